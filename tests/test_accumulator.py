"""RecordAccumulator without a broker: the invariants the compiled send path relies on."""

from __future__ import annotations

import threading
import time

import pytest

from kcore.codec import decode_batches
from kcore.errors import ClusterAuthorizationFailedError, KcoreError, KcoreTimeoutError
from kcore.producer.accumulator import RecordAccumulator
from kcore.types import TopicPartition

TP = TopicPartition("t", 0)


def _accumulator(buffer_memory: int) -> RecordAccumulator:
    return RecordAccumulator(
        batch_size=100, linger_s=0.0, buffer_memory=buffer_memory, compression="none"
    )


def test_threads_waiting_for_memory_leave_one_open_batch_and_it_is_the_last() -> None:
    """Two threads find the partition's batch full while buffer.memory is used up; once memory
    comes back both queue a new batch. Only the last may be open (the send path appends to the
    open batch it saw last, so a second open one would take records out of order)."""
    acc = _accumulator(buffer_memory=300)
    full, _, _ = acc.append(TP, None, b"x" * 79, 0, None, 5.0)  # fills its batch: 161 reserved
    acc.append(TopicPartition("u", 0), None, b"y", 0, None, 5.0)  # 100 more: 261 of 300
    assert full.closed
    errors: list[BaseException] = []

    def send(value: bytes) -> None:
        try:
            acc.append(TP, None, value, 0, None, 5.0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(v,)) for v in (b"a", b"b")]
    for t in threads:
        t.start()
    time.sleep(0.2)  # both wait in _reserve
    for batch in acc.drain(time.monotonic() + 1, lambda tp, b, n: True):
        acc.done(batch)  # memory back: both threads go on
    for t in threads:
        t.join(5)
    assert not errors
    queue = acc._queues[TP]
    assert [b.closed for b in queue][:-1] == [True] * (len(queue) - 1)
    assert sum(b.records for b in queue) == 2


def test_append_returns_each_record_s_index_in_its_batch() -> None:
    acc = _accumulator(buffer_memory=10_000)
    got = [acc.append(TP, None, b"v", 0, None, 1.0) for _ in range(3)]
    batch = got[0][0]
    assert [(b is batch, index) for b, index, _ in got] == [(True, 0), (True, 1), (True, 2)]
    assert batch.records == 3 == batch.builder.record_count


def test_a_landed_batch_gives_its_memory_back_at_once() -> None:
    """done() frees the batch's bytes (payload and builder buffer) even while something
    still holds the batch (the send path keeps the batch it saw last per partition)."""
    acc = _accumulator(buffer_memory=10_000)
    batch, _, _ = acc.append(TP, None, b"v" * 50, 0, None, 1.0)
    (taken,) = acc.drain(time.monotonic() + 1, lambda tp, b, n: True)
    taken.payload = taken.builder.build()
    acc.done(taken)
    assert taken is batch and taken.payload is None and batch.records == 1
    assert acc._used == 0
    try:
        taken.builder.build()
    except ValueError as exc:
        assert "released" in str(exc)
    else:
        raise AssertionError("a released builder built a batch")


def test_a_chunk_s_batch_is_closed_while_it_is_filled() -> None:
    """append_chunk's batch is queued closed: Python code runs before its compiled loop (here,
    iterating the values), and a send on another thread must not append to it first (the
    chunk's records would not start at index 0, and their offsets would be reported wrong)."""
    acc = _accumulator(buffer_memory=10_000)
    acc.append(TP, None, b"open", 0, None, 1.0)  # an open batch the chunk must close
    seen: list[bool] = []

    class Values:
        def __len__(self) -> int:
            return 2

        def __iter__(self):
            seen.extend(b.closed for b in acc._queues[TP])
            return iter([b"a", b"b"])

    batch, taken = acc.append_chunk(TP, None, Values(), 0, None, 0, -1, 100, 1.0)
    assert seen == [True, True] and batch.closed and batch.records == taken == 2
    later, index, _ = acc.append(TP, None, b"c", 0, None, 1.0)
    assert later is not batch and index == 0


def test_a_chunk_with_bad_input_queues_nothing() -> None:
    acc = _accumulator(buffer_memory=10_000)
    try:
        acc.append_chunk(TP, None, [b"a", 5], 0, None, 0, -1, 100, 1.0)
    except TypeError:
        pass
    else:
        raise AssertionError("an int value was taken")
    assert not acc._queues[TP] and acc._used == 0 and not acc.incomplete


