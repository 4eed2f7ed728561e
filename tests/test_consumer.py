"""The consumer (manual assignment) against real brokers: records written by confluent-kafka and
by Kafka's console producer read back exactly, as records and as Arrow; positions, seeks,
pause/resume, offset resets; and leadership moving while reading."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Producer as ConfluentProducer

import kcore
from kcore.admin import AdminOperationError, NewTopic, TopicPartition
from kcore.errors import KcoreError, NoOffsetForPartitionError, OffsetOutOfRangeError

# Recent timestamps: records older than the broker's retention (7 days) may be deleted by
# its retention check while a test runs.
BASE_TS = int(time.time() * 1000) - 3_600_000


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create(bootstrap: str, topic: str, partitions: int, rf: int = 1) -> None:
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions, rf)])


def consumer(bootstrap: str, **extra) -> kcore.Consumer:
    return kcore.Consumer(
        {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", **extra}
    )


def read(c: kcore.Consumer, n: int, timeout: float = 30) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += c.poll(1.0)
    return out


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_reads_what_confluent_kafka_wrote(kafka_cluster, codec):
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name(f"from-confluent-{codec}")
    create(bootstrap, topic, 3)
    peer = ConfluentProducer(
        {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5}
    )
    sent = {}
    for i in range(3000):
        key = None if i % 7 == 0 else b"k%d" % (i % 40)
        value = None if i % 50 == 0 else b"value-%d" % i * 3
        headers = [("i", str(i).encode())] if i % 3 == 0 else None
        ts = BASE_TS + i
        peer.produce(topic, value, key, timestamp=ts, headers=headers)
        sent[ts] = (key, value, tuple(headers or ()))
    peer.flush(30)
    with consumer(bootstrap) as c:
        c.assign([(topic, p) for p in range(3)])
        got = read(c, len(sent))
    assert len(got) == len(sent)
    for r in got:
        assert (r.key, r.value, r.headers) == sent[r.timestamp]
    # offsets per partition are consecutive from 0 (nothing skipped, nothing twice)
    for p in range(3):
        offsets = [r.offset for r in got if r.partition == p]
        assert offsets == list(range(len(offsets)))


def test_reads_what_the_console_producer_wrote(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("from-console")
    create(bootstrap, topic, 1)
    lines = [f"key{i}:value {i}" for i in range(200)]
    kafka_cluster.run_tool(
        "kafka-console-producer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=:",
        input="\n".join(lines) + "\n",
        check=True,
    )
    with consumer(bootstrap) as c:
        c.assign([(topic, 0)])
        got = read(c, len(lines))
    assert [(r.key, r.value) for r in got] == [
        (f"key{i}".encode(), f"value {i}".encode()) for i in range(200)
    ]


def test_poll_arrow_matches_poll(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("arrow")
    create(bootstrap, topic, 2)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(5000):
            p.send(
                topic,
                b"v%d" % i,
                b"k%d" % (i % 10),
                headers=[("h", b"1")] if i % 100 == 0 else None,
            )
        p.flush(30)
    with consumer(bootstrap) as c:
        c.assign([(topic, 0), (topic, 1)])
        records = read(c, 5000)
        c.seek_to_beginning()
        rows = []
        deadline = time.monotonic() + 30
        while len(rows) < 5000 and time.monotonic() < deadline:
            rb = c.poll_arrow(1.0, max_records=700)
            assert rb.num_rows <= 700
            assert rb.schema.names[:7] == [
                "key",
                "value",
                "topic",
                "partition",
                "offset",
                "timestamp",
                "timestampType",
            ]
            rows += rb.to_pylist()
    assert len(rows) == 5000
    by_pos = {(r["partition"], r["offset"]): r for r in rows}
    for rec in records:
        row = by_pos[(rec.partition, rec.offset)]
        ts = row["timestamp"]  # an Arrow timestamp[ms, UTC], as Spark's source has it
        assert (row["key"], row["value"], row["topic"]) == (rec.key, rec.value, topic)
        assert round(ts.timestamp() * 1000) == rec.timestamp


def test_resume_from_another_thread_ends_a_waiting_poll(kafka_cluster):
    """A poll that began while its partition was paused hands out that partition's data as
    soon as another thread resumes it, not at the end of its timeout."""
    import threading

    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("resume")
    create(bootstrap, topic, 1)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        p.send(topic, b"v").result(30)
    tp = TopicPartition(topic, 0)
    with consumer(bootstrap) as c:
        c.assign([tp])
        c.pause([tp])
        assert c.poll(1.0) == []  # positions looked up meanwhile; nothing handed out
        timer = threading.Timer(1.0, c.resume, args=([tp],))
        started = time.monotonic()
        timer.start()
        try:
            got = c.poll(20.0)
        finally:
            timer.cancel()
        assert [r.value for r in got] == [b"v"]
        assert time.monotonic() - started < 10


def test_positions_seeks_and_pause(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("seek")
    create(bootstrap, topic, 2)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(100):
            p.send(topic, b"%d" % i, partition=i % 2, timestamp_ms=BASE_TS + i)
        p.flush(30)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with consumer(bootstrap) as c:
        c.assign([tp0, tp1])
        assert c.assignment() == {tp0, tp1}
        assert c.position(tp0) == 0  # auto.offset.reset=earliest
        c.seek(tp0, 40)
        c.pause([tp1])
        got = read(c, 10)
        assert {r.partition for r in got} == {0} and got[0].offset == 40
        c.resume([tp1])
        got = read(c, 60)
        assert {r.partition for r in got} >= {1}
        c.seek_to_end([tp0])
        assert c.position(tp0) == 50
        times = c.offsets_for_times({tp0: BASE_TS + 20})
        assert times[tp0].offset == 10  # partition 0 holds the even i
        with pytest.raises(KcoreError, match="not assigned"):
            c.seek((topic, 9), 0)


def test_by_duration_starts_at_the_first_record_that_recent(kafka_cluster):
    """auto.offset.reset=by_duration:<ISO-8601> (KIP-1106): the first offset whose timestamp
    is at most that old; with none that recent, the end."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("by-duration")
    create(bootstrap, topic, 2)
    now = int(time.time() * 1000)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(10):  # two hours old on both partitions, recent on partition 0 only
            p.send(topic, b"old-%d" % i, partition=0, timestamp_ms=now - 7_200_000 + i)
            p.send(topic, b"old-%d" % i, partition=1, timestamp_ms=now - 7_200_000 + i)
        for i in range(5):
            p.send(topic, b"new-%d" % i, partition=0, timestamp_ms=now + i)
        p.flush(30)
    with consumer(bootstrap, **{"auto.offset.reset": "by_duration:PT1H"}) as c:
        c.assign([(topic, 0), (topic, 1)])
        assert c.position((topic, 0)) == 10
        assert c.position((topic, 1)) == 10  # nothing that recent: the end
        assert [r.value for r in read(c, 5)] == [b"new-%d" % i for i in range(5)]


