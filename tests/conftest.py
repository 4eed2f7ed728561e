"""Fixtures shared by several test modules (the cluster fixtures come from kcore's pytest
plugin)."""

from __future__ import annotations

import os
import subprocess
import time
import venv
from pathlib import Path

import pytest

from kcore.testing import KafkaCluster

# 10.255.255.1 is not routed from this machine: what a client outside the brokers' network
# sees when advertised.listeners names an internal address.
UNREACHABLE_HOST = "10.255.255.1"


@pytest.fixture(scope="session")
def unreachable_cluster():
    """One broker whose client listener advertises an address this machine cannot reach (as
    behind a NAT or a load balancer); its real port on 127.0.0.1 still works for bootstrap."""
    with KafkaCluster(1, advertised_host=UNREACHABLE_HOST) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory) -> Path:
    """A virtual environment's python with what Spark's Python workers need for kcore's data
    source (pyspark, pyarrow, numpy) but neither kcore nor cramjam: an executor that kcore
    reaches only by being shipped there.

    Installing pyspark (a ~450 MB wheel) takes ~10 s even from pip's cache and needs the index
    otherwise, so the packages are symlinked from this interpreter's site-packages instead."""
    import numpy
    import pyspark

    env_dir = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    ours = Path(pyspark.__file__).parent.parent
    for name in ("pyspark", "py4j", "pyarrow", "numpy", "numpy.libs"):
        if name == "numpy.libs" and not (ours / name).exists():
            continue  # numpy's bundled libraries: only some wheels have them
        (site / name).symlink_to(ours / name)
    assert Path(numpy.__file__).parent == ours / "numpy"
    check = "import pyspark, pyarrow, numpy\nfor m in ('kcore', 'cramjam'):\n" + (
        "    try:\n        __import__(m)\n    except ImportError:\n        pass\n"
        "    else:\n        raise SystemExit(m + ' is importable')"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK"))}
    subprocess.run([str(python), "-c", check], check=True, env=env)
    return python


def read_records(consumer, n: int, timeout: float = 60, poll_s: float = 0.5) -> list:
    """Poll ``consumer`` until it has returned ``n`` records or ``timeout`` passes; what it
    returned (the caller asserts on it)."""
    import time

    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += consumer.poll(poll_s)
    return got


def wait_stopped(pid: int, timeout: float = 10) -> None:
    """Until every thread of ``pid`` is stopped: a thread busy in the kernel (disk I/O) stops
    only when it gets out, and a request sent before then may still be answered (seen once
    on a loaded CI machine: the 'stopped' broker wrote and acknowledged a record)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue  # a thread that ended meanwhile
        if states and all(s in "tT" for s in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"broker {pid} did not stop within {timeout}s")
