"""The cluster layer against real brokers: bootstrap and its failures, broker restarts,
leadership moves while requests flow, new topics, re-bootstrap, idle connections."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from kcore import AdminClient
from kcore.admin import NewTopic, TopicPartition
from kcore.cluster import ClusterClient
from kcore.errors import BootstrapError, BrokerConnectionError, KcoreError

DEAD = "127.0.0.1:1,127.0.0.1:2"  # nothing listens on ports 1 and 2


def run(coro):
    return asyncio.run(coro)


async def started(client: ClusterClient, timeout: float):
    """``client`` started (which returns at once) and its first bootstrap waited for."""
    await client.start()
    return await client.ready(timeout)


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_bootstrap_skips_dead_addresses(kafka_cluster3):
    async def main():
        # The real addresses come last; shuffling may still try the dead ones first.
        client = ClusterClient({"bootstrap.servers": f"{DEAD},{kafka_cluster3.bootstrap_servers}"})
        try:
            md = await started(client, 30)
            assert sorted(md.brokers) == kafka_cluster3.node_ids
            # The brokers' own addresses replaced the bootstrap list.
            assert {b.address for b in md.brokers.values()} == {
                kafka_cluster3.broker_address(n) for n in kafka_cluster3.node_ids
            }
        finally:
            await client.close()

    run(main())


def test_bootstrap_failure_lists_every_address_within_the_timeout():
    async def main():
        client = ClusterClient({"bootstrap.servers": f"{DEAD},no-such-host.invalid:9092"})
        start = time.monotonic()
        with pytest.raises(BootstrapError) as info:
            await started(client, 2.0)
        elapsed = time.monotonic() - start
        err = info.value
        assert {a for a, _ in err.attempts} == {
            "127.0.0.1:1",
            "127.0.0.1:2",
            "no-such-host.invalid:9092",
        }
        text = str(err)
        assert "connection refused" in text and "dns" in text and "within 2s" in text
        assert elapsed < 2.0 + 5  # bounded by the timeout, not by retries piling up
        await client.close()

    run(main())


def test_an_http_server_at_the_bootstrap_address_is_named():
    """A peer that answers in HTTP (a proxy, a web server on the port) is said to be one, not
    taken for a TLS listener."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()

    async def main():
        port = server.getsockname()[1]
        client = ClusterClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        with pytest.raises(BootstrapError, match="the peer answered in HTTP"):
            await started(client, 2.0)
        await client.close()

    try:
        run(main())
    finally:
        server.close()


def test_requests_pipeline_on_one_connection(kafka_cluster):
    from kcore.protocol.messages import MetadataRequest

    async def main():
        client = ClusterClient({"bootstrap.servers": kafka_cluster.bootstrap_servers})
        try:
            md = await started(client, 30)
            node = next(iter(md.brokers))
            conn = await client.connection(node)
            responses = await asyncio.gather(
                *(client.send(node, MetadataRequest(topics=[])) for _ in range(50))
            )
            assert len(responses) == 50
            assert await client.connection(node) is conn  # one connection per broker
        finally:
            await client.close()

    run(main())


def test_metadata_survives_a_broker_stop_and_start(kafka_cluster3):
    async def main():
        client = ClusterClient({"bootstrap.servers": kafka_cluster3.bootstrap_servers})
        await started(client, 30)
        errors: list[BaseException] = []
        seen_brokers: list[set[int]] = []
        stop = asyncio.Event()

        async def keep_asking():
            while not stop.is_set():
                try:
                    md = await client.refresh_metadata()
                    seen_brokers.append(set(md.brokers))
                except KcoreError as exc:  # pragma: no cover - what the test forbids
                    errors.append(exc)
                await asyncio.sleep(0.05)

        asker = asyncio.get_running_loop().create_task(keep_asking())
        # Stop the broker the client most likely talks to.
        victim = client.least_loaded_node() or 1
        await asyncio.to_thread(kafka_cluster3.stop_broker, victim)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(kafka_cluster3.start_broker, victim)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not seen_brokers or victim not in seen_brokers[-1]):
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(asker, 30)
        try:
            assert not errors, errors
            assert any(victim not in s for s in seen_brokers), "the stop was never observed"
            assert victim in seen_brokers[-1], "the restarted broker did not come back"
            # And the client talks to it again.
            from kcore.protocol.messages import MetadataRequest

            await client.send(victim, MetadataRequest(topics=[]))
        finally:
            await client.close()

    run(main())