def test_a_batch_whose_builder_ran_out_of_memory_takes_no_more_records() -> None:
    """Out of memory while appending closes the batch (its builder may have lost its buffer):
    the next record starts a new batch instead of failing again, and building the old one
    raises. Run in a child with a capped address space, so the allocation really fails."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import resource
        from kcore.types import TopicPartition
        from kcore.producer.accumulator import RecordAccumulator
        tp = TopicPartition("t", 0)
        acc = RecordAccumulator(
            batch_size=1 << 30, linger_s=0.0, buffer_memory=1 << 31, compression="none"
        )
        batch, _, _ = acc.append(tp, None, b"v" * 100, 0, None, 1.0)
        big = memoryview(bytearray(256 << 20))
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (used + (64 << 20), hard))
        try:
            acc.append(tp, None, big, 0, None, 1.0)
        except MemoryError:
            print("MemoryError; closed:", batch.closed)
        later, index, _ = acc.append(tp, None, b"small", 0, None, 1.0)
        print("new batch:", later is not batch, index)
        try:
            batch.builder.build()
        except MemoryError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "MemoryError; closed: True",
        "new batch: True 0",
        "this batch builder ran out of memory; its 1 record(s) are lost",
    ]


def test_a_split_batch_s_halves_take_its_place_sequences_memory_and_futures() -> None:
    """What the sender does with a batch the broker refused as too large: two halves, queued
    where it was (before later batches), holding its sequence range and its reservation of
    buffer.memory; every record's future answers from the half its record went to (each half
    has its own base offset), also after a half is split again."""
    from kcore.producer.results import DeliveryFuture

    acc = RecordAccumulator(
        batch_size=10_000, linger_s=0.0, buffer_memory=100_000, compression="lz4"
    )
    futures = []
    for i in range(7):
        batch, index, _ = acc.append(TP, b"k%d" % i, b"v%d" % i, 1000 + i, [("h", b"%d" % i)], 5.0)
        futures.append(DeliveryFuture(batch.result, index, TP.topic, 0, 1000 + i))
    batch.closed = True
    later, _, _ = acc.append(TP, None, b"later", 2000, None, 5.0)
    (sent,) = acc.drain(time.monotonic() + 1, lambda tp, b, n: True)
    used = acc._used  # (a batch sent part full keeps reserved what it holds)
    assert sent is batch
    sent.sequence, sent.producer = 40, (7, 0)
    sent.payload = sent.builder.build()

    early: list = []  # waits from before the splits: its wait moves to the record's part
    early_waiter = threading.Thread(target=lambda: early.append(futures[4].result(30).offset))
    early_waiter.start()
    time.sleep(0.05)
    first, second = acc.split(sent)
    assert (first.records, second.records) == (3, 4)
    assert (first.sequence, second.sequence) == (40, 43)
    assert first.producer == second.producer == (7, 0)
    assert sent.order == first.order < second.order < later.order
    assert acc._used == used  # the halves hold the batch's reservation
    assert [b for b in acc._queues[TP]] == [first, second, later]
    assert not sent.result.done

    # The second half is too large again: its quarters take its place.
    acc._queues[TP].clear()
    second.payload = second.builder.build()
    third, fourth = acc.split(second)
    assert (third.records, fourth.records, third.sequence, fourth.sequence) == (2, 2, 43, 45)
    assert second.order == third.order < fourth.order < later.order

    waiting: list = []
    waiter = threading.Thread(target=lambda: waiting.append(futures[3].result(30).offset))
    waiter.start()  # waits on the record's part (the third quarter), not on the whole batch
    called: list = []
    futures[0].add_done_callback(lambda f: called.append(f.result(0).offset))
    first.result.complete(100)
    assert called == [100] and futures[0].done() and not futures[3].done()
    assert futures[1].result(0).offset == 101  # its half is done: no wait for the others
    third.result.complete(200)
    waiter.join(10)
    early_waiter.join(10)
    assert waiting == [200] and early == [201]
    assert not sent.result.done and "pending" in repr(futures[6])
    fourth.result.complete(300, log_append_time=5)
    assert sent.result.done and sent.result.error is None
    assert [f.result(0).offset for f in futures] == [100, 101, 102, 200, 201, 300, 301]
    assert futures[6].result(0).timestamp == 5  # the part's log append time
    assert sent.result.segments() == [(100, 3), (200, 2), (300, 2)]
    records = [r for b in decode_batches(fourth.builder.build()) for r in b.records()]
    assert [(r[1], r[2], r[3], r[4]) for r in records] == [
        (1005, b"k5", b"v5", (("h", b"5"),)),
        (1006, b"k6", b"v6", (("h", b"6"),)),
    ]


def test_a_split_batch_s_records_fail_with_their_own_half() -> None:
    from kcore.producer.results import DeliveryFuture

    acc = RecordAccumulator(
        batch_size=10_000, linger_s=0.0, buffer_memory=100_000, compression="none"
    )
    for i in range(4):
        batch, index, _ = acc.append(TP, None, b"v", 0, None, 5.0)
        assert index == i
    futures = [DeliveryFuture(batch.result, i, "t", 0, 0) for i in range(4)]
    (sent,) = acc.drain(time.monotonic() + 1, lambda tp, b, n: True)
    sent.payload = sent.builder.build()
    first, second = acc.split(sent)
    assert first.sequence is None and second.sequence is None  # not idempotent: none given
    second.result.fail(KcoreError("refused"))
    first.result.complete(10)
    assert [f.exception(0) is None for f in futures] == [True, True, False, False]
    assert futures[1].result(0).offset == 11
    assert str(sent.result.error) == "refused"
    assert "failed" in repr(futures[3]) and "done" in repr(futures[0])


def test_awaits_on_a_loop_follow_their_records_into_the_split_parts() -> None:
    """Awaits of a batch's records (a loop's futures gathered as they are, and plain awaits)
    wait in one list per loop; a split moves each to its record's part, so a part answered
    wakes its records' awaits without waiting for the other part."""
    import asyncio

    from kcore.producer.results import DeliveryFuture

    acc = RecordAccumulator(
        batch_size=10_000, linger_s=0.0, buffer_memory=100_000, compression="none"
    )
    for _ in range(4):
        batch, _, _ = acc.append(TP, None, b"v", 0, None, 5.0)
    (sent,) = acc.drain(time.monotonic() + 1, lambda tp, b, n: True)
    sent.payload = sent.builder.build()

    async def run() -> tuple[list, list]:
        loop = asyncio.get_running_loop()
        own = [DeliveryFuture(batch.result, i, "t", 0, 0, loop) for i in range(4)]
        plain = [DeliveryFuture(batch.result, i, "t", 0, 0) for i in range(4)]
        first_half = asyncio.gather(own[0], plain[1])
        second_half = asyncio.gather(plain[2], own[3])
        await asyncio.sleep(0)  # every await registered on the unsplit batch
        first, second = acc.split(sent)
        first.result.complete(10)
        got_first = await first_half
        assert not second_half.done()
        second.result.complete(20)
        return got_first, await second_half

    got_first, got_second = asyncio.run(run())
    assert [m.offset for m in got_first + got_second] == [10, 11, 20, 21]


