"""The producer against real brokers, with confluent-kafka's consumer as the independent reader:
what was sent is what is read back (keys, null values, headers, timestamps, every codec), keyed
records land on the Java partitioner's partitions, backpressure, and no record lost or written
twice while leaders move and a broker dies."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka import TopicPartition as CTopicPartition
from conftest import wait_stopped

import kcore
from kcore.admin import NewTopic, TopicPartition
from kcore.codec import partition_for_key
from kcore.errors import InvalidTopicError, KcoreError, KcoreTimeoutError, MessageTooLargeError
from kcore.testing import KafkaCluster

# Recent timestamps: records older than the broker's retention (7 days) may be deleted by
# its retention check while a test runs.
BASE_TS = int(time.time() * 1000) - 3_600_000
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create(bootstrap: str, topic: str, partitions: int, rf: int = 1, **config: str) -> None:
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions, rf, config=config)])


def read_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 60):
    """Every record of the topic, read by confluent-kafka: {partition: [message, ...]}."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    consumer.assign([CTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: dict[int, list] = defaultdict(list)
    got = 0
    deadline = time.monotonic() + timeout
    try:
        while got < expected and time.monotonic() < deadline:
            for msg in consumer.consume(10000, 1.0):
                assert msg.error() is None, msg.error()
                out[msg.partition()].append(msg)
                got += 1
        # and nothing more arrives
        extra = consumer.consume(1000, 1.0)
        for msg in extra:
            out[msg.partition()].append(msg)
    finally:
        consumer.close()
    return out


def read_with_kcore(bootstrap: str, topic: str, partitions: int, expected: int) -> list:
    """Records of the topic read by kcore's consumer from the beginning (at most 30 s)."""
    with kcore.Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([(topic, p) for p in range(partitions)])
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < expected and time.monotonic() < deadline:
            got += c.poll(1.0)
    return got


def test_send_and_read_back(kafka_cluster):
    topic = name("produce")
    create(kafka_cluster.bootstrap_servers, topic, 3)
    with kcore.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as producer:
        sent = []
        for i in range(300):
            key = None if i % 10 == 0 else b"key-%d" % (i % 37)
            value = None if i % 25 == 0 else b"value-%d" % i
            headers = [("n", str(i).encode()), ("empty", None)] if i % 3 == 0 else None
            ts = BASE_TS + i
            sent.append(
                (
                    key,
                    value,
                    headers,
                    ts,
                    producer.send(topic, value, key, headers=headers, timestamp_ms=ts),
                )
            )
        producer.flush(30)
        metas = [f.result(0) for *_, f in sent]
    assert all(m.topic == topic and m.offset >= 0 for m in metas)
    back = read_all(kafka_cluster.bootstrap_servers, topic, 3, len(sent))
    by_pos = {(m.partition(), m.offset()): m for msgs in back.values() for m in msgs}
    assert len(by_pos) == len(sent)
    for (key, value, headers, ts, _), meta in zip(sent, metas, strict=True):
        msg = by_pos[(meta.partition, meta.offset)]
        assert msg.key() == key and msg.value() == value
        assert msg.timestamp()[1] == ts == meta.timestamp
        assert (msg.headers() or None) == ([(k, v) for k, v in headers] if headers else None)
        if key is not None:  # the Java default partitioner's choice
            assert meta.partition == partition_for_key(key, 3)


def test_keyed_partitions_match_librdkafka_murmur2(kafka_cluster):
    topic = name("keyed")
    create(kafka_cluster.bootstrap_servers, topic, 7)
    keys = [b"user-%d" % i for i in range(200)]
    with kcore.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as producer:
        ours = [producer.send(topic, b"v", k) for k in keys]
        producer.flush(30)
    peer = ConfluentProducer(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers, "partitioner": "murmur2_random"}
    )
    theirs: dict[bytes, int] = {}
    for k in keys:
        peer.produce(
            topic,
            b"v",
            k,
            on_delivery=lambda err, msg: theirs.__setitem__(msg.key(), msg.partition()),
        )
    peer.flush(30)
    assert [f.result(0).partition for f in ours] == [theirs[k] for k in keys]


@pytest.mark.parametrize(
    ("codec", "level"),
    [
        ("none", None),
        ("gzip", None),
        ("snappy", None),
        ("lz4", None),
        ("zstd", None),
        ("gzip", 1),
        ("lz4", 12),  # LZ4 HC, as Java's producer writes any level but 9
        ("zstd", 19),
        ("zstd", -5),
        ("zstd", -1),  # a level of zstd's (Java passes it on), not "the default"
    ],
    ids=str,
)
def test_every_codec_reads_back(kafka_cluster, codec, level):
    """Every codec, and compression.<codec>.level (KIP-390), read back by confluent-kafka."""
    topic = name(f"codec-{codec}")
    create(kafka_cluster.bootstrap_servers, topic, 2)
    config = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "compression.type": codec}
    if level is not None:
        config[f"compression.{codec}.level"] = level
    values = [b"%06d" % i * 20 for i in range(2000)]
    with kcore.Producer(config) as producer:
        if level is not None:
            assert producer._core.accumulator.compression_level == level
        for i, v in enumerate(values):
            producer.send(topic, v, b"k%d" % (i % 50))
        producer.flush(30)
    back = read_all(kafka_cluster.bootstrap_servers, topic, 2, len(values))
    assert sorted(m.value() for msgs in back.values() for m in msgs) == sorted(values)


def test_a_request_carries_the_batches_that_waited_for_a_free_slot(kafka_cluster):
    """Batches that wait for a free slot go together in the next request, one per partition
    (test_sender_sequences checks the max.in.flight rule itself, without a broker). How many
    wait depends on how fast the broker answers and on who holds the GIL (CI runs gave 1.9
    and 2.7 batches a request where a quiet machine gave 4.5), so here the sender is held
    until all ~150 batches are queued: then each request carries one of each partition that
    still has one (4.8-5.1 on average here), the broker writes them all, and every record
    lands once. A record goes to every partition first: a topic just created can answer
    NOT_LEADER_OR_FOLLOWER for a while after its metadata names the leader, and a batch
    retried after its backoff leaves the rest of its partition's batches to go one a request
    (CI runs failed so, with 148 and 296 records retried)."""
    topic = name("in-flight")
    create(kafka_cluster.bootstrap_servers, topic, 6)
    config = {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "batch.size": 16384,
        "max.in.flight.requests.per.connection": 1,
    }
    n = 20000
    values = [b"%0100d" % i for i in range(n)]
    with kcore.Producer(config) as producer:
        warm_up = [producer.send(topic, b"first", partition=p) for p in range(6)]
        for future in warm_up:  # the metadata, and every partition's leader ready
            future.result(30)
        per_batch = 16384 // (100 + 21)  # send_batch's chunk: batch.size over its estimate
        # The sender drains under the accumulator's lock (re-entrant for this thread).
        with producer._core.accumulator._cond:
            sent = producer.send_batch(topic, values)
        sent.result(60)
        metrics = producer.metrics()
        assert metrics["records-per-request-avg"] > 3.5 * per_batch, metrics
    back = read_all(kafka_cluster.bootstrap_servers, topic, 6, n + 6)
    got = sorted(m.value() for msgs in back.values() for m in msgs)
    assert got == sorted([*values, *[b"first"] * 6])


