"""Type stubs for the producer's compiled send path (src/kcore/producer/_sendpath.pyx)."""

from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from kcore._codec import RecordBatchBuilder

class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int

class DeliveryFuture:
    _batch: Any
    _index: int
    topic: str
    partition: int
    timestamp: int
    def __init__(
        self, batch: Any, index: int, topic: str, partition: int, timestamp: int
    ) -> None: ...
    def done(self) -> bool: ...
    def result(self, timeout: float | None = None) -> RecordMetadata: ...
    def exception(self, timeout: float | None = None) -> BaseException | None: ...
    def add_done_callback(self, fn: Callable[[DeliveryFuture], Any]) -> None: ...
    def __await__(self) -> Generator[Any, None, RecordMetadata]: ...

class ProducerBatchBase:
    builder: RecordBatchBuilder
    result: Any
    closed: bool
    @property
    def records(self) -> int: ...

class SendPath:
    slow: Any
    enabled: bool
    def __init__(
        self,
        slow: Any,
        tp_type: type,
        queues: Any,
        cache: Any,
        batch_size: int,
        enabled: bool = True,
        max_payload: int = ...,
    ) -> None: ...
    def sticky_partition(self, topic: str, count: int, available: Any, size: int) -> int: ...
    def send(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Any = None,
        on_delivery: Any = None,
    ) -> Any: ...
