"""Transactions against a real broker: the transactional producer (kcore.producer.transactions)
and read_committed in the consumer (kcore.consumer.aborted), with confluent-kafka's
read_committed consumer as the independent reader.

Each protocol test runs twice: ``v2`` on the session cluster (Kafka 4.x finalizes
``transaction.version`` 2: KIP-890 part 2, partitions registered by Produce, the epoch bumped
at every EndTxn) and ``v1`` on a cluster of its own whose ``transaction.version`` is downgraded
to 1 (AddPartitionsToTxn, AddOffsetsToTxn, Produce at most v11). Reads wait for a committed
sentinel record rather than for time to pass."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import TopicPartition as CTopicPartition

import kcore
from kcore.admin import NewTopic
from kcore.cluster.client import ClusterClient, broker_id
from kcore.cluster.metadata import BrokerInfo
from kcore.errors import (
    InvalidProducerEpochError,
    MessageTooLargeError,
    ProducerFencedError,
    TransactionAbortedError,
    TransactionalIdAuthorizationFailedError,
    TransactionStateError,
)
from kcore.network.backoff import ExponentialBackoff
from kcore.producer.idempotence import IdempotenceState
from kcore.producer.transactions import TransactionManager
from kcore.producer.txn_state import TransactionStateMachine, TxnState
from kcore.protocol.messages import EndTxnResponse, OffsetFetchRequest
from kcore.protocol.messages.offset_fetch_request import OffsetFetchRequestTopic
from kcore.testing import KafkaCluster

SENTINEL = b"--sentinel--"
UNSTABLE_OFFSET_COMMIT = 88


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create(bootstrap: str, topic: str, partitions: int = 1, **config: str) -> None:
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1, config=config)])


def producer(bootstrap: str, txn_id: str | None = None, **extra: object) -> kcore.Producer:
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "transactional.id": txn_id or name("txn"),
        "linger.ms": 1,
    }
    config.update(extra)
    return kcore.Producer(config)


async def _wait_for_feature(bootstrap: str, level: int, timeout: float = 30) -> None:
    cluster = ClusterClient({"bootstrap.servers": bootstrap})
    await cluster.start()
    try:
        await cluster.ready(timeout)
        deadline = time.monotonic() + timeout
        while True:
            node = next(iter(cluster.metadata.brokers))
            conn = await cluster.connection(node)
            if conn.finalized_features.get("transaction.version") == level:
                return
            assert time.monotonic() < deadline, conn.finalized_features
            conn.close()  # a new connection gets a fresh ApiVersions answer
            await asyncio.sleep(0.2)
    finally:
        await cluster.close()


@pytest.fixture(scope="module")
def tv1_cluster(tmp_path_factory):
    """A one-node cluster with ``transaction.version`` downgraded to 1."""
    work = tmp_path_factory.mktemp("kafka-tv1-", numbered=True)
    with KafkaCluster(1, work_dir=work, keep_logs=True) as cluster:
        bootstrap = cluster.bootstrap_servers
        cluster.run_tool(
            "kafka-features",
            "--bootstrap-server",
            bootstrap,
            "downgrade",
            "--feature",
            "transaction.version=1",
            check=True,
        )
        asyncio.run(_wait_for_feature(bootstrap, 1))
        yield cluster


@pytest.fixture(params=["v2", "v1"])
def txn_cluster(request):
    """(cluster, the transaction protocol the producer is expected to use)."""
    if request.param == "v1":
        return request.getfixturevalue("tv1_cluster"), 1
    return request.getfixturevalue("kafka_cluster"), 2


def read_kcore(
    bootstrap: str,
    topic: str,
    partitions: int = 1,
    *,
    isolation: str = "read_committed",
    until: bytes = SENTINEL,
    count: int | None = None,
    arrow: bool = False,
    timeout: float = 30,
    **extra: object,
) -> list[tuple[int, int, bytes | None]]:
    """(partition, offset, value) of the topic's records read by kcore from the beginning until
    the ``until`` value was read on every partition (or ``count`` records), at most
    ``timeout`` seconds."""
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "auto.offset.reset": "earliest",
        "isolation.level": isolation,
    }
    config.update(extra)
    got: list[tuple[int, int, bytes | None]] = []
    done: set[int] = set()
    with kcore.Consumer(config) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if arrow:
                rb = consumer.poll_arrow(0.5)
                rows = zip(
                    rb.column("partition").to_pylist(),
                    rb.column("offset").to_pylist(),
                    rb.column("value").to_pylist(),
                    strict=True,
                )
            else:
                rows = ((r.partition, r.offset, r.value) for r in consumer.poll(0.5))
            for row in rows:
                got.append(row)
                if row[2] == until:
                    done.add(row[0])
            if count is not None and len(got) >= count:
                break
            if count is None and len(done) == partitions:
                break
    return got


def read_confluent(bootstrap: str, topic: str) -> list[bytes | None]:
    """Values of partition 0 read by librdkafka with isolation.level=read_committed, until the
    sentinel."""
    consumer = ConfluentConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": name("reader"),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([CTopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: list[bytes | None] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and SENTINEL not in values:
            for msg in consumer.consume(1000, 0.5):
                assert msg.error() is None, msg.error()
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def commit_sentinel(p: kcore.Producer, topic: str, partitions: int = 1) -> None:
    p.begin_transaction()
    for partition in range(partitions):
        p.send(topic, SENTINEL, partition=partition)
    p.commit_transaction(30)


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (OffsetFetch with require_stable: pending transactional
    offsets are waited for)."""

    async def fetch() -> dict[int, int]:
        cluster = ClusterClient({"bootstrap.servers": bootstrap})
        await cluster.start()
        try:
            deadline = time.monotonic() + 30
            while True:
                node = (await cluster.find_coordinator(group, key_type=0)).node_id
                version = await cluster.version_for(node, 9, min_version=7, max_version=7)
                request = OffsetFetchRequest(
                    group_id=group,
                    topics=[
                        OffsetFetchRequestTopic(
                            name=topic, partition_indexes=list(range(partitions))
                        )
                    ],
                    require_stable=True,
                )
                response = await cluster.send(node, request, version)
                codes = {response.error_code} | {
                    p.error_code for t in response.topics for p in t.partitions
                }
                if codes <= {0}:
                    return {
                        p.partition_index: p.committed_offset
                        for t in response.topics
                        for p in t.partitions
                    }
                assert codes <= {0, UNSTABLE_OFFSET_COMMIT}, codes
                assert time.monotonic() < deadline, "offsets stayed unstable"
                await asyncio.sleep(0.1)
        finally:
            await cluster.close()

    return asyncio.run(fetch())


