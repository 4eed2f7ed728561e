"""Fixtures shared by several test modules (the cluster fixtures come from kcore's pytest
plugin)."""

from __future__ import annotations

import os
import subprocess
import time
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

from kcore.testing import KafkaCluster

# 10.255.255.1 is not routed from this machine: what a client outside the brokers' network
# sees when advertised.listeners names an internal address.
UNREACHABLE_HOST = "10.255.255.1"
ROOT = Path(__file__).resolve().parents[1]


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


@dataclass(frozen=True)
class KcoreDist:
    """What ``bash wheels/build.sh`` built: the sdist, a manylinux wheel per interpreter found
    (keyed by version, "3.12"), the one Spark bundle, and the interpreters it looked for and
    did not find."""

    directory: Path
    sdist: Path
    wheels: dict[str, Path]
    interpreters: dict[str, Path]
    missing: list[str]
    bundle: Path
    log: str


def build_interpreters() -> tuple[dict[str, Path], list[str]]:
    """The CPythons wheels/build.sh builds for, as it finds them (version → path), and those
    it does not find."""
    listing = subprocess.run(
        ["bash", str(ROOT / "wheels" / "build.sh"), "--interpreters"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    found: dict[str, Path] = {}
    missing: list[str] = []
    for line in filter(None, listing):
        version, where = line.split(" ", 1)
        if where == "missing":
            missing.append(version)
        else:
            found[version] = Path(where)
    return found, missing


@pytest.fixture(scope="session")
def kcore_dist(tmp_path_factory) -> KcoreDist:
    """The documented build, run once a session (it compiles a wheel per interpreter: about a
    minute and a half on two cores)."""
    out = tmp_path_factory.mktemp("dist")
    interpreters, missing = build_interpreters()
    run = subprocess.run(
        ["bash", str(ROOT / "wheels" / "build.sh"), str(out)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    wheels: dict[str, Path] = {}
    for version in interpreters:
        tag = "cp" + version.replace(".", "")
        found = list(out.glob(f"kcore-*-{tag}-{tag}-*.whl"))
        assert len(found) == 1, (version, sorted(p.name for p in out.iterdir()))
        wheels[version] = found[0]
    [sdist] = out.glob("kcore-*.tar.gz")
    [bundle] = out.glob("kcore-*-spark-*.zip")
    return KcoreDist(out, sdist, wheels, interpreters, missing, bundle, run.stderr)
