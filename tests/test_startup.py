"""Start-up as Java and librdkafka users expect it: constructors return at once and connect in
the background (the first call that needs the cluster waits within its own bound), and one
config dict serves every client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

import pytest

import kcore
import kcore.config as kcore_config
from kcore.errors import BootstrapError, ConfigError
from kcore.testing import KafkaCluster

QUICK_S = 1.0  # "returns at once": well under a second


@pytest.fixture(scope="module")
def own_cluster():
    """A cluster of this module's own: its broker is stopped and started here."""
    with KafkaCluster(1) as cluster:
        yield cluster


def timed(make):
    started = time.monotonic()
    client = make()
    return client, time.monotonic() - started


def test_clients_start_while_the_cluster_is_down_and_work_once_it_is_up(own_cluster) -> None:
    topic = "startup-down"
    own_cluster.create_topic(topic, partitions=1)
    bootstrap = own_cluster.bootstrap_servers
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": "startup-down-group",  # consumer
        "auto.offset.reset": "earliest",  # consumer
        "linger.ms": "5",  # producer
    }
    own_cluster.stop_broker(own_cluster.node_ids[0])
    pool = concurrent.futures.ThreadPoolExecutor(2)
    producer, took_p = timed(lambda: kcore.Producer(conf))
    # A short default.api.timeout.ms: the group's coordinator lookups give up while the
    # cluster is down, and polls still return nothing (they never raise for it, as Java's).
    consumer, took_c = timed(lambda: kcore.Consumer({**conf, "default.api.timeout.ms": "1000"}))
    admin, took_a = timed(lambda: kcore.AdminClient(conf))
    try:
        assert max(took_p, took_c, took_a) < QUICK_S, (took_p, took_c, took_a)
        # An admin call fails within its timeout, naming the address and why.
        started = time.monotonic()
        with pytest.raises(BootstrapError) as info:
            admin.list_topics(timeout=2)
        assert time.monotonic() - started < 2 + 2
        text = str(info.value)
        assert all(address in text for address in bootstrap.split(","))
        assert "within 2s" in text and "refused" in text
        with pytest.raises(BootstrapError):
            producer.wait_until_ready(0.5)
        # A consumer subscribed meanwhile polls nothing (no error) while the cluster is down.
        consumer.subscribe([topic])
        polled_until = time.monotonic() + 3
        while time.monotonic() < polled_until:
            assert consumer.poll(0.5) == []
        started = time.monotonic()
        with pytest.raises(BootstrapError, match="no bootstrap server answered within"):
            consumer.end_offsets([(topic, 0)], timeout=1)
        assert time.monotonic() - started < 1 + 2
        # Sends made while down wait (up to max.block.ms) and are delivered once it is up.
        values = [b"sent while down %d" % i for i in range(3)]
        sent = pool.submit(lambda: [producer.send(topic, v) for v in values])
        time.sleep(1.0)
        assert not sent.done()
        own_cluster.start_broker(own_cluster.node_ids[0])
        futures = sent.result(timeout=60)
        assert [f.result(timeout=60).offset for f in futures] == [0, 1, 2]
        admin.wait_until_ready(30)
        assert topic in admin.list_topics(timeout=30)
        got: list = []
        deadline = time.monotonic() + 60
        while len(got) < len(values) and time.monotonic() < deadline:
            got += consumer.poll(0.5)
        assert [r.value for r in got] == values
    finally:
        if not own_cluster.is_running(own_cluster.node_ids[0]):
            own_cluster.start_broker(own_cluster.node_ids[0])
        pool.shutdown(wait=False)
        for client in (producer, consumer, admin):
            client.close()


def test_asyncio_clients_start_at_once_while_the_cluster_is_down(own_cluster) -> None:
    conf = {"bootstrap.servers": own_cluster.bootstrap_servers, "max.block.ms": "1500"}

    async def main() -> None:
        clients = [
            kcore.AsyncProducer(conf),
            kcore.AsyncConsumer(conf),
            kcore.AsyncAdminClient(conf),
        ]
        try:
            for client in clients:
                started = time.monotonic()
                await client.start()
                assert time.monotonic() - started < QUICK_S
            for client in clients:
                started = time.monotonic()
                with pytest.raises(BootstrapError, match="within 1s"):
                    await client.wait_until_ready(timeout=1)
                assert time.monotonic() - started < 1 + 2
            # send waits max.block.ms, then says why.
            with pytest.raises(BootstrapError, match="within 1.5s"):
                await clients[0].send("startup-async", b"x")
        finally:
            for client in clients:
                await client.close()

    own_cluster.stop_broker(own_cluster.node_ids[0])
    try:
        asyncio.run(main())
    finally:
        own_cluster.start_broker(own_cluster.node_ids[0])


