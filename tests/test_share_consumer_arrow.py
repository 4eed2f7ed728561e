"""ShareConsumer.poll_arrow against a real Kafka broker: the acquired records as one Arrow record
batch (the normal consumer's columns and delivery_count), acknowledged whole or row by row;
released rows coming back with a higher delivery count; members reading batches, each record
accepted once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from share_helpers import new_share_topic
from share_helpers import produce as produce_numbered

import kcore
from kcore import AcknowledgeType, ShareConsumer
from kcore.errors import AcknowledgementError, KcoreError, WakeupError

EXPLICIT = {"share.acknowledgement.mode": "explicit"}


@pytest.fixture
def share_topic(kafka_cluster: Any) -> tuple[str, str]:
    return new_share_topic(kafka_cluster)


def produce(bootstrap: str, topic: str, n: int, partitions: int = 2) -> None:
    """Numbered records, each with a header (the Arrow headers column is not all null)."""
    produce_numbered(bootstrap, topic, n, partitions, headers=[("h", b"x")])


def consumer(cluster: Any, group: str, **extra: Any) -> ShareConsumer:
    return ShareConsumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": group, **extra}
    )


def batches_until(c: ShareConsumer, want: int, timeout: float = 60, ack: Any = None) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while sum(b.num_rows for b in got) < want and time.monotonic() < deadline:
        batch = c.poll_arrow(0.5)
        if ack is not None and batch.num_rows:
            c.acknowledge_batch(batch, ack)
        if batch.num_rows:
            got.append(batch)
    return got


def test_poll_arrow_has_the_consumer_s_columns_and_delivery_count(
    kafka_cluster: Any, share_topic: Any
) -> None:
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 30)
    # The normal consumer's columns, in its order, and delivery_count.
    plain_config = {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "auto.offset.reset": "earliest",
    }
    with kcore.Consumer(plain_config) as plain:
        plain.assign([kcore.TopicPartition(topic, 0)])
        deadline = time.monotonic() + 30
        normal = plain.poll_arrow(0.5)
        while not normal.num_rows and time.monotonic() < deadline:
            normal = plain.poll_arrow(0.5)
    assert normal.num_rows
    with consumer(kafka_cluster, group, **EXPLICIT) as c:
        c.subscribe([topic])
        empty = c.poll_arrow(0)  # nothing yet, or some rows: either way the same columns
        if empty.num_rows:
            c.acknowledge_batch(empty, AcknowledgeType.ACCEPT)
        got = ([empty] if empty.num_rows else []) + batches_until(
            c, 30 - empty.num_rows, ack=AcknowledgeType.ACCEPT
        )
        table = pa.Table.from_batches(got)
        assert table.schema.names == [*normal.schema.names, "delivery_count"]
        for field in normal.schema:
            assert table.schema.field(field.name).type == field.type, field.name
        assert empty.schema == table.schema
        assert table.num_rows == 30
        assert sorted(table.column("value").to_pylist()) == sorted(b"v%d" % i for i in range(30))
        assert set(table.column("delivery_count").to_pylist()) == {1}
        assert set(table.column("topic").to_pylist()) == {topic}
        rows = table.to_pylist()
        assert all(r["key"] == b"k" + r["value"][1:] for r in rows)
        assert all(r["partition"] == int(r["value"][1:]) % 2 for r in rows)
        assert all(r["headers"] == [{"key": "h", "value": b"x"}] for r in rows)
        results = c.commit_sync(30)
        assert all(err is None for err in results.values()), results
        assert batches_until(c, 1, timeout=3) == []  # each accepted once: none left


def test_rows_released_come_back_with_a_higher_delivery_count(
    kafka_cluster: Any, share_topic: Any
) -> None:
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 10)
    with consumer(kafka_cluster, group, **EXPLICIT) as c:
        c.subscribe([topic])
        seen: dict[bytes, list[int]] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(len(v) for v in seen.values()) < 20:
            batch = c.poll_arrow(0.5)
            # Row by row: first deliveries released, second ones accepted.
            for row in batch.to_pylist():
                seen.setdefault(row["value"], []).append(row["delivery_count"])
                first = row["delivery_count"] == 1
                c.acknowledge_offset(
                    row["topic"],
                    row["partition"],
                    row["offset"],
                    AcknowledgeType.RELEASE if first else AcknowledgeType.ACCEPT,
                )
        assert seen == {b"v%d" % i: [1, 2] for i in range(10)}
        assert all(err is None for err in c.commit_sync(30).values())
        assert batches_until(c, 1, timeout=3) == []


def test_a_batch_is_acknowledged_whole_or_not_at_all(kafka_cluster: Any, share_topic: Any) -> None:
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 6, partitions=1)
    with consumer(kafka_cluster, group, **EXPLICIT) as c:
        c.subscribe([topic])
        batch = batches_until(c, 1)[0]
        n = batch.num_rows
        assert n >= 2  # one produce batch, one acquisition
        c.acknowledge_offset(topic, 0, batch.column("offset")[0].as_py(), AcknowledgeType.ACCEPT)
        # Its first row is acknowledged already: the whole batch is refused, nothing changed.
        with pytest.raises(AcknowledgementError):
            c.acknowledge_batch(batch, AcknowledgeType.RELEASE)
        c.acknowledge_batch(batch.slice(1), AcknowledgeType.RELEASE)
        with pytest.raises(AcknowledgementError):
            c.acknowledge_batch(batch.slice(1), AcknowledgeType.ACCEPT)  # acknowledged already
        with pytest.raises(KcoreError):
            c.acknowledge_batch([1, 2], AcknowledgeType.ACCEPT)
        with pytest.raises(AcknowledgementError):
            c.acknowledge_offset(topic, 0, 10**9)
        with pytest.raises(AcknowledgementError):
            c.acknowledge_batch(batch, 9)
        with pytest.raises(KcoreError):
            c.poll_arrow(0, max_records=0)
        assert all(err is None for err in c.commit_sync(30).values())
        again = batches_until(c, n - 1, ack=AcknowledgeType.ACCEPT)
        table = pa.Table.from_batches(again)
        released = batch.slice(1).column("offset").to_pylist()
        got = dict(
            zip(
                table.column("offset").to_pylist(),
                table.column("delivery_count").to_pylist(),
                strict=True,
            )
        )
        assert {o: got.get(o) for o in released} == {o: 2 for o in released}
    with consumer(kafka_cluster, group) as implicit:
        implicit.subscribe([topic])
        with pytest.raises(AcknowledgementError):
            implicit.acknowledge_batch(batch, AcknowledgeType.ACCEPT)  # implicit mode


def test_poll_and_poll_arrow_taking_turns_hand_out_every_record_once(
    kafka_cluster: Any, share_topic: Any
) -> None:
    """poll_arrow makes the fetches that follow decode into Arrow columns, poll into records;
    whatever the buffer holds when the caller switches is handed out the other way. Two waves
    of records: the first fetched while poll_arrow waits (then taken by both), the second
    while poll waits. Every record comes once, with the fields a plain consumer reads."""
    topic, group = share_topic
    bootstrap = kafka_cluster.bootstrap_servers
    got: dict[tuple[int, int], tuple[Any, ...]] = {}

    def take(c: ShareConsumer, arrow: bool) -> int:
        if arrow:
            batch = c.poll_arrow(0.5, max_records=23)
            for row in batch.to_pylist():
                key = (row["partition"], row["offset"])
                assert key not in got
                headers = tuple((h["key"], h["value"]) for h in row["headers"])
                stamp = int(row["timestamp"].timestamp() * 1000)
                got[key] = (row["key"], row["value"], stamp, headers)
                assert row["delivery_count"] == 1 and row["topic"] == topic
            if batch.num_rows:
                c.acknowledge_batch(batch, AcknowledgeType.ACCEPT)
            return int(batch.num_rows)
        records = c.poll(0.5)
        for r in records:
            key = (r.partition, r.offset)
            assert key not in got
            got[key] = (r.key, r.value, r.timestamp, tuple(r.headers))
            assert r.delivery_count == 1 and r.topic == topic
            c.acknowledge(r, AcknowledgeType.ACCEPT)
        return len(records)

    # Polls smaller than a fetch's run, so that a run is taken both ways.
    with consumer(kafka_cluster, group, **EXPLICIT, **{"max.poll.records": 17}) as c:
        c.subscribe([topic])
        for wave, arrow_first in ((0, True), (1, False)):
            produce_numbered(bootstrap, topic, 100, 2, headers=[("h", b"x")], start=100 * wave)
            deadline = time.monotonic() + 60
            while not take(c, arrow_first):
                assert time.monotonic() < deadline, "no records"
            turn = 0
            while len(got) < 100 * (wave + 1):
                assert time.monotonic() < deadline, f"{len(got)} records"
                turn += 1
                take(c, arrow_first != bool(turn % 2))
        assert all(err is None for err in c.commit_sync(30).values())
    plain_config = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
    want: dict[tuple[int, int], tuple[Any, ...]] = {}
    with kcore.Consumer(plain_config) as plain:
        plain.assign([kcore.TopicPartition(topic, 0), kcore.TopicPartition(topic, 1)])
        deadline = time.monotonic() + 30
        while len(want) < 200 and time.monotonic() < deadline:
            for r in plain.poll(0.5):
                want[(r.partition, r.offset)] = (r.key, r.value, r.timestamp, tuple(r.headers))
    assert got == want


def test_a_batch_of_an_earlier_poll_is_not_taken_for_the_last_one(
    kafka_cluster: Any, share_topic: Any
) -> None:
    """acknowledge_batch of the batch the last poll_arrow made takes its offsets from what that
    poll handed out; any other batch (an earlier poll's, a copy) is read by its columns: an
    earlier batch acknowledged again is refused and leaves the last poll's records owed."""
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 12, partitions=1)
    limit = {"max.poll.records": 3, "share.acquire.mode": "record_limit"}
    with consumer(kafka_cluster, group, **EXPLICIT, **limit) as c:
        c.subscribe([topic])
        first = batches_until(c, 1)[0]
        c.acknowledge_batch(first, AcknowledgeType.ACCEPT)
        second = batches_until(c, 1)[0]
        assert set(second.column("offset").to_pylist()).isdisjoint(
            first.column("offset").to_pylist()
        )
        with pytest.raises(AcknowledgementError, match="acknowledged already|not delivered"):
            c.acknowledge_batch(first, AcknowledgeType.ACCEPT)
        copy = pa.record_batch(second.columns, schema=second.schema)
        c.acknowledge_batch(copy, AcknowledgeType.RELEASE)  # by its columns: all of second
        with pytest.raises(AcknowledgementError, match="acknowledged already"):
            c.acknowledge_batch(second, AcknowledgeType.ACCEPT)
        assert all(err is None for err in c.commit_sync(30).values())
        # The released rows come back, with a delivery count of 2.
        rest = batches_until(c, 12 - first.num_rows, ack=AcknowledgeType.ACCEPT)
        again = pa.Table.from_batches(rest)
        counts = dict(
            zip(
                again.column("offset").to_pylist(),
                again.column("delivery_count").to_pylist(),
                strict=True,
            )
        )
        assert all(counts.get(o) == 2 for o in second.column("offset").to_pylist())


