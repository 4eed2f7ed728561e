"""KIP-714 client telemetry against a real broker with a telemetry receiver: the broker runs
tests/java/TelemetryCapture.java (compiled here) as a metric reporter that writes every push it
receives to a file; subscriptions are made with Kafka's own kafka-client-metrics tool, each
matching one test's client id so the tests do not see each other's pushes.

Waits are bounded (the pushes come every push interval); nothing here asserts a duration."""

import asyncio
import base64
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from share_helpers import new_share_topic
from share_helpers import produce as produce_records

import kcore
from kcore.cluster.client import ClusterClient
from kcore.cluster.telemetry_sender import TelemetrySender
from kcore.config import ClientConfig
from kcore.protocol.types import ZERO_UUID
from kcore.testing import jars
from kcore.testing.cluster import KafkaCluster

pytestmark = pytest.mark.slow

JAVA_SOURCE = Path(__file__).parent / "java" / "TelemetryCapture.java"
INTERVAL_MS = 500
WAIT_S = 60.0  # bound on waiting for pushes (several push intervals; a slow CI machine)
PRODUCER = "org.apache.kafka.producer."
CONSUMER = "org.apache.kafka.consumer."


@dataclass
class Push:
    instance_id: str
    terminating: bool
    content_type: str
    client_id: str
    names: list[str]  # one per Metric, in the payload's order
    resource: dict[str, str]
    # each Metric's data points: (attributes, value)
    points: dict[str, list[tuple[dict[str, str], float]]]