def _delete_and_wait(admin, topic: str) -> None:
    admin.delete_topics([topic])
    deadline = time.monotonic() + 30
    while topic in admin.list_topics():
        assert time.monotonic() < deadline, f"{topic} still listed"
        time.sleep(0.1)


def test_a_new_topic_is_asked_about_alone_so_a_deleted_one_stays_deleted(kafka_cluster):
    """As Java's producer (KIP-526), the first send to a topic fetches that topic's metadata
    alone, in one request. Asking about every topic written to before, as kcore did, made a
    broker with auto.create.topics.enable create again a topic deleted since, and the send
    waited for a second request (a refresh of everything) besides."""
    bootstrap = kafka_cluster.bootstrap_servers
    gone, new = name("deleted"), name("later")
    create(bootstrap, gone, 1)
    create(bootstrap, new, 1)
    with (
        kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin,
        kcore.Producer({"bootstrap.servers": bootstrap}) as producer,
    ):
        producer.send(gone, b"v").result(30)
        _delete_and_wait(admin, gone)
        cluster = producer._core.cluster
        asked: list[list[str] | None] = []
        build = cluster.metadata_request

        def spy(conn, topics=(), named_only=False):
            request, version = build(conn, topics, named_only)
            asked.append(None if request.topics is None else [t.name for t in request.topics])
            return request, version

        cluster.metadata_request = spy
        producer.send(new, b"v").result(30)
        assert asked == [[new]]
        assert gone not in admin.list_topics()


def test_a_topic_not_written_to_for_metadata_max_idle_ms_is_forgotten(kafka_cluster):
    """metadata.max.idle.ms, as Java's: a topic not written to for that long leaves the
    producer's metadata at its next refresh, so it is no longer asked about (deleted, it is
    not created again); a later send to it fetches it again. A topic written to stays."""
    bootstrap = kafka_cluster.bootstrap_servers
    idle, busy = name("idle"), name("busy")
    create(bootstrap, idle, 1)
    create(bootstrap, busy, 1)
    config = {
        "bootstrap.servers": bootstrap,
        "metadata.max.idle.ms": 5000,  # (the least Java allows)
        "metadata.max.age.ms": 300,
    }
    with (
        kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin,
        kcore.Producer(config) as producer,
    ):
        producer.send(idle, b"1").result(30)
        cluster = producer._core.cluster
        deadline = time.monotonic() + 30
        while idle in cluster.topics or idle in cluster.metadata.topics:
            producer.send(busy, b"x").result(30)
            assert time.monotonic() < deadline, "the idle topic is still tracked"
            time.sleep(0.2)
        assert busy in cluster.topics and busy in cluster.metadata.topics
        _delete_and_wait(admin, idle)
        time.sleep(1.0)  # three refreshes or so
        assert idle not in admin.list_topics()
        # Sent to again, it is asked about again: the broker creates it (as for Java).
        producer.send(idle, b"2").result(30)
        assert idle in cluster.topics


@pytest.mark.parametrize("form", ["list", "numpy", "pyarrow"])
def test_send_batch(kafka_cluster, form):
    topic = name(f"batch-{form}")
    create(kafka_cluster.bootstrap_servers, topic, 4)
    n = 20000
    values = [b"value-%08d" % i for i in range(n)]
    keys = [b"key-%05d" % (i % 1000) for i in range(n)]
    if form == "numpy":
        col_v, col_k = np.array(values), np.array(keys)
    elif form == "pyarrow":
        col_v, col_k = pa.array(values, pa.binary()), pa.array(keys, pa.binary())
    else:
        col_v, col_k = values, keys
    with kcore.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as producer:
        keyed = producer.send_batch(topic, col_v, col_k, timestamp_ms=BASE_TS)
        unkeyed = producer.send_batch(topic, col_v)
        assert len(keyed) == len(unkeyed) == n
        keyed.result(60)
        unkeyed.result(60)
    back = read_all(kafka_cluster.bootstrap_servers, topic, 4, 2 * n)
    msgs = [m for ms in back.values() for m in ms]
    assert len(msgs) == 2 * n
    with_keys = [m for m in msgs if m.key() is not None]
    assert sorted(m.value() for m in with_keys) == sorted(values)
    assert all(m.partition() == partition_for_key(m.key(), 4) for m in with_keys)
    # Per key, send order is kept.
    seen: dict[bytes, list[bytes]] = defaultdict(list)
    for p in sorted(back):
        for m in back[p]:
            if m.key() is not None:
                seen[m.key()].append(m.value())
    unordered = {k: vs for k, vs in seen.items() if vs != sorted(vs)}
    assert not unordered, list(unordered.items())[:2]
    assert all(m.timestamp()[1] == BASE_TS for m in with_keys)


