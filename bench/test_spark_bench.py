"""kcore's Spark data source (``format("kcore")``) against Spark's JVM Kafka connector
(``format("kafka")``, spark-sql-kafka-0-10), measured in the same run, in the same Spark
session, against the same real broker.

One ``local[2]`` SparkSession (the connector's jars on ``spark.jars``, fetched once with Maven
by ``kcore.testing.spark_jars``; kcore registered with ``kcore.spark.register``) and one Kafka
node (the ``kafka_cluster`` fixture of kcore's pytest plugin, or ``KCORE_BOOTSTRAP``). Before
the benchmarks, untimed, kcore's ``Producer.send_batch`` writes ROWS records
(``KCORE_BENCH_SPARK_ROWS``, default 5,000,000) with 16-byte keys and 100-byte values into an
8-partition topic, ROWS / 8 a partition. Groups (``spark:<what>``), each format back to back:

* ``spark:read``: ``spark.read.format(f)`` of the whole topic into Spark's ``noop`` sink
  (``df.write.format("noop").mode("overwrite").save()``: every row and column is produced,
  nothing is kept);
* ``spark:write``: ``df.write.format(f).mode("append")`` of ROWS generated rows (16-byte
  binary keys, 100-byte binary values, from ``spark.range`` in 8 partitions) into a fresh
  8-partition topic each round (created in the round's setup, untimed), with
  ``kafka.linger.ms`` 5 for both and the rest each sink's defaults (acks all, idempotence on;
  ``batch.size`` 262144 in kcore's sink, Java's 16384 in the JVM's), two diagnostic rows
  with the batch sizes swapped, and the floor: the same job into a Python data source that
  drops the Arrow batches it is handed (bench/_spark_floor.py), so Spark's making of the rows
  and their way to a Python worker with no Kafka client at all; and the wire floor at each
  sink's batch size: a Python data source that only encodes each Arrow batch's records with
  kcore's compiled encoder and writes them as Produce requests on one blocking connection
  (bench/_spark_floor.py), the least a Python sink does to get the rows into Kafka;
* ``spark:stream``: ``spark.readStream.format(f)`` of the whole topic from ``earliest``,
  ``Trigger.AvailableNow``, ``maxOffsetsPerTrigger`` ROWS / 5 (5 micro-batches), into the
  ``noop`` sink, with a fresh checkpoint directory each round; and its floor: the same query
  on a Python streaming source that plans the same micro-batches and yields Arrow batches of
  Kafka's schema from memory (bench/_spark_floor.py), so what Spark costs any Python stream.

Each benchmark runs one untimed warm-up round (the JVM's JIT, the Python workers and kcore's
cached clients) and ROUNDS timed rounds (``KCORE_BENCH_SPARK_ROUNDS``, default 3); before the
first write benchmark both formats and the wire floor write the job twice, untimed, for the
broker's JIT (else the first write benchmark paid for it), and before every write round the
topics written so far are deleted and the page cache's dirty data written back (else its
writeback landed in later rounds). Besides the wall time, a round records the CPU time
of Spark's process tree (the JVM and its Python workers, separately) and of the broker.

Correctness, outside the timed part: both formats' batch reads are run once more with an
aggregate (per partition: row count, sums of offsets and of Spark's ``hash(key, value)``),
which must be equal to each other, count ROWS / 8 a partition and have offsets 0..n-1; each
write round's topic must hold ROWS records (end offsets), and each streaming round's
micro-batches must sum to ROWS input rows.

Run: ``pytest bench/test_spark_bench.py --benchmark-json=out.json && python bench/report.py
out.json`` (see docs/benchmarks-spark.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_producer_bench import wait_until_removed

import kcore
import kcore.spark
from kcore.admin import NewTopic
from kcore.testing.spark_jars import spark_kafka_jars

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROWS = int(os.environ.get("KCORE_BENCH_SPARK_ROWS", "5000000"))
ROUNDS = int(os.environ.get("KCORE_BENCH_SPARK_ROUNDS", "3"))
PARTITIONS = 8
KEY_SIZE = 16
VALUE_SIZE = 100
STREAM_BATCH = max(1, ROWS // 5)  # maxOffsetsPerTrigger: 5 micro-batches
LINGER_MS = 5
SEND_CHUNK = 100_000  # records per send_batch call while writing the source topic
TIMEOUT_S = 600.0
SEED = 0x6B636F7265

FLOOR_FORMAT = "kcore-bench-floor"  # bench/_spark_floor.py's data sources
WIRE_FLOOR_FORMAT = "kcore-bench-wire"
FORMATS = {  # format name -> (impl shown by report.py, label prefix)
    "kcore": ("kcore", "kcore"),
    "kafka": ("spark-sql-kafka", "JVM spark-sql-kafka-0-10"),
}


def _group(what: str) -> pytest.MarkDecorator:
    return pytest.mark.benchmark(group=f"spark:{what}")


# ---------------------------------------------------------------------------------------------
# The process tree's CPU time (the JVM, its Python workers) and the broker's


def _ticks(pid: int) -> tuple[int, int, int]:
    """(utime + stime, cutime + cstime, ppid) of ``pid``, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]), int(fields[1])


