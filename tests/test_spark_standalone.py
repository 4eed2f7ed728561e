"""kcore's Spark data source on a real Spark standalone cluster (``kcore.testing.SparkCluster``:
a master and two workers, each its own JVM; the session-scoped ``spark_cluster`` fixture), not
``local[N]``. Its executors run a virtual environment without kcore or cramjam (the
``bare_python`` fixture), so kcore reaches them only by being shipped: by
``kcore.spark.register`` (a session in this process, and a streaming application), or as the
Spark bundle on ``spark-submit --py-files`` alone. Against a real broker: a batch write read
back by a batch read; a streaming query (kcore to kcore) stopped, then restarted from its
checkpoint by another application, reading only the new records, nothing lost or duplicated.
Also: a cluster that cannot start says why, and mismatched Pythons are refused."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import OTHER_PYTHON, PROBE, check_executor_probe

import kcore
import kcore.spark
from kcore.testing import SparkCluster
from kcore.testing.errors import ClusterError, ClusterStartError

pytestmark = [pytest.mark.slow, pytest.mark.broker]

PARTITIONS = 3


def probes() -> dict[str, Any]:
    """PROBE's functions, defined in a module of their own that executors do not have: Spark
    pickles them by value."""
    namespace: dict[str, Any] = {"__name__": "kcore_standalone_probe"}
    exec(PROBE, namespace)
    return namespace


@pytest.fixture(scope="module")
def bundle_cache(tmp_path_factory) -> Path:
    """Where executors (and the driver's Python planners) extract the bundle's compiled files."""
    return tmp_path_factory.mktemp("bundle-cache")


@pytest.fixture(scope="module")
def spark(spark_cluster, bare_python, bundle_cache):
    """A session in this process whose executors are the cluster's, running ``bare_python``;
    ``register`` ships kcore to them (a cluster master: always)."""
    session = spark_cluster.session(
        "kcore-standalone",
        executor_python=bare_python,
        conf={
            "spark.executorEnv.KCORE_BUNDLE_CACHE": str(bundle_cache),
            "spark.sql.shuffle.partitions": "2",
        },
    )
    try:
        session.sparkContext.setLogLevel("WARN")
        kcore.spark.register(session)
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def bootstrap(kafka_cluster) -> str:
    return kafka_cluster.bootstrap_servers


def new_topic(cluster: Any, partitions: int = PARTITIONS) -> str:
    name = f"standalone-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(name, partitions, 1)
    return name


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    with kcore.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as producer:
        futures = [producer.send(topic, v.encode(), key=v.encode()) for v in values]
        producer.flush(30)
        for f in futures:
            f.result(30)


def read_topic(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Any]:
    """Every record of ``topic``: polls until ``expected`` arrived, then a little longer, so
    that a duplicate would be seen too."""
    with kcore.Consumer({"bootstrap.servers": bootstrap}) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        for p in range(partitions):
            consumer.seek((topic, p), 0)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(0.5)
        records += consumer.poll(0.5)
        return records


def test_register_ships_kcore_to_the_clusters_executors(spark, spark_cluster, bare_python):
    [shipped] = [f for f in spark.sparkContext.listFiles if f.endswith(".zip")]
    name = shipped.rsplit("/", 1)[-1]
    probe = probes()
    rdd = spark.sparkContext.parallelize(range(4), 4).map(probe["probe"]).collect()
    source = probe["probe_data_source"](spark)
    assert len(rdd) == 4 and len(source) == 1
    cache = Path(spark.conf.get("spark.executorEnv.KCORE_BUNDLE_CACHE"))
    for raw in rdd + source:
        check_executor_probe(raw, cache, name, bare_python)
    # The application's executors are the cluster's: one on each worker.
    [app] = [a for a in spark_cluster.state()["activeapps"] if a["name"] == "kcore-standalone"]
    assert app["cores"] == spark_cluster.workers, app


def test_a_cluster_that_cannot_start_says_why(spark, tmp_path):
    # Run while the module's session is up: starting JVMs here must leave it working (the tests
    # after this one use it).
    with pytest.raises(ClusterStartError, match="is not a Spark distribution"):
        SparkCluster(1, spark_home=tmp_path).start()
    # A worker that refuses its settings: the error shows its log, and nothing is left running.
    cluster = SparkCluster(1, memory_per_worker="lots", work_dir=tmp_path / "bad")
    with pytest.raises(ClusterStartError) as err:
        cluster.start()
    assert "worker-1 exited with status" in str(err.value)
    assert err.value.log_path == tmp_path / "bad" / "worker-1.log"
    assert "Last lines of" in str(err.value) and "--memory" in str(err.value), err.value
    assert cluster.failed and not any(d.is_running() for d in cluster.daemons)
    assert os.path.exists(err.value.log_path)  # kept after a failure


def test_batch_write_then_read_round_trip(spark, kafka_cluster, bootstrap):
    topic = new_topic(kafka_cluster)
    rows = 3000
    df = spark.range(0, rows, 1, 4).selectExpr(
        "CAST(id AS STRING) AS key",
        "CAST(concat('value-', CAST(id AS STRING)) AS BINARY) AS value",
        f"CAST(id % {PARTITIONS} AS INT) AS partition",
    )
    (
        df.write.format("kcore")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    back = (
        spark.read.format("kcore")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .selectExpr("CAST(key AS STRING) AS key", "value", "partition", "offset")
        .collect()
    )
    assert Counter((r.key, bytes(r.value), r.partition) for r in back) == Counter(
        (str(i), f"value-{i}".encode(), i % PARTITIONS) for i in range(rows)
    )
    for p in range(PARTITIONS):  # each offset of each partition once
        offsets = sorted(r.offset for r in back if r.partition == p)
        assert offsets == list(range(len(offsets))), p


STREAM_APP = (
    PROBE
    + """
import sys

from pyspark.sql import SparkSession

import kcore.spark

bootstrap, source, sink, checkpoint, trigger = sys.argv[1:6]
spark = SparkSession.builder.getOrCreate()
kcore.spark.register(spark)  # ships the bundle this driver runs from to the executors
writer = (
    spark.readStream.format("kcore")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", source)
    .option("startingOffsets", "earliest")
    .load()
    .selectExpr("key", "value")
    .writeStream.format("kcore")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("topic", sink)
    .option("checkpointLocation", checkpoint)
)
if trigger == "processingTime":  # runs until stopped, as a long-lived query does
    query = writer.trigger(processingTime="1 second").start()
    query.processAllAvailable()
    query.stop()
else:
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
assert query.exception() is None, query.exception()
print("ROWS " + json.dumps(sum(p["numInputRows"] for p in query.recentProgress)))
run_probes(spark, data_source=False)
spark.stop()
"""
)


def submit(cluster: SparkCluster, app: str, tmp_path: Path, *args: str, **kwargs: Any) -> dict:
    """Run ``app`` with spark-submit on ``cluster``; the JSON of its ``KEY json`` lines."""
    script = tmp_path / "app.py"
    script.write_text(app)
    res = cluster.submit(script, *args, cwd=tmp_path, timeout=300, **kwargs)
    assert res.returncode == 0, res.stderr[-6000:]
    out = {}
    for line in res.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key.isupper() and value[:1] in "[{0123456789":
            out[key] = json.loads(value)
    assert "PROBES" in out, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def test_streaming_query_restarts_from_its_checkpoint(
    spark_cluster, kafka_cluster, bootstrap, bare_python, spark_bundle, tmp_path
):
    # Spark runs a Python streaming source's planner on the driver with the executors' Python
    # and the driver's PYTHONPATH, without the files addPyFile (or --py-files) added: kcore must
    # be importable there, here by the bundle on PYTHONPATH. Executors get it from register.
    source, sink = new_topic(kafka_cluster), new_topic(kafka_cluster)
    checkpoint = str(tmp_path / "checkpoint")
    cache = tmp_path / "cache"
    options: dict[str, Any] = {
        "executor_python": bare_python,
        "driver_python": bare_python,
        "conf": {"spark.executorEnv.KCORE_BUNDLE_CACHE": str(cache)},
        "env": {"PYTHONPATH": str(spark_bundle), "KCORE_BUNDLE_CACHE": str(cache)},
    }
    first = [f"first-{i}" for i in range(600)]
    produce(bootstrap, source, first)
    args = (bootstrap, source, sink, checkpoint)
    run1 = submit(spark_cluster, STREAM_APP, tmp_path, *args, "processingTime", **options)
    assert run1["ROWS"] == len(first)

    second = [f"second-{i}" for i in range(400)]
    produce(bootstrap, source, second)
    run2 = submit(spark_cluster, STREAM_APP, tmp_path, *args, "availableNow", **options)
    assert run2["ROWS"] == len(second)  # only what came after the checkpoint

    got = read_topic(bootstrap, sink, PARTITIONS, len(first) + len(second))
    assert Counter(r.value.decode() for r in got) == Counter(first + second)  # once each
    for raw in run1["PROBES"]["rdd"] + run2["PROBES"]["rdd"]:
        check_executor_probe(raw, cache, spark_bundle.name, bare_python)


PY_FILES_APP = (
    PROBE
    + """
import sys

from pyspark.sql import SparkSession

bootstrap, topic = sys.argv[1:3]
spark = SparkSession.builder.getOrCreate()
# kcore came with --py-files: register only registers the data source, it ships nothing
spark.conf.set("spark.kcore.shipToExecutors", "false")
import kcore.spark

kcore.spark.register(spark)
print("FILES " + json.dumps(spark.sparkContext.listFiles))
(
    spark.range(0, 500, 1, 2)
    .selectExpr("CAST(id AS STRING) AS value")
    .write.format("kcore")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("topic", topic)
    .mode("append")
    .save()
)
back = (
    spark.read.format("kcore")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", topic)
    .load()
    .selectExpr("CAST(value AS STRING) AS value")
)
print("VALUES " + json.dumps(sorted(int(r.value) for r in back.collect())))
run_probes(spark)
spark.stop()
"""
)


def run_py_files_app(
    spark_cluster: SparkCluster,
    kafka_cluster: Any,
    bootstrap: str,
    python: Path,
    bundle: Path,
    tmp_path: Path,
) -> list[str]:
    """PY_FILES_APP with its driver and executors on ``python`` (which has no kcore) and
    ``bundle`` on ``--py-files``, checked: only the bundle shipped, the records round trip,
    every probe ran kcore from the bundle. The probes' raw reports."""
    topic = new_topic(kafka_cluster, partitions=2)
    cache = tmp_path / "cache"
    out = submit(
        spark_cluster,
        PY_FILES_APP,
        tmp_path,
        bootstrap,
        topic,
        executor_python=python,
        driver_python=python,
        py_files=[bundle],
        conf={"spark.executorEnv.KCORE_BUNDLE_CACHE": str(cache)},
        env={"KCORE_BUNDLE_CACHE": str(cache)},
    )
    [shipped] = out["FILES"]
    assert shipped.endswith("/" + bundle.name)  # what --py-files added, and only that
    assert out["VALUES"] == list(range(500))
    probes = out["PROBES"]
    assert len(probes["rdd"]) == 2 and len(probes["source"]) == 1
    reports = probes["rdd"] + probes["source"] + [probes["driver"]]
    for raw in reports:
        check_executor_probe(raw, cache, bundle.name, python)
    return reports


def test_py_files_bundle_only(
    spark_cluster, kafka_cluster, bootstrap, bare_python, spark_bundle, tmp_path
):
    # Neither the driver's Python nor the executors' has kcore: only the bundle brings it.
    run_py_files_app(spark_cluster, kafka_cluster, bootstrap, bare_python, spark_bundle, tmp_path)


def test_executor_python_of_another_version_is_refused(spark_cluster, tmp_path):
    other = tmp_path / "python"
    other.write_text("#!/bin/sh\necho 3.99\n")
    other.chmod(other.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(ClusterError, match=r"is 3\.99, the driver's .* PySpark needs the same"):
        spark_cluster.session("refused", executor_python=other)
    with pytest.raises(ClusterError, match=r"is 3\.99, the driver's"):
        spark_cluster.submit(
            tmp_path / "app.py", executor_python=other, driver_python=sys.executable
        )


def test_another_interpreter_runs_the_one_bundle_for_all(
    spark_cluster, kafka_cluster, bootstrap, other_bare_python, kcore_dist, tmp_path
):
    # An application whose driver and executors run OTHER_PYTHON (PySpark wants one minor
    # version on both sides), neither with kcore nor cramjam, gets kcore from the bundle that
    # wheels/build.sh made for every interpreter it found: the loader picks that interpreter's
    # compiled modules and cramjam out of it.
    reports = run_py_files_app(
        spark_cluster, kafka_cluster, bootstrap, other_bare_python, kcore_dist.bundle, tmp_path
    )
    tag = OTHER_PYTHON.replace(".", "")
    for raw in reports:
        assert f".cpython-{tag}-" in json.loads(raw)["codec"]