def test_send_batch_keyed_lists_keep_each_records_time_and_order(kafka_cluster):
    """Keyed lists are read in place through the rows sorted by partition (no copies): each
    record keeps its own time (a list of them), null keys go sticky, and per partition the
    records land in send order."""
    topic = name("batch-keyed-times")
    create(kafka_cluster.bootstrap_servers, topic, 5)
    n = 12000
    values = [b"value-%06d" % i for i in range(n)]
    keys = [None if i % 10 == 0 else b"key-%04d" % (i % 700) for i in range(n)]
    times = [BASE_TS + i for i in range(n)]
    with kcore.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as producer:
        chunks = []
        append_chunk = producer._core.accumulator.append_chunk

        def spy(*args):
            chunks.append(args[-1] is not None)  # rows given: the columns read in place
            return append_chunk(*args)

        producer._core.accumulator.append_chunk = spy
        producer.send_batch(topic, values, keys, timestamp_ms=times).result(60)
        assert chunks and all(chunks)
        # Times that are not all signed ints take the path that checks them (and refuses).
        with pytest.raises(TypeError):
            producer.send_batch(topic, values, keys, timestamp_ms=[1.5] * n)
    back = read_all(kafka_cluster.bootstrap_servers, topic, 5, n)
    assert sum(len(ms) for ms in back.values()) == n
    assert len({p for p, msgs in back.items() for m in msgs if m.key() is None}) == 1
    for p, msgs in back.items():
        indices = [int(m.value().split(b"-")[1]) for m in msgs]
        assert indices == sorted(indices), p  # send order within the partition
        for i, m in zip(indices, msgs, strict=True):
            assert m.timestamp()[1] == BASE_TS + i
            assert m.key() == keys[i]
            if m.key() is not None:
                assert p == partition_for_key(m.key(), 5)


@pytest.mark.parametrize(("form", "size"), [("list", 100), ("pyarrow", 100), ("list", 2)])
def test_send_batch_fills_batches_up_to_batch_size(kafka_cluster, form, size):
    """send_batch's batches end at batch.size, as Java's producer fills one, not where an
    estimate of the records' size would end them (~10% short for 100-byte values, over 2x
    for 2-byte ones, whose later chunks are offered more rows than the first)."""
    topic = name(f"batch-full-{form}-{size}")
    create(kafka_cluster.bootstrap_servers, topic, 1)
    n, batch_size = 5000 * 100 // size, 16384
    values = [(b"%0100d" % i)[-size:] for i in range(n)]
    column = pa.array(values, pa.binary()) if form == "pyarrow" else values
    config = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "batch.size": batch_size}
    with kcore.Producer(config) as producer:
        result = producer.send_batch(topic, column, partition=0, timestamp_ms=BASE_TS)
        result.result(60)
        m = producer.metrics()
    # A full batch ends less than one record (~108 bytes for 100-byte values) short of
    # batch.size; cut by the estimate it had 135 records, 14,641 bytes.
    assert batch_size - (size + 8) < m["batch-size-max"] <= batch_size, m
    assert m["batch-size-avg"] > 0.9 * batch_size, m  # all full but the first and last
    got = read_all(kafka_cluster.bootstrap_servers, topic, 1, n)[0]
    assert [g.value() for g in got] == values


@pytest.mark.parametrize("form", ["pyarrow-us", "pyarrow-chunked-ms", "numpy-ns", "numpy-scalar"])
def test_send_batch_takes_a_column_of_times(kafka_cluster, form):
    """timestamp_ms as a pyarrow timestamp column (any unit, chunked too) or numpy datetime64
    (an array, or one time for all): each record's timestamp in milliseconds, floored; a null
    (NaT) is the time of sending, as in Spark's Kafka sink."""
    topic = name("batch-times")
    create(kafka_cluster.bootstrap_servers, topic, 1)
    n = 1000
    ms = [BASE_TS + 1000 * i for i in range(n)]
    values = [b"v%d" % i for i in range(n)]
    if form == "pyarrow-us":
        micros = [t * 1000 if i != 7 else None for i, t in enumerate(ms)]
        times = pa.array(micros, pa.timestamp("us"))
    elif form == "pyarrow-chunked-ms":
        times = pa.chunked_array(
            [
                pa.array(ms[:400], pa.timestamp("ms", "UTC")),
                pa.array(ms[400:], pa.timestamp("ms", "UTC")),
            ]
        )
    elif form == "numpy-ns":
        times = np.array(ms, dtype="datetime64[ms]").astype("datetime64[ns]")
        times[7] = np.datetime64("NaT")
    else:
        times = np.datetime64(BASE_TS * 1000 + 999, "us")
    before = int(time.time() * 1000)
    with kcore.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as producer:
        producer.send_batch(topic, values, partition=0, timestamp_ms=times).result(60)
    after = int(time.time() * 1000)
    got = [m.timestamp()[1] for m in read_all(kafka_cluster.bootstrap_servers, topic, 1, n)[0]]
    assert len(got) == n
    if form == "pyarrow-chunked-ms":
        assert got == ms
    elif form == "numpy-scalar":
        assert got == [BASE_TS] * n
    else:
        assert got[:7] + got[8:] == ms[:7] + ms[8:]
        assert before <= got[7] <= after


@pytest.mark.parametrize("form", ["list", "pyarrow"])
def test_send_batch_with_headers(kafka_cluster, form):
    """send_batch's headers (Python pairs, or Spark's list<struct<key, value>> column), keyed
    (rows regrouped by partition) and not, read back by confluent-kafka; a mismatched length
    queues nothing."""
    topic = name(f"batch-headers-{form}")
    create(kafka_cluster.bootstrap_servers, topic, 3)
    n = 3000
    values = [b"value-%06d" % i for i in range(n)]
    keys = [b"key-%03d" % (i % 50) for i in range(n)]
    rows = [[("i", b"%d" % i), ("even", None)] if i % 2 == 0 else None for i in range(n)]
    if form == "pyarrow":
        entry = pa.struct([("key", pa.string()), ("value", pa.binary())])
        data = [None if r is None else [{"key": k, "value": v} for k, v in r] for r in rows]
        headers = pa.array(data, pa.list_(entry))
    else:
        headers = rows
    with kcore.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as producer:
        with pytest.raises(ValueError, match="header lists"):
            producer.send_batch(topic, values, keys, headers=headers[:10])
        keyed = producer.send_batch(topic, values, keys, headers=headers, timestamp_ms=BASE_TS)
        unkeyed = producer.send_batch(topic, values, headers=headers, timestamp_ms=BASE_TS)
        keyed.result(60)
        unkeyed.result(60)
    back = read_all(kafka_cluster.bootstrap_servers, topic, 3, 2 * n)
    msgs = [m for ms in back.values() for m in ms]
    assert len(msgs) == 2 * n
    for m in msgs:
        i = int(m.value().split(b"-")[1])
        want = None if i % 2 else [("i", b"%d" % i), ("even", None)]
        assert m.headers() == want, (i, m.headers())
        assert m.key() is None or m.partition() == partition_for_key(m.key(), 3)


