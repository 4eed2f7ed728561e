"""kcore.testing: real Kafka clusters started from the jars (no mocks). The session fixtures
``kafka_cluster`` / ``kafka_cluster3`` are shared with the rest of the suite; only the tests
that need an unusual cluster (advertised host, startup failures) start their own."""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kcore.testing import (
    ClusterControlError,
    ClusterStartError,
    ExternalCluster,
    KafkaCluster,
    KafkaJarsError,
    Listener,
    kafka_libs,
)
from kcore.testing import jars as kjars
from kcore.testing.cluster import read_properties

pytestmark = pytest.mark.broker
pytest_plugins = ["pytester"]

_CACHE_ROOT = kjars.cache_root()  # before any pytester fixture changes HOME


# -- helpers: raw Kafka requests (kcore's own client does not exist yet) --------------------------
def _can_connect(address: str, timeout: float = 3.0) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def _request(address: str, api_key: int, version: int, body: bytes) -> bytes:
    """One request with a v1 header (non-flexible APIs); returns the response after its
    correlation id."""
    host, port = address.rsplit(":", 1)
    client_id = b"kcore-test"
    header = struct.pack(">hhih", api_key, version, 42, len(client_id)) + client_id
    payload = header + body
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        data = _recv_exact(s, size)
    assert struct.unpack(">i", data[:4])[0] == 42
    return data[4:]


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return buf


def _api_versions_error(address: str) -> int:
    return struct.unpack(">h", _request(address, 18, 0, b"")[:2])[0]


def _metadata_brokers(address: str) -> dict[int, tuple[str, int]]:
    """node id -> (host, port) as a client sees them (Metadata v4: no topics)."""
    data = _request(address, 3, 4, struct.pack(">ib", 0, 0))
    pos = 4  # throttle_time_ms
    (count,) = struct.unpack_from(">i", data, pos)
    pos += 4
    brokers = {}
    for _ in range(count):
        node_id, hlen = struct.unpack_from(">ih", data, pos)
        pos += 6
        host = data[pos : pos + hlen].decode()
        pos += hlen
        port, rack_len = struct.unpack_from(">ih", data, pos)
        pos += 6 + max(rack_len, 0)
        brokers[node_id] = (host, port)
    return brokers


def _jvms_under(path: Path) -> list[str]:
    res = subprocess.run(["pgrep", "-af", str(path)], capture_output=True, text=True)
    return [line for line in res.stdout.splitlines() if "java" in line]


def _describe(cluster, topic: str, bootstrap: str | None = None) -> dict[int, dict[str, set[int]]]:
    """partition -> {"Replicas": {...}, "Isr": {...}} from TopicCommand --describe."""
    res = cluster.run_tool(
        "org.apache.kafka.tools.TopicCommand",
        "--bootstrap-server",
        bootstrap or cluster.bootstrap_servers,
        "--describe",
        "--topic",
        topic,
        check=True,
    )
    out: dict[int, dict[str, set[int]]] = {}
    for line in res.stdout.splitlines():
        m = re.search(r"Partition: (\d+)\s+Leader: \S+\s+Replicas: ([\d,]+)\s+Isr: ([\d,]*)", line)
        if m:
            out[int(m[1])] = {
                "Replicas": {int(x) for x in m[2].split(",")},
                "Isr": {int(x) for x in m[3].split(",") if x},
            }
    assert out, res.stdout
    return out


@pytest.fixture
def cluster3(kafka_cluster3):
    """The session 3-node cluster, with every node running again after the test."""
    yield kafka_cluster3
    for node_id in kafka_cluster3.node_ids:
        if not kafka_cluster3.is_running(node_id):
            kafka_cluster3.start_broker(node_id)


