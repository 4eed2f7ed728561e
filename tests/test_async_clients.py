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
