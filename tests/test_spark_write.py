"""The write side of kcore's Spark data source: ``df.write`` / ``df.writeStream`` with
``format("kcore")``, through a real ``local[2]`` Spark (one session for the module) into a real
broker, read back with ``kcore.Consumer``: exactly the rows written (count and content) on the
right partitions and topics; the JVM sink's option and column checks, at planning; a job against
an unreachable broker fails in bounded time; streaming and transactional streaming writes; and
one cached producer per executor process, reused by its tasks.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from typing import Any

import pyspark  # noqa: F401  (a dev dependency: missing means a broken setup, not a skip)
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.functions import col, udf
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import kcore
import kcore.spark
from kcore.admin import NewTopic
from kcore.codec import partition_for_key
from kcore.errors import KcoreError
from kcore.spark.write_options import SINK_BATCH_SIZE, write_settings

pytestmark = [pytest.mark.broker, pytest.mark.slow]

HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


@pytest.fixture(scope="module")
def spark():
    session = (
        SparkSession.builder.master("local[2]")
        .appName("kcore-spark-write")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    kcore.spark.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def bootstrap(kafka_cluster) -> str:
    return kafka_cluster.bootstrap_servers


def new_topic(bootstrap: str, partitions: int = 3) -> str:
    name = f"sw-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])
    return name


def read_topic(
    bootstrap: str, topic: str, partitions: int, expected: int, isolation: str = "read_uncommitted"
) -> list[Any]:
    """Every record of ``topic``: polls until ``expected`` arrived, then a little longer, so
    that a duplicate or stray record would be seen too."""
    config = {"bootstrap.servers": bootstrap, "isolation.level": isolation}
    with kcore.Consumer(config) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        for p in range(partitions):
            consumer.seek((topic, p), 0)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(0.5)
        records += consumer.poll(0.5)
        return records


def writer(df: Any, bootstrap: str, **options: str) -> Any:
    return df.write.format("kcore").option("kafka.bootstrap.servers", bootstrap).options(**options)


# -- batch writes ---------------------------------------------------------------------------------


def test_key_value_headers_partition_columns(spark, bootstrap):
    topic = new_topic(bootstrap)
    schema = StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("headers", HEADERS),
            StructField("partition", IntegerType()),
        ]
    )
    rows = [
        (
            f"k{i}",
            b"v%d" % i if i % 7 else None,  # a few null values (tombstones)
            [("n", b"%d" % i), ("empty", None)] if i % 3 else ([] if i % 2 else None),
            i % 3,
        )
        for i in range(60)
    ]
    writer(spark.createDataFrame(rows, schema).repartition(2), bootstrap, topic=topic).mode(
        "append"
    ).save()

    got = read_topic(bootstrap, topic, 3, len(rows))
    assert len(got) == len(rows)
    assert Counter((r.partition, r.key, r.value, r.headers) for r in got) == Counter(
        (p, k.encode(), v, tuple(h or ())) for k, v, h, p in rows
    )


def test_a_trace_goes_on_through_a_spark_job_with_headers(spark, bootstrap):
    """A record sent inside a span (otel.traces.enable), read by the kcore source with
    includeHeaders and written on by the kcore sink with its headers column: the record that
    arrives downstream still names its sender's span (trace context in the headers)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(exporter))
    source, sink = new_topic(bootstrap), new_topic(bootstrap)
    config = {
        "bootstrap.servers": bootstrap,
        "otel.traces.enable": True,
        "otel.tracer.provider": tracers,
    }
    with kcore.Producer(config) as producer:
        for i in range(30):
            producer.send(source, b"v%d" % i, headers=[("n", b"%d" % i)])
        producer.flush(30)
    sent = {s.context.span_id: s for s in exporter.get_finished_spans()}
    assert len(sent) == 30

    df = (
        spark.read.format("kcore")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("includeHeaders", "true")
        .load()
        .select("key", "value", "headers")
    )
    writer(df, bootstrap, topic=sink).mode("append").save()

    got = read_topic(bootstrap, sink, 3, 30)
    assert len(got) == 30
    for record in got:
        span_id = trace.get_current_span(kcore.trace_context(record)).get_span_context().span_id
        span = sent[span_id]  # the sender's span, through Spark
        assert ("n", record.value[1:]) in record.headers
        assert span.attributes["messaging.destination.name"] == source