# -- commit and abort -------------------------------------------------------------------------


def test_commit_makes_records_visible_to_read_committed(txn_cluster):
    cluster, protocol = txn_cluster
    bootstrap = cluster.bootstrap_servers
    topic = name("txn-commit")
    create(bootstrap, topic, 3)
    with producer(bootstrap) as p:
        p.init_transactions(30)
        assert p._core.txn.version == protocol
        p.begin_transaction()
        futures = [p.send(topic, b"v%d" % i, key=b"k%d" % i) for i in range(60)]
        p.flush(30)
        # Written, but open: read_uncommitted sees the records, read_committed not yet (the
        # last stable offset stays before the open transaction).
        assert len(read_kcore(bootstrap, topic, 3, isolation="read_uncommitted", count=60)) == 60
        assert read_kcore(bootstrap, topic, 3, count=1, timeout=1.5) == []
        epoch = p._core.identity.epoch
        p.commit_transaction(30)
        # v2: the coordinator bumps the epoch at every EndTxn; v1 keeps it
        assert p._core.identity.epoch == epoch + (1 if protocol == 2 else 0)
        metas = [f.result(0) for f in futures]
        commit_sentinel(p, topic, 3)
    got = read_kcore(bootstrap, topic, 3)
    values = {(part, off): v for part, off, v in got if v != SENTINEL}
    assert values == {(m.partition, m.offset): b"v%d" % i for i, m in enumerate(metas)}


