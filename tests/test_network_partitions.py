"""Network partitions against real brokers: three nodes, each in a network namespace of its own
(``kafka_cluster3_isolated``), one of them cut off (its link down: packets are lost, it keeps
running) for longer than the clients' request timeout, then healed.

* An idempotent acks=all producer whose partition leader is cut off: the partition's records
  go to the new leader while the old one is cut off, every record is acknowledged, none lost
  or written twice, each partition's order kept.
* A group member cut off from its coordinator (it runs in a namespace of its own): its
  partitions move to the other member, it rejoins after the heal, and no record is processed
  twice except those it processed after its last successful commit.
* A consume-transform-produce application whose transaction coordinator is cut off: the
  output holds every input record exactly once.
* Offsets sent to a transaction while the group coordinator is cut off: the call times out,
  the request goes on, and the commit carries them.

The harness needs root (or CAP_NET_ADMIN) and iproute2; without them these tests error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from eos_app import GroupProgress, Processor, ReadUntil, read_committed_kcore

import kcore
from kcore.errors import KcoreError, KcoreTimeoutError
from kcore.testing import KafkaCluster

pytestmark = pytest.mark.slow

# The clients' request timeout; every partition lasts well beyond it.
REQUEST_TIMEOUT_MS = 3000
CUT_SECONDS = 10


def wait_for(cond: Callable[[], bool], timeout: float, what: str, describe=lambda: "") -> float:
    """Wait until ``cond()``; returns the seconds it took (reported, never asserted)."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{describe()}")
        time.sleep(0.1)
    return time.monotonic() - start


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(cluster: KafkaCluster, name: str, partitions: int) -> None:
    # Returns once the metadata gives every partition a leader.
    cluster.create_topic(name, partitions, 3, {"min.insync.replicas": "2"})


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    # Each broker applies a new topic's metadata on its own time: a broker that has not yet
    # answers UNKNOWN_TOPIC_OR_PARTITION, so that answer is waited out like a missing leader.
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        deadline = time.monotonic() + 30
        while True:
            try:
                leader = admin.describe_topics([topic])[topic].partitions[partition].leader
            except KcoreError:
                if time.monotonic() > deadline:
                    raise
                leader = -1
            if leader >= 0 or time.monotonic() > deadline:
                return leader
            time.sleep(0.1)


# -- 1. an idempotent producer whose leader is cut off ---------------------------------------------


class SequenceProducer:
    """Sends ``partition-sequence`` values to each partition in turn, from a thread, until
    stopped; records every delivery failure."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.producer = kcore.Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "max.in.flight.requests.per.connection": 5,
                "request.timeout.ms": REQUEST_TIMEOUT_MS,
                "linger.ms": 5,
            }
        )
        self.topic, self.partitions = topic, partitions
        self.sent = [0] * partitions
        self.acked = [0] * partitions
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()

    def _delivered(self, partition: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, metadata: Any) -> None:
            with self._lock:
                if err is not None:
                    self.failures.append(f"partition {partition}: {err!r}")
                else:
                    self.acked[partition] += 1

        return on_delivery

    def _run(self) -> None:
        callbacks = [self._delivered(p) for p in range(self.partitions)]
        while not self._stop.is_set():
            for p in range(self.partitions):
                for _ in range(20):
                    seq = self.sent[p]
                    self.producer.send(
                        self.topic, b"%d-%d" % (p, seq), partition=p, on_delivery=callbacks[p]
                    )
                    self.sent[p] = seq + 1
            time.sleep(0.01)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        self.producer.flush(120)
        self.producer.close()


def read_partition(bootstrap: str, topic: str, partition: int, count: int) -> list[bytes]:
    """The partition's values, read until ``count`` and a quiet second (a repeat would show as
    more), or two minutes. Not up to the end offset a first ListOffsets gives: until a broker
    just healed catches up with the controller it serves its metadata from before the cut
    (itself the leader, at the old epoch), so a fresh consumer that bootstraps there asks it,
    and it answers with its log's end at the cut (2,660 of 19,440 acknowledged, once). Once it
    has caught up it fences that epoch, and the consumer moves to the leader."""
    values: list[bytes] = []
    with kcore.Consumer(
        {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
    ) as consumer:
        consumer.assign([(topic, partition)])
        until = ReadUntil(count, quiet=1)
        records: list[Any] = []
        while not until.done(len(values), bool(records)):
            records = consumer.poll(0.5)
            values += [r.value for r in records]
    return values


def test_idempotent_producer_loses_and_repeats_nothing_while_its_leader_is_cut_off(
    kafka_cluster3_isolated,
):
    cluster = kafka_cluster3_isolated
    bootstrap = cluster.bootstrap_servers
    topic, partitions = unique("cut-leader"), 3
    create_topic(cluster, topic, partitions)
    leader = leader_of(bootstrap, topic, 0)
    producer = SequenceProducer(bootstrap, topic, partitions)
    producer.start()
    try:
        wait_for(lambda: producer.acked[0] >= 2000, 60, "the first acknowledgements")
        with cluster.partition(leader):
            cut = time.monotonic()
            before = list(producer.acked)
            # Leadership moves (broker.session.timeout.ms), and partition 0's records go to the
            # new leader: none waits for a connection to the old one (as Java's producer).
            moved = wait_for(
                lambda: producer.acked[0] > before[0] + 100,
                30,
                "partition 0's records to be acknowledged by its new leader",
            )
            print(f"partition 0 acknowledged again {moved:.1f}s after its leader was cut off")
            # Longer than request.timeout.ms: in-flight requests time out.
            time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut)))
        healed_at = list(producer.acked)
        wait_for(lambda: producer.acked[0] >= healed_at[0] + 2000, 60, "acks after the heal")
    finally:
        producer.stop()
    assert producer.failures == []
    assert producer.acked == producer.sent
    for p in range(partitions):
        values = read_partition(bootstrap, topic, p, producer.sent[p])
        expected = [b"%d-%d" % (p, i) for i in range(producer.sent[p])]
        if values != expected:
            dup = sum(n - 1 for n in Counter(values).values() if n > 1)
            lost = len(set(expected) - set(values))
            raise AssertionError(
                f"partition {p}: {len(values)} records read, {len(expected)} sent, "
                f"{lost} lost, {dup} repeated, in order: {values == sorted(values, key=_seq)}"
            )


def _seq(value: bytes) -> int:
    return int(value.split(b"-")[1])


# -- 2. a group member cut off from its coordinator ------------------------------------------------

MEMBER = r"""
import json, os, sys, kcore
from kcore.errors import KcoreError
bootstrap, group, topic, stop_file, request_timeout = sys.argv[1:6]
def emit(kind, **fields):
    print(json.dumps({"event": kind, **fields}), flush=True)
