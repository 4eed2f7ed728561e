"""Share groups (KIP-932, "queues for Kafka"): :class:`ShareConsumer`."""

from kcore.consumer.share.acknowledgements import AcknowledgeType, ShareRecord
from kcore.consumer.share.client import AcknowledgementCommitCallback, ShareConsumer
from kcore.errors import AcknowledgementError

__all__ = [
    "AcknowledgeType",
    "AcknowledgementCommitCallback",
    "AcknowledgementError",
    "ShareConsumer",
    "ShareRecord",
]