def test_send_batch_checks_headers_up_front_and_reports_chunks_queued_before_an_error(
    kafka_cluster,
):
    """A bad header anywhere fails send_batch before anything is queued; a bad value in a
    later chunk (found only as that chunk is encoded) raises with the earlier chunks' result
    attached, and those records are delivered."""
    topic = name("batch-bad")
    create(kafka_cluster.bootstrap_servers, topic, 1)
    n = 5000
    values = [b"v" * 100] * n
    headers = [[("h", b"x")]] * (n - 1) + [[("h", "a str value")]]
    config = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "batch.size": 16384}
    with kcore.Producer(config) as producer:
        with pytest.raises(TypeError, match="header values are bytes"):
            producer.send_batch(topic, values, headers=headers)
        producer.flush(30)
        with kcore.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as admin:
            assert admin.list_offsets({(topic, 0): "latest"})[TopicPartition(topic, 0)].offset == 0
        with pytest.raises(TypeError) as caught:
            producer.send_batch(topic, values[:-1] + [12345])
        queued = caught.value.queued
        assert 0 < len(queued) < n and "were queued" in "".join(caught.value.__notes__)
        queued.result(30)
        with kcore.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as admin:
            end = admin.list_offsets({(topic, 0): "latest"})[TopicPartition(topic, 0)].offset
        assert end == len(queued)


def test_delivery_callbacks_and_errors(kafka_cluster):
    topic = name("callbacks")
    create(kafka_cluster.bootstrap_servers, topic, 1)
    config = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "max.block.ms": 2000}
    results = []
    with kcore.Producer(config) as producer:
        producer.send(topic, b"a", on_delivery=lambda err, md: results.append((err, md)))
        producer.flush(30)
        # As Java's waitOnMetadata: a partition beyond the count waits max.block.ms for
        # metadata that shows it, then says so in Java's words.
        with pytest.raises(KcoreTimeoutError, match="Partition 5 of topic .* partition count 1"):
            producer.send(topic, b"x", partition=5)
        with pytest.raises(KcoreTimeoutError, match="Partition 5 of topic .* partition count 1"):
            producer.send_batch(topic, [b"x"], partition=5)
        # As Java's producer, its metadata requests let the broker create a missing topic
        # (auto.create.topics.enable, true by default, as on this test broker).
        assert producer.send(name("auto-created"), b"x").result(30).offset == 0
        with pytest.raises(InvalidTopicError, match="'bad topic!'"):  # at once, as Java
            producer.send("bad topic!", b"x")
        # Partitions added since the producer's metadata: found at once, not after
        # metadata.max.age.ms.
        with kcore.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as admin:
            admin.create_partitions({topic: 3})
        assert producer.send(topic, b"y", partition=2).result(30).partition == 2
    assert results[0][0] is None and results[0][1].offset == 0
    with pytest.raises(KcoreError, match="closed"):
        producer.send(topic, b"late")


def test_the_compiled_send_path_follows_a_metadata_refresh(kafka_cluster):
    """The compiled send path learns of a new metadata snapshot from the cache's on_update: once
    a refresh shows partitions added on the broker, records for them take the compiled path
    (not the full Python send), and land there."""
    topic = name("send-path-refresh")
    create(kafka_cluster.bootstrap_servers, topic, 1)
    with kcore.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as producer:
        path = producer._core.send_path
        full_way: list[object] = []
        slow = path.slow

        def counted(*args: object) -> object:
            full_way.append(args)
            return slow(*args)

        path.slow = counted
        producer.send(topic, b"a").result(30)
        producer.send(topic, b"b").result(30)
        assert len(full_way) <= 1  # (the first record may wait for the topic's metadata)
        with kcore.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as admin:
            admin.create_partitions({topic: 3})
        # Partition 2 is not in the send path's snapshot: the full way, which refreshes.
        assert producer.send(topic, b"c", partition=2).result(30).partition == 2
        before = len(full_way)
        futures = [producer.send(topic, b"d%d" % i, partition=2) for i in range(10)]
        assert [f.result(30).partition for f in futures] == [2] * 10
        assert len(full_way) == before  # compiled, under the refreshed snapshot


def test_close_from_a_delivery_callback_does_not_wait(kafka_cluster):
    """As Java: close() on the network thread (from a callback) closes with a timeout of 0 and
    returns; every record is still completed, and later sends are refused."""
    topic = name("close-in-callback")
    create(kafka_cluster.bootstrap_servers, topic, 1)
    producer = kcore.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    seen: list = []

    def on_delivery(err, md):
        seen.append(err)
        if len(seen) == 1:
            producer.close()

    futures = [producer.send(topic, b"%d" % i, on_delivery=on_delivery) for i in range(5)]
    deadline = time.monotonic() + 30
    while producer._loop.is_running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not producer._loop.is_running
    assert len(seen) == 5 and all(f.done() for f in futures)
    with pytest.raises(KcoreError, match="closed"):
        producer.send(topic, b"late")
    producer.close()  # again, from this thread: nothing left to do


def test_a_producer_whose_brokers_cannot_be_reached_fails_within_max_block_ms(
    unreachable_cluster,
):
    """Bootstrap works but the broker advertises an address this machine cannot reach: the
    producer id (idempotence) cannot be had; wait_until_ready fails after max.block.ms naming
    why (it waited for ever). The constructor returns at once, as Java's."""
    config = {
        "bootstrap.servers": unreachable_cluster.bootstrap_servers,
        "max.block.ms": 3000,
        "socket.connection.setup.timeout.ms": 1000,
    }
    t0 = time.monotonic()
    with kcore.Producer(config) as producer:
        assert time.monotonic() - t0 < 1
        with pytest.raises(KcoreTimeoutError, match=r"InitProducerId\) within 3s; last: "):
            producer.wait_until_ready()
    assert time.monotonic() - t0 < 30