consumer = kcore.Consumer({
    "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
    "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
    "request.timeout.ms": int(request_timeout), "default.api.timeout.ms": 10000})
parts = lambda tps: sorted(tp.partition for tp in tps)
consumer.subscribe([topic], on_assign=lambda tps: emit("assigned", partitions=parts(tps)),
                   on_revoke=lambda tps: emit("revoked", partitions=parts(tps)),
                   on_lost=lambda tps: emit("lost", partitions=parts(tps)))
while not os.path.exists(stop_file):
    try:
        records = consumer.poll(0.5)
    except KcoreError as exc:
        emit("error", error=repr(exc))
        continue
    if not records:
        continue
    emit("processed", records=[[r.partition, r.offset] for r in records])
    offsets = {}
    for r in records:
        offsets[(r.topic, r.partition)] = max(offsets.get((r.topic, r.partition), 0), r.offset + 1)
    try:
        consumer.commit(offsets)
        emit("committed", offsets=[[tp[1], o] for tp, o in offsets.items()])
    except KcoreError as exc:
        emit("commit_failed", error=repr(exc))
consumer.close()
emit("closed")
"""


@dataclass
class Member:
    """A group member in a child process (in a network host of its own, or not), whose events
    (assignments, records processed, commits) are read from its output as they come."""

    name: str
    argv: list[str]
    log_path: Path
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.append((time.monotonic(), json.loads(line)))
            except ValueError:
                pass

    def assignment(self) -> list[int]:
        current: list[int] = []
        for _, e in list(self.events):
            if e["event"] == "assigned":
                current = sorted(set(current) | set(e["partitions"]))
            elif e["event"] in ("revoked", "lost"):
                current = [p for p in current if p not in e["partitions"]]
        return current

    def processed_since(self, since: float) -> int:
        return sum(len(e["records"]) for t, e in list(self.events) if t >= since and
                   e["event"] == "processed")  # fmt: skip

    def assigned_since(self, since: float) -> bool:
        return any(
            t >= since and e["event"] == "assigned" and e["partitions"] for t, e in self.events
        )

    def stop(self) -> None:
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        self._log.close()

    def describe(self) -> str:
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        kinds = Counter(e["event"] for _, e in self.events)
        tail = self.log_path.read_text(errors="replace").splitlines()[-40:]
        return f"member {self.name} ({state}), events {dict(kinds)}; stderr:\n" + "\n".join(tail)


def uncovered_processings(member: Member) -> Counter[tuple[int, int]]:
    """The records ``member`` processed that no successful commit of its own covered while
    their partition was still its own: its uncommitted windows, the only records another
    member (or this one, assigned the partition again) may process again. A commit made
    after the partition was lost or revoked covers only what was processed since."""
    pending: list[tuple[int, int]] = []
    uncovered: Counter[tuple[int, int]] = Counter()
    for _, e in member.events:
        if e["event"] == "processed":
            pending += [tuple(r) for r in e["records"]]  # type: ignore[misc]
        elif e["event"] == "committed":
            done = dict(map(tuple, e["offsets"]))  # type: ignore[arg-type]
            pending = [(p, o) for p, o in pending if not (p in done and o < done[p])]
        elif e["event"] in ("lost", "revoked"):
            gone = set(e["partitions"])
            uncovered.update(r for r in pending if r[0] in gone)
            pending = [r for r in pending if r[0] not in gone]
    return uncovered + Counter(pending)


class BackgroundProducer:
    """Keeps writing to a topic (round robin, acks=all) until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = kcore.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        self.topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self.producer.send_batch(self.topic, [b"%d" % n for n in range(i, i + 20)])
            i += 20
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.producer.flush(60)
        self.producer.close()


