"""pytest plugin (entry point ``kcore``): Kafka cluster fixtures for real-broker tests.

* ``kafka_cluster`` — one node, session scope; ``kafka_cluster3`` — three nodes, session scope.
  Each starts on first use, under pytest's ``tmp_path_factory`` (logs stay there after the run).
* ``kafka_cluster3_isolated`` — three nodes, each in a network namespace of its own
  (``isolated_network=True``), so tests can ``partition()`` and ``throttle()`` nodes and client
  hosts; session scope; after each test the network is healed. It needs root (or
  CAP_NET_ADMIN) and iproute2 and is always a local cluster (KCORE_BOOTSTRAP and
  KCORE_TEST_BROKER do not apply): without them its tests error, never skip.
* ``KCORE_BOOTSTRAP=host:port`` — both fixtures are that existing cluster (ExternalCluster).
* ``KCORE_TEST_BROKER=docker`` — started with testcontainers (DockerKafkaCluster, one node).
* A cluster that cannot start makes the tests that use it error; they are never skipped.
* When a test using a cluster fails (the plugin's or one a test's own fixture yields), the tail
  of every node's log is added to its report, and the cluster keeps its logs.
* After a test that stopped or killed nodes of a session cluster, they are started again.
* Under pytest-xdist every worker starts its own clusters (each node a JVM of -Xmx512m).
* ``spark_cluster`` — a Spark standalone cluster (SparkCluster: a master and two workers of two
  cores and 1g each), session scope, started on first use; its logs are added to the report of a
  test using it that fails, and kept.

Importing this module does no JVM or Maven work; everything happens in the fixtures. pytest
loads it through the ``pytest11`` entry point named ``kcore`` (``-p no:kcore`` disables it);
with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` load it with ``-p kcore.testing.pytest_plugin``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from kcore.testing.cluster import BaseCluster
    from kcore.testing.spark_cluster import SparkCluster

CLUSTER_FIXTURES = ("kafka_cluster", "kafka_cluster3", "kafka_cluster3_isolated")
LOG_TAIL_LINES = 30

_clusters: list[BaseCluster] = []  # every cluster a fixture started this session
_user_clusters: list[BaseCluster] = []  # the tests' own clusters, once a test using one failed
_spark_clusters: list[SparkCluster] = []  # the spark_cluster fixture's


def pytest_configure(config: pytest.Config) -> None:
    if not any(line.split(":")[0].strip() == "broker" for line in config.getini("markers")):
        config.addinivalue_line(
            "markers", "broker: needs a real Kafka cluster (kcore.testing fixtures)"
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if set(getattr(item, "fixturenames", ())) & set(CLUSTER_FIXTURES):
            item.add_marker("broker")


def make_cluster(brokers: int, tmp_path_factory: pytest.TempPathFactory) -> BaseCluster:
    """The cluster the fixtures use, chosen by KCORE_BOOTSTRAP / KCORE_TEST_BROKER (unstarted)."""
    from kcore.testing.cluster import ExternalCluster, KafkaCluster
    from kcore.testing.errors import ClusterError

    bootstrap = os.environ.get("KCORE_BOOTSTRAP", "").strip()
    if bootstrap:
        return ExternalCluster(bootstrap)
    kind = os.environ.get("KCORE_TEST_BROKER", "").strip().lower()
    if kind == "docker":
        from kcore.testing.docker import DockerKafkaCluster

        return DockerKafkaCluster(brokers)
    if kind not in ("", "local", "jars"):
        raise ClusterError(f"KCORE_TEST_BROKER={kind!r}: expected 'docker', 'local' or unset")
    work_dir = tmp_path_factory.mktemp(f"kafka{brokers}-", numbered=True)
    return KafkaCluster(brokers, work_dir=work_dir, keep_logs=True)


def _session_cluster(
    brokers: int, tmp_path_factory: pytest.TempPathFactory, cluster: BaseCluster | None = None
) -> Iterator[Any]:
    from kcore.testing.cluster import ExternalCluster
    from kcore.testing.errors import ClusterStartError

    cluster = cluster or make_cluster(brokers, tmp_path_factory)
    cluster.start()  # a failure errors every test that uses the fixture (pytest caches it)
    if isinstance(cluster, ExternalCluster) and brokers > 1:
        # Someone else's cluster may be smaller than the fixture promises: its tests would
        # fail on replication factors and node ids, saying nothing of why.
        found = len(cluster.node_ids)
        if found < brokers:
            raise ClusterStartError(
                f"the {brokers}-node fixture needs {brokers} brokers; KCORE_BOOTSTRAP's "
                f"cluster ({cluster.bootstrap_servers}) has {found}. Point it at a larger "
                "cluster, or unset it to start a local one from the Kafka jars."
            )
    _clusters.append(cluster)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A one-node Kafka cluster (KRaft) shared by the whole session."""
    yield from _session_cluster(1, tmp_path_factory)