def _tree_cpu(root: int) -> tuple[float, float]:
    """CPU seconds of ``root`` itself, and of all its descendants with what the tree reaped (a
    Python worker that exited is counted in its parent: the pyspark daemon, or the JVM for the
    process that plans a Python streaming source)."""
    parents: dict[int, int] = {}
    times: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            own, reaped, ppid = _ticks(int(entry))
        except (OSError, IndexError, ValueError):
            continue
        parents[int(entry)] = ppid
        times[int(entry)] = (own, reaped)
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    hz = os.sysconf("SC_CLK_TCK")
    own, reaped = times.get(root, (0, 0))
    rest = reaped + sum(sum(times[p]) for p in tree if p != root and p in times)
    return own / hz, rest / hz


@dataclass
class Meters:
    jvm_pid: int
    broker_pid: int | None
    rounds: list[dict[str, float]] = field(default_factory=list)
    _start: tuple[float, float, float | None] | None = None

    def _now(self) -> tuple[float, float, float | None]:
        jvm, python = _tree_cpu(self.jvm_pid)
        broker = None
        if self.broker_pid is not None:
            own, _, _ = _ticks(self.broker_pid)
            broker = own / os.sysconf("SC_CLK_TCK")
        return jvm, python, broker

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> None:
        if self._start is None:
            return
        (j0, p0, b0), (j1, p1, b1) = self._start, self._now()
        self._start = None
        row = {"jvm_cpu_s": j1 - j0, "python_cpu_s": max(0.0, p1 - p0)}
        if b0 is not None and b1 is not None:
            row["broker_cpu_s"] = b1 - b0
        self.rounds.append(row)

    def extra_info(self) -> dict[str, Any]:
        if not self.rounds:
            return {}
        out: dict[str, Any] = {"cpu_rounds": self.rounds}
        for key in ("jvm_cpu_s", "python_cpu_s", "broker_cpu_s"):
            vals = [r[key] for r in self.rounds if key in r]
            if vals:
                out[key] = float(np.median(vals))
        out["cpu_s"] = out["jvm_cpu_s"] + out["python_cpu_s"]
        return out


# ---------------------------------------------------------------------------------------------
# The session, the broker and the source topic (all untimed)