def test_a_batch_wakes_a_loop_that_awaits_its_records_once() -> None:
    """1,000 awaited records of one batch, completed on another thread (a sync Producer's
    network thread): one call_soon_threadsafe to the awaiting loop, not one per record; a
    loop closed before the batch completes is skipped, and the completing thread goes on."""
    import asyncio

    from kcore.producer.results import BatchResult, DeliveryFuture

    class CountingLoop(asyncio.SelectorEventLoop):
        wakeups = 0

        def call_soon_threadsafe(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            CountingLoop.wakeups += 1
            return super().call_soon_threadsafe(*args, **kwargs)

    result = BatchResult()
    futures = [DeliveryFuture(result, i, "t", 0, 0) for i in range(1000)]

    async def run() -> list:
        gathered = asyncio.gather(*futures)
        await asyncio.sleep(0)
        before = CountingLoop.wakeups
        threading.Thread(target=result.complete, args=(7,)).start()
        got = await gathered
        assert CountingLoop.wakeups - before == 1
        return got

    loop = CountingLoop()
    try:
        got = loop.run_until_complete(run())
    finally:
        loop.close()
    assert [m.offset for m in got] == list(range(7, 1007))

    pending = BatchResult()
    waiting = DeliveryFuture(pending, 0, "t", 0, 0)
    closed = asyncio.new_event_loop()
    task = closed.create_task(_await(waiting))
    closed.run_until_complete(asyncio.sleep(0.01))  # its await is registered
    task.cancel()
    closed.run_until_complete(asyncio.sleep(0))
    closed.close()
    pending.complete(3)  # the hand-over to the closed loop is dropped
    assert waiting.result(0).offset == 3


async def _await(awaitable):  # type: ignore[no-untyped-def]
    return await awaitable


# -- the batch buffer pool (Java's BufferPool) -------------------------------------------------


def test_a_delivered_buffer_is_reused_only_when_nothing_else_holds_it() -> None:
    """A builder's buffer goes back to its pool on release only if no one else references it
    (what build() returned may still be in a caller's hands), and a reused buffer holds the new
    batch's bytes only: the records, the length and the hash are those of a fresh batch."""
    from kcore._codec import BatchBufferPool, RecordBatchBuilder

    pool = BatchBufferPool(min_buffer=1024, max_buffer=1 << 20, limit=8 << 20)

    def batch(payload: bytes, codec: str = "none") -> RecordBatchBuilder:
        b = RecordBatchBuilder(codec, pool=pool, capacity=64 << 10)
        for i in range(200):
            b.append(b"k%d" % i, payload, 1000 + i)
        return b

    first = batch(b"A" * 200)
    kept = first.build()
    first.release()
    assert len(pool) == 0  # `kept` still references it
    assert [r[3] for r in next(iter(decode_batches(kept))).records()][:1] == [b"A" * 200]
    del kept

    second = batch(b"B" * 200)
    second.build()  # the result dropped at once
    capacity = second.capacity
    second.release()
    assert len(pool) == 1 and pool.held_bytes == capacity == 64 << 10

    third = RecordBatchBuilder("none", pool=pool, capacity=64 << 10)
    assert len(pool) == 0 and pool.reuses == 1
    third.append(None, b"short", 7)
    out = third.build()
    assert out == bytes(out) and len(out) == len(bytes(out))
    assert hash(out) == hash(bytes(out))  # not a stale hash of the buffer's last batch
    [(offset, ts, key, value, headers)] = next(iter(decode_batches(out))).records()
    assert (offset, ts, key, value, headers) == (0, 7, None, b"short", ())

    # A compressed batch's own buffer (its output is a separate object) always comes back.
    lz4 = batch(b"C" * 200, "lz4")
    compressed = lz4.build()
    lz4.release()
    assert len(pool) == 1
    assert next(iter(decode_batches(compressed))).records()[0][3] == b"C" * 200


def test_the_pool_keeps_within_its_limit_and_size_bounds() -> None:
    from kcore._codec import BatchBufferPool, RecordBatchBuilder

    def released(pool: BatchBufferPool, capacity: int) -> None:
        b = RecordBatchBuilder("lz4", pool=pool, capacity=capacity)
        b.append(None, b"x", 0)
        b.release()

    limited = BatchBufferPool(min_buffer=32 << 10, max_buffer=128 << 10, limit=100 << 10)
    first = RecordBatchBuilder("lz4", pool=limited, capacity=64 << 10)
    second = RecordBatchBuilder("lz4", pool=limited, capacity=64 << 10)
    first.release()
    second.release()  # 128 KiB would pass the 100 KiB limit: let go
    assert len(limited) == 1 and limited.held_bytes == 64 << 10

    bounded = BatchBufferPool(min_buffer=32 << 10, max_buffer=128 << 10, limit=1 << 30)
    released(bounded, 16 << 10)  # under min_buffer
    released(bounded, 256 << 10)  # over max_buffer
    assert len(bounded) == 0
    released(bounded, 64 << 10)
    assert len(bounded) == 1
    # A builder that needs more than the pooled buffers hold lets them go and makes its own.
    big = RecordBatchBuilder("none", pool=bounded, capacity=96 << 10)
    assert big.capacity >= 96 << 10 and len(bounded) == 0 and bounded.held_bytes == 0
    released(bounded, 64 << 10)
    bounded.trim(0)
    assert len(bounded) == 0 and bounded.held_bytes == 0


def test_batches_and_pooled_buffers_stay_within_buffer_memory() -> None:
    """With batch.size large enough to pool, delivered batches' buffers are kept for the next
    ones, and batches in use plus pooled buffers never pass buffer.memory."""
    batch_size, memory = 100_000, 1_000_000
    acc = RecordAccumulator(
        batch_size=batch_size, linger_s=0.0, buffer_memory=memory, compression="none"
    )
    pool = acc._pool
    assert pool is not None
    partitions = [TopicPartition("t", p) for p in range(6)]
    value = b"v" * 1000
    for round_ in range(4):
        batches = []
        for i in range(300):  # 300 KB a round: 3+ batches of 6 partitions
            batch, _, _ = acc.append(partitions[i % 6], None, value, 0, None, 5.0)
            if batch not in batches:
                batches.append(batch)
            assert acc._used + pool.held_bytes <= memory, (round_, i)
        for batch in batches:
            batch.closed = True
            batch.payload = batch.builder.build()
        for batch in batches:
            acc.done(batch)
            assert acc._used + pool.held_bytes <= memory
        assert acc._used == 0 and 0 < pool.held_bytes <= memory
    assert pool.reuses > 0
    acc.close()
    assert pool.held_bytes == 0


def test_a_pooled_batch_is_made_at_its_capacity_and_counted_within_buffer_memory() -> None:
    """A new batch's buffer is batch.size + 16 KiB exactly (not the next power of two), and
    what is counted against buffer.memory never passes it, pool or not."""
    from kcore.producer.accumulator import BATCH_SLACK

    acc = RecordAccumulator(
        batch_size=100_000, linger_s=0.0, buffer_memory=240_000, compression="none"
    )
    batch, _, _ = acc.append(TP, None, b"v" * 1000, 0, None, 5.0)
    assert batch.builder.capacity == 100_000 + BATCH_SLACK
    assert batch.reserved == batch.builder.capacity
    other, _, _ = acc.append(TopicPartition("t", 1), None, b"v" * 1000, 0, None, 5.0)
    assert acc._used <= 240_000 and acc.available_bytes >= 0
    # A third partition's batch does not fit: it waits (and times out) rather than overshoot.
    try:
        acc.append(TopicPartition("t", 2), None, b"v", 0, None, 0.05)
    except KcoreError:
        pass
    assert acc._used <= 240_000
    for b in (batch, other):
        b.closed = True
        b.payload = b.builder.build()
        acc.done(b)
    assert acc._used == 0


def test_a_large_records_batch_is_made_at_what_it_reserved() -> None:
    """A record larger than batch.size gets a buffer of exactly its batch's reservation (it
    was made at batch.size + 16 KiB and doubled past it), and a buffer.memory below that
    capacity caps the buffer too."""
    acc = RecordAccumulator(
        batch_size=65536, linger_s=0.0, buffer_memory=1 << 20, compression="none"
    )
    batch, _, _ = acc.append(TP, None, b"v" * 100_000, 0, None, 5.0)
    assert batch.builder.capacity == batch.reserved >= 100_000
    assert batch.builder.size_in_bytes <= batch.builder.capacity
    small = RecordAccumulator(
        batch_size=65536, linger_s=0.0, buffer_memory=70_000, compression="none"
    )
    b, _, _ = small.append(TP, None, b"v" * 100, 0, None, 5.0)
    assert b.builder.capacity == b.reserved == 70_000 and small._used <= 70_000


def test_a_partition_s_empty_queue_goes_and_comes_back_with_its_next_batch() -> None:
    """Every drain walks the queues, so emptied ones go: a producer that wrote to many topics
    (one a day, say) would otherwise walk every partition it ever wrote to. A record for the
    partition after that queues a new batch as before, and ``has_topic`` (metadata.max.idle.ms)
    sees records waiting or in flight."""
    acc = _accumulator(buffer_memory=10_000)
    acc.append(TP, None, b"v", 0, None, 1.0)
    assert acc.has_topic("t") and not acc.has_topic("other")
    (sent,) = acc.drain(time.monotonic() + 1, lambda tp, b, n: True)
    assert acc.has_topic("t")  # in flight
    assert acc.drain(time.monotonic() + 1, lambda tp, b, n: True) == []
    assert TP not in acc._queues
    acc.done(sent)
    assert not acc.has_topic("t")
    again, index, _ = acc.append(TP, None, b"w", 0, None, 1.0)
    assert index == 0 and list(acc._queues[TP]) == [again]
    assert acc.drain(time.monotonic() + 1, lambda tp, b, n: True) == [again]


def test_send_batch_offers_each_chunk_about_what_the_last_one_took() -> None:
    """send_batch's row windows (kcore.producer.columns._next_window): a filled batch sets the
    next window to what it took and a quarter more, never under the estimate's rows (a lone
    record over batch.size takes 1); a group that ran out teaches nothing; a chunk that took
    every row offered (smaller records than estimated) doubles it."""
    from kcore.producer.columns import _next_window

    chunk = 1000
    assert _next_window(2000, 2000, 1800, chunk) == 1800 + 450 + 1
    assert _next_window(2000, 2000, 1, chunk) == chunk
    assert _next_window(2000, 3, 3, chunk) == 2000  # a partition's last 3 rows
    assert _next_window(2000, 2000, 2000, chunk) == 4000


def test_appends_after_a_fatal_broker_error_raise_that_error_s_class() -> None:
    """A producer closed by a broker's fatal answer (e.g. no IDEMPOTENT_WRITE for its producer
    id) refuses later records with the same class, so one ``except`` catches both a failed
    record and a refused one; a producer closed for another reason raises KcoreError."""
    acc = _accumulator(buffer_memory=1000)
    acc.close(ClusterAuthorizationFailedError("no IDEMPOTENT_WRITE"))
    with pytest.raises(ClusterAuthorizationFailedError, match="closed: no IDEMPOTENT_WRITE"):
        acc.append(TP, None, b"x", 0, None, 1.0)
    other = _accumulator(buffer_memory=1000)
    other.close(KcoreError("the sender stopped"))
    with pytest.raises(KcoreError, match="the producer is closed: the sender stopped") as info:
        other.append(TP, None, b"x", 0, None, 1.0)
    assert type(info.value) is KcoreError


def test_a_batch_sent_part_full_keeps_reserved_only_what_it_holds() -> None:
    """Without a buffer pool a batch's buffer grows with its records, so a batch sent with a
    few records (many partitions, little each) keeps reserved its buffer and one copy of its
    bytes, not batch.size: the memory it gives back lets a blocked send go on at once."""
    acc = RecordAccumulator(
        batch_size=16384, linger_s=0.0, buffer_memory=2 * 16384, compression="none"
    )
    for p in range(2):
        acc.append(TopicPartition("t", p), None, b"x" * 100, 0, None, 1.0)
    assert acc.available_bytes == 0  # batch.size reserved for each
    sent = acc.drain(time.monotonic() + 1, lambda tp, b, n: True)
    assert len(sent) == 2
    for batch in sent:
        assert batch.reserved == batch.builder.capacity + batch.builder.size_in_bytes < 16384
    assert acc.available_bytes == 2 * 16384 - sum(b.reserved for b in sent)
    acc.append(TopicPartition("t", 2), None, b"x" * 100, 0, None, 0.0)  # no wait needed
    for batch in sent:
        acc.done(batch)
    assert acc.available_bytes == 2 * 16384 - 16384  # the third partition's batch


def test_the_sticky_partitioner_moves_uniformly_among_partitions_with_a_leader() -> None:
    from collections import Counter

    from kcore.producer._sendpath import SendPath

    path = SendPath(None, TopicPartition, {}, None, 100)
    # Partitions 0-9 of 12 have a leader; the count (10) also leaves out 10 and 11.
    available = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11]
    chosen = []
    for _ in range(20_000):
        # 100 bytes fill the sticky partition's batch: every call moves on
        chosen.append(path.sticky_partition("t", 10, available, 100))
    assert all(a != b for a, b in zip(chosen, chosen[1:], strict=False))
    counts = Counter(chosen)
    assert set(counts) == set(range(10))
    assert min(counts.values()) > 1_700 and max(counts.values()) < 2_300  # 2,000 each
    # Until batch.size bytes went to it, the partition stays.
    first = path.sticky_partition("u", 10, available, 30)
    assert path.sticky_partition("u", 10, available, 30) == first
    # One partition with a leader: that one, always; none: any of the count.
    assert {path.sticky_partition("v", 10, [4], 100) for _ in range(50)} == {4}
    assert {path.sticky_partition("w", 3, [], 100) for _ in range(200)} == {0, 1, 2}


