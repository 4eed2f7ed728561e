"""Delivery results: one shared result per batch, and a small future per record pointing at it
(a send makes one tiny object, not a lock or a condition). ``DeliveryFuture`` and
``RecordMetadata`` are compiled (kcore.producer._sendpath): the send path makes a future per
record."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

from kcore.errors import KcoreTimeoutError
from kcore.producer._sendpath import DeliveryFuture, RecordMetadata

__all__ = ["BatchResult", "DeliveryFuture", "RecordMetadata", "SendBatchResult"]


class BatchResult:
    """The outcome of one produce batch, shared by its records. Completed on the network
    thread, waited for on any thread."""

    __slots__ = (
        "base_offset",
        "log_append_time",
        "error",
        "record_errors",
        "parts",
        "_done",
        "_lock",
        "_cond",
        "_callbacks",
        "_watchers",
        "_parts_left",
    )

    def __init__(self) -> None:
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        # KIP-467: the records the broker named as the cause of the batch's failure, by index
        # (their own errors); the batch's other records fail with ``error``.
        self.record_errors: dict[int, BaseException] | None = None
        # Set when the batch was split (the broker found it too large): ``(first index, count,
        # result)`` per part, in record order. Each part has its own base offset (other
        # producers may write between them), so a record's outcome is its part's (``locate``).
        self.parts: list[tuple[int, int, BatchResult]] | None = None
        self._done = False
        # Guards the outcome. A thread that waits makes ``_cond`` on it, notified when the
        # batch is done or split (waiters for one record move to its part): most batches are
        # never waited on by a thread, and a Condition costs more to make than a small batch
        # takes to fill.
        self._lock = threading.Lock()
        self._cond: threading.Condition | None = None
        # (callback, index of the record it is for, or -1 for the whole batch)
        self._callbacks: list[tuple[Callable[[BatchResult], Any], int]] | None = None
        # Per event loop, what waits there for the batch or one of its records (``watch``):
        # the whole list goes to its loop in one hand-over.
        self._watchers: dict[asyncio.AbstractEventLoop, list[Any]] | None = None
        self._parts_left = 0

    @property
    def done(self) -> bool:
        return self._done

    def complete(self, base_offset: int, log_append_time: int = -1) -> None:
        self._finish(base_offset, log_append_time, None)

    def fail(
        self, error: BaseException, record_errors: dict[int, BaseException] | None = None
    ) -> None:
        if record_errors and not self._done:
            self.record_errors = record_errors
        self._finish(-1, -1, error)

    def error_at(self, index: int) -> BaseException | None:
        """The error of the record at ``index`` (of this result; after a split, see
        ``locate``): its own if the broker named it (KIP-467), else the batch's."""
        if self.error is None or not self.record_errors:
            return self.error
        return self.record_errors.get(index, self.error)

    def _finish(self, base_offset: int, log_append_time: int, error: BaseException | None) -> None:
        with self._lock:
            if self._done:  # the first outcome stands (e.g. a timeout, then a late answer)
                return
            self.base_offset = base_offset
            self.log_append_time = log_append_time
            self.error = error
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
            watchers, self._watchers = self._watchers, None
            if self._cond is not None:
                self._cond.notify_all()
        # The loops first: a callback below may wake a flush, which then finds them run.
        for loop, entries in (watchers or {}).items():
            _hand_over(loop, entries)
        for callback, _ in callbacks or ():
            try:
                callback(self)
            except BaseException:  # a user's callback must not break delivery of the others
                import logging

                logging.getLogger("kcore.producer").exception("delivery callback raised")

    def split(self, parts: list[tuple[int, int, BatchResult]]) -> None:
        """The batch's records now travel as ``parts`` (first index, count, result): done when
        every part is; ``error`` is the first failed part's, ``base_offset`` the first part's.
        A record's own callbacks and waiters move to its part: a part delivered answers for
        its records without waiting for the others."""
        with self._lock:
            assert not self._done and self.parts is None
            self.parts = parts
            self._parts_left = len(parts)
            callbacks = self._callbacks or []
            self._callbacks = [(c, i) for c, i in callbacks if i < 0]
            watchers = self._watchers or {}
            self._watchers = {
                loop: kept
                for loop, entries in watchers.items()
                if (kept := [w for w in entries if type(w) is tuple and w[1] < 0])
            } or None
            if self._cond is not None:
                self._cond.notify_all()
        try:
            for callback, index in callbacks:
                if index >= 0:
                    part, at = self._part_of(index)
                    part.add_callback(callback, at)
            for loop, entries in watchers.items():
                for entry in entries:
                    if type(entry) is tuple:  # an await's waiter: (future, index)
                        waiter, index = entry
                        if index < 0:
                            continue  # the whole batch's: stays
                        part, at = self._part_of(index)
                        if not part.watch(loop, waiter, at):
                            _hand_over(loop, [entry])
                    else:  # a loop's DeliveryFuture: it knows where its record went
                        part, at = entry._record_result()
                        if not part.watch(loop, entry, at):
                            _hand_over(loop, [entry])
        finally:
            # After the records' callbacks: the last part runs them before the whole batch's.
            for _, _, part in parts:
                part.add_callback(self._part_done)

    def _part_done(self, _part: BatchResult) -> None:
        with self._lock:
            self._parts_left -= 1
            if self._parts_left:
                return
        assert self.parts is not None
        first = self.parts[0][2]
        error = next((p.error for _, _, p in self.parts if p.error is not None), None)
        self._finish(first.base_offset, first.log_append_time, error)

    def _part_of(self, index: int) -> tuple[BatchResult, int]:
        assert self.parts is not None
        for start, count, part in self.parts:
            if index < start + count:
                return part, index - start
        raise IndexError(index)

    def locate(self, index: int) -> tuple[BatchResult, int]:
        """The result that holds the record at ``index`` of this batch, and its index there."""
        result = self
        while result.parts is not None:
            result, index = result._part_of(index)
        return result, index

    def segments(self) -> list[tuple[int, int]]:
        """``(base_offset, count)`` of each part this batch was delivered as, in record order
        (one entry, count -1, for a batch that was never split)."""
        if self.parts is None:
            return [(self.base_offset, -1)]
        out: list[tuple[int, int]] = []
        for _, count, part in self.parts:
            out += [(base, count if n < 0 else n) for base, n in part.segments()]
        return out

    def add_callback(self, callback: Callable[[BatchResult], Any], index: int = -1) -> None:
        """Call ``callback(result)`` once the batch is done, or with ``index`` once the record
        at that index is (its part's result, for a split batch)."""
        with self._lock:
            if not self._done:
                if index < 0 or self.parts is None:
                    if self._callbacks is None:
                        self._callbacks = []
                    self._callbacks.append((callback, index))
                    return
            elif index < 0 or self.parts is None:
                index = -1  # done: call it now
        if index >= 0:  # split: its part calls it
            part, at = self._part_of(index)
            part.add_callback(callback, at)
            return
        callback(self)

    def watch(self, loop: asyncio.AbstractEventLoop, waiter: Any, index: int = -1) -> bool:
        """Wake ``waiter`` on ``loop`` once the record at ``index`` is done (-1: the whole
        batch; a split batch's record: once its part is): a future of ``loop`` gets its result
        set (None), a DeliveryFuture of ``loop`` runs its done callbacks. What awaits a record
        waits this way: when the batch is done, everything that waits on a loop goes to it in
        one hand-over (one ``call_soon``, or ``call_soon_threadsafe`` from another thread;
        dropped if the loop is closed), in the order it came. False, and nothing registered,
        if it is done already."""
        # A DeliveryFuture goes in as it is (no allocation per record): it finds its record
        # again after a split.
        entry = waiter if type(waiter) is DeliveryFuture else (waiter, index)
        with self._lock:
            if self._done:
                return False
            if index < 0 or self.parts is None:
                if self._watchers is None:
                    self._watchers = {loop: [entry]}
                    return True
                entries = self._watchers.get(loop)
                if entries is None:
                    self._watchers[loop] = [entry]
                else:
                    entries.append(entry)
                return True
        part, at = self._part_of(index)  # split: its part answers for it
        return part.watch(loop, waiter, at)

    def wait(self, timeout: float | None) -> bool:
        """Wait until the whole batch is done."""
        if self._done:
            return True
        with self._lock:
            return self._condition().wait_for(lambda: self._done, timeout)

    def _condition(self) -> threading.Condition:
        """What a thread waits on (made at the first wait); ``_lock`` held."""
        if self._cond is None:
            self._cond = threading.Condition(self._lock)
        return self._cond

    def wait_record(self, index: int, timeout: float | None) -> bool:
        """Wait until the record at ``index`` is delivered or failed: its part's outcome when
        the batch is split meanwhile (the whole batch may take longer)."""
        if self._done:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        result = self
        while True:
            with result._lock:
                while not result._done and result.parts is None:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    result._condition().wait(left)
                if result._done:
                    return True
            result, index = result._part_of(index)  # split meanwhile: follow the record


