"""kcore's consumer against its peers (confluent-kafka, kafka-python, aiokafka), measured in the
same run against the same real broker.

Before the benchmarks, outside any timed part, N records (``KCORE_BENCH_CONSUME_N``, default
1,000,000) of 100-byte JSON-like values (the producer benchmark's ``make_values``; lz4 shrinks
a batch of them ~2.6x), no keys, are written once per codec (``none`` and ``lz4``) into a
6-partition topic (N / 6 records each) of one Kafka node (the ``kafka_cluster`` fixture of
kcore's pytest plugin, or ``KCORE_BOOTSTRAP``) by kcore's ``Producer.send_batch``, one call a
partition (acks=all, ``linger.ms`` 5, ``batch.size`` 1,000,000 bytes), and the topic's end
offsets are checked. Every round then reads all N records back from the beginning. Groups
(``consume:<codec>``), so bench/report.py's ratios compare like with like:

* kcore ``Consumer.poll(1.0, max_records=10_000)`` in a loop, summing ``len``;
* kcore ``Consumer.poll_arrow(1.0, max_records=100_000)`` in a loop, summing ``num_rows``;
* confluent-kafka ``Consumer.consume(10_000, 1.0)`` in a loop (asking for at most the records
  left: it waits for as many as it is asked for), counting the messages whose ``error()`` is
  None (and, in ``none`` only, a diagnostic row with an 8 MiB partition fetch);
* kafka-python ``KafkaConsumer.poll(timeout_ms=1000, max_records=10_000)``, summing the lengths
  of the lists it returns;
* aiokafka ``AIOKafkaConsumer.getmany(timeout_ms=1000, max_records=10_000)`` on an event loop
  in the benchmark's thread, the same way.

Every client assigns all 6 partitions by hand and starts from the beginning (no consumer group,
no offset commits), with the same fetch sizing: 1 MiB per partition (Java's and librdkafka's
default), 50 MiB per fetch, ``fetch.min.bytes`` 1, ``fetch.max.wait.ms`` 500 (see FETCHING and
the clients' factories below). Each round gets a new consumer, created, connected and assigned
in pytest-benchmark's ``setup`` (outside the timed part) and closed after it: the timed part
runs from the first poll to the N-th record, and so includes the first offset lookup and
fetches (a few ms of a round of a second or more).

Besides wall time, each round records the process CPU time (``time.process_time``: the calling
thread and every thread of the client, e.g. librdkafka's or kcore's network thread), the
broker's CPU time (a separate process, when kcore.testing runs it) and the growth of the peak
RSS over the round (``VmHWM`` reset through ``/proc/self/clear_refs`` before each round).

Correctness, outside the timed part: every round must count exactly N records and leave the
consumer's positions at the topic's end offsets (a client that read a record twice and skipped
another would fail the latter), and confluent-kafka must have returned no error message. Before
their rounds, kcore's rows read the whole topic once more, untimed, keeping what they read:
every partition's offsets must be 0..n-1 in order, the values exactly the ones written, the
keys null, and ``poll_arrow``'s batches must have Spark's columns (key, value, topic,
partition, offset, timestamp, timestampType).

``KCORE_BENCH_CONSUME_VALUE_SIZE``, ``KCORE_BENCH_CONSUME_PARTITIONS`` and
``KCORE_BENCH_CONSUME_BATCH_SIZE`` change the shape of the topics of the rows above (100 B,
6, 1,000,000 by default).

``test_large_values`` (groups ``consume-large:<value size>B@<batch.size>``): 1 KiB and 10 KiB
values in 8-partition topics written at 16 KiB and 1 MB batches (128 MB of values each,
``KCORE_BENCH_CONSUME_LARGE_MB``), read with the fetch settings above by kcore ``poll``,
kcore ``poll_arrow`` and confluent-kafka ``consume``, beside two floors: one memcpy and one
CRC32C of the same bytes (``floor``), and the same with the broker and the socket
(``fetch_floor``: the same Fetch requests on one connection, each answer's record bytes
CRC'd and copied once, nothing decoded). The variants take turns round by round
(``KCORE_BENCH_CONSUME_LARGE_ROUNDS``, default 5), each round in a process of its own
(bench/_consume_child.py) that first reads the whole topic untimed; with
``KCORE_BENCH_CONSUME_BASELINE_SRC`` set to another tree's ``src``, that tree's ``poll`` and
``poll_arrow`` take turns too. The table (printed with ``-s``, and kept in extra_info) gives
the medians, the ratio to confluent-kafka and the CPU per MB against the floor's.

Run: ``pytest bench/test_consumer_bench.py --benchmark-json=out.json && python bench/report.py
out.json`` (see docs/benchmarks-consumer.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from test_producer_bench import (
    VALUE_SIZE as TEMPLATE_VALUE_SIZE,
)
from test_producer_bench import (
    Broker,
    RoundMeters,
    _info,
    _need,
    _optional,
    make_values,
)

import kcore
import kcore.consumer.fetcher as kcore_fetcher

pytestmark = [pytest.mark.broker, pytest.mark.slow]

N = int(os.environ.get("KCORE_BENCH_CONSUME_N", "1000000"))
# Rounds per benchmark: ROUNDS, and one for a client slower than SLOW_ROUND_S a round,
# estimated from its priming (PRIME_RECORDS read by a consumer of its own, untimed).
ROUNDS = int(os.environ.get("KCORE_BENCH_CONSUME_ROUNDS", "3"))
SLOW_ROUND_S = 10.0
PRIME_RECORDS = min(N, 50_000)
# The shape of the topics of the rows below: value size, partitions, the writer's batch.size.
VALUE_SIZE = int(os.environ.get("KCORE_BENCH_CONSUME_VALUE_SIZE", str(TEMPLATE_VALUE_SIZE)))
PARTITIONS = int(os.environ.get("KCORE_BENCH_CONSUME_PARTITIONS", "6"))
CODECS = ("none", "lz4")
# The topics' writer (kcore's producer, as in bench/test_producer_bench.py).
LINGER_MS = 5
BATCH_SIZE = int(os.environ.get("KCORE_BENCH_CONSUME_BATCH_SIZE", "1000000"))
# Fetch sizing, the same for every client.
PARTITION_FETCH = 1024 * 1024  # max.partition.fetch.bytes: Java's and librdkafka's default
BIG_PARTITION_FETCH = 8 * 1024 * 1024  # the diagnostic confluent-kafka row
FETCH_MAX_BYTES = 50 * 1024 * 1024  # fetch.max.bytes: everyone's default
FETCH_MAX_WAIT_MS = 500
FETCH_MIN_BYTES = 1
# Records a call may return.
POLL_RECORDS = 10_000
ARROW_RECORDS = 100_000
POLL_TIMEOUT_S = 1.0
POLL_TIMEOUT_MS = int(POLL_TIMEOUT_S * 1000)
TIMEOUT_S = 300.0  # for one pass over the topic, by any client
WARM_UP_S = 6.0  # the broker's fetch path, before the first benchmark
SETTLE_S = 2.0
ARROW_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")

FETCHING = {  # what report.py prints about the run
    "records": f"{N:,} values of {VALUE_SIZE} B, no keys, written once per codec before the "
    f"benchmarks (kcore send_batch, batch.size {BATCH_SIZE:,} B, linger.ms {LINGER_MS}, "
    "acks all)",
    "topic": f"one per codec, {PARTITIONS} partitions of N / {PARTITIONS} records, RF 1",
    "assignment": f"manual, all {PARTITIONS} partitions from the beginning, no group, no commits",
    "partition fetch": f"{PARTITION_FETCH >> 20} MiB (max.partition.fetch.bytes; librdkafka "
    f"fetch.message.max.bytes; diagnostic confluent-kafka row {BIG_PARTITION_FETCH >> 20} MiB)",
    "fetch.max.bytes": f"{FETCH_MAX_BYTES >> 20} MiB",
    "fetch.min.bytes": FETCH_MIN_BYTES,
    "fetch.max.wait.ms": FETCH_MAX_WAIT_MS,
    "records per call": f"{POLL_RECORDS:,} (poll_arrow {ARROW_RECORDS:,})",
    "read-ahead": "each client's default (kcore: "
    f"{getattr(kcore_fetcher, 'PREFETCH_RESPONSES', '?')} responses a partition; librdkafka: "
    "queued.max.messages.kbytes 64 MiB; kafka-python, aiokafka: one response a partition)",
    "CRC checks": "each client's default (kcore, kafka-python, aiokafka: on; librdkafka: off)",
}

confluent = _optional("confluent_kafka")
kafka = _optional("kafka")
aiokafka = _optional("aiokafka")


def _group(codec: str) -> pytest.MarkDecorator:
    return pytest.mark.benchmark(group=f"consume:{codec}")


# ---------------------------------------------------------------------------------------------
# The topics, written once (outside the timed part), and the broker warmed up for reading


@dataclass(frozen=True)
class Topic:
    name: str
    codec: str
    end_offsets: dict[int, int]  # partition -> end offset (their sum is N)


@dataclass
class Topics:
    broker: Broker
    by_codec: dict[str, Topic]
    expected: list[bytes]  # the N values written, sorted


def _kcore_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    config = {
        "bootstrap.servers": bootstrap,
        "auto.offset.reset": "earliest",
        "max.partition.fetch.bytes": PARTITION_FETCH,
        "fetch.max.bytes": FETCH_MAX_BYTES,
        "fetch.min.bytes": FETCH_MIN_BYTES,
        "fetch.max.wait.ms": FETCH_MAX_WAIT_MS,
    }
    config.update(overrides)
    return config


def _open_kcore(bootstrap: str, topic: str) -> Any:
    c = kcore.Consumer(_kcore_config(bootstrap))
    c.assign([(topic, p) for p in range(PARTITIONS)])
    c.seek_to_beginning()
    return c


@pytest.fixture(scope="module")
def topics(kafka_cluster: Any) -> Iterator[Topics]:
    """One topic per codec holding the N values, and the broker warmed up: a fresh JVM is slower
    for its first seconds (JIT), which would land on whichever client runs first. kcore reads
    the topics (poll_arrow) for WARM_UP_S, at least once each, then the broker idles for
    SETTLE_S."""
    nodes = getattr(kafka_cluster, "nodes", [])
    process = getattr(nodes[0], "process", None) if len(nodes) == 1 else None
    bootstrap = kafka_cluster.bootstrap_servers
    values = _values(N, VALUE_SIZE)
    assert {len(v) for v in values} == {VALUE_SIZE}
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        broker = Broker(bootstrap, admin, process.pid if process else None)
        try:
            by_codec = {}
            for codec in CODECS:
                name = _new_topic(broker, f"bench-consume-{codec}", PARTITIONS)
                config = {
                    "bootstrap.servers": bootstrap,
                    "linger.ms": LINGER_MS,
                    "batch.size": BATCH_SIZE,
                    "compression.type": codec,
                    "acks": "all",
                }
                with kcore.Producer(config) as producer:
                    # N / 6 records a partition: the sticky partitioner's random chunk
                    # placement would change the partitions' sizes from run to run and leave
                    # some empty at a small N (where librdkafka stalls on a fetch the broker
                    # holds for fetch.max.wait.ms).
                    sent = [
                        producer.send_batch(name, values[p::PARTITIONS], partition=p)
                        for p in range(PARTITIONS)
                    ]
                    for result in sent:
                        result.result(TIMEOUT_S)
                offsets = _end_offsets(broker, name, PARTITIONS)
                want = {p: len(values[p::PARTITIONS]) for p in range(PARTITIONS)}
                assert offsets == want, f"{name}: end offsets {offsets}, want {want}"
                by_codec[codec] = Topic(name, codec, offsets)
            deadline = time.monotonic() + WARM_UP_S
            for topic in [*by_codec.values()] * 100:
                c = _open_kcore(bootstrap, topic.name)
                try:
                    assert _consume_arrow(c, N) == N
                finally:
                    c.close()
                if time.monotonic() > deadline and topic.codec == CODECS[-1]:
                    break
            time.sleep(SETTLE_S)
            yield Topics(broker, by_codec, sorted(values))
        finally:
            broker.delete_all()


def _values(n: int, size: int, seed: int = 7) -> list[bytes]:
    """``n`` values of ``size`` bytes: the producer benchmark's 100-byte JSON-like values, or
    (another size) the same template repeated to ``size`` with fresh symbols in every hole."""
    if size == TEMPLATE_VALUE_SIZE:
        return make_values(n)
    rows = -(-size // TEMPLATE_VALUE_SIZE)
    parts = make_values(n * rows, seed)
    return [b"".join(parts[i * rows : (i + 1) * rows])[:size] for i in range(n)]


def _new_topic(broker: Broker, prefix: str, partitions: int) -> str:
    """A topic of ``partitions`` partitions (RF 1), its logs in place (see Broker.new_topic)."""
    from kcore.admin import NewTopic

    broker.count += 1
    name = f"{prefix}-{broker.run}-{broker.count:03d}"
    broker.admin.create_topics([NewTopic(name, partitions, 1)], timeout=30)
    broker.created.append(name)
    _end_offsets(broker, name, partitions)
    return name


def _end_offsets(broker: Broker, topic: str, partitions: int) -> dict[int, int]:
    got = broker.admin.list_offsets({(topic, p): "latest" for p in range(partitions)})
    return {tp.partition: r.offset for tp, r in got.items()}


# ---------------------------------------------------------------------------------------------
# Rounds: a fresh consumer each, created in setup; checks and bookkeeping outside the timed part


@dataclass
class Reader:
    """One client's consumer, as the rounds drive it."""

    open: Callable[[], Any]  # a new consumer, connected, assigned all partitions, at the start
    consume: Callable[[Any, int], int]  # the timed part: read until n records, return the count
    positions: Callable[[Any], dict[int, int]]  # partition -> next offset it would read
    close: Callable[[Any], None]
    check: Callable[[], None] = lambda: None  # the client's own check of its last round


