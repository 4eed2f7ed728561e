"""Fixtures shared by several test modules (the cluster fixtures come from kcore's pytest
plugin)."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

import kcore
from kcore import _bundle_loader
from kcore.testing import KafkaCluster, jars

ROOT = Path(__file__).resolve().parents[1]
# The interpreters of the multi-interpreter Spark bundle the tests build from the documented
# build's wheels: this one and another (with cramjam's wheels), and one the bundle lacks.
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


def kcoreless_venv(
    env_dir: Path, base_python: Path, linked: tuple[str, ...], pins: tuple[str, ...] = ()
) -> Path:
    """A virtual environment of ``base_python`` at ``env_dir`` with neither kcore nor cramjam:
    the packages ``linked`` symlinked from this interpreter's site-packages (pure Python ones,
    or compiled ones when it is this interpreter), ``pins`` installed by pip. Its python."""
    subprocess.run(
        [str(base_python), "-m", "venv", *([] if pins else ["--without-pip"]), str(env_dir)],
        check=True,
    )
    python = env_dir / "bin" / "python"
    env = clean_env()
    if pins:
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins],
            check=True,
            env=env,
        )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout.strip()
    )
    import pyspark

    ours = Path(pyspark.__file__).parent.parent
    for name in linked:
        if name == "numpy.libs" and not (ours / name).exists():
            continue  # numpy's bundled libraries: only some wheels have them
        (site / name).symlink_to(ours / name)
    version = subprocess.run(
        [str(base_python), "-c", "import sys; print(sys.version_info[:2])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    check = (
        "import sys, pyspark, pyarrow, numpy\n"
        f"assert sys.version_info[:2] == {version}\n"
        "for m in ('kcore', 'cramjam'):\n"
        "    try:\n        __import__(m)\n    except ImportError:\n        pass\n"
        "    else:\n        raise SystemExit(m + ' is importable')"
    )
    subprocess.run([str(python), "-c", check], check=True, env=env)
    return python


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory) -> Path:
    """A virtual environment's python with what Spark's Python workers need for kcore's data
    source (pyspark, pyarrow, numpy) but neither kcore nor cramjam: an executor that kcore
    reaches only by being shipped there.

    Installing pyspark (a ~450 MB wheel) takes ~10 s even from pip's cache and needs the index
    otherwise, so the packages are symlinked from this interpreter's site-packages instead."""
    import numpy
    import pyspark

    assert Path(numpy.__file__).parent.parent == Path(pyspark.__file__).parent.parent
    return kcoreless_venv(
        tmp_path_factory.mktemp("bare-venv"),
        Path(sys.executable),
        ("pyspark", "py4j", "pyarrow", "numpy", "numpy.libs"),
    )


@pytest.fixture(scope="session")
def other_bare_python(tmp_path_factory) -> Path:
    """As ``bare_python``, on OTHER_PYTHON: a Spark driver and executors of another interpreter
    than this one, with neither kcore nor cramjam. pyspark and py4j are pure Python and linked
    from here; pyarrow and numpy are compiled, so pip installs this environment's versions of
    them for that interpreter (from pip's cache or the index)."""
    import numpy
    import pyarrow

    return kcoreless_venv(
        tmp_path_factory.mktemp("other-bare-venv"),
        cpython(OTHER_PYTHON),
        ("pyspark", "py4j"),
        pins=(f"pyarrow=={pyarrow.__version__}", f"numpy=={numpy.__version__}"),
    )