class _Countdown:
    """Batches not done yet, told by their completion callbacks; one thread sleep for all."""

    __slots__ = ("_cond", "_left", "_failed")

    def __init__(self, left: int) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._left = left
        self._failed = False

    def one_done(self, result: BatchResult) -> None:
        with self._cond:
            self._left -= 1
            if result.error is not None:
                self._failed = True
            if self._left == 0 or self._failed:
                self._cond.notify_all()

    def wait(self, timeout: float | None) -> bool:
        """Until every batch is done or one has failed (True), or ``timeout`` (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._left == 0 or self._failed, timeout)


class SendBatchResult:
    """What ``send_batch`` returns: the batches the records went into. ``result(timeout)``
    waits for all and returns ``[(partition, base_offset, count), ...]`` in send order of the
    chunks (a chunk the broker found too large for one batch, split and sent in parts, gives an
    entry per part); raises the first delivery error."""

    __slots__ = ("topic", "_parts", "_countdown")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._parts: list[tuple[int, int, BatchResult]] = []  # partition, count, result
        self._countdown: _Countdown | None = None  # made at the first wait that needs one

    def add(self, partition: int, count: int, result: BatchResult) -> None:
        self._parts.append((partition, count, result))

    def done(self) -> bool:
        return all(r.done for _, _, r in self._parts)

    def result(self, timeout: float | None = None) -> list[tuple[int, int, int]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        settled = self._wait_all_or_a_failure(timeout)  # False: the time ran out
        for partition, count, r in self._parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not (settled and r.wait(left)):
                raise KcoreTimeoutError(
                    f"records to {self.topic} not delivered within {timeout:g}s"
                )
            if r.error is not None:
                # A record the broker named as the cause (KIP-467) says more than the rest.
                raise r.record_errors[min(r.record_errors)] if r.record_errors else r.error
            if r.parts is None:
                out.append((partition, r.base_offset, count))
            else:
                out += [(partition, base, n) for base, n in r.segments()]
        return out

    def _wait_all_or_a_failure(self, timeout: float | None) -> bool:
        """Sleep once until every batch is done or one has failed (or ``timeout``), instead
        of once a batch: waited in turn, each batch not done yet costs this thread a sleep
        and the network thread a wake-up of it, thousands a call when the values are large
        (a batch a record or two). What ``result`` reports is then read in send order. The
        countdown is registered once: a caller polling with short timeouts adds nothing."""
        countdown = self._countdown
        if countdown is None:
            pending = [r for _, _, r in self._parts if not r.done]
            if len(pending) < 2 or any(r.error is not None for _, _, r in self._parts):
                # One batch: its own wait is as cheap. One failed already: the batches
                # before it are waited for in turn, as a failure found later would be.
                return True
            countdown = self._countdown = _Countdown(len(pending))
            for r in pending:
                r.add_callback(countdown.one_done)
        return countdown.wait(timeout)

    def add_done_callback(self, callback: Callable[[BaseException | None], Any]) -> None:
        """Call ``callback(error)`` once every batch is done (on the thread that finished the
        last): None if all were delivered, else the first batch's error."""
        parts = [r for _, _, r in self._parts]
        left = [len(parts)]
        lock = threading.Lock()

        def one_done(_: BatchResult) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                callback(next((r.error for r in parts if r.error is not None), None))

        if not parts:
            callback(None)
        for r in parts:
            r.add_callback(one_done)

    def __await__(self) -> Generator[Any, None, list[tuple[int, int, int]]]:
        """``await result`` (AsyncProducer): ``result()`` without blocking the event loop,
        resumed once when every batch is done (not once a batch)."""
        pending = [r for _, _, r in self._parts if not r.done]
        if pending:
            yield from all_done(pending, [len(pending)]).__await__()
        return self.result(0)

    def __len__(self) -> int:
        return sum(c for _, c, _ in self._parts)