def _deadline_passed(deadline: float, total: int, n: int) -> bool:
    if time.monotonic() > deadline:
        raise TimeoutError(f"{total} of {n} records after {TIMEOUT_S:g}s")
    return False


@dataclass
class Rounds:
    """pytest-benchmark's ``setup``/``teardown`` for one benchmark: a new consumer per round,
    whose count and positions (of the partitions holding records) are checked afterwards.
    Measured by the producer benchmark's RoundMeters."""

    topics: Topics
    topic: Topic
    benchmark: Any
    reader: Reader
    pending: Any = None  # the round's consumer, until checked and closed
    got: int | None = None
    meters: RoundMeters = field(init=False)

    def __post_init__(self) -> None:
        self.meters = RoundMeters(self.topics.broker)

    def setup(self) -> tuple[tuple[Any], dict[str, Any]]:
        self.finish()  # pytest-benchmark --benchmark-disable calls no teardown
        self.got = None
        consumer = self.pending = self.reader.open()
        self.meters.start()
        return (consumer,), {}

    def timed(self, consumer: Any) -> None:
        self.got = self.meters.timed(self.reader.consume, consumer, N)

    def teardown(self, consumer: Any) -> None:
        self.meters.stop()
        self.finish()

    def finish(self) -> None:
        consumer, self.pending = self.pending, None
        if consumer is None:
            return
        try:
            assert self.got == N, f"{self.got} records read, want {N}"
            # (an empty partition has no position in librdkafka: OFFSET_INVALID)
            ends = {p: end for p, end in self.topic.end_offsets.items() if end}
            positions = self.reader.positions(consumer)
            positions = {p: positions[p] for p in ends}
            assert positions == ends, (
                f"positions {positions} after the round, want the end offsets {ends}"
            )
            self.reader.check()
        finally:
            self.reader.close(consumer)

    def prime(self) -> float:
        """PRIME_RECORDS read by a consumer of its own, untimed (imports, warm code paths);
        returns the estimated time of a round."""
        consumer = self.reader.open()
        try:
            t0 = time.perf_counter()
            got = self.reader.consume(consumer, PRIME_RECORDS)
            elapsed = time.perf_counter() - t0
        finally:
            self.reader.close(consumer)
        assert got >= PRIME_RECORDS
        return elapsed * N / got

    def run(self) -> None:
        estimate = self.prime()
        rounds = 1 if estimate > SLOW_ROUND_S else ROUNDS
        try:
            self.benchmark.pedantic(
                self.timed, setup=self.setup, teardown=self.teardown, rounds=rounds, iterations=1
            )
        except BaseException:
            consumer, self.pending = self.pending, None  # the round's own error: no checks
            if consumer is not None:
                self.reader.close(consumer)
            raise
        self.finish()  # after pytest-benchmark --benchmark-disable's single call
        self.benchmark.extra_info.update(
            **self.meters.extra_info(),
            estimated_round_s=estimate,
            end_offsets=self.topic.end_offsets,
        )