class ArrowMember(threading.Thread):
    """Polls Arrow batches in its own thread, accepting each whole batch."""

    def __init__(self, cluster: Any, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        limit = {"max.poll.records": 10, "share.acquire.mode": "record_limit"}
        self.consumer = consumer(cluster, group, **EXPLICIT, **limit)
        self.topic = topic
        self.values: list[bytes] = []
        self.counts: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.consumer.subscribe([self.topic])
            while not self.stop.is_set():
                batch = self.consumer.poll_arrow(0.5)
                self.values.extend(batch.column("value").to_pylist())
                self.counts.extend(batch.column("delivery_count").to_pylist())
                self.consumer.acknowledge_batch(batch, AcknowledgeType.ACCEPT)
                time.sleep(0.005 * batch.num_rows)  # the work, during which others take theirs
        except WakeupError:
            pass
        except BaseException as exc:
            self.error = exc
        finally:
            self.consumer.close()


def test_arrow_members_accept_every_record_once(kafka_cluster: Any, share_topic: Any) -> None:
    topic, group = share_topic
    members = [ArrowMember(kafka_cluster, group, topic) for _ in range(3)]
    for m in members:
        m.start()
    total = 300
    produce(kafka_cluster.bootstrap_servers, topic, total)
    deadline = time.monotonic() + 90
    while sum(len(m.values) for m in members) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    for m in members:
        m.stop.set()
    for m in members:
        m.join(30)
        assert m.error is None, m.error
    values = [v for m in members for v in m.values]
    assert sorted(values) == sorted(b"v%d" % i for i in range(total))
    assert all(n == 1 for m in members for n in m.counts)
    with consumer(kafka_cluster, group) as late:
        late.subscribe([topic])
        assert batches_until(late, 1, timeout=4) == []