def test_the_send_path_hands_a_new_batch_to_new_batch_and_everything_else_to_slow() -> None:
    """A record whose partition has no open batch it fits goes to ``new_batch`` (the
    accumulator appends it to a new batch under its lock); the path makes its future from the
    index returned and appends the next records itself. ``new_batch`` returning None sends the
    record the full way (``slow``)."""
    from types import SimpleNamespace

    from kcore.cluster.metadata import ClusterMetadata, PartitionInfo, TopicInfo
    from kcore.producer._sendpath import SendPath

    acc = RecordAccumulator(batch_size=300, linger_s=1.0, buffer_memory=1 << 20, compression="none")
    parts = {p: PartitionInfo("t", p, 1) for p in range(2)}
    cache = SimpleNamespace(
        current=ClusterMetadata(topics={"t": TopicInfo("t", None, parts)}), on_update=[]
    )
    opened: list[tuple[TopicPartition, bytes | None, bytes | None, int]] = []
    slow: list[tuple[object, ...]] = []

    def new_batch(tp: TopicPartition, key: bytes | None, value: bytes | None, ts: int) -> object:
        opened.append((tp, key, value, ts))
        batch, index, _wake = acc.append(tp, key, value, ts, None, 1.0)
        return batch, index

    path = SendPath(
        lambda *args: slow.append(args),
        TopicPartition,
        acc.queues,
        cache,
        300,
        new_batch=new_batch,
    )
    futures = [path.send("t", b"v" * 100, partition=1, timestamp_ms=1_000 + i) for i in range(5)]
    # Two records of ~120 bytes fit a 300-byte batch: a new batch for the 1st, 3rd and 5th.
    assert [(o[0], o[3]) for o in opened] == [
        (TopicPartition("t", 1), 1_000 + i) for i in (0, 2, 4)
    ]
    assert [f._index for f in futures] == [0, 1, 0, 1, 0]
    batches = list(acc.queues[TopicPartition("t", 1)])
    assert [b.records for b in batches] == [2, 2, 1]
    assert [f._batch for f in futures] == [b.result for b in batches for _ in range(b.records)]
    assert [b.closed for b in batches] == [True, True, False]
    records = [r for b in batches for r in decode_batches(b.builder.build())[0].records()]
    assert [(r[1], r[3]) for r in records] == [(1_000 + i, b"v" * 100) for i in range(5)]
    assert not slow
    path.new_batch = lambda *args: None  # e.g. the AsyncProducer's loop short of memory
    path.send("t", b"w", partition=0, timestamp_ms=7)
    assert slow == [("t", b"w", None, 0, 7, None, None)]