def _bench_info(benchmark: Any, key: str, label: str, impl: str, codec: str, **extra: Any) -> None:
    _info(
        benchmark,
        key,
        label,
        impl=impl,
        items=N,
        payload_bytes=N * VALUE_SIZE,
        codec=codec,
        settings=FETCHING,
        **extra,
    )


def _check_read(
    topics: Topics, topic: Topic, offsets: dict[int, list[int]], values: list[bytes]
) -> None:
    """What one untimed pass read: every partition's offsets 0..n-1 in order, the values
    exactly the ones written (in any order across partitions)."""
    for p in range(PARTITIONS):
        got = np.asarray(offsets.get(p, []), dtype=np.int64)
        want = np.arange(topic.end_offsets[p], dtype=np.int64)
        assert np.array_equal(got, want), (
            f"partition {p}: {len(got)} offsets read, not 0..{len(want) - 1} in order"
        )
    assert len(values) == N, f"{len(values)} values read, want {N}"
    assert sorted(values) == topics.expected, "the values read are not the ones written"


# ---------------------------------------------------------------------------------------------
# The clients, with matched fetch settings


CODEC_PARAMS = [pytest.param(c, marks=_group(c), id=c) for c in CODECS]


def _kcore_reader(topics: Topics, topic: Topic, consume: Callable[[Any, int], int]) -> Reader:
    return Reader(
        open=lambda: _open_kcore(topics.broker.bootstrap, topic.name),
        consume=consume,
        positions=lambda c: {p: c.position((topic.name, p)) for p in range(PARTITIONS)},
        close=lambda c: c.close(),
    )


