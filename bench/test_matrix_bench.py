"""The workload matrix: kcore and its peers (confluent-kafka, ``confluent_kafka.aio``, aiokafka,
kafka-python) over shapes real pipelines have, taking turns round by round in one run against
one real broker (bench/conftest.py's ``kafka_cluster``: one KRaft node of kcore.testing).

Design. A full cross product of the axes (partitions x value size x batch.size x keys x codec x
acks x API) is thousands of cells; instead every cell is the main shape with one axis changed:

* main shape: 6 partitions, 100-byte JSON-like values (lz4 shrinks them ~2.6x), batch.size
  16384 (Java's default), no keys, no compression, acks=1 without idempotence, linger.ms 5,
  buffer.memory 32 MiB (librdkafka: queue.buffering.max.kbytes), 5 requests in flight a
  connection (max.in.flight.requests.per.connection: Java's default; aiokafka has no such
  setting);
* partitions 1, 3, 60, 600; values 10 B, 1 KB, 10 KB; batch.size 1 MB; keyed (16-byte keys,
  murmur2-partitioned); lz4, zstd; acks=all with idempotence; asyncio;
* one partition with 1 KB values (a producer cell): a request carries at most one batch of a
  partition, so here every request is one 16 KiB batch, and a client's cost per request is
  what the cell measures;
* many partitions: a keyed producer over 1,000 partitions (aiokafka sits it out: 9.5 s a round
  at 600), a consumer reading 1,000.

Cells are named ``<section>:<cell>`` (``produce:partitions-600``, ``consume:java:lz4``,
``produce-async:main``, ``defaults:produce``); ``KCORE_BENCH_MATRIX_CELLS`` (comma-separated
fnmatch patterns, e.g. ``produce:*,*:lz4``) picks a subset. Sections:

* ``produce``: the blocking APIs with the same settings for every client: kcore
  ``Producer.send`` per record + ``flush``, kcore ``Producer.send_batch`` (one call) +
  ``result``, confluent-kafka ``Producer.produce`` per record + ``flush``, aiokafka ``await
  send`` per record + ``gather`` (its only API is asyncio), and kafka-python ``send`` + ``flush``
  in the main cell only (a round takes it ~10x as long as the others;
  ``KCORE_BENCH_MATRIX_KAFKA_PYTHON=all`` puts it in every cell).
* ``produce-async``: the main shape on an event loop: ``await send`` per record with the futures
  gathered (kcore ``AsyncProducer``, aiokafka, ``confluent_kafka.aio.AIOProducer``) and kcore's
  ``await send_batch``.
* ``consume``: topics written the way other applications write them, before the cell's rounds
  and untimed: by Kafka's own ``ProducerPerformance`` (kafka-producer-perf-test, run from the
  Kafka jars kcore.testing runs the broker with; values from a payload file of the same
  JSON-like values) and by librdkafka (confluent-kafka ``Producer.produce``), each at its
  defaults (only ``compression.type`` set in the codec cells). Read back from the beginning, no
  group, with the same fetch settings for every client (1 MiB a partition, 50 MiB a fetch,
  fetch.min.bytes 1, fetch.max.wait.ms 500, check.crcs true; up to 10,000 records a call, kcore
  ``poll_arrow`` 100,000): kcore ``Consumer.poll``, kcore ``Consumer.poll_arrow``, confluent-kafka
  ``Consumer.consume``, aiokafka ``getmany``, kafka-python ``poll`` (main cell only).
* ``consume-async``: the Java-written main topic read by kcore ``AsyncConsumer.poll``,
  ``confluent_kafka.aio.AIOConsumer.consume`` and aiokafka ``getmany``.
* ``defaults``: the main shape with each client at its own defaults (only the bootstrap servers
  set): kcore's send loop and send_batch against confluent-kafka's produce loop, aiokafka and
  kafka-python; and their consumers reading the Java-written main topic. Under the producers'
  table, for reference (not a Python client, so not a row), Java's own producer at its
  defaults, which are kcore's: ``ProducerPerformance``'s steady-state rate after 2N records,
  and the broker's CPU per N records over its run.

Rounds. Every round of every client is a process of its own (bench/_matrix_child.py), which
first sends or reads a few thousand records untimed (connections, metadata, producer id,
warm code paths) and then times N records (``KCORE_BENCH_MATRIX_N``, default 200,000, capped at
``KCORE_BENCH_MATRIX_MB`` MB of values, default 40: 1 KB values are 40,000 records, 10 KB
4,000). Within a cell the clients take turns, ``KCORE_BENCH_MATRIX_ROUNDS`` rounds each (default
2), each round starting with the next client, after an untimed round of the first client
(of every client in a section's first cell: the broker's JIT). A producer cell's topic is new, and
written to before the rounds, untimed (a record in each partition, then N records of the
cell's shape by kcore ``send_batch``): the broker's first writes of a shape are slower, and
would land on whichever client came first. Before every round the page cache's dirty data is
written back (``os.sync``, untimed), and a cell's topic is deleted (its files gone) before the
next cell starts. Besides wall time each round reports its process CPU time (every thread:
librdkafka's and kcore's network threads too) and its peak RSS (``VmHWM``, reset just before
the timed part: the process's highest RSS during it, interpreter and imports included).

Correctness, outside the timed part: a producer round must raise the topic's end offsets by
exactly what it sent (and its own results must count N, where the API returns them); a consumer
round must count N records and end at the topic's end offsets on every non-empty partition.
Nothing asserts a timing.

Report: one line per cell, each client's median time (its CPU and peak RSS beside it), and
for each kcore API the best peer's median over its own (above 1: kcore is faster). Printed
with ``-s`` and kept in the benchmark's extra_info (``python bench/report.py out.json`` prints
it again). Run: ``pytest bench/test_matrix_bench.py -s --benchmark-json=out.json`` (see
docs/benchmarks-matrix.md).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from _matrix_child import make_keys, make_values, process_cpu
from test_producer_bench import Broker, _need, _optional

import kcore
from kcore.admin import NewTopic

pytestmark = [pytest.mark.broker, pytest.mark.slow]

N = int(os.environ.get("KCORE_BENCH_MATRIX_N", "200000"))
MB = float(os.environ.get("KCORE_BENCH_MATRIX_MB", "40"))
ROUNDS = int(os.environ.get("KCORE_BENCH_MATRIX_ROUNDS", "2"))
CELLS = [p.strip() for p in os.environ.get("KCORE_BENCH_MATRIX_CELLS", "*").split(",") if p]
KAFKA_PYTHON_EVERYWHERE = os.environ.get("KCORE_BENCH_MATRIX_KAFKA_PYTHON", "") == "all"
PRIME_MAX = 5_000
TIMEOUT_S = 300.0
CHILD = str(Path(__file__).with_name("_matrix_child.py"))
JAVA_TOOL = "org.apache.kafka.tools.ProducerPerformance"
PAYLOAD_LINES = 1_000  # distinct values in Java's payload file (it picks one at random a record)

confluent = _optional("confluent_kafka")

LINGER_MS = 5
BUFFER_MEMORY = 32 * 1024 * 1024
# Java's default and the idempotent producer's most; librdkafka's own is 1,000,000, which in the
# 1 KB cell alone was worth ~1.3x to confluent-kafka (its defaults section keeps it).
MAX_IN_FLIGHT = 5
FETCH = {
    "max.partition.fetch.bytes": 1024 * 1024,
    "fetch.max.bytes": 50 * 1024 * 1024,
    "fetch.min.bytes": 1,
    "fetch.max.wait.ms": 500,
    # Every client checks each batch's CRC, as Java's consumer does by default (so do kcore,
    # aiokafka and kafka-python); librdkafka does not unless told (its check.crcs is false).
    "check.crcs": True,
}


@dataclass(frozen=True)
class Shape:
    partitions: int = 6
    value_size: int = 100
    batch_size: int = 16384
    keyed: bool = False
    codec: str = "none"
    idempotent: bool = False

    @property
    def records(self) -> int:
        return min(N, max(1, int(MB * 1_000_000) // self.value_size))

    def producer_settings(self) -> dict[str, Any]:
        """The settings every producer gets, in Java's names."""
        return {
            "acks": "all" if self.idempotent else "1",
            "enable.idempotence": self.idempotent,
            "linger.ms": LINGER_MS,
            "batch.size": self.batch_size,
            "compression.type": self.codec,
            "buffer.memory": BUFFER_MEMORY,
            "max.in.flight.requests.per.connection": MAX_IN_FLIGHT,
        }


