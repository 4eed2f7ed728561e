"""Type stubs for the producer's compiled send path (src/kcore/producer/_sendpath.pyx)."""

from asyncio import AbstractEventLoop
from collections.abc import Callable, Generator
from contextvars import Context
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
    _loop: AbstractEventLoop | None
    _asyncio_future_blocking: bool | None
    def __init__(
        self,
        batch: Any,
        index: int,
        topic: str,
        partition: int,
        timestamp: int,
        loop: AbstractEventLoop | None = None,
    ) -> None: ...
    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def cancel(self, msg: Any = None) -> bool: ...
    def result(self, timeout: float | None = None) -> RecordMetadata: ...
    def exception(self, timeout: float | None = None) -> BaseException | None: ...
    def when_delivered(
        self, fn: Callable[[BaseException | None, RecordMetadata | None], Any]
    ) -> None: ...
    def add_done_callback(
        self, fn: Callable[[DeliveryFuture], Any], *, context: Context | None = None
    ) -> None: ...
    def remove_done_callback(self, fn: Callable[[DeliveryFuture], Any]) -> int: ...
    def get_loop(self) -> AbstractEventLoop: ...
    def _loop_done(self) -> None: ...
    def _record_result(self) -> tuple[Any, int]: ...
    def __await__(self) -> Generator[Any, None, RecordMetadata]: ...

class ProducerBatchBase:
    builder: RecordBatchBuilder
    result: Any
    closed: bool
    @property
    def records(self) -> int: ...

class SendPath:
    slow: Any
    new_batch: Any
    enabled: bool
    loop: AbstractEventLoop | None
    def __init__(
        self,
        slow: Any,
        tp_type: type,
        queues: Any,
        cache: Any,
        batch_size: int,
        enabled: bool = True,
        max_payload: int = ...,
        new_batch: Any = None,
    ) -> None: ...
    def metadata_updated(self) -> None: ...
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