def _consume_records(c: Any, n: int) -> int:
    poll = c.poll
    total = 0
    deadline = time.monotonic() + TIMEOUT_S
    while total < n and not _deadline_passed(deadline, total, n):
        total += len(poll(POLL_TIMEOUT_S, max_records=POLL_RECORDS))
    return total


def _consume_arrow(c: Any, n: int) -> int:
    poll_arrow = c.poll_arrow
    total = 0
    deadline = time.monotonic() + TIMEOUT_S
    while total < n and not _deadline_passed(deadline, total, n):
        total += poll_arrow(POLL_TIMEOUT_S, max_records=ARROW_RECORDS).num_rows
    return total


@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_kcore_poll(benchmark: Any, topics: Topics, codec: str) -> None:
    _bench_info(
        benchmark,
        "kcore.poll",
        f"kcore Consumer.poll loop (max_records {POLL_RECORDS:,})",
        "kcore",
        codec,
    )
    topic = topics.by_codec[codec]
    # The check pass: the whole topic, untimed, with the same calls, keeping what was read.
    c = _open_kcore(topics.broker.bootstrap, topic.name)
    offsets: dict[int, list[int]] = {}
    values: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < N and not _deadline_passed(deadline, len(values), N):
            for r in c.poll(POLL_TIMEOUT_S, max_records=POLL_RECORDS):
                assert r.topic == topic.name and r.key is None and not r.headers, r
                offsets.setdefault(r.partition, []).append(r.offset)
                values.append(r.value)
    finally:
        c.close()
    _check_read(topics, topic, offsets, values)
    del offsets, values
    Rounds(topics, topic, benchmark, _kcore_reader(topics, topic, _consume_records)).run()