def test_out_of_range_resets_and_latest_and_none(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("reset")
    create(bootstrap, topic, 1)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(20):
            p.send(topic, b"%d" % i)
        p.flush(30)
    with consumer(bootstrap) as c:
        c.assign([(topic, 0)])
        c.seek((topic, 0), 1000)  # past the end: OFFSET_OUT_OF_RANGE, reset to earliest
        got = read(c, 20)
        assert [r.offset for r in got] == list(range(20))
    with kcore.Consumer({"bootstrap.servers": bootstrap}) as c:  # default: latest
        c.assign([(topic, 0)])
        assert c.position((topic, 0)) == 20
        assert c.poll(0.5) == []
    with kcore.Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "none"}) as c:
        c.assign([(topic, 0)])
        with pytest.raises(NoOffsetForPartitionError, match="auto.offset.reset is none") as e:
            read(c, 1, timeout=5)
        assert e.value.partitions == [TopicPartition(topic, 0)]
        # position() says so too (as Java), rather than waiting out its timeout.
        t0 = time.monotonic()
        with pytest.raises(NoOffsetForPartitionError):
            c.position((topic, 0), timeout=30)
        assert time.monotonic() - t0 < 10
        # Reported while the partition had no position; a seek since makes it moot. An
        # offset out of range is reported (as Java's OffsetOutOfRangeException, naming it)
        # and the position stays where it was until the caller seeks.
        time.sleep(0.3)
        c.seek((topic, 0), 5)
        assert [r.offset for r in read(c, 15)] == list(range(5, 20))
        c.seek((topic, 0), 1000)
        with pytest.raises(OffsetOutOfRangeError, match="offset 1000 is out of range") as oor:
            read(c, 1, timeout=5)
        assert oor.value.partitions == {TopicPartition(topic, 0): 1000}
        assert c.position((topic, 0)) == 1000
        with pytest.raises(OffsetOutOfRangeError):  # again, until a seek
            read(c, 1, timeout=5)
        c.seek((topic, 0), 18)
        assert [r.offset for r in read(c, 2)] == [18, 19]
    with kcore.Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "none"}) as c:
        c.assign([(topic, 0)])
        time.sleep(0.3)  # the fetcher may report "no position" before the seek
        c.seek((topic, 0), 0)
        assert [r.offset for r in read(c, 20)] == list(range(20))