MAIN = Shape()
AXES: list[tuple[str, Shape]] = [
    ("main", MAIN),
    ("partitions-1", replace(MAIN, partitions=1)),
    ("partitions-3", replace(MAIN, partitions=3)),
    ("partitions-60", replace(MAIN, partitions=60)),
    ("partitions-600", replace(MAIN, partitions=600)),
    ("value-10B", replace(MAIN, value_size=10)),
    ("value-1KB", replace(MAIN, value_size=1000)),
    ("value-10KB", replace(MAIN, value_size=10_000)),
    ("batch-1MB", replace(MAIN, batch_size=1_000_000)),
    ("keyed", replace(MAIN, keyed=True)),
    ("lz4", replace(MAIN, codec="lz4")),
    ("zstd", replace(MAIN, codec="zstd")),
    ("acks-all-idempotent", replace(MAIN, idempotent=True)),
    # One batch a request: what a client pays per request, beside the broker's (the floor)
    ("partitions-1-value-1KB", replace(MAIN, partitions=1, value_size=1000)),
    # Many partitions: a keyed producer spreading over 1,000 (the consumer cell reads 1,000)
    ("partitions-1000-keyed", replace(MAIN, partitions=1000, keyed=True)),
    ("partitions-1000", replace(MAIN, partitions=1000)),
]
# Cells a peer sits out: aiokafka's producer took 9.5 s a round at 600 partitions (kcore and
# confluent-kafka 0.1-0.3 s), so a 1,000-partition round of it would take most of the run.
SITS_OUT = {"partitions-1000-keyed": ("aiokafka",), "partitions-1000": ()}
# The consumer cells: the axes a reader sees (a topic's writer picks batch.size, keys, acks).
CONSUME_AXES = ("main", "partitions-1", "partitions-3", "partitions-60", "partitions-600")
CONSUME_AXES += ("value-10B", "value-1KB", "value-10KB", "lz4", "zstd", "partitions-1000")
LIBRDKAFKA_AXES = ("main", "value-1KB", "lz4")