@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_kcore_poll_arrow(benchmark: Any, topics: Topics, codec: str) -> None:
    _bench_info(
        benchmark,
        "kcore.poll_arrow",
        f"kcore Consumer.poll_arrow loop (max_records {ARROW_RECORDS:,})",
        "kcore",
        codec,
    )
    topic = topics.by_codec[codec]
    # The check pass: the whole topic, untimed, with the same calls, keeping what was read.
    c = _open_kcore(topics.broker.bootstrap, topic.name)
    offsets: dict[int, list[int]] = {}
    values: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < N and not _deadline_passed(deadline, len(values), N):
            rb = c.poll_arrow(POLL_TIMEOUT_S, max_records=ARROW_RECORDS)
            if not rb.num_rows:
                continue
            names = tuple(rb.schema.names)
            assert names[: len(ARROW_COLUMNS)] == ARROW_COLUMNS, names
            assert rb.column("key").null_count == rb.num_rows, "keys should all be null"
            assert set(rb.column("topic").to_pylist()) == {topic.name}
            parts = rb.column("partition").to_numpy()
            offs = rb.column("offset").to_numpy()
            for p in np.unique(parts).tolist():
                offsets.setdefault(p, []).extend(offs[parts == p].tolist())
            values.extend(rb.column("value").to_pylist())
    finally:
        c.close()
    _check_read(topics, topic, offsets, values)
    del offsets, values
    Rounds(topics, topic, benchmark, _kcore_reader(topics, topic, _consume_arrow)).run()