@pytest.fixture(scope="module")
def telemetry_cluster(tmp_path_factory):
    """A one-node cluster whose broker has the capturing telemetry receiver."""
    work = tmp_path_factory.mktemp("telemetry")
    classes = work / "classes"
    classes.mkdir()
    libs = jars.kafka_libs()  # the version the cluster runs
    clients_jar = next(libs.glob("kafka-clients-*.jar"))
    res = subprocess.run(
        ["javac", "-cp", str(clients_jar), "-d", str(classes), str(JAVA_SOURCE)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    capture = work / "pushes.tsv"
    capture.touch()
    config = {
        "metric.reporters": "TelemetryCapture",
        "kcore.telemetry.capture.file": str(capture),
    }
    with KafkaCluster(1, broker_config=config, extra_classpath=[classes]) as cluster:
        cluster.capture = capture
        yield cluster


def pushes(cluster, client_id: str) -> list[Push]:
    out = []
    for line in cluster.capture.read_text().splitlines():
        instance, terminating, content_type, cid, data = line.split("\t")
        if cid != client_id:
            continue
        md = metrics_pb2.MetricsData()
        md.ParseFromString(base64.b64decode(data))
        names, resource, points = [], {}, {}
        for rm in md.resource_metrics:
            resource.update({kv.key: kv.value.string_value for kv in rm.resource.attributes})
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    names.append(m.name)
                    data = getattr(m, m.WhichOneof("data"))
                    points[m.name] = [
                        ({kv.key: kv.value.string_value for kv in dp.attributes}, dp.as_double)
                        for dp in data.data_points
                    ]
        out.append(
            Push(instance, terminating == "true", content_type, cid, names, resource, points)
        )
    return out


def wait_for(cluster, client_id: str, done, what: str) -> list[Push]:
    deadline = time.monotonic() + WAIT_S
    while True:
        got = pushes(cluster, client_id)
        if done(got):
            return got
        assert time.monotonic() < deadline, f"{what}: got {got}"
        time.sleep(0.1)


def poll_until_pushes(cluster, client_id: str, consumer, what: str) -> None:
    """Poll ``consumer`` (its pushes go out from its event loop meanwhile) until two pushes
    of ``client_id`` came."""
    deadline = time.monotonic() + WAIT_S
    while len(pushes(cluster, client_id)) < 2:
        consumer.poll(0.2)
        assert time.monotonic() < deadline, what


def subscribe(cluster, name: str, prefixes: str, client_id: str) -> None:
    cluster.run_tool(
        "org.apache.kafka.tools.ClientMetricsCommand",
        "--bootstrap-server",
        cluster.bootstrap_servers,
        "--alter",
        "--name",
        name,
        "--metrics",
        prefixes,
        "--interval",
        str(INTERVAL_MS),
        "--match",
        f"client_id={client_id}",
        check=True,
    )


def new_client_id(what: str) -> str:
    return f"telemetry-{what}-{uuid.uuid4().hex[:8]}"


def producer_config(cluster, client_id: str, **extra) -> dict:
    return {"bootstrap.servers": cluster.bootstrap_servers, "client.id": client_id, **extra}


def test_producer_pushes_subscribed_metrics_and_a_terminating_push(telemetry_cluster):
    cluster = telemetry_cluster
    cid = new_client_id("producer")
    topic = f"{cid}-topic"
    cluster.create_topic(topic)
    subscribe(cluster, cid, PRODUCER, cid)
    with kcore.Producer(producer_config(cluster, cid, **{"transactional.id": cid})) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send(topic, b"v%d" % i)
        producer.commit_transaction()
        got = wait_for(cluster, cid, lambda p: len(p) >= 2, "two pushes")
    got = wait_for(cluster, cid, lambda p: any(x.terminating for x in p), "a terminating push")
    assert [x.terminating for x in got].count(True) == 1 and got[-1].terminating
    assert len({x.instance_id for x in got}) == 1  # one client instance id, the broker's
    assert all(x.content_type == "OTLP" for x in got)  # the broker's name for MetricsData
    assert got[0].resource == {"transactional_id": cid}
    for push in got:
        assert push.names and all(n.startswith(PRODUCER) for n in push.names), push.names
    names = set().union(*(x.names for x in got))
    assert {PRODUCER + "record.send.total", PRODUCER + "request.rate"} <= names


def only(*prefixes: str):
    """A push that has metrics, each under one of ``prefixes``."""
    return lambda push: bool(push.names) and all(n.startswith(prefixes) for n in push.names)


def test_pushes_follow_a_changed_subscription(telemetry_cluster):
    cluster = telemetry_cluster
    cid = new_client_id("change")
    subscribe(cluster, cid, PRODUCER + "record.", cid)
    with kcore.Producer(producer_config(cluster, cid)):
        first = wait_for(cluster, cid, lambda p: len(p) >= 1, "a push")
        assert only(PRODUCER + "record.")(first[0]), first[0].names
        seen = len(pushes(cluster, cid))
        subscribe(cluster, cid, f"{PRODUCER}request.,{PRODUCER}connection.", cid)
        new = only(PRODUCER + "request.", PRODUCER + "connection.")
        got = wait_for(
            cluster, cid, lambda p: any(new(x) for x in p[seen:]), "a push of the new prefixes"
        )
        # (a push already under way when the subscription changed may still have the old ones)
        assert all(only(PRODUCER + "record.")(x) or new(x) for x in got[seen:])
        # consumer metrics only: a producer has none, so its pushes carry no metrics
        subscribe(cluster, cid, CONSUMER, cid)
        seen = len(got)
        wait_for(cluster, cid, lambda p: any(not x.names for x in p[seen:]), "an empty push")


def test_consumer_and_async_producer_push(telemetry_cluster):
    cluster = telemetry_cluster
    cid = new_client_id("consumer")
    topic = f"{cid}-topic"
    cluster.create_topic(topic)
    subscribe(cluster, cid, CONSUMER, cid)
    config = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "client.id": cid,
        "group.id": cid,
        "auto.offset.reset": "earliest",
    }
    with kcore.Consumer(config) as consumer:
        consumer.subscribe([topic])
        poll_until_pushes(cluster, cid, consumer, "no consumer pushes")
    got = wait_for(cluster, cid, lambda p: any(x.terminating for x in p), "a terminating push")
    assert got[0].resource == {"group_id": cid}
    for push in got:
        assert all(n.startswith(CONSUMER) for n in push.names), push.names
    assert CONSUMER + "fetch.manager.fetch.total" in set().union(*(x.names for x in got))

    async_cid = new_client_id("async")
    subscribe(cluster, async_cid, PRODUCER, async_cid)

    async def run() -> None:
        async with kcore.AsyncProducer(producer_config(cluster, async_cid)) as producer:
            await (await producer.send(topic, b"x"))
            deadline = time.monotonic() + WAIT_S
            while not pushes(cluster, async_cid):
                assert time.monotonic() < deadline, "no async producer push"
                await asyncio.sleep(0.1)

    asyncio.run(run())
    got = wait_for(cluster, async_cid, lambda p: p[-1].terminating, "a terminating push")
    assert all(n.startswith(PRODUCER) for x in got for n in x.names)


def test_share_consumer_pushes_under_its_share_metric_groups(telemetry_cluster):
    """A share consumer (KIP-932) pushes as Java's does: its metrics under the consumer-share
    groups (fetch manager, coordinator, its own), the share group as a resource attribute, a
    terminating push at close."""
    cluster = telemetry_cluster
    cid = new_client_id("share")
    topic, group = new_share_topic(cluster)
    produce_records(cluster.bootstrap_servers, topic, 20)
    subscribe(cluster, cid, CONSUMER, cid)
    config = {"bootstrap.servers": cluster.bootstrap_servers, "client.id": cid, "group.id": group}
    with kcore.ShareConsumer(config) as consumer:
        consumer.subscribe([topic])
        poll_until_pushes(cluster, cid, consumer, "no share consumer pushes")
    got = wait_for(cluster, cid, lambda p: any(x.terminating for x in p), "a terminating push")
    assert got[0].resource == {"group_id": group}
    names = set().union(*(x.names for x in got))
    share = CONSUMER + "share."
    assert all(n.startswith(share) for n in names), names
    assert share + "fetch.manager.records.consumed.total" in names
    assert share + "coordinator.assigned.partitions" in names
    assert share + "time.between.poll.max" in names


def test_consumer_pushes_each_partitions_lag_with_topic_and_partition(telemetry_cluster):
    """A known backlog: 100 records in partition 0 and 30 in partition 1, the consumer at 40
    and 25 (it never polls, so its positions stay there while the fetcher learns the high
    watermarks). Its pushes carry records.lag as one metric with a point per partition,
    the topic and partition as attributes, the lag as metrics() has it."""
    cluster = telemetry_cluster
    cid = new_client_id("lag")
    topic = f"{cid}-topic"
    cluster.create_topic(topic, partitions=2)
    with kcore.Producer(producer_config(cluster, f"{cid}-producer")) as producer:
        for partition, count in ((0, 100), (1, 30)):
            for i in range(count):
                producer.send(topic, b"v%d" % i, partition=partition)
        producer.flush(30)
    lag = CONSUMER + "fetch.manager.records.lag"
    subscribe(cluster, cid, lag, cid)
    config = {"bootstrap.servers": cluster.bootstrap_servers, "client.id": cid}
    expected = {(topic, 0): 60.0, (topic, 1): 5.0}

    def lag_points(push: Push) -> dict[tuple[str, int], float]:
        return {(a["topic"], int(a["partition"])): v for a, v in push.points.get(lag, [])}

    with kcore.Consumer(config) as consumer:
        consumer.assign([(topic, 0), (topic, 1)])
        consumer.seek((topic, 0), 40)
        consumer.seek((topic, 1), 25)
        deadline = time.monotonic() + WAIT_S
        while any(consumer.current_lag(tp) is None for tp in expected):
            assert time.monotonic() < deadline, "the lag never became known"
            time.sleep(0.1)
        metrics = consumer.metrics()
        from_metrics = {
            (topic, p): metrics[f"records-lag{{topic={topic},partition={p}}}"] for p in (0, 1)
        }
        assert from_metrics == expected
        got = wait_for(
            cluster, cid, lambda p: any(lag_points(x) == expected for x in p), "lag points"
        )
    got = wait_for(cluster, cid, lambda p: any(x.terminating for x in p), "a terminating push")
    with_lag = [x for x in got if lag in x.points]
    assert with_lag and lag_points(with_lag[-1]) == expected  # the terminating push's too
    for push in with_lag:
        assert push.names.count(lag) == 1, push.names  # one metric, a point per partition
        assert all(set(a) == {"topic", "partition"} for a, _ in push.points[lag])
        assert set(lag_points(push)) <= set(expected)
        assert all(n.startswith(lag) for n in push.names), push.names


def test_admin_client_pushes_when_enabled(telemetry_cluster):
    cluster = telemetry_cluster
    cid = new_client_id("admin")
    subscribe(cluster, cid, "org.apache.kafka.admin.client.", cid)
    config = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "client.id": cid,
        "enable.metrics.push": "true",  # off by default for the admin client, as Java's
    }
    with kcore.AdminClient(config) as admin:
        admin.list_topics()
        wait_for(cluster, cid, lambda p: len(p) >= 1, "an admin push")
    got = wait_for(cluster, cid, lambda p: p[-1].terminating, "a terminating push")
    assert "org.apache.kafka.admin.client.request.total" in got[0].names


