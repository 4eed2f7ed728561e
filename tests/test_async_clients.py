"""The asyncio clients against a real broker: nothing blocks the caller's event loop (a full
buffer.memory waits off it), close() may be cancelled and still finishes, an ``async def``
on_delivery runs, and misuse (before start, another loop, after close) is an error."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from conftest import wait_stopped

import kcore
from kcore.admin import NewTopic, TopicPartition
from kcore.errors import KcoreError


def _topic(bootstrap: str, partitions: int = 3) -> str:
    name = f"async-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])
    return name


async def _ticker(ticks: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        ticks.append(loop.time())
        await asyncio.sleep(0.01)


def _longest_gap(ticks: list[float]) -> float:
    return max((b - a for a, b in zip(ticks, ticks[1:], strict=False)), default=0.0)


def test_a_full_buffer_memory_waits_off_the_event_loop(kafka_cluster):
    """send_batch of 4x buffer.memory and a send loop through a tiny buffer: every record is
    delivered, and the loop keeps running meanwhile (it runs the sender that frees memory:
    blocking it stalled everything for max.block.ms, then failed)."""
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs)
    config = {
        "bootstrap.servers": bs,
        "buffer.memory": 64 * 1024,
        "batch.size": 16 * 1024,
        "max.block.ms": 20000,
    }

    async def run() -> tuple[int, int, float]:
        ticks: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.ensure_future(_ticker(ticks, stop))
        async with kcore.AsyncProducer(config) as producer:
            values = [b"%06d" % i + b"x" * 200 for i in range(1300)]  # ~270 KB
            result = await producer.send_batch(topic, values)
            futures = [
                await producer.send(topic, b"one-by-one %d" % i + b"y" * 500) for i in range(300)
            ]
            await producer.flush(30)
            delivered = sum(count for _, _, count in await result)
            for f in futures:
                await f
        stop.set()
        await ticker
        return delivered, len(futures), _longest_gap(ticks)

    delivered, sent, gap = asyncio.run(run())
    assert delivered == 1300 and sent == 300
    assert gap < 2.0, f"the event loop stood still for {gap:.2f}s"
    with kcore.AdminClient({"bootstrap.servers": bs}) as admin:
        ends = admin.list_offsets({(topic, p): "latest" for p in range(3)})
    assert sum(r.offset for r in ends.values()) == 1600


def test_close_may_be_cancelled_and_still_finishes(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs)

    async def run() -> None:
        producer = await kcore.AsyncProducer({"bootstrap.servers": bs, "linger.ms": 50}).start()
        futures = [await producer.send(topic, b"v%d" % i) for i in range(100)]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(producer.close(), 0.001)  # cut short at once
        await producer.close()  # waits for the same closing, which went on
        assert all(f.done() for f in futures)
        assert [(await f).topic for f in futures[:1]] == [topic]
        with pytest.raises(KcoreError, match="closed"):
            await producer.send(topic, b"late")

    asyncio.run(run())


def test_an_async_on_delivery_runs_on_the_producers_loop(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs)

    async def run() -> list:
        seen: list = []
        loop = asyncio.get_running_loop()

        async def on_delivery(err, metadata) -> None:
            await asyncio.sleep(0)
            seen.append(
                (err, metadata.partition if metadata else None, asyncio.get_running_loop() is loop)
            )

        async with kcore.AsyncProducer({"bootstrap.servers": bs}) as producer:
            for i in range(5):
                await producer.send(topic, b"%d" % i, partition=1, on_delivery=on_delivery)
            await producer.flush(30)
            for _ in range(100):
                if len(seen) == 5:
                    break
                await asyncio.sleep(0.01)
        return seen

    assert asyncio.run(run()) == [(None, 1, True)] * 5


def test_misuse_is_an_error_not_a_hang(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)

    async def before_start() -> None:
        producer = kcore.AsyncProducer({"bootstrap.servers": bs})
        with pytest.raises(KcoreError, match="not started"):
            await producer.send(topic, b"x")
        await producer.close()
        consumer = kcore.AsyncConsumer({"bootstrap.servers": bs})
        consumer.assign([TopicPartition(topic, 0)])
        with pytest.raises(KcoreError, match="not started"):
            await consumer.poll(0.1)
        await consumer.close()

    asyncio.run(before_start())

    async def started() -> kcore.AsyncProducer:
        return await kcore.AsyncProducer({"bootstrap.servers": bs}).start()

    loop_a = asyncio.new_event_loop()
    try:
        producer = loop_a.run_until_complete(started())

        async def from_another_loop() -> None:
            with pytest.raises(KcoreError, match="another|other than"):
                await producer.send(topic, b"x")

        asyncio.run(from_another_loop())
        loop_a.run_until_complete(producer.close())
    finally:
        loop_a.close()

    async def after_close() -> None:
        consumer = await kcore.AsyncConsumer({"bootstrap.servers": bs}).start()
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.close()
        with pytest.raises(KcoreError, match="closed"):
            await consumer.poll(0.1)

    asyncio.run(after_close())
    consumer = kcore.Consumer({"bootstrap.servers": bs})
    consumer.assign([TopicPartition(topic, 0)])
    consumer.close()
    with pytest.raises(KcoreError, match="closed"):
        consumer.poll(0.1)


def test_an_event_loop_that_ends_without_close_fails_the_records_loudly(kafka_cluster, caplog):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    futures: list = []

    async def run() -> None:
        producer = await kcore.AsyncProducer({"bootstrap.servers": bs, "linger.ms": 60000}).start()
        for i in range(10):
            futures.append(await producer.send(topic, b"%d" % i))
        # no close(): asyncio.run cancels the sender as the loop ends

    asyncio.run(run())
    assert all(f.done() for f in futures)
    with pytest.raises(KcoreError, match="event loop ended before close"):
        futures[0].result(0)
    assert "event loop ended before close" in caplog.text


def test_an_on_assign_cut_short_by_a_cancelled_poll_is_finished_by_the_next(kafka_cluster):
    """asyncio.wait_for(consumer.poll(), ...) cancels a poll whose async on_assign is still
    running (seeking to offsets kept elsewhere, say): the listener goes on, and the next poll
    waits for it before handing out records, so they start where it sought."""
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    with kcore.Producer({"bootstrap.servers": bs}) as producer:
        for i in range(20):
            producer.send(topic, b"%d" % i)

    async def run() -> tuple[list, list[int]]:
        events: list = []
        config = {
            "bootstrap.servers": bs,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
        async with kcore.AsyncConsumer(config) as consumer:

            async def on_assign(partitions) -> None:
                events.append("assign started")
                await asyncio.sleep(1.0)
                for tp in partitions:
                    consumer.seek(tp, 15)  # as if the offset were kept outside Kafka
                events.append("assign done")

            consumer.subscribe([topic], on_assign=on_assign)
            got: list = []
            cancelled = 0
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while len(got) < 5 and loop.time() < deadline:
                try:
                    got += await asyncio.wait_for(consumer.poll(2.0), 0.3)
                except asyncio.TimeoutError:
                    cancelled += 1
            events.append(("cancelled polls", cancelled > 0))
            return events, [r.offset for r in got]

    events, offsets = asyncio.run(run())
    assert events[:2] == ["assign started", "assign done"] and events[2] == (
        "cancelled polls",
        True,
    )
    assert offsets == [15, 16, 17, 18, 19]


def test_a_later_close_with_a_deadline_forces_a_waiting_one(kafka_cluster):
    """close() with no timeout waits for records a stopped (SIGSTOPped) broker does not
    answer; a later close(0.5) ends it at its own deadline, failing what is left, as Java's
    close(timeout)."""
    import os
    import signal

    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    pid = kafka_cluster.nodes[0].process.pid

    async def run() -> float:
        producer = await kcore.AsyncProducer({"bootstrap.servers": bs}).start()
        await (await producer.send(topic, b"warm"))  # connected, metadata known
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_stopped(pid)  # (a thread busy in the kernel stops late: seen once in CI)
            future = await producer.send(topic, b"never answered")
            first = asyncio.ensure_future(producer.close())
            await asyncio.sleep(0.5)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await producer.close(0.5)
            took = loop.time() - started
            await asyncio.wait_for(first, 30)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert future.done()
        with pytest.raises(KcoreError):
            future.result(0)
        return took

    assert asyncio.run(run()) < 15


def test_a_rebalance_cut_short_by_a_cancelled_poll_runs_on_revoke_once(kafka_cluster):
    """An eager rebalance whose async on_revoke is still running when asyncio.wait_for
    cancels the poll: the group step goes on in the background and the next poll waits for
    it, so on_revoke runs once (a step cut short ran it again and could leave partitions
    unassigned), and the member ends up with its share."""
    import threading

    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 4)
    group = f"g-{topic}"
    config = {
        "bootstrap.servers": bs,
        "group.id": group,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "range",
    }
    other_done = threading.Event()
    other_owned: list = []

    def other_member() -> None:
        with kcore.Consumer(config) as c:
            c.subscribe([topic])
            while not other_done.is_set():
                c.poll(0.2)
                other_owned[:] = sorted(c.assignment())

    async def run() -> tuple[int, int]:
        revokes = 0

        async def on_revoke(partitions) -> None:
            nonlocal revokes
            if partitions:
                revokes += 1
                await asyncio.sleep(1.0)

        async with kcore.AsyncConsumer(config) as consumer:
            consumer.subscribe([topic], on_revoke=on_revoke)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while len(consumer.assignment()) < 4 and loop.time() < deadline:
                await consumer.poll(0.2)
            assert len(consumer.assignment()) == 4
            thread = threading.Thread(target=other_member, daemon=True)
            thread.start()
            try:
                while loop.time() < deadline and not (
                    len(consumer.assignment()) == 2 and len(other_owned) == 2
                ):
                    try:
                        await asyncio.wait_for(consumer.poll(1.0), 0.3)
                    except asyncio.TimeoutError:
                        pass
                return revokes, len(consumer.assignment())
            finally:
                other_done.set()
                thread.join(30)

    revokes, owned = asyncio.run(run())
    assert (revokes, owned) == (1, 2)


# -- awaited delivery futures ---------------------------------------------------------------------


def _end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        ends = admin.list_offsets({(topic, p): "latest" for p in range(partitions)})
    return {tp.partition: r.offset for tp, r in ends.items()}


def test_many_awaited_futures_complete_in_order_per_partition(kafka_cluster):
    """20,000 sends gathered at once (an AsyncProducer's futures are asyncio futures of its
    loop: gather takes them as they are) and a few awaited one by one: each record's offset,
    per partition, is its place in send order, and the partitions' ends count them all."""
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 3)
    n = 20_000

    async def run() -> tuple[list, list]:
        async with kcore.AsyncProducer({"bootstrap.servers": bs, "linger.ms": 5}) as producer:
            futures = [await producer.send(topic, b"%06d" % i) for i in range(n)]
            assert all(asyncio.isfuture(f) for f in futures[:10])
            assert futures[0].get_loop() is asyncio.get_running_loop()
            gathered = await asyncio.gather(*futures)
            one_by_one = [await f for f in futures[:100]]
            return futures, gathered + one_by_one

    futures, metas = asyncio.run(run())
    gathered, one_by_one = metas[:n], metas[n:]
    assert one_by_one == gathered[:100]
    per_partition: dict[int, list[int]] = {}
    for future, meta in zip(futures, gathered, strict=True):
        assert (meta.topic, meta.partition) == (topic, future.partition)
        per_partition.setdefault(meta.partition, []).append(meta.offset)
    for offsets in per_partition.values():
        assert offsets == list(range(len(offsets)))
    assert _end_offsets(bs, topic, 3) == {p: len(o) for p, o in per_partition.items()} | {
        p: 0 for p in range(3) if p not in per_partition
    }