def test_follows_leadership_moves(kafka_cluster3):
    bootstrap = kafka_cluster3.bootstrap_servers
    topic = name("consume-moving")
    create(bootstrap, topic, 3, 3)
    n = 30000
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(n):
            p.send(topic, b"%06d" % i, b"k%d" % (i % 30))
        p.flush(60)
    with (
        consumer(bootstrap, **{"max.poll.records": 1000}) as c,
        kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin,
    ):
        c.assign([(topic, p) for p in range(3)])
        got = read(c, 3000)
        before = admin.describe_topics([topic])[topic].partitions
        admin.alter_partition_reassignments(
            {
                TopicPartition(topic, q.partition): [r for r in q.replicas if r != q.leader]
                + [q.leader]
                for q in before
            }
        )
        time.sleep(1.0)
        admin.elect_leaders([(topic, q.partition) for q in before])
        got += read(c, n - len(got), timeout=60)
        # Each new leader was asked whether the log still holds the position (KIP-320).
        deadline = time.monotonic() + 30
        while c._core.fetcher.validator.validations < 3 and time.monotonic() < deadline:
            assert c.poll(0.2) == []
        assert c._core.fetcher.validator.validations >= 3  # one per partition at least
        assert c._core.fetcher.validator.truncations == 0
    assert len(got) == n
    assert len({(r.partition, r.offset) for r in got}) == n


def test_an_offline_partition_does_not_hold_up_the_others(kafka_cluster3):
    """Partition 1 of the topic lives only on a stopped broker (no leader): a consumer of
    partition 0 still finds its position and reads (as Java's, whose lookup asks partition 0's
    leader only), and a new producer sends to partition 0; before, both waited for every
    partition of the topic to have a leader, and failed after their timeouts."""
    bootstrap = kafka_cluster3.bootstrap_servers
    topic = name("offline-neighbour")
    ids = kafka_cluster3.node_ids
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, replica_assignment={0: [ids[0]], 1: [ids[1]]})])
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        p.send_batch(topic, [b"zero-%d" % i for i in range(10)], partition=0).result(30)
        p.send_batch(topic, [b"one"] * 5, partition=1).result(30)
    kafka_cluster3.stop_broker(ids[1])
    try:
        tp0 = TopicPartition(topic, 0)
        with consumer(bootstrap, **{"default.api.timeout.ms": 30000}) as c:
            started = time.monotonic()
            c.assign([tp0])
            got = read(c, 10, timeout=20)
            assert [r.value for r in got] == [b"zero-%d" % i for i in range(10)]
            assert c.end_offsets([tp0], timeout=20) == {tp0: 10}
            assert time.monotonic() - started < 20
        # Both partitions assigned: partition 0's position is looked up and read at once
        # while partition 1's waits for a leader (as Java's PartitionLeaderStrategy); the
        # lookup waited for both, default.api.timeout.ms long.
        tp1 = TopicPartition(topic, 1)
        with consumer(bootstrap, **{"default.api.timeout.ms": 30000}) as c:
            started = time.monotonic()
            c.assign([tp0, tp1])
            got = read(c, 10, timeout=20)
            assert [r.value for r in got] == [b"zero-%d" % i for i in range(10)]
            assert time.monotonic() - started < 20
            with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
                with pytest.raises(AdminOperationError) as failed:
                    admin.list_offsets({tp0: "latest", tp1: "latest"}, timeout=3)
            # what answered is kept; the other names why it did not
            assert failed.value.results[tp0].offset == 10
            assert "no leader" in str(failed.value.errors[tp1])
        # A new producer (as Java's) needs the topic, not a leader for every partition: an
        # unkeyed record goes to the partition that has one, at once.
        with kcore.Producer({"bootstrap.servers": bootstrap, "max.block.ms": 20000}) as p:
            started = time.monotonic()
            assert p.send(topic, b"new").result(20).partition == 0
            assert time.monotonic() - started < 15
    finally:
        kafka_cluster3.start_broker(ids[1])