@dataclass
class Bench:
    spark: Any
    bootstrap: str
    admin: kcore.AdminClient
    topic: str  # the source topic: ROWS records
    jars: list[str]
    meters: Callable[[], Meters]
    runtime: str = ""  # Spark's and Java's versions
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    created: list[str] = field(default_factory=list)
    count: int = 0
    data_dir: Path | None = None  # the broker's log dir, when kcore.testing runs it

    def clear_writes(self) -> None:
        """Before a write round (untimed): the topics written so far deleted, their files gone
        (bench/conftest.py's broker removes them 0.2 s after), then the page cache's dirty
        data written back. Kept, every round's ~250 MB of logs piled up as dirty pages and
        the kernel's writeback of them landed in whichever rounds came later: the same rows
        took 2-3x the broker CPU late in the group (measured: the wire floor's 256 KiB row
        1.72-1.75 s of broker CPU a round as the group's last rows, 0.65 s alone; kcore's
        16 KiB row 2.37 s against 1.01-1.03 s, moved later in the group)."""
        written = [t for t in self.created if t != self.topic]
        if written:
            self.admin.delete_topics(written, timeout=60)
            self.created = [t for t in self.created if t == self.topic]
            if self.data_dir is not None:
                wait_until_removed(self.data_dir, written)
        os.sync()

    def check_written(self, topic: str, result: None) -> None:
        """A write round's check: its topic holds ROWS records."""
        ends = self.end_offsets(topic)
        assert sum(ends.values()) == ROWS, f"{topic}: end offsets {ends}, want {ROWS} in all"

    def new_topic(self, what: str) -> str:
        self.count += 1
        name = f"bench-spark-{what}-{self.run}-{self.count:03d}"
        self.admin.create_topics([NewTopic(name, PARTITIONS, 1)], timeout=60)
        self.created.append(name)
        assert len(self.admin.describe_topics([name])[name].partitions) == PARTITIONS
        # ListOffsets is answered by the partition's leader: once it is, the broker takes
        # writes. Java's producer (kafka-clients 3.9) writing at once can lose a race: its
        # first batch gets NOT_LEADER_OR_FOLLOWER, a later in-flight batch is taken as the
        # producer's first, and the retried first batch is out of sequence until
        # delivery.timeout.ms fails the task (seen here with the JVM connector only).
        assert self.end_offsets(name) == dict.fromkeys(range(PARTITIONS), 0)
        return name

    def end_offsets(self, topic: str) -> dict[int, int]:
        got = self.admin.list_offsets({(topic, p): "latest" for p in range(PARTITIONS)})
        return {tp.partition: r.offset for tp, r in got.items()}

    def reader(self, fmt: str, streaming: bool = False) -> Any:
        read = self.spark.readStream if streaming else self.spark.read
        return (
            read.format(fmt)
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", self.topic)
        )


def _keys(ids: np.ndarray) -> np.ndarray:
    """``ids`` as 16 ASCII digits each (S16), without a Python loop."""
    digits = (ids[:, None] // (10 ** np.arange(KEY_SIZE - 1, -1, -1, dtype=np.int64))) % 10
    return np.ascontiguousarray((digits + ord("0")).astype(np.uint8)).view(f"S{KEY_SIZE}").ravel()


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz012345", dtype=np.uint8)
    raw = alphabet[rng.integers(0, len(alphabet), size=(n, VALUE_SIZE), dtype=np.uint8)]
    return np.ascontiguousarray(raw).view(f"S{VALUE_SIZE}").ravel()


def _fill(bootstrap: str, topic: str) -> None:
    """ROWS records, ROWS / 8 a partition (the last takes the remainder), keys 0..ROWS-1."""
    rng = np.random.default_rng(SEED)
    config = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "acks": "all",
    }
    per = ROWS // PARTITIONS
    with kcore.Producer(config) as producer:
        sent = []
        for p in range(PARTITIONS):
            lo, hi = p * per, ROWS if p == PARTITIONS - 1 else (p + 1) * per
            for start in range(lo, hi, SEND_CHUNK):
                ids = np.arange(start, min(hi, start + SEND_CHUNK), dtype=np.int64)
                keys, values = _keys(ids), _values(rng, len(ids))
                sent.append(producer.send_batch(topic, values, keys=keys, partition=p))
            for result in sent:
                result.result(TIMEOUT_S)
            sent.clear()


def _jvm_pid(spark: Any) -> int:
    return int(spark._jvm.java.lang.ProcessHandle.current().pid())


@pytest.fixture(scope="module")
def bench(kafka_cluster: Any) -> Iterator[Bench]:
    from pyspark.sql import SparkSession

    jars = [str(p) for p in spark_kafka_jars()]
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kcore-spark-bench")
        .config("spark.jars", ",".join(jars))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", str(PARTITIONS))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    kcore.spark.register(spark)
    # The floor's data source goes to the Python workers by value (bench/ is not on their path).
    import _produce_floor
    import _spark_floor
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(_produce_floor)
    cloudpickle.register_pickle_by_value(_spark_floor)
    spark.dataSource.register(_spark_floor.FloorDataSource)
    spark.dataSource.register(_spark_floor.WireFloorDataSource)
    nodes = getattr(kafka_cluster, "nodes", [])
    process = getattr(nodes[0], "process", None) if len(nodes) == 1 else None
    broker_pid = process.pid if process else None
    jvm_pid = _jvm_pid(spark)
    bootstrap = kafka_cluster.bootstrap_servers
    admin = kcore.AdminClient({"bootstrap.servers": bootstrap})
    b = Bench(spark, bootstrap, admin, "", jars, lambda: Meters(jvm_pid, broker_pid))
    if process is not None:
        b.data_dir = Path(nodes[0].data_dir)
    java = spark._jvm.java.lang.System.getProperty("java.version")
    b.runtime = f"Spark {spark.version}, Java {java}"
    try:
        b.topic = b.new_topic("source")
        _fill(bootstrap, b.topic)
        ends = b.end_offsets(b.topic)
        assert sum(ends.values()) == ROWS, f"source topic end offsets {ends}"
        yield b
    finally:
        try:
            if b.created:
                admin.delete_topics(b.created, timeout=120)
        finally:
            admin.close()
            spark.stop()


