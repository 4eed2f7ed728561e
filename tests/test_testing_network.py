"""kcore.testing's test network (network namespaces on a bridge): hosts reach each other and
this process, a cut host is unreachable until restored, a throttle is a tbf on both ends,
nothing is left behind, and what a dead process left is swept. Then the same through
KafkaCluster(isolated_network=True): a partitioned node is unreachable, its peers fence it,
and it is back after the heal."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from kcore.testing import ClusterControlError, KafkaCluster, NetworkSetupError, TestNetwork
from kcore.testing import network as knetwork

ECHO = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7777))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(c.recv(100))
    c.close()
"""


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def echo(address: str, timeout: float = 2.0) -> bytes | str:
    try:
        with socket.create_connection((address, 7777), timeout=timeout) as s:
            s.sendall(b"ping")
            return s.recv(100)
    except OSError as exc:
        return type(exc).__name__


@pytest.fixture
def network():
    with TestNetwork() as net:
        yield net
    # close() removed everything it made
    assert net.bridge not in ip("-o", "link", "show")


def test_hosts_are_reachable_until_cut_and_again_after_restore(network):
    host = network.add_host("server")
    other = network.add_host("client")
    assert host.address != other.address
    assert host.namespace in ip("netns", "list")
    server = subprocess.Popen(
        host.command([sys.executable, "-c", ECHO, host.address]), stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None and server.stdout.readline().startswith(b"ready")
        assert echo(host.address) == b"ping"
        # from the other host's namespace too
        probe = f"import socket; print(socket.create_connection(('{host.address}', 7777)))"
        assert subprocess.run(other.command([sys.executable, "-c", probe])).returncode == 0
        network.cut(host)
        assert network.is_cut(host)
        assert echo(host.address) in ("TimeoutError", "OSError")  # lost, or no route to host
        network.restore(host)
        deadline = time.monotonic() + 10
        while echo(host.address) != b"ping":
            assert time.monotonic() < deadline, "not reachable again after restore()"
            time.sleep(0.2)
    finally:
        server.kill()
        server.wait()


def test_throttle_puts_a_token_bucket_on_both_ends(network):
    host = network.add_host("slow")
    network.throttle(host, "512kbit")
    outside = subprocess.run(
        ["tc", "qdisc", "show", "dev", host.link], capture_output=True, text=True
    ).stdout
    inside = subprocess.run(
        ["tc", "-n", host.namespace, "qdisc", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
    ).stdout
    assert "tbf" in outside and "512Kbit" in outside
    assert "tbf" in inside and "512Kbit" in inside
    network.heal()
    again = subprocess.run(
        ["tc", "qdisc", "show", "dev", host.link], capture_output=True, text=True
    ).stdout
    assert "tbf" not in again


def test_what_a_dead_process_left_behind_is_swept():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"kcore-{dead.pid}-1-node1"
    bridge = f"kc{os.getpid() % 0xFFFFFF:06x}zz"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    subprocess.run(
        ["ip", "link", "set", bridge, "alias", f"kcore-test-network-{dead.pid}"], check=True
    )
    removed = knetwork.sweep_stale()
    assert stale in removed and bridge in removed
    assert stale not in ip("netns", "list")
    assert bridge not in ip("-o", "link", "show")


def test_bad_host_names_and_unknown_hosts_are_clear_errors(network):
    with pytest.raises(ValueError, match="host name"):
        network.add_host("bad name")
    network.add_host("one")
    with pytest.raises(ValueError, match="taken"):
        network.add_host("one")
    with pytest.raises(NetworkSetupError, match="no host 'two'"):
        network.host("two")


def test_a_cluster_without_a_network_says_so(kafka_cluster):
    with pytest.raises(ClusterControlError, match="cannot partition node 1|no test network"):
        kafka_cluster.partition(1)


def test_a_partitioned_node_is_fenced_and_back_after_the_heal(kafka_cluster3_isolated):
    cluster = kafka_cluster3_isolated
    node = cluster.node(3)
    assert node.host != "127.0.0.1" and node.host in cluster.bootstrap_servers
    from kcore.admin import AdminClient

    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        with cluster.partition(3) as fault:
            assert "in force" in repr(fault)
            host, port = node.address.rsplit(":", 1)
            with pytest.raises(OSError):
                socket.create_connection((host, int(port)), timeout=2).close()
            assert cluster.is_running(3)  # cut off, not stopped
            deadline = time.monotonic() + 60
            while {b.node_id for b in admin.describe_cluster().brokers} != {1, 2}:
                assert time.monotonic() < deadline, "the other nodes did not fence node 3"
                time.sleep(0.5)
        assert "healed" in repr(fault)
        socket.create_connection((host, int(port)), timeout=5).close()
        deadline = time.monotonic() + 60
        while {b.node_id for b in admin.describe_cluster().brokers} != {1, 2, 3}:
            assert time.monotonic() < deadline, "node 3 did not come back"
            time.sleep(0.5)


def test_a_stopped_isolated_cluster_leaves_no_namespace(tmp_path):
    cluster = KafkaCluster(1, isolated_network=True, work_dir=tmp_path)
    with cluster:
        namespaces = [h.namespace for h in cluster.network.hosts]
        bridge = cluster.network.bridge
        assert all(ns in ip("netns", "list") for ns in namespaces)
    listing = ip("netns", "list")
    assert not any(ns in listing for ns in namespaces)
    assert bridge not in ip("-o", "link", "show")
    with pytest.raises(ClusterControlError, match="not running"):
        _ = cluster.network