def test_a_delivery_failure_reaches_every_awaiting_future(kafka_cluster):
    """Records the broker refuses (over the topic's max.message.bytes: batches split down to
    one record, each refused) and one the producer refuses before queueing (over
    max.request.size): every future, gathered or awaited, raises the kcore error, and the
    records that fit are delivered."""
    from kcore.errors import MessageTooLargeError

    bs = kafka_cluster.bootstrap_servers
    topic = f"async-too-large-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient({"bootstrap.servers": bs}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"})])
    config = {"bootstrap.servers": bs, "max.request.size": 100_000, "linger.ms": 20}

    async def run() -> tuple[list, BaseException, list]:
        async with kcore.AsyncProducer(config) as producer:
            refused = [await producer.send(topic, b"x" * 3000) for _ in range(30)]
            never_queued = await producer.send(topic, b"y" * 200_000)
            fits = [await producer.send(topic, b"z" * 10) for _ in range(5)]
            outcomes = await asyncio.gather(*refused, return_exceptions=True)
            with pytest.raises(MessageTooLargeError):
                await refused[0]  # awaited again: the same error
            with pytest.raises(MessageTooLargeError, match="max.request.size"):
                await never_queued
            late = [f.exception() for f in refused]
            return outcomes, late[0], await asyncio.gather(*fits)

    outcomes, late, delivered = asyncio.run(run())
    assert len(outcomes) == 30
    assert all(isinstance(e, MessageTooLargeError) for e in outcomes), outcomes[:3]
    assert isinstance(late, KcoreError)
    assert sorted(m.offset for m in delivered) == list(range(5))


