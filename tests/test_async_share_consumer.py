"""kcore.AsyncShareConsumer against a real Kafka broker: several members on one event loop
sharing a topic, each record accepted once; released records coming back with a higher
delivery count; close releasing what a member holds; poll_arrow and batch acknowledgement."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from share_helpers import group_config, new_share_topic, produce

from kcore import AcknowledgeType, AsyncShareConsumer, ShareRecord
from kcore.errors import AcknowledgementError, KcoreError

EXPLICIT = {"share.acknowledgement.mode": "explicit"}


@pytest.fixture
def share_topic(kafka_cluster: Any) -> tuple[str, str]:
    return new_share_topic(kafka_cluster)


def consumer(cluster: Any, group: str, **extra: Any) -> AsyncShareConsumer:
    return AsyncShareConsumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": group, **extra}
    )


async def poll_until(
    c: AsyncShareConsumer, want: int, timeout: float = 60, ack: Any = None
) -> list[ShareRecord]:
    got: list[ShareRecord] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        records = await c.poll(0.5)
        for r in records:
            if ack is not None:
                c.acknowledge(r, ack(r))
        got.extend(records)
    return got


def test_async_members_share_the_work_each_record_accepted_once(
    kafka_cluster: Any, share_topic: Any
) -> None:
    topic, group = share_topic
    total = 300
    limit = {"max.poll.records": 10, "share.acquire.mode": "record_limit"}

    async def main() -> tuple[list[list[ShareRecord]], list[ShareRecord]]:
        stop = asyncio.Event()
        taken: list[list[ShareRecord]] = [[], [], []]

        async def member(i: int) -> None:
            async with consumer(kafka_cluster, group, **EXPLICIT, **limit) as c:
                c.subscribe([topic])
                while not stop.is_set():
                    for r in await c.poll(0.5):
                        taken[i].append(r)
                        c.acknowledge(r, AcknowledgeType.ACCEPT)
                        await asyncio.sleep(0.005)  # the work, during which others take theirs
                    if sum(map(len, taken)) >= total:
                        stop.set()
                assert all(err is None for err in (await c.commit_sync(30)).values())

        tasks = [asyncio.ensure_future(member(i)) for i in range(3)]
        await asyncio.sleep(1)
        await asyncio.get_running_loop().run_in_executor(
            None, produce, kafka_cluster.bootstrap_servers, topic, total
        )
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        async with consumer(kafka_cluster, group) as late:
            late.subscribe([topic])
            left = await poll_until(late, 1, timeout=4)
        return taken, left

    taken, left = asyncio.run(main())
    values = [r.value for records in taken for r in records]
    assert sorted(values) == sorted(b"v%d" % i for i in range(total))  # each once, none lost
    assert all(r.delivery_count == 1 for records in taken for r in records)
    assert sum(1 for records in taken if records) >= 2
    assert left == []  # all accepted


def test_async_released_records_come_back_with_a_higher_delivery_count(
    kafka_cluster: Any, share_topic: Any
) -> None:
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 10)

    async def main() -> dict[bytes, list[int]]:
        seen: dict[bytes, list[int]] = {}
        outcomes: list[Exception | None] = []
        async with consumer(kafka_cluster, group, **EXPLICIT) as c:
            c.set_acknowledgement_commit_callback(lambda offsets, err: outcomes.append(err))
            c.subscribe([topic])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and sum(len(v) for v in seen.values()) < 20:
                for r in await c.poll(0.5):
                    seen.setdefault(r.value, []).append(r.delivery_count)
                    first = r.delivery_count == 1
                    c.acknowledge(r, AcknowledgeType.RELEASE if first else AcknowledgeType.ACCEPT)
                c.commit_async()
            assert all(err is None for err in (await c.commit_sync(30)).values())
            assert await poll_until(c, 1, timeout=3) == []
        assert outcomes and all(err is None for err in outcomes)
        return seen

    assert asyncio.run(main()) == {b"v%d" % i: [1, 2] for i in range(10)}


def test_async_close_releases_what_the_consumer_holds(kafka_cluster: Any, share_topic: Any) -> None:
    topic, group = share_topic
    # Locks far longer than the test waits: records come back by release, not by expiry.
    group_config(kafka_cluster, group, share_record_lock_duration_ms=60000)
    produce(kafka_cluster.bootstrap_servers, topic, 10)

    async def main() -> tuple[list[ShareRecord], list[ShareRecord]]:
        async with consumer(kafka_cluster, group, **EXPLICIT) as first:
            first.subscribe([topic])
            held = await poll_until(first, 1)
            first.acknowledge(held[0], AcknowledgeType.ACCEPT)
        async with consumer(kafka_cluster, group) as second:
            second.subscribe([topic])
            got = await poll_until(second, 9, timeout=20)
        return held, got

    held, got = asyncio.run(main())
    assert sorted(r.value for r in got) == sorted(
        b"v%d" % i for i in range(10) if b"v%d" % i != held[0].value
    )
    counts = {r.value: r.delivery_count for r in got}
    assert all(counts[r.value] == 2 for r in held[1:])


def test_async_poll_arrow_acknowledge_batch_and_bad_use(
    kafka_cluster: Any, share_topic: Any
) -> None:
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 20)

    async def main() -> None:
        c = consumer(kafka_cluster, group, **EXPLICIT)
        with pytest.raises(KcoreError):
            await c.poll(0)  # not started
        async with c:
            with pytest.raises(KcoreError):
                await c.poll(0)  # no subscription
            with pytest.raises(KcoreError):
                c.subscribe([])
            c.subscribe([topic])
            assert c.subscription() == {topic}
            rows = 0
            deadline = time.monotonic() + 60
            while rows < 20 and time.monotonic() < deadline:
                batch = await c.poll_arrow(0.5)
                assert batch.schema.names[-1] == "delivery_count"
                if batch.num_rows:
                    c.acknowledge_batch(batch, AcknowledgeType.ACCEPT)
                    with pytest.raises(AcknowledgementError):
                        c.acknowledge_batch(batch, AcknowledgeType.ACCEPT)  # twice
                rows += batch.num_rows
            assert rows == 20
            assert all(err is None for err in (await c.commit_sync(30)).values())
            await c.unsubscribe()
            assert c.subscription() == set()
        with pytest.raises(KcoreError):
            await c.poll(0)  # closed
        await c.close()  # again: nothing happens

    asyncio.run(main())


def test_a_cancelled_poll_leaves_the_consumer_usable(kafka_cluster: Any, share_topic: Any) -> None:
    """asyncio.wait_for cutting a poll short (the asyncio way of wakeup): nothing acquired is
    lost, the next polls get every record once."""
    topic, group = share_topic

    async def main() -> list[ShareRecord]:
        async with consumer(kafka_cluster, group) as c:
            c.subscribe([topic])
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.poll(30), 0.5)  # nothing produced yet
            await asyncio.get_running_loop().run_in_executor(
                None, produce, kafka_cluster.bootstrap_servers, topic, 20
            )
            got = await poll_until(c, 20)
            assert all(err is None for err in (await c.commit_sync(30)).values())
            assert await poll_until(c, 1, timeout=3) == []
            return got

    got = asyncio.run(main())
    assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(20))
