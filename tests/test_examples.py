"""The examples run as a user runs them: a subprocess, against the test cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.broker
@pytest.mark.slow
def test_spark_pipeline(kafka_cluster):
    env = {**os.environ, "KCORE_BOOTSTRAP": kafka_cluster.bootstrap_servers}
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / "pipeline.py"), "--rows", "20000", "--partitions", "3"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = res.stdout
    assert res.returncode == 0, f"exit {res.returncode}\n{out}\n{res.stderr[-4000:]}"
    assert "OK: 20,000 events written and read back by a batch and a streaming query" in out
    for phase in ("write (batch)", "read (batch)", "read (stream)"):
        assert any(line.startswith(phase) and "20,000" in line for line in out.splitlines()), out
    # maxOffsetsPerTrigger is a quarter of the rows: the stream ran in several micro-batches
    assert sum("micro-batch" in line for line in out.splitlines()) >= 4, out


@pytest.mark.broker
def test_roundtrip(kafka_cluster):
    env = {**os.environ, "KCORE_BOOTSTRAP": kafka_cluster.bootstrap_servers}
    res = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "roundtrip.py"),
            "--records",
            "20000",
            "--compression",
            "lz4",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = res.stdout
    assert res.returncode == 0, f"exit {res.returncode}\n{out}\n{res.stderr[-4000:]}"
    assert "produced 20,000 records" in out and "consumed 20,000 records" in out, out
    assert "OK: every record came back once" in out, out