def test_leadership_moves_while_requests_flow(kafka_cluster3):
    topic = topic_name("moving")
    config = {"bootstrap.servers": kafka_cluster3.bootstrap_servers}
    with AdminClient(config) as admin, AdminClient(config) as worker:
        admin.create_topics([NewTopic(topic, 3, 3)])
        before = admin.describe_topics([topic])[topic].partitions
        tps = {TopicPartition(topic, p.partition): "latest" for p in before}
        worker.list_offsets(tps)  # warm: the worker now caches the current leaders
        stop = threading.Event()
        failures: list[BaseException] = []
        calls = [0]

        def flow():
            while not stop.is_set():
                try:
                    assert len(worker.list_offsets(tps)) == len(tps)
                    calls[0] += 1
                except BaseException as exc:  # pragma: no cover - what the test forbids
                    failures.append(exc)
                    return

        thread = threading.Thread(target=flow)
        thread.start()
        try:
            # Reorder every partition's replicas so that its preferred (first) replica is not
            # the current leader, then elect the preferred leaders.
            wanted = {
                p.partition: [r for r in p.replicas if r != p.leader] + [p.leader] for p in before
            }
            admin.alter_partition_reassignments(
                {TopicPartition(topic, p): replicas for p, replicas in wanted.items()}
            )
            deadline = time.monotonic() + 60
            while admin.list_partition_reassignments() and time.monotonic() < deadline:
                time.sleep(0.2)
            outcome = admin.elect_leaders(list(tps))
            assert all(err is None for err in outcome.values()), outcome
            # The brokers apply the election moments later.
            after = before
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                after = admin.describe_topics([topic])[topic].partitions
                if all(a.leader == wanted[a.partition][0] for a in after):
                    break
                time.sleep(0.2)
            assert all(a.leader != b.leader for a, b in zip(after, before, strict=True))
            time.sleep(1.0)  # requests keep flowing against the moved leaders
        finally:
            stop.set()
            thread.join(60)
        assert not failures, failures
        assert calls[0] > 0
        # The worker follows: its cache names the new leaders (it was told by NOT_LEADER
        # errors or a refresh, without an error reaching the caller).
        worker.list_offsets(tps)
        cached = worker.cluster.metadata.topics[topic].partitions
        assert {p: cached[p].leader for p in cached} == {a.partition: a.leader for a in after}


def test_a_topic_created_later_appears_without_errors(kafka_cluster):
    topic = topic_name("late")

    async def main():
        client = ClusterClient(
            {"bootstrap.servers": kafka_cluster.bootstrap_servers, "metadata.max.age.ms": 500}
        )
        await started(client, 30)
        try:
            client.add_topics([topic])  # e.g. a producer about to write to it
            await client.refresh_metadata()
            assert topic not in client.metadata.topics
            await asyncio.to_thread(kafka_cluster.create_topic, topic, partitions=2)
            # Only the periodic refresh (metadata.max.age.ms) runs: no explicit call.
            deadline = time.monotonic() + 20
            while topic not in client.metadata.topics and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert client.metadata.partitions_for(topic) == [0, 1]
        finally:
            await client.close()

    run(main())


def test_rebootstrap_when_no_known_broker_answers(unreachable_cluster):
    async def main():
        base = {
            "bootstrap.servers": unreachable_cluster.bootstrap_servers,
            "socket.connection.setup.timeout.ms": 1000,
            "reconnect.backoff.ms": 10,
        }
        client = ClusterClient(base)
        await started(client, 30)
        try:
            # Every known broker (the advertised one) is unreachable: the refresh goes back
            # to the bootstrap list (KIP-899) instead of failing.
            md = await client.refresh_metadata()
            assert client.rebootstraps >= 1
            assert list(md.brokers) == [1]
        finally:
            await client.close()
        strict = ClusterClient({**base, "metadata.recovery.strategy": "none"})
        await started(strict, 30)
        try:
            with pytest.raises(BrokerConnectionError):
                await strict.refresh_metadata()
        finally:
            await strict.close()

    run(main())