# -- the session clusters -------------------------------------------------------------------------
def test_single_node_cluster_serves_kafka_on_bootstrap(kafka_cluster):
    print(f"1-node startup_seconds={kafka_cluster.startup_seconds:.2f}")
    assert kafka_cluster.node_ids == [1]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", kafka_cluster.bootstrap_servers)
    assert kafka_cluster.broker_address(1) == kafka_cluster.bootstrap_servers
    assert kafka_cluster.is_running(1)
    assert _can_connect(kafka_cluster.bootstrap_servers)
    assert _api_versions_error(kafka_cluster.bootstrap_servers) == 0
    assert "Kafka Server started" in kafka_cluster.log_tail(1, 200)
    props = read_properties(kafka_cluster.nodes[0].properties_path)
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"].startswith("1@127.0.0.1:")
    assert props["inter.broker.listener.name"] == "INTERNAL"
    assert props["offsets.topic.replication.factor"] == "1"
    assert "auto.create.topics.enable" not in props  # Kafka's default (true)


def test_three_node_cluster_replicates_to_all_brokers(cluster3):
    print(f"3-node startup_seconds={cluster3.startup_seconds:.2f}")
    assert cluster3.node_ids == [1, 2, 3]
    addresses = cluster3.bootstrap_servers.split(",")
    assert len(set(addresses)) == 3 and all(_can_connect(a) for a in addresses)
    assert set(_metadata_brokers(addresses[0])) == {1, 2, 3}
    props = read_properties(cluster3.nodes[2].properties_path)
    assert props["node.id"] == "3" and props["controller.quorum.voters"].count("@") == 3
    assert props["transaction.state.log.min.isr"] == "2"

    res = cluster3.run_tool(
        "org.apache.kafka.tools.TopicCommand",
        "--bootstrap-server",
        cluster3.bootstrap_servers,
        "--create",
        "--topic",
        "rf3",
        "--partitions",
        "3",
        "--replication-factor",
        "3",
    )
    assert res.returncode == 0, res.stderr
    parts = _describe(cluster3, "rf3")
    assert set(parts) == {0, 1, 2}
    assert all(p["Replicas"] == {1, 2, 3} for p in parts.values())
    assert all(p["Isr"] == {1, 2, 3} for p in parts.values())


def test_stop_start_and_kill_brokers(cluster3):
    cluster3.create_topic("restarts", partitions=2, replication_factor=3)
    addr2, addr3 = cluster3.broker_address(2), cluster3.broker_address(3)

    # Other tests share this session cluster and may have restarted node 2 already.
    starts = cluster3.log_tail(2, 100000).count("Kafka Server started")
    cluster3.stop_broker(2)  # SIGTERM: controlled shutdown
    assert not cluster3.is_running(2) and not _can_connect(addr2)
    assert cluster3.is_running(1) and cluster3.is_running(3)
    cluster3.start_broker(2)
    assert cluster3.is_running(2) and _can_connect(addr2)
    assert cluster3.log_tail(2, 100000).count("Kafka Server started") == starts + 1

    cluster3.kill_broker(3)  # SIGKILL
    assert not cluster3.is_running(3) and not _can_connect(addr3)
    assert _api_versions_error(cluster3.broker_address(1)) == 0  # the rest still serves
    cluster3.start_broker(3)
    assert cluster3.is_running(3) and _can_connect(addr3)
    assert set(_metadata_brokers(addr3)) == {1, 2, 3}

    deadline = time.monotonic() + 30  # the restarted replicas catch up and rejoin the ISR
    while True:
        parts = _describe(cluster3, "restarts")
        if all(p["Isr"] == {1, 2, 3} for p in parts.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all(p["Isr"] == {1, 2, 3} for p in parts.values()), parts


def test_external_cluster_has_addresses_but_no_control(kafka_cluster):
    with ExternalCluster(f" {kafka_cluster.bootstrap_servers}, ") as ext:
        assert ext.bootstrap_servers == kafka_cluster.bootstrap_servers
        assert ext.node_ids == kafka_cluster.node_ids  # as the cluster describes itself
        assert ext.broker_address(ext.node_ids[0]) == kafka_cluster.bootstrap_servers
        with pytest.raises(ClusterControlError, match="has no node 99"):
            ext.broker_address(99)
        for op in (ext.stop_broker, ext.start_broker, ext.kill_broker, ext.is_running):
            with pytest.raises(ClusterControlError, match="external cluster"):
                op(1)
        ext.create_topic("made-through-external")  # Kafka's CLI tools still work
    listing = kafka_cluster.run_tool(
        "kafka-topics", "--bootstrap-server", kafka_cluster.bootstrap_servers, "--list"
    )
    assert "made-through-external" in listing.stdout.split()


# -- clusters of their own ------------------------------------------------------------------------
_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" user_admin="admin-secret";'
)
SASL = Listener(
    "SASL_PLAINTEXT",
    "SASL_PLAINTEXT",
    {
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": _JAAS,
    },
)


