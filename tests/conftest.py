"""Fixtures shared by several test modules (the cluster fixtures come from kcore's pytest
plugin)."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from kcore.testing import KafkaCluster

ROOT = Path(__file__).resolve().parents[1]
# The interpreters of the multi-interpreter Spark bundle the tests build: this one and another
# (each gets a kcore wheel built, ~25 s, and cramjam's wheel), and one the bundle lacks.
THIS_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
OTHER_PYTHON = "3.12" if THIS_PYTHON != "3.12" else "3.11"
ABSENT_PYTHON = "3.10" if THIS_PYTHON != "3.10" else "3.13"

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


def cpython(version: str) -> Path:
    """A CPython ``version`` (``"3.12"``) on this machine: this interpreter, else pyenv's, else
    one on PATH. CI machines have 3.10 to 3.13, so a missing one fails the test."""
    if version == THIS_PYTHON:
        return Path(sys.executable)
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(pyenv.glob(f"{version}.*/bin/python{version}"))
    if found:
        return found[-1]
    on_path = shutil.which(f"python{version}")
    if on_path:
        return Path(on_path)
    pytest.fail(f"no CPython {version} on this machine (none under {pyenv}, none on PATH)")


def _build_outputs(directory: str, names: list[str]) -> set[str]:
    # What an in-place build left in the source tree: compiled modules, Cython's C, metadata.
    generated_c = {f"{n[:-4]}.c" for n in names if n.endswith(".pyx")}
    return {
        n
        for n in names
        if n in generated_c or n == "__pycache__" or n.endswith((".so", ".pyd", ".egg-info"))
    }


@pytest.fixture(scope="session")
def kcore_wheels(tmp_path_factory) -> dict[str, Path]:
    """kcore wheels built from this source tree for this interpreter and OTHER_PYTHON, as
    ``{"3.11": wheel, ...}``. Built at once, each from its own copy of the sources (a build
    writes its generated C and build directory into the tree it builds)."""
    out = tmp_path_factory.mktemp("kcore-wheels")
    builds = {}
    for version in (THIS_PYTHON, OTHER_PYTHON):
        tree = out / f"src-{version}"
        tree.mkdir()
        for name in ("pyproject.toml", "setup.py", "README.md"):
            shutil.copy2(ROOT / name, tree / name)
        shutil.copytree(ROOT / "src", tree / "src", ignore=_build_outputs)
        cmd = [str(cpython(version)), "-m", "pip", "wheel", "-q", "--no-deps", "-w"]
        builds[version] = subprocess.Popen(
            [*cmd, str(out / version), str(tree)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    wheels = {}
    for version, build in builds.items():
        output, _ = build.communicate(timeout=600)
        assert build.returncode == 0, output[-5000:]
        [wheels[version]] = (out / version).glob("kcore-*.whl")
    return wheels


@pytest.fixture(scope="session")
def cramjam_wheels(tmp_path_factory, kcore_wheels) -> dict[str, Path]:
    """The installed cramjam's version as wheels for the interpreters of ``kcore_wheels`` and
    this platform, from pip's cache or PyPI."""
    out = tmp_path_factory.mktemp("cramjam-wheels")
    version = importlib.metadata.version("cramjam")
    wheels = {}
    for python in kcore_wheels:
        dest = out / python
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps"]
            + ["--python-version", python, "-d", str(dest), f"cramjam=={version}"],
            check=True,
        )
        [wheels[python]] = dest.glob("cramjam-*.whl")
    return wheels


@pytest.fixture(scope="session")
def multi_bundle(tmp_path_factory, kcore_wheels, cramjam_wheels) -> Path:
    """One Spark bundle for the interpreters of ``kcore_wheels``, built as wheels/build.sh
    builds it: by the builder run as a script, without kcore installed."""
    out = tmp_path_factory.mktemp("multi-bundle")
    cmd = [sys.executable, "-I", str(ROOT / "src" / "kcore" / "spark" / "bundle.py"), "-o"]
    cmd.append(str(out))
    for python in kcore_wheels:
        cmd += ["--kcore-wheel", str(kcore_wheels[python])]
        cmd += ["--cramjam-wheel", str(cramjam_wheels[python])]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return Path(res.stdout.strip())
