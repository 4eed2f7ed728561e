"""RecordAccumulator: records wait here, per partition, in compiled batch builders until the
sender takes them (a batch is full at ``batch.size``, or has waited ``linger.ms``).

Thread-safe: ``send`` appends from the caller's thread while the sender drains on the network
thread. Memory is reserved a batch at a time from ``buffer.memory``; when it runs out, appends
block up to ``max.block.ms`` and then raise, as in the Java producer.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import Any

from kcore._codec import BatchBufferPool
from kcore.codec import DEFAULT_COMPRESSION_LEVEL, RecordBatchBuilder, decode_batches
from kcore.errors import KafkaError, KcoreError, KcoreTimeoutError
from kcore.producer._sendpath import ProducerBatchBase
from kcore.producer.results import BatchResult
from kcore.types import TopicPartition

__all__ = ["MemoryShortage", "ProducerBatch", "RecordAccumulator"]

_ORDER = itertools.count()

# Bytes a record adds besides its key, value and headers (length, attributes, deltas, lengths).
RECORD_OVERHEAD = 21
BATCH_HEADER = 61
# Batches of batch.size at least this large reuse delivered batches' buffers (below it malloc
# recycles the memory itself, and a page fault per batch is not worth a pool).
POOLED_BATCH_MIN = 64 * 1024
# Room in a new batch's buffer past batch.size: the record that fills a batch ends past it.
BATCH_SLACK = 16 * 1024
# A new batch's buffer is made this large at most up front (a huge batch.size grows its
# buffers as records come, rather than asking for all of it per batch).
BATCH_CAPACITY_MAX = 8 << 20


class ProducerBatch(ProducerBatchBase):
    """Records for one partition, sent (and retried) as one unit. ``builder``, ``result``,
    ``records`` and ``closed`` live in the compiled base (kcore.producer._sendpath), where the
    send path uses them."""

    __slots__ = (
        "tp",
        "created",
        "reserved",
        "sequence",
        "attempts",
        "retry_at",
        "payload",
        "order",
        "producer",
        "in_flight",
        "span",
        "free_attempts",
        "maybe_written",
        "leader_epoch",
    )

    def __init__(self, tp: TopicPartition, builder: RecordBatchBuilder, reserved: int) -> None:
        self.tp = tp
        self.builder = builder
        self.result = BatchResult()
        self.created = time.monotonic()
        self.reserved = reserved
        self.closed = False  # no more appends (full, or sent once)
        self.sequence: int | None = None  # idempotence: first sequence, fixed once sent
        self.attempts = 0
        self.retry_at = 0.0
        self.leader_epoch = -1  # its partition's leader epoch when it was last sent
        self.payload: bytes | None = None
        self.order: float = next(_ORDER)  # creation order: retries keep it within a partition
        # (producer id, epoch) its sequence belongs to: an epoch bump, or a new producer id
        # (what a bump gives an idempotent producer without transactional.id), renumbers it.
        self.producer: tuple[int, int] | None = None
        self.in_flight = False
        # The orders from ``order`` up to ``order + span`` are this batch's: the parts of a
        # split take them, so they sort where the batch did, before every later batch (exact
        # while order < 2**(53 - depth of splitting): far beyond any producer's batch count).
        self.span = 1.0
        # Sends that do not count against ``retries``: those of the batch a split came from
        # (as Java's split batches start their attempt count afresh).
        self.free_attempts = 0
        # Sent with its sequence, and no answer since has said it was not written (only a
        # sequence error does): the broker may have written it, so it keeps its producer id,
        # epoch and sequence through an epoch bump (the broker then answers DUPLICATE_SEQUENCE,
        # or rejects it under the old epoch, and only then is it renumbered).
        self.maybe_written = False


class MemoryShortage(Exception):
    """buffer.memory is full and the calling thread may not wait for it (internal: the
    AsyncProducer then waits off its event loop and tries again). ``retry``, when set, is
    what is left of the call to do then."""

    retry: Callable[[], Any] | None = None


class RecordAccumulator:
    def __init__(
        self,
        *,
        batch_size: int,
        linger_s: float,
        buffer_memory: int,
        compression: str,
        compression_level: int = DEFAULT_COMPRESSION_LEVEL,
        max_in_flight: int = 5,
    ) -> None:
        self.batch_size = max(batch_size, 1)
        self.linger_s = linger_s
        self.buffer_memory = buffer_memory
        self.compression: Any = compression  # one of the codec names (the config checks it)
        self.compression_level = compression_level
        # Taken as ``with self._lock`` (the lock's own C methods; a Condition's ``with`` runs
        # two Python calls around them, a few per new batch); reentrant: a chunk refused
        # midway gives its batch back (``done``) with it held.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        # Batches in flight per partition; at most max_in_flight (the broker keeps the last
        # five batches' sequences per producer, so five is the most idempotence allows).
        self._in_flight: dict[TopicPartition, int] = {}
        self.max_in_flight = max(1, max_in_flight)
        self._used = 0
        # The thread that must never block for memory (an AsyncProducer's event loop).
        self.no_wait_thread: int | None = None
        self.waiting = 0  # threads blocked for buffer.memory now
        self.wait_ns_total = 0  # how long they have been blocked, all told
        # Delivered batches' buffers, reused by new batches (Java's BufferPool); counted with
        # _used against buffer.memory. Small batches gain nothing: malloc recycles those.
        self._pool: BatchBufferPool | None = None
        self._capacity = 0  # a new batch's buffer: batch.size and room for the record past it
        if self.batch_size >= POOLED_BATCH_MIN:
            self._capacity = min(self.batch_size + BATCH_SLACK, BATCH_CAPACITY_MAX)
            self._pool = BatchBufferPool(
                min_buffer=POOLED_BATCH_MIN, max_buffer=2 * self._capacity, limit=0
            )
        self._flushing = 0
        self._closed = False
        self._cause: BaseException | None = None
        self.incomplete: set[BatchResult] = set()
        self.wake_sender: Callable[[], None] | None = None  # set by the producer

    @property
    def queues(self) -> dict[TopicPartition, deque[ProducerBatch]]:
        """The batches waiting per partition, the last of each its open one. Read only by the
        compiled send path, without the lock, under the GIL rule stated in
        kcore/producer/_sendpath.pyx; changed only here, under the lock."""
        return self._queues

    # -- appending (any thread) ---------------------------------------------------------------

    def _reserve(self, need: int, deadline: float) -> None:
        """Take ``need`` bytes of ``buffer.memory``, waiting for the sender to free some."""
        need = min(need, self.buffer_memory)  # one oversized record may use all of it
        # Pooled buffers do not count here: the new batch takes one of them (_new_batch).
        if self._used + need > self.buffer_memory:
            if self.no_wait_thread is not None and threading.get_ident() == self.no_wait_thread:
                # The AsyncProducer's event loop, which also runs the sender that frees memory:
                # waiting here would stall both. The caller waits elsewhere (MemoryShortage).
                if self._closed:
                    raise self._closed_error()
                raise MemoryShortage(need)
            # Blocked for memory: counted, as Java's waiting-threads and bufferpool-wait-time.
            self.waiting += 1
            started = time.monotonic_ns()
            try:
                self._wait_for_memory(need, deadline)
            finally:
                self.waiting -= 1
                self.wait_ns_total += time.monotonic_ns() - started
        self._used += need

    def _wait_for_memory(self, need: int, deadline: float) -> None:
        while self._used + need > self.buffer_memory:
            if self._closed:
                raise self._closed_error()
            if self.wake_sender is not None:
                # Memory comes back only as batches are sent: make sure the sender is awake to
                # send the full ones (it may be asleep until linger or its idle timeout).
                self.wake_sender()
            left = deadline - time.monotonic()
            if left <= 0:
                raise KcoreTimeoutError(
                    f"buffer.memory ({self.buffer_memory} bytes) stayed full for max.block.ms: "
                    "the brokers take records slower than they are sent"
                )
            self._cond.wait(left)

    @property
    def available_bytes(self) -> int:
        """buffer.memory not taken by batches (pooled buffers count as free, as Java's)."""
        return self.buffer_memory - self._used

    def _new_batch(
        self, tp: TopicPartition, estimate: int, deadline: float, closed: bool = False
    ) -> ProducerBatch:
        # With the pool, a batch's buffer is made (or taken) at its capacity up front, and
        # counted whole: batches and pooled buffers together stay within buffer.memory.
        reserved = min(
            max(self.batch_size, estimate + BATCH_HEADER, self._capacity), self.buffer_memory
        )
        self._reserve(reserved, deadline)
        try:
            builder = RecordBatchBuilder(
                self.compression,
                compression_level=self.compression_level,
                pool=self._pool,
                # What was reserved, exactly (a large record's batch is larger than capacity;
                # a buffer.memory below it, smaller): the buffer never outgrows its count.
                # Without the pool, what is known to come (a large record, send_batch's chunk)
                # is made at once, not by doubling from the builder's 4 KiB start.
                capacity=min(max(self._capacity, estimate + BATCH_HEADER), reserved)
                if self._pool is not None
                else min(estimate + BATCH_HEADER, reserved),
                max_capacity=reserved,
            )
        except BaseException:  # (MemoryError, an interrupt): the reservation goes back
            self._used -= reserved
            self._memory_back()
            raise
        if self._pool is not None and self._used + self._pool.held_bytes > self.buffer_memory:
            self._pool.trim(max(0, self.buffer_memory - self._used))
        batch = ProducerBatch(tp, builder, reserved)
        batch.closed = closed
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        elif queue and not queue[-1].closed:
            # Another thread queued a batch while this one waited for memory: one open batch
            # per partition, always the last (invariant (a) of the send path's GIL rule).
            queue[-1].closed = True
        queue.append(batch)
        self.incomplete.add(batch.result)
        return batch

    def append(
        self,
        tp: TopicPartition,
        key: Any,
        value: Any,
        timestamp_ms: int,
        headers: Any,
        max_block_s: float,
    ) -> tuple[ProducerBatch, int, bool]:
        """Add one record; returns ``(batch, index in batch, wake the sender)``."""
        estimate = RECORD_OVERHEAD + _length(key) + _length(value)
        if headers:  # (as Java's estimate: a record's headers are part of its size)
            estimate += sum(8 + _length(k) + _length(v) for k, v in headers)
        with self._lock:
            if self._closed:
                raise self._closed_error()
            queue = self._queues.get(tp)
            batch = queue[-1] if queue else None
            wake = False
            if (
                batch is None
                or batch.closed
                or (batch.records and batch.builder.size_in_bytes + estimate > self.batch_size)
            ):
                if batch is not None and not batch.closed:
                    batch.closed = True
                    wake = True  # a full batch is ready to go
                batch = self._new_batch(tp, estimate, time.monotonic() + max_block_s)
                wake = True  # (also starts the linger clock on the sender's side)
            builder = batch.builder
            # The index comes from the append itself: the compiled send path appends to this
            # batch without the lock (the GIL rule in kcore/producer/_sendpath.pyx).
            try:
                index = builder.append(key, value, timestamp_ms, headers)
            except MemoryError:
                # The builder may have lost its buffer (RecordBatchBuilder.resize): no more
                # appends; the sender fails the batch when it cannot build it.
                batch.closed = True
                raise
            if builder.size_in_bytes >= self.batch_size:
                batch.closed = True
                wake = True
            return batch, index, wake

    def append_chunk(
        self,
        tp: TopicPartition,
        keys: Any,
        values: Any,
        timestamp_ms: Any,
        headers: Any,
        start: int,
        stop: int,
        estimate: int,
        max_block_s: float,
        rows: Any = None,
    ) -> tuple[ProducerBatch, int]:
        """Add rows ``start:stop`` of the columns, as many as fit ``batch.size``, as one batch
        of their own, queued closed (``_new_batch`` closes the partition's open batch): Python
        code runs between queueing it and the compiled loop, and the lock-free send path (its
        GIL rule: kcore/producer/_sendpath.pyx) must not slip a record in first (the chunk's
        records would no longer start at index 0).
        Returns the batch and how many rows it took (read from the call, not from the batch,
        which the sender may have sent and released by the time this returns)."""
        with self._lock:
            if self._closed:
                raise self._closed_error()
            batch = self._new_batch(tp, estimate, time.monotonic() + max_block_s, closed=True)
            try:
                taken: int = batch.builder.append_many(
                    keys, values, timestamp_ms, headers, start, stop, self.batch_size, rows
                )
            except BaseException:
                # Bad input: none of the chunk's records may go out (out of its queue, then
                # its memory given back as for a batch that landed).
                self._queues[tp].remove(batch)
                self.done(batch)
                raise
            return batch, taken

    def split(self, batch: ProducerBatch) -> list[ProducerBatch]:
        """Split a sent batch the broker refused as too large (MESSAGE_TOO_LARGE) into two
        halves queued in its place, as Java's producer splits one (it splits to ``batch.size``,
        which never shrinks a batch when ``batch.size`` is over the topic's limit; halving
        always does). The halves keep its creation time, attempts, producer id, epoch and
        sequence range (the first half its first sequence, the second the rest), so batches
        after it keep theirs; its result becomes the halves' (``BatchResult.split``)."""
        assert batch.payload is not None and batch.records > 1
        # First everything that may fail (decoding, encoding: e.g. out of memory), with no
        # state changed; then the swap, which does not fail.
        records = [r for b in decode_batches(batch.payload) for r in b.records()]
        middle = len(records) // 2
        halves: list[ProducerBatch] = []
        for number, part in enumerate((records[:middle], records[middle:])):
            builder = RecordBatchBuilder(self.compression, compression_level=self.compression_level)
            for _offset, timestamp, key, value, headers in part:
                builder.append(key, value, timestamp, headers or None)
            half = ProducerBatch(batch.tp, builder, 0)
            half.closed = True
            half.created = batch.created
            # Sent as often as the batch (a retry: it goes once nothing of its partition is in
            # flight), but with a fresh retries budget.
            half.attempts = half.free_attempts = batch.attempts
            half.span = batch.span / 2
            half.order = batch.order + number * half.span
            if batch.sequence is not None:
                half.sequence = (batch.sequence + number * middle) & 0x7FFFFFFF
                half.producer = batch.producer
            halves.append(half)
        with self._lock:
            # The halves hold the batch's reservation of buffer.memory between them.
            halves[0].reserved = batch.reserved // 2
            halves[1].reserved = batch.reserved - halves[0].reserved
            batch.reserved = 0
            batch.result.split(
                [(0, middle, halves[0].result), (middle, len(records) - middle, halves[1].result)]
            )
            for half in halves:
                self.incomplete.add(half.result)
                self.requeue(half, 0.0)
            self.done(batch)  # its bytes go; its result completes with the halves'
        return halves

    # -- draining (network thread) ------------------------------------------------------------

    def next_ready_in(self, now: float) -> float | None:
        """Seconds until some batch is ready (0: now), or None when nothing waits."""
        soonest: float | None = None
        with self._lock:
            for tp, queue in self._queues.items():
                if not queue or self._in_flight.get(tp, 0) >= self.max_in_flight:
                    continue
                head = queue[0]
                if head.closed or len(queue) > 1 or self._flushing or self._closed:
                    ready_at = head.retry_at
                else:
                    ready_at = max(head.created + self.linger_s, head.retry_at)
                wait = max(0.0, ready_at - now)
                if soonest is None or wait < soonest:
                    soonest = wait
        return soonest

    def drain(
        self, now: float, sendable: Callable[[TopicPartition, ProducerBatch, int], bool]
    ) -> list[ProducerBatch]:
        """Take the head batch of every partition that is ready, has fewer than
        ``max_in_flight`` batches in flight, and is ``sendable(tp, head, in_flight)`` (its
        leader is known, ordering allows it)."""
        out: list[ProducerBatch] = []
        emptied: list[TopicPartition] = []
        freed = False
        with self._lock:
            for tp, queue in self._queues.items():
                in_flight = self._in_flight.get(tp, 0)
                if not queue:
                    emptied.append(tp)
                    continue
                if in_flight >= self.max_in_flight:
                    continue
                head = queue[0]
                full = head.closed or len(queue) > 1 or self._flushing or self._closed
                if head.retry_at > now or (not full and now - head.created < self.linger_s):
                    continue
                if not sendable(tp, head, in_flight):
                    continue
                queue.popleft()
                head.closed = True  # out of its queue: (b) of the send path's GIL rule
                head.in_flight = True
                self._in_flight[tp] = in_flight + 1
                out.append(head)
                if self._pool is None and self._shrink_reservation(head):
                    freed = True
            # Empty queues go (the next batch makes a new one): every drain and wait walks
            # the queues, and a producer that wrote to many topics (a topic per hour, say)
            # would walk every partition it ever wrote to. The compiled send path only
            # appends to a queued open batch, so a queue gone under it sends it the slow way.
            for tp in emptied:
                if not self._queues.get(tp):  # (sendable may have requeued one meanwhile)
                    self._queues.pop(tp, None)
            if freed:
                self._memory_back()
        return out

    def _shrink_reservation(self, batch: ProducerBatch) -> bool:
        """A batch taken to be sent, whose buffer grew with its records (no pool), keeps
        reserved only what it can hold from now on: its buffer and one copy of its bytes
        (the built payload), below batch.size when it went out part full. Many partitions
        with little each (batches of a few records) otherwise ran out of buffer.memory with
        a fraction of it in use, and the send loop waited for memory. ``_lock`` held."""
        held = batch.builder.capacity + batch.builder.size_in_bytes
        if held >= batch.reserved:
            return False
        self._used -= batch.reserved - held
        batch.reserved = held
        return True

    def requeue(self, batch: ProducerBatch, retry_at: float) -> None:
        """Put a batch that must be retried back into its partition's queue in creation order,
        so retries go out in the order the records were sent."""
        with self._lock:
            batch.retry_at = retry_at
            queue = self._queues.setdefault(batch.tp, deque())
            position = 0
            while position < len(queue) and queue[position].order < batch.order:
                position += 1
            queue.insert(position, batch)
            self._landed(batch)

    def done(self, batch: ProducerBatch) -> None:
        """A batch was delivered or failed for good: free its memory and its partition."""
        self.done_all((batch,))

    def done_all(self, batches: Iterable[ProducerBatch]) -> None:
        """``done`` of each batch (a request's), under one lock and one wake-up of the threads
        waiting for memory."""
        with self._lock:
            incomplete, pool = self.incomplete, self._pool
            for batch in batches:
                self._landed(batch)
                self._used -= batch.reserved
                # The bytes go now, not when the batch object does: the send path keeps the
                # batch it saw last per partition (until its next record there), outside
                # buffer.memory.
                batch.payload = None
                if pool is not None:  # (what the pool may keep, before it is offered more)
                    pool.limit = 0 if self._closed else self.buffer_memory - self._used
                batch.builder.release()
                incomplete.discard(batch.result)
            self._memory_back()

    def _memory_back(self) -> None:
        """Wake the threads waiting for buffer.memory (memory came back, or the accumulator
        closed); ``_lock`` held. Only they wait on ``_cond``, each counted in ``waiting``
        under the lock before it waits."""
        if self.waiting:
            self._cond.notify_all()

    def _landed(self, batch: ProducerBatch) -> None:
        if not batch.in_flight:
            return
        batch.in_flight = False
        tp = batch.tp
        left = self._in_flight.get(tp, 0) - 1
        if left > 0:
            self._in_flight[tp] = left
        else:
            self._in_flight.pop(tp, None)

    def queued(self) -> dict[TopicPartition, tuple[int, int]]:
        """Per partition, the records waiting here (not sent yet) and their bytes as built so
        far (uncompressed, record framing included): the statistics' msgq_cnt/msgq_bytes."""
        with self._lock:
            out = {}
            for tp, queue in self._queues.items():
                batches = [b for b in queue if not b.in_flight]
                if batches:
                    out[tp] = (
                        sum(b.records for b in batches),
                        sum(b.builder.size_in_bytes for b in batches),
                    )
            return out

    def has_topic(self, topic: str) -> bool:
        """Whether records of ``topic`` wait here or are in flight."""
        with self._lock:
            return any(tp.topic == topic for tp, q in self._queues.items() if q) or any(
                tp.topic == topic for tp in self._in_flight
            )

    def waiting_earlier(self, tp: TopicPartition, order: float) -> bool:
        """Whether a batch of ``tp`` created before ``order`` waits to be (re)sent."""
        with self._lock:
            return any(b.order < order for b in self._queues.get(tp, ()))

    def reset_sequences(self, partitions: Collection[TopicPartition] | None = None) -> None:
        """A new producer epoch: waiting batches (of ``partitions``, or all) get new sequences
        when next sent. With ``partitions`` (an idempotent producer's epoch bump), a batch
        that may have been written keeps its numbering (``maybe_written``): renumbered, it
        would be written a second time."""
        with self._lock:
            for tp, queue in self._queues.items():
                if partitions is not None and tp not in partitions:
                    continue
                for b in queue:
                    if partitions is not None and b.maybe_written:
                        continue
                    b.sequence = None
                    b.payload = None
                    b.maybe_written = False

    def expire(self, now: float, timeout_s: float) -> list[ProducerBatch]:
        """Take out waiting batches older than ``delivery.timeout.ms``."""
        out: list[ProducerBatch] = []
        with self._lock:
            for queue in self._queues.values():
                while queue and now - queue[0].created > timeout_s:
                    batch = queue.popleft()
                    batch.closed = True  # out of its queue: (b) of the send path's GIL rule
                    out.append(batch)
        return out

    def abort_all(self) -> list[ProducerBatch]:
        with self._lock:
            out = [b for q in self._queues.values() for b in q]
            for q in self._queues.values():
                q.clear()
            for b in out:
                b.closed = True  # out of its queue: (b) of the send path's GIL rule
            return out

    def begin_flush(self) -> None:
        with self._lock:
            self._flushing += 1

    def end_flush(self) -> None:
        with self._lock:
            self._flushing -= 1

    def close(self, cause: BaseException | None = None) -> None:
        """No more records; ``cause``, when given, is named by every later append."""
        with self._lock:
            self._closed = True
            self._cause = cause
            if self._pool is not None:
                self._pool.trim(0)
            self._memory_back()

    def _closed_error(self) -> KcoreError:
        # A broker's fatal answer keeps its class, so a caller catches a later append's error
        # by the same type as the records it failed (Java fails later sends with that error).
        cause = self._cause
        if isinstance(cause, KafkaError):
            return cause.with_message(f"the producer is closed: {cause.message}")
        return KcoreError("the producer is closed" + (f": {cause}" if cause is not None else ""))

    def pending_results(self) -> list[BatchResult]:
        with self._lock:
            return list(self.incomplete)

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self.incomplete)


def _length(data: Any) -> int:
    """Bytes of a key or value (a memoryview, array or numpy array counts its bytes, not its
    items: the builder writes them all)."""
    if data is None:
        return 0
    if type(data) is bytes:  # the common case, without the try
        return len(data)
    try:
        return memoryview(data).nbytes
    except TypeError:
        try:
            return len(data)
        except TypeError:
            return 0