def test_abort_hides_records_from_read_committed_only(txn_cluster):
    cluster, protocol = txn_cluster
    bootstrap = cluster.bootstrap_servers
    topic = name("txn-abort")
    create(bootstrap, topic, 2)
    with producer(bootstrap, **{"linger.ms": 60_000}) as p:  # nothing goes before a flush
        p.init_transactions(30)
        assert p._core.txn.version == protocol
        p.begin_transaction()
        sent = [p.send(topic, b"aborted-%d" % i, partition=i % 2) for i in range(40)]
        p.flush(30)  # on the broker, then aborted
        p.abort_transaction(30)
        assert all(f.exception() is None for f in sent)  # delivered; the transaction aborted
        p.begin_transaction()
        unsent = p.send(topic, b"never-sent", partition=0)  # lingers; aborted before it goes
        p.abort_transaction(30)
        assert isinstance(unsent.exception(), TransactionAbortedError)
        commit_sentinel(p, topic, 2)
    committed = read_kcore(bootstrap, topic, 2)
    assert sorted(v for _, _, v in committed) == [SENTINEL, SENTINEL]
    uncommitted = read_kcore(bootstrap, topic, 2, isolation="read_uncommitted")
    values = [v for _, _, v in uncommitted]
    assert sorted(v for v in values if v and v.startswith(b"aborted")) == sorted(
        b"aborted-%d" % i for i in range(40)
    )


def test_interleaved_transactions_read_back_exactly_the_committed(txn_cluster):
    """Two transactional producers on one partition, their transactions open at the same time,
    committed and aborted in turn: the log interleaves committed and aborted batches. kcore's
    poll and poll_arrow (with small fetches, so aborted transactions span responses) and
    librdkafka read exactly the committed records, in order."""
    cluster, protocol = txn_cluster
    bootstrap = cluster.bootstrap_servers
    topic = name("txn-mixed")
    create(bootstrap, topic, 1)
    expected: list[bytes] = []
    with producer(bootstrap) as a, producer(bootstrap) as b:
        a.init_transactions(30)
        b.init_transactions(30)
        assert a._core.txn.version == b._core.txn.version == protocol
        for round_ in range(8):
            a.begin_transaction()
            b.begin_transaction()
            batch_a = [b"a%d-%d" % (round_, i) for i in range(25)]
            batch_b = [b"b%d-%d" % (round_, i) for i in range(25)]
            for va, vb in zip(batch_a, batch_b, strict=True):
                a.send(topic, va, partition=0)
                b.send(topic, vb, partition=0)
                if va.endswith(b"-12"):
                    a.flush(30)
                    b.flush(30)
            commit_a = round_ % 2 == 0
            commit_b = round_ % 3 == 0
            # Whoever ends first, the other's records stay interleaved in the log.
            (a.commit_transaction if commit_a else a.abort_transaction)(30)
            (b.commit_transaction if commit_b else b.abort_transaction)(30)
            expected += [v for v, keep in ((v, commit_a) for v in batch_a) if keep]
            expected += [v for v, keep in ((v, commit_b) for v in batch_b) if keep]
        commit_sentinel(a, topic)
    expected.append(SENTINEL)

    small = {"max.partition.fetch.bytes": 600, "fetch.max.bytes": 600}
    polled = read_kcore(bootstrap, topic, **small)
    assert sorted(v for _, _, v in polled) == sorted(expected)
    offsets = [o for _, o, _ in polled]
    assert offsets == sorted(offsets)
    arrow = read_kcore(bootstrap, topic, arrow=True, **small)
    assert [(o, v) for _, o, v in arrow] == [(o, v) for _, o, v in polled]
    assert read_confluent(bootstrap, topic) == [v for _, _, v in polled]
    # each producer's committed records in its send order
    for prefix in (b"a", b"b"):
        mine = [v for _, _, v in polled if v.startswith(prefix) and v != SENTINEL]
        assert mine == [v for v in expected if v.startswith(prefix) and v != SENTINEL]


# -- offsets ----------------------------------------------------------------------------------


