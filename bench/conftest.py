"""Fixtures, seed data and pytest-benchmark settings for the codec benchmarks.

Run on its own (``pyproject.toml``'s ``testpaths = ["tests"]`` keeps it out of plain ``pytest``):

    pytest bench/test_codec_bench.py --benchmark-json=out.json
    python bench/report.py out.json

Every data set is built once per session from a fixed seed, outside any timed region.
"""

from __future__ import annotations

import os

# numpy's OpenBLAS starts worker threads that spin for a while after any BLAS call, taking one
# of this machine's two cores from the code under test; nothing here needs threaded BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import platform  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from importlib import metadata  # noqa: E402

import numpy as np  # noqa: E402
import pytest
from _workload import CODECS, CRC_BUFFER_SIZE, KEY_SIZE, N_RECORDS, SEED, VALUE_SIZE, Workload
from _workload import build as build_workload

from kcore.codec import RecordBatchBuilder, crc32c_implementation

# pytest-benchmark settings that keep the suite to a few minutes on a 2-core machine: at least
# 5 rounds of everything, and no more than ~0.5 s of rounds for the fast ones. Each applies
# only when the command line (or PYTEST_ADDOPTS) does not set it.
BENCH_DEFAULTS = {
    "benchmark_min_rounds": ("--benchmark-min-rounds", 5),
    "benchmark_max_time": ("--benchmark-max-time", 0.5),
    "benchmark_sort": ("--benchmark-sort", "name"),
}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Apply BENCH_DEFAULTS before pytest-benchmark reads its options."""
    given = list(config.invocation_params.args) + shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    for dest, (flag, value) in BENCH_DEFAULTS.items():
        if not hasattr(config.option, dest):
            continue  # pytest-benchmark is not loaded
        if any(arg == flag or arg.startswith(flag + "=") for arg in given):
            continue
        setattr(config.option, dest, value)
    # kafka-python's protocol schemas use importlib.resources' deprecated read_text/open_text.
    config.addinivalue_line(
        "filterwarnings", r"ignore:(read|open)_text is deprecated:DeprecationWarning"
    )
    compile_kcore()


def compile_kcore() -> None:
    """kcore's bytecode written once, as pip writes it when it installs the wheel (and as the
    peers' installed packages have theirs). From a source checkout run with
    PYTHONDONTWRITEBYTECODE, each benchmark child process would otherwise compile the modules
    kcore imports on first use (the protocol messages of its first requests) inside its timed
    part: ~12 ms of CPU a share-group member."""
    import compileall

    import kcore

    compileall.compile_dir(os.path.dirname(kcore.__file__), quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run each benchmark group's members back to back (groups in file order), so what the
    report compares was measured minutes apart at most, not across the whole session."""
    first_seen: dict[str, int] = {}

    def group_of(item: pytest.Item) -> str:
        marker = item.get_closest_marker("benchmark")
        return marker.kwargs.get("group", "") if marker is not None else ""

    for item in items:
        first_seen.setdefault(group_of(item), len(first_seen))
    items.sort(key=lambda item: first_seen[group_of(item)])  # stable: file order within a group


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """Record what report.py prints about the machine and the implementations measured."""
    try:
        import aiokafka.record.default_records as aiokafka_records

        aiokafka_builder = aiokafka_records.DefaultRecordBatchBuilder.__module__
    except ImportError:
        aiokafka_builder = "not installed"
    try:
        import kafka.codec as kafka_codec

        kafka_codecs = [c for c in CODECS[1:] if getattr(kafka_codec, f"has_{c}")()]
    except ImportError:
        kafka_codecs = []
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    machine_info["kcore_bench"] = {
        "nproc": len(affinity) if affinity is not None else os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "kcore_crc32c": crc32c_implementation(),
        "aiokafka_builder_module": aiokafka_builder,
        "kafka_python_codecs": ["none", *kafka_codecs],
        "versions": {
            dist: _version(dist)
            for dist in (
                "kcore",
                "aiokafka",
                "kafka-python",
                "confluent-kafka",
                "cramjam",
                "lz4",
                "python-snappy",
                "zstandard",
                "crc32c",
                "google-crc32c",
                "numpy",
                "pyarrow",
                "pytest-benchmark",
            )
        },
        "workload": {
            "records": N_RECORDS,
            "key_size": KEY_SIZE,
            "value_size": VALUE_SIZE,
            "crc_buffer_bytes": CRC_BUFFER_SIZE,
            "seed": SEED,
        },
        # bench/test_cluster_bench.py: which broker and which librdkafka were measured
        "kafka_broker": _kafka_broker(),
        "librdkafka": _librdkafka(),
    }


