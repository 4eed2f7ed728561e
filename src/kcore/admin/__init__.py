"""The admin client: ``kcore.AdminClient`` (blocking) and ``kcore.admin.AsyncAdminClient``."""

from .acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from .async_client import AsyncAdminClient
from .client import AdminClient
from .describe_groups import ConsumerGroupDescription, MemberDescription
from .groups import ConsumerGroupListing, GroupListing
from .scram import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from .share_groups import (
    ShareGroupDescription,
    ShareMemberDescription,
    SharePartitionOffsetInfo,
)
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
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclPermissionType",
    "AdminClient",
    "AdminOperationError",
    "AsyncAdminClient",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigResource",
    "ConsumerGroupDescription",
    "ConsumerGroupListing",
    "ConsumerGroupMetadata",
    "GroupListing",
    "ListOffsetsResult",
    "MemberDescription",
    "NewTopic",
    "OffsetSpec",
    "PatternType",
    "ResourceType",
    "ScramCredentialInfo",
    "ScramMechanism",
    "ShareGroupDescription",
    "ShareMemberDescription",
    "SharePartitionOffsetInfo",
    "TopicDescription",
    "TopicPartition",
    "UserScramCredentialDeletion",
    "UserScramCredentialUpsertion",
    "UserScramCredentialsDescription",
]