def _confluent(benchmark: Any, topics: Topics, topic: Topic, partition_fetch: int) -> None:
    errors: list[Any] = []
    tps = [confluent.TopicPartition(topic.name, p) for p in range(PARTITIONS)]
    config = {
        "bootstrap.servers": topics.broker.bootstrap,
        "group.id": f"bench-consume-{topics.broker.run}",  # required; no group is joined
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.message.max.bytes": partition_fetch,  # max.partition.fetch.bytes
        "fetch.max.bytes": FETCH_MAX_BYTES,
        "fetch.min.bytes": FETCH_MIN_BYTES,
        "fetch.wait.max.ms": FETCH_MAX_WAIT_MS,
    }

    def open_() -> Any:
        errors.clear()
        c = confluent.Consumer(config)
        c.list_topics(topic.name, timeout=30)  # connected, the topic's metadata known
        c.assign(
            [
                confluent.TopicPartition(topic.name, p, confluent.OFFSET_BEGINNING)
                for p in range(PARTITIONS)
            ]
        )
        return c

    def consume(c: Any, n: int) -> int:
        take = c.consume
        total = 0
        deadline = time.monotonic() + TIMEOUT_S
        while total < n and not _deadline_passed(deadline, total, n):
            # At most what is left: consume waits (up to its timeout) for as many messages as it
            # is asked for, and the round's last call would wait for records that never come.
            for m in take(min(POLL_RECORDS, n - total), POLL_TIMEOUT_S):
                if m.error() is None:
                    total += 1
                else:
                    errors.append(m.error())
        return total

    def check() -> None:
        assert not errors, errors[:3]

    reader = Reader(
        open=open_,
        consume=consume,
        positions=lambda c: {tp.partition: tp.offset for tp in c.position(tps)},
        close=lambda c: c.close(),
        check=check,
    )
    Rounds(topics, topic, benchmark, reader).run()


@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_confluent_consume(benchmark: Any, topics: Topics, codec: str) -> None:
    _need(confluent, "confluent-kafka")
    _bench_info(
        benchmark,
        "confluent.consume",
        f"confluent-kafka Consumer.consume loop ({POLL_RECORDS:,})",
        "confluent-kafka",
        codec,
    )
    _confluent(benchmark, topics, topics.by_codec[codec], PARTITION_FETCH)


@_group("none")
def test_confluent_consume_big_fetch(benchmark: Any, topics: Topics) -> None:
    """A diagnostic row, not a goal's peer: librdkafka with 1 MiB partition fetches and ~1 MB
    batches gets one batch per partition per fetch; this shows what a bigger fetch does."""
    _need(confluent, "confluent-kafka")
    _bench_info(
        benchmark,
        "confluent.consume.8MiB",
        f"confluent-kafka Consumer.consume loop ({POLL_RECORDS:,}), "
        f"{BIG_PARTITION_FETCH >> 20} MiB partition fetch",
        f"confluent-kafka ({BIG_PARTITION_FETCH >> 20} MiB partition fetch)",
        "none",
        partition_fetch_bytes=BIG_PARTITION_FETCH,
    )
    _confluent(benchmark, topics, topics.by_codec["none"], BIG_PARTITION_FETCH)


@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_kafka_python_poll(benchmark: Any, topics: Topics, codec: str) -> None:
    _need(kafka, "kafka-python")
    _bench_info(
        benchmark,
        "kafka-python.poll",
        f"kafka-python KafkaConsumer.poll loop (max_records {POLL_RECORDS:,})",
        "kafka-python",
        codec,
    )
    topic = topics.by_codec[codec]
    tps = [kafka.TopicPartition(topic.name, p) for p in range(PARTITIONS)]

    def open_() -> Any:
        c = kafka.KafkaConsumer(
            bootstrap_servers=topics.broker.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=PARTITION_FETCH,
            fetch_max_bytes=FETCH_MAX_BYTES,
            fetch_min_bytes=FETCH_MIN_BYTES,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        )
        assert c.partitions_for_topic(topic.name) == set(range(PARTITIONS))  # metadata known
        c.assign(tps)
        c.seek_to_beginning()
        return c

    def consume(c: Any, n: int) -> int:
        poll = c.poll
        total = 0
        deadline = time.monotonic() + TIMEOUT_S
        while total < n and not _deadline_passed(deadline, total, n):
            total += sum(
                map(len, poll(timeout_ms=POLL_TIMEOUT_MS, max_records=POLL_RECORDS).values())
            )
        return total

    reader = Reader(
        open=open_,
        consume=consume,
        positions=lambda c: {tp.partition: c.position(tp) for tp in tps},
        close=lambda c: c.close(autocommit=False),
    )
    Rounds(topics, topic, benchmark, reader).run()


