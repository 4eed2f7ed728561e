"""Delivery results: one shared result per batch, and a small future per record pointing at it
(a send makes one tiny object, not a lock or a condition)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from kcore._codec import RecordFutureBase
from kcore.errors import KcoreTimeoutError

__all__ = ["BatchResult", "DeliveryFuture", "RecordMetadata", "SendBatchResult"]


class RecordMetadata(NamedTuple):
    """Where a record landed: ``timestamp`` is the record's (or the broker's, with
    LogAppendTime) timestamp in ms; ``offset`` is -1 with ``acks=0``."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class BatchResult:
    """The outcome of one produce batch, shared by its records. Completed on the network
    thread, waited for on any thread."""

    __slots__ = ("base_offset", "log_append_time", "error", "_event", "_callbacks", "_lock")

    def __init__(self) -> None:
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self._event = threading.Event()
        self._callbacks: list[Callable[[BatchResult], Any]] | None = None
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def complete(self, base_offset: int, log_append_time: int = -1) -> None:
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self._finish()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            try:
                callback(self)
            except Exception:  # a user's callback must not break delivery of the others
                import logging

                logging.getLogger("kcore.producer").exception("delivery callback raised")

    def add_callback(self, callback: Callable[[BatchResult], Any]) -> None:
        with self._lock:
            if not self._event.is_set():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback(self)

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)


class DeliveryFuture(RecordFutureBase):
    """What ``send`` returns: ``result(timeout)`` gives the :class:`RecordMetadata` or raises
    the delivery error; ``await``-able too. (Its fields live in the compiled base, which the
    compiled send path fills without calling ``__init__``.)"""

    __slots__ = ()
    _batch: BatchResult
    _index: int
    topic: str
    partition: int
    timestamp: int

    def __init__(self, batch: BatchResult, index: int, topic: str, partition: int, ts: int):
        self._batch = batch
        self._index = index
        self.topic = topic
        self.partition = partition
        self.timestamp = ts

    def done(self) -> bool:
        return self._batch.done

    def _metadata(self) -> RecordMetadata:
        b = self._batch
        if b.error is not None:
            raise b.error
        offset = b.base_offset + self._index if b.base_offset >= 0 else -1
        ts = b.log_append_time if b.log_append_time >= 0 else self.timestamp
        return RecordMetadata(self.topic, self.partition, offset, ts)

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if not self._batch.wait(timeout):
            raise KcoreTimeoutError(
                f"record to {self.topic}-{self.partition} not delivered within {timeout:g}s"
            )
        return self._metadata()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._batch.wait(timeout):
            raise KcoreTimeoutError(f"record to {self.topic}-{self.partition} still pending")
        return self._batch.error

    def add_done_callback(self, fn: Callable[[DeliveryFuture], Any]) -> None:
        self._batch.add_callback(lambda _b: fn(self))

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        if not self._batch.done:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()

            def wake(_b: BatchResult) -> None:
                loop.call_soon_threadsafe(_set_done, waiter)

            self._batch.add_callback(wake)
            yield from waiter.__await__()
        return self._metadata()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "failed" if self._batch.error else "done"
        return f"<DeliveryFuture {self.topic}-{self.partition} {state}>"


def _set_done(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class SendBatchResult:
    """What ``send_batch`` returns: the batches the records went into. ``result(timeout)``
    waits for all and returns ``[(partition, base_offset, count), ...]`` in send order of the
    chunks; raises the first delivery error."""

    __slots__ = ("topic", "_parts")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._parts: list[tuple[int, int, BatchResult]] = []  # partition, count, result

    def add(self, partition: int, count: int, result: BatchResult) -> None:
        self._parts.append((partition, count, result))

    def done(self) -> bool:
        return all(r.done for _, _, r in self._parts)

    def result(self, timeout: float | None = None) -> list[tuple[int, int, int]]:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        for partition, count, r in self._parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not r.wait(left):
                raise KcoreTimeoutError(
                    f"records to {self.topic} not delivered within {timeout:g}s"
                )
            if r.error is not None:
                raise r.error
            out.append((partition, r.base_offset, count))
        return out

    def __len__(self) -> int:
        return sum(c for _, c, _ in self._parts)
