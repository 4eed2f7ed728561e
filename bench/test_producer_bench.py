"""kcore's producer against its peers (confluent-kafka, kafka-python, aiokafka), measured in the
same run against the same real broker.

Every round produces N records (``KCORE_BENCH_PRODUCE_N``, default 300,000) of 100-byte
JSON-like values (lz4 shrinks a batch of them ~2.6x), no keys, into a fresh 6-partition topic
of one Kafka node (the ``kafka_cluster`` fixture of kcore's pytest plugin, or
``KCORE_BOOTSTRAP``), with ``acks=all`` and idempotence on, and waits until the broker has
acknowledged all of them. Groups (``produce:<codec>``, for compression ``none`` and ``lz4``),
so bench/report.py's ratios compare like with like:

* kcore ``Producer.send`` per record, then ``flush()``;
* kcore ``Producer.send_batch`` from a list and from a pyarrow binary array, then ``result()``
  (and, in ``none`` only, a diagnostic row: from a list with a ``buffer.memory`` of 128 MiB);
* confluent-kafka ``Producer.produce`` per record (``poll`` while ``BufferError``), ``flush()``;
* kafka-python ``KafkaProducer.send`` per record, then ``flush()``;
* aiokafka ``AIOKafkaProducer.send`` per record (its futures collected), then ``flush()``.

Group ``produce-async:none``, the asyncio cell: ``KCORE_BENCH_ASYNC_N`` (default 100,000) of the
same values, ``await send`` per record then ``asyncio.gather`` of the futures, for kcore's
AsyncProducer, aiokafka and confluent-kafka's ``confluent_kafka.aio.AIOProducer`` (if
importable), and kcore's ``await send_batch``; the clients take turns, ``KCORE_BENCH_ASYNC_CYCLES``
times (``test_async_send_gather``).

Every client gets the same batching: ``linger.ms`` 5, ``batch.size`` 1,000,000 bytes (the
largest batch a default broker takes is 1,048,588), 32 MiB of send buffer where the client has
such a limit (see BATCHING and the clients' factories below). Each producer is created,
connected and primed outside the timed part, once per benchmark; each round gets its own new
topic (created, and its partitions' logs ready on the broker, before it; checked after it,
outside the timed part; deleted after it on kcore.testing's cluster, else at the end of the
module), so a round also pays for one metadata fetch of the new topic, as a producer's first
send to a topic does. A floor row (pre-encoded requests, no client) bounds what any client can
reach on the broker.

Besides wall time, each round records the process CPU time (``time.process_time``: the calling
thread and every thread of the client, e.g. librdkafka's or kcore's network thread), the
broker's CPU time (a separate process, when kcore.testing runs it) and the growth of the peak
RSS over the round (``VmHWM`` reset through ``/proc/self/clear_refs`` before each round).

Correctness, outside the timed part: after each round the new topic's end offsets must sum to N
(``kcore.AdminClient.list_offsets``); kafka-python's and aiokafka's futures must hold no error,
kcore's ``send_batch`` result must count N records, confluent-kafka's ``flush`` must leave none.

Run: ``pytest bench/test_producer_bench.py --benchmark-json=out.json && python bench/report.py
out.json`` (see docs/benchmarks-producer.md).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _workload import SEED, VALUE_ALPHABET

import kcore
from kcore.admin import NewTopic

pytestmark = [pytest.mark.broker, pytest.mark.slow]

N = int(os.environ.get("KCORE_BENCH_PRODUCE_N", "300000"))
# Rounds per benchmark: ROUNDS, fewer (down to MIN_ROUNDS) for a client whose rounds would
# take longer than ROUND_BUDGET_S together, and one for a client slower than SLOW_ROUND_S a
# round (kafka-python: ~12 s); each estimated from the client's priming.
ROUNDS = int(os.environ.get("KCORE_BENCH_PRODUCE_ROUNDS", "5"))
MIN_ROUNDS = min(3, ROUNDS)
ROUND_BUDGET_S = float(os.environ.get("KCORE_BENCH_PRODUCE_BUDGET_S", "10"))
SLOW_ROUND_S = 8.0
VALUE_SIZE = 100
PARTITIONS = 6
CODECS = ("none", "lz4")
LINGER_MS = 5
BATCH_SIZE = 1_000_000
BUFFER_MEMORY = 32 * 1024 * 1024
BIG_BUFFER = 128 * 1024 * 1024  # more than N records take in batches (a diagnostic row)
MEMORY_BUFFERS = (8 * 1024 * 1024, BUFFER_MEMORY)  # the send loop's peak RSS, against these
PRIME_RECORDS = 20_000  # twice per producer, before its first round: connections, JIT, ...
TIMEOUT_S = 120.0
WARM_UP_S = 6.0  # the broker's produce path, before the first benchmark
SETTLE_S = 2.0
SETTLE_ROUNDS_MAX = 12  # rounds per codec at most, until the broker's CPU a round stops falling

BATCHING = {  # what report.py prints about the run
    "records": f"{N:,} values of {VALUE_SIZE} B, no keys",
    "topic": f"fresh per round, {PARTITIONS} partitions, RF 1",
    "acks": "all",
    "idempotence": "on",
    "linger.ms": LINGER_MS,
    "batch.size": f"{BATCH_SIZE:,} B",
    "send buffer": f"{BUFFER_MEMORY >> 20} MiB (kcore, librdkafka; kafka-python, aiokafka: none)",
}


def _optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


confluent = _optional("confluent_kafka")
kafka = _optional("kafka")
aiokafka = _optional("aiokafka")


def _group(codec: str) -> pytest.MarkDecorator:
    return pytest.mark.benchmark(group=f"produce:{codec}")


def _info(
    benchmark: Any,
    key: str,
    label: str,
    *,
    impl: str,
    items: int | None = None,
    unit: str = "records",
    **extra: Any,
) -> None:
    """What report.py needs (as in test_codec_bench.py): a stable ``key`` (goals refer to it), a
    label, who implements it (``kcore`` rows get ratios against every other row of the group),
    and the work done per call (``items`` of ``unit``; ``payload_bytes`` for MB/s)."""
    benchmark.extra_info.update(key=key, label=label, impl=impl, items=items, unit=unit, **extra)


def _need(module: Any, what: str) -> None:
    if module is None:
        pytest.skip(f"{what} is not installed")


# ---------------------------------------------------------------------------------------------
# Data, broker and per-round bookkeeping (all outside the timed part)


# JSON-like values: a fixed 100-byte template whose 28 ``#`` are drawn per record from 32
# symbols, so a batch compresses with lz4 too (~2.6x), as records of one schema do.
VALUE_TEMPLATE = (
    b'{"id":"################","user":"user-#####","event":"page_view","region":"eu-west-1",'
    b'"v":"#######"}'
)
assert len(VALUE_TEMPLATE) == VALUE_SIZE


def make_values(n: int, seed: int = SEED + 2) -> list[bytes]:
    """``n`` values from VALUE_TEMPLATE and a fixed seed (the memory child calls this too)."""
    rng = np.random.default_rng(seed)
    template = np.frombuffer(VALUE_TEMPLATE, dtype=np.uint8)
    holes = np.flatnonzero(template == ord("#"))
    alphabet = np.frombuffer(VALUE_ALPHABET, dtype=np.uint8)
    rows = np.tile(template, (n, 1))
    rows[:, holes] = alphabet[rng.integers(0, len(alphabet), size=(n, len(holes)))]
    return [bytes(row) for row in rows]


@dataclass(frozen=True)
class Values:
    """The N values, as a list and as a pyarrow binary array."""

    list: list[bytes]
    arrow: pa.Array


@pytest.fixture(scope="module")
def values() -> Values:
    as_list = make_values(N)
    arrow = pa.array(as_list, pa.binary())
    assert arrow.to_pylist() == as_list and {len(v) for v in as_list} == {VALUE_SIZE}
    return Values(as_list, arrow)


def wait_until_removed(data_dir: Path, topics: list[str]) -> None:
    """Until the broker's log dir ``data_dir`` holds no partition directory of ``topics``
    (deleted ones included), for at most 10 s (then the round goes on, slowed)."""
    deadline = time.monotonic() + 10
    names = "|".join(re.escape(t) for t in topics)
    pattern = re.compile(f"(?:{names})" + r"-\d+(\..*-delete)?$")
    while any(pattern.match(entry) for entry in os.listdir(data_dir)):
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)


@dataclass
class Broker:
    bootstrap: str
    admin: kcore.AdminClient
    pid: int | None  # the broker JVM, when kcore.testing runs it (for its CPU time)
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    count: int = 0
    created: list[str] = field(default_factory=list)
    delete_each: bool = False
    data_dir: Path | None = None  # the broker's log dir, when kcore.testing runs it

    def new_topic(self, prefix: str = "bench-produce") -> str:
        self.count += 1
        name = f"{prefix}-{self.run}-{self.count:03d}"
        self.admin.create_topics([NewTopic(name, PARTITIONS, 1)], timeout=30)
        self.created.append(name)
        described = self.admin.describe_topics([name], timeout=30)
        assert len(described[name].partitions) == PARTITIONS
        # Metadata names a new partition's leader before that broker has made its log, and a
        # Produce in between is answered NOT_LEADER_OR_FOLLOWER and retried after
        # retry.backoff.ms (100 ms in every client here): up to three batches of a kcore round
        # were, adding 40-130 ms at random. ListOffsets (the admin client retries it) answers
        # once the logs are there: the rounds time writing, not the topic's creation.
        self.end_offsets(name)
        return name

    def own_cluster(self) -> None:
        """On the cluster kcore.testing started for this run (bench/conftest.py starts it so
        that deleted topics' files go within 0.2 s), each round's topic is deleted right after
        it. Kept, the rounds' logs (~3 GB at 1,000,000 records a round) became dirty pages the
        kernel wrote back during later rounds, and the broker's CPU for the same records
        doubled in whichever rounds that landed."""
        self.delete_each = True

    def delete(self, topic: str) -> None:
        """A round's topic, once checked: deleted now on our own cluster, else at the end."""
        if self.delete_each and topic in self.created:
            self.admin.delete_topics([topic], timeout=60)
            self.created.remove(topic)
            self._wait_until_removed(topic)

    def _wait_until_removed(self, topic: str) -> None:
        """Until the broker has removed the topic's files (log.segment.delete.delay.ms after
        the deletion, ~0.3 s in all): the next round's setup took ~0.27 s, so the unlinking
        of the last round's ~120 MB of logs, and the freeing of their page cache, landed in
        the first 40-70 ms of every timed round."""
        if self.data_dir is not None:
            wait_until_removed(self.data_dir, [topic])

    def delete_all(self) -> None:
        """Every topic this module made, deleted at its end: a broker removes a deleted
        topic's files a minute later (``file.delete.delay.ms``), which would otherwise land
        in some later benchmark's rounds (~2 GB of logs for the whole module)."""
        if self.created:
            self.admin.delete_topics(self.created, timeout=60)
            self.created.clear()

    def end_offsets(self, topic: str) -> dict[int, int]:
        got = self.admin.list_offsets({(topic, p): "latest" for p in range(PARTITIONS)})
        return {tp.partition: r.offset for tp, r in got.items()}

    def cpu_s(self) -> float | None:
        if self.pid is None:
            return None
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.fixture(scope="module")
def broker(kafka_cluster: Any, values: Values) -> Iterator[Broker]:
    """The broker, warmed up: a fresh JVM is slower for its first seconds (JIT), which would
    land on whichever client runs first. kcore writes records (both codecs) for WARM_UP_S, then
    a round's worth of records twice per codec (the broker's lz4 path took one to two rounds of
    1,000,000 records to settle: its CPU for one went from ~0.9 s to ~0.3 s), then rounds of
    N until the broker's CPU a round stops falling (``_settle_broker``), then the broker idles
    for SETTLE_S."""
    nodes = getattr(kafka_cluster, "nodes", [])
    process = getattr(nodes[0], "process", None) if len(nodes) == 1 else None
    with kcore.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as admin:
        b = Broker(kafka_cluster.bootstrap_servers, admin, process.pid if process else None)
        if process is not None:
            b.own_cluster()
            b.data_dir = Path(nodes[0].data_dir)
        warm = b.new_topic("bench-produce-warm-up")
        chunk = values.list[: min(N, 50_000)]
        deadline = time.monotonic() + WARM_UP_S
        for codec in CODECS * 1000:
            with kcore.Producer(_kcore_config(b, codec)) as producer:
                producer.send_batch(warm, chunk).result(TIMEOUT_S)
                for v in chunk[:10_000]:
                    producer.send(warm, v)
                producer.flush(TIMEOUT_S)
            if time.monotonic() > deadline:
                break
        for codec in CODECS:
            with kcore.Producer(_kcore_config(b, codec)) as producer:
                for _ in range(2):
                    producer.send_batch(warm, values.list).result(TIMEOUT_S)
        b.delete(warm)
        _settle_broker(b, values)
        os.sync()  # the warm-up's ~1 GB of logs written back now, not during the first rows
        time.sleep(SETTLE_S)
        try:
            yield b
        finally:
            b.delete_all()


def _settle_broker(b: Broker, values: Values) -> None:
    """Rounds of N records (each codec, each into a fresh topic, as the benchmarks write)
    until the broker's CPU for a round stops falling: for 5-10 more rounds after the warm-up
    above, its CPU for the same 1,000,000 records went on dropping, from ~0.3 s to ~0.17 s
    (its JIT), and the benchmarks that ran first (kcore's, by file order) paid for that."""
    if b.pid is None:
        return  # no broker CPU to watch (KCORE_BOOTSTRAP): the warm-up above is all
    last: dict[str, float] = {}
    for _ in range(SETTLE_ROUNDS_MAX):
        settled = True
        for codec in CODECS:
            with kcore.Producer(_kcore_config(b, codec)) as producer:
                topic = b.new_topic("bench-produce-settle")
                os.sync()
                cpu0 = b.cpu_s() or 0.0
                producer.send_batch(topic, values.list).result(TIMEOUT_S)
                cpu = (b.cpu_s() or 0.0) - cpu0
                b.delete(topic)
            if codec not in last or cpu < 0.9 * last[codec]:
                settled = False
            last[codec] = min(cpu, last.get(codec, cpu))
        if settled:
            return


def _rss_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field_name} in /proc/self/status")


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


