"""Share groups (KIP-932) with mixed membership, against a real broker: kcore ShareConsumers
(threads), Kafka's own console share consumer (a JVM) and confluent-kafka's ShareConsumer
(librdkafka) in ONE share group on a two-partition topic, so that each partition is shared by
members of different clients. Every record is accepted exactly once across them and the group's
lag falls to 0; records a kcore member releases are delivered again (to whichever member shares
the partition) and still accepted exactly once overall.

What each member accepted: kcore's and confluent's members acknowledge explicitly and count a
record only once ``commit_sync`` reported its partition's acknowledgements applied; the console
share consumer prints each record's value (acknowledging it, implicitly, as it polls again or
closes), so its output is what it accepted: a printed record whose acknowledgement failed would
come back and be printed (or taken) twice, which the exactly-once check catches."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import confluent_kafka
from share_helpers import total_lag, unique, wait_for

import kcore as kc
from kcore import AcknowledgeType
from kcore.admin import AdminOperationError, NewTopic

PARTITIONS = 2  # fewer than the members: the broker gives each partition to several of them
# Small acquisitions (KIP-1206's record_limit) so that the records spread over the members.
SMALL = {"max.poll.records": "20", "share.acquire.mode": "record_limit"}
JAVA_ARGS = [arg for k, v in SMALL.items() for arg in ("--command-property", f"{k}={v}")]


class PythonMember(threading.Thread):
    """A share group member polling in its own thread in explicit mode. ``accepted``: values
    whose acceptance the broker confirmed (commit_sync after each poll); ``released``: values
    released (and confirmed so). ``release(value, delivery_count)`` picks what to release."""

    def __init__(self, release: Callable[[bytes, int], bool] | None = None) -> None:
        super().__init__(daemon=True)
        self.release = release or (lambda value, count: False)
        self.accepted: list[bytes] = []
        self.released: list[bytes] = []
        self.redelivered: list[tuple[bytes, int]] = []  # (value, delivery count > 1)
        self.joined = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.consume()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def consume(self) -> None:
        raise NotImplementedError

    def settle(self, accepted: list[bytes], released: list[bytes], failed: bool) -> None:
        assert not failed, "the broker refused acknowledgements"
        self.accepted.extend(accepted)
        self.released.extend(released)


class KcoreMember(PythonMember):
    def __init__(self, bootstrap: str, group: str, topic: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        config = {"bootstrap.servers": bootstrap, "group.id": group, **SMALL}
        config["share.acknowledgement.mode"] = "explicit"
        self.consumer = kc.ShareConsumer(config)
        self.topic = topic

    def consume(self) -> None:
        with self.consumer as c:
            c.subscribe([self.topic])
            self.joined.set()
            while not self.stop.is_set():
                accepted, released = [], []
                for r in c.poll(0.5):
                    assert r.value is not None
                    if r.delivery_count > 1:
                        self.redelivered.append((r.value, r.delivery_count))
                    if self.release(r.value, r.delivery_count):
                        c.acknowledge(r, AcknowledgeType.RELEASE)
                        released.append(r.value)
                    else:
                        c.acknowledge(r, AcknowledgeType.ACCEPT)
                        accepted.append(r.value)
                    time.sleep(0.001)  # the work, during which others take theirs
                if accepted or released:
                    results = c.commit_sync(30)
                    self.settle(accepted, released, any(e is not None for e in results.values()))


class ConfluentMember(PythonMember):
    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        super().__init__()
        self.consumer = confluent_kafka.ShareConsumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "share.acknowledgement.mode": "explicit",
            }
        )
        self.topic = topic

    def consume(self) -> None:
        c = self.consumer
        try:
            c.subscribe([self.topic])
            self.joined.set()
            while not self.stop.is_set():
                accepted = []
                for m in c.poll(0.5):
                    assert m.error() is None, m.error()
                    c.acknowledge(m, confluent_kafka.AcknowledgeType.ACCEPT)
                    accepted.append(m.value())
                    time.sleep(0.001)
                if accepted:
                    results = c.commit_sync(30)
                    self.settle(accepted, [], any(e is not None for e in results.values()))
        finally:
            c.close()


def run_mixed_group(
    cluster: Any, share_members: Any, total: int, release: Callable[[bytes, int], bool] | None
) -> tuple[dict[str, list[bytes]], list[PythonMember]]:
    """Two kcore members (the first releasing what ``release`` picks), a console share
    consumer and a confluent member in one share group; ``total`` records produced once all
    have joined. Returns each member's accepted values (by name) once the lag is 0."""
    bootstrap = cluster.bootstrap_servers
    topic, group = unique("share-interop"), unique("sg-interop")
    with kc.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
        admin.alter_configs({("group", group): {"share.auto.offset.reset": "earliest"}})
        python_members: list[PythonMember] = [
            KcoreMember(bootstrap, group, topic, release=release),
            KcoreMember(bootstrap, group, topic),
            ConfluentMember(bootstrap, group, topic),
        ]
        java = share_members(bootstrap, topic, group, JAVA_ARGS)
        try:
            for m in python_members:
                m.start()
            for m in python_members:
                assert m.joined.wait(60), m.error
            wait_for(lambda: members(admin, group) == 4, "all four members to join the group")
            # Produced in rounds, so that each member's fetches find some.
            with kc.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as producer:
                for i in range(total):
                    producer.send(topic, b"r%d" % i, partition=i % PARTITIONS)
                    if i % 200 == 199:
                        producer.flush(30)
                        time.sleep(0.05)
                producer.flush(30)

            def everything_accepted() -> bool:
                for m in python_members:
                    assert m.error is None, m.error
                assert java.proc.poll() is None, "the console share consumer exited"
                java.read.extend(drain(java))
                done = len(java.read) + sum(len(m.accepted) for m in python_members)
                return done >= total

            wait_for(everything_accepted, f"the members to accept {total} records")
            wait_for(lambda: total_lag(admin, group) == 0, "the group's lag to fall to 0")
        finally:
            for m in python_members:
                m.stop.set()
            for m in python_members:
                m.join(60)
            java.stop()
        for m in python_members:
            assert m.error is None, m.error
        java.read.extend(drain(java))
        # Closing the members accepted nothing more (everything was confirmed before).
        assert total_lag(admin, group) == 0
    accepted = {
        "kcore-1": python_members[0].accepted,
        "kcore-2": python_members[1].accepted,
        "confluent": python_members[2].accepted,
        "java": [line.encode() for line in java.read],
    }
    return accepted, python_members


