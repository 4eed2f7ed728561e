"""SASL re-authentication (KIP-368) against a real broker whose sessions last 3 s
(``connections.max.reauth.ms``): kcore's connections log in again on themselves before the
session ends, with requests in flight, instead of being closed by the broker and reconnecting.
A producer and a consumer run across several sessions and lose nothing."""

from __future__ import annotations

import time
import uuid

import pytest

import kcore
from kcore.admin import NewTopic
from kcore.testing import KafkaCluster
from kcore.testing.security import SASL_PLAINTEXT_LISTENER, sasl_listener

USER, PASSWORD = "bob", "bob-secret"
SESSION_MS = 3000


@pytest.fixture(scope="module")
def reauth_cluster():
    listener = sasl_listener(name=SASL_PLAINTEXT_LISTENER, users={USER: PASSWORD})
    config = {"connections.max.reauth.ms": SESSION_MS}
    with KafkaCluster(listeners=[listener], broker_config=config) as cluster:
        yield cluster


def _config(cluster, mechanism: str) -> dict:
    return {
        "bootstrap.servers": cluster.bootstrap_for(SASL_PLAINTEXT_LISTENER),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": USER,
        "sasl.password": PASSWORD,
    }


def _connections(client) -> list:
    return client._core.cluster.connections.ready_connections()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_connections_log_in_again_before_the_session_ends(reauth_cluster, mechanism):
    config = _config(reauth_cluster, mechanism)
    topic = f"reauth-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient(config) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    sent: list[bytes] = []
    with (
        kcore.Producer(config) as producer,
        kcore.Consumer({**config, "auto.offset.reset": "earliest"}) as consumer,
    ):
        consumer.assign([(topic, 0), (topic, 1)])
        got: list = []
        producer.send(topic, b"first").result(30)
        sent.append(b"first")
        before = {id(c) for c in _connections(producer) + _connections(consumer)}
        deadline = time.monotonic() + 3.5 * SESSION_MS / 1000
        i = 0
        while time.monotonic() < deadline:
            value = b"v%d" % i
            producer.send(topic, value).result(30)  # each waits: no retry hides a failure
            sent.append(value)
            got += consumer.poll(0.2)
            i += 1
        while len(got) < len(sent) and time.monotonic() < deadline + 30:
            got += consumer.poll(0.5)
        conns = _connections(producer) + _connections(consumer)
        # The same connections all along, each logged in again (3 s sessions, 10.5 s run).
        assert {id(c) for c in conns} >= before
        assert all(c.session_lifetime_ms > 0 for c in conns)
        assert max(c.reauthentications for c in conns) >= 2
    assert sorted(r.value for r in got) == sorted(sent)