@dataclass
class RoundMeters:
    """What a round measures besides pytest-benchmark's wall time: the client's CPU time (every
    thread of this process), the broker's CPU time and the growth of the peak RSS. ``start``
    in a round's setup, ``timed`` around its timed part, ``stop`` in its teardown (the
    consumer benchmark's rounds use it too)."""

    broker: Broker
    cpu: list[float] = field(default_factory=list)
    broker_cpu: list[float] = field(default_factory=list)
    rss_growth: list[int] = field(default_factory=list)
    _rss0: int = 0
    _broker0: float | None = None
    _peak_ok: bool = False

    def start(self) -> None:
        self._peak_ok = _reset_peak_rss()
        self._rss0 = _rss_kib("VmRSS")
        self._broker0 = self.broker.cpu_s()

    def timed(self, part: Callable[..., Any], *args: Any) -> Any:
        cpu0 = time.process_time()
        result = part(*args)
        self.cpu.append(time.process_time() - cpu0)
        return result

    def stop(self) -> None:
        broker1 = self.broker.cpu_s()
        if self._broker0 is not None and broker1 is not None:
            self.broker_cpu.append(broker1 - self._broker0)
        if self._peak_ok:
            self.rss_growth.append((_rss_kib("VmHWM") - self._rss0) * 1024)

    def extra_info(self) -> dict[str, Any]:
        median = statistics.median
        return dict(
            cpu_s=median(self.cpu) if self.cpu else None,
            cpu_s_rounds=self.cpu,
            broker_cpu_s=median(self.broker_cpu) if self.broker_cpu else None,
            rss_growth_bytes=max(self.rss_growth) if self.rss_growth else None,
            rss_growth_rounds=self.rss_growth,
        )