def test_async_producer(kafka_cluster):
    topic = name("async")
    create(kafka_cluster.bootstrap_servers, topic, 2)

    async def main():
        async with kcore.AsyncProducer({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as p:
            futures = [await p.send(topic, b"v%d" % i, b"k%d" % i) for i in range(100)]
            metas = [await f for f in futures]
            batch = await p.send_batch(topic, [b"x"] * 50)
            await p.flush(30)
            assert batch.done()
            # A SendBatchResult is awaited without blocking the loop: while its records are
            # sent, a ticker task keeps running.
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.001)

            tick_task = asyncio.create_task(ticker())
            parts = await (await p.send_batch(topic, [b"y"] * 200_000, partition=1))
            tick_task.cancel()
            assert sum(n for _, _, n in parts) == 200_000 and {p for p, _, _ in parts} == {1}
            assert ticks > 1
            return metas

    metas = asyncio.run(main())
    assert len({(m.partition, m.offset) for m in metas}) == 100


def test_records_that_can_never_be_sent_fail_at_once(kafka_cluster):
    """As Java's ensureValidRecordSize: a record larger than max.request.size or buffer.memory
    gets a failed future (and its callback the error) at once, never queued; keys and values
    that are not bytes raise TypeError naming which and how to fix it."""
    topic = name("never-fits")
    create(kafka_cluster.bootstrap_servers, topic, 1)
    small = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "max.request.size": 2000}
    with kcore.Producer(small) as producer:
        seen = []
        for key in (None, b"k"):  # unkeyed and keyed (the compiled path hands both over)
            future = producer.send(topic, b"x" * 3000, key, on_delivery=lambda e, m: seen.append(e))
            with pytest.raises(
                MessageTooLargeError, match=r"larger than max.request.size \(2000\)"
            ):
                future.result(0)
        assert len(seen) == 2 and all(isinstance(e, MessageTooLargeError) for e in seen)
        assert producer.send(topic, b"x" * 1000).result(30).offset == 0  # the rest goes on
        with pytest.raises(TypeError, match=r"value is a str; encode it"):
            producer.send(topic, "text")
        with pytest.raises(TypeError, match=r"key must be bytes-like or None, not int"):
            producer.send(topic, b"v", 5)
    tiny = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "buffer.memory": 4096}
    with kcore.Producer(tiny) as producer:
        with pytest.raises(MessageTooLargeError, match=r"larger than buffer.memory \(4096\)"):
            producer.send(topic, b"x" * 5000).result(0)


def test_backpressure_then_nothing_lost(tmp_path):
    """A stopped broker and a tiny buffer.memory: send blocks max.block.ms and raises; the
    records already accepted are delivered once the broker is back."""
    with KafkaCluster(1) as cluster:
        topic = name("backpressure")
        create(cluster.bootstrap_servers, topic, 1)
        config = {
            "bootstrap.servers": cluster.bootstrap_servers,
            "buffer.memory": 64 * 1024,
            "batch.size": 16 * 1024,
            "max.block.ms": 1500,
            "delivery.timeout.ms": 120000,
            "request.timeout.ms": 5000,
        }
        with kcore.Producer(config) as producer:
            producer.send(topic, b"warm").result(30)
            cluster.stop_broker(1)
            accepted = []
            with pytest.raises(KcoreTimeoutError, match="buffer.memory"):
                for i in range(100000):
                    accepted.append(producer.send(topic, b"%08d" % i + b"x" * 200))
            assert 0 < len(accepted) < 100000
            cluster.start_broker(1)
            producer.flush(120)
            assert all(f.result(0).offset >= 0 for f in accepted)
        back = read_all(cluster.bootstrap_servers, topic, 1, len(accepted) + 1)
        values = [m.value() for m in back[0]][1:]
        assert values == [b"%08d" % i + b"x" * 200 for i in range(len(accepted))]


def test_delivered_batches_hold_no_memory(kafka_cluster):
    """Once its records are delivered a batch's bytes are freed or go back to the producer's
    buffer pool (within buffer.memory, as Java's BufferPool keeps them), though the send path
    keeps the batch it saw last in each partition: 48 partitions of ~256 KiB batches would
    otherwise stay allocated (12 MiB) after flush, outside buffer.memory."""
    import gc
    import tracemalloc

    topic = name("released")
    create(kafka_cluster.bootstrap_servers, topic, 48)
    value = b"v" * 4000
    config = {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "batch.size": 300_000,
        "linger.ms": 1000,
        "buffer.memory": 32 << 20,
    }
    with kcore.Producer(config) as producer:
        producer.send(topic, b"warm", partition=0).result(30)  # metadata, connections
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            futures = [producer.send(topic, value, partition=i % 48) for i in range(48 * 60)]
            producer.flush(60)
            assert {f.result(0).partition for f in futures} == set(range(48))
            del futures
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
            pool = producer._core.accumulator._pool
            pooled = pool.held_bytes
        finally:
            tracemalloc.stop()
    assert 0 < pooled <= config["buffer.memory"]  # reused by the next batches
    assert held - pooled < 2 << 20, f"{held - pooled} bytes still allocated after flush"


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_reused_batch_buffers_carry_only_their_own_records(kafka_cluster, codec):
    """With batch.size large enough for the buffer pool, later batches are written into the
    buffers of delivered ones: every record read back (by confluent-kafka) is the one sent,
    from a send loop and send_batch alike, across rounds of different record sizes."""
    bs = kafka_cluster.bootstrap_servers
    topic = name(f"pooled-{codec}")
    create(bs, topic, 3)
    config = {
        "bootstrap.servers": bs,
        "batch.size": 128 << 10,
        "buffer.memory": 2 << 20,
        "linger.ms": 2,
        "compression.type": codec,
    }
    sent: list[bytes] = []
    with kcore.Producer(config) as producer:
        for round_, size in enumerate((300, 40, 1000, 7)):
            values = [b"%d-%06d-" % (round_, i) + b"x" * size for i in range(3000)]
            if round_ % 2:
                producer.send_batch(topic, values).result(60)
            else:
                for v in values:
                    producer.send(topic, v)
                producer.flush(60)
            sent += values
        pool = producer._core.accumulator._pool
        assert pool is not None and pool.reuses > 0
    got = read_all(bs, topic, 3, len(sent))
    assert sorted(m.value() for msgs in got.values() for m in msgs) == sorted(sent)


@contextlib.contextmanager
def broker_stopped(cluster: KafkaCluster) -> Iterator[None]:
    """The cluster's (first) broker SIGSTOPped for the block: it takes connections and answers
    nothing."""
    pid = cluster.nodes[0].process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_stopped(pid)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_close_with_a_timeout_fails_what_is_unacknowledged_at_the_deadline():
    """A broker that stops answering (SIGSTOP) while a record is in flight: close(2) returns
    within its timeout plus a little, not after request.timeout.ms, and the record fails."""
    with KafkaCluster(1) as cluster:
        topic = name("close-deadline")
        create(cluster.bootstrap_servers, topic, 1)
        config = {
            "bootstrap.servers": cluster.bootstrap_servers,
            "request.timeout.ms": 60000,
            "delivery.timeout.ms": 120000,
        }
        producer = kcore.Producer(config)
        producer.send(topic, b"warm").result(30)
        with broker_stopped(cluster):
            future = producer.send(topic, b"unanswered")
            time.sleep(0.5)  # sent, not answered
            started = time.monotonic()
            producer.close(2)
            took = time.monotonic() - started
            with pytest.raises(KcoreError, match="closed before the record was acknowledged"):
                future.result(0)
        assert took < 10, took