def test_the_send_path_routes_by_the_metadata_the_cache_last_announced() -> None:
    """The send path reads the cache's snapshot again only after ``on_update`` said it changed
    (a flag, not an attribute lookup a record), and keeps the last topic's route: a partition
    added to the topic is routed to compiled once the cache announces it, and a topic sent to
    with an equal but distinct str object goes the same way."""
    from types import SimpleNamespace

    from kcore.cluster.metadata import ClusterMetadata, PartitionInfo, TopicInfo
    from kcore.producer._sendpath import SendPath

    def snapshot(count: int) -> ClusterMetadata:
        parts = {p: PartitionInfo("topic", p, 1) for p in range(count)}
        return ClusterMetadata(topics={"topic": TopicInfo("topic", None, parts)})

    acc = RecordAccumulator(batch_size=300, linger_s=1.0, buffer_memory=1 << 20, compression="none")
    cache = SimpleNamespace(current=snapshot(2), on_update=[])
    slow: list[tuple[object, ...]] = []

    def new_batch(tp: TopicPartition, key: bytes | None, value: bytes | None, ts: int) -> object:
        batch, index, _wake = acc.append(tp, key, value, ts, None, 1.0)
        return batch, index

    path = SendPath(
        lambda *args: slow.append(args), TopicPartition, acc.queues, cache, 300, new_batch=new_batch
    )
    assert cache.on_update == [path.metadata_updated]
    path.send("topic", b"a", partition=1, timestamp_ms=1)
    path.send("topic", b"b", partition=2, timestamp_ms=2)  # not in the snapshot: the full way
    assert slow == [("topic", b"b", None, 2, 2, None, None)]
    cache.current = snapshot(3)
    path.send("topic", b"c", partition=2, timestamp_ms=3)  # not announced yet: the old route
    assert len(slow) == 2
    for callback in cache.on_update:
        callback()
    topic = "".join(["to", "pic"])  # equal to "topic", another object
    future = path.send(topic, b"d", partition=2, timestamp_ms=4)
    assert len(slow) == 2 and future.partition == 2
    assert acc.queues[TopicPartition("topic", 2)][-1].records == 1
    cache.current = ClusterMetadata()  # the topic is gone: the full way again
    path.metadata_updated()
    path.send("topic", b"e", partition=0, timestamp_ms=5)
    assert len(slow) == 3


