"""Consumer groups against real brokers: members of kcore (every assignor, and the KIP-848
protocol), confluent-kafka and a killed process sharing one group; commits and restarts; static
membership; the coordinator's broker killed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from confluent_kafka import Consumer as ConfluentConsumer

import kcore
from kcore.admin import NewTopic, TopicPartition
from kcore.errors import FencedInstanceIdError, KcoreError, WakeupError

FAST = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "auto.offset.reset": "earliest",
    "metadata.max.age.ms": 2000,
}


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create(bootstrap: str, topic: str, partitions: int, rf: int = 1) -> None:
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions, rf)])


def produce(bootstrap: str, topic: str, n: int, start: int = 0, **extra) -> None:
    with kcore.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **extra}) as p:
        for i in range(start, start + n):
            p.send(topic, b"v%d" % i, key=b"k%d" % i)
        p.flush(60)


class Member(threading.Thread):
    """A kcore group member polling in its own thread, keeping what it read."""

    def __init__(self, bootstrap: str, group: str, topics, **extra) -> None:
        super().__init__(daemon=True)
        cfg = {"bootstrap.servers": bootstrap, "group.id": group, **FAST, **extra}
        if cfg.get("group.protocol") == "consumer":  # the broker sets these under KIP-848
            del cfg["session.timeout.ms"], cfg["heartbeat.interval.ms"]
        self.consumer = kcore.Consumer(cfg)
        self.topics = topics
        self.records: list = []
        self.events: list[tuple[str, list]] = []
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def run(self) -> None:
        c = self.consumer
        try:
            c.subscribe(
                self.topics,
                on_assign=lambda ps: self.events.append(("assign", sorted(ps))),
                on_revoke=lambda ps: self.events.append(("revoke", sorted(ps))),
                on_lost=lambda ps: self.events.append(("lost", sorted(ps))),
            )
            while not self.stop_flag.is_set():
                recs = c.poll(0.2)
                with self.lock:
                    self.records += recs
        except BaseException as exc:  # reported by the test
            self.error = exc

    def assignment(self) -> set[TopicPartition]:
        return self.consumer.assignment()

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(30)
        self.consumer.close()


def wait_for(cond, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def partitions_split(assignments, topic: str, n: int) -> bool:
    """Every partition of ``topic`` owned by exactly one member."""
    owned = [tp for a in assignments for tp in a]
    return sorted(owned) == [TopicPartition(topic, p) for p in range(n)]


def total(members) -> int:
    return sum(len(m.records) for m in members)


@pytest.mark.parametrize(
    "extra",
    [
        {"partition.assignment.strategy": "range"},
        {"partition.assignment.strategy": "roundrobin"},
        {"partition.assignment.strategy": "cooperative-sticky"},
        {"group.protocol": "consumer"},
    ],
    ids=["range", "roundrobin", "cooperative-sticky", "kip848"],
)
def test_members_split_the_partitions_and_read_each_record_once(kafka_cluster, extra):
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("grp"), name("g")
    create(bootstrap, topic, 6)
    produce(bootstrap, topic, 3000)
    members = [Member(bootstrap, group, [topic], **extra) for _ in range(3)]
    try:
        for m in members:  # staggered: rebalances happen while records are being read
            m.start()
            time.sleep(1.0)
        produce(bootstrap, topic, 3000, start=3000)
        wait_for(
            lambda: (
                partitions_split([m.assignment() for m in members], topic, 6)
                and sorted(len(m.assignment()) for m in members) == [2, 2, 2]
                and total(members) >= 6000
            ),
            90,
            "the members to split the partitions and read everything",
        )
        for m in members:
            assert m.error is None, m.error
        seen = [(r.partition, r.offset) for m in members for r in m.records]
        assert len(set(seen)) == 6000
        # commits on revoke: a partition that moved is not read again by its new owner
        assert len(seen) == 6000
        if extra.get("partition.assignment.strategy") == "cooperative-sticky":
            # incremental: the first member never had everything revoked at once
            revokes = [ps for kind, ps in members[0].events if kind == "revoke"]
            assert all(len(ps) < 6 for ps in revokes)
    finally:
        for m in members:
            m.stop()


class PeerMember(threading.Thread):
    """A confluent-kafka group member; every call on its consumer is made from this thread."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.config = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
        self.topic = topic
        self.records: list[tuple[int, int]] = []
        self.owned: set[TopicPartition] = set()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        c = ConfluentConsumer(self.config)
        try:
            c.subscribe([self.topic])
            while not self.stop_flag.is_set():
                msg = c.poll(0.2)
                if msg is not None and msg.error() is None:
                    self.records.append((msg.partition(), msg.offset()))
                self.owned = {TopicPartition(tp.topic, tp.partition) for tp in c.assignment()}
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            c.close()

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(30)