def test_retries_zero_fails_at_the_first_retriable_error():
    """retries=0 (idempotence off, as Java requires): a request that times out (the broker is
    SIGSTOPped) fails its record at once, instead of being retried until
    delivery.timeout.ms."""
    with KafkaCluster(1) as cluster:
        topic = name("no-retries")
        create(cluster.bootstrap_servers, topic, 1)
        config = {
            "bootstrap.servers": cluster.bootstrap_servers,
            "retries": 0,
            "enable.idempotence": False,
            "acks": 1,
            "request.timeout.ms": 2000,
            "delivery.timeout.ms": 60000,
        }
        with kcore.Producer(config) as producer:
            producer.send(topic, b"warm").result(30)
            with broker_stopped(cluster):
                started = time.monotonic()
                future = producer.send(topic, b"unanswered")
                with pytest.raises(KcoreError) as caught:
                    future.result(30)
                took = time.monotonic() - started
        assert took < 15, (took, caught.value)


def test_records_in_flight_fail_at_delivery_timeout_not_after_their_request():
    """delivery.timeout.ms bounds the time to a record's outcome even while its request is out
    (as Java's): with the broker SIGSTOPped, the first attempt times out at request.timeout.ms
    and the retry hangs in connection setup; the record fails at the delivery timeout, not
    a request or setup timeout later. Once the broker is back, later records go through."""
    with KafkaCluster(1) as cluster:
        topic = name("in-flight-expiry")
        create(cluster.bootstrap_servers, topic, 1)
        config = {
            "bootstrap.servers": cluster.bootstrap_servers,
            "linger.ms": 0,
            "request.timeout.ms": 4000,
            "delivery.timeout.ms": 6000,
            "socket.connection.setup.timeout.ms": 20000,
            "socket.connection.setup.timeout.max.ms": 20000,
        }
        producer = kcore.Producer(config)
        try:
            producer.send(topic, b"warm").result(30)
            with broker_stopped(cluster):
                started = time.monotonic()
                future = producer.send(topic, b"unanswered")
                with pytest.raises(KcoreTimeoutError, match="delivery.timeout.ms"):
                    future.result(60)
                took = time.monotonic() - started
                # Its request may still be out: close(timeout) keeps to its deadline all the same.
                started = time.monotonic()
                producer.close(2)
                closing = time.monotonic() - started
        finally:
            producer.close()
        assert 5.5 < took < 10, took
        assert closing < 5, closing
        with kcore.Producer(config) as again:
            assert again.send(topic, b"after").result(60).offset >= 1


def test_no_loss_no_duplicates_while_leaders_move_and_a_broker_dies(kafka_cluster3):
    """RF 3, min.insync.replicas 2, acks=all, idempotence: 200,000 keyed records while
    leadership moves and a broker is killed and restarted. Every record is acknowledged once and
    read back once, in send order per partition."""
    bootstrap = kafka_cluster3.bootstrap_servers
    topic = name("chaos")
    partitions = 6
    create(bootstrap, topic, partitions, 3, **{"min.insync.replicas": "2"})
    n = 200_000
    acked: list = [None] * n
    errors: list = []
    config = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 65536,
        "delivery.timeout.ms": 180000,
        "request.timeout.ms": 10000,
    }
    with (
        kcore.Producer(config) as producer,
        kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin,
    ):
        done = threading.Event()

        def chaos():
            time.sleep(0.5)
            before = admin.describe_topics([topic])[topic].partitions
            admin.alter_partition_reassignments(
                {
                    TopicPartition(topic, p.partition): [r for r in p.replicas if r != p.leader]
                    + [p.leader]
                    for p in before
                }
            )
            time.sleep(1.0)
            admin.elect_leaders([(topic, p.partition) for p in before])
            time.sleep(0.5)
            kafka_cluster3.kill_broker(2)
            time.sleep(2.0)
            kafka_cluster3.start_broker(2)
            done.set()

        chaos_thread = threading.Thread(target=chaos)
        chaos_thread.start()
        futures = []
        for i in range(n):
            futures.append(producer.send(topic, b"%09d" % i, b"key-%d" % (i % 1000)))
            if i % 20000 == 0:
                time.sleep(0.2)  # spread the sends over the chaos
        chaos_thread.join(120)
        producer.flush(180)
        for i, f in enumerate(futures):
            try:
                acked[i] = f.result(0)
            except Exception as exc:  # pragma: no cover - what the test forbids
                errors.append((i, exc))
    assert done.is_set()
    assert not errors, errors[:5]
    positions = {(m.partition, m.offset) for m in acked}
    assert len(positions) == n  # every record acknowledged at its own offset
    back = read_all(bootstrap, topic, partitions, n, timeout=120)
    values = [m.value() for msgs in back.values() for m in msgs]
    assert len(values) == n and len(set(values)) == n  # each once
    for p, msgs in back.items():  # send order per partition
        nums = [int(m.value()) for m in msgs]
        assert nums == sorted(nums), f"partition {p} out of order"


def test_order_holds_with_batches_in_flight_on_a_new_topic(kafka_cluster):
    """Five batches a partition in flight (the default) right after the topic is created, when
    the first ones may meet NOT_LEADER_OR_FOLLOWER: the leader takes any first sequence from a
    producer it has no state for, so a partition pipelines only after its first batch is
    written; per key, the log holds the records in send order."""
    bootstrap = kafka_cluster.bootstrap_servers
    for round_ in range(4):
        topic = name(f"inflight-{round_}")
        create(bootstrap, topic, 4)
        n = 20000
        values = [b"value-%08d" % i for i in range(n)]
        keys = [b"key-%04d" % (i % 500) for i in range(n)]
        with kcore.Producer({"bootstrap.servers": bootstrap, "batch.size": 8000}) as producer:
            producer.send_batch(topic, values, keys).result(60)
        got = read_with_kcore(bootstrap, topic, 4, n)
        assert len(got) == n
        per_key: dict[bytes, list[bytes]] = defaultdict(list)
        for r in sorted(got, key=lambda r: (r.partition, r.offset)):
            per_key[r.key].append(r.value)
        assert all(vs == sorted(vs) for vs in per_key.values())


