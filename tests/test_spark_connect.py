"""kcore's data source under Spark Connect. ``kcore.spark.register`` ships the driver's kcore
to the session with ``addArtifacts`` (once, however often it is called), and a batch write and
a batch read (headers included) run on Python workers that have no kcore of their own (the bare
environment of the spark-submit tests). Streaming reads and writes run where the server's
Python has kcore: Spark 4.2 does not put a Connect session's artifacts on the path of a
streaming query's Python processes (the driver-side one that plans a streaming source, the
tasks of a streaming write: ``ModuleNotFoundError: kcore``), so a streaming query cannot rely on
the shipped bundle (docs/spark.md says so).

The client runs in a child process: ``SparkSession.builder.remote("local[2]")`` starts a local
Spark Connect server in that process's JVM and switches PySpark to Connect mode there, which
must not leak into the other Spark tests' classic sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from kcore import AdminClient
from kcore.admin import NewTopic
from kcore.codec import partition_for_key

pytestmark = [pytest.mark.slow, pytest.mark.broker]

APP = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import udf
    import kcore.spark
    from kcore.spark import shipping

    bootstrap, topic = sys.argv[1], sys.argv[2]
    spark = (
        SparkSession.builder.remote("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    assert shipping._is_connect(spark), type(spark)
    kcore.spark.register(spark)
    kcore.spark.register(spark)  # twice: added once
    shipped = sorted(name for _, name in shipping._shipped_to_connect)


    @udf("string")
    def where_kcore(_):
        import sys
        import kcore, kcore._codec
        return json.dumps([sys.executable, kcore.__file__, kcore._codec.__file__])


    probes = [json.loads(r[0]) for r in spark.range(2).select(where_kcore("id")).collect()]

    rows = [(f"k{i % 7}", f"value {i}", [("n", f"{i}".encode())]) for i in range(300)]
    schema = "key string, value string, headers array<struct<key: string, value: binary>>"
    (
        spark.createDataFrame(rows, schema)
        .write.format("kcore")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    read = (
        spark.read.format("kcore")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
        .selectExpr("CAST(key AS STRING) k", "CAST(value AS STRING) v", "headers", "partition")
        .collect()
    )
    streamed = []
    if "--streaming" in sys.argv:
        query = (
            spark.readStream.format("kcore")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("key", "value", "partition")
            .writeStream.format("kcore")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic + "-copy")
            .option("checkpointLocation", "checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        assert query.exception() is None, query.exception()
        streamed = [
            r.v
            for r in spark.read.format("kcore")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic + "-copy")
            .load()
            .selectExpr("CAST(value AS STRING) v")
            .collect()
        ]
    out = {
        "shipped": shipped,
        "probes": probes,
        "read": [[r.k, r.v, [[h.key, h.value.decode()] for h in r.headers], r.partition]
                 for r in read],
        "streamed": streamed,
    }
    print("RESULT " + json.dumps(out))
    spark.stop()
    """
)


def _run(bootstrap: str, tmp_path: Path, python: Path, *flags: str) -> dict:
    """Run APP with ``python`` as the Python workers' interpreter; its RESULT."""
    topic = f"connect-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 3, 1), NewTopic(topic + "-copy", 3, 1)])
    script = tmp_path / "app.py"
    script.write_text(APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK", "SPARK"))}
    env.update(
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=sys.executable,
        KCORE_BUNDLE_CACHE=str(tmp_path / "cache"),
    )
    res = subprocess.run(
        [sys.executable, str(script), bootstrap, topic, *flags],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=420,
    )
    lines = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert res.returncode == 0 and lines, res.stdout[-3000:] + res.stderr[-6000:]
    out: dict = json.loads(lines[0].removeprefix("RESULT "))
    return out


SENT = {f"value {i}": (f"k{i % 7}", [["n", str(i)]]) for i in range(300)}


def _check_batch(out: dict, python: Path) -> None:
    [shipped] = out["shipped"]
    assert shipped.startswith("kcore-") and shipped.endswith(".zip")
    for worker_python, kcore_file, codec_file in out["probes"]:
        assert worker_python == str(python)
        assert f"{shipped}/kcore/__init__.py" in kcore_file  # the shipped zip comes first
        assert Path(codec_file).suffix == ".so"
    got = {v: (k, headers) for k, v, headers, _ in out["read"]}
    assert len(out["read"]) == 300 and got == SENT
    # Keyed rows land where the Java client puts them.
    assert all(p == partition_for_key(k.encode(), 3) for k, _, _, p in out["read"])


def test_batch_read_and_write_on_workers_without_kcore(kafka_cluster, bare_python, tmp_path):
    out = _run(kafka_cluster.bootstrap_servers, tmp_path, bare_python)
    _check_batch(out, bare_python)


def test_streaming_read_and_write(kafka_cluster, tmp_path):
    python = Path(sys.executable)  # the server's Python has kcore (see the module's docstring)
    out = _run(kafka_cluster.bootstrap_servers, tmp_path, python, "--streaming")
    _check_batch(out, python)
    assert sorted(out["streamed"]) == sorted(SENT)