def test_async_consumer(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("async-consume")
    create(bootstrap, topic, 1)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(100):
            p.send(topic, b"%d" % i)
        p.flush(30)

    async def main():
        async with kcore.AsyncConsumer(
            {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
        ) as c:
            c.assign([(topic, 0)])
            got = []
            while len(got) < 100:
                got += await c.poll(5.0)
            assert await c.position((topic, 0)) == 100
            rb = None
            c.seek_to_beginning()
            rb = await c.poll_arrow(5.0)
            # The same position and lookup methods as the blocking consumer.
            found = await c.offsets_for_times({(topic, 0): got[40].timestamp})
            assert found[TopicPartition(topic, 0)].offset <= 40
            c.seek((topic, 0), 90)
            c.pause([(topic, 0)])
            assert await c.poll(0.5) == []
            c.resume([(topic, 0)])
            tail = []
            while len(tail) < 10:
                tail += await c.poll(5.0)
            return got, rb, tail

    got, rb, tail = asyncio.run(main())
    assert [r.value for r in got] == [b"%d" % i for i in range(100)]
    assert rb.num_rows > 0
    assert [r.offset for r in tail] == list(range(90, 100))


def test_beginning_end_offsets_and_partitions_for(kafka_cluster):
    """Java's beginningOffsets/endOffsets/partitionsFor; the end under read_committed is the
    last stable offset (an open transaction's records are not counted)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("edges")
    create(bootstrap, topic, 2)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        p.send_batch(topic, [b"v"] * 10, partition=0).result(30)
    txn = kcore.Producer({"bootstrap.servers": bootstrap, "transactional.id": name("edges-tx")})
    txn.init_transactions()
    txn.begin_transaction()
    txn.send(topic, b"open", partition=0).result(30)  # written, not committed
    try:
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        with consumer(bootstrap) as c:
            assert c.partitions_for(topic) == [0, 1] and c.partitions_for(name("none")) == []
            assert c.beginning_offsets(tps) == {tps[0]: 0, tps[1]: 0}
            assert c.end_offsets(tps) == {tps[0]: 11, tps[1]: 0}
        with consumer(bootstrap, **{"isolation.level": "read_committed"}) as c:
            assert c.end_offsets(tps) == {tps[0]: 10, tps[1]: 0}
    finally:
        txn.abort_transaction()
        txn.close()


def test_polling_with_nothing_assigned_is_an_error(kafka_cluster):
    """As Java's IllegalStateException: poll/poll_arrow (sync and async) with neither an
    assignment nor a subscription raise at once, naming what to call, instead of waiting out
    the timeout for nothing; an emptied assignment counts too."""
    bootstrap = kafka_cluster.bootstrap_servers
    with consumer(bootstrap) as c:
        for poll in (c.poll, c.poll_arrow):
            started = time.monotonic()
            with pytest.raises(KcoreError, match=r"no partitions assigned.*assign\(\)"):
                poll(5.0)
            assert time.monotonic() - started < 1
        c.assign([])
        with pytest.raises(KcoreError, match="no partitions assigned"):
            c.poll(5.0)

    async def main() -> None:
        async with kcore.AsyncConsumer({"bootstrap.servers": bootstrap}) as ac:
            for poll in (ac.poll, ac.poll_arrow):
                with pytest.raises(KcoreError, match="no partitions assigned"):
                    await poll(5.0)

    asyncio.run(main())


def test_fetches_ending_in_a_partial_batch(kafka_cluster):
    """max.partition.fetch.bytes that cuts batches in half: each response ends with a partial
    batch, which the next fetch gets whole (and a first batch larger than the limit still comes
    whole, KIP-74)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("partial")
    create(bootstrap, topic, 1)
    with kcore.Producer({"bootstrap.servers": bootstrap, "batch.size": 30000}) as p:
        p.send_batch(topic, [b"%05d" % i + b"x" * 95 for i in range(3000)]).result(30)
    for limit in (20000, 45000):
        with consumer(bootstrap, **{"max.partition.fetch.bytes": limit}) as c:
            c.assign([(topic, 0)])
            got = read(c, 3000)
            c.seek_to_beginning()
            rows = 0
            deadline = time.monotonic() + 30
            while rows < 3000 and time.monotonic() < deadline:
                rows += c.poll_arrow(1.0).num_rows
        assert [r.offset for r in got] == list(range(3000)) and rows == 3000


def test_a_seek_right_after_assign_wins_over_the_offset_reset(kafka_cluster):
    """auto.offset.reset=latest looks up the end while seek_to_beginning arrives: the seek
    wins (the lookup's answer is dropped)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("seek-race")
    create(bootstrap, topic, 3)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        p.send_batch(topic, [b"v%d" % i for i in range(300)]).result(30)
    for _ in range(5):
        with consumer(bootstrap, **{"auto.offset.reset": "latest"}) as c:
            c.assign([(topic, p) for p in range(3)])
            c.seek_to_beginning()
            assert len(read(c, 300)) == 300


def test_fetch_sessions_are_used_and_survive_a_lost_session(kafka_cluster):
    """Fetches share a session per broker (KIP-227), named partitions change as data is taken;
    a session the broker no longer accepts is replaced and no record is lost or repeated."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("sessions")
    create(bootstrap, topic, 4)
    with kcore.Producer({"bootstrap.servers": bootstrap, "batch.size": 20000}) as p:
        p.send_batch(topic, [b"%06d" % i + b"x" * 100 for i in range(20000)]).result(30)
    with consumer(bootstrap, **{"max.partition.fetch.bytes": 30000}) as c:
        c.assign([(topic, p) for p in range(4)])
        got = read(c, 8000)
        sessions = c._core.fetcher._sessions
        assert sessions and all(s.session_id != 0 and s.epoch > 1 for s in sessions.values())
        for s in sessions.values():
            s.epoch += 1000  # the broker answers INVALID_FETCH_SESSION_EPOCH to the next fetch
        got += read(c, 20000 - len(got))
        assert all(s.session_id != 0 for s in sessions.values())
        fetcher = c._core.fetcher
    assert not fetcher._sessions  # closed (epoch -1) on close
    assert len(got) == 20000
    for p in range(4):
        offsets = [r.offset for r in got if r.partition == p]
        assert offsets == list(range(len(offsets)))


def test_batches_larger_than_the_partition_limit_on_every_partition(kafka_cluster):
    """Only the first partition of a fetch gets an oversized batch whole (KIP-74); the others
    get part of one, and ask for the batch's size next time. Records of every partition come,
    and pausing a partition stops its records while the others flow (reading ahead)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("oversized")
    create(bootstrap, topic, 6)
    with kcore.Producer({"bootstrap.servers": bootstrap, "batch.size": 200_000}) as p:
        p.send_batch(topic, [b"%06d" % i + b"y" * 200 for i in range(30000)]).result(30)
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        in_p0 = admin.list_offsets({(topic, 0): "latest"})[TopicPartition(topic, 0)].offset
    with consumer(bootstrap, **{"max.partition.fetch.bytes": 20000}) as c:
        c.assign([(topic, p) for p in range(6)])
        c.pause([(topic, 0)])
        got = read(c, 30000 - in_p0)
        got += c.poll(0.5)
        paused = [r for r in got if r.partition == 0]
        c.resume([(topic, 0)])
        got += read(c, 30000 - len(got))
    assert paused == [] and len(got) == 30000
    assert sorted(int(r.value[:6]) for r in got) == list(range(30000))


def test_poll_hands_out_taken_records_before_raising_a_queued_error():
    """Records taken in a poll are returned; a queued error comes at the next poll (as Java),
    so a position moved for records the caller never got cannot happen."""
    from kcore.codec import RecordBatchBuilder
    from kcore.consumer.core import ConsumerCore
    from kcore.consumer.fetch_buffer import FetchedData
    from kcore.consumer.positions import PartitionState

    core = ConsumerCore({"bootstrap.servers": "127.0.0.1:1"})  # never started: no I/O
    tp = TopicPartition("t", 0)
    b = RecordBatchBuilder("none")
    for i in range(5):
        b.append(None, b"v%d" % i, BASE_TS + i)
    batch = b.build()
    f = core.fetcher
    f.positions.add(tp, PartitionState(position=0, queued=1, queued_bytes=len(batch)))
    core.buffer.add(FetchedData(tp, 0, batch, 5, end_offset=5))
    core.buffer.add_error(KcoreError("boom"))
    got = core.take_records(100)
    assert [r.value for r in got] == [b"v%d" % i for i in range(5)]
    assert f.positions.require(tp).position == 5
    with pytest.raises(KcoreError, match="boom"):
        core.take_records(100)


def _queued_core(batches_by_partition: dict[int, list[bytes]]):
    """A consumer core that never starts (no I/O), each partition of topic "t" holding the
    given fetch responses' records (each a bytes of whole batches, offsets from 0 on)."""
    from kcore.codec import decode_batches
    from kcore.consumer.core import ConsumerCore
    from kcore.consumer.fetch_buffer import FetchedData
    from kcore.consumer.positions import PartitionState

    core = ConsumerCore({"bootstrap.servers": "127.0.0.1:1"})
    for p, responses in batches_by_partition.items():
        tp = TopicPartition("t", p)
        core.fetcher.positions.add(tp, PartitionState(position=0, queued=len(responses)))
        offset = 0
        for records in responses:
            end = decode_batches(records, check_crcs=False)[-1].next_offset
            core.buffer.add(FetchedData(tp, offset, records, 100, end_offset=end))
            offset = end
    return core


def _batch(base: int, n: int, tag: bytes) -> bytes:
    from kcore.codec import RecordBatchBuilder

    b = RecordBatchBuilder("none", base_offset=base)
    for i in range(n):
        b.append(None, tag + b"%d" % (base + i), BASE_TS + i)
    return bytes(b.build())


def test_poll_arrow_in_small_steps_and_poll_take_turns_without_a_gap():
    """poll_arrow takes records of several partitions' queued data into one batch, stopping
    inside a batch when it has max_records; poll and poll_arrow taking turns hand out every
    record once, in order per partition, and each partition's position follows."""
    core = _queued_core(
        {
            0: [_batch(0, 5, b"a") + _batch(5, 4, b"a"), _batch(9, 3, b"a")],
            1: [_batch(0, 7, b"b")],
        }
    )
    seen: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    steps = [("arrow", 3), ("poll", 2), ("arrow", 6), ("poll", 4), ("arrow", 100)]
    for how, limit in steps:
        if how == "arrow":
            rb = core.take_arrow(limit)
            assert rb.num_rows <= limit
            assert rb.schema.names[:7] == [
                "key",
                "value",
                "topic",
                "partition",
                "offset",
                "timestamp",
                "timestampType",
            ]
            assert set(rb.column("topic").to_pylist()) <= {"t"}
            for p, o, v in zip(
                rb.column("partition").to_pylist(),
                rb.column("offset").to_pylist(),
                rb.column("value").to_pylist(),
                strict=True,
            ):
                seen[p].append((o, v))
        else:
            got = core.take_records(limit)
            assert len(got) <= limit
            for r in got:
                seen[r.partition].append((r.offset, r.value))
    assert seen[0] == [(i, b"a%d" % i) for i in range(12)]
    assert seen[1] == [(i, b"b%d" % i) for i in range(7)]
    positions = core.fetcher.positions
    assert positions.require(TopicPartition("t", 0)).position == 12
    assert positions.require(TopicPartition("t", 1)).position == 7
    assert core.take_arrow(10).num_rows == 0


def test_poll_arrow_hands_out_the_records_before_a_corrupt_batch_then_raises():
    """A fetch response whose second batch is corrupt: poll_arrow hands out the first batch's
    records (the position moves past them), and the next poll_arrow raises the codec's
    CorruptRecordError, named with the partition; nothing is handed out twice."""
    from kcore.errors import CorruptRecordError

    bad = bytearray(_batch(4, 3, b"x"))
    bad[-1] ^= 0x55
    core = _queued_core({0: [_batch(0, 4, b"x") + bytes(bad)]})
    rb = core.take_arrow(100)
    assert rb.column("offset").to_pylist() == [0, 1, 2, 3]
    assert core.fetcher.positions.require(TopicPartition("t", 0)).position == 4
    with pytest.raises(CorruptRecordError, match="t-0"):
        core.take_arrow(100)


def test_a_partition_that_does_not_exist_is_reported_and_the_others_flow(kafka_cluster):
    """An offset lookup that fails for good (partition 99 of a 1-partition topic) reaches
    poll as an error; fetching of the other partitions goes on."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("no-such-partition")
    create(bootstrap, topic, 1)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        p.send_batch(topic, [b"v%d" % i for i in range(100)], partition=0).result(30)
    errors: list[Exception] = []
    got: list = []
    with consumer(bootstrap) as c:
        c.assign([(topic, 0), (topic, 99)])
        deadline = time.monotonic() + 30
        while (len(got) < 100 or not errors) and time.monotonic() < deadline:
            try:
                got += c.poll(1.0)
            except KcoreError as exc:
                errors.append(exc)
    assert len(got) == 100 and errors
    assert any("99" in str(e) for e in errors), errors


def test_manual_assignment_with_a_group_id_resumes_from_the_committed_offset(kafka_cluster):
    """As Java: assign() with a group.id starts at the group's committed offset, and only a
    partition with nothing committed falls back to auto.offset.reset."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("assign-commit"), name("g")
    create(bootstrap, topic, 2)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(20):
            p.send(topic, b"%d" % i, partition=i % 2)
        p.flush(30)
    cfg = {"group.id": group, "auto.offset.reset": "earliest"}
    with consumer(bootstrap, **cfg) as c:
        c.assign([(topic, 0)])
        got: list = []
        while len(got) < 4:
            got += c.poll(1.0, max_records=4 - len(got))
        assert [r.offset for r in got] == [0, 1, 2, 3]
        c.commit()  # the position: 4
    with consumer(bootstrap, **cfg) as c:
        c.assign([(topic, 0), (topic, 1)])  # partition 1: nothing committed
        got = read(c, 6 + 10)
        assert sorted(r.offset for r in got if r.partition == 0) == list(range(4, 10))
        assert sorted(r.offset for r in got if r.partition == 1) == list(range(10))


NO_ADMIN_SCRIPT = """
import sys, time
import kcore
from kcore.cluster.offsets import OffsetLookupError
from kcore.types import TopicPartition

bootstrap, topic, base_ts = sys.argv[1], sys.argv[2], int(sys.argv[3])
tp = TopicPartition(topic, 0)
with kcore.Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "latest"}) as c:
    assert c.beginning_offsets([tp]) == {tp: 0}
    assert c.end_offsets([tp]) == {tp: 10}
    assert c.offsets_for_times({tp: base_ts + 4})[tp].offset == 4
    missing = TopicPartition(topic, 5)  # the topic has one partition
    try:
        c.end_offsets([tp, missing], timeout=10)
        raise AssertionError("a partition that does not exist was looked up")
    except OffsetLookupError as exc:  # what answered is kept; the other names why it did not
        assert exc.results[tp].offset == 10 and list(exc.errors) == [missing], exc
    c.assign([tp])
    assert c.position(tp, timeout=20) == 10  # auto.offset.reset=latest: a lookup
    c.seek_to_beginning([tp])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 10 and time.monotonic() < deadline:
        got += c.poll(0.5)
    assert [r.offset for r in got] == list(range(10)), got
    c.seek_to_end([tp])
    assert c.poll(0.5) == [] and c.position(tp) == 10
admin = sorted(m for m in sys.modules if m == "kcore.admin" or m.startswith("kcore.admin."))
assert not admin, admin
print("ok")
"""


def test_offset_lookups_need_no_admin_client(kafka_cluster):
    """The consumer looks offsets up itself (kcore.cluster.offsets), as Java's consumer has its
    own OffsetFetcher: beginning/end offsets, offsets by time, resets and seeks to either end
    work in a process that never imports kcore.admin; a partly failed lookup raises
    OffsetLookupError with what answered and why the rest did not."""
    import subprocess
    import sys

    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("no-admin")
    create(bootstrap, topic, 1)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(10):
            p.send(topic, b"%d" % i, partition=0, timestamp_ms=BASE_TS + i)
        p.flush(30)
    done = subprocess.run(
        [sys.executable, "-c", NO_ADMIN_SCRIPT, bootstrap, topic, str(BASE_TS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