def _kafka_broker() -> str:
    from kcore.testing.versions import KAFKA_VERSION

    external = os.environ.get("KCORE_BOOTSTRAP", "").strip()
    if external:
        return f"external ({external})"
    if os.environ.get("KCORE_TEST_BROKER", "").strip().lower() == "docker":
        return "docker (kcore.testing.docker)"
    return f"Apache Kafka {KAFKA_VERSION}, 1 KRaft node on 127.0.0.1 (kcore.testing)"


def _librdkafka() -> str:
    try:
        import confluent_kafka
    except ImportError:
        return "not installed"
    return confluent_kafka.libversion()[0]


@pytest.fixture(scope="session")
def workload() -> Workload:
    return build_workload()


@pytest.fixture(scope="session")
def batches(workload: Workload) -> dict[str, bytes]:
    """One v2 batch per codec holding the whole workload, built by kcore and checked against
    aiokafka's decoder: the input every decode benchmark reads."""
    from _checks import check_encoded

    out = {}
    for codec in CODECS:
        builder = RecordBatchBuilder(codec)
        builder.append_many(workload.keys, workload.values, workload.timestamps)
        buf = builder.build()
        check_encoded(buf, codec, workload)
        out[codec] = buf
    return out


@pytest.fixture(scope="session")
def crc_buffer() -> bytes:
    return np.random.default_rng(SEED + 1).bytes(CRC_BUFFER_SIZE)


@pytest.fixture(scope="session")
def crc_expected(crc_buffer: bytes) -> int:
    """CRC32C of the buffer by google-crc32c (an independent implementation), itself checked
    against the standard check value."""
    import google_crc32c

    assert google_crc32c.value(b"123456789") == 0xE3069283
    return google_crc32c.value(crc_buffer)


@pytest.fixture(scope="session")
def murmur2_expected(workload: Workload) -> list[int]:
    """murmur2 of every key as an unsigned 32-bit int, by kafka-python's pure-Python port of
    the Java client's Utils.murmur2 (independent of kcore)."""
    from kafka.partitioner import murmur2

    return [murmur2(k) & 0xFFFFFFFF for k in workload.keys]


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory):
    """kcore's one-node cluster fixture, except that a cluster kcore.testing starts here deletes
    a deleted topic's files within 0.2 s (``log.segment.delete.delay.ms`` 200 and
    ``log.initial.task.delay.ms`` 0; by default the broker's deletion task first runs 30 s
    after start, then every minute). The producer benchmark deletes each round's topic after
    it; kept for a minute, ~2 GB of their logs piled up as dirty pages, and the kernel's
    writeback of them doubled the broker's CPU for the same records in whichever client's
    rounds it landed (measured: 0.3 s a round of 1,000,000 records before it, 0.7-1.0 s during
    it). Set dynamically, the delay did not reach the deletion task; 0 makes that task spin
    (idle broker CPU 0.87 s in 10 s against 0.41 s; 0.48 s at 200 ms).

    Its sockets' buffers are the OS's, autotuned (``socket.receive.buffer.bytes`` and
    ``socket.send.buffer.bytes`` -1), as guides for high-throughput brokers advise, instead of
    Kafka's 100 KiB. With 100 KiB the broker read a client's 1 MB Produce requests in 100 KiB
    steps and capped one connection's throughput, whichever client: the floor (pre-encoded
    requests, bench/test_producer_bench.py) took 170-180 ms for 1,000,000 records against
    150-160 ms, while confluent-kafka's rounds (700 ms, bound by its own CPU) did not move
    (docs/benchmarks-producer.md, "The broker's socket buffers")."""
    from kcore.testing import pytest_plugin
    from kcore.testing.cluster import KafkaCluster

    external = os.environ.get("KCORE_BOOTSTRAP", "").strip()
    docker = os.environ.get("KCORE_TEST_BROKER", "").strip().lower() == "docker"
    if external or docker:  # as the plugin's fixture makes it
        yield from pytest_plugin._session_cluster(1, tmp_path_factory)
        return
    work_dir = tmp_path_factory.mktemp("kafka1-bench-", numbered=True)
    cluster = KafkaCluster(
        1,
        work_dir=work_dir,
        keep_logs=True,
        broker_config={
            "log.segment.delete.delay.ms": 200,
            "log.initial.task.delay.ms": 0,
            "socket.receive.buffer.bytes": -1,
            "socket.send.buffer.bytes": -1,
        },
    )
    cluster.start()
    pytest_plugin._clusters.append(cluster)  # its broker log in a failing benchmark's report
    try:
        yield cluster
    finally:
        cluster.stop()