def test_on_delivery_callbacks_and_awaits_mix(kafka_cluster):
    """Records with an on_delivery (plain and async def) among records without: awaiting
    gives each record the metadata its callback got, and by the time the gather returns every
    plain callback has run (it runs as the batch completes, before the wake-ups)."""
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 2)

    async def run() -> tuple[dict, dict, list, list]:
        plain: dict = {}
        from_async: dict = {}

        def on_delivery(err, metadata) -> None:
            assert err is None
            plain[(metadata.partition, metadata.offset)] = metadata

        async def on_delivery_async(err, metadata) -> None:
            await asyncio.sleep(0)
            from_async[(metadata.partition, metadata.offset)] = metadata

        async with kcore.AsyncProducer({"bootstrap.servers": bs}) as producer:
            futures = []
            for i in range(3000):
                callback = (None, on_delivery, on_delivery_async)[i % 3]
                futures.append(
                    await producer.send(topic, b"%d" % i, b"k%d" % i, on_delivery=callback)
                )
            metas = await asyncio.gather(*futures)
            seen_plain = len(plain)
            await producer.flush(30)
            for _ in range(200):
                if len(from_async) == 1000:
                    break
                await asyncio.sleep(0.01)
        return plain, from_async, metas, [seen_plain]

    plain, from_async, metas, (seen_plain,) = asyncio.run(run())
    assert seen_plain == 1000
    assert [plain[(m.partition, m.offset)] for m in metas[1::3]] == metas[1::3]
    assert [from_async[(m.partition, m.offset)] for m in metas[2::3]] == metas[2::3]
    assert len({(m.partition, m.offset) for m in metas}) == 3000