def test_send_offsets_to_transaction_commits_with_the_transaction(txn_cluster):
    cluster, protocol = txn_cluster
    bootstrap = cluster.bootstrap_servers
    source, sink = name("txn-src"), name("txn-sink")
    create(bootstrap, source, 2)
    create(bootstrap, sink, 1)
    group = name("txn-group")
    with producer(bootstrap) as p:
        p.init_transactions(30)
        assert p._core.txn.version == protocol
        p.begin_transaction()
        p.send(sink, b"out-1", partition=0)
        p.send_offsets_to_transaction({(source, 0): 42, (source, 1): 7}, group)
        p.commit_transaction(30)
        assert committed_offsets(bootstrap, group, source, 2) == {0: 42, 1: 7}

        p.begin_transaction()  # offsets alone (no record) in a transaction, aborted
        p.send_offsets_to_transaction(
            {kcore.TopicPartition(source, 0): 99}, kcore.ConsumerGroupMetadata(group)
        )
        p.abort_transaction(30)
        assert committed_offsets(bootstrap, group, source, 2) == {0: 42, 1: 7}

        p.begin_transaction()
        p.send_offsets_to_transaction({(source, 1): 8}, kcore.ConsumerGroupMetadata(group))
        p.commit_transaction(30)
        assert committed_offsets(bootstrap, group, source, 2) == {0: 42, 1: 8}
        commit_sentinel(p, sink)
    assert [v for _, _, v in read_kcore(bootstrap, sink)] == [b"out-1", SENTINEL]


# -- errors -----------------------------------------------------------------------------------


def test_a_second_producer_with_the_same_id_fences_the_first(txn_cluster):
    cluster, protocol = txn_cluster
    bootstrap = cluster.bootstrap_servers
    topic = name("txn-fence")
    create(bootstrap, topic, 1)
    txn_id = name("shared")
    first = producer(bootstrap, txn_id)
    try:
        first.init_transactions(30)
        first.begin_transaction()
        first.send(topic, b"zombie", partition=0)
        first.flush(30)
        with producer(bootstrap, txn_id) as second:
            second.init_transactions(30)  # fences the first, aborts its open transaction
            with pytest.raises(ProducerFencedError) as raised:
                first.commit_transaction(30)
            assert txn_id in str(raised.value)
            # every further call raises too
            with pytest.raises(ProducerFencedError):
                first.begin_transaction()
            with pytest.raises(ProducerFencedError):
                first.send(topic, b"more", partition=0)
            with pytest.raises(ProducerFencedError):
                first.abort_transaction(30)
            second.begin_transaction()
            second.send(topic, b"from-second", partition=0)
            second.commit_transaction(30)
            commit_sentinel(second, topic)
    finally:
        first.close(5)
    assert [v for _, _, v in read_kcore(bootstrap, topic)] == [b"from-second", SENTINEL]


def test_a_failed_produce_makes_the_transaction_abortable(txn_cluster):
    """A record the broker refuses (larger than the topic's max.message.bytes) fails the
    transaction: commit raises naming the cause, abort works, the next transaction commits."""
    cluster, protocol = txn_cluster
    bootstrap = cluster.bootstrap_servers
    topic = name("txn-fail")
    create(bootstrap, topic, 2, **{"max.message.bytes": "2000"})
    with producer(bootstrap) as p:
        p.init_transactions(30)
        p.begin_transaction()
        good = [p.send(topic, b"ok-%d" % i, partition=0) for i in range(10)]
        p.flush(30)
        too_big = p.send(topic, b"x" * 10_000, partition=1)
        with pytest.raises(TransactionStateError) as raised:
            p.commit_transaction(30)
        assert raised.value.abortable
        assert "MESSAGE_TOO_LARGE" in str(raised.value) or "RECORD_LIST_TOO_LARGE" in str(
            raised.value
        )
        assert too_big.exception() is not None
        assert all(f.exception() is None for f in good)
        with pytest.raises(TransactionStateError):
            p.send(topic, b"after the failure", partition=0)
        epoch = p._core.identity.epoch
        p.abort_transaction(30)
        # The failed batch had sequence numbers: a new epoch (v1: InitProducerId, KIP-360;
        # v2: the EndTxn answer) so that the next batches do not follow on from them.
        assert p._core.identity.epoch == epoch + 1

        p.begin_transaction()
        p.send(topic, b"next", partition=1)
        p.send(topic, b"next", partition=0)
        p.commit_transaction(30)
        commit_sentinel(p, topic, 2)
    got = read_kcore(bootstrap, topic, 2)
    assert sorted((part, v) for part, _, v in got) == [
        (0, SENTINEL),
        (0, b"next"),
        (1, SENTINEL),
        (1, b"next"),
    ]


