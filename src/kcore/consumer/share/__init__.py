"""Share groups (KIP-932, "queues for Kafka"): :class:`ShareConsumer`,
:class:`AsyncShareConsumer`."""

from kcore.consumer.share.acknowledgements import AcknowledgeType, ShareRecord
from kcore.consumer.share.client import (
    AcknowledgementCommitCallback,
    AsyncShareConsumer,
    ShareConsumer,
)
from kcore.errors import AcknowledgementError

__all__ = [
    "AcknowledgeType",
    "AcknowledgementCommitCallback",
    "AcknowledgementError",
    "AsyncShareConsumer",
    "ShareConsumer",
    "ShareRecord",
]