PRODUCE_CLIENTS = ("kcore-send", "kcore-batch", "confluent", "aiokafka", "kafka-python")
# Not a client: the cell's Produce requests built untimed, then only written
# (bench/_produce_floor.py): the broker's time for the records, which bounds every client.
FLOOR = "floor"
PRODUCE_ASYNC_CLIENTS = ("kcore-async-send", "kcore-async-batch", "aiokafka", "confluent-aio")
CONSUME_CLIENTS = ("kcore-poll", "kcore-arrow", "confluent", "aiokafka", "kafka-python")
CONSUME_ASYNC_CLIENTS = ("kcore-async", "confluent-aio", "aiokafka")
LABELS = {
    "kcore-send": "kcore send",
    "kcore-batch": "kcore send_batch",
    "kcore-async-send": "kcore await send",
    "kcore-async-batch": "kcore await send_batch",
    "kcore-poll": "kcore poll",
    "kcore-arrow": "kcore poll_arrow",
    "kcore-async": "kcore await poll",
    "confluent": "confluent-kafka",
    "confluent-aio": "confluent_kafka.aio",
    "aiokafka": "aiokafka",
    "kafka-python": "kafka-python",
    FLOOR: "floor",
}


def selected(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in CELLS)


@dataclass
class Cell:
    name: str
    shape: Shape
    clients: tuple[str, ...]
    settings: dict[str, Any] | None  # None: every client at its own defaults
    writer: str | None = None  # consumer cells: who wrote the topic
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _clients(all_clients: tuple[str, ...], main: bool, axis: str = "main") -> tuple[str, ...]:
    out = tuple(c for c in all_clients if c not in SITS_OUT.get(axis, ()))
    if main or KAFKA_PYTHON_EVERYWHERE:
        return out
    return tuple(c for c in out if c != "kafka-python")