def test_a_transaction_the_coordinator_timed_out_is_aborted_and_the_producer_goes_on(
    kafka_cluster,
):
    """KIP-588 (transaction protocol v2): the coordinator aborts a transaction that ran past
    transaction.timeout.ms and bumps the epoch; the next Produce gets INVALID_PRODUCER_EPOCH.
    As Java's InvalidProducerEpochException that fails the transaction, not the producer:
    abort_transaction works and the next transaction commits (it was fatal)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("txn-timeout")
    create(bootstrap, topic, 1)
    with producer(bootstrap, **{"transaction.timeout.ms": 1000}) as p:
        p.init_transactions(30)
        p.begin_transaction()
        p.send(topic, b"timed out", partition=0).result(30)
        # The broker looks for timed-out transactions every 10 s by default.
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the coordinator never timed the transaction out"
            time.sleep(0.5)
            error = p.send(topic, b"late", partition=0).exception(30)
            if error is not None:
                break
        assert isinstance(error, InvalidProducerEpochError)
        with pytest.raises(TransactionStateError) as raised:
            p.commit_transaction(30)
        assert raised.value.abortable
        p.abort_transaction(30)
        p.begin_transaction()
        p.send(topic, b"next", partition=0)
        p.commit_transaction(30)
        commit_sentinel(p, topic, 1)
    assert [v for _, _, v in read_kcore(bootstrap, topic)] == [b"next", SENTINEL]


def test_latest_under_read_committed_is_the_last_stable_offset(kafka_cluster):
    """auto.offset.reset=latest under read_committed starts at the last stable offset (as
    Java's ListOffsets with the consumer's isolation level): an open transaction's records,
    committed later, are read (starting at the high watermark skipped them)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("txn-lso")
    create(bootstrap, topic, 1)
    config = {
        "bootstrap.servers": bootstrap,
        "isolation.level": "read_committed",
        "auto.offset.reset": "latest",
    }
    with producer(bootstrap) as p:
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(5):
            p.send(topic, b"open-%d" % i, partition=0)
        p.flush(30)
        with kcore.Consumer(config) as c:
            c.assign([(topic, 0)])
            assert c.position((topic, 0)) == 0
            p.commit_transaction(30)
            got: list = []
            deadline = time.monotonic() + 30
            while len(got) < 5 and time.monotonic() < deadline:
                got += c.poll(0.5)
    assert [r.value for r in got] == [b"open-%d" % i for i in range(5)]


