"""The consumer: ``kcore.Consumer`` (blocking) and ``kcore.AsyncConsumer``, manual assignment."""

from .client import AsyncConsumer, Consumer, ConsumerRecord

__all__ = ["AsyncConsumer", "Consumer", "ConsumerRecord"]