# ---------------------------------------------------------------------------------------------
# Topics and rounds (untimed bookkeeping in this process, timed parts in the children)


def _new_topic(broker: Broker, prefix: str, partitions: int) -> str:
    broker.count += 1
    name = f"{prefix}-{broker.run}-{broker.count:03d}"
    broker.admin.create_topics([NewTopic(name, partitions, 1)], timeout=60)
    broker.created.append(name)
    # ListOffsets answers once the partitions' logs exist (see Broker.new_topic): no round
    # pays for NOT_LEADER_OR_FOLLOWER retries of a topic still being made.
    _end_offsets(broker, name, partitions)
    return name


def _warm_topic(broker: Broker, cell: Cell) -> str:
    """A new topic for a producer cell, written to untimed first: a record in every
    partition, then N records of the cell's shape and settings (kcore ``send_batch``). The
    broker's first writes of a shape cost more than the next ones (600 partitions: the first
    client's first round took 1.7-2.0 s where its second took 0.14-0.18 s, a record in each
    partition first or not), and would land on whichever client writes first."""
    shape = cell.shape
    topic = _new_topic(broker, "bench-matrix", shape.partitions)
    config = {"bootstrap.servers": broker.bootstrap, **(cell.settings or {})}
    with kcore.Producer(config) as producer:
        for p in range(shape.partitions):
            producer.send(topic, b"warm-up", partition=p)
        values = make_values(shape.records, shape.value_size)
        keys = make_keys(shape.records) if shape.keyed else None
        producer.send_batch(topic, values, keys).result(TIMEOUT_S)
    return topic


def _end_offsets(broker: Broker, topic: str, partitions: int) -> dict[int, int]:
    got = broker.admin.list_offsets({(topic, p): "latest" for p in range(partitions)})
    return {tp.partition: r.offset for tp, r in got.items()}


def _delete(broker: Broker, topic: str) -> None:
    """The topic, deleted now, and (on bench/conftest.py's cluster, which deletes its files
    0.2 s later) its files gone before the next round: their unlinking and the freeing of their
    page cache landed in the next cell's first round otherwise."""
    broker.delete(topic)