def test_columnar_path_partitioner_and_timestamps(spark, bootstrap):
    topic = new_topic(bootstrap)
    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", StringType()),
            StructField("partition", IntegerType()),
            StructField("timestamp", TimestampType()),
        ]
    )
    t0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
    rows = [
        (
            b"key%d" % i if i % 5 else None,
            f"välue {i}",
            None if i % 2 else i % 3,  # odd rows: the producer's partitioner decides
            t0.replace(second=i % 60),
        )
        for i in range(500)
    ]
    writer(spark.createDataFrame(rows, schema).repartition(3), bootstrap, topic=topic).mode(
        "append"
    ).save()

    got = read_topic(bootstrap, topic, 3, len(rows))
    assert len(got) == len(rows)
    assert Counter((r.key, r.value, r.timestamp) for r in got) == Counter(
        (k, v.encode(), int(ts.timestamp() * 1000)) for k, v, _, ts in rows
    )
    by_value = {r.value: r.partition for r in got}
    for key, value, partition, _ in rows:
        if partition is not None:
            assert by_value[value.encode()] == partition
        elif key is not None:  # the Java default partitioner's choice, as the JVM sink's
            assert by_value[value.encode()] == partition_for_key(key, 3)


def test_topic_column_and_topic_option(spark, bootstrap):
    first, second, forced = new_topic(bootstrap, 2), new_topic(bootstrap, 2), new_topic(bootstrap)
    rows = [(first if i % 3 else second, f"v{i}", i % 2 if i % 3 else None) for i in range(30)]
    df = spark.createDataFrame(rows, "topic string, value string, partition int")
    writer(df, bootstrap).mode("append").save()
    got = read_topic(bootstrap, first, 2, 20)
    assert sorted((r.partition, r.value) for r in got) == sorted(
        (p, v.encode()) for t, v, p in rows if t == first
    )
    assert len(read_topic(bootstrap, second, 2, 10)) == 10

    # The option overrides the column (the partition column still applies).
    writer(df, bootstrap, topic=forced).mode("append").save()
    assert len(read_topic(bootstrap, forced, 3, 30)) == 30
    assert len(read_topic(bootstrap, first, 2, 20)) == 20  # nothing more went there


@pytest.mark.parametrize("kind", ["string", "binary"])
def test_string_and_binary_key_and_value(spark, bootstrap, kind):
    topic = new_topic(bootstrap, 1)
    text = ["ünïcode", "", "plain"]
    rows = [(t, t) if kind == "string" else (t.encode(), t.encode()) for t in text]
    df = spark.createDataFrame(rows, f"key {kind}, value {kind}").coalesce(1)
    writer(df, bootstrap, topic=topic).mode("append").save()
    got = read_topic(bootstrap, topic, 1, 3)
    assert [(r.key, r.value) for r in got] == [(t.encode(), t.encode()) for t in text]


# -- checks at planning, and failures at run time -------------------------------------------------


@pytest.mark.parametrize(
    "select, options, mode, expected",
    [
        ("'k' as key", {"topic": "t"}, "append", "required column 'value' not found"),
        ("1 as value", {"topic": "t"}, "append", "column 'value' has unsupported type int"),
        ("1 as key, 'v' as value", {"topic": "t"}, "append", "column 'key' has unsupported"),
        ("'v' as value, 'p' as partition", {"topic": "t"}, "append", "column 'partition' has"),
        ("'v' as value, array('h') as headers", {"topic": "t"}, "append", "column 'headers' has"),
        ("'v' as value", {}, "append", "option required when no 'topic' column"),
        ("'v' as value, 1 as topic", {}, "append", "column 'topic' has unsupported type int"),
        ("'v' as value", {"topic": "t", "kafka.key.serializer": "x"}, "append", "key.serializer"),
        ("'v' as value", {"topic": "t", "kafka.no.such.key": "1"}, "append", "kafka.no.such.key"),
        ("'v' as value", {"topic": "t", "kafka.bootstrap.servers": ""}, "append", "bootstrap"),
        ("'v' as value", {"topic": "t"}, "overwrite", "save mode overwrite is not allowed"),
    ],
)
def test_bad_options_and_columns_fail_at_planning(
    spark, bootstrap, select, options, mode, expected
):
    df = spark.range(1).selectExpr(*select.split(", "))
    started = time.monotonic()
    with pytest.raises(Exception, match="ConfigError") as info:
        writer(df, bootstrap, **options).mode(mode).save()
    assert expected in str(info.value)
    assert time.monotonic() - started < 30  # no broker was waited for