@dataclass
class Rounds:
    """pytest-benchmark's ``setup``/``teardown`` for one benchmark: a fresh topic per round,
    whose end offsets are checked afterwards, measured by RoundMeters."""

    broker: Broker
    benchmark: Any
    check: Callable[[], None] = lambda: None  # the client's own check of its last round
    records: int = N  # what a round writes
    pending: str | None = None
    meters: RoundMeters = field(init=False)

    def __post_init__(self) -> None:
        self.meters = RoundMeters(self.broker)

    def setup(self) -> tuple[tuple[str], dict[str, Any]]:
        self.finish()  # pytest-benchmark --benchmark-disable calls no teardown
        topic = self.pending = self.broker.new_topic()
        # Earlier rounds' log data is still dirty in the page cache, and the kernel writes it
        # back 30 s later (dirty_expire_centisecs), i.e. during some later round, whichever
        # client that is: the first rows after the warm-up measured up to 2x the broker CPU
        # of the later ones for the same records. Written back here, untimed, every round
        # starts alike.
        os.sync()
        self.prepare(topic)
        self.meters.start()
        return (topic,), {}

    def prepare(self, topic: str) -> None:
        """Untimed work of a round before its meters start (none here)."""

    def timed(self, produce: Callable[[str], None]) -> Callable[[str], None]:
        def run(topic: str) -> None:
            self.meters.timed(produce, topic)

        return run

    def teardown(self, topic: str) -> None:
        self.meters.stop()
        self.finish()

    def finish(self) -> None:
        topic, self.pending = self.pending, None
        if topic is None:
            return
        self.check()
        offsets = self.broker.end_offsets(topic)
        n = self.records
        assert sum(offsets.values()) == n, f"{topic}: end offsets {offsets}, want {n} in all"
        self.broker.delete(topic)

    def run(
        self,
        prime: Callable[[str], None],
        produce: Callable[[str], None],
        *,
        goal_peer: bool = False,
    ) -> None:
        """``prime`` writes PRIME_RECORDS to a topic of its own, twice, untimed (connections,
        producer id, warm code paths: a long-lived producer's state); how long the second took
        sets the number of rounds. Then the timed rounds of ``produce``, each into a fresh
        topic. ``goal_peer``: the client the goals compare against always gets MIN_ROUNDS (its
        median sets every ratio; a small priming can overestimate it, e.g. librdkafka's)."""
        topic = self.broker.new_topic("bench-produce-prime")
        prime(topic)
        t0 = time.perf_counter()
        prime(topic)
        estimate = (time.perf_counter() - t0) * self.records / PRIME_RECORDS
        self.broker.delete(topic)
        rounds = max(MIN_ROUNDS, min(ROUNDS, int(ROUND_BUDGET_S / estimate)))
        if estimate > SLOW_ROUND_S and not goal_peer:
            rounds = 1
        try:
            self.benchmark.pedantic(
                self.timed(produce),
                setup=self.setup,
                teardown=self.teardown,
                rounds=rounds,
                iterations=1,
            )
        except BaseException:
            self.pending = None  # the round's own error, not a check's of a half-made round
            raise
        self.finish()  # after pytest-benchmark --benchmark-disable's single call
        self.benchmark.extra_info.update(self.meters.extra_info())


