"""A Spark job on kcore: generate events, write them to Kafka, read them back twice (a batch
query and a streaming query), and check that what came back is exactly what was written.

    python examples/pipeline.py [--rows 2000000] [--partitions 4] [--spark standalone]

It runs against a one-node Kafka cluster that kcore starts on this machine (the first run
fetches the Kafka jars with Maven), or the cluster ``KCORE_BOOTSTRAP`` (or ``--bootstrap``)
names, and a ``local[2]`` Spark session; with ``--spark standalone``, against a Spark standalone
cluster started here (``kcore.testing.SparkCluster``: a master and two workers, each its own
JVM, whose executors get kcore from ``kcore.spark.register``). The phases:

1. Spark generates N events (``{"id":..,"user":..,"amount":..}`` JSON values keyed by user),
   each sent to Kafka partition ``id % partitions``, and computes per partition what the topic
   must hold: the count, the sum of the amounts and a checksum (the sum of Spark's ``hash`` of
   key and value).
2. ``df.write.format("kcore")`` writes them to a new topic.
3. ``spark.read.format("kcore")`` reads the topic back; per partition the same aggregates, plus
   the offsets (0..n-1, each once).
4. ``spark.readStream.format("kcore")`` reads it again with ``Trigger.AvailableNow`` in
   micro-batches of at most ``--max-offsets-per-trigger`` records, aggregating each in
   ``foreachBatch`` (only the per-partition sums are kept, never the rows).

It prints a line per stage and a summary of rows/s per phase, and exits with 0 only if every
check matches.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Spark aggregates per Kafka partition: (count, sum of amounts, checksum, min/max/sum offset).
AGGREGATES = [
    "count(*) AS n",
    "sum(amount) AS amount",
    "sum(CAST(hash(key, value) AS BIGINT)) AS checksum",
]
OFFSET_AGGREGATES = ["min(offset) AS first", "max(offset) AS last", "sum(offset) AS offsets"]
CHECKED = ("n", "amount", "checksum")


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", flush=True)


@dataclass
class Totals:
    """Per partition: count, amount, checksum, and the offsets seen (first, last, sum)."""

    parts: dict[int, dict[str, int]] = field(default_factory=dict)

    def add(self, rows: list[Any]) -> None:
        for row in rows:
            got = row.asDict()
            p = int(got.pop("partition"))
            mine = self.parts.setdefault(p, {})
            for name, raw in got.items():
                value = int(raw) if raw is not None else 0  # a sum over no values is null
                if name == "first":
                    mine[name] = min(mine.get(name, value), value)
                elif name == "last":
                    mine[name] = max(mine.get(name, value), value)
                else:
                    mine[name] = mine.get(name, 0) + value

    @property
    def rows(self) -> int:
        return sum(p["n"] for p in self.parts.values())


def compare(what: str, got: Totals, expected: Totals, partitions: int) -> list[str]:
    """The mismatches between what a read aggregated and what was written."""
    problems = []
    for p in range(partitions):
        want = expected.parts.get(p, {"n": 0, "amount": 0, "checksum": 0})
        have = got.parts.get(p, {"n": 0, "amount": 0, "checksum": 0})
        for name in CHECKED:
            if have.get(name, 0) != want.get(name, 0):
                problems.append(
                    f"{what}: partition {p} {name} is {have.get(name, 0)}, want {want.get(name, 0)}"
                )
        n = want["n"]
        if n and (have.get("first"), have.get("last")) != (0, n - 1):
            problems.append(
                f"{what}: partition {p} offsets {have.get('first')}..{have.get('last')}, "
                f"want 0..{n - 1}"
            )
        elif n and have.get("offsets") != n * (n - 1) // 2:
            problems.append(f"{what}: partition {p} offsets are not 0..{n - 1} once each")
    unknown = set(got.parts) - set(range(partitions))
    if unknown:
        problems.append(f"{what}: rows in partitions {sorted(unknown)} of {partitions}")
    return problems


@contextlib.contextmanager
def kafka(bootstrap: str | None, clock: Clock) -> Iterator[str]:
    if bootstrap:
        clock.say(f"using the Kafka cluster at {bootstrap}")
        yield bootstrap
        return
    from kcore.testing import KafkaCluster

    clock.say("starting a local Kafka cluster (the first run fetches the jars with Maven)")
    with KafkaCluster(1) as cluster:
        clock.say(f"  ready in {cluster.startup_seconds:.1f}s at {cluster.bootstrap_servers}")
        yield cluster.bootstrap_servers
    clock.say("Kafka cluster stopped")


@contextlib.contextmanager
def spark_cluster(kind: str, clock: Clock) -> Iterator[Any]:
    """None for ``local``; a started standalone cluster for ``standalone``."""
    if kind == "local":
        yield None
        return
    from kcore.testing import SparkCluster

    clock.say("starting a Spark standalone cluster (a master and two workers)")
    with SparkCluster(2) as cluster:
        clock.say(f"  ready in {cluster.startup_seconds:.1f}s at {cluster.master_url}")
        yield cluster
    clock.say("Spark cluster stopped")


def start_spark(partitions: int, cluster: Any) -> Any:
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "1g",
        "spark.sql.shuffle.partitions": str(partitions),
    }
    if cluster is not None:  # executors on the cluster's workers, running this Python
        spark = cluster.session("kcore-pipeline", conf=settings)
    else:
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master("local[2]").appName("kcore-pipeline")
        for key, value in settings.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def events(spark: Any, rows: int, partitions: int) -> Any:
    """N events: keyed by user, a JSON value, and the Kafka partition each goes to."""
    user, amount = "id % 10007", "(id * 7919) % 100000"
    value = f"""format_string('{{"id":%d,"user":%d,"amount":%d}}', id, {user}, {amount})"""
    return spark.range(0, rows, 1, numPartitions=2 * partitions).selectExpr(
        f"CAST(concat('user-', CAST({user} AS STRING)) AS BINARY) AS key",
        f"CAST({value} AS BINARY) AS value",
        f"CAST(id % {partitions} AS INT) AS partition",
        f"{amount} AS amount",
    )


def parsed(df: Any) -> Any:
    """The amount back out of each JSON value."""
    return df.selectExpr(
        "key",
        "value",
        "partition",
        "offset",
        "CAST(get_json_object(CAST(value AS STRING), '$.amount') AS BIGINT) AS amount",
    )


def per_partition(df: Any, offsets: bool = True) -> list[Any]:
    aggs = AGGREGATES + (OFFSET_AGGREGATES if offsets else [])
    return df.groupBy("partition").agg(*[_expr(a) for a in aggs]).collect()


def _expr(text: str) -> Any:
    from pyspark.sql import functions as F

    return F.expr(text)


@dataclass
class Phase:
    name: str
    rows: int
    seconds: float


def run(args: argparse.Namespace, bootstrap: str, clock: Clock, cluster: Any = None) -> int:
    import kcore
    import kcore.spark
    from kcore.admin import NewTopic

    rows, partitions = args.rows, args.partitions
    topic = f"kcore-pipeline-{uuid.uuid4().hex[:8]}"
    phases: list[Phase] = []
    problems: list[str] = []

    clock.say(f"starting Spark ({cluster.master_url if cluster else 'local[2]'})")
    spark = start_spark(partitions, cluster)
    checkpoint = tempfile.mkdtemp(prefix="kcore-pipeline-")
    admin = kcore.AdminClient({"bootstrap.servers": bootstrap})
    try:
        kcore.spark.register(spark)
        clock.say(f"  Spark {spark.version} ready; kcore data source registered")
        rf = 1 if args.embedded else -1
        admin.create_topics([NewTopic(topic, partitions, rf)])
        clock.say(f"created topic {topic} ({partitions} partitions)")

        source = events(spark, rows, partitions)
        clock.say(f"computing what {rows:,} generated events must give")
        expected = Totals()
        expected.add(per_partition(source, offsets=False))

        clock.say(f"writing {rows:,} events with df.write.format('kcore')")
        t = time.monotonic()
        (
            source.select("key", "value", "partition")
            .write.format("kcore")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic)
            .mode("append")
            .save()
        )
        phases.append(Phase("write (batch)", rows, time.monotonic() - t))
        clock.say(f"  written in {phases[-1].seconds:.1f}s")
        ends = admin.list_offsets({(topic, p): "latest" for p in range(partitions)})
        in_topic = sum(r.offset for r in ends.values())
        if in_topic != rows:
            problems.append(f"the topic holds {in_topic:,} records, want {rows:,}")

        clock.say("reading the topic back with spark.read.format('kcore')")
        t = time.monotonic()
        batch = (
            spark.read.format("kcore")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .load()
        )
        got = Totals()
        got.add(per_partition(parsed(batch)))
        phases.append(Phase("read (batch)", got.rows, time.monotonic() - t))
        clock.say(f"  {got.rows:,} rows aggregated in {phases[-1].seconds:.1f}s")
        problems += compare("batch read", got, expected, partitions)

        limit = args.max_offsets_per_trigger or max(1, -(-rows // 4))
        clock.say(
            "reading it again with spark.readStream.format('kcore'), Trigger.AvailableNow, "
            f"at most {limit:,} offsets a micro-batch"
        )
        streamed = Totals()

        def each_batch(df: Any, batch_id: int) -> None:
            rows_before = streamed.rows
            streamed.add(per_partition(parsed(df)))
            clock.say(f"  micro-batch {batch_id}: {streamed.rows - rows_before:,} rows")

        t = time.monotonic()
        query = (
            spark.readStream.format("kcore")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(limit))
            .load()
            .writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", os.path.join(checkpoint, "stream"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        phases.append(Phase("read (stream)", streamed.rows, time.monotonic() - t))
        clock.say(f"  {streamed.rows:,} rows aggregated in {phases[-1].seconds:.1f}s")
        problems += compare("stream read", streamed, expected, partitions)
    finally:
        with contextlib.suppress(Exception):
            admin.delete_topics([topic])
        admin.close()
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)

    print()
    print(f"{'phase':<16}{'rows':>12}{'seconds':>10}{'rows/s':>12}")
    for phase in phases:
        rate = phase.rows / phase.seconds if phase.seconds else 0.0
        print(f"{phase.name:<16}{phase.rows:>12,}{phase.seconds:>10.1f}{rate:>12,.0f}")
    print()
    checks = 1 + 2 * partitions * (len(CHECKED) + 1)
    if problems:
        for problem in problems:
            print(f"MISMATCH {problem}")
        print(f"FAILED: {len(problems)} of {checks} checks do not match")
        return 1
    print(
        f"OK: {rows:,} events written and read back by a batch and a streaming query; "
        f"all {checks} checks match"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="events to generate")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the topic")
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=None,
        help="the streaming query's micro-batch limit (default: a quarter of the rows)",
    )
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("KCORE_BOOTSTRAP") or None,
        help="an existing cluster (default $KCORE_BOOTSTRAP; else one is started here)",
    )
    parser.add_argument(
        "--spark",
        choices=("local", "standalone"),
        default="local",
        help="local[2] in this process (default), or a Spark standalone cluster started here",
    )
    args = parser.parse_args(argv)
    if args.rows < 1 or args.partitions < 1:
        parser.error("--rows and --partitions must be positive")
    args.embedded = not args.bootstrap
    clock = Clock()
    print(
        f"kcore Spark pipeline: {args.rows:,} events, {args.partitions} partitions, "
        f"Spark {args.spark}",
        flush=True,
    )
    with kafka(args.bootstrap, clock) as bootstrap, spark_cluster(args.spark, clock) as cluster:
        return run(args, bootstrap, clock, cluster)


if __name__ == "__main__":
    sys.exit(main())
