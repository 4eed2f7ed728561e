"""Authorization failures against a real broker with ACLs (KRaft's StandardAuthorizer): a client
logged in as a user the ACLs deny a consumer group, a transactional id or a topic gets Kafka's
error for it (GROUP_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
TOPIC_AUTHORIZATION_FAILED) naming what was denied, within seconds, and nothing it was told
failed happened anyway (no offsets committed, no records of a failed transaction visible).

One cluster for the module. Its PLAINTEXT listeners (client, inter-broker, controller) are
unauthenticated: their principal, ``User:ANONYMOUS``, is a super user, so the broker and the
tests' own setup and checks pass every ACL. Alice logs in on the SASL_PLAINTEXT listener;
``allow.everyone.if.no.acl.found`` lets her do everything no ACL names. Two kinds of denial:

* ``denied*`` (group, transactional id, topic): ``DENY All`` for alice: even the coordinator
  lookup (FindCoordinator needs Describe) fails;
* ``describe-only*`` (group, transactional id): ``ALLOW Describe`` and nothing else, so the
  lookup works and the broker refuses JoinGroup, ConsumerGroupHeartbeat, OffsetCommit,
  InitProducerId, AddOffsetsToTxn and TxnOffsetCommit themselves (OffsetFetch needs only
  Describe).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

import kcore
from kcore.admin import NewTopic, TopicPartition
from kcore.errors import (
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    TransactionStateError,
)
from kcore.testing import KafkaCluster
from kcore.testing.security import SASL_PLAINTEXT_LISTENER, sasl_listener

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

USER, PASSWORD = "alice", "alice-secret"
DENIED = "denied"  # DENY All for alice on groups, transactional ids and topics with this prefix
DESCRIBE_ONLY = "describe-only"  # ALLOW Describe only, on groups and transactional ids
PREFIXES = [DENIED, DESCRIBE_ONLY]
OPEN_TOPIC = "open"  # no ACL: alice may do anything with it
DENIED_TOPIC = "denied-topic"
OPEN_RECORDS = [f"open-{i}".encode() for i in range(10)]
SECONDS = 10  # what any one failure may take to be reported

BROKER_CONFIG = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
    "allow.everyone.if.no.acl.found": "true",
}


def add_acls(cluster: KafkaCluster, *args: str) -> None:
    cluster.run_tool(
        "kafka-acls",
        "--bootstrap-server",
        cluster.bootstrap_servers,
        "--add",
        "--resource-pattern-type",
        "prefixed",
        *args,
        check=True,
    )


@pytest.fixture(scope="module")
def authz(tmp_path_factory) -> Iterator[KafkaCluster]:
    listener = sasl_listener(
        name=SASL_PLAINTEXT_LISTENER, mechanisms=["SCRAM-SHA-256"], users={USER: PASSWORD}
    )
    work = tmp_path_factory.mktemp("kafka-authz-", numbered=True)
    with KafkaCluster(
        broker_config=BROKER_CONFIG, listeners=[listener], work_dir=work, keep_logs=True
    ) as cluster:
        add_acls(
            cluster,
            *("--deny-principal", f"User:{USER}", "--operation", "All"),
            *("--group", DENIED, "--transactional-id", DENIED, "--topic", DENIED),
        )
        add_acls(
            cluster,
            *("--allow-principal", f"User:{USER}", "--operation", "Describe"),
            *("--group", DESCRIBE_ONLY, "--transactional-id", DESCRIBE_ONLY),
        )
        with kcore.AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            admin.create_topics([NewTopic(OPEN_TOPIC, 1, 1), NewTopic(DENIED_TOPIC, 1, 1)])
        with kcore.Producer({"bootstrap.servers": cluster.bootstrap_servers}) as producer:
            for value in OPEN_RECORDS:
                producer.send(OPEN_TOPIC, value)
            producer.flush(30)
        yield cluster


def alice(cluster: KafkaCluster, **extra: object) -> dict[str, object]:
    """Client config of alice on the SASL listener. The timeouts here and in alice_consumer /
    alice_producer are short, so that a failure retried instead of reported shows as a slow
    test, not as a wait of minutes."""
    return {
        "bootstrap.servers": cluster.bootstrap_for(SASL_PLAINTEXT_LISTENER),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": USER,
        "sasl.password": PASSWORD,
        "request.timeout.ms": 10000,
        **extra,
    }


def alice_consumer(cluster: KafkaCluster, **extra: object) -> kcore.Consumer:
    return kcore.Consumer(alice(cluster, **{"default.api.timeout.ms": 15000, **extra}))


def alice_producer(cluster: KafkaCluster, **extra: object) -> kcore.Producer:
    return kcore.Producer(alice(cluster, **{"max.block.ms": 15000, "linger.ms": 1, **extra}))


def superuser(cluster: KafkaCluster, **extra: object) -> dict[str, object]:
    return {"bootstrap.servers": cluster.bootstrap_servers, **extra}


@contextlib.contextmanager
def within(seconds: float, what: str) -> Iterator[None]:
    """The block must finish (return or raise) within ``seconds``."""
    start = time.monotonic()
    yield
    took = time.monotonic() - start
    assert took < seconds, f"{what} took {took:.1f}s (at most {seconds}s)"


def raises(error: type[BaseException], name: str) -> Any:
    """pytest.raises for ``error`` whose message names ``name`` (quoted or not)."""
    return pytest.raises(error, match=re.escape(name))


def poll_until_raises(
    consumer: kcore.Consumer | kcore.ShareConsumer, seconds: float = SECONDS
) -> None:
    """Poll until poll raises (it must within ``seconds``; the caller checks what)."""
    deadline = time.monotonic() + seconds
    got = 0
    while time.monotonic() < deadline:
        got += len(consumer.poll(0.5))
    pytest.fail(f"poll raised nothing within {seconds}s ({got} records)")


def committed_as_superuser(cluster: KafkaCluster, group: str, tp: TopicPartition) -> int | None:
    with kcore.Consumer(superuser(cluster, **{"group.id": group})) as consumer:
        return consumer.committed([tp], timeout=SECONDS)[tp]


def close_promptly(client: kcore.Consumer | kcore.ShareConsumer | kcore.Producer) -> None:
    with within(5, "close()"):
        client.close()


# -- consumer groups -------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
@pytest.mark.parametrize("prefix", PREFIXES)
def test_subscribing_in_a_denied_group_raises_from_poll(authz, prefix, protocol):
    group = f"{prefix}-g1-{protocol}"
    consumer = alice_consumer(authz, **{"group.id": group, "group.protocol": protocol})
    try:
        consumer.subscribe([OPEN_TOPIC])
        with within(SECONDS, "the first error"), raises(GroupAuthorizationFailedError, group):
            poll_until_raises(consumer)
        # Not a one-off: the next poll says so again (Java's consumer does the same).
        with within(SECONDS, "the second error"), raises(GroupAuthorizationFailedError, group):
            poll_until_raises(consumer)
        assert consumer.assignment() == set()
    finally:
        close_promptly(consumer)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_share_consumer_in_a_denied_group_raises_from_poll(authz, prefix):
    group = f"{prefix}-share-g1"
    consumer = kcore.ShareConsumer(alice(authz, **{"group.id": group}))
    try:
        consumer.subscribe([OPEN_TOPIC])
        with within(SECONDS, "the first error"), raises(GroupAuthorizationFailedError, group):
            poll_until_raises(consumer)
        with within(SECONDS, "the second error"), raises(GroupAuthorizationFailedError, group):
            poll_until_raises(consumer)
        assert consumer.assignment() == set()
    finally:
        close_promptly(consumer)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_commit_and_committed_in_a_denied_group_with_manual_assignment(authz, prefix):
    group = f"{prefix}-g2"
    tp = TopicPartition(OPEN_TOPIC, 0)
    consumer = alice_consumer(authz, **{"group.id": group, "enable.auto.commit": False})
    try:
        consumer.assign([tp])
        with within(SECONDS, "commit()"), raises(GroupAuthorizationFailedError, group):
            consumer.commit({tp: 3})
        future = consumer.commit({tp: 4}, asynchronous=True)
        assert future is not None
        with within(SECONDS, "commit(asynchronous=True)"):
            with raises(GroupAuthorizationFailedError, group):
                future.result(SECONDS)
        if prefix == DENIED:
            with within(SECONDS, "committed()"), raises(GroupAuthorizationFailedError, group):
                consumer.committed([tp])
        else:  # OffsetFetch needs only Describe on the group, which alice has
            with within(SECONDS, "committed()"):
                assert consumer.committed([tp]) == {tp: None}
    finally:
        close_promptly(consumer)
    # What was reported failed did fail: the group has no offset.
    assert committed_as_superuser(authz, group, tp) is None


# -- transactions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_init_transactions_with_a_denied_transactional_id_is_fatal(authz, prefix):
    txn_id = f"{prefix}-t3"
    producer = alice_producer(authz, **{"transactional.id": txn_id})
    try:
        with within(SECONDS, "init_transactions()"):
            with raises(TransactionalIdAuthorizationFailedError, txn_id):
                producer.init_transactions()
        # Fatal, as in Java: every later transactional call raises the same at once, and no
        # record is taken.
        with within(1, "the calls after it"):
            with raises(TransactionalIdAuthorizationFailedError, txn_id):
                producer.init_transactions()
            with raises(TransactionalIdAuthorizationFailedError, txn_id):
                producer.begin_transaction()
            with raises(TransactionalIdAuthorizationFailedError, txn_id):
                producer.send(OPEN_TOPIC, b"never sent")
    finally:
        close_promptly(producer)


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("prefix", PREFIXES)
def test_send_offsets_to_transaction_for_a_denied_group_is_abortable(
    authz, prefix, version, monkeypatch
):
    """As Java's TransactionManager: GROUP_AUTHORIZATION_FAILED from the group's
    FindCoordinator, AddOffsetsToTxn (protocol v1) or TxnOffsetCommit is an abortable error
    naming the group: send_offsets_to_transaction raises it, commit_transaction refuses,
    abort_transaction recovers, and the next transaction commits. Only the committed records
    are visible; the group gets no offsets."""
    if version == 1:  # a client of transaction protocol v1 (the broker serves both)
        monkeypatch.setattr(
            "kcore.producer.transactions.transaction_version", lambda features, versions: 1
        )
    group = f"{prefix}-g4-v{version}"
    topic = f"txn-out-{prefix}-v{version}"
    with kcore.AdminClient(superuser(authz)) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    tp = TopicPartition(OPEN_TOPIC, 0)
    producer = alice_producer(authz, **{"transactional.id": f"ok-t4-{prefix}-v{version}"})
    try:
        with within(SECONDS, "init_transactions()"):
            producer.init_transactions()
        assert producer._core.txn.version == version
        producer.begin_transaction()
        aborted = [producer.send(topic, f"aborted-{i}".encode()) for i in range(3)]
        with within(SECONDS, "send_offsets_to_transaction()"):
            with raises(GroupAuthorizationFailedError, group):
                producer.send_offsets_to_transaction({tp: 5}, group)
        with within(SECONDS, "commit_transaction()"):
            with pytest.raises(TransactionStateError, match="abort_transaction") as info:
                producer.commit_transaction()
        assert info.value.abortable
        assert isinstance(info.value.cause, GroupAuthorizationFailedError)
        assert group in str(info.value.cause)
        with within(SECONDS, "abort_transaction()"):
            producer.abort_transaction()
        assert all(f.done() for f in aborted)  # each written then aborted, or failed: none hangs
        producer.begin_transaction()
        committed = [producer.send(topic, f"committed-{i}".encode()) for i in range(3)]
        with within(SECONDS, "commit_transaction()"):
            producer.commit_transaction()
        assert all(f.result(SECONDS).offset >= 0 for f in committed)
    finally:
        close_promptly(producer)
    assert read_committed(authz, topic, 3) == [f"committed-{i}".encode() for i in range(3)]
    assert committed_as_superuser(authz, group, tp) is None


def read_committed(cluster: KafkaCluster, topic: str, count: int) -> list[bytes | None]:
    """The values a read_committed consumer reads from ``topic`` (waiting for ``count``, then
    a moment more for any record that should not be there)."""
    config = superuser(
        cluster, **{"isolation.level": "read_committed", "auto.offset.reset": "earliest"}
    )
    got: list[bytes | None] = []
    with kcore.Consumer(config) as consumer:
        consumer.assign([(topic, 0)])
        deadline = time.monotonic() + SECONDS
        while len(got) < count and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(0.5)]
        got += [r.value for r in consumer.poll(0.5)]
    return got


def test_sending_to_a_denied_topic_in_a_transaction_fails_at_once(authz):
    """The record is refused by send() itself (Java's waitOnMetadata throws the same), not
    after max.block.ms as if the topic did not exist."""
    producer = alice_producer(authz, **{"transactional.id": "ok-t6", "max.block.ms": 30000})
    try:
        producer.init_transactions()
        producer.begin_transaction()
        with within(SECONDS, "send()"), raises(TopicAuthorizationFailedError, DENIED_TOPIC):
            producer.send(DENIED_TOPIC, b"refused")
        # As Java: the transaction cannot commit without the refused record; abort recovers.
        with pytest.raises(TransactionStateError) as failed:
            producer.commit_transaction()
        assert failed.value.abortable
        producer.abort_transaction()
        producer.begin_transaction()
        producer.commit_transaction()
    finally:
        close_promptly(producer)


# -- topics ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_subscribing_to_a_denied_topic_raises_from_poll(authz, protocol):
    """Classic: the metadata answer names the topic. KIP-848: the broker refuses the
    ConsumerGroupHeartbeat with TOPIC_AUTHORIZATION_FAILED and no message (Java's consumer
    cannot name the topic either); kcore's error names the group."""
    group = f"ok-g5-{protocol}"
    consumer = alice_consumer(authz, **{"group.id": group, "group.protocol": protocol})
    named = DENIED_TOPIC if protocol == "classic" else group
    try:
        consumer.subscribe([DENIED_TOPIC])
        with within(SECONDS, "the error"), raises(TopicAuthorizationFailedError, named):
            poll_until_raises(consumer)
        assert consumer.assignment() == set()
    finally:
        close_promptly(consumer)


def test_a_denied_topic_beside_an_allowed_one_classic(authz):
    """As Java's classic consumer: poll raises for the denied topic (once per metadata
    refresh) and the allowed topic of the subscription is read meanwhile, every record."""
    consumer = alice_consumer(authz, **{"group.id": "ok-g5-mixed", "auto.offset.reset": "earliest"})
    errors = 0
    got: list[bytes | None] = []
    try:
        consumer.subscribe([DENIED_TOPIC, OPEN_TOPIC])
        deadline = time.monotonic() + 2 * SECONDS
        while len(got) < len(OPEN_RECORDS) and time.monotonic() < deadline:
            try:
                got += [r.value for r in consumer.poll(0.5)]
            except TopicAuthorizationFailedError as exc:
                assert DENIED_TOPIC in str(exc) and OPEN_TOPIC not in str(exc)
                errors += 1
        assert consumer.assignment() == {TopicPartition(OPEN_TOPIC, 0)}
    finally:
        close_promptly(consumer)
    assert errors >= 1
    assert got == OPEN_RECORDS


def test_a_denied_topic_assigned_manually_raises_from_poll(authz):
    consumer = alice_consumer(authz, **{"auto.offset.reset": "earliest"})
    try:
        consumer.assign([(DENIED_TOPIC, 0)])
        with within(SECONDS, "the error"), raises(TopicAuthorizationFailedError, DENIED_TOPIC):
            poll_until_raises(consumer)
    finally:
        close_promptly(consumer)