def test_calls_out_of_order_raise(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("txn-state")
    create(bootstrap, topic, 1)
    with producer(bootstrap) as p:
        with pytest.raises(TransactionStateError, match="init_transactions"):
            p.send(topic, b"early")
        with pytest.raises(TransactionStateError, match="init_transactions"):
            p.begin_transaction()
        p.init_transactions(30)
        with pytest.raises(TransactionStateError):
            p.init_transactions(30)
        with pytest.raises(TransactionStateError, match="begin_transaction"):
            p.send(topic, b"outside")
        with pytest.raises(TransactionStateError):
            p.send_batch(topic, [b"outside"])
        with pytest.raises(TransactionStateError):
            p.commit_transaction(30)
        with pytest.raises(TransactionStateError):
            p.abort_transaction(30)
        p.begin_transaction()
        with pytest.raises(TransactionStateError):
            p.begin_transaction()
        p.commit_transaction(30)  # an empty transaction: nothing to send to the coordinator
        p.begin_transaction()
        p.send_batch(topic, [b"b1", b"b2"], partition=0)
        p.commit_transaction(30)
        commit_sentinel(p, topic)
    with kcore.Producer({"bootstrap.servers": bootstrap}) as plain:
        with pytest.raises(TransactionStateError, match="transactional.id"):
            plain.begin_transaction()
    assert [v for _, _, v in read_kcore(bootstrap, topic)] == [b"b1", b"b2", SENTINEL]


def test_async_producer_and_close_aborting_an_open_transaction(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic = name("txn-async")
    create(bootstrap, topic, 1)
    txn_id = name("async")

    async def run() -> None:
        config = {"bootstrap.servers": bootstrap, "transactional.id": txn_id}
        async with kcore.AsyncProducer(config) as p:
            await p.init_transactions(30)
            await p.begin_transaction()
            for i in range(5):
                await p.send(topic, b"async-%d" % i, partition=0)
            await p.commit_transaction(30)
            await p.begin_transaction()
            future = await p.send(topic, b"open-at-close", partition=0)
            await p.flush(30)
            assert future.exception() is None
        # closed with the transaction open: aborted, so a new producer of the id needs not
        # wait for the transaction timeout
        async with kcore.AsyncProducer(config) as p:
            await p.init_transactions(30)
            await p.begin_transaction()
            await p.send(topic, SENTINEL, partition=0)
            await p.commit_transaction(30)

    asyncio.run(run())
    values = [v for _, _, v in read_kcore(bootstrap, topic)]
    assert values == [b"async-%d" % i for i in range(5)] + [SENTINEL]


# -- the state machine and the coordinator rules, without a broker ----------------------------


class FakeConnection:
    def version_for(self, api_key: int, **limits: object) -> int:
        return 5 if limits.get("min_version") == 5 else 4


class FakeCluster:
    """Answers EndTxn with the scripted error codes, one per request, and records which
    coordinator each request went to; each lookup names the next node."""

    def __init__(self, codes: list[int]) -> None:
        self.codes = list(codes)
        self.lookups = 0
        self.sent_to: list[int] = []
        self.retry_backoff = ExponentialBackoff(1, 2)

    async def find_coordinator(
        self, key: str, key_type: int = 0, timeout: float | None = None
    ) -> BrokerInfo:
        self.lookups += 1
        return BrokerInfo(self.lookups, "127.0.0.1", 9092)

    async def connection(self, node: int) -> FakeConnection:
        return FakeConnection()

    async def send(
        self, node: int, request: object, version: int, timeout: float | None = None
    ) -> object:
        self.sent_to.append(broker_id(node))  # (coordinators have connections of their own)
        return EndTxnResponse(error_code=self.codes.pop(0), producer_id=1000, producer_epoch=4)


class Scripted:
    """A transaction state machine in READY (producer id 1000, epoch 3) and the coordinator
    requests that drive it over a FakeCluster; ``producers``: each new id and epoch taken."""

    def __init__(self, codes: list[int] | None = None, version: int = 1) -> None:
        self.cluster = FakeCluster(codes or [])
        self.machine = TransactionStateMachine("t-1")
        self.identity = IdempotenceState()
        self.identity.reset(1000, 3)
        self.producers: list[tuple[int, int]] = []
        self.requests = TransactionManager(
            self.machine,
            self.identity,
            self.cluster,  # type: ignore[arg-type]
            60000,
            renumber_waiting=lambda: self.producers.append(self.identity.producer),
            wake_sender=lambda: None,
        )
        self.machine.initialized(version, can_bump_epoch=True, produce_versions={})


def test_coordinator_errors_refind_or_retry_on_the_same_coordinator():
    # NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE look the coordinator up again;
    # COORDINATOR_LOAD_IN_PROGRESS and CONCURRENT_TRANSACTIONS retry on the same one.
    t = Scripted([16, 14, 51, 15, 0], version=2)
    t.machine.begin()
    t.machine.offsets_added()  # (something to end)
    t.machine.start_commit()
    asyncio.run(t.requests.end(commit=True))
    assert t.cluster.sent_to == [1, 2, 2, 2, 3]
    assert t.cluster.lookups == 3
    assert t.machine.state is TxnState.READY
    assert t.producers == [(1000, 4)]  # v2: EndTxn v5's bumped epoch is taken


@pytest.mark.parametrize("code", [90, 47])
def test_fencing_is_fatal_and_every_later_call_raises(code):
    t = Scripted([code])
    txn = t.machine
    txn.begin()
    txn.offsets_added()
    txn.start_commit()
    with pytest.raises(ProducerFencedError, match="t-1"):
        asyncio.run(t.requests.end(commit=True))
    assert txn.state is TxnState.FATAL_ERROR
    for call in (txn.begin, txn.check_can_send, txn.start_abort, txn.check_initializable):
        with pytest.raises(ProducerFencedError):
            call()


def test_transactional_id_authorization_failure_is_fatal():
    t = Scripted([53])
    t.machine.begin()
    t.machine.offsets_added()
    t.machine.start_commit()
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        asyncio.run(t.requests.end(commit=True))
    with pytest.raises(TransactionalIdAuthorizationFailedError, match="t-1"):
        t.machine.begin()


def test_a_failed_batch_makes_the_transaction_abortable():
    t = Scripted([0])  # (the answer to the epoch bump)
    txn = t.machine
    txn.begin()
    assert txn.undrained_error() is None
    txn.batch_failed(MessageTooLargeError("too big"), used_sequence=True)
    assert txn.state is TxnState.ABORTABLE_ERROR and txn.epoch_bump_required
    assert isinstance(txn.undrained_error(), TransactionAbortedError)
    with pytest.raises(TransactionStateError) as raised:
        txn.start_commit()
    assert raised.value.abortable and isinstance(raised.value.cause, MessageTooLargeError)
    txn.start_abort()
    assert txn.state is TxnState.ABORTING
    txn.batch_failed(MessageTooLargeError("in flight"), used_sequence=False)  # ignored now
    assert txn.state is TxnState.ABORTING
    # Nothing was registered: no EndTxn. The failed batch was numbered: v1 bumps the epoch
    # with InitProducerId (KIP-360).
    asyncio.run(t.requests.end(commit=False))
    assert t.cluster.sent_to == [1]
    assert t.producers == [(1000, 4)]
    assert txn.state is TxnState.READY and not txn.epoch_bump_required


def test_concurrent_transactions_on_the_first_registration_retries_after_20_ms():
    """CONCURRENT_TRANSACTIONS answering a transaction's first AddPartitionsToTxn (the
    previous transaction is still being completed) is retried after 20 ms, as Java's, not
    after retry.backoff.ms (here 1 s)."""
    from kcore.protocol.messages.add_partitions_to_txn_response import (
        AddPartitionsToTxnPartitionResult,
        AddPartitionsToTxnResponse,
        AddPartitionsToTxnTopicResult,
    )

    tp = kcore.TopicPartition("t", 0)
    t = Scripted(version=1)
    t.cluster.retry_backoff = ExponentialBackoff(1000, 1000)
    answers = [51, 51, 0]

    async def send(node: int, request: object, version: int, timeout: float | None = None):
        t.cluster.sent_to.append(broker_id(node))
        part = AddPartitionsToTxnPartitionResult(
            partition_index=0, partition_error_code=answers.pop(0)
        )
        topic = AddPartitionsToTxnTopicResult(name="t", results_by_partition=[part])
        return AddPartitionsToTxnResponse(error_code=0, results_by_topic_v3_and_below=[topic])

    t.cluster.send = send  # type: ignore[method-assign]
    t.machine.begin()
    assert not t.machine.may_send(tp)  # noted for registration

    async def register() -> None:
        t.requests.ensure_adding()
        await t.requests._add_task

    started = time.monotonic()
    asyncio.run(register())
    assert time.monotonic() - started < 0.5
    assert t.cluster.sent_to == [1, 1, 1] and not answers
    assert t.machine.may_send(tp) and t.machine.started