async def all_done(pending: list[BatchResult], left: list[int]) -> None:
    """Until every result in ``pending`` (not empty) is done (``left[0]``: how many are not
    yet), on the running loop: one resumption for all of them."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    finished = loop.create_future()

    def one_done(_result: BatchResult) -> None:
        left[0] -= 1
        if left[0] == 0 and not finished.done():
            finished.set_result(None)

    def on_done(result: BatchResult) -> None:
        # Results complete on the sender's thread, this loop's, but for a few failed from
        # another: a self-pipe write for each of thousands of batches is what that saves.
        if threading.get_ident() == loop_thread:
            one_done(result)
        else:
            try:
                loop.call_soon_threadsafe(one_done, result)
            except RuntimeError:  # the loop is closed: nothing waits there any more
                pass

    for result in pending:
        result.add_callback(on_done)
    await finished


def _wake(waiter: Any) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _hand_over(loop: asyncio.AbstractEventLoop, entries: list[Any]) -> None:
    """What waits on ``loop`` for a batch, run there in one go. From the loop's own thread (an
    AsyncProducer's sender) a plain ``call_soon``; from another (a Producer's network thread)
    one ``call_soon_threadsafe``, i.e. one wake-up of that loop per batch. A closed loop has
    nothing left waiting on it: dropped."""
    try:
        if asyncio._get_running_loop() is loop:
            loop.call_soon(_run_watchers, loop, entries)
        else:
            loop.call_soon_threadsafe(_run_watchers, loop, entries)
    except RuntimeError:  # closed (never raised into the thread that completes batches)
        pass


def _run_watchers(loop: asyncio.AbstractEventLoop, entries: list[Any]) -> None:
    for entry in entries:
        try:
            if type(entry) is tuple:
                _wake(entry[0])
            else:
                entry._loop_done()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # one failing must not keep the others waiting
            loop.call_exception_handler({"message": "a delivery wake-up raised", "exception": exc})