def test_null_topic_in_the_data_fails_the_job(spark, bootstrap):
    topic = new_topic(bootstrap, 1)
    df = spark.createDataFrame([(topic, "a"), (None, "b")], "topic string, value string")
    with pytest.raises(Exception, match="null topic present in the data"):
        writer(df.coalesce(1), bootstrap).mode("append").save()


def test_a_timestamp_before_1970_fails_the_job(spark, bootstrap):
    """Kafka takes no negative timestamp (the JVM sink's task fails on one too): the task
    fails naming the column, and the rows of its batch are not written."""
    topic = new_topic(bootstrap, 1)
    df = spark.createDataFrame(
        [
            ("a", datetime(2020, 1, 1, tzinfo=timezone.utc)),
            ("b", datetime(1969, 12, 31, tzinfo=timezone.utc)),
        ],
        "value string, timestamp timestamp",
    )
    with pytest.raises(Exception, match="timestamp: invalid timestamp -86400000 ms"):
        writer(df.coalesce(1), bootstrap, topic=topic).mode("append").save()
    assert read_topic(bootstrap, topic, 1, 0) == []


def test_transactional_writes_get_a_longer_transaction_timeout():
    """A task is one transaction: the producer's 60 s would abort slow tasks; 15 min is the
    brokers' default ceiling. A value given stays; without transactions nothing is set."""
    schema = StructType([StructField("value", StringType())])
    base = {"kafka.bootstrap.servers": "h:1", "topic": "t"}
    txn = write_settings({**base, "kafka.transactional.id": "p"}, schema)
    assert txn.producer_config["transaction.timeout.ms"] == "900000"
    given = {**base, "kafka.transactional.id": "p", "kafka.transaction.timeout.ms": "120000"}
    assert write_settings(given, schema).producer_config["transaction.timeout.ms"] == "120000"
    assert "transaction.timeout.ms" not in write_settings(base, schema).producer_config