def test_a_member_cut_off_from_its_coordinator_loses_its_partitions_and_rejoins(
    kafka_cluster3_isolated, tmp_path
):
    cluster = kafka_cluster3_isolated
    bootstrap = cluster.bootstrap_servers
    topic, group, partitions = unique("cut-member"), unique("cut-member"), 6
    create_topic(cluster, topic, partitions)
    stop_file = tmp_path / "stop"
    host = cluster.client_host("member_b")
    script = [sys.executable, "-c", MEMBER, bootstrap, group, topic, str(stop_file)]
    script.append(str(REQUEST_TIMEOUT_MS))
    writer = BackgroundProducer(bootstrap, topic)
    a = Member("a", script, tmp_path / "a.log")
    b = Member("b", host.command(script), tmp_path / "b.log")
    members = (a, b)

    def describe() -> str:
        return "\n".join(m.describe() for m in members)

    try:
        wait_for(
            lambda: a.assignment() and b.assignment() and b.processed_since(0) > 0,
            90,
            "both members to have partitions and b to process records",
            describe,
        )
        with cluster.partition(host):
            cut = time.monotonic()
            moved = wait_for(
                lambda: a.assignment() == list(range(partitions)),
                60,
                "b's partitions to move to a",
                describe,
            )
            time.sleep(2)
        healed = time.monotonic()
        rejoined = wait_for(
            lambda: b.assigned_since(healed) and b.processed_since(healed) > 0,
            90,
            "b to rejoin and process records again",
            describe,
        )
        print(f"partitions moved {moved:.1f}s after the cut; b rejoined {rejoined:.1f}s after")
        writer.stop()
        end = kcore.Consumer({"bootstrap.servers": bootstrap})
        try:
            ends = end.end_offsets([(topic, p) for p in range(partitions)])
        finally:
            end.close()
        want = {(tp.partition, o) for tp, end_offset in ends.items() for o in range(end_offset)}

        def processed() -> set[tuple[int, int]]:
            return {
                (p, o)
                for m in members
                for _, e in list(m.events)
                if e["event"] == "processed"
                for p, o in e["records"]
            }

        wait_for(lambda: want <= processed(), 90, "every record to be processed", describe)
    finally:
        stop_file.touch()
        writer.stop() if not writer._stop.is_set() else None
        for m in members:
            m.stop()
    assert cut < healed
    counts: Counter[tuple[int, int]] = Counter()
    for m in members:
        for _, e in m.events:
            if e["event"] == "processed":
                counts.update(tuple(r) for r in e["records"])  # type: ignore[misc]
    assert set(counts) >= want, f"{len(want - set(counts))} records never processed"
    allowed = uncovered_processings(a) + uncovered_processings(b)
    beyond = {r: n - 1 for r, n in counts.items() if n > 1 and n - 1 > allowed[r]}
    assert not beyond, (
        f"processed twice outside an uncommitted window: {sorted(beyond)[:20]}\n"
        + timeline(members, min(beyond), cut, healed)
    )


def timeline(
    members: tuple[Member, ...], record: tuple[int, int], cut: float, healed: float
) -> str:
    """What each member did about ``record``'s partition (times from the cut; healed at the
    time given), for a failure's message."""
    p, o = record
    lines: list[tuple[float, str]] = [(healed - cut, "healed")]
    for m in members:
        for t, e in m.events:
            kind = e["event"]
            if kind == "processed":
                offsets = [ro for rp, ro in e["records"] if rp == p and abs(ro - o) <= 100]
                if offsets:
                    mark = " <-" if o in offsets else ""
                    lines.append(
                        (t - cut, f"{m.name} processed {min(offsets)}..{max(offsets)}{mark}")
                    )
            elif kind == "committed":
                done = dict(map(tuple, e["offsets"]))
                if p in done and abs(done[p] - o) <= 100:
                    lines.append((t - cut, f"{m.name} committed {done[p]}"))
            elif kind in ("assigned", "revoked", "lost") and p in e["partitions"]:
                lines.append((t - cut, f"{m.name} {kind} {e['partitions']}"))
            elif kind in ("commit_failed", "error"):
                lines.append((t - cut, f"{m.name} {kind}: {e['error'][:160]}"))
    head = f"partition {p} around offset {o}, times from the cut:"
    return "\n".join([head] + [f"{t:+.2f}s {line}" for t, line in sorted(lines)])