def members(admin: kc.AdminClient, group: str) -> int:
    """How many members the share group has (0 until the first joined: the group is unknown)."""
    try:
        return len(admin.describe_share_groups([group])[group].members)
    except AdminOperationError:
        return 0


def drain(java: Any) -> list[str]:
    """The lines the console share consumer printed since last asked."""
    lines = []
    while not java.records.empty():
        lines.append(java.records.get_nowait())
    return lines


def assert_each_accepted_once(accepted: dict[str, list[bytes]], total: int) -> None:
    counts = Counter(v for values in accepted.values() for v in values)
    twice = {v: n for v, n in counts.items() if n > 1}
    assert not twice, f"accepted more than once: {sorted(twice)[:10]}"
    missing = {b"r%d" % i for i in range(total)} - set(counts)
    assert not missing, f"never accepted: {sorted(missing)[:10]}"
    assert len(counts) == total


def test_kcore_java_and_confluent_members_accept_each_record_once(
    kafka_cluster: Any, share_members: Any
) -> None:
    total = 3000
    accepted, _ = run_mixed_group(kafka_cluster, share_members, total, release=None)
    assert_each_accepted_once(accepted, total)
    # Each kind of member took part (the broker spreads the acquisitions over the members).
    assert all(accepted[name] for name in accepted), {k: len(v) for k, v in accepted.items()}


def test_records_a_kcore_member_releases_are_accepted_once_elsewhere_or_again(
    kafka_cluster: Any, share_members: Any
) -> None:
    """The first kcore member releases every fifth record on its first delivery: each comes
    back (to any member, its delivery count one higher) and is accepted exactly once."""
    total = 2000

    def release(value: bytes, delivery_count: int) -> bool:
        return delivery_count == 1 and int(value[1:]) % 5 == 0

    accepted, members = run_mixed_group(kafka_cluster, share_members, total, release)
    assert_each_accepted_once(accepted, total)
    releaser = members[0]
    assert releaser.released, "the releasing member was handed none of the records it releases"
    assert len(set(releaser.released)) == len(releaser.released)
    # What it released came back: accepted by some member afterwards, exactly once (above);
    # those it was handed again came with a higher delivery count (and it accepted them).
    came_back = {v for v, _ in releaser.redelivered}
    assert all(count >= 2 for _, count in releaser.redelivered)
    assert came_back <= set(releaser.accepted)
    assert not set(releaser.released) & (set(releaser.accepted) - came_back)