@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_aiokafka_getmany(benchmark: Any, topics: Topics, codec: str) -> None:
    _need(aiokafka, "aiokafka")
    _bench_info(
        benchmark,
        "aiokafka.getmany",
        f"aiokafka AIOKafkaConsumer.getmany loop (max_records {POLL_RECORDS:,})",
        "aiokafka",
        codec,
    )
    topic = topics.by_codec[codec]
    tps = [aiokafka.TopicPartition(topic.name, p) for p in range(PARTITIONS)]
    loop = asyncio.new_event_loop()

    async def start() -> Any:  # aiokafka objects must be made inside the loop
        c = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=topics.broker.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # a fresh assignment starts at the beginning
            max_partition_fetch_bytes=PARTITION_FETCH,
            fetch_max_bytes=FETCH_MAX_BYTES,
            fetch_min_bytes=FETCH_MIN_BYTES,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        )
        await c.start()  # connected, cluster metadata known
        c.assign(tps)
        return c

    async def consume_async(c: Any, n: int) -> int:
        getmany = c.getmany
        total = 0
        deadline = time.monotonic() + TIMEOUT_S
        while total < n and not _deadline_passed(deadline, total, n):
            batch = await getmany(timeout_ms=POLL_TIMEOUT_MS, max_records=POLL_RECORDS)
            total += sum(map(len, batch.values()))
        return total

    async def positions(c: Any) -> dict[int, int]:
        return {tp.partition: await c.position(tp) for tp in tps}

    reader = Reader(
        open=lambda: loop.run_until_complete(start()),
        consume=lambda c, n: loop.run_until_complete(consume_async(c, n)),
        positions=lambda c: loop.run_until_complete(positions(c)),
        close=lambda c: loop.run_until_complete(c.stop()),
    )
    try:
        Rounds(topics, topic, benchmark, reader).run()
    finally:
        loop.close()


# ---------------------------------------------------------------------------------------------
# Large values: kcore poll, kcore poll_arrow, confluent-kafka consume and the floor, alternating
# round by round, each round in a process of its own (bench/_consume_child.py)

LARGE_VALUE_SIZES = (1024, 10 * 1024)
LARGE_BATCH_SIZES = (16 * 1024, 1_000_000)  # the writer's batch.size: Java's default, and 1 MB
LARGE_PARTITIONS = int(os.environ.get("KCORE_BENCH_CONSUME_LARGE_PARTITIONS", "8"))
# Value bytes in each large-value topic (MB of 10^6 bytes): N = this / the value size.
LARGE_MB = int(os.environ.get("KCORE_BENCH_CONSUME_LARGE_MB", "128"))
LARGE_ROUNDS = int(os.environ.get("KCORE_BENCH_CONSUME_LARGE_ROUNDS", "5"))
# Another tree's ``src`` (e.g. a worktree of an older commit, its compiled codec in place):
# its poll and poll_arrow get rounds too, in the same alternation.
BASELINE_SRC = os.environ.get("KCORE_BENCH_CONSUME_BASELINE_SRC", "").strip()
LARGE_VARIANTS = ("poll", "poll_arrow", "confluent", "floor", "fetch_floor")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_consume_child.py")
LARGE_PARAMS = [
    pytest.param(
        size,
        batch,
        marks=pytest.mark.benchmark(group=f"consume-large:{size}B@{batch}"),
        id=f"{size}B-batch{batch}",
    )
    for size in LARGE_VALUE_SIZES
    for batch in LARGE_BATCH_SIZES
]