def _bench_info(benchmark: Any, key: str, label: str, impl: str, codec: str, **extra: Any) -> None:
    _info(
        benchmark,
        key,
        label,
        impl=impl,
        items=N,
        payload_bytes=N * VALUE_SIZE,
        codec=codec,
        settings=BATCHING,
        **extra,
    )


# ---------------------------------------------------------------------------------------------
# The clients, with matched settings


def _kcore_config(broker: Broker, codec: str, **overrides: Any) -> dict[str, Any]:
    config = {
        "bootstrap.servers": broker.bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": LINGER_MS,
        "batch.size": BATCH_SIZE,
        "buffer.memory": BUFFER_MEMORY,
        "compression.type": codec,
    }
    config.update(overrides)
    return config


CODEC_PARAMS = [pytest.param(c, marks=_group(c), id=c) for c in CODECS]


@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_kcore_send(benchmark: Any, broker: Broker, values: Values, codec: str) -> None:
    _bench_info(benchmark, "kcore.send", "kcore Producer.send loop + flush", "kcore", codec)
    vs = values.list
    with kcore.Producer(_kcore_config(broker, codec)) as producer:

        def produce_to(topic: str, records: list[bytes]) -> None:
            send = producer.send
            for v in records:
                send(topic, v)
            producer.flush(TIMEOUT_S)

        Rounds(broker, benchmark).run(
            lambda topic: produce_to(topic, vs[:PRIME_RECORDS]), lambda topic: produce_to(topic, vs)
        )