def test_send_batch_result_sleeps_once_for_all_its_batches() -> None:
    """``SendBatchResult.result`` waits for thousands of batches (a record or two each when the
    values are large) with one sleep, not one a batch (each a wake-up from the thread that
    completes them); what it returns is still in send order, and a failed batch still raises
    its error once the batches before it are done."""
    from kcore.producer.results import BatchResult, SendBatchResult

    out = SendBatchResult("t")
    parts = [BatchResult() for _ in range(2000)]
    for i, r in enumerate(parts):
        out.add(i % 6, 1, r)

    def complete_from_the_end() -> None:
        time.sleep(0.05)  # result() is waiting by now
        for i, r in reversed(list(enumerate(parts))):
            r.complete(1000 + i)

    for _ in range(3):  # a caller polling: one countdown, registered once
        with pytest.raises(KcoreTimeoutError):
            out.result(0.001)
    assert all(len(r._callbacks or ()) == 1 for r in parts)
    threading.Thread(target=complete_from_the_end).start()
    assert out.result(10) == [(i % 6, 1000 + i, 1) for i in range(2000)]
    assert all(r._cond is None for r in parts)  # no batch was waited on by itself

    # A batch failed before anything waited: the earlier ones are still waited for.
    failing = SendBatchResult("t")
    first, second, third, fourth = (BatchResult() for _ in range(4))
    for i, r in enumerate((first, second, third, fourth)):
        failing.add(i, 1, r)
    second.fail(KcoreError("refused"))
    with pytest.raises(KcoreTimeoutError):  # the first is not done: the wait runs out
        failing.result(0.1)
    threading.Timer(0.05, first.complete, args=(5,)).start()
    with pytest.raises(KcoreError, match="refused"):
        failing.result(5)

    # A batch fails while the caller sleeps: it wakes, and raises once those before are done.
    failing = SendBatchResult("t")
    first, second, third = (BatchResult() for _ in range(3))
    for i, r in enumerate((first, second, third)):
        failing.add(i, 1, r)
    threading.Timer(0.05, third.fail, args=(KcoreError("too large"),)).start()
    threading.Timer(0.2, first.complete, args=(5,)).start()
    threading.Timer(0.25, second.complete, args=(6,)).start()
    with pytest.raises(KcoreError, match="too large"):
        failing.result(5)