def test_disabled_or_unsubscribed_clients_push_nothing(telemetry_cluster):
    """Three producers side by side: one pushing (the control, to know pushes happen), one
    with enable.metrics.push=false under a subscription that matches it, and one that no
    subscription matches. By the time the control has pushed three times and closed, the
    others have pushed nothing."""
    cluster = telemetry_cluster
    control, disabled, unmatched = (new_client_id(w) for w in ("control", "off", "none"))
    subscribe(cluster, control, PRODUCER, control)
    subscribe(cluster, disabled, PRODUCER, disabled)
    with (
        kcore.Producer(producer_config(cluster, control)),
        kcore.Producer(producer_config(cluster, disabled, **{"enable.metrics.push": "false"})),
        kcore.Producer(producer_config(cluster, unmatched)),
    ):
        wait_for(cluster, control, lambda p: len(p) >= 3, "the control's pushes")
    wait_for(cluster, control, lambda p: p[-1].terminating, "the control's terminating push")
    assert pushes(cluster, disabled) == []
    assert pushes(cluster, unmatched) == []


def test_broker_without_a_receiver_is_not_asked(kafka_cluster):
    """The shared cluster has no telemetry receiver, so its ApiVersions lacks the telemetry
    APIs: the client stops at once, never having asked for a subscription."""
    config = ClientConfig({"bootstrap.servers": kafka_cluster.bootstrap_servers}, role="producer")

    async def run() -> None:
        async with ClusterClient(config) as cluster:
            sender = TelemetrySender(cluster, "producer", config)
            sender.start()
            deadline = time.monotonic() + WAIT_S
            while not sender.state.finished:
                assert time.monotonic() < deadline, sender.state.phase
                await asyncio.sleep(0.05)
            assert sender.state.instance_id == ZERO_UUID and sender.state.subscription is None
            await sender.close()

    asyncio.run(run())
