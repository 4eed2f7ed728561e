"""The producer: ``kcore.Producer`` (blocking) and ``kcore.AsyncProducer``."""

from .client import AsyncProducer, Producer
from .results import DeliveryFuture, RecordMetadata, SendBatchResult

__all__ = ["AsyncProducer", "DeliveryFuture", "Producer", "RecordMetadata", "SendBatchResult"]