def test_advertised_host_misleads_clients_only_and_nothing_is_left_behind(tmp_path):
    bogus = "kcore-doctor-test.invalid"
    with KafkaCluster(2, advertised_host=bogus, listeners=[SASL]) as cluster:
        print(f"2-node startup_seconds={cluster.startup_seconds:.2f}")
        work = cluster.work_dir
        assert work is not None
        for node in cluster.nodes:
            props = read_properties(node.properties_path)
            advertised = props["advertised.listeners"].split(",")
            assert f"PLAINTEXT://{bogus}:{node.port}" in advertised
            assert f"INTERNAL://127.0.0.1:{node.ports['INTERNAL']}" in advertised
            assert node.advertised_address == f"{bogus}:{node.port}"
        # Clients bootstrap fine but are told to reconnect to the bogus host ...
        assert _metadata_brokers(cluster.broker_address(1)) == {
            n.node_id: (bogus, n.port) for n in cluster.nodes
        }
        # ... while the brokers keep replicating over INTERNAL, which tools can use too.
        internal = cluster.bootstrap_for("INTERNAL")
        cluster.create_topic("adv", partitions=2, replication_factor=2, bootstrap_servers=internal)
        parts = _describe(cluster, "adv", bootstrap=internal)
        assert all(p["Isr"] == {1, 2} for p in parts.values())
        # An extra listener (the extension point SSL/SASL tests build on) works as well.
        client_config = tmp_path / "sasl.properties"
        client_config.write_text(
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
            f"sasl.jaas.config={_JAAS.split(' user_admin')[0]};\n"
        )
        listing = cluster.run_tool(
            "kafka-topics",
            "--bootstrap-server",
            cluster.bootstrap_for("SASL_PLAINTEXT"),
            "--command-config",
            client_config,
            "--list",
            check=True,
        )
        assert "adv" in listing.stdout.split()
        assert len(_jvms_under(work)) == 2
    assert _jvms_under(work) == []
    assert not work.exists()  # clean exit, temp work dir: removed


_RUNNER = """
import sys, time
from kcore.testing import KafkaCluster
cluster = KafkaCluster(1, work_dir=sys.argv[1]).start()
print("UP", flush=True)
if sys.argv[2] == "exit":
    sys.exit(0)  # without stop(): the atexit hook must kill the node
time.sleep(600)  # until SIGKILLed: PR_SET_PDEATHSIG must kill the node
"""