def test_an_unpooled_batch_buffer_is_made_for_the_record_it_starts_with() -> None:
    """Below the pool's batch.size, a batch's buffer starts at 4 KiB and doubles as records
    come; a record known to be larger (or send_batch's chunk) gets its buffer at that size at
    once: a 10 KB record's batch holds about 10 KB, not the 16 KiB doubling would reach."""
    acc = RecordAccumulator(
        batch_size=16384, linger_s=0.0, buffer_memory=1 << 20, compression="none"
    )
    big, _, _ = acc.append(TP, None, b"x" * 10_000, 0, None, 5.0)
    assert 10_000 < big.builder.capacity < 10_200
    small, _, _ = acc.append(TopicPartition("t", 1), None, b"y" * 100, 0, None, 5.0)
    assert small.builder.capacity == 4096


def test_an_awaited_send_batch_result_resumes_once_for_all_its_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``await send_batch(...)``'s result registers one countdown, not a waiter per batch that
    resumes the awaiting task once a batch; it returns in send order, and a failed batch
    raises its error once every batch is done."""
    import asyncio

    from kcore.producer.results import BatchResult, SendBatchResult

    async def run(out: SendBatchResult, parts: list[BatchResult], fail_at: int = -1) -> list:
        loop = asyncio.get_running_loop()

        def complete_from_the_end() -> None:
            for i, r in reversed(list(enumerate(parts))):
                if i == fail_at:
                    r.fail(KcoreError("refused"))
                else:
                    r.complete(1000 + i)

        loop.call_later(0.02, complete_from_the_end)
        return await out

    watched = []  # what waited on a batch of its own (one resumption each)
    watch = BatchResult.watch
    monkeypatch.setattr(
        BatchResult, "watch", lambda self, *a, **k: watched.append(self) or watch(self, *a, **k)
    )
    parts = [BatchResult() for _ in range(500)]
    out = SendBatchResult("t")
    for i, r in enumerate(parts):
        out.add(i % 6, 1, r)
    assert asyncio.run(run(out, parts)) == [(i % 6, 1000 + i, 1) for i in range(500)]
    assert watched == []

    parts = [BatchResult() for _ in range(3)]
    failing = SendBatchResult("t")
    for i, r in enumerate(parts):
        failing.add(i, 1, r)
    with pytest.raises(KcoreError, match="refused"):
        asyncio.run(run(failing, parts, fail_at=1))
    assert all(r.done for r in parts)