def test_lz4_high_compression_is_checked_at_planning():
    """kafka.compression.lz4.level other than 9 is LZ4 HC, which needs the lz4 package: without
    it the write fails when planned (naming the option), not in every task."""
    import subprocess
    import sys

    schema = StructType([StructField("value", StringType())])
    base = {"kafka.bootstrap.servers": "h:1", "topic": "t", "kafka.compression.type": "lz4"}
    for level in ("9", "12"):  # this environment has lz4: both plan
        write_settings({**base, "kafka.compression.lz4.level": level}, schema)
    code = (
        "import sys; sys.modules['lz4'] = None\n"
        "from pyspark.sql.types import StructField, StringType, StructType\n"
        "from kcore.errors import ConfigError\n"
        "from kcore.spark.write_options import write_settings\n"
        "schema = StructType([StructField('value', StringType())])\n"
        f"base = {base!r}\n"
        "write_settings({**base, 'kafka.compression.lz4.level': '9'}, schema)\n"
        "try:\n"
        "    write_settings({**base, 'kafka.compression.lz4.level': '12'}, schema)\n"
        "except ConfigError as e:\n"
        "    assert e.key == 'kafka.compression.lz4.level' and 'lz4 package' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('planned without the lz4 package')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_unreachable_broker_fails_the_job_in_bounded_time(spark):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {"topic": "t", "kafka.max.block.ms": "3000"}
    empty = spark.range(0).selectExpr("cast(id as string) as value")
    writer(empty, f"127.0.0.1:{port}", **options).mode("append").save()  # no rows: no producer

    df = spark.range(10).selectExpr("cast(id as string) as value")
    started = time.monotonic()
    with pytest.raises(Exception, match="BootstrapError") as info:
        writer(df, f"127.0.0.1:{port}", **options).mode("append").save()
    assert "kcore" in str(info.value)
    assert time.monotonic() - started < 60


# -- streaming ------------------------------------------------------------------------------------


def run_available_now(
    spark, source_dir: str, checkpoint: str, one_task: bool = False, **options: str
) -> None:
    """One ``Trigger.AvailableNow`` run of the text files in ``source_dir`` into Kafka."""
    df = spark.readStream.format("text").load(source_dir)
    query = (
        (df.coalesce(1) if one_task else df)
        .writeStream.format("kcore")
        .options(**options)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the streaming query did not finish"
    finally:
        query.stop()


def put(directory: str, name: str, lines: list[str]) -> None:
    with open(os.path.join(directory, name), "w") as f:
        f.write("\n".join(lines) + "\n")


def test_streaming_write_lands_every_row_once(spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap, 2)
    source = tmp_path / "in"
    source.mkdir()
    options = {"kafka.bootstrap.servers": bootstrap, "topic": topic}
    put(str(source), "a.txt", [f"a{i}" for i in range(100)])
    run_available_now(spark, str(source), str(tmp_path / "ckpt"), **options)
    put(str(source), "b.txt", [f"b{i}" for i in range(50)])
    run_available_now(spark, str(source), str(tmp_path / "ckpt"), **options)  # only b is new

    got = read_topic(bootstrap, topic, 2, 150)
    assert sorted(r.value for r in got) == sorted(
        [f"a{i}".encode() for i in range(100)] + [f"b{i}".encode() for i in range(50)]
    )


def test_transactional_streaming_write(spark, bootstrap, tmp_path):
    """Each task writes in a transaction of id ``<prefix>-<partition>``: a read_committed
    reader sees the query's rows, and not those of an earlier attempt of the same task that
    never committed (a zombie: its transaction is aborted, its producer fenced)."""
    topic = new_topic(bootstrap, 2)
    prefix = f"txn-{topic}"
    # What a crashed attempt of the query's one task (partition 0) leaves behind.
    zombie = kcore.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}-0"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for partition in (0, 1):
        zombie.send_batch(topic, [b"zombie"] * 5, partition=partition).result(30)

    source = tmp_path / "in"
    source.mkdir()
    put(str(source), "a.txt", [f"a{i}" for i in range(40)])
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "topic": topic,
        "kafka.transactional.id": prefix,
    }
    run_available_now(spark, str(source), str(tmp_path / "ckpt"), one_task=True, **options)

    committed = read_topic(bootstrap, topic, 2, 40, "read_committed")
    assert sorted(r.value for r in committed) == sorted(f"a{i}".encode() for i in range(40))
    everything = read_topic(bootstrap, topic, 2, 50)
    assert sum(r.value == b"zombie" for r in everything) == 10  # written, then aborted
    with pytest.raises(KcoreError, match="PRODUCER_FENCED"):  # the query's task fenced it
        zombie.commit_transaction(30)
    zombie.close(5)


# -- the executor-side producer cache -------------------------------------------------------------


def test_one_cached_producer_per_executor_process(spark, bootstrap):
    topic = new_topic(bootstrap, 2)
    client_id = f"reuse-{uuid.uuid4().hex[:6]}"  # a config of this test's own
    options = {"topic": topic, "kafka.client.id": client_id}
    df = spark.range(0, 100, 1, 2).selectExpr("cast(id as string) as value")
    for _ in range(4):  # 8 tasks
        writer(df, bootstrap, **options).mode("append").save()
    assert len(read_topic(bootstrap, topic, 2, 400)) == 400

    # The sink's producer config: the kafka.* options and the sink's batch.size default.
    config = {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "batch.size": str(SINK_BATCH_SIZE),
    }

    def stats(_):
        from kcore.spark import clients

        return json.dumps(clients.stats(config))

    # Python UDF tasks run in the same (reused) Python workers as the write tasks did.
    reports = spark.range(0, 16, 1, 16).select(udf(stats, "string", useArrow=False)(col("id")))
    reports = reports.collect()
    by_pid = {s["pid"]: s for s in (json.loads(r[0]) for r in reports)}
    assert sum(s["producers_lent"] for s in by_pid.values()) == 8
    assert all(s["producers_created"] <= 1 for s in by_pid.values()), by_pid
    assert sum(s["producers_created"] for s in by_pid.values()) <= 2  # local[2]: 2 workers