def _send_batch(benchmark: Any, broker: Broker, column: Any, codec: str, **overrides: Any) -> None:
    results: list[Any] = []
    with kcore.Producer(_kcore_config(broker, codec, **overrides)) as producer:

        def prime(topic: str) -> None:
            producer.send_batch(topic, column[:PRIME_RECORDS]).result(TIMEOUT_S)

        def produce(topic: str) -> None:
            results.append(producer.send_batch(topic, column).result(TIMEOUT_S))

        def check() -> None:
            out = results.pop()
            assert sum(count for _, _, count in out) == N
            assert {p for p, _, _ in out} <= set(range(PARTITIONS))

        Rounds(broker, benchmark, check).run(prime, produce)


@pytest.mark.parametrize(
    "form", [pytest.param("list", id="list"), pytest.param("pyarrow", id="pyarrow")]
)
@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_kcore_send_batch(
    benchmark: Any, broker: Broker, values: Values, codec: str, form: str
) -> None:
    _bench_info(
        benchmark,
        f"kcore.send_batch.{form}",
        f"kcore Producer.send_batch({form}) + result",
        "kcore",
        codec,
    )
    _send_batch(benchmark, broker, values.list if form == "list" else values.arrow, codec)


@_group("none")
def test_kcore_send_batch_big_buffer(benchmark: Any, broker: Broker, values: Values) -> None:
    """A diagnostic row, not held to a goal: the same call with a buffer.memory that holds all
    N records at once, so it never waits for the sender to free memory (see the doc)."""
    _bench_info(
        benchmark,
        "kcore.send_batch.list.big_buffer",
        f"kcore Producer.send_batch(list) + result, buffer.memory {BIG_BUFFER >> 20} MiB",
        "kcore",
        "none",
        buffer_memory=BIG_BUFFER,
    )
    _send_batch(benchmark, broker, values.list, "none", **{"buffer.memory": BIG_BUFFER})


# The floor: what no client can beat on this broker


MAX_REQUEST_SIZE = 1_048_576  # Java's max.request.size default, which every client here keeps
MAX_IN_FLIGHT = 5  # max.in.flight.requests.per.connection with idempotence