KILLED_MEMBER = r"""
import json, sys, kcore, kcore.errors
bootstrap, group, topic = sys.argv[1:4]
c = kcore.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                    "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                    "heartbeat.interval.ms": 500})
c.subscribe([topic])
while True:
    recs = c.poll(0.5, max_records=50)
    for r in recs:
        print(json.dumps(["R", r.partition, r.offset]), flush=True)
    if recs:
        try:
            c.commit()
        except kcore.errors.KcoreError:  # rebalancing: the next poll rejoins
            continue
        print(json.dumps(["C"] + [[tp.partition, o] for tp, o in
              c.committed(c.assignment()).items() if o is not None]), flush=True)
"""


@pytest.mark.timeout(240)
def test_kcore_and_confluent_members_share_a_group_and_survive_a_killed_member(kafka_cluster):
    """3 kcore members (two here, one in a child process) and 1 confluent-kafka member in one
    group on 12 partitions (default strategies on both sides: kcore range, cooperative-sticky;
    librdkafka range, roundrobin; the group agrees on range, in the standard consumer
    protocol). Every partition has exactly one owner. Then the child is SIGKILLed without
    leaving: within the session timeout its partitions move to the others; every record is
    read, and only records the child read after its last commit are read twice."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("mixed"), name("g")
    create(bootstrap, topic, 12)
    produce(bootstrap, topic, 1200)
    members = [Member(bootstrap, group, [topic]) for _ in range(2)]
    peer = PeerMember(bootstrap, group, topic)
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_MEMBER, bootstrap, group, topic],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list = []

    def read_child() -> None:
        for line in proc.stdout:  # one at a time: the test watches them arrive
            lines.append(json.loads(line))

    reader = threading.Thread(target=read_child, daemon=True)
    reader.start()

    def check_members() -> None:
        for who in (*members, peer):
            assert who.error is None, repr(who.error)

    def survivors() -> list[set[TopicPartition]]:
        check_members()
        return [*(m.assignment() for m in members), peer.owned]

    try:
        for m in (*members, peer):
            m.start()

        def split_four_ways() -> bool:
            # The child's share is what the others leave: 3 partitions once all 4 have joined.
            held = survivors()
            return all(len(h) == 3 for h in held) and len(set().union(*held)) == 9

        wait_for(split_four_ways, 90, "four members (one of them the child) to split the topic")
        produce(bootstrap, topic, 1200, start=1200)
        wait_for(lambda: any(x[0] == "C" for x in lines), 60, "the child to read and commit")
        # Let the child get a bit further, then kill it without a LeaveGroup.
        produce(bootstrap, topic, 1200, start=2400)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(10)
        reader.join(10)
        wait_for(
            lambda: partitions_split(survivors(), topic, 12) and all(survivors()),
            60,
            "the three survivors to take the child's partitions",
        )
        # The session timeout (6 s) and a rebalance, not max.poll.interval.ms (300 s); wide,
        # for a loaded 2-core machine running a JVM, four members and a child process.
        assert time.monotonic() - killed_at < 45

        def survivors_read() -> set[tuple[int, int]]:
            check_members()
            kc = {(r.partition, r.offset) for m in members for r in list(m.records)}
            return kc | set(peer.records)

        child = {(x[1], x[2]) for x in lines if x[0] == "R"}
        wait_for(lambda: len(survivors_read() | child) >= 3600, 60, "every record to be read")
        assert len(survivors_read() | child) == 3600
        last_commit: dict[int, int] = {}
        for x in lines:
            if x[0] == "C":
                last_commit.update({p: o for p, o in x[1:]})
        twice = child & survivors_read()
        # read twice only from the child's window after its last commit
        assert all(o >= last_commit.get(p, 0) for p, o in twice), sorted(twice)[:10]
    finally:
        if proc.poll() is None:
            proc.kill()
        peer.stop()
        for m in members:
            m.stop()


def test_commit_then_restart_resumes_from_the_committed_offsets(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("resume"), name("g")
    create(bootstrap, topic, 3)
    produce(bootstrap, topic, 600)
    cfg = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, **FAST}
    first: list = []
    with kcore.Consumer(cfg) as c:
        c.subscribe([topic])
        while len(first) < 300:
            first += c.poll(0.5, max_records=300 - len(first))
        c.commit()
        positions = {tp: c.position(tp) for tp in c.assignment()}
        assert c.committed(list(positions)) == positions
        assert c.group_metadata().group_id == group
        assert c.group_metadata().generation_id >= 1
    rest: list = []
    with kcore.Consumer(cfg) as c:
        c.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(rest) < 300 and time.monotonic() < deadline:
            rest += c.poll(0.5)
        time.sleep(0.5)
        rest += c.poll(0.5)
    both = [(r.partition, r.offset) for r in first + rest]
    assert len(both) == 600 and len(set(both)) == 600


def test_auto_commit_commits_on_close(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("autocommit"), name("g")
    create(bootstrap, topic, 2)
    produce(bootstrap, topic, 100)
    cfg = {"bootstrap.servers": bootstrap, "group.id": group, **FAST}
    got: list = []
    with kcore.Consumer(cfg) as c:
        c.subscribe(topic)
        while len(got) < 100:
            got += c.poll(0.5)
    with kcore.Consumer(cfg) as c:
        committed = c.committed([(topic, 0), (topic, 1)])
    assert sum(o for o in committed.values() if o) == 100


def test_static_member_restarts_with_its_partitions(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("static"), name("g")
    create(bootstrap, topic, 4)
    cfg = {"bootstrap.servers": bootstrap, "group.id": group, **FAST, "session.timeout.ms": 30000}
    a = Member(bootstrap, group, [topic], **{"group.instance.id": "a", "session.timeout.ms": 30000})
    b = kcore.Consumer({**cfg, "group.instance.id": "b"})
    b.subscribe([topic])
    a.start()
    try:
        wait_for(
            lambda: (
                # b goes on polling: a rebalance the group starts meanwhile completes only
                # once every member has rejoined, b too (under load it failed: b sat idle)
                (b.poll(0.1) or True)
                # both members own partitions: b alone holding all four is the generation
                # before a joined, and a's join moves half of them (CI failed on that)
                and a.assignment()
                and b.assignment()
                and partitions_split([a.assignment(), b.assignment()], topic, 4)
                # a's listener has run for its current assignment
                and a.events
                and a.events[-1][0] == "assign"
                and set(a.events[-1][1]) == a.assignment()
            ),
            60,
            "a split group",
        )
        before = b.assignment()
        generation = b.group_metadata().generation_id
        b.close()  # a static member does not leave the group
        b = kcore.Consumer({**cfg, "group.instance.id": "b"})
        b.subscribe([topic])
        wait_for(lambda: (b.poll(0.1) or True) and b.assignment(), 30, "b to rejoin")
        assert b.assignment() == before
        # The coordinator may still rebalance once: the restarted member's subscription
        # carries generation -1 where its last one had the group's generation (as a restarted
        # Java member's does), and changed metadata makes the broker rebalance. What static
        # membership guarantees holds: a never lost its partitions to a session expiry.
        assert all(kind != "lost" for kind, _ in a.events), a.events
        assert b.group_metadata().generation_id >= generation
    finally:
        b.close()
        a.stop()


def test_a_second_process_with_the_same_instance_id_fences_the_first(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("fenced"), name("g")
    create(bootstrap, topic, 2)
    cfg = {"bootstrap.servers": bootstrap, "group.id": group, **FAST, "group.instance.id": "same"}
    first = kcore.Consumer(cfg)
    second = kcore.Consumer(cfg)
    try:
        first.subscribe([topic])
        wait_for(lambda: (first.poll(0.1) or True) and first.assignment(), 30, "first joined")
        second.subscribe([topic])
        wait_for(lambda: (second.poll(0.1) or True) and second.assignment(), 30, "second")
        with pytest.raises(FencedInstanceIdError):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                first.poll(0.2)
    finally:
        second.close()
        first.close()


def test_pattern_subscription_picks_up_new_topics(kafka_cluster):
    """A pattern matches whole topic names (Java's Pattern.matches): ``-[ab]`` does not take
    ``-a-dlq``."""
    bootstrap = kafka_cluster.bootstrap_servers
    prefix = name("pat")
    create(bootstrap, f"{prefix}-a", 1)
    create(bootstrap, f"{prefix}-a-dlq", 1)
    cfg = {"bootstrap.servers": bootstrap, "group.id": name("g"), **FAST}
    with kcore.Consumer(cfg) as c:
        c.subscribe(re.compile(re.escape(prefix) + r"-[ab]"))
        wait_for(lambda: (c.poll(0.1) or True) and c.assignment(), 30, "first topic")
        create(bootstrap, f"{prefix}-b", 2)
        wait_for(lambda: (c.poll(0.1) or True) and len(c.assignment()) == 3, 60, "the new topic")
        assert {tp.topic for tp in c.assignment()} == {f"{prefix}-a", f"{prefix}-b"}


def test_unsubscribe_and_close_revoke_and_commit_first(kafka_cluster):
    """As Java's onLeavePrepare: unsubscribe() and close() commit (auto-commit) and call
    on_revoke with what the member owns, in the caller's thread, before leaving. unsubscribe()
    also ends a manual assignment, so subscribe() works after assign(); subscribe([]) and
    assign([]) are unsubscribe()."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("leave"), name("g")
    create(bootstrap, topic, 2)
    produce(bootstrap, topic, 50)
    cfg = {"bootstrap.servers": bootstrap, "group.id": group, **FAST}
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    events: list = []
    caller = threading.get_ident()

    def on_revoke(ps):
        assert threading.get_ident() == caller
        events.append(("revoke", sorted(ps)))

    def subscribe(c, topics=(topic,)):
        c.subscribe(
            list(topics),
            on_assign=lambda ps: events.append(("assign", sorted(ps))),
            on_revoke=on_revoke,
        )

    with kcore.Consumer(cfg) as c:
        subscribe(c)
        got: list = []
        wait_for(lambda: (got.extend(c.poll(0.2)) or True) and len(got) == 50, 60, "50 records")
        c.unsubscribe()
        assert events == [("assign", tps), ("revoke", tps)]
        assert c.assignment() == set()
        assert sum(c.committed(tps).values()) == 50  # committed before on_revoke
        c.assign([tps[0]])  # manual after unsubscribe
        assert c.assignment() == {tps[0]}
        with pytest.raises(KcoreError, match="unsubscribe"):
            c.subscribe([topic])
        c.assign([])
        assert c.assignment() == set()
        subscribe(c)  # allowed again
        wait_for(lambda: (c.poll(0.2) or True) and len(c.assignment()) == 2, 60, "assignment")
        c.subscribe([])
        assert events[-1] == ("revoke", tps) and c.assignment() == set()
        subscribe(c)
        wait_for(lambda: (c.poll(0.2) or True) and len(c.assignment()) == 2, 60, "assignment")
        events.clear()
    assert events == [("revoke", tps)]  # by close()


def test_partitions_stay_when_the_committed_offset_lookup_fails(kafka_cluster):
    """The group assigns partitions and the first committed-offset lookup fails: the member
    keeps them and looks again (before, the join was done and the partitions were lost until
    the next rebalance)."""
    from kcore.errors import KcoreTimeoutError

    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("lookup"), name("g")
    create(bootstrap, topic, 2)
    produce(bootstrap, topic, 40)
    cfg = {"bootstrap.servers": bootstrap, "group.id": group, **FAST, "enable.auto.commit": False}
    with kcore.Consumer(cfg) as c:
        c.assign([(topic, 0), (topic, 1)])
        c.commit({(topic, 0): 10, (topic, 1): 10})
    with kcore.Consumer(cfg) as c:
        offsets = c._core.group.offsets
        real, calls = offsets.fetch_with_epochs, []

        async def flaky(partitions, timeout):
            calls.append(sorted(partitions))
            if len(calls) == 1:
                raise KcoreTimeoutError("injected: the coordinator did not answer")
            return await real(partitions, timeout)

        offsets.fetch_with_epochs = flaky
        c.subscribe([topic])
        got: list = []
        wait_for(lambda: (got.extend(c.poll(0.2)) or True) and len(got) == 20, 60, "records")
        assert len(calls) >= 2
        firsts = {p: min(r.offset for r in got if r.partition == p) for p in (0, 1)}
        assert firsts == {0: 10, 1: 10}


def test_poll_keeps_its_timeout_while_the_group_rebalances(kafka_cluster):
    """A rebalance waits for every member to rejoin, up to the rebalance timeout: a member that
    is not polling holds it up. As Java's, poll(timeout) returns when its timeout is up (the
    join goes on at the next poll); it blocked until the rebalance was over."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("slow-rebalance"), name("g")
    create(bootstrap, topic, 2)
    produce(bootstrap, topic, 10)
    base = {"bootstrap.servers": bootstrap, "group.id": group, **FAST}
    with kcore.Consumer({**base, "max.poll.interval.ms": 15000}) as slow:
        slow.subscribe([topic])
        wait_for(lambda: (slow.poll(0.2) or True) and len(slow.assignment()) == 2, 60, "first")
        # slow stops polling; its heartbeats go on, so the group waits for it to rejoin
        with kcore.Consumer(base) as c:
            c.subscribe([topic])
            t0 = time.monotonic()
            assert c.poll(0.5) == []
            # Not the 15 s the rebalance waits for slow (this first poll also bootstraps, finds
            # the coordinator and sends the JoinGroup; a loaded machine is given its time).
            assert time.monotonic() - t0 < 10
            got: list = []
            wait_for(lambda: (got.extend(c.poll(0.5)) or True) and len(got) == 10, 60, "records")


def test_wakeup_interrupts_poll_from_another_thread(kafka_cluster):
    """Java's wakeup(): the poll under way (or the next one) raises WakeupError; the consumer
    goes on working afterwards."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("wakeup"), name("g")
    create(bootstrap, topic, 1)
    with kcore.Consumer({"bootstrap.servers": bootstrap, "group.id": group, **FAST}) as c:
        c.subscribe([topic])
        c.poll(1.0)
        threading.Timer(0.5, c.wakeup).start()
        t0 = time.monotonic()
        with pytest.raises(WakeupError):
            c.poll(30)
        assert time.monotonic() - t0 < 10
        c.wakeup()  # before the call: the next one raises at once
        with pytest.raises(WakeupError):
            c.poll(30)
        produce(bootstrap, topic, 3)
        got: list = []
        wait_for(lambda: (got.extend(c.poll(0.5)) or True) and len(got) == 3, 60, "records")


@pytest.mark.parametrize("protocol", ["classic", "consumer"], ids=["classic", "kip848"])
def test_a_member_that_stopped_polling_rejoins_at_its_next_poll(kafka_cluster, protocol):
    """max.poll.interval.ms passes without a poll: the member leaves (its partitions are
    lost), and its next poll joins again and reads on (under KIP-848 it stayed out)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("stale"), name("g")
    create(bootstrap, topic, 2)
    produce(bootstrap, topic, 20)
    cfg = {"bootstrap.servers": bootstrap, "group.id": group, **FAST, "group.protocol": protocol}
    cfg["max.poll.interval.ms"] = 1500
    if protocol == "consumer":
        del cfg["session.timeout.ms"], cfg["heartbeat.interval.ms"]
    events: list = []
    with kcore.Consumer(cfg) as c:
        c.subscribe([topic], on_lost=lambda ps: events.append(("lost", sorted(ps))))
        got: list = []
        wait_for(lambda: (got.extend(c.poll(0.2)) or True) and len(got) == 20, 60, "records")
        # No poll: the heartbeat task leaves the group (and marks the partitions lost; only
        # the next poll clears that). A fixed sleep raced the leave on a loaded machine.
        wait_for(lambda: c._core.group.member.lost, 30, "the member to leave")
        produce(bootstrap, topic, 20, start=20)
        more: list = []
        want = {b"v%d" % i for i in range(20, 40)}
        # Every new record, not a count: the member may read v0-v19 again (leaving on a poll
        # timeout commits nothing), and 20 of those would satisfy a count.
        wait_for(
            lambda: (more.extend(c.poll(0.2)) or True) and {r.value for r in more} >= want,
            60,
            "rejoin",
        )
        assert events and events[0][0] == "lost"


def test_async_consumer_in_a_group(kafka_cluster):
    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("async-grp"), name("g")
    create(bootstrap, topic, 3)
    produce(bootstrap, topic, 300)
    assigned: list = []

    async def on_assign(ps):
        await asyncio.sleep(0)
        assigned.extend(ps)

    async def main():
        cfg = {"bootstrap.servers": bootstrap, "group.id": group, **FAST}
        async with kcore.AsyncConsumer(cfg) as c:
            c.subscribe([topic], on_assign=on_assign)
            got: list = []
            deadline = time.monotonic() + 60
            while len(got) < 300 and time.monotonic() < deadline:
                got += await c.poll(0.5)
            await c.commit()
            return got, await c.committed([(topic, p) for p in range(3)])

    got, committed = asyncio.run(main())
    assert len({(r.partition, r.offset) for r in got}) == 300
    assert sorted(assigned) == [TopicPartition(topic, p) for p in range(3)]
    assert sum(committed.values()) == 300


def test_the_group_carries_on_when_the_coordinator_s_broker_dies(kafka_cluster3):
    bootstrap = kafka_cluster3.bootstrap_servers
    topic, group = name("coord-dies"), name("g")
    create(bootstrap, topic, 6, rf=3)
    produce(bootstrap, topic, 1200, acks="all")
    members = [Member(bootstrap, group, [topic]) for _ in range(2)]
    for m in members:
        m.start()
    killed = None
    try:
        wait_for(lambda: total(members) >= 1200, 60, "the first records")
        coordinator = members[0].consumer._core.group.link.node_id
        assert coordinator is not None
        killed = coordinator
        kafka_cluster3.kill_broker(coordinator)
        produce(bootstrap, topic, 1200, start=1200, acks="all")
        wait_for(
            lambda: len({(r.partition, r.offset) for m in members for r in m.records}) >= 2400,
            120,
            "the records written after the coordinator died",
        )
        for m in members:
            assert m.error is None, m.error
        wait_for(
            lambda: members[0].consumer._core.group.link.node_id not in (None, killed),
            60,
            "a new coordinator",
        )
    finally:
        for m in members:
            m.stop()
        if killed is not None:
            kafka_cluster3.start_broker(killed)


def test_a_failing_listener_is_raised_after_the_rebalance_step_finishes():
    """No broker: a listener's exception does not stop the step (the partitions still move);
    poll raises it at the end, as Java does, and the sync and async drivers agree."""
    from kcore.cluster.client import ClusterClient
    from kcore.config import ClientConfig
    from kcore.consumer.group import GroupCoordinator, drive_async, drive_sync

    cfg = ClientConfig({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, role="consumer")
    no_partitions = SimpleNamespace(interrupt_wait=lambda: None)  # the listener moves none
    group = GroupCoordinator(ClusterClient(cfg), cfg, no_partitions)  # type: ignore[arg-type]
    done: list[str] = []

    def bad(partitions):
        raise ValueError(f"listener saw {partitions}")

    async def abad(partitions):
        raise ValueError("async listener")

    def step(fn):
        def body():
            yield from group._listener(fn, [TopicPartition("t", 0)], "on_assign")
            done.append("after")

        group._poll_step = body
        return group.poll_step()

    with pytest.raises(ValueError, match="listener saw"):
        drive_sync(step(bad), run=asyncio.run)
    with pytest.raises(ValueError, match="async listener"):
        drive_sync(step(abad), run=asyncio.run)
    with pytest.raises(ValueError, match="async listener"):
        asyncio.run(drive_async(step(abad)))
    assert done == ["after"] * 3


def test_kip848_resubscribing_after_unsubscribe_takes_only_the_new_topics(kafka_cluster):
    """A KIP-848 member that unsubscribed forgets what it was given: subscribing to another
    topic does not take the first topic's partitions back (they may be another member's)."""
    bootstrap = kafka_cluster.bootstrap_servers
    first, second, group = name("first"), name("second"), name("g")
    create(bootstrap, first, 2)
    create(bootstrap, second, 1)
    cfg = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer"}
    cfg["auto.offset.reset"] = "earliest"
    seen: list = []
    with kcore.Consumer(cfg) as c:
        c.subscribe([first])
        wait_for(lambda: (c.poll(0.2) or True) and len(c.assignment()) == 2, 60, "first")
        c.unsubscribe()
        c.subscribe([second])

        def settled() -> bool:
            c.poll(0.2)
            seen.append(set(c.assignment()))
            return c.assignment() == {TopicPartition(second, 0)}

        wait_for(settled, 60, "second")
    assert all(tp.topic == second for owned in seen for tp in owned), seen
