"""kcore: a Kafka client for Python whose hot path is compiled."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _bundle_loader

_bundle_loader.install(__spec__)  # no-op unless kcore runs from a Spark bundle (a zip)
from . import _codec  # noqa: E402, F401  (fail at import if the compiled codec is missing)
from ._version import __version__ as __version__  # noqa: E402

if TYPE_CHECKING:
    from kcore.admin import AdminClient, AsyncAdminClient, NewTopic
    from kcore.cluster.otel import trace_context
    from kcore.consumer import AsyncConsumer, Consumer, ConsumerRecord
    from kcore.consumer.share import (
        AcknowledgeType,
        AsyncShareConsumer,
        ShareConsumer,
        ShareRecord,
    )
    from kcore.producer import AsyncProducer, Producer, RecordMetadata
    from kcore.types import ConsumerGroupMetadata, TopicPartition

# Clients load on first use, so ``import kcore`` for the codec alone stays cheap.
_LAZY = {
    "AdminClient": "kcore.admin",
    "AsyncAdminClient": "kcore.admin",
    "NewTopic": "kcore.admin",
    "ConsumerGroupMetadata": "kcore.types",
    "TopicPartition": "kcore.types",
    "Producer": "kcore.producer",
    "AsyncProducer": "kcore.producer",
    "RecordMetadata": "kcore.producer",
    "Consumer": "kcore.consumer",
    "AsyncConsumer": "kcore.consumer",
    "ConsumerRecord": "kcore.consumer",
    "ShareConsumer": "kcore.consumer.share",
    "AsyncShareConsumer": "kcore.consumer.share",
    "ShareRecord": "kcore.consumer.share",
    "AcknowledgeType": "kcore.consumer.share",
    "trace_context": "kcore.cluster.otel",
}

__all__ = [
    "AcknowledgeType",
    "AdminClient",
    "AsyncAdminClient",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncShareConsumer",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "NewTopic",
    "Producer",
    "RecordMetadata",
    "ShareConsumer",
    "ShareRecord",
    "TopicPartition",
    "__version__",
    "trace_context",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kcore' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