class RawProduceFloor:
    """The least a client does to write the N records: nothing. Batches (idempotent, chunks of
    about ``batch.size`` of the same values, partitions in turn) and their Produce requests
    (up to ``max.request.size``) are all made before the timed part; the timed part writes the
    ready frames on one connection, five in flight, and reads the answers. What it takes is the
    broker's time (and the loopback's), so ``confluent-kafka / floor`` is the highest ratio any
    client could reach in that run."""

    def __init__(self, broker: Broker, codec: str) -> None:
        from _produce_floor import init_producer_id

        from kcore.network.blocking import BlockingBrokerConnection

        host, port = broker.bootstrap.split(",")[0].rsplit(":", 1)
        self.conn = BlockingBrokerConnection(host, int(port), timeout=TIMEOUT_S).open()
        self.codec = codec
        # Produce v13 names topics by id; v12 by name, which saves a metadata lookup here.
        self.version = self.conn.version_for(0, max_version=12)
        self.producer = init_producer_id(self.conn)
        self.frames: dict[str, list[tuple[int, bytearray]]] = {}

    def close(self) -> None:
        self.conn.close()

    def prepare(self, topic: str, values: Any) -> None:
        from kcore.codec import RecordBatchBuilder
        from kcore.protocol.messages import ProduceRequest
        from kcore.protocol.messages.produce_request import PartitionProduceData, TopicProduceData

        per_batch = max(1, BATCH_SIZE // (VALUE_SIZE + 8))  # 8: a record's varints and fields
        sequences = [0] * PARTITIONS
        now = int(time.time() * 1000)
        batches: list[tuple[int, bytes]] = []
        for number, start in enumerate(range(0, len(values), per_batch)):
            partition = number % PARTITIONS
            chunk = values[start : start + per_batch]
            builder = RecordBatchBuilder(
                self.codec,
                producer_id=self.producer[0],
                producer_epoch=self.producer[1],
                base_sequence=sequences[partition],
            )
            builder.append_many(None, chunk, now)
            sequences[partition] += len(chunk)
            batches.append((partition, builder.build()))
        frames = []
        while batches:
            size, parts = 0, []
            while batches and (not parts or size + len(batches[0][1]) <= MAX_REQUEST_SIZE):
                partition, records = batches.pop(0)
                size += len(records)
                parts.append(PartitionProduceData(index=partition, records=records))
            request = ProduceRequest(
                transactional_id=None,
                acks=-1,
                timeout_ms=30_000,
                topic_data=[TopicProduceData(name=topic, partition_data=parts)],
            )
            frames.append(self.conn.prepare(request, self.version))
        self.frames[topic] = frames

    def produce(self, topic: str) -> None:
        frames = self.frames.pop(topic)
        waiting: list[int] = []
        for correlation_id, frame in frames:
            if len(waiting) == MAX_IN_FLIGHT:
                self._check(waiting.pop(0))
            self.conn.send_prepared(frame)
            waiting.append(correlation_id)
        for correlation_id in waiting:
            self._check(correlation_id)

    def _check(self, correlation_id: int) -> None:
        response = self.conn.receive(correlation_id, TIMEOUT_S).body
        for t in response.responses:
            for p in t.partition_responses:
                assert p.error_code == 0, f"partition {p.index}: error {p.error_code}"


class FloorRounds(Rounds):
    """Rounds whose setup also makes the round's frames (untimed)."""

    floor: RawProduceFloor | None = None
    column: Any = None

    def prepare(self, topic: str) -> None:
        assert self.floor is not None
        self.floor.prepare(topic, self.column)


@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_floor_produce(benchmark: Any, broker: Broker, values: Values, codec: str) -> None:
    """Not a client: ready-made Produce requests written as fast as the broker takes them
    (RawProduceFloor). report.py holds the send_batch goal against it."""
    _bench_info(
        benchmark,
        "floor.produce",
        "pre-encoded Produce requests, one connection (floor)",
        "floor",
        codec,
    )
    floor = RawProduceFloor(broker, codec)
    try:
        rounds = FloorRounds(broker, benchmark)
        rounds.floor, rounds.column = floor, values.list

        def prime(topic: str) -> None:
            floor.prepare(topic, values.list[:PRIME_RECORDS])
            floor.produce(topic)

        rounds.run(prime, floor.produce)
    finally:
        floor.close()


@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_confluent_produce(benchmark: Any, broker: Broker, values: Values, codec: str) -> None:
    _need(confluent, "confluent-kafka")
    _bench_info(
        benchmark,
        "confluent.produce",
        "confluent-kafka Producer.produce loop + flush",
        "confluent-kafka",
        codec,
    )
    config = {
        "bootstrap.servers": broker.bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": LINGER_MS,
        "batch.size": BATCH_SIZE,
        # librdkafka's counterpart of buffer.memory; its message count limit stays at its
        # default (100,000), so produce() raises BufferError and the loop polls.
        "queue.buffering.max.kbytes": BUFFER_MEMORY // 1024,
        "compression.type": codec,
    }
    # No on_delivery callback: it would cost confluent-kafka a Python call per record, which
    # kcore's loop does not make either. A record that failed is missing from the end offsets.
    producer = confluent.Producer(config)
    vs = values.list

    def produce_to(topic: str, records: list[bytes]) -> None:
        p = producer.produce
        for v in records:
            while True:
                try:
                    p(topic, v)
                    break
                except BufferError:  # queue.buffering.max.messages: serve delivery reports
                    producer.poll(0.1)
        left = producer.flush(TIMEOUT_S)
        assert left == 0, f"{left} records undelivered after {TIMEOUT_S:g}s"

    Rounds(broker, benchmark).run(
        lambda topic: produce_to(topic, vs[:PRIME_RECORDS]),
        lambda topic: produce_to(topic, vs),
        goal_peer=True,
    )


@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_kafka_python_send(benchmark: Any, broker: Broker, values: Values, codec: str) -> None:
    _need(kafka, "kafka-python")
    _bench_info(
        benchmark,
        "kafka-python.send",
        "kafka-python KafkaProducer.send loop + flush",
        "kafka-python",
        codec,
    )
    producer = kafka.KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=LINGER_MS,
        batch_size=BATCH_SIZE,  # kafka-python 3 has no buffer_memory (no send buffer limit)
        compression_type=None if codec == "none" else codec,
    )
    vs = values.list
    futures: list[Any] = []

    def produce_to(topic: str, records: list[bytes]) -> None:
        send = producer.send
        futures.clear()
        futures.extend([send(topic, v) for v in records])
        producer.flush(TIMEOUT_S)

    def check() -> None:
        assert len(futures) == N
        failed = [f.exception for f in futures if not f.succeeded()]
        assert not failed, failed[:3]

    try:
        Rounds(broker, benchmark, check).run(
            lambda topic: produce_to(topic, vs[:PRIME_RECORDS]),
            lambda topic: produce_to(topic, vs),
        )
    finally:
        producer.close(TIMEOUT_S)