# The broker's process by bootstrap address, when this run started it (its CPU per round is
# then reported); a broker from KCORE_TEST_BOOTSTRAP is not measured.
BROKER_PID: dict[str, int] = {}


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["bootstrap"] in BROKER_PID:
        spec = {**spec, "broker_pid": BROKER_PID[spec["bootstrap"]]}
    done = subprocess.run(
        [sys.executable, CHILD, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{spec['role']} {spec['client']} ({spec['topic']}) failed:\n{done.stderr[-4000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _prime(records: int) -> int:
    return max(1, min(PRIME_MAX, records // 5))


def _produce_round(broker: Broker, cell: Cell, client: str, topic: str) -> dict[str, Any]:
    shape = cell.shape
    before = sum(_end_offsets(broker, topic, shape.partitions).values())
    got = _child(
        {
            "role": "produce",
            "client": client,
            "bootstrap": broker.bootstrap,
            "topic": topic,
            "partitions": shape.partitions,
            "records": shape.records,
            "prime": _prime(shape.records),
            "settings": cell.settings,
            "value_size": shape.value_size,
            "keyed": shape.keyed,
        }
    )
    after = sum(_end_offsets(broker, topic, shape.partitions).values())
    assert after - before == got["sent"], (cell.name, client, before, after, got)
    return got


def _consume_round(
    broker: Broker, cell: Cell, client: str, topic: str, ends: dict[int, int]
) -> dict[str, Any]:
    shape = cell.shape
    got = _child(
        {
            "role": "consume",
            "client": client,
            "bootstrap": broker.bootstrap,
            "topic": topic,
            "partitions": shape.partitions,
            "records": shape.records,
            "prime": _prime(shape.records),
            "settings": cell.settings,
        }
    )
    assert got["records"] == shape.records, (cell.name, client, got["records"])
    # (a partition nothing was written to has no position in librdkafka: OFFSET_INVALID)
    positions = {int(p): o for p, o in got["positions"].items() if ends.get(int(p))}
    assert positions == {p: e for p, e in ends.items() if e}, (cell.name, client, positions)
    return got


def _run_cells(
    cells: list[Cell], one_round: Callable[[Cell, str], dict[str, Any]], warm_up: bool
) -> None:
    """The cells one after another; within a cell the clients take turns, round by round."""
    for i, cell in enumerate(cells):
        # Untimed: every client once in a section's first cell (the broker's JIT), the first
        # client once in the others. The first round after a cell's setup was slower whoever
        # ran it (600 partitions: 0.38 s for confluent-kafka first, 0.24-0.29 s after; kcore
        # send 0.7-0.9 s first, 0.14-0.19 s after), and the rotation alone leaves that on
        # round 1's first client.
        for client in cell.clients if warm_up and i == 0 else cell.clients[:1]:
            os.sync()
            one_round(cell, client)
        cell.results = {client: [] for client in cell.clients}
        k = len(cell.clients)
        for r in range(ROUNDS):
            # Each round starts with the next client: none is always first after the cell's
            # setup (or after whatever the machine's other tenants did between cells).
            for client in cell.clients[r % k :] + cell.clients[: r % k]:
                # The log data of earlier rounds (and of the topic a consumer cell reads, just
                # written) is dirty in the page cache until the kernel writes it back, 30 s
                # later, i.e. during some later round: written back here, untimed.
                os.sync()
                got = one_round(cell, client)
                cell.results[client].append(got)
                print(f"{cell.name} {client}: {got['wall_s']:.3f} s", flush=True)


# ---------------------------------------------------------------------------------------------
# Topics the consumer cells read: written by Java's ProducerPerformance or by librdkafka


def _java_producer(
    broker: Broker, topic: str, shape: Shape, records: int, *args: str
) -> tuple[str, float]:
    """Java's ProducerPerformance sending ``records`` of ``shape``'s values to ``topic`` as fast
    as it can, at its producer's defaults (but ``compression.type``); ``args`` are more of its
    options. Its output, and the broker's CPU seconds over the whole run (0.0 when this run did
    not start the broker). Its own JVM command, not the cluster's ``run_tool``: that one starts
    tools quickly (C1 only, serial GC, 256 MiB), and a producer measured for its rate needs the
    JVM's full compiler."""
    from kcore.testing import _cds, jars
    from kcore.testing.versions import KAFKA_VERSION

    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(b"\n".join(make_values(min(PAYLOAD_LINES, shape.records), shape.value_size)))
        payload = f.name
    props = [f"bootstrap.servers={broker.bootstrap}"]
    if shape.codec != "none":
        props.append(f"compression.type={shape.codec}")
    libs = jars.kafka_libs(KAFKA_VERSION)
    cmd = [
        jars.java_executable(),
        "-Xmx512m",
        f"-Dlog4j2.configurationFile={jars.tools_log4j2_config(KAFKA_VERSION)}",
        *_cds.classpath_args(libs),
        JAVA_TOOL,
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--throughput",
        "-1",
        "--payload-file",
        payload,
        *args,
        "--command-property",
        *props,
    ]
    pid = BROKER_PID.get(broker.bootstrap)
    before = process_cpu(pid) if pid else 0.0
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        os.unlink(payload)
    broker_cpu = process_cpu(pid) - before if pid else 0.0
    if done.returncode != 0:
        raise AssertionError(f"{JAVA_TOOL} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.stdout, broker_cpu


def _write_java(broker: Broker, topic: str, shape: Shape) -> None:
    _java_producer(broker, topic, shape, shape.records)


def _write_librdkafka(broker: Broker, topic: str, shape: Shape) -> None:
    config: dict[str, Any] = {"bootstrap.servers": broker.bootstrap}
    if shape.codec != "none":
        config["compression.type"] = shape.codec
    producer = confluent.Producer(config)
    for v in make_values(shape.records, shape.value_size):
        while True:
            try:
                producer.produce(topic, v)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(TIMEOUT_S) == 0


@dataclass
class ConsumeTopics:
    broker: Broker
    made: dict[tuple[str, Shape], tuple[str, dict[int, int]]] = field(default_factory=dict)

    def get(self, writer: str, shape: Shape) -> tuple[str, dict[int, int]]:
        """The topic ``writer`` wrote in ``shape`` (written now, the first time), and its end
        offsets, which must sum to the records written."""
        key = (writer, shape)
        if key not in self.made:
            topic = _new_topic(self.broker, f"bench-matrix-{writer}", shape.partitions)
            (_write_java if writer == "java" else _write_librdkafka)(self.broker, topic, shape)
            ends = _end_offsets(self.broker, topic, shape.partitions)
            assert sum(ends.values()) == shape.records, (writer, shape, ends)
            counts = sorted(ends.values())
            print(
                f"{writer} wrote {topic}: {shape.records:,} records, per partition "
                f"{counts[0]:,}..{counts[-1]:,}, {counts.count(0)} partitions empty",
                flush=True,
            )
            self.made[key] = (topic, ends)
        return self.made[key]


# ---------------------------------------------------------------------------------------------
# The tables


def _fmt_s(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 10 else f"{s:.1f} s"


def _is_peer(client: str) -> bool:
    return not client.startswith("kcore") and client != FLOOR


def _table(title: str, cells: list[Cell]) -> str:
    clients = list(dict.fromkeys(c for cell in cells for c in cell.clients))
    floor = FLOOR in clients
    head = ["cell", "records", *(LABELS[c] for c in clients), "best peer", "kcore vs best peer"]
    if floor:
        head.append("bound: best peer / floor")
    broker = any("broker_cpu_s" in r for cell in cells for rs in cell.results.values() for r in rs)
    figures = "median wall time / median CPU s / " + (
        "median broker CPU s / peak RSS MB" if broker else "peak RSS MB"
    )
    lines = [
        f"### {title}",
        "",
        f"Each client: {figures}. Ratio: the best peer's median / kcore's (above 1: kcore is "
        "faster)."
        + (
            " Floor: the cell's requests built untimed, then only written (no client); the "
            "bound is the most any client could gain over the best peer on that broker."
            if floor
            else ""
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for cell in cells:
        med = {c: statistics.median(r["wall_s"] for r in rs) for c, rs in cell.results.items()}
        row = [cell.name, f"{cell.shape.records:,}"]
        for c in clients:
            rs = cell.results.get(c)
            if not rs:
                row.append("-")
                continue
            parts = [_fmt_s(med[c]), f"{statistics.median(r['cpu_s'] for r in rs):.2f}"]
            if broker:
                parts.append(f"{statistics.median(r.get('broker_cpu_s', 0.0) for r in rs):.2f}")
            parts.append(f"{max(r['peak_rss'] for r in rs) / 1e6:.0f}")
            row.append(" / ".join(parts))
        peers = {c: m for c, m in med.items() if _is_peer(c)}
        best = min(peers, key=peers.__getitem__) if peers else None
        row.append(LABELS[best] if best else "-")
        ratios = [
            f"{LABELS[c].removeprefix('kcore ')} {peers[best] / m:.2f}x"
            for c, m in med.items()
            if c.startswith("kcore") and best
        ]
        row.append(", ".join(ratios) or "-")
        if floor:
            row.append(_bound(med, peers[best]) if best and FLOOR in med else "-")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return "\n".join(lines)


def _bound(med: dict[str, float], best_peer: float) -> str:
    """The cell's bound (best peer / floor). A floor slower than a kcore row was measured under
    other conditions than that row (a busy machine: the floor only writes prepared requests),
    so it bounds nothing in that cell, and the table says so rather than print a bound that
    kcore passes."""
    bound = f"{best_peer / med[FLOOR]:.2f}x"
    fastest = min((m for c, m in med.items() if c.startswith("kcore")), default=None)
    if fastest is not None and fastest < med[FLOOR]:
        return f"{bound} (floor slower than kcore: no bound)"
    return bound


def _summary(cells: list[Cell]) -> dict[str, Any]:
    return {cell.name: cell.results for cell in cells}


def _finish(benchmark: Any, tables: list[str], cells: list[Cell]) -> None:
    table = "\n".join(tables)
    print("\n" + table, flush=True)
    benchmark.extra_info.update(
        table=table,
        cells=_summary(cells),
        settings={"records": N, "mb": MB, "rounds": ROUNDS, "linger.ms": LINGER_MS},
    )


# ---------------------------------------------------------------------------------------------
# The benchmarks: one per section group, each holding its cells' alternating rounds


def _open_broker(kafka_cluster: Any, admin: kcore.AdminClient) -> Broker:
    broker = Broker(kafka_cluster.bootstrap_servers, admin, None)
    nodes = getattr(kafka_cluster, "nodes", [])
    if len(nodes) == 1 and getattr(nodes[0], "process", None) is not None:
        broker.own_cluster()  # delete() deletes at once
        broker.data_dir = Path(nodes[0].data_dir)  # and waits until the files are gone
        BROKER_PID[broker.bootstrap] = nodes[0].process.pid  # its CPU, round by round
    return broker


def _rounds_and_tables(
    benchmark: Any,
    broker: Broker,
    sync: list[Cell],
    aio: list[Cell],
    one: Callable[[Cell, str], dict[str, Any]],
    what: str,
    settings: str,
) -> None:
    """The blocking cells' rounds, then the asyncio ones', as one benchmark; the broker's
    topics deleted after; a table for each kind of cell."""
    try:
        benchmark.pedantic(
            lambda: (_run_cells(sync, one, True), _run_cells(aio, one, not sync)),
            rounds=1,
            iterations=1,
        )
    finally:
        broker.delete_all()
    tables = []
    if sync:
        tables.append(_table(f"{what}, {settings}", sync))
    if aio:
        tables.append(_table(f"{what} on asyncio, {settings}", aio))
    _finish(benchmark, tables, sync + aio)


@pytest.mark.benchmark(group="matrix:produce")
def test_produce(benchmark: Any, kafka_cluster: Any) -> None:
    _need(confluent, "confluent-kafka")
    sync = [
        Cell(
            f"produce:{name}",
            shape,
            _clients(PRODUCE_CLIENTS, name == "main", name) + (FLOOR,),
            None,
        )
        for name, shape in AXES
        if name != "partitions-1000"  # (the keyed cell is the producer's 1,000-partition one)
    ]
    aio = [Cell("produce-async:main", MAIN, PRODUCE_ASYNC_CLIENTS, None)]
    sync = [c for c in sync if selected(c.name)]
    aio = [c for c in aio if selected(c.name)]
    if not sync and not aio:
        pytest.skip("no produce cell selected (KCORE_BENCH_MATRIX_CELLS)")
    for cell in sync + aio:
        cell.settings = cell.shape.producer_settings()
    with kcore.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as admin:
        broker = _open_broker(kafka_cluster, admin)
        topics: dict[str, str] = {}

        def one(cell: Cell, client: str) -> dict[str, Any]:
            if cell.name not in topics:
                for name in list(topics):  # the last cell's topic, done with
                    _delete(broker, topics.pop(name))
                topics[cell.name] = _warm_topic(broker, cell)
            return _produce_round(broker, cell, client, topics[cell.name])

        _rounds_and_tables(benchmark, broker, sync, aio, one, "Producers", "the same settings")


@pytest.mark.benchmark(group="matrix:consume")
def test_consume(benchmark: Any, kafka_cluster: Any) -> None:
    _need(confluent, "confluent-kafka")
    shapes = dict(AXES)
    sync = [
        Cell(
            f"consume:{writer}:{name}",
            shapes[name],
            _clients(CONSUME_CLIENTS, name == "main", name),
            FETCH,
            writer,
        )
        for writer, names in (("java", CONSUME_AXES), ("librdkafka", LIBRDKAFKA_AXES))
        for name in names
    ]
    aio = [Cell("consume-async:java:main", MAIN, CONSUME_ASYNC_CLIENTS, FETCH, "java")]
    sync = [c for c in sync if selected(c.name)]
    aio = [c for c in aio if selected(c.name)]
    if not sync and not aio:
        pytest.skip("no consume cell selected (KCORE_BENCH_MATRIX_CELLS)")
    with kcore.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as admin:
        broker = _open_broker(kafka_cluster, admin)
        written = ConsumeTopics(broker)

        def one(cell: Cell, client: str) -> dict[str, Any]:
            assert cell.writer is not None
            topic, ends = written.get(cell.writer, cell.shape)
            return _consume_round(broker, cell, client, topic, ends)

        _rounds_and_tables(
            benchmark, broker, sync, aio, one, "Consumers", "the same fetch settings"
        )


@pytest.mark.benchmark(group="matrix:defaults")
def test_defaults(benchmark: Any, kafka_cluster: Any) -> None:
    """The main shape, each client at its own defaults (only bootstrap.servers given)."""
    _need(confluent, "confluent-kafka")
    produce = Cell("defaults:produce", MAIN, PRODUCE_CLIENTS + ("confluent-aio",), None)
    consume = Cell("defaults:consume", MAIN, CONSUME_CLIENTS, None, "java")
    cells = [c for c in (produce, consume) if selected(c.name)]
    if not cells:
        pytest.skip("no defaults cell selected (KCORE_BENCH_MATRIX_CELLS)")
    with kcore.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as admin:
        broker = _open_broker(kafka_cluster, admin)
        written = ConsumeTopics(broker)
        produce_topic: list[str] = []

        def one(cell: Cell, client: str) -> dict[str, Any]:
            if cell is produce:
                if not produce_topic:
                    produce_topic.append(_warm_topic(broker, cell))
                return _produce_round(broker, cell, client, produce_topic[0])
            topic, ends = written.get("java", MAIN)
            return _consume_round(broker, cell, client, topic, ends)

        java = ""
        try:
            benchmark.pedantic(
                lambda: [_run_cells([cell], one, True) for cell in cells], rounds=1, iterations=1
            )
            if produce in cells:
                java = _java_at_defaults(broker, produce, produce_topic[0])
        finally:
            broker.delete_all()
    tables = [
        _table(f"Each client at its own defaults: {cell.name.split(':')[1]}", [cell])
        + (java if cell is produce else "")
        for cell in cells
    ]
    _finish(benchmark, tables, cells)


JAVA_WARM_UP = 2  # N's Java's producer sends before its steady state (its JIT, the broker's)
JAVA_TIMED = 4  # N's of steady state


def _java_at_defaults(broker: Broker, cell: Cell, topic: str) -> str:
    """Java's own producer at its defaults (Java's are kcore's) on the cell's shape, for
    reference under the defaults table: not a Python client, so not a row. Its steady-state
    rate after JAVA_WARM_UP x N records, as the time N records take at that rate; the broker's
    CPU over the whole run, per N records (the broker's work for Java's requests, which are
    kcore's too: 16 KiB batches, acks=all, idempotence)."""
    n = cell.shape.records
    out, broker_cpu = _java_producer(
        broker,
        topic,
        cell.shape,
        (JAVA_WARM_UP + JAVA_TIMED) * n,
        "--warmup-records",
        str(JAVA_WARM_UP * n),
    )
    match = re.search(r"(\d+) steady state records sent, ([\d.]+) records/sec", out)
    if match is None:
        raise AssertionError(f"{JAVA_TOOL} printed no steady-state rate:\n{out[-2000:]}")
    wall = n / float(match.group(2))
    kcore_send = statistics.median(r["wall_s"] for r in cell.results["kcore-send"])
    line = (
        f"Java's producer at its defaults ({JAVA_TOOL}, {n:,} records at its steady-state rate "
        f"after {JAVA_WARM_UP * n:,}, one run after the rounds): {_fmt_s(wall)}, kcore send "
        f"{wall / kcore_send:.2f}x"
    )
    if broker_cpu:
        per_n = broker_cpu / (JAVA_WARM_UP + JAVA_TIMED)
        line += f"; the broker's CPU {per_n:.2f} s per {n:,} records (its whole run's average)"
    return line + ".\n"