@pytest.fixture(scope="session")
def spark_bundle(tmp_path_factory) -> Path:
    """The Spark bundle of the kcore under test, built as a user builds it."""
    out = tmp_path_factory.mktemp("bundle")
    res = subprocess.run(
        [sys.executable, "-m", "kcore.spark.bundle", "-o", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    path = Path(res.stdout.strip())
    python_tag, platform_tag = _bundle_loader.current_tags()
    assert path.name == f"kcore-{kcore.__version__}-spark-{python_tag}-{platform_tag}.zip"
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what decides what a Python imports or which Python PySpark
    runs (PYTHON*, PYSPARK*), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK"))}
    return {**env, **extra}


MURMUR2_21 = -973932308  # Java's Utils.murmur2("21".getBytes())

# What executors report: where kcore, its compiled modules and cramjam came from, and that they
# work.
PROBE = textwrap.dedent(
    """
    import json, os, sys


    def probe(_=None):
        import kcore
        import kcore._codec as c
        import kcore.codec as pub
        import kcore.producer._sendpath as sendpath
        import kcore.protocol._decoders as decoders
        import kcore.cluster._metadata_apply as metadata_apply
        import kcore.consumer.share._acknowledge as share_acknowledge
        import kcore._metrics as metrics

        cramjam = sys.modules["cramjam"]  # the codec's (a bundle's serves it once kcore loads)

        data = b"kcore " * 1000
        return json.dumps({
            "python": sys.executable,
            "kcore": kcore.__file__,
            "codec": c.__file__,
            "sendpath": sendpath.__file__,
            "decoders": decoders.__file__,
            "metadata_apply": metadata_apply.__file__,
            "share_acknowledge": share_acknowledge.__file__,
            "metrics": metrics.__file__,
            "cramjam": cramjam.__file__,
            "zstd": pub.decompress("zstd", pub.compress("zstd", data)) == data,
            "lz4": pub.decompress("lz4", pub.compress("lz4", data)) == data,
            "murmur2": pub.murmur2(b"21"),
        })


    def run_probes(spark, data_source=True):
        rdd = spark.sparkContext.parallelize(range(2), 2).map(probe).collect()
        source = data_source and probe_data_source(spark)
        print("PROBES " + json.dumps({"rdd": rdd, "source": source or [], "driver": probe()}))


    def probe_data_source(spark):
        from pyspark.sql.datasource import DataSource, DataSourceReader

        class ProbeReader(DataSourceReader):
            def read(self, partition):
                yield (probe(),)

        class Probe(DataSource):
            @classmethod
            def name(cls):
                return "kcoreprobe"

            def schema(self):
                return "probe string"

            def reader(self, schema):
                return ProbeReader()

        # Registered after kcore's: a Python data source sees the files added before it was.
        spark.dataSource.register(Probe)
        return [row.probe for row in spark.read.format("kcoreprobe").load().collect()]
    """
)


def check_executor_probe(raw: str, cache: Path, bundle_name: str, python: Path) -> None:
    """``raw`` (what PROBE's ``probe`` returned) says: run by ``python``, kcore imported from
    the bundle ``bundle_name``, its compiled modules and cramjam extracted to ``cache``, and
    working."""
    p = json.loads(raw)
    assert p["python"] == str(python)
    assert f"{bundle_name}/kcore/__init__.py" in p["kcore"]  # imported from the zip
    codec = Path(p["codec"])
    # The compiled codec, extracted to the cache, in a directory named by its content hash.
    assert codec.suffix == ".so" and codec.parent.parent == cache, codec
    assert codec.parent.name.startswith("kcore._codec-")
    # The producer's compiled module (it cimports the codec), extracted alike.
    sendpath = Path(p["sendpath"])
    assert sendpath.suffix == ".so" and sendpath.parent.parent == cache, sendpath
    assert sendpath.parent.name.startswith("kcore.producer._sendpath-")
    for key, module in (
        ("decoders", "kcore.protocol._decoders"),
        ("metadata_apply", "kcore.cluster._metadata_apply"),
        ("share_acknowledge", "kcore.consumer.share._acknowledge"),
        ("metrics", "kcore._metrics"),
    ):
        path = Path(p[key])
        assert path.suffix == ".so" and path.parent.parent == cache, path
        assert path.parent.name.startswith(module + "-")
    assert Path(p["cramjam"]).parent.parent == cache and Path(p["cramjam"]).parent.name.startswith(
        "cramjam-"
    )
    assert p["zstd"] and p["lz4"]
    assert p["murmur2"] == MURMUR2_21


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


@functools.cache
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


def cpython(version: str) -> Path:
    """A CPython ``version`` (``"3.12"``) on this machine, found as wheels/build.sh finds it.
    CI machines have 3.10 to 3.13, so a missing one fails the test."""
    if version == THIS_PYTHON:
        return Path(sys.executable)
    found, _ = build_interpreters()
    if version not in found:
        pytest.fail(f"no CPython {version} on this machine (wheels/build.sh --interpreters)")
    return found[version]


@pytest.fixture(scope="session")
def kcore_wheels(kcore_dist: KcoreDist) -> dict[str, Path]:
    """The documented build's kcore wheels for this interpreter and OTHER_PYTHON, as
    ``{"3.11": wheel, ...}``: the interpreters of the multi-interpreter bundle tests build,
    which lacks ABSENT_PYTHON."""
    for version in (THIS_PYTHON, OTHER_PYTHON):
        if version not in kcore_dist.wheels:
            pytest.fail(f"wheels/build.sh built no wheel for CPython {version}: {kcore_dist.log}")
    return {v: kcore_dist.wheels[v] for v in (THIS_PYTHON, OTHER_PYTHON)}


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


# How long a share group member may take to print the records it was given.
SHARE_WAIT_S = 90.0


class ShareMember:
    """A member of a share group: Kafka's ConsoleShareConsumer in a JVM of its own, each record
    it prints one line (it acknowledges each record it printed, as it polls again). ``stop``
    ends it with SIGTERM: its shutdown hook closes the consumer, which leaves the group."""

    MAIN = "org.apache.kafka.tools.consumer.ConsoleShareConsumer"

    def __init__(
        self, bootstrap: str, topic: str, group: str, extra_args: Sequence[str] = ()
    ) -> None:
        libs = jars.kafka_libs()
        self.proc = subprocess.Popen(
            [
                jars.java_executable(),
                "-Xmx192m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                f"-Dlog4j2.configurationFile={jars.tools_log4j2_config()}",
                "-cp",
                str(libs / "*"),
                self.MAIN,
                "--bootstrap-server",
                bootstrap,
                "--topic",
                topic,
                "--group",
                group,
                *extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.records: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        stdout = self.proc.stdout

        def read() -> None:
            for line in stdout:
                self.records.put(line.rstrip("\n"))

        threading.Thread(target=read, daemon=True).start()
        self.read: list[str] = []

    def wait_for_records(self, n: int) -> list[str]:
        """The first ``n`` records it printed, waiting for them."""
        deadline = time.monotonic() + SHARE_WAIT_S
        while len(self.read) < n:
            left = deadline - time.monotonic()
            assert left > 0 and self.proc.poll() is None, (
                f"the share consumer printed {len(self.read)} of {n} records "
                f"(exit status {self.proc.poll()})"
            )
            try:
                self.read.append(self.records.get(timeout=min(left, 1.0)))
            except queue.Empty:
                continue
        return self.read[:n]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def share_members():
    started: list[ShareMember] = []

    def start(
        bootstrap: str, topic: str, group: str, extra_args: Sequence[str] = ()
    ) -> ShareMember:
        member = ShareMember(bootstrap, topic, group, extra_args)
        started.append(member)
        return member

    yield start
    for member in started:
        member.stop()