def test_a_failing_sender_fails_the_records_instead_of_hanging(kafka_cluster, monkeypatch):
    from kcore.producer.sender import Sender

    def broken(self, batches):
        raise RuntimeError("boom")

    monkeypatch.setattr(Sender, "_dispatch", broken)
    topic = name("broken-sender")
    create(kafka_cluster.bootstrap_servers, topic, 1)
    producer = kcore.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    try:
        future = producer.send(topic, b"v")
        with pytest.raises(KcoreError, match="sender stopped.*boom"):
            future.result(30)
        with pytest.raises(KcoreError):
            producer.send(topic, b"more")
    finally:
        producer.close(5)


def test_a_batch_that_cannot_be_built_fails_alone(kafka_cluster, monkeypatch):
    """A batch whose bytes cannot be made (its builder ran out of memory, say) fails its own
    records; the other partitions' batches in the same request are delivered."""
    from kcore.producer.sender import Sender

    real = Sender._payload

    def payload(self, batch):
        if batch.tp.partition == 1:
            raise MemoryError("this batch builder ran out of memory; its 1 record(s) are lost")
        return real(self, batch)

    monkeypatch.setattr(Sender, "_payload", payload)
    topic = name("unbuildable")
    create(kafka_cluster.bootstrap_servers, topic, 2)
    config = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "linger.ms": 200}
    with kcore.Producer(config) as producer:
        producer.send(topic, b"warm", partition=0).result(30)  # both in one request below
        good = producer.send(topic, b"kept", partition=0)
        bad = producer.send(topic, b"lost", partition=1)
        with pytest.raises(KcoreError, match=f"{topic}-1: this batch builder ran out of memory"):
            bad.result(30)
        assert good.result(30).offset == 1
        assert producer.send(topic, b"after", partition=0).result(30).offset == 2


def test_the_java_console_consumer_reads_what_kcore_wrote(kafka_cluster):
    """Kafka's own console consumer (the Java client) reads kcore's records of every codec as
    they were sent: keys, null keys and values, headers, timestamps."""
    bootstrap = kafka_cluster.bootstrap_servers
    run = uuid.uuid4().hex[:6]
    sent: dict[str, tuple] = {}
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(f"java-reads-{run}-{c}", 1, 1) for c in CODECS])
    for codec in CODECS:
        with kcore.Producer(
            {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5}
        ) as producer:
            for i in range(60):
                value = None if i % 10 == 3 else f"{codec}-value-{i}".encode()
                key = None if i % 7 == 0 else f"key-{i % 9}".encode()
                headers = [("n", str(i).encode()), ("codec", codec.encode())] if i % 2 else None
                ts = BASE_TS + 1000 * CODECS.index(codec) + i
                producer.send(
                    f"java-reads-{run}-{codec}", value, key, timestamp_ms=ts, headers=headers
                )
                sent[f"{ts}"] = (key, value, headers)
    out = kafka_cluster.run_tool(
        "kafka-console-consumer",
        "--bootstrap-server",
        bootstrap,
        "--include",
        f"java-reads-{run}-.*",
        "--from-beginning",
        "--max-messages",
        len(sent),
        "--timeout-ms",
        60000,
        *("--formatter-property", "print.timestamp=true"),
        *("--formatter-property", "print.key=true"),
        *("--formatter-property", "print.headers=true"),
        *("--formatter-property", "null.literal=<null>"),
        *("--formatter-property", "headers.separator=;"),
        *("--formatter-property", "headers.key.separator=:"),
        check=True,
    ).stdout
    got = {}
    for line in out.splitlines():
        if not line.startswith("CreateTime:"):
            continue
        ts_field, headers_field, key_field, value_field = line.split("\t")
        headers = (
            None
            if headers_field == "NO_HEADERS"
            else [(h.split(":")[0], h.split(":")[1].encode()) for h in headers_field.split(";")]
        )
        key = None if key_field == "<null>" else key_field.encode()
        value = None if value_field == "<null>" else value_field.encode()
        got[ts_field.removeprefix("CreateTime:")] = (key, value, headers)
    assert got == sent


def test_keys_land_where_the_java_producer_puts_them(kafka_cluster):
    """Kafka's console producer (the Java client's default partitioner) writes keyed records;
    each is on the partition kcore's partitioner picks for its key."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("java-keys")
    create(bootstrap, topic, 7)
    lines = [f"user-{i * 7919 % 1000}:v{i}" for i in range(300)]
    kafka_cluster.run_tool(
        "kafka-console-producer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        *("--reader-property", "parse.key=true"),
        *("--reader-property", "key.separator=:"),
        input="\n".join(lines) + "\n",
        check=True,
    )
    got = read_with_kcore(bootstrap, topic, 7, len(lines))
    assert len(got) == len(lines)
    assert {r.partition for r in got} == set(range(7))
    assert all(r.partition == partition_for_key(r.key, 7) for r in got)


def test_a_failed_batch_never_makes_a_later_one_a_duplicate(kafka_cluster):
    """A batch the broker refuses for good (MESSAGE_TOO_LARGE) must not hand its sequence
    numbers back: the next batch would reuse sequence 0 of the same epoch, which the broker
    takes for a duplicate of the first batch and drops while answering success. A new epoch
    renumbers instead (KIP-360, as Java)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("too-large")
    create(bootstrap, topic, 1, **{"max.message.bytes": "2000"})
    with kcore.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0}) as producer:
        first = producer.send(topic, b"first", partition=0).result(30)
        with pytest.raises(KcoreError):
            producer.send(topic, b"x" * 10_000, partition=0).result(30)
        second = producer.send(topic, b"after", partition=0).result(30)
        third = producer.send(topic, b"later", partition=0).result(30)
    assert (first.offset, second.offset, third.offset) == (0, 1, 2)
    back = read_all(bootstrap, topic, 1, 3)
    assert [m.value() for m in back[0]] == [b"first", b"after", b"later"]