def test_an_assigned_consumer_polls_nothing_while_down_and_reads_once_up(own_cluster) -> None:
    """Manual assignment looks its positions up at once; while the cluster is down that
    lookup waits and is tried again (past default.api.timeout.ms), and poll never raises."""
    topic = "startup-assigned"
    own_cluster.create_topic(topic, partitions=1)
    with kcore.Producer({"bootstrap.servers": own_cluster.bootstrap_servers}) as producer:
        producer.send(topic, b"written before").result(30)
    own_cluster.stop_broker(own_cluster.node_ids[0])
    consumer = kcore.Consumer(
        {
            "bootstrap.servers": own_cluster.bootstrap_servers,
            "auto.offset.reset": "earliest",
            "default.api.timeout.ms": "1000",
        }
    )
    try:
        consumer.assign([(topic, 0)])
        polled_until = time.monotonic() + 3  # three times the lookup's bound
        while time.monotonic() < polled_until:
            assert consumer.poll(0.5) == []
        own_cluster.start_broker(own_cluster.node_ids[0])
        got: list = []
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            got = consumer.poll(0.5)
        assert [r.value for r in got] == [b"written before"]
    finally:
        if not own_cluster.is_running(own_cluster.node_ids[0]):
            own_cluster.start_broker(own_cluster.node_ids[0])
        consumer.close()


def test_a_bootstrap_failure_raised_at_every_wait_keeps_one_traceback() -> None:
    """ready() raises a final bootstrap failure again at every call: from its own traceback,
    which must not grow (each raise would add its frames and keep them alive)."""
    from kcore.cluster import ClusterClient

    async def main() -> list[int]:
        client = ClusterClient({"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SSL"})
        await client.start()
        depths = []
        try:
            for _ in range(4):
                try:
                    await client.ready(5)
                except BootstrapError as exc:
                    depth, tb = 0, exc.__traceback__
                    while tb is not None:
                        depth, tb = depth + 1, tb.tb_next
                    depths.append(depth)
        finally:
            await client.close()
        return depths

    depths = asyncio.run(main())
    assert len(depths) == 4 and len(set(depths)) == 1, depths


def test_one_dict_builds_producer_consumer_and_admin(
    kafka_cluster, caplog: pytest.LogCaptureFixture
) -> None:
    topic = "startup-shared-dict"
    kafka_cluster.create_topic(topic, partitions=1)
    shared = {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "request.timeout.ms": "20000",
        "linger.ms": "5",  # producer
        "acks": "all",  # producer
        "group.id": "startup-shared",  # consumer
        "auto.offset.reset": "earliest",  # consumer
        "default.api.timeout.ms": "30000",  # admin and consumer
    }
    kcore_config._LOGGED_IGNORED.clear()  # logged once per process: earlier tests logged some
    with caplog.at_level(logging.WARNING, logger="kcore.config"):
        with kcore.AdminClient(shared) as admin:
            assert topic in admin.list_topics()
        with kcore.Producer(shared) as producer:
            producer.send(topic, b"shared").result(timeout=30)
        with kcore.Consumer(shared) as consumer:
            consumer.subscribe([topic])
            got: list = []
            for _ in range(60):
                got += consumer.poll(0.5)
                if got:
                    break
            assert [r.value for r in got] == [b"shared"]
    logged = " ".join(r.getMessage() for r in caplog.records)
    for key in ("linger.ms", "group.id", "acks", "default.api.timeout.ms"):
        assert key in logged
    # Strict mode and typos are still refused, before any connection.
    with pytest.raises(ConfigError, match="group.id: a consumer setting, not a producer one"):
        kcore.Producer({**shared, "kcore.config.strict": "true"})
    with pytest.raises(ConfigError, match="did you mean 'linger.ms'"):
        kcore.Producer({**shared, "linger.msec": 5})