def test_a_cancelled_await_does_not_take_the_record_back(kafka_cluster):
    """A task awaiting a future on the producer's loop is cancelled at once: the future is
    cancelled (as any asyncio future), the record is still delivered and its on_delivery gets
    the metadata; asyncio.wait_for on a future times out as on any future."""
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)

    async def run() -> tuple[list, list]:
        delivered: list = []
        config = {"bootstrap.servers": bs, "linger.ms": 60000}  # sent at flush only
        async with kcore.AsyncProducer(config) as producer:
            future = await producer.send(
                topic, b"kept", on_delivery=lambda e, m: delivered.append((e, m.offset))
            )
            task = asyncio.ensure_future(future)
            waiter = asyncio.get_running_loop().create_task(_await(future))
            await asyncio.sleep(0.05)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert future.cancelled() and task is future
            with pytest.raises(asyncio.CancelledError):
                future.result()
            other = await producer.send(topic, b"timed out")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(other, 0.05)
            last = await producer.send(topic, b"last")
            await producer.flush(30)
            return delivered, [(await last).offset]

    delivered, last = asyncio.run(run())
    assert delivered == [(None, 0)] and last == [2]
    assert _end_offsets(bs, topic, 1) == {0: 3}


async def _await(awaitable):
    return await awaitable


def test_futures_awaited_from_two_loops_in_two_threads(kafka_cluster, caplog):
    """One sync Producer, sending from two threads, each awaiting its own futures and the
    other's on its own event loop (a batch wakes each waiting loop once); an AsyncProducer's
    futures awaited on another thread's loop too. A loop closed while its awaits were
    pending drops its wake-up: the delivery goes on, nothing is logged, and the futures
    still answer."""
    import threading

    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 2)
    n = 2000
    with kcore.Producer({"bootstrap.servers": bs}) as producer:
        sent: dict[str, list] = {}
        both_sent = threading.Barrier(2)
        results: dict[str, list] = {}
        errors: list[BaseException] = []

        def thread(me: str, other: str) -> None:
            async def run() -> list:
                sent[me] = [producer.send(topic, b"%s-%d" % (me.encode(), i)) for i in range(n)]
                both_sent.wait(30)
                assert not asyncio.isfuture(sent[me][0])  # a plain awaitable on any loop
                return await asyncio.gather(*sent[me], *sent[other])

            try:
                results[me] = asyncio.run(run())
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=thread, args=("a", "b")),
            threading.Thread(target=thread, args=("b", "a")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert results["a"] == results["b"][n:] + results["b"][:n]
        assert len({(m.partition, m.offset) for m in results["a"]}) == 2 * n

        # A loop closed before delivery: its wake-up is dropped.
        lingering = kcore.Producer({"bootstrap.servers": bs, "linger.ms": 60000})
        try:
            pending = [lingering.send(topic, b"p%d" % i) for i in range(100)]

            async def give_up() -> None:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.gather(*pending), 0.05)

            with caplog.at_level("WARNING"):
                asyncio.run(give_up())  # (closes its loop)
                lingering.flush(30)
            assert [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")] == []
            assert all(f.result(0).offset >= 0 for f in pending)
        finally:
            lingering.close()

    # An AsyncProducer's futures awaited on its own loop and on another thread's loop.
    async def async_side() -> tuple[list, list]:
        async with kcore.AsyncProducer({"bootstrap.servers": bs}) as aproducer:
            futures = [await aproducer.send(topic, b"async-%d" % i) for i in range(n)]
            elsewhere: list = []

            def other_loop() -> None:
                elsewhere.extend(asyncio.run(_gather(futures)))

            t = threading.Thread(target=other_loop)
            t.start()
            here = await asyncio.gather(*futures)
            await asyncio.get_running_loop().run_in_executor(None, t.join, 60)
            return here, elsewhere

    here, elsewhere = asyncio.run(async_side())
    assert here == elsewhere and len(here) == n


async def _gather(futures):
    return await asyncio.gather(*futures)