@pytest.mark.parametrize(
    "mode", ["idempotent", "idempotent-lz4", "not-idempotent", "transactional", "send_batch"]
)
def test_a_batch_too_large_for_the_topic_is_split_and_every_record_delivered(kafka_cluster, mode):
    """batch.size over the topic's max.message.bytes: the broker refuses each batch as
    MESSAGE_TOO_LARGE; the producer splits it (in halves, until the parts fit) and sends the
    parts, as Java does, instead of failing every record. Each record is written once, in send
    order, and its future gives the offset it was written at."""

    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("split")
    create(bootstrap, topic, 2, **{"max.message.bytes": "20000"})
    config: dict = {"bootstrap.servers": bootstrap, "batch.size": 400_000, "linger.ms": 300}
    if mode == "idempotent-lz4":
        config["compression.type"] = "lz4"
    if mode == "not-idempotent":
        config.update({"enable.idempotence": False, "acks": 1})
    if mode == "transactional":
        config["transactional.id"] = name("split-txn")
    n = 300
    # Random values: incompressible, so compression cannot bring a batch under the limit.
    values = [b"%04d:" % i + os.urandom(1000) for i in range(n)]
    with kcore.Producer(config) as producer:
        if mode == "transactional":
            producer.init_transactions()
            producer.begin_transaction()
        if mode == "send_batch":
            results = [producer.send_batch(topic, values[:n], partition=0)]
        else:
            headers = [[("i", b"%d" % i)] if i % 3 else None for i in range(n)]
            keys = [None if i % 5 == 0 else b"k%d" % i for i in range(n)]
            delivered: list = []
            results = [
                producer.send(
                    topic,
                    values[i],
                    key=keys[i],
                    partition=i % 2,
                    headers=headers[i],
                    on_delivery=lambda err, md, i=i: delivered.append((i, err, md)),
                )
                for i in range(n)
            ]
        if mode == "transactional":
            producer.commit_transaction()
        producer.flush(60)
        outcomes = [r.result(0) for r in results]
    back = read_all(bootstrap, topic, 2, n)
    assert sum(len(m) for m in back.values()) == n
    if mode == "send_batch":
        # One entry per part, in record order, covering the records with their offsets.
        parts = outcomes[0]
        assert len(parts) > 1 and sum(count for _, _, count in parts) == n
        at = [(0, base + k) for _, base, count in parts for k in range(count)]
        assert [m.value() for m in back[0]] == values
        assert [(0, m.offset()) for m in back[0]] == at
        return
    by_offset = {(p, m.offset()): m for p, msgs in back.items() for m in msgs}
    for i, md in enumerate(outcomes):
        m = by_offset[(md.partition, md.offset)]  # the future's offset holds its record
        assert m.value() == values[i]
        assert m.key() == keys[i]
        assert (m.headers() or None) == headers[i]
    for p in (0, 1):
        assert [m.value() for m in back[p]] == values[p::2]  # send order, each once
    assert sorted(i for i, err, _ in delivered if err is None) == list(range(n))


def test_a_split_batch_fails_only_its_record_that_cannot_fit(kafka_cluster):
    """Among records that fit, one record over max.message.bytes: the split goes down to it,
    it alone fails with MESSAGE_TOO_LARGE, the rest are delivered in order."""
    from kcore.errors import MessageTooLargeError

    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("split-one")
    create(bootstrap, topic, 1, **{"max.message.bytes": "20000"})
    values = [b"%03d" % i + b"x" * (30_000 if i == 37 else 500) for i in range(100)]
    config = {"bootstrap.servers": bootstrap, "batch.size": 400_000, "linger.ms": 300}
    with kcore.Producer(config) as producer:
        futures = [producer.send(topic, v, partition=0) for v in values]
        producer.flush(60)
    with pytest.raises(MessageTooLargeError):
        futures[37].result(0)
    offsets = [f.result(0).offset for i, f in enumerate(futures) if i != 37]
    assert offsets == list(range(99))
    back = read_all(bootstrap, topic, 1, 99)
    assert [m.value() for m in back[0]] == values[:37] + values[38:]


def test_batches_in_flight_behind_a_split_one_go_again_after_its_halves(kafka_cluster):
    """Idempotent, several batches of a partition in flight, each too large: the first comes
    back MESSAGE_TOO_LARGE, the ones behind it OUT_OF_ORDER_SEQUENCE (the broker saw a gap).
    The halves keep the first's sequences and go first; the others follow with theirs: every
    record once, in send order."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("split-flying")
    create(bootstrap, topic, 1, **{"max.message.bytes": "20000"})
    config = {"bootstrap.servers": bootstrap, "batch.size": 60_000, "linger.ms": 20}
    values = [b"%04d:" % i + os.urandom(1000) for i in range(600)]
    with kcore.Producer(config) as producer:
        producer.send(topic, b"warm", partition=0).result(30)  # so more than one may fly
        futures = [producer.send(topic, v, partition=0) for v in values]
        producer.flush(60)
    assert [f.result(0).offset for f in futures] == list(range(1, 601))
    back = read_all(bootstrap, topic, 1, 601)
    assert [m.value() for m in back[0]] == [b"warm", *values]


def test_records_the_broker_names_as_invalid_fail_with_their_own_error(kafka_cluster):
    """KIP-467, as Java: a compacted topic refuses a batch holding a record without a key
    (INVALID_RECORD) and names that record; it fails with the broker's error and words about
    it, the batch's other records with a plain KcoreError (Java's KafkaException) saying why
    they were not written. Nothing is retried, and the producer goes on. send_batch raises the
    named record's error."""
    from kcore.errors import InvalidRecordError, KcoreError

    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("compacted")
    create(bootstrap, topic, 1, **{"cleanup.policy": "compact"})
    config = {"bootstrap.servers": bootstrap, "linger.ms": 500}
    with kcore.Producer(config) as p:
        futures = [
            p.send(topic, b"v%d" % i, key, partition=0) for i, key in enumerate([b"a", None, b"c"])
        ]
        p.flush(30)
        errors = [f.exception(0) for f in futures]
        assert isinstance(errors[1], InvalidRecordError) and "without key" in str(errors[1])
        for e in (errors[0], errors[2]):
            assert type(e) is KcoreError and "part of a batch with invalid records" in str(e)
        with pytest.raises(InvalidRecordError, match="without key"):
            futures[1].result(0)
        assert p.send(topic, b"after", b"k", partition=0).result(30).offset == 0
        result = p.send_batch(topic, [b"x", b"y"], keys=[b"k", None], partition=0)
        with pytest.raises(InvalidRecordError, match="without key"):
            result.result(30)
