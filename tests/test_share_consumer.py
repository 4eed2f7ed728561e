"""Share groups (KIP-932) against a real Kafka 4.3 broker: several ShareConsumers (threads) sharing
a two-partition topic, each record accepted once across them; released records coming back with
a higher delivery count, rejected ones never; the delivery-count limit; a silent member's records
coming back to the others when its acquisition locks time out; bad use refused."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from share_helpers import (
    group_config,
    new_share_topic,
    one_partition_topic,
    produce,
    total_lag,
    unique,
    wait_for,
)

import kcore
from kcore import AcknowledgeType, ShareConsumer, ShareRecord
from kcore.config import ClientConfig
from kcore.errors import AcknowledgementError, ConfigError, KcoreError, WakeupError
from kcore.producer import Producer  # imported here, not first inside a test with threads
from kcore.testing import KafkaCluster


@pytest.fixture
def share_topic(kafka_cluster: Any) -> tuple[str, str]:
    return new_share_topic(kafka_cluster)


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
        # The last poll's records are accepted by the commit (implicit mode).
        results = c.commit_sync(30)
        assert results and all(err is None for err in results.values())
    # Everything was accepted: a new member of the group gets nothing.
    with consumer(kafka_cluster, group) as again:
        again.subscribe([topic])
        assert poll_until(again, 1, timeout=5) == []


class Member(threading.Thread):
    """A share consumer polling in its own thread (implicit mode), keeping what it read."""

    def __init__(self, cluster: Any, group: str, topic: str, **extra: Any) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer(cluster, group, **extra)
        self.topic = topic
        self.records: list[ShareRecord] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.consumer.subscribe([self.topic])
            while not self.stop.is_set():
                records = self.consumer.poll(0.5)
                self.records.extend(records)
                time.sleep(0.005 * len(records))  # the work, during which others take theirs
        except WakeupError:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.consumer.close()


def test_members_share_the_work_each_record_accepted_once(
    kafka_cluster: Any, share_topic: Any
) -> None:
    topic, group = share_topic
    # Small acquisitions (KIP-1206's record_limit), so that the records spread over members.
    limit = {"max.poll.records": 10, "share.acquire.mode": "record_limit"}
    members = [Member(kafka_cluster, group, topic, **limit) for _ in range(3)]
    for m in members:
        m.start()
    total = 300
    produce(kafka_cluster.bootstrap_servers, topic, total)
    deadline = time.monotonic() + 90
    while sum(len(m.records) for m in members) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    for m in members:
        m.stop.set()
    for m in members:
        m.join(30)
        assert m.error is None, m.error
    values = [r.value for m in members for r in m.records]
    assert sorted(values) == sorted(b"v%d" % i for i in range(total))  # each once, none lost
    assert all(r.delivery_count == 1 for m in members for r in m.records)
    # More than one member did some of the work (the broker spreads records over members).
    assert sum(1 for m in members if m.records) >= 2
    # All accepted (the members' close accepted their last poll): nothing is left.
    with consumer(kafka_cluster, group) as late:
        late.subscribe([topic])
        assert poll_until(late, 1, timeout=4) == []


def test_released_records_come_back_with_a_higher_delivery_count(
    kafka_cluster: Any, share_topic: Any
) -> None:
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 10)
    with consumer(kafka_cluster, group, **{"share.acknowledgement.mode": "explicit"}) as c:
        c.subscribe([topic])
        seen: dict[bytes, list[int]] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(len(v) for v in seen.values()) < 20:
            for r in c.poll(0.5):
                seen.setdefault(r.value, []).append(r.delivery_count)
                first = r.delivery_count == 1
                c.acknowledge(r, AcknowledgeType.RELEASE if first else AcknowledgeType.ACCEPT)
        assert seen == {b"v%d" % i: [1, 2] for i in range(10)}
        assert all(err is None for err in c.commit_sync(30).values())
        assert poll_until(c, 1, timeout=3) == []


def test_rejected_records_never_come_back(kafka_cluster: Any, share_topic: Any) -> None:
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 20)
    explicit = {"share.acknowledgement.mode": "explicit"}
    outcomes: list[tuple[dict[Any, set[int]], Exception | None]] = []
    with consumer(kafka_cluster, group, **explicit) as c:
        c.set_acknowledgement_commit_callback(lambda offsets, err: outcomes.append((offsets, err)))
        c.subscribe([topic])

        acknowledged = 0

        def reject_odd(r: ShareRecord) -> AcknowledgeType:
            nonlocal acknowledged
            acknowledged += 1
            odd = int(r.value[1:]) % 2
            return AcknowledgeType.REJECT if odd else AcknowledgeType.RELEASE

        # Until all 20 were seen once: a released record may come back (and be released
        # again) before the other partition's records arrive.
        seen: set[bytes] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 20 and time.monotonic() < deadline:
            seen.update(r.value for r in poll_until(c, 1, timeout=0.5, ack=reject_odd))
        assert seen == {b"v%d" % i for i in range(20)}
        assert all(err is None for err in c.commit_sync(30).values())
        back = poll_until(c, 10, ack=lambda r: AcknowledgeType.ACCEPT)
        assert sorted(r.value for r in back) == sorted(b"v%d" % i for i in range(0, 20, 2))
        assert poll_until(c, 1, timeout=3) == []
    # The callback heard of every acknowledgement, each without an error.
    acked = [
        (tp, o)
        for offsets, err in outcomes
        if err is None
        for tp, os in offsets.items()
        for o in os
    ]
    assert len(acked) == acknowledged + 10 and all(err is None for _, err in outcomes)


def test_a_record_past_the_delivery_count_limit_is_archived(
    kafka_cluster: Any, share_topic: Any
) -> None:
    topic, group = share_topic
    group_config(kafka_cluster, group, share_delivery_count_limit=2)
    produce(kafka_cluster.bootstrap_servers, topic, 4)
    with consumer(kafka_cluster, group, **{"share.acknowledgement.mode": "explicit"}) as c:
        c.subscribe([topic])
        counts: dict[bytes, list[int]] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for r in c.poll(0.5):
                counts.setdefault(r.value, []).append(r.delivery_count)
                c.acknowledge(r, AcknowledgeType.RELEASE)
            if len(counts) == 4 and all(len(v) >= 2 for v in counts.values()):
                break
        assert c.commit_sync(30)
        assert poll_until(c, 1, timeout=3) == []  # a third delivery never comes
    assert counts == {b"v%d" % i: [1, 2] for i in range(4)}


def test_implicit_mode_small_polls_commit_async_and_the_callback(
    kafka_cluster: Any, share_topic: Any
) -> None:
    """Polls of 3 records out of larger acquisitions: each poll accepts the previous one's
    records; commit_async sends the last ones; the callback hears of every offset once."""
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 30)
    heard: list[tuple[Any, int, Exception | None]] = []

    def callback(offsets: dict[Any, set[int]], err: Exception | None) -> None:
        heard.extend((tp, o, err) for tp, os in offsets.items() for o in os)

    with consumer(kafka_cluster, group, **{"max.poll.records": 3}) as c:
        c.set_acknowledgement_commit_callback(callback)
        c.subscribe([topic])
        sizes: list[int] = []
        got: list[ShareRecord] = []
        deadline = time.monotonic() + 60
        while len(got) < 30 and time.monotonic() < deadline:
            records = c.poll(0.5)
            if records:
                sizes.append(len(records))
            got.extend(records)
        assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(30))
        assert max(sizes) <= 3
        c.commit_async()
        deadline = time.monotonic() + 30
        while len(heard) < 30 and time.monotonic() < deadline:
            assert c.poll(0.2) == []
        assert sorted((tp.partition, o) for tp, o, _ in heard) == sorted(
            (r.partition, r.offset) for r in got
        )
        assert all(err is None for _, _, err in heard)
        # Leaving and joining again: everything was accepted, nothing comes back.
        c.unsubscribe()
        assert c.assignment() == set()
        c.subscribe([topic])
        assert poll_until(c, 1, timeout=4) == []


@pytest.mark.slow
def test_a_silent_members_records_return_when_its_locks_time_out(
    kafka_cluster: Any, share_topic: Any
) -> None:
    # One partition: the group's assignor gives it to both members (with two partitions and
    # two members each could get one, and the silent member's would wait for it).
    _, group = share_topic
    topic = one_partition_topic(kafka_cluster, group, lock_ms=2000)
    produce(kafka_cluster.bootstrap_servers, topic, 10, partitions=1)
    explicit = {"share.acknowledgement.mode": "explicit"}
    with consumer(kafka_cluster, group, **explicit) as silent:
        silent.subscribe([topic])
        held = poll_until(silent, 1)
        assert held
        # It neither acknowledges nor polls again: another member gets its records once the
        # locks expire, delivered a second time (and the rest for the first time).
        with consumer(kafka_cluster, group) as other:
            other.subscribe([topic])
            got = poll_until(other, 10, timeout=60)
            assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(10))
            again = {r.value for r in held}
            assert {r.value: r.delivery_count for r in got} == {
                r.value: 2 if r.value in again else 1 for r in got
            }
        # Its late acknowledgements change nothing: the records were the other member's.
        for r in held:
            silent.acknowledge(r, AcknowledgeType.RELEASE)
        silent.commit_sync(30)
        assert poll_until(silent, 1, timeout=3) == []


def test_a_release_goes_back_while_the_member_still_reads_its_buffer(
    kafka_cluster: Any, share_topic: Any
) -> None:
    # A fetch answered with more records than a poll takes: what the member acknowledged
    # waits for the next fetch a short while only (a tenth of the lock, at most 0.5 s), then
    # goes on its own, so a released record reaches another member long before the locks of
    # the records the first still holds run out.
    _, group = share_topic
    topic = one_partition_topic(kafka_cluster, group, lock_ms=20000)
    with Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "linger.ms": 500}) as p:
        for i in range(50):  # one batch: acquired whole by one fetch
            p.send(topic, b"v%d" % i, partition=0)
        p.flush(30)
    explicit = {"share.acknowledgement.mode": "explicit", "max.poll.records": 5}
    with consumer(kafka_cluster, group, **explicit) as first:
        first.subscribe([topic])
        taken = poll_until(first, 1)
        assert len(taken) == 5
        assert first._core.fetcher.acquisition_lock_s == 20.0  # as the leader announced
        first.acknowledge(taken[0], AcknowledgeType.RELEASE)
        for r in taken[1:]:
            first.acknowledge(r, AcknowledgeType.ACCEPT)
        time.sleep(0.7)
        more = first.poll(5)  # from its buffer, no fetch: the release goes on its own
        assert len(more) == 5
        with consumer(kafka_cluster, group) as second:
            second.subscribe([topic])
            got = poll_until(second, 1, timeout=10)
            assert [(r.value, r.delivery_count) for r in got] == [(taken[0].value, 2)]
        for r in more:
            first.acknowledge(r, AcknowledgeType.ACCEPT)


def test_close_releases_what_the_consumer_holds(kafka_cluster: Any, share_topic: Any) -> None:
    topic, group = share_topic
    # Locks far longer than the test waits: records come back by release, not by expiry.
    group_config(kafka_cluster, group, share_record_lock_duration_ms=60000)
    produce(kafka_cluster.bootstrap_servers, topic, 10)
    explicit = {"share.acknowledgement.mode": "explicit"}
    with consumer(kafka_cluster, group, **explicit) as first:
        first.subscribe([topic])
        held = poll_until(first, 1)
        first.acknowledge(held[0], AcknowledgeType.ACCEPT)
    # Closed with the rest unacknowledged (and maybe more fetched, never handed out): all
    # released at close, so another member gets them at once.
    with consumer(kafka_cluster, group) as second:
        second.subscribe([topic])
        got = poll_until(second, 9, timeout=20)
        assert sorted(r.value for r in got) == sorted(
            b"v%d" % i for i in range(10) if b"v%d" % i != held[0].value
        )
        counts = {r.value: r.delivery_count for r in got}
        assert all(counts[r.value] == 2 for r in held[1:])


def test_renew_keeps_the_record_for_a_later_acknowledgement(
    kafka_cluster: Any, share_topic: Any
) -> None:
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 2, partitions=1)  # one batch, one poll
    with consumer(kafka_cluster, group, **{"share.acknowledgement.mode": "explicit"}) as c:
        c.subscribe([topic])
        got = poll_until(c, 1)
        assert len(got) == 2
        for r in got:
            c.acknowledge(r, AcknowledgeType.RENEW)
        assert all(err is None for err in c.commit_sync(30).values())
        for r in got:  # still this consumer's to acknowledge
            c.acknowledge(r, AcknowledgeType.ACCEPT)
        assert all(err is None for err in c.commit_sync(30).values())
        assert poll_until(c, 1, timeout=3) == []


def test_bad_use_is_refused(kafka_cluster: Any, share_topic: Any) -> None:
    topic, group = share_topic
    boot = kafka_cluster.bootstrap_servers
    with pytest.raises(ConfigError, match="share group"):
        ShareConsumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "x"})
    with pytest.raises(ConfigError, match="group.id"):
        ShareConsumer({"bootstrap.servers": boot})
    with pytest.raises(ConfigError, match="share.acknowledgement.mode"):
        kcore.Consumer({"bootstrap.servers": boot, "share.acknowledgement.mode": "explicit"})
    with pytest.raises(ConfigError):
        ClientConfig(
            {"bootstrap.servers": boot, "group.id": "g", "share.acknowledgement.mode": "manual"},
            role="share_consumer",
        )
    produce(boot, topic, 4)
    with consumer(kafka_cluster, group) as implicit:
        with pytest.raises(KcoreError, match="subscribe"):
            implicit.poll(0)
        implicit.subscribe([topic])
        got = poll_until(implicit, 1)
        with pytest.raises(AcknowledgementError, match="explicit"):
            implicit.acknowledge(got[0])
    with consumer(kafka_cluster, group, **{"share.acknowledgement.mode": "explicit"}) as c:
        c.subscribe([topic])
        got = poll_until(c, 1)
        r = got[0]
        c.acknowledge(r)
        with pytest.raises(AcknowledgementError, match="already"):
            c.acknowledge(r, AcknowledgeType.REJECT)
        foreign = r._replace(offset=r.offset + 1000)
        with pytest.raises(AcknowledgementError, match="not delivered"):
            c.acknowledge(foreign)
        with pytest.raises(AcknowledgementError, match="acknowledgement type"):
            c.acknowledge(got[-1], 9)
        for other in got[1:]:
            c.acknowledge(other, AcknowledgeType.RELEASE)
        got = poll_until(c, 1)
        with pytest.raises(AcknowledgementError, match="not acknowledged"):
            c.poll(0)
        for other in got:
            c.acknowledge(other, AcknowledgeType.RELEASE)
        c.wakeup()
        with pytest.raises(WakeupError):
            c.poll(5)
        # From another thread, while a poll waits (nothing is left to deliver).
        poll_until(c, 10, timeout=3, ack=lambda r: AcknowledgeType.ACCEPT)
        timer = threading.Timer(0.5, c.wakeup)
        timer.start()
        with pytest.raises(WakeupError):
            while True:
                for other in c.poll(30):
                    c.acknowledge(other, AcknowledgeType.ACCEPT)
        timer.join()
    with pytest.raises(KcoreError, match="closed"):
        c.acknowledge(r)
    with pytest.raises(KcoreError, match="closed"):
        c.poll(0)


@pytest.mark.slow
def test_members_carry_on_when_the_coordinator_and_a_leader_die(kafka_cluster3: Any) -> None:
    """The group coordinator's broker is killed, then (restarted, and) the leader of partition
    0: the members find the new coordinator, follow the partition to its new leader (a new
    share session there) and read what is written afterwards; every record is delivered at
    least once (those a dead leader had handed out may come again)."""
    boot = kafka_cluster3.bootstrap_servers
    topic, group = unique("share3"), unique("sg3")
    kafka_cluster3.create_topic(topic, 2, 3)
    group_config(kafka_cluster3, group, share_auto_offset_reset="earliest")
    acks_all = {"bootstrap.servers": boot, "acks": "all", "linger.ms": 5}

    def send(start: int, n: int) -> None:
        with Producer(acks_all) as p:
            for i in range(start, start + n):
                p.send(topic, b"v%d" % i, partition=i % 2)
            p.flush(60)

    fast_metadata = {"metadata.max.age.ms": 2000}
    members = [Member(kafka_cluster3, group, topic, **fast_metadata) for _ in range(2)]
    for m in members:
        m.start()

    def wait_for_values(n: int) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if {r.value for m in members for r in m.records} >= {b"v%d" % i for i in range(n)}:
                return
            time.sleep(0.2)
        raise AssertionError(f"the first {n} records were not all delivered")

    killed = None
    try:
        send(0, 100)
        wait_for_values(100)
        heartbeat = members[0].consumer._core.heartbeat
        killed = heartbeat.link.node_id
        assert killed is not None
        kafka_cluster3.kill_broker(killed)
        send(100, 100)
        wait_for_values(200)
        assert heartbeat.link.node_id != killed
        kafka_cluster3.start_broker(killed)
        leader = members[0].consumer.cluster.metadata.leader_for(topic, 0)
        assert leader is not None
        killed = leader.node_id
        kafka_cluster3.kill_broker(killed)
        send(200, 100)
        wait_for_values(300)
        # The records may all have come through the other member: this one's metadata learns
        # the new leader at its next refresh (metadata.max.age.ms 2000) at the latest.
        deadline = time.monotonic() + 30
        while True:
            new_leader = members[0].consumer.cluster.metadata.leader_for(topic, 0)
            if new_leader is not None and new_leader.node_id != killed:
                break
            assert time.monotonic() < deadline, f"partition 0's leader still {new_leader}"
            time.sleep(0.2)
        for m in members:
            assert m.error is None, m.error
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.join(30)
        if killed is not None:
            kafka_cluster3.start_broker(killed)


Position = tuple[int, int]  # (partition, offset)


class AcceptingMember(threading.Thread):
    """A share consumer in its own thread, in explicit mode, accepting every record it is given.
    It keeps each delivery and how each acceptance ended (the commit callback's error or None),
    stamped from ``clock`` (shared by the members) so that the test can order them across
    members."""

    def __init__(
        self, cluster: Any, group: str, topic: str, clock: Iterator[int], **extra: Any
    ) -> None:
        super().__init__(daemon=True)
        explicit = {"share.acknowledgement.mode": "explicit"}
        self.consumer = consumer(cluster, group, **explicit, **extra)
        self.consumer.set_acknowledgement_commit_callback(self._acknowledged)
        self.topic = topic
        self.clock = clock
        self.deliveries: list[tuple[int, ShareRecord]] = []  # (stamp, record)
        self.outcomes: list[tuple[int, Position, Exception | None]] = []  # (stamp, _, error)
        self._awaiting: set[Position] = set()  # accepted, not answered yet
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _acknowledged(self, offsets: dict[Any, set[int]], err: Exception | None) -> None:
        # The callback also hears of releases (records read ahead, given back at close): only
        # offsets accepted and not answered yet are acceptances.
        for tp, sent in offsets.items():
            answered = {(tp.partition, o) for o in sent} & self._awaiting
            self._awaiting -= answered
            self.outcomes.extend((next(self.clock), at, err) for at in sorted(answered))

    def run(self) -> None:
        try:
            self.consumer.subscribe([self.topic])
            while not self.stop.is_set():
                records = self.consumer.poll(0.5)
                for r in records:
                    self.deliveries.append((next(self.clock), r))
                    self.consumer.acknowledge(r, AcknowledgeType.ACCEPT)
                    self._awaiting.add((r.partition, r.offset))
                time.sleep(0.01 * len(records))  # the work, during which others take theirs
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.consumer.close()

    def accepted(self) -> list[bytes | None]:
        """The values of the records whose acceptance the broker confirmed."""
        outcomes = list(self.outcomes)  # read first: each one's delivery is in deliveries
        values = {(r.partition, r.offset): r.value for _, r in self.deliveries}
        return [values[at] for _, at, err in outcomes if err is None]


@pytest.mark.slow
def test_members_follow_partitions_whose_leader_moves_while_they_consume(
    kafka_cluster3: Any,
) -> None:
    """The leadership of both partitions moves to another broker while two members accept
    records (a reassignment makes another replica the preferred one, then a preferred leader
    election; the old leader stays a follower), and later moves back. The members follow the
    partitions to their new leaders, where the records written after each move are acquired
    and accepted. Every record is accepted exactly once overall and the group's lag falls to
    0. A record comes again only while its acceptance is not confirmed (the old leader's
    acquisitions, and acceptances it did not apply, are unknown to the new one), never once it
    is."""
    boot = kafka_cluster3.bootstrap_servers
    topic, group = unique("moved"), unique("sg3")
    kafka_cluster3.create_topic(topic, 2, 3)
    group_config(kafka_cluster3, group, share_auto_offset_reset="earliest")
    tps = [kcore.TopicPartition(topic, p) for p in range(2)]
    waves = [400, 400, 200]  # records written before the first move, between, after the last
    total = sum(waves)
    clock = itertools.count()
    small = {"max.poll.records": 10, "share.acquire.mode": "record_limit"}
    members = [AcceptingMember(kafka_cluster3, group, topic, clock, **small) for _ in range(2)]

    def accepted() -> list[bytes | None]:
        return [v for m in members for v in m.accepted()]

    with kcore.AdminClient({"bootstrap.servers": boot}) as admin:

        def leaders() -> dict[kcore.TopicPartition, int]:
            (described,) = admin.describe_topics([topic]).values()
            return {
                kcore.TopicPartition(topic, p.partition): p.leader for p in described.partitions
            }

        def move_leaders() -> dict[kcore.TopicPartition, int]:
            """Each partition's next replica made its preferred one, then its leader."""
            (described,) = admin.describe_topics([topic]).values()
            moved_to: dict[kcore.TopicPartition, int] = {}
            order: dict[kcore.TopicPartition | tuple[str, int], list[int] | None] = {}
            for p in described.partitions:
                tp = kcore.TopicPartition(topic, p.partition)
                others = [r for r in p.replicas if r != p.leader]
                moved_to[tp] = others[0]
                order[tp] = [others[0], p.leader, *others[1:]]
            admin.alter_partition_reassignments(order)
            wait_for(lambda: not admin.list_partition_reassignments(tps), "the reassignment to end")
            assert admin.elect_leaders(tps) == dict.fromkeys(tps)
            wait_for(lambda: leaders() == moved_to, f"the leaders to move to {moved_to}")
            return moved_to

        try:
            for m in members:
                m.start()
            first_leaders = leaders()
            written = 0
            for wave, n in enumerate(waves):
                produce(boot, topic, n, start=written)
                written += n
                if wave == len(waves) - 1:
                    break
                some = written - n + 40
                wait_for(
                    lambda: len(set(accepted())) >= some,  # noqa: B023 - called right here
                    "the members to accept some of the new records",
                )
                moved_to = move_leaders()
                # The move came while the members were still at work.
                assert len(set(accepted())) < written, "everything was read before the move"
            assert moved_to == first_leaders  # the second move went back
            everything = {b"v%d" % i for i in range(total)}
            wait_for(lambda: set(accepted()) >= everything, "every record to be accepted")
            wait_for(lambda: total_lag(admin, group) == 0, "the group's lag to fall to 0")

            # Each member follows the partitions assigned to it to their leaders.
            def followed() -> bool:
                for m in members:
                    for tp in m.consumer.assignment():
                        leader = m.consumer.cluster.metadata.leader_for(tp.topic, tp.partition)
                        if leader is None or leader.node_id != moved_to[tp]:
                            return False
                return True

            wait_for(followed, "the members' metadata to name the new leaders")
        finally:
            for m in members:
                m.stop.set()
            for m in members:
                m.join(60)
    for m in members:
        assert not m.is_alive()
        assert m.error is None, m.error

    # Accepted exactly once overall, nothing lost; the records written after a move could only
    # be acquired from, and accepted by, the partition's new leader.
    counts = collections.Counter(accepted())
    assert set(counts) == everything
    assert [v for v, n in counts.items() if n != 1] == []
    # Every acceptance was answered, and those that failed (sent to the old leader, which no
    # longer hosts the share partition) failed with kcore errors.
    for m in members:
        assert {(r.partition, r.offset) for _, r in m.deliveries} == {at for _, at, _ in m.outcomes}
    failed = [err for m in members for _, _, err in m.outcomes if err is not None]
    assert all(isinstance(err, KcoreError) for err in failed), failed
    # A record whose acceptance was confirmed is not delivered again: a member may still hand
    # out a copy read ahead from the old leader, but accepting that copy fails. One that comes
    # again need not have a higher delivery count: the new leader counts from the state the
    # share coordinator stored, which holds acknowledgements, not acquisitions.
    confirmed = {at: stamp for m in members for stamp, at, err in m.outcomes if err is None}
    again = [
        r
        for m in members
        for stamp, r in m.deliveries
        if stamp > confirmed[r.partition, r.offset]
        and not any(
            at == (r.partition, r.offset) and later > stamp and err is not None
            for later, at, err in m.outcomes
        )
    ]
    assert again == []


@pytest.mark.slow
def test_a_restarted_broker_s_lost_share_session_is_opened_again(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker keeps share sessions in memory: after its restart the member's next ShareFetch
    (at the old epoch) is refused, and the member opens a new session and reads on. Its own
    single-node cluster, as the restart would disturb the shared ones."""
    with KafkaCluster(1, work_dir=tmp_path) as cluster:
        topic, group = unique("restart"), unique("sg")
        cluster.create_topic(topic, 2)
        group_config(cluster, group, share_auto_offset_reset="earliest")
        produce(cluster.bootstrap_servers, topic, 10)
        with consumer(cluster, group) as c:
            c.subscribe([topic])
            got = poll_until(c, 10)
            c.commit_sync(30)
            caplog.set_level(logging.INFO, logger="kcore.consumer.share")
            cluster.stop_broker(1)
            cluster.start_broker(1)
            produce(cluster.bootstrap_servers, topic, 10)
            got += poll_until(c, 10, timeout=90)
        assert sorted(r.value for r in got) == sorted(b"v%d" % (i % 10) for i in range(20))
        assert "opening a new one" in caplog.text


def share_lag(cluster: Any, group: str, topic: str) -> int:
    """The group's lag on partition 0 of ``topic`` (DescribeShareGroupOffsets v1 to its
    coordinator): how many records there are not delivery-complete (-1: no state yet)."""
    from kcore.cluster.client import ClusterClient
    from kcore.cluster.coordinator import CoordinatorLink
    from kcore.protocol.messages.describe_share_group_offsets_request import (
        DescribeShareGroupOffsetsRequest,
        DescribeShareGroupOffsetsRequestGroup,
        DescribeShareGroupOffsetsRequestTopic,
    )

    async def ask() -> int:
        async with ClusterClient({"bootstrap.servers": cluster.bootstrap_servers}) as client:
            topics = [DescribeShareGroupOffsetsRequestTopic(topic_name=topic, partitions=[0])]
            request = DescribeShareGroupOffsetsRequest(
                groups=[DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=topics)]
            )
            response = await CoordinatorLink(client, group).send(request)
            (answer,) = response.groups
            (partition,) = answer.topics[0].partitions
            return int(partition.lag)

    return asyncio.run(ask())


def test_transaction_markers_in_acquired_ranges_are_acknowledged_as_gaps(
    kafka_cluster: Any, share_topic: Any
) -> None:
    """Records written in transactions: the commit markers take offsets inside the acquired
    ranges and are never handed out; acknowledged as gaps, they let the share-partition start
    offset move past them once every record is accepted."""
    topic, group = share_topic
    boot = kafka_cluster.bootstrap_servers
    config = {"bootstrap.servers": boot, "transactional.id": unique("txn")}
    with Producer(config) as p:
        p.init_transactions(30)
        for txn in range(2):
            p.begin_transaction()
            for i in range(5):
                p.send(topic, b"v%d" % (txn * 5 + i), partition=0)
            p.commit_transaction(30)
    with consumer(kafka_cluster, group) as c:
        c.subscribe([topic])
        got = poll_until(c, 10)
        assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(10))
        assert all(err is None for err in c.commit_sync(30).values())
        # Records at 0-4 and 6-10, markers at 5 and 11: every offset's delivery is complete
        # (accepted, or a gap), so the group's lag is 0.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if share_lag(kafka_cluster, group, topic) == 0:
                break
            time.sleep(0.5)
        assert share_lag(kafka_cluster, group, topic) == 0


def test_a_member_that_stops_polling_leaves_and_joins_again(
    kafka_cluster: Any, share_topic: Any
) -> None:
    """max.poll.interval.ms: a member that does not poll for that long leaves the group, so
    its records go to the others (long before their locks would expire); its next poll joins
    again."""
    topic, group = share_topic
    group_config(kafka_cluster, group, share_record_lock_duration_ms=60000)
    produce(kafka_cluster.bootstrap_servers, topic, 10, partitions=1)
    explicit = {"share.acknowledgement.mode": "explicit", "max.poll.interval.ms": 2000}
    with consumer(kafka_cluster, group, **explicit) as slow:
        slow.subscribe([topic])
        held = poll_until(slow, 1)
        with consumer(kafka_cluster, group) as other:
            other.subscribe([topic])
            got = poll_until(other, 10, timeout=20)
            assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(10))
            released = {h.value for h in held}
            assert all(r.delivery_count == 2 for r in got if r.value in released)
        assert slow.assignment() == set()
        # Polling again: a member once more (the records are gone: nothing to read).
        assert slow.poll(3) == []
        deadline = time.monotonic() + 10
        while not slow.assignment() and time.monotonic() < deadline:
            slow.poll(0.2)
        assert slow.assignment() == {kcore.TopicPartition(topic, 0), kcore.TopicPartition(topic, 1)}


def test_metrics_count_what_was_fetched_polled_and_acknowledged(
    kafka_cluster: Any, share_topic: Any
) -> None:
    """Java's share-fetch-manager and consumer-share metrics, against what the test saw:
    records consumed are those the polls returned, acknowledgements sent those it made (the
    released ones counted too), none failed; fetches, their sizes and the time between polls
    recorded."""
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 300)
    # At most 100 records a poll: several polls, so that the time between polls is measured
    # (one poll could take all 300 when each partition's records came in one batch).
    settings = {"share.acknowledgement.mode": "explicit", "max.poll.records": 100}
    with consumer(kafka_cluster, group, **settings) as c:
        c.subscribe([topic])
        got = poll_until(
            c,
            300,
            ack=lambda r: AcknowledgeType.RELEASE if r.offset % 10 == 0 else AcknowledgeType.ACCEPT,
        )
        acknowledged = len(got)
        results = c.commit_sync(30)
        assert results and all(err is None for err in results.values())
        m = c.metrics()
    assert m["records-consumed-total"] == len(got) >= 300
    assert m["acknowledgements-send-total"] == acknowledged
    assert m["acknowledgements-error-total"] == 0
    assert m["fetch-total"] >= 1 and m["fetch-latency-avg"] > 0
    assert m["bytes-consumed-total"] > 300 and m["fetch-size-max"] > 0
    assert m["records-per-request-max"] >= 1
    assert m["time-between-poll-max"] >= 0 and m["last-poll-seconds-ago"] >= 0
    assert m["assigned-partitions"] == 2
    assert m["request-total"] > 0 and m["connection-count"] >= 1  # as every client has


def test_a_fast_member_asks_for_several_batches_a_fetch_record_limit_for_max_poll_records(
    kafka_cluster: Any,
) -> None:
    """A leader acquires whole batches and answers a member's fetches one at a time: a member
    that takes records quickly asks for more than max.poll.records once it measured its rate
    (a fetch then acquires several partitions' batches), polls still hand out at most
    max.poll.records, and every record is delivered once. In record_limit mode a fetch asks
    for max.poll.records exactly (the broker then acquires no more)."""
    topic, per_partition, partitions = unique("share8"), 250, 8
    kafka_cluster.create_topic(topic, partitions)
    # One batch a partition: 250 records acquired together.
    with Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "linger.ms": 1000}) as p:
        for i in range(per_partition * partitions):
            p.send(topic, b"v%d" % i, partition=i % partitions)
        p.flush(60)
    for mode, most in (("batch_optimized", None), ("record_limit", 10)):
        group = unique("sg")
        group_config(kafka_cluster, group, share_auto_offset_reset="earliest")
        settings = {"max.poll.records": 10, "share.acquire.mode": mode}
        with consumer(kafka_cluster, group, **settings) as c:
            c.subscribe([topic])
            got: list[ShareRecord] = []
            deadline = time.monotonic() + 60
            while len(got) < per_partition * partitions and time.monotonic() < deadline:
                records = c.poll(0.5)
                assert len(records) <= 10
                got.extend(records)
            assert sorted(r.value for r in got) == sorted(
                b"v%d" % i for i in range(per_partition * partitions)
            )
            per_request = c.metrics()["records-per-request-max"]
        if most is None:
            assert per_request > per_partition, "no fetch acquired more than one batch"
        else:
            assert per_request <= most


def test_async_share_consumer_has_the_same_metrics(kafka_cluster: Any, share_topic: Any) -> None:
    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 20)

    async def run() -> dict[str, float]:
        config = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": group}
        async with kcore.AsyncShareConsumer(config) as c:
            c.subscribe([topic])
            seen = 0
            deadline = time.monotonic() + 60
            while seen < 20 and time.monotonic() < deadline:
                seen += len(await c.poll(0.5))
            await c.commit_sync(30)
            return c.metrics()

    m = asyncio.run(run())
    assert m["records-consumed-total"] >= 20
    assert m["acknowledgements-send-total"] >= 20 and m["acknowledgements-error-total"] == 0


def test_statistics_name_the_share_group_and_its_partitions(
    kafka_cluster: Any, share_topic: Any
) -> None:
    """statistics.interval.ms on a share consumer: librdkafka's document, with the records
    consumed, each assigned partition's leader and records waiting for poll, and the share
    group's member (no offsets: the broker tracks delivery)."""
    import json

    topic, group = share_topic
    produce(kafka_cluster.bootstrap_servers, topic, 100)
    documents: list[dict[str, Any]] = []
    extra = {"statistics.interval.ms": 100, "stats_cb": lambda s: documents.append(json.loads(s))}
    with consumer(kafka_cluster, group, **extra) as c:
        c.subscribe([topic])
        got = poll_until(c, 100)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            documents and documents[-1]["rxmsgs"] >= len(got)
        ):
            time.sleep(0.05)
        last = documents[-1]
    assert last["type"] == "share_consumer" and last["rxmsgs"] == len(got) >= 100
    assert last["rxmsg_bytes"] > 0
    group_stats = last["cgrp"]
    assert group_stats["type"] == "share" and group_stats["group_id"] == group
    assert group_stats["state"] == "up" and group_stats["member_epoch"] > 0
    assert group_stats["assignment_size"] == 2 and group_stats["subscription"] == [topic]
    partitions = last["topics"][topic]["partitions"]
    assert sorted(partitions) == ["0", "1"]
    assert all(p["leader"] >= 0 and p["fetchq_cnt"] >= 0 for p in partitions.values())