# -- 3. exactly once while the transaction coordinator is cut off ----------------------------------


def transaction_coordinator(cluster: Any, txn_id: str) -> int:
    """The transactional id's coordinator, as Kafka's own tool describes it."""
    deadline = time.monotonic() + 60
    while True:
        res = cluster.run_tool(
            "kafka-transactions",
            "--bootstrap-server",
            cluster.bootstrap_servers,
            "describe",
            "--transactional-id",
            txn_id,
        )
        lines = [line.split() for line in res.stdout.splitlines() if line.strip()]
        if res.returncode == 0 and len(lines) >= 2 and "CoordinatorId" in lines[0]:
            return int(lines[1][lines[0].index("CoordinatorId")])
        if time.monotonic() > deadline:
            raise AssertionError(f"kafka-transactions describe failed:\n{res.stderr[-2000:]}")
        time.sleep(1)


def test_consume_transform_produce_is_exactly_once_while_its_coordinator_is_cut_off(
    kafka_cluster3_isolated, tmp_path
):
    cluster = kafka_cluster3_isolated
    bootstrap = cluster.bootstrap_servers
    n, partitions = 20_000, 3
    tag = uuid.uuid4().hex[:8]
    source, sink, group, txn_id = f"cut-in-{tag}", f"cut-out-{tag}", f"cut-{tag}", f"cut-{tag}"
    for t in (source, sink):
        create_topic(cluster, t, partitions)
    with kcore.Producer({"bootstrap.servers": bootstrap, "acks": "all"}) as p:
        p.send_batch(source, [b"%d" % i for i in range(n)], keys=[b"k%d" % i for i in range(n)])
        p.flush(120)
    extra = {"request.timeout.ms": REQUEST_TIMEOUT_MS}
    args = [bootstrap, group, source, sink, txn_id, json.dumps(extra)]
    processor = Processor(args, tmp_path / "processor.log")
    try:
        with GroupProgress(bootstrap, group, source, partitions) as progress:
            wait_for(
                lambda: progress.committed() >= n // 5, 120, "the first commits", processor.describe
            )
            coordinator = transaction_coordinator(cluster, txn_id)
            with cluster.partition(coordinator):
                time.sleep(CUT_SECONDS)
            wait_for(
                lambda: progress.committed() >= n, 240, "the rest of the input", processor.describe
            )
    finally:
        processor.kill()
    got = read_committed_kcore(bootstrap, sink, partitions, n)
    assert len(got) == n, f"read {len(got)} committed records, {len(set(got))} distinct"
    assert sorted(got) == sorted(b"%d!" % i for i in range(n))


# -- 4. offsets sent to a transaction while the group coordinator is cut off -----------------------


def test_offsets_whose_send_timed_out_still_commit_with_the_transaction(kafka_cluster3_isolated):
    """send_offsets_to_transaction times out while the group's coordinator is cut off; the
    request goes on (as Java keeps it queued), and commit_transaction waits for it: the
    transaction never commits without the offsets the caller handed over."""
    cluster = kafka_cluster3_isolated
    bootstrap = cluster.bootstrap_servers
    source, sink, group = unique("offs-in"), unique("offs-out"), unique("offs")
    for t in (source, sink):
        create_topic(cluster, t, 1)
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.alter_consumer_group_offsets(group, {(source, 0): 0})  # the group exists
        coordinator = admin.describe_consumer_groups([group])[group].coordinator
        producer = kcore.Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": unique("offs"),
                "request.timeout.ms": REQUEST_TIMEOUT_MS,
            }
        )
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(sink, b"output")
            with cluster.partition(coordinator):
                with pytest.raises(KcoreTimeoutError):
                    producer.send_offsets_to_transaction({(source, 0): 42}, group, timeout=1)
                time.sleep(CUT_SECONDS)  # the request times out; the coordinator moves
            producer.commit_transaction(120)
        finally:
            producer.close()
        # require_stable: once the transaction's markers are written. Asked until it holds: a
        # former coordinator back from the partition answers from its stale state for a moment
        # (before it learns it was replaced); without the offsets it would never hold.
        want = {kcore.TopicPartition(source, 0): 42}
        seen: list[Any] = []

        def committed() -> bool:
            seen.append(admin.list_consumer_group_offsets(group, require_stable=True, timeout=60))
            return seen[-1] == want

        wait_for(committed, 60, "the offsets to be committed", lambda: f"last read: {seen[-1]}")
