"""The admin client: ``kcore.AdminClient`` (blocking) and ``kcore.admin.AsyncAdminClient``."""

from .async_client import AsyncAdminClient
from .client import AdminClient
from .groups import ConsumerGroupListing
from .types import (
    AdminOperationError,
    ClusterDescription,
    ConfigEntry,
    ConfigResource,
    ConsumerGroupMetadata,
    ListOffsetsResult,
    NewTopic,
    OffsetSpec,
    TopicDescription,
    TopicPartition,
)

__all__ = [
    "AdminClient",
    "AdminOperationError",
    "AsyncAdminClient",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigResource",
    "ConsumerGroupListing",
    "ConsumerGroupMetadata",
    "ListOffsetsResult",
    "NewTopic",
    "OffsetSpec",
    "TopicDescription",
    "TopicPartition",
]