@pytest.fixture(scope="session")
def kafka_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A three-node Kafka cluster (KRaft, every node a voter) shared by the whole session."""
    yield from _session_cluster(3, tmp_path_factory)


@pytest.fixture(scope="session")
def kafka_cluster3_isolated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A three-node Kafka cluster whose nodes each run in a network namespace of their own on
    a bridge it creates, so that tests can cut nodes (and client hosts) off; session scope."""
    from kcore.testing.cluster import KafkaCluster

    work_dir = tmp_path_factory.mktemp("kafka3-isolated-", numbered=True)
    cluster = KafkaCluster(3, work_dir=work_dir, keep_logs=True, isolated_network=True)
    yield from _session_cluster(3, tmp_path_factory, cluster)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone cluster on 127.0.0.1 shared by the whole session: a master and two
    workers (two cores and 1g each), run from the installed pyspark."""
    from kcore.testing.spark_cluster import SparkCluster

    work_dir = tmp_path_factory.mktemp("spark-", numbered=True)
    cluster = SparkCluster(2, work_dir=work_dir, keep_logs=True)
    _spark_clusters.append(cluster)
    cluster.start()  # a failure errors every test that uses the fixture (pytest caches it)
    try:
        yield cluster
    finally:
        cluster.stop()


def _clusters_of(item: pytest.Item) -> list[BaseCluster]:
    """The clusters a test had as fixtures: the plugin's and the user's own."""
    from kcore.testing.cluster import BaseCluster

    funcargs = getattr(item, "funcargs", None) or {}
    found: list[BaseCluster] = []
    for value in funcargs.values():
        if isinstance(value, BaseCluster) and all(value is not c for c in found):
            found.append(value)
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    report = outcome.get_result()
    if report.failed:
        for cluster in _clusters_of(item):
            cluster.mark_failed()
            if all(cluster is not c for c in (*_clusters, *_user_clusters)):
                _user_clusters.append(cluster)  # named in the summary with the plugin's
            for title, text in _log_sections(cluster):
                report.sections.append((title, text))
        for spark in _spark_clusters_of(item):
            spark.mark_failed()
            for daemon in spark.daemons:
                title = (
                    f"Spark {daemon.name} log (last {LOG_TAIL_LINES} lines of {daemon.log_path})"
                )
                report.sections.append((title, spark.log_tail(daemon.name, LOG_TAIL_LINES)))


def _spark_clusters_of(item: pytest.Item) -> list[SparkCluster]:
    from kcore.testing.spark_cluster import SparkCluster

    funcargs = getattr(item, "funcargs", None) or {}
    found: list[SparkCluster] = []
    for value in funcargs.values():
        if isinstance(value, SparkCluster) and all(value is not c for c in found):
            found.append(value)
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test that stopped or killed nodes of a session cluster, they are started again
    and its network (if it has one) is healed: the next tests get the whole cluster (a test
    that failed between kill and restart would otherwise leave it short of a node for the rest
    of the session)."""
    yield
    if nextitem is None:  # the session's clusters are being stopped
        return
    for cluster in _clusters_of(item):
        if any(cluster is c for c in _clusters):
            _heal(cluster)


def _heal(cluster: BaseCluster) -> None:
    from kcore.testing.errors import ClusterError

    if not getattr(cluster, "_started", False):
        return  # stopped as a whole (cluster.stop()), or not one kcore.testing runs
    try:
        cluster.heal()
    except ClusterError as exc:
        import warnings

        warnings.warn(f"kcore.testing: could not heal the test network: {exc}", stacklevel=1)
    try:
        down = [n for n in cluster.node_ids if not cluster.is_running(n)]
    except ClusterError:  # a cluster kcore.testing does not run (KCORE_BOOTSTRAP, docker)
        return
    for node_id in down:
        try:
            cluster.start_broker(node_id)
        except ClusterError as exc:  # the next test that needs it fails and shows the log
            import warnings

            warnings.warn(f"kcore.testing: could not restart node {node_id}: {exc}", stacklevel=1)


def _log_sections(cluster: BaseCluster) -> list[tuple[str, str]]:
    from kcore.testing.errors import ClusterError

    sections = []
    for node_id in cluster.node_ids:
        try:
            tail = cluster.log_tail(node_id, LOG_TAIL_LINES)
        except ClusterError:
            continue
        except OSError as exc:
            tail = f"(cannot read it: {exc})"
        try:
            where = f" of {cluster.log_path(node_id)}"
        except ClusterError:
            where = ""
        title = f"kafka node {node_id} log (last {LOG_TAIL_LINES} lines{where})"
        sections.append((title, tail))
    return sections


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for cluster in (*_clusters, *_user_clusters):
        if cluster.failed and cluster.work_dir is not None:
            terminalreporter.write_line(f"kcore: Kafka logs kept in {cluster.work_dir}")
    for spark in _spark_clusters:
        if spark.failed and spark.work_dir is not None:
            terminalreporter.write_line(f"kcore: Spark logs kept in {spark.work_dir}")