@pytest.mark.parametrize("codec", CODEC_PARAMS)
def test_aiokafka_send(benchmark: Any, broker: Broker, values: Values, codec: str) -> None:
    _need(aiokafka, "aiokafka")
    _bench_info(
        benchmark,
        "aiokafka.send",
        "aiokafka AIOKafkaProducer.send loop + flush",
        "aiokafka",
        codec,
    )
    vs = values.list
    futures: list[Any] = []
    loop = asyncio.new_event_loop()

    async def start() -> Any:  # aiokafka objects must be made inside the loop
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=LINGER_MS,
            max_batch_size=BATCH_SIZE,
            compression_type=None if codec == "none" else codec,
        )
        await producer.start()
        return producer

    producer = loop.run_until_complete(start())

    async def produce_async(topic: str, records: list[bytes]) -> None:
        send = producer.send
        futures.clear()
        futures.extend([await send(topic, v) for v in records])  # send() returns a future
        await producer.flush()

    def produce_to(topic: str, records: list[bytes]) -> None:
        loop.run_until_complete(produce_async(topic, records))

    def check() -> None:
        assert len(futures) == N
        failed = [f.exception() for f in futures if f.exception() is not None]
        assert not failed, failed[:3]

    try:
        Rounds(broker, benchmark, check).run(
            lambda topic: produce_to(topic, vs[:PRIME_RECORDS]),
            lambda topic: produce_to(topic, vs),
        )
    finally:
        loop.run_until_complete(producer.stop())
        loop.close()


# ---------------------------------------------------------------------------------------------
# asyncio: ``await send`` per record, then ``gather`` of the futures


def _async_group() -> pytest.MarkDecorator:
    return pytest.mark.benchmark(group="produce-async:none")


ASYNC_N = int(os.environ.get("KCORE_BENCH_ASYNC_N", "100000"))
# Each client's benchmark runs this many times, the clients taking turns (kcore, aiokafka,
# confluent-kafka's asyncio producer, kcore's send_batch, then again): the machine's drift
# lands on all of them alike. Compare the medians over the cycles.
ASYNC_CYCLES = int(os.environ.get("KCORE_BENCH_ASYNC_CYCLES", "3"))
ASYNC_CLIENTS = ("kcore", "aiokafka", "confluent-aio", "kcore-batch")


def _async_values(values: Values) -> list[bytes]:
    return values.list[:ASYNC_N] if N >= ASYNC_N else make_values(ASYNC_N)


def _async_run(
    benchmark: Any,
    broker: Broker,
    loop: asyncio.AbstractEventLoop,
    produce: Callable[[str, list[bytes]], Any],
    records: list[bytes],
    close: Callable[[], Any],
) -> None:
    """Rounds of ``produce(topic, records)`` (a coroutine function) on ``loop``; then the
    producer's ``close()`` (a coroutine function) on it, and the loop closed."""

    def produce_to(topic: str, vs: list[bytes]) -> None:
        loop.run_until_complete(produce(topic, vs))

    try:
        Rounds(broker, benchmark, records=len(records)).run(
            lambda topic: produce_to(topic, records[:PRIME_RECORDS]),
            lambda topic: produce_to(topic, records),
        )
    finally:
        loop.run_until_complete(close())
        loop.close()