SETTINGS = {  # what report.py prints about the run
    "records": f"{ROWS:,}, {KEY_SIZE} B keys, {VALUE_SIZE} B values, {PARTITIONS} partitions "
    "(ROWS / 8 each), RF 1",
    "spark": f"local[2], one session for both formats, driver memory 2g, {ROUNDS} rounds + "
    "1 warm-up",
    "read": "whole topic -> noop sink, default options",
    "write": f"spark.range -> fresh topic each round; kafka.linger.ms {LINGER_MS}, the rest "
    "defaults (acks all, idempotence on; batch.size: kcore 262144, JVM 16384)",
    "stream": f"earliest, Trigger.AvailableNow, maxOffsetsPerTrigger {STREAM_BATCH:,}, noop sink",
}


def _info(benchmark: Any, fmt: str, what: str, label: str, b: Bench) -> None:
    impl, prefix = FORMATS[fmt]
    benchmark.extra_info.update(
        key=f"{fmt}.{what}",
        label=f"{prefix} {label}",
        impl=impl,
        items=ROWS,
        unit="records",
        payload_bytes=ROWS * (KEY_SIZE + VALUE_SIZE),
        settings={
            **SETTINGS,
            "runtime": b.runtime,
            "jars": ", ".join(os.path.basename(j) for j in b.jars),
        },
    )


def _run(
    benchmark: Any,
    b: Bench,
    timed: Callable[..., Any],
    setup: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]],
    check: Callable[..., None],
) -> None:
    """ROUNDS timed rounds after one warm-up: ``setup`` untimed, ``timed`` measured (with the
    CPU meters), ``check`` of its result untimed, before the next round's ``setup``."""
    meters = b.meters()
    results: list[tuple[tuple[Any, ...], Any]] = []

    def measured(*args: Any) -> None:
        meters.start()
        try:
            results.append((args, timed(*args)))
        finally:
            meters.stop()

    def checked_then_setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        # The last round checked before the next setup (which may delete its topic).
        while results:
            round_args, result = results.pop(0)
            check(*round_args, result)
        return setup()

    args, kwargs = setup()
    check(*args, timed(*args, **kwargs))  # warm-up, checked too
    benchmark.pedantic(measured, setup=checked_then_setup, rounds=ROUNDS, iterations=1)
    for round_args, result in results:
        check(*round_args, result)
    benchmark.extra_info.update(meters.extra_info())


# ---------------------------------------------------------------------------------------------
# Correctness of the reads, once (untimed): both formats must read the same records


def _digest(b: Bench, fmt: str) -> list[tuple[int, ...]]:
    """Per partition: (partition, rows, sum of offsets, sum of hash(key, value))."""
    from pyspark.sql import functions as F

    rows = (
        b.reader(fmt)
        .load()
        .groupBy("partition")
        .agg(
            F.count(F.lit(1)),
            F.sum("offset"),
            F.sum(F.hash("key", "value").cast("bigint")),
        )
        .orderBy("partition")
        .collect()
    )
    return [tuple(int(x) for x in r) for r in rows]


