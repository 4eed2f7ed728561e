"""The examples run as a user runs them: a subprocess, against the test cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(cluster, script: str, *args: str, timeout: float) -> str:
    """Run an example as a user would, against ``cluster``; its stdout, once it succeeded."""
    env = {**os.environ, "KCORE_BOOTSTRAP": cluster.bootstrap_servers}
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr[-4000:]}"
    return res.stdout


@pytest.mark.broker
@pytest.mark.slow
def test_spark_pipeline(kafka_cluster):
    out = run_example(
        kafka_cluster, "pipeline.py", "--rows", "20000", "--partitions", "3", timeout=400
    )
    assert "OK: 20,000 events written and read back by a batch and a streaming query" in out
    for phase in ("write (batch)", "read (batch)", "read (stream)"):
        assert any(line.startswith(phase) and "20,000" in line for line in out.splitlines()), out
    # maxOffsetsPerTrigger is a quarter of the rows: the stream ran in several micro-batches
    assert sum("micro-batch" in line for line in out.splitlines()) >= 4, out


@pytest.mark.broker
@pytest.mark.slow
def test_spark_pipeline_on_a_standalone_cluster(kafka_cluster):
    # The same job and checks, its executors on the workers of a cluster the example starts.
    out = run_example(
        kafka_cluster,
        "pipeline.py",
        "--rows",
        "20000",
        "--partitions",
        "3",
        "--spark",
        "standalone",
        timeout=400,
    )
    assert "Spark standalone cluster" in out and "starting Spark (spark://127.0.0.1:" in out, out
    assert "OK: 20,000 events written and read back by a batch and a streaming query" in out
    assert sum("micro-batch" in line for line in out.splitlines()) >= 4, out


@pytest.mark.broker
def test_roundtrip(kafka_cluster):
    out = run_example(
        kafka_cluster, "roundtrip.py", "--records", "20000", "--compression", "lz4", timeout=300
    )
    assert "produced 20,000 records" in out and "consumed 20,000 records" in out, out
    assert "OK: every record came back once" in out, out