def test_idle_connections_are_closed(kafka_cluster):
    from kcore.protocol.messages import MetadataRequest

    async def main():
        client = ClusterClient(
            {"bootstrap.servers": kafka_cluster.bootstrap_servers, "connections.max.idle.ms": 300}
        )
        md = await started(client, 30)
        try:
            node = next(iter(md.brokers))
            conn = await client.connection(node)
            await client.send(node, MetadataRequest(topics=[]))
            deadline = time.monotonic() + 10
            while conn.is_ready and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert not conn.is_ready
            # A new request simply reconnects.
            await client.send(node, MetadataRequest(topics=[]))
        finally:
            await client.close()

    run(main())


def test_open_soon_opens_a_connection_without_waiting_and_says_how_it_went(kafka_cluster):
    """``open_soon`` (the producer's way to connect to a leader while its batches wait): one
    attempt however often asked, ``on_done(True)`` once the connection is ready, at once for
    one ready already; ``on_done(False)`` for a node it cannot dial, the failure recorded."""

    async def main():
        client = ClusterClient(
            {"bootstrap.servers": kafka_cluster.bootstrap_servers, "connections.max.idle.ms": 1000}
        )
        md = await started(client, 30)
        try:
            node = next(iter(md.brokers))
            deadline = time.monotonic() + 10  # (idle: closed after 1 s)
            while client.ready_connection(node) is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert client.ready_connection(node) is None
            told: list[bool] = []
            client.open_soon(node, told.append)
            client.open_soon(node, told.append)
            assert told == []  # not waited for
            while len(told) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert told == [True, True]
            assert client.ready_connection(node) is not None
            assert client.last_failure(node) is None
            client.open_soon(node, told.append)  # ready already
            await asyncio.sleep(0)
            assert told == [True, True, True]
            unknown: list[bool] = []
            client.open_soon(999, unknown.append)  # not in the metadata
            while not unknown and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert unknown == [False]
        finally:
            await client.close()
        with pytest.raises(KcoreError, match="closed"):
            client.open_soon(node, told.append)

    run(main())


def test_every_dns_address_of_a_name_is_tried(kafka_cluster, monkeypatch):
    """``client.dns.lookup=use_all_dns_ips``: a name with several addresses, the first dead
    (127.0.0.2: loopback, but nothing listens there), still connects. DNS is the one thing
    stubbed: this machine's resolver has no multi-address name to offer."""
    import socket

    port = int(kafka_cluster.bootstrap_servers.rsplit(":", 1)[1])
    real = asyncio.BaseEventLoop.getaddrinfo

    async def getaddrinfo(self, host, *args, **kwargs):
        if host == "kafka.multi.test":
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
                for ip in ("127.0.0.2", "127.0.0.1")
            ]
        return await real(self, host, *args, **kwargs)

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)

    async def main():
        client = ClusterClient({"bootstrap.servers": f"kafka.multi.test:{port}"})
        try:
            md = await started(client, 20)
            assert list(md.brokers) == [1]
        finally:
            await client.close()

    run(main())


def test_throttle_time_is_honoured(kafka_cluster):
    """KIP-219: a broker that throttles a client answers at once with throttle_time_ms; the
    client must then hold its next request back that long. A request quota of 1% of one
    handler thread for this client id makes the real broker throttle it."""
    from kcore.protocol.messages import MetadataRequest

    client_id = f"throttled-{uuid.uuid4().hex[:6]}"
    kafka_cluster.run_tool(
        "kafka-configs",
        "--bootstrap-server",
        kafka_cluster.bootstrap_servers,
        "--alter",
        "--add-config",
        "request_percentage=1",
        "--entity-type",
        "clients",
        "--entity-name",
        client_id,
        check=True,
    )

    async def main():
        client = ClusterClient(
            {"bootstrap.servers": kafka_cluster.bootstrap_servers, "client.id": client_id}
        )
        md = await started(client, 30)
        node = next(iter(md.brokers))
        conn = await client.connection(node)
        try:
            throttle_ms = 0
            deadline = time.monotonic() + 30
            while throttle_ms == 0 and time.monotonic() < deadline:
                sent = time.monotonic()
                bodies = await asyncio.gather(
                    *(conn.request(MetadataRequest(topics=None)) for _ in range(20))
                )
                throttle_ms = max(b.throttle_time_ms for b in bodies)
            assert throttle_ms > 0, "the broker never throttled"
            # The connection holds back until at least the throttle after that answer, and the
            # next request is not sent before then.
            held_until = conn._throttled_until
            assert held_until >= sent + throttle_ms / 1000
            await conn.request(MetadataRequest(topics=[]))
            assert time.monotonic() >= held_until
        finally:
            await client.close()

    run(main())