@pytest.fixture(scope="module")
def checked_reads(bench: Bench) -> None:
    per = ROWS // PARTITIONS
    sizes = [per] * (PARTITIONS - 1) + [ROWS - per * (PARTITIONS - 1)]
    digests = {fmt: _digest(bench, fmt) for fmt in FORMATS}
    assert digests["kcore"] == digests["kafka"], digests
    got = [(r[0], r[1], r[2]) for r in digests["kcore"]]
    want = [(p, n, n * (n - 1) // 2) for p, n in enumerate(sizes)]
    assert got == want, f"(partition, rows, sum of offsets): {got}, want {want}"


# ---------------------------------------------------------------------------------------------
# The benchmarks


FORMAT_PARAMS = [pytest.param(fmt, id=fmt) for fmt in FORMATS]


@_group("read")
@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_batch_read(benchmark: Any, bench: Bench, checked_reads: None, fmt: str) -> None:
    _info(benchmark, fmt, "read", "batch read -> noop", bench)

    def read() -> None:
        bench.reader(fmt).load().write.format("noop").mode("overwrite").save()

    _run(benchmark, bench, read, lambda: ((), {}), lambda result: None)


def _source(spark: Any) -> Any:
    """ROWS rows of 16-byte binary keys and 100-byte binary values, made by Spark."""
    return spark.range(0, ROWS, 1, numPartitions=PARTITIONS).selectExpr(
        f"CAST(lpad(CAST(id AS STRING), {KEY_SIZE}, '0') AS BINARY) AS key",
        "CAST(substring(repeat(lpad(hex(id * 2654435761), 16, '0'), 7), 1, "
        f"{VALUE_SIZE}) AS BINARY) AS value",
    )


# (format, kafka.batch.size option or None): each format's defaults (kcore's sink: 256 KiB,
# Java's producer: 16 KiB), then diagnostic rows with the other's batch size.
WRITE_PARAMS = [
    pytest.param("kcore", None, id="kcore"),
    pytest.param("kafka", None, id="kafka"),
    pytest.param("kcore", 16384, id="kcore-batch16k"),
    pytest.param("kafka", 262144, id="kafka-batch256k"),
]


WARM_WRITES = 2  # untimed writes per format before the first write benchmark


def _write_options(bench: Bench, batch_size: int | None) -> dict[str, str]:
    """A write's options: each sink's defaults but linger.ms (and batch.size if given)."""
    options = {"kafka.bootstrap.servers": bench.bootstrap, "kafka.linger.ms": str(LINGER_MS)}
    if batch_size is not None:
        options["kafka.batch.size"] = str(batch_size)
    return options


def _write(source: Any, fmt: str, topic: str, options: dict[str, str]) -> None:
    source.write.format(fmt).options(**options).option("topic", topic).mode("append").save()


@pytest.fixture(scope="module")
def warm_broker(bench: Bench) -> None:
    """A fresh broker's JIT takes several of these jobs to warm up: the first write benchmark
    paid for it (its broker CPU twice the others', up to 1.6x their wall time, whichever
    format ran first). So both formats and the wire floor write the job a few times first,
    untimed (without, the wire floor's rounds had 2.6x the broker CPU of kcore's sink for the
    same record batches; alone, warm, the two were level)."""
    source = _source(bench.spark)
    for _ in range(WARM_WRITES):
        for fmt in FORMATS:
            _write(source, fmt, bench.new_topic(f"warm-{fmt}"), _write_options(bench, None))
        _write_wire_floor(bench, source, bench.new_topic("warm-wire"), 262_144)


def _write_wire_floor(bench: Bench, source: Any, topic: str, batch_size: int) -> None:
    source.write.format(WIRE_FLOOR_FORMAT).options(
        bootstrap=bench.bootstrap,
        topic=topic,
        partitions=str(PARTITIONS),
        batch_size=str(batch_size),
        rows=str(ROWS),
    ).mode("append").save()


@_group("write")
@pytest.mark.parametrize("batch_size", [262_144, 16_384])
def test_batch_write_wire_floor(
    benchmark: Any, bench: Bench, warm_broker: None, batch_size: int
) -> None:
    """Not a sink: the write's rows put on the wire with kcore's compiled encoder and one
    blocking connection, nothing else (bench/_spark_floor.py), at each sink's batch size:
    kcore's row over this one is what its producer costs besides the encoding and the
    socket."""
    _info(benchmark, "kcore", "write", f"batch write, kafka.batch.size {batch_size:,}", bench)
    benchmark.extra_info.update(
        key=f"floor.wire-write.batch{batch_size}",
        label=f"Python sink: compiled encoder, one blocking connection, batch.size {batch_size:,}"
        " (wire floor)",
        impl=f"wire floor (batch.size {batch_size:,})",
    )
    source = _source(bench.spark)

    def setup() -> tuple[tuple[str], dict[str, Any]]:
        bench.clear_writes()
        return (bench.new_topic("write-wire"),), {}

    def write(topic: str) -> None:
        _write_wire_floor(bench, source, topic, batch_size)

    _run(benchmark, bench, write, setup, bench.check_written)


@_group("write")
@pytest.mark.parametrize(("fmt", "batch_size"), WRITE_PARAMS)
def test_batch_write(
    benchmark: Any, bench: Bench, warm_broker: None, fmt: str, batch_size: int | None
) -> None:
    if batch_size is None:
        _info(benchmark, fmt, "write", "batch write", bench)
    else:
        _info(benchmark, fmt, "write", f"batch write, kafka.batch.size {batch_size:,}", bench)
        impl, _ = FORMATS[fmt]
        benchmark.extra_info.update(
            key=f"{fmt}.write.batch{batch_size}",
            impl=impl if fmt == "kcore" else f"{impl} (batch.size {batch_size:,})",
        )
    source = _source(bench.spark)
    options = _write_options(bench, batch_size)

    def setup() -> tuple[tuple[str], dict[str, Any]]:
        bench.clear_writes()
        return (bench.new_topic(f"write-{fmt}"),), {}

    def write(topic: str) -> None:
        _write(source, fmt, topic, options)

    _run(benchmark, bench, write, setup, bench.check_written)


@_group("write")
def test_batch_write_floor(benchmark: Any, bench: Bench, warm_broker: None) -> None:
    """Not a sink: the write's rows handed to a Python data source that drops them (what
    any Python sink pays before its first record). report.py bounds the write goal by it."""
    _info(benchmark, "kcore", "write", "batch write", bench)
    benchmark.extra_info.update(
        key="floor.write",
        label="Python data source dropping the Arrow batches (floor)",
        impl="floor",
    )
    source = _source(bench.spark)

    def write() -> None:
        # (the data source's commit fails the job unless its tasks were handed every row)
        source.write.format(FLOOR_FORMAT).option("rows", str(ROWS)).mode("append").save()

    def setup() -> tuple[tuple[()], dict[str, Any]]:
        bench.clear_writes()  # as for the sinks' rounds
        return (), {}

    _run(benchmark, bench, write, setup, lambda result: None)


@_group("stream")
@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_stream_read(benchmark: Any, bench: Bench, checked_reads: None, fmt: str) -> None:
    _info(benchmark, fmt, "stream", "stream read (AvailableNow) -> noop", bench)
    _stream_rounds(
        benchmark,
        bench,
        lambda: bench.reader(fmt, streaming=True).option("startingOffsets", "earliest"),
    )


@_group("stream")
def test_stream_read_floor(benchmark: Any, bench: Bench) -> None:
    """Not a source of Kafka's: the stream's query on a Python streaming source that plans its
    micro-batches as kcore's and yields Arrow batches of Kafka's schema from memory
    (bench/_spark_floor.py), so what Spark costs any Python stream, with no client at all."""
    _info(benchmark, "kcore", "stream", "stream read (AvailableNow) -> noop", bench)
    benchmark.extra_info.update(
        key="floor.stream",
        label="Python streaming source yielding Arrow batches from memory (floor)",
        impl="floor",
    )
    _stream_rounds(
        benchmark,
        bench,
        lambda: (
            bench.spark.readStream.format(FLOOR_FORMAT)
            .option("rows", str(ROWS))
            .option("partitions", str(PARTITIONS))
            .option("key_size", str(KEY_SIZE))
            .option("value_size", str(VALUE_SIZE))
        ),
    )


def _stream_rounds(benchmark: Any, bench: Bench, reader: Callable[[], Any]) -> None:
    """The stream's rounds: ``reader()``'s stream, ROWS in STREAM_BATCH-row micro-batches
    (Trigger.AvailableNow), into the noop sink, a fresh checkpoint each round."""
    dirs: list[str] = []

    def setup() -> tuple[tuple[str], dict[str, Any]]:
        dirs.append(tempfile.mkdtemp(prefix="kcore-bench-spark-"))
        return (dirs[-1],), {}

    def stream(checkpoint: str) -> list[int]:
        query = (
            reader()
            .option("maxOffsetsPerTrigger", str(STREAM_BATCH))
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(TIMEOUT_S)
        if query.isActive:
            query.stop()
            raise TimeoutError(f"the streaming query did not end within {TIMEOUT_S:g}s")
        if query.exception() is not None:
            raise AssertionError(f"the streaming query failed: {query.exception()}")
        return [int(p["numInputRows"]) for p in query.recentProgress]

    def check(checkpoint: str, batches: list[int]) -> None:
        shutil.rmtree(checkpoint, ignore_errors=True)
        assert sum(batches) == ROWS, f"micro-batches read {batches}, want {ROWS} in all"

    try:
        _run(benchmark, bench, stream, setup, check)
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