def _child(spec: dict[str, Any], src: str | None) -> dict[str, Any]:
    """One round in a new process; ``src``: the kcore tree it imports (None: this one's)."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    done = subprocess.run(
        [sys.executable, CHILD, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if done.returncode != 0:
        raise AssertionError(f"{spec['variant']} round failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _large_table(
    title: str, n: int, mb: float, times: dict[str, list[dict[str, Any]]]
) -> tuple[str, dict[str, Any]]:
    """Medians of wall and CPU time (and of its kernel part), ratios to confluent-kafka (its
    median / the row's: above 1 the row is faster) and CPU against the two floors'."""
    med = {v: statistics.median(r["wall_s"] for r in rows) for v, rows in times.items()}
    cpu = {v: statistics.median(r["cpu_s"] for r in rows) for v, rows in times.items()}
    # (the floor reads memory only: no kernel time of its own)
    kernel = {
        v: statistics.median(r["sys_s"] for r in rows)
        for v, rows in times.items()
        if all("sys_s" in r for r in rows)
    }
    floor_cpu = cpu.get("floor")
    fetch_floor_cpu = cpu.get("fetch_floor")
    peer = med.get("confluent")
    lines = [
        f"\n{title} ({n:,} records, {mb:g} MB of values, {LARGE_PARTITIONS} partitions, "
        f"{len(next(iter(times.values())))} rounds a variant, alternating)",
        "| variant | median wall | MB/s | vs confluent | CPU s (in the kernel) | CPU ms/MB "
        "| CPU vs floor | CPU vs fetch floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for v in times:
        ratio = f"{peer / med[v]:.2f}x" if peer and v != "floor" else ""
        vs_floor = f"{cpu[v] / floor_cpu:.1f}x" if floor_cpu else ""
        vs_fetch = f"{cpu[v] / fetch_floor_cpu:.1f}x" if fetch_floor_cpu and v != "floor" else ""
        in_kernel = f" ({kernel[v]:.3f})" if v in kernel else ""
        lines.append(
            f"| {v} | {med[v] * 1000:.1f} ms | {mb / med[v]:,.0f} | {ratio} | "
            f"{cpu[v]:.3f}{in_kernel} | {cpu[v] / mb * 1000:.2f} | {vs_floor} | {vs_fetch} |"
        )
    summary = {"median_s": med, "cpu_s": cpu, "sys_s": kernel, "mb": mb, "records": n}
    return "\n".join(lines), summary


@pytest.mark.parametrize(("value_size", "batch_size"), LARGE_PARAMS)
def test_large_values(benchmark: Any, kafka_cluster: Any, value_size: int, batch_size: int) -> None:
    """N = KCORE_BENCH_CONSUME_LARGE_MB x 10^6 / value_size values written by kcore's
    ``send_batch`` (one call a partition, ``batch.size`` batch_size) into a topic of
    LARGE_PARTITIONS partitions, read back with the fetch settings of the rows above: kcore
    ``poll`` and ``poll_arrow`` (and a baseline tree's, if given), confluent-kafka ``consume``,
    the floor (one memcpy and one CRC32C of the N x value_size bytes) and the fetch floor (the
    same, fetched from the broker: bench/_consume_child.py), the variants taking turns round
    by round. kcore's variants check every value read once, untimed."""
    _need(confluent, "confluent-kafka")
    n = LARGE_MB * 1_000_000 // value_size
    bootstrap = kafka_cluster.bootstrap_servers
    values = _values(n, value_size)
    digest = hashlib.sha256(b"".join(sorted(values))).hexdigest()
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        broker = Broker(bootstrap, admin, None)
        try:
            name = _new_topic(broker, f"bench-consume-{value_size}b", LARGE_PARTITIONS)
            config = {
                "bootstrap.servers": bootstrap,
                "linger.ms": LINGER_MS,
                "batch.size": batch_size,
                "acks": "all",
            }
            with kcore.Producer(config) as producer:
                sent = [
                    producer.send_batch(name, values[p::LARGE_PARTITIONS], partition=p)
                    for p in range(LARGE_PARTITIONS)
                ]
                for result in sent:
                    result.result(TIMEOUT_S)
            ends = _end_offsets(broker, name, LARGE_PARTITIONS)
            assert sum(ends.values()) == n, ends
            del values
            base = {
                "bootstrap": bootstrap,
                "topic": name,
                "partitions": LARGE_PARTITIONS,
                "records": n,
                "value_size": value_size,
                "group": f"bench-consume-{broker.run}",
                "expected_sha": digest,
                "prime": n,  # a whole pass first: the rounds measure a warm consumer
                "fetch": {
                    "partition_fetch": PARTITION_FETCH,
                    "max_bytes": FETCH_MAX_BYTES,
                    "min_bytes": FETCH_MIN_BYTES,
                    "max_wait_ms": FETCH_MAX_WAIT_MS,
                    "poll_records": POLL_RECORDS,
                    "arrow_records": ARROW_RECORDS,
                },
            }
            variants: list[tuple[str, str, str | None]] = [(v, v, None) for v in LARGE_VARIANTS]
            if BASELINE_SRC:
                variants += [(f"baseline {v}", v, BASELINE_SRC) for v in ("poll", "poll_arrow")]
            times: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in variants}
            checked: set[str] = set()

            def rounds() -> None:
                for _ in range(LARGE_ROUNDS):
                    for label, variant, src in variants:
                        check = variant in ("poll", "poll_arrow") and label not in checked
                        got = _child({**base, "variant": variant, "check": check}, src)
                        checked.add(label)
                        assert got["records"] == n, (label, got)
                        if "positions" in got:
                            positions = {int(p): o for p, o in got["positions"].items()}
                            assert positions == ends, (label, positions, ends)
                        times[label].append(got)

            benchmark.pedantic(rounds, rounds=1, iterations=1)
        finally:
            broker.delete_all()
    table, summary = _large_table(
        f"{value_size} B values, written at batch.size {batch_size:,}",
        n,
        n * value_size / 1e6,
        times,
    )
    print(table)
    benchmark.extra_info.update(table=table, **summary, batch_size=batch_size)
