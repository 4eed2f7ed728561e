"""The fetch buffer: completed fetches on their way from the network side (fetch responses,
handled on the client's event loop) to ``poll`` (on the caller's thread), as Java's
``FetchBuffer``.

:class:`FetchBuffer` owns the queue and its lock; the fetcher adds to it, the poll side
(collector.py) takes from it and the consumer's core drops what a seek or an unassignment made
stale, each through its methods. Lock order: a caller may hold the positions' lock when it
calls in (positions.py); the buffer never calls out while it holds its own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from kcore.types import TopicPartition

__all__ = ["NO_PARTITION", "FetchBuffer", "FetchedData"]

NO_PARTITION = TopicPartition("", -1)  # a queued error about no partition in particular


@dataclass(eq=False)  # queued entries are told apart by identity, never by their bytes
class FetchedData:
    """One partition's data from one Fetch response, or an error for ``poll`` to raise."""

    tp: TopicPartition
    fetch_offset: int
    records: Any  # bytes or memoryview of record batches
    high_watermark: int
    end_offset: int = -1  # the offset after its last complete batch
    decoded: list[Any] | None = None  # poll's cache of the decoded records
    taken: int = 0
    # What is left to hand out: the records at or after ``next_offset``, in the batches from
    # byte ``position`` of ``records`` on (poll_arrow appends them a call at a time).
    next_offset: int = -1
    position: int = 0
    # read_committed: the records without the aborted transactions' (made once, when needed)
    committed: Any = None
    error: BaseException | None = None
    # read_committed: (producer id, first offset) of the aborted transactions the response
    # named for this partition; None when there are none (poll filters only then).
    aborted: list[tuple[int, int]] | None = None
    # (last offset, leader epoch) of each run of batches with one epoch, in offset order
    epochs: list[tuple[int, int]] = field(default_factory=list)
    leader_epoch: int = -1  # the partition leader's epoch the fetch was made under

    def __post_init__(self) -> None:
        if self.next_offset < 0:
            self.next_offset = self.fetch_offset

    def epoch_at(self, offset: int) -> int:
        """The leader epoch of the batch holding ``offset`` (-1: unknown, magic 0/1)."""
        for last, epoch in self.epochs:
            if offset <= last:
                return epoch
        return self.epochs[-1][1] if self.epochs else -1


class FetchBuffer:
    """Completed fetches in arrival order. Thread-safe: any thread adds, takes and waits."""

    def __init__(self) -> None:
        self._completed: deque[FetchedData] = deque()
        self._lock = threading.Condition()
        self._ready: asyncio.Event | None = None  # set when something is added (AsyncConsumer)
        self._woken = False
        self._closed = False

    def start(self) -> None:
        """On the event loop the fetcher runs on: from now on an asyncio waiter is woken too."""
        self._ready = asyncio.Event()

    def close(self) -> None:
        """No more data will come: waiters return at once."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    # -- the network side --------------------------------------------------------------------------

    def add(self, data: FetchedData) -> None:
        self.add_all([data])

    def add_all(self, datas: list[FetchedData]) -> None:
        """Several partitions' data from one response, in order: the waiting poll is woken
        once for all of them."""
        if not datas:
            return
        with self._lock:
            self._completed.extend(datas)
            self._lock.notify_all()
        self._signal()

    def add_error(
        self, error: BaseException, tp: TopicPartition = NO_PARTITION, *, once: bool = False
    ) -> None:
        """An error for ``poll`` to raise (``tp``: the partition it is about, if one). ``once``:
        not if one about ``tp`` already waits (a partition failing again and again while the
        caller does not poll must not fill the queue)."""
        with self._lock:
            if once and any(d.error is not None and d.tp == tp for d in self._completed):
                return
            self._completed.append(FetchedData(tp, -1, b"", -1, error=error))
            self._lock.notify_all()
        self._signal()

    # -- the poll side -----------------------------------------------------------------------------

    def peek(self) -> list[FetchedData]:
        """What is queued, oldest first (a copy: the caller may remove entries meanwhile)."""
        with self._lock:
            return list(self._completed)

    def remove(self, data: FetchedData) -> None:
        """Take ``data`` out (used up, or stale); nothing if it is gone already."""
        with self._lock:
            for i, queued in enumerate(self._completed):
                if queued is data:
                    del self._completed[i]
                    return

    def drain(self, partitions: Collection[TopicPartition], *, keep_errors: bool = False) -> None:
        """Drop what was fetched for ``partitions``, and their queued errors unless
        ``keep_errors``."""
        with self._lock:
            self._completed = deque(
                d
                for d in self._completed
                if d.tp not in partitions or (keep_errors and d.error is not None)
            )

    def retain(self, partitions: Collection[TopicPartition]) -> None:
        """Keep only what is about ``partitions`` (a new assignment)."""
        with self._lock:
            self._completed = deque(d for d in self._completed if d.tp in partitions)

    def own_bytes(self, partitions: Collection[TopicPartition]) -> None:
        """Data of ``partitions`` may wait long (paused): each keeps its own bytes, not a view
        that pins the whole response it came in (and the other partitions' data in it)."""
        with self._lock:
            for data in self._completed:
                if data.tp in partitions and isinstance(data.records, memoryview):
                    data.records = bytes(data.records)

    # -- waiting -----------------------------------------------------------------------------------

    def wakeup(self) -> None:
        """End the current (or next) wait early: the caller has other work, such as a new
        group assignment to take on."""
        with self._lock:
            self._woken = True
            self._lock.notify_all()
        self._signal()

    def wait(self, timeout: float, paused: Collection[TopicPartition]) -> None:
        """Block until something ``poll`` would take is queued (an error, or data of a
        partition not in ``paused``), :meth:`wakeup` is called, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not (self._deliverable(paused) or self._woken):
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return
                self._lock.wait(left)
            self._woken = False

    async def wait_async(self, timeout: float, paused: Collection[TopicPartition]) -> None:
        """:meth:`wait` for a caller on the event loop of :meth:`start`."""
        event = self._ready
        if event is None:  # not started yet
            await asyncio.sleep(min(max(timeout, 0.0), 0.005))
            return
        event.clear()
        with self._lock:
            if self._deliverable(paused):
                return
        try:
            await asyncio.wait_for(event.wait(), max(timeout, 0.0))
        except asyncio.TimeoutError:
            pass

    def _deliverable(self, paused: Collection[TopicPartition]) -> bool:
        """(Lock held.) Whether ``poll`` would find something: an error, or data of a
        partition not paused (data of a paused one stays queued without waking the caller)."""
        return any(d.error is not None or d.tp not in paused for d in self._completed)

    def _signal(self) -> None:
        if self._ready is not None:
            self._ready.set()