def _async_check(metadata: list[Any], n: int) -> None:
    assert len(metadata) == n and all(m is not None for m in metadata[:: max(1, n // 100)])


def _gathered(send: Callable[[str, bytes], Any]) -> Callable[[str, list[bytes]], Any]:
    """``await send(topic, value)`` for each value (each returns its delivery future), then
    the futures gathered: the way every client's asyncio API is measured here."""

    async def send_each(topic: str, vs: list[bytes]) -> None:
        futures = [await send(topic, v) for v in vs]
        _async_check(await asyncio.gather(*futures), len(vs))

    return send_each


def _kcore_async(benchmark: Any, broker: Broker, records: list[bytes], batch: bool) -> None:
    loop = asyncio.new_event_loop()
    producer = loop.run_until_complete(kcore.AsyncProducer(_kcore_config(broker, "none")).start())

    async def send_batch(topic: str, vs: list[bytes]) -> None:
        parts = await (await producer.send_batch(topic, vs))
        assert sum(count for _, _, count in parts) == len(vs)

    produce = send_batch if batch else _gathered(producer.send)
    _async_run(benchmark, broker, loop, produce, records, lambda: producer.close(TIMEOUT_S))


def _aiokafka_async(benchmark: Any, broker: Broker, records: list[bytes]) -> None:
    _need(aiokafka, "aiokafka")
    loop = asyncio.new_event_loop()

    async def start() -> Any:  # aiokafka objects must be made inside the loop
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=LINGER_MS,
            max_batch_size=BATCH_SIZE,
        )
        await producer.start()
        return producer

    producer = loop.run_until_complete(start())

    # send() returns a future
    _async_run(benchmark, broker, loop, _gathered(producer.send), records, producer.stop)


def _confluent_async(benchmark: Any, broker: Broker, records: list[bytes]) -> None:
    aio = _optional("confluent_kafka.aio")
    _need(aio, "confluent_kafka.aio")
    loop = asyncio.new_event_loop()
    config = {
        "bootstrap.servers": broker.bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": LINGER_MS,
        "batch.size": BATCH_SIZE,
        "queue.buffering.max.kbytes": BUFFER_MEMORY // 1024,
    }

    async def start() -> Any:  # AIOProducer takes the running loop
        # Its own buffer hands records to librdkafka 1,000 at a time (its default; N is a
        # multiple, so no round waits for its 1 s buffer timeout).
        return aio.AIOProducer(config)

    producer = loop.run_until_complete(start())

    # produce() returns a future
    _async_run(benchmark, broker, loop, _gathered(producer.produce), records, producer.close)


ASYNC_LABELS = {
    "kcore": ("kcore.async.send", "kcore AsyncProducer await send + gather", "kcore"),
    "aiokafka": ("aiokafka.async.send", "aiokafka await send + gather", "aiokafka"),
    "confluent-aio": (
        "confluent.aio.produce",
        "confluent_kafka.aio AIOProducer await produce + gather",
        "confluent-kafka",
    ),
    "kcore-batch": (
        "kcore.async.send_batch",
        "kcore AsyncProducer await send_batch(list)",
        "kcore",
    ),
}


@_async_group()
@pytest.mark.parametrize(
    ("cycle", "client"),
    [(c, client) for c in range(ASYNC_CYCLES) for client in ASYNC_CLIENTS],
    ids=[f"{client}-{c}" for c in range(ASYNC_CYCLES) for client in ASYNC_CLIENTS],
)
def test_async_send_gather(
    benchmark: Any, broker: Broker, values: Values, cycle: int, client: str
) -> None:
    """``ASYNC_N`` records of 100 B on an asyncio loop: ``await send`` each, then ``gather``
    the futures (send_batch: one call, then await its result). Same settings as the rest of
    the module, no compression."""
    key, label, impl = ASYNC_LABELS[client]
    _info(
        benchmark,
        key,
        label,
        impl=impl,
        items=ASYNC_N,
        payload_bytes=ASYNC_N * VALUE_SIZE,
        codec="none",
        settings=BATCHING | {"records": f"{ASYNC_N:,} values of {VALUE_SIZE} B, no keys"},
        cycle=cycle,
    )
    records = _async_values(values)
    if client == "aiokafka":
        _aiokafka_async(benchmark, broker, records)
    elif client == "confluent-aio":
        _confluent_async(benchmark, broker, records)
    else:
        _kcore_async(benchmark, broker, records, batch=client == "kcore-batch")


# ---------------------------------------------------------------------------------------------
# Peak RSS of a send loop against buffer.memory, in a fresh interpreter


MEMORY_CHILD = r"""
import gc, json, sys, time

bench_dir, bootstrap, topic, n, prime, buffer_memory, batch_size = json.loads(sys.argv[1])
sys.path.insert(0, bench_dir)
from test_producer_bench import make_values  # noqa: E402

import kcore  # noqa: E402


def status(name):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024


values = make_values(n)
config = {
    "bootstrap.servers": bootstrap,
    "linger.ms": 5,
    "batch.size": batch_size,
    "buffer.memory": buffer_memory,
}
with kcore.Producer(config) as producer:
    for v in values[:prime]:
        producer.send(topic, v)
    producer.flush(120)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    t0, cpu0 = time.perf_counter(), time.process_time()
    for v in values:
        producer.send(topic, v)
    producer.flush(120)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    peak = status("VmHWM")
result = {"rss_before": before, "rss_growth": peak - before, "seconds": seconds, "cpu": cpu}
print(json.dumps(result))
"""


def _send_loop_memory(broker: Broker, buffer_memory: int) -> dict[str, Any]:
    """A kcore send loop of N records in a child process (whose heap nothing else has grown):
    how far its peak RSS rises above its RSS before the loop, with the values already built
    and the producer primed. Not timed by pytest-benchmark; reported next to the table."""
    if not _reset_peak_rss():
        return {"buffer_memory": buffer_memory, "error": "no /proc/self/clear_refs"}
    topic = broker.new_topic("bench-produce-memory")
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    args = [bench_dir, broker.bootstrap, topic, N, PRIME_RECORDS, buffer_memory, BATCH_SIZE]
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    offsets = broker.end_offsets(topic)
    assert sum(offsets.values()) == N + PRIME_RECORDS, offsets
    return {"buffer_memory": buffer_memory, **json.loads(out.stdout.strip().splitlines()[-1])}


@pytest.mark.benchmark(group="memory:produce")
def test_kcore_send_loop_memory(benchmark: Any, broker: Broker) -> None:
    """The send loop's peak RSS against buffer.memory, each in a fresh process (report.py's
    last table). A group of its own, defined last, so it runs after every timed group: its
    children write 2 x N records, and when it ran inside the uncompressed group the row timed
    right after it (``send_batch(list)``) came out slower than beside the other rows (runs
    E1-E5 against F1-F3 in docs/benchmarks-producer.md)."""
    _bench_info(benchmark, "kcore.send.memory", "kcore send loop, peak RSS", "kcore", "none")
    benchmark.extra_info["memory"] = [
        _send_loop_memory(broker, buffer_memory) for buffer_memory in MEMORY_BUFFERS
    ]
    # (pytest-benchmark keeps extra_info only for a benchmark that ran)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