def test_no_broker_outlives_a_killed_or_exiting_test_process(tmp_path):
    runners = {
        how: subprocess.Popen(
            [sys.executable, "-c", _RUNNER, str(tmp_path / how), how],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for how in ("sigkill", "exit")
    }
    try:
        for how, proc in runners.items():
            assert proc.stdout is not None and proc.stdout.readline().strip() == "UP", how
        assert len(_jvms_under(tmp_path / "sigkill")) == 1
        runners["sigkill"].kill()
        assert runners["exit"].wait(60) == 0
        assert runners["exit"].stderr is not None
        assert "killed Kafka cluster left running at exit" in runners["exit"].stderr.read()
        deadline = time.monotonic() + 15
        while _jvms_under(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _jvms_under(tmp_path) == []
    finally:
        for proc in runners.values():
            proc.kill()
            proc.communicate()


def test_bad_broker_config_raises_with_the_log_tail(tmp_path):
    cluster = KafkaCluster(1, broker_config={"num.io.threads": "lots"}, work_dir=tmp_path)
    with pytest.raises(ClusterStartError) as info:
        cluster.start()
    err = info.value
    assert "num.io.threads" in str(err) and "lots" in str(err)  # Kafka's own complaint
    assert err.node_id == 1 and err.log_path is not None and err.log_path.exists()
    assert str(tmp_path) in str(err)
    assert _jvms_under(tmp_path) == []
    assert cluster.failed and not cluster.is_running(1)


def test_jvm_that_dies_at_startup_raises_with_the_log_tail(tmp_path):
    with pytest.raises(
        ClusterStartError, match=r"exited with status \d+ before it was ready"
    ) as info:
        KafkaCluster(1, heap="1m", work_dir=tmp_path).start()
    assert "heap" in str(info.value).lower()  # the JVM's message is in the tail
    assert (tmp_path / "node1" / "server.log").exists()
    assert _jvms_under(tmp_path) == []


def test_startup_timeout_raises_and_kills_the_nodes(tmp_path):
    # Well under any real start: with its class-data archive a node came up in under 2 s on a
    # fast machine, and this test (2 s then) saw no timeout.
    cluster = KafkaCluster(1, startup_timeout=0.3, work_dir=tmp_path)
    with pytest.raises(ClusterStartError, match="within 0.3s|timed out") as info:
        cluster.start()
    assert info.value.work_dir == tmp_path.resolve()
    assert _jvms_under(tmp_path) == []
    assert (tmp_path / "node1" / "node.properties").exists()  # kept for a look


# -- jars -----------------------------------------------------------------------------------------
def test_jars_are_cached_and_stamped():
    kafka_libs()  # fetched already if any cluster ran
    started = time.monotonic()
    libs = kafka_libs()
    assert time.monotonic() - started < 1.0  # no Maven run the second time
    assert (libs / f"kafka_2.13-{kjars.versions.KAFKA_VERSION}.jar").is_file()
    assert (libs.parent / "libs.complete.json").is_file()
    assert not any("connect-runtime" in p.name for p in libs.iterdir())


def _java_only_path(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").symlink_to(kjars.java_executable())
    return str(bin_dir)


def test_missing_mvn_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", _java_only_path(tmp_path))
    with pytest.raises(KafkaJarsError, match="`mvn`"):
        kafka_libs()


def test_maven_failure_shows_its_output(tmp_path, monkeypatch):
    monkeypatch.setenv("KCORE_CACHE_DIR", str(tmp_path))
    with pytest.raises(KafkaJarsError, match="Maven could not fetch") as info:
        kafka_libs("0.0.0-kcore-no-such-version")
    assert "0.0.0-kcore-no-such-version" in str(info.value).split("output:", 1)[1]
    assert not (tmp_path / "kafka-0.0.0-kcore-no-such-version" / "libs").exists()


def test_concurrent_fetches_run_maven_once_and_redo_a_partial_fetch(tmp_path):
    cache = tmp_path / "cache"
    partial = cache / f"kafka-{kjars.versions.KAFKA_VERSION}" / "libs"
    partial.mkdir(parents=True)
    (partial / "half-written.jar").write_bytes(b"")  # an earlier fetch died here: no stamp
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout);"
        "from kcore.testing.jars import kafka_libs; print('LIBS', kafka_libs())"
    )
    env = {**os.environ, "KCORE_CACHE_DIR": str(cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum(o.count("fetching the Kafka") for o in outs) == 1, outs  # the other one waited
    assert not (partial / "half-written.jar").exists()
    assert (partial / f"kafka_2.13-{kjars.versions.KAFKA_VERSION}.jar").is_file()


# -- the pytest plugin ----------------------------------------------------------------------------
def test_plugin_is_registered_and_cheap_to_import(tmp_path):
    cache = tmp_path / "never-created"
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "--trace-config", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env={**os.environ, "KCORE_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "kcore.testing.pytest_plugin" in res.stdout
    assert not cache.exists()  # no jar or JVM work unless a cluster fixture is used


def test_plugin_adds_log_tails_to_failed_reports_and_keeps_logs(pytester, monkeypatch):
    # pytester points HOME elsewhere; keep using the jar cache this session already filled
    monkeypatch.setenv("KCORE_CACHE_DIR", str(_CACHE_ROOT))
    pytester.makepyfile(
        """
        def test_fails_with_a_cluster(kafka_cluster):
            print("WORKDIR", kafka_cluster.work_dir)
            assert kafka_cluster.is_running(1)
            assert False, "deliberate"

        def test_passes(kafka_cluster):
            assert kafka_cluster.is_running(1)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    result.assert_outcomes(failed=1, passed=1)
    out = result.stdout.str()
    assert "kafka node 1 log (last 30 lines of " in out
    assert "Kafka Server started" in out
    work = Path(re.search(r"WORKDIR (\S+)", out)[1])
    assert f"kcore: Kafka logs kept in {work}" in out
    assert (work / "node1" / "server.log").exists() and (work / "node1" / "data").exists()
    assert _jvms_under(work) == []


def test_plugin_env_selects_external_or_docker_clusters(pytester, monkeypatch, kafka_cluster):
    pytester.makepyfile(
        """
        import os
        import pytest
        from kcore.testing import ClusterControlError, ExternalCluster

        def test_external(kafka_cluster):
            assert isinstance(kafka_cluster, ExternalCluster)
            assert kafka_cluster.bootstrap_servers == os.environ["KCORE_BOOTSTRAP"]
            with pytest.raises(ClusterControlError, match="KCORE_BOOTSTRAP"):
                kafka_cluster.kill_broker(1)

        def test_external_three_nodes(kafka_cluster3):
            pass
        """
    )
    monkeypatch.setenv("KCORE_BOOTSTRAP", kafka_cluster.bootstrap_servers)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)  # one node for three: clear error, no skip
    assert "the 3-node fixture needs 3 brokers; KCORE_BOOTSTRAP's cluster" in result.stdout.str()

    monkeypatch.delenv("KCORE_BOOTSTRAP")
    monkeypatch.setenv("KCORE_TEST_BROKER", "docker")
    pytester.makepyfile("def test_docker_three_nodes(kafka_cluster3):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)  # a single Docker node only: clear error, no skip
    assert "KCORE_TEST_BROKER=docker runs a single node" in result.stdout.str()


def test_confluent_env_names_for_the_docker_image():
    from kcore.testing.docker import confluent_env_name

    assert confluent_env_name("num.io.threads") == "KAFKA_NUM_IO_THREADS"
    assert confluent_env_name("log.dir_x-y") == "KAFKA_LOG_DIR__X___Y"


def test_plugin_errors_instead_of_skipping_when_no_cluster_can_start(
    pytester, tmp_path, monkeypatch
):
    pytester.makepyfile(
        """
        def test_one(kafka_cluster):
            pass

        def test_two(kafka_cluster3):
            pass
        """
    )
    monkeypatch.setenv("PATH", _java_only_path(tmp_path))  # no mvn ...
    monkeypatch.setenv("KCORE_CACHE_DIR", str(tmp_path / "empty-cache"))  # ... and no jars
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    assert "KafkaJarsError" in result.stdout.str()


# -- review fixes: versions, Java, tools, topics, healing, user clusters' logs --------------------
def test_kafka_version_is_read_when_a_cluster_is_made(monkeypatch):
    from kcore.testing import versions
    from kcore.testing.errors import ClusterError

    monkeypatch.setenv("KCORE_KAFKA_VERSION", "4.1.0")
    assert versions.kafka_version() == "4.1.0"
    assert KafkaCluster(1).kafka_version == "4.1.0"  # made, not started
    monkeypatch.setenv("KCORE_KAFKA_VERSION", "3.9.1")
    with pytest.raises(ClusterError, match="4.0 or later"):
        versions.kafka_version()
    monkeypatch.delenv("KCORE_KAFKA_VERSION")
    assert versions.kafka_version() == versions.DEFAULT_KAFKA_VERSION


def test_an_old_java_is_named(tmp_path, monkeypatch):
    fake = tmp_path / "jdk11" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk11"))
    with pytest.raises(KafkaJarsError, match="is Java 11; Apache Kafka 4.x needs Java 17"):
        kjars.java_executable()


def test_a_tool_that_overruns_its_timeout_is_a_kafka_tool_error(kafka_cluster):
    from kcore.testing.errors import KafkaToolError

    with pytest.raises(KafkaToolError, match="did not finish within") as info:
        kafka_cluster.run_tool("kafka-topics", "--version", timeout=0.05)
    assert info.value.returncode is None
    # No input given: the console producer reads an empty stdin and ends, not the terminal.
    res = kafka_cluster.run_tool(
        "kafka-console-producer",
        "--bootstrap-server",
        kafka_cluster.bootstrap_servers,
        "--topic",
        f"tool-stdin-{uuid.uuid4().hex[:6]}",
        timeout=60,
    )
    assert res.returncode == 0, res.stderr


def test_create_topic_returns_with_leaders_and_delete_topic(kafka_cluster3):
    import kcore
    from kcore.errors import TopicAlreadyExistsError

    topic = f"made-{uuid.uuid4().hex[:8]}"
    kafka_cluster3.create_topic(topic, partitions=6, config={"retention.ms": 60000})
    with kcore.AdminClient({"bootstrap.servers": kafka_cluster3.bootstrap_servers}) as admin:
        described = admin.describe_topics([topic])[topic]
        assert len(described.partitions) == 6 and all(p.leader > 0 for p in described.partitions)
        assert all(len(p.replicas) == 3 for p in described.partitions)
    with pytest.raises(TopicAlreadyExistsError):
        kafka_cluster3.create_topic(topic)
    kafka_cluster3.delete_topic(topic)


def test_the_plugin_restarts_nodes_a_test_left_down(kafka_cluster3, kafka_cluster):
    """A node of a session cluster a test killed is started again, the only node of a
    one-node cluster too; a cluster stopped as a whole is left alone."""
    from kcore.testing import pytest_plugin

    for cluster, node in ((kafka_cluster3, 3), (kafka_cluster, 1)):
        cluster.kill_broker(node)
        try:
            pytest_plugin._heal(cluster)
            assert all(cluster.is_running(n) for n in cluster.node_ids)
        finally:
            if not cluster.is_running(node):
                cluster.start_broker(node)
    stopped = KafkaCluster(1)  # never started
    pytest_plugin._heal(stopped)
    assert not stopped.nodes or not any(stopped.is_running(n) for n in stopped.node_ids)


def test_a_tests_own_cluster_gets_log_tails_too(pytester):
    """A cluster the test's own fixture yields (no plugin cluster in the session) gets the log
    section and the 'logs kept' line on failure; here a stand-in with a log file."""
    pytester.makepyfile(
        """
        import pytest
        from pathlib import Path
        from kcore.testing.cluster import BaseCluster

        class LoggedCluster(BaseCluster):
            def __init__(self, root):
                self.root = root
                (root / "server.log").write_text("line one\\nthe broker said something\\n")

            @property
            def node_ids(self):
                return [1]

            def log_tail(self, node_id, lines=50):
                return (self.root / "server.log").read_text()

            def log_path(self, node_id):
                return self.root / "server.log"

            @property
            def work_dir(self):
                return self.root

            @property
            def bootstrap_servers(self):
                return "127.0.0.1:1"

        @pytest.fixture
        def my_cluster(tmp_path):
            yield LoggedCluster(tmp_path)

        def test_fails(my_cluster):
            assert False, "deliberate"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "kafka node 1 log (last 30 lines of " in out
    assert "the broker said something" in out


def test_class_data_archive_training_that_fails_is_tried_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training cluster that does not start leaves no archive and is not tried again (each
    later start would pay its timeout); the start goes on without one."""
    from kcore.testing import _cds

    monkeypatch.setenv("KCORE_CDS", "1")
    version = kjars.versions.kafka_version()
    archives = _cds.Archives(kjars.java_executable(), kafka_libs(version), version)
    archives.dir = tmp_path / "cds"
    tries: list[str] = []

    def train(version: str, dump: Path, work_dir: Path) -> None:
        tries.append(version)
        raise RuntimeError("the training cluster did not start")

    archives.ensure(train)
    archives.ensure(train)
    assert tries == [version]
    assert archives.complete() and not archives.path.exists() and archives.flags() == []
    assert "the training cluster did not start" in caplog.text
