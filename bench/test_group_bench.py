"""kcore's consumer groups and transactional producer against confluent-kafka, measured in the
same run against the same real broker (the ``kafka_cluster`` fixture of kcore's pytest plugin,
or ``KCORE_BOOTSTRAP``).

Three groups, so bench/report.py's ratios (peer median / kcore median) compare like with like:

* ``join:first-record``: a fresh consumer with a new ``group.id`` subscribes to a topic of 6
  partitions already holding JOIN_RECORDS records (``auto.offset.reset=earliest``) and polls
  until the first record arrives. Timed: from constructing the consumer to the first record
  (kcore ``Consumer(config)``, ``subscribe``, ``poll(1.0)`` until it returns records;
  confluent-kafka ``Consumer(config)``, ``subscribe``, ``poll(1.0)`` until a message without
  error). Rows: the classic protocol (each client's default assignors, ``session.timeout.ms``
  6000 and ``heartbeat.interval.ms`` 500 for both) and ``group.protocol=consumer`` (KIP-848;
  both clients reject the two timeouts there: the broker sets them). Closing the consumer is
  outside the timed part.
* ``rebalance:3rd-member``: two members of a new group, each polling in its own thread
  (``poll(0.1)`` in a loop), own the 12 partitions of a topic (6 each) and have read all of its
  REBALANCE_RECORDS records; a third member joins. Timed: from the third member's ``subscribe``
  until the group is balanced again: the three members' partitions are disjoint, cover all 12,
  and each member holds 4 (what every assignor here hands out with 12 partitions and 3
  members). Also kept per round (``covered_s_rounds``): when the members first all held some
  partitions whose union covered the 12; with the incremental protocols (cooperative-sticky,
  KIP-848) that can happen one step before the end. What a member holds is tracked by its
  rebalance listeners (assign adds, revoke and lost remove), which both clients call inside
  ``poll`` in the member's thread, and checked against ``assignment()`` after the round. Rows:
  kcore's default (``range, cooperative-sticky``, hence eager ``range``), kcore
  ``cooperative-sticky``, kcore ``group.protocol=consumer``; confluent-kafka's default
  (``range,roundrobin``, eager ``range``), ``cooperative-sticky`` and
  ``group.protocol=consumer``. Each round has its own group; setting up the first two members
  and closing all three is outside the timed part.
* ``txn:1000x100B``: TXN_N transactions (``KCORE_BENCH_TXN_N``, default 50) of 1,000 records
  of 100 bytes (the producer benchmark's JSON-like values, no keys) into a 6-partition topic.
  ``init_transactions`` and two priming transactions are outside the timed part; a round is
  TXN_N times ``begin_transaction``, 1,000 sends, ``commit_transaction``. Rows: kcore
  ``send`` per record, kcore one ``send_batch`` of the 1,000 values, confluent-kafka
  ``produce`` per record. Both clients get ``linger.ms`` 5 and ``batch.size`` 1,000,000 bytes
  (librdkafka's defaults, as in bench/test_producer_bench.py); ``acks=all`` and idempotence
  come with transactions.

Besides wall time, each round records the process CPU time (every thread: the members',
kcore's network threads, librdkafka's), the broker's CPU time and the peak RSS growth
(bench/test_producer_bench.py's ``RoundMeters``).

Correctness, outside the timed part: a join's first record must be offset 0 of its partition
holding the value written there, and confluent-kafka must have returned no error message; after
a rebalance round every member's listener-tracked partitions must equal its ``assignment()``,
the three must split the 12 partitions 4/4/4, every record of the topic must have been read by
some member, and no member may have raised; after a transactional row's rounds, a
``read_committed`` kcore consumer must read exactly the records of every committed transaction
(priming included) from the row's own topic, and ``send_batch``'s results must count 1,000
records each.

The broker is warmed up first: group joins by both clients for WARM_UP_S (the first also
creates ``__consumer_offsets``), and, before the transactional rows, transactions of 1,000
records by both clients for TXN_WARM_UP_S (``KCORE_BENCH_TXN_WARM_UP_S``, default 20 s; the
first creates ``__transaction_state``): a fresh broker's transactions were 3-4x slower.

Other knobs: ``KCORE_BENCH_JOIN_ROUNDS`` (default 5), ``KCORE_BENCH_REBALANCE_ROUNDS`` (3),
``KCORE_BENCH_TXN_ROUNDS`` (3).

Run: ``pytest bench/test_group_bench.py --benchmark-json=out.json && python bench/report.py
out.json`` (see docs/benchmarks-groups.md).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_producer_bench import (
    VALUE_SIZE,
    Broker,
    RoundMeters,
    _info,
    _need,
    _optional,
    make_values,
)

import kcore
from kcore.admin import NewTopic

pytestmark = [pytest.mark.broker, pytest.mark.slow]

JOIN_ROUNDS = int(os.environ.get("KCORE_BENCH_JOIN_ROUNDS", "5"))
REBALANCE_ROUNDS = int(os.environ.get("KCORE_BENCH_REBALANCE_ROUNDS", "3"))
TXN_N = int(os.environ.get("KCORE_BENCH_TXN_N", "50"))
TXN_ROUNDS = int(os.environ.get("KCORE_BENCH_TXN_ROUNDS", "3"))
TXN_RECORDS = 1000
TXN_PRIME = 2  # transactions per producer before its rounds, untimed
JOIN_PARTITIONS = 6
JOIN_RECORDS = 3000
REBALANCE_PARTITIONS = 12
REBALANCE_RECORDS = 3000
MEMBERS = 3
TXN_PARTITIONS = 6
# The classic protocol's timeouts, the same for both clients (the broker owns them under
# KIP-848, and both clients refuse them there).
CLASSIC_TIMEOUTS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
MEMBER_POLL_S = 0.1
JOIN_POLL_S = 1.0
LINGER_MS = 5
BATCH_SIZE = 1_000_000
TIMEOUT_S = 60.0  # for one join, one rebalance, one commit
WARM_UP_S = 3.0  # group joins by both clients, before the first benchmark
# Transactions by both clients before the transactional rows: a fresh broker's transaction path
# is 3-4x slower for its first thousand or two transactions (JIT), which would hide the clients.
TXN_WARM_UP_S = float(os.environ.get("KCORE_BENCH_TXN_WARM_UP_S", "20"))

SETTINGS = {  # what report.py prints about the run
    "join topic": f"{JOIN_PARTITIONS} partitions, {JOIN_RECORDS:,} records of {VALUE_SIZE} B",
    "rebalance topic": f"{REBALANCE_PARTITIONS} partitions, {REBALANCE_RECORDS:,} records",
    "classic protocol": "session.timeout.ms 6000, heartbeat.interval.ms 500 (both clients); "
    "assignors: each client's default unless the row says",
    "KIP-848": "group.protocol=consumer, the broker's heartbeat interval and session timeout",
    "offsets": "auto.offset.reset earliest, enable.auto.commit (both defaults: on)",
    "member poll": f"poll({MEMBER_POLL_S:g}) in a loop, one thread a member",
    "transactions": f"{TXN_N} a round of {TXN_RECORDS:,} records of {VALUE_SIZE} B, "
    f"linger.ms {LINGER_MS}, batch.size {BATCH_SIZE:,} B, acks all",
}

confluent = _optional("confluent_kafka")

JOIN = pytest.mark.benchmark(group="join:first-record")
REBALANCE = pytest.mark.benchmark(group="rebalance:3rd-member")
TXN = pytest.mark.benchmark(group="txn:1000x100B")


def _bench_info(benchmark: Any, key: str, label: str, impl: str, **extra: Any) -> None:
    _info(benchmark, key, label, impl=impl, settings=SETTINGS, **extra)


def _group_id(what: str) -> str:
    return f"bench-{what}-{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------------------------------------
# The broker, its topics (written once, outside the timed part), warmed up


@dataclass
class Env:
    broker: Broker
    join_topic: str
    first_values: dict[int, bytes]  # partition -> the value at offset 0 of the join topic
    rebalance_topic: str


def _create(broker: Broker, prefix: str, partitions: int) -> str:
    broker.count += 1
    name = f"{prefix}-{broker.run}-{broker.count:03d}"
    broker.admin.create_topics([NewTopic(name, partitions, 1)], timeout=30)
    broker.created.append(name)
    described = broker.admin.describe_topics([name], timeout=30)
    assert len(described[name].partitions) == partitions
    return name


def _fill(broker: Broker, topic: str, partitions: int, n: int) -> dict[int, list[bytes]]:
    """``n`` values, ``n / partitions`` a partition (one send_batch a partition), checked by
    the end offsets."""
    values = make_values(n)
    by_partition = {p: values[p::partitions] for p in range(partitions)}
    with kcore.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": LINGER_MS}) as p:
        sent = [p.send_batch(topic, vs, partition=q) for q, vs in by_partition.items()]
        for result in sent:
            result.result(TIMEOUT_S)
    got = broker.admin.list_offsets({(topic, q): "latest" for q in range(partitions)})
    ends = {tp.partition: r.offset for tp, r in got.items()}
    want = {q: len(vs) for q, vs in by_partition.items()}
    assert ends == want, f"{topic}: end offsets {ends}, want {want}"
    return by_partition


@pytest.fixture(scope="module")
def env(kafka_cluster: Any) -> Iterator[Env]:
    nodes = getattr(kafka_cluster, "nodes", [])
    process = getattr(nodes[0], "process", None) if len(nodes) == 1 else None
    bootstrap = kafka_cluster.bootstrap_servers
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        broker = Broker(bootstrap, admin, process.pid if process else None)
        try:
            join_topic = _create(broker, "bench-join", JOIN_PARTITIONS)
            by_partition = _fill(broker, join_topic, JOIN_PARTITIONS, JOIN_RECORDS)
            rebalance_topic = _create(broker, "bench-rebalance", REBALANCE_PARTITIONS)
            _fill(broker, rebalance_topic, REBALANCE_PARTITIONS, REBALANCE_RECORDS)
            firsts = {p: vs[0] for p, vs in by_partition.items()}
            e = Env(broker, join_topic, firsts, rebalance_topic)
            # The first group ever creates __consumer_offsets; then a few joins by both clients
            # warm the broker's group coordinator (JIT) for whichever row comes first.
            deadline = time.monotonic() + WARM_UP_S
            while True:
                for join in (_kcore_join, _confluent_join):
                    if join is _confluent_join and confluent is None:
                        continue
                    c, record = join(e, CLASSIC_TIMEOUTS)
                    _check_first(e, record)
                    c.close()
                if time.monotonic() > deadline:
                    break
            yield e
        finally:
            broker.delete_all()


# ---------------------------------------------------------------------------------------------
# Rounds: setup, the timed part and the checks, with pytest-benchmark's pedantic mode


@dataclass
class Rounds:
    """A round's state is made by ``start`` (pytest-benchmark's setup), used by ``timed``,
    then checked and released by ``finish`` (its teardown), or only released by ``release``
    when the round itself failed. Measured by the producer benchmark's RoundMeters."""

    broker: Broker
    benchmark: Any
    start: Callable[[], Any]
    timed_part: Callable[[Any], None]
    check: Callable[[Any], None]
    release: Callable[[Any], None]
    pending: Any = None
    meters: RoundMeters = field(init=False)

    def __post_init__(self) -> None:
        self.meters = RoundMeters(self.broker)

    def setup(self) -> tuple[tuple[Any], dict[str, Any]]:
        self.finish()  # pytest-benchmark --benchmark-disable calls no teardown
        state = self.pending = self.start()
        self.meters.start()
        return (state,), {}

    def timed(self, state: Any) -> None:
        self.meters.timed(self.timed_part, state)

    def teardown(self, state: Any) -> None:
        self.meters.stop()
        self.finish()

    def finish(self) -> None:
        state, self.pending = self.pending, None
        if state is None:
            return
        try:
            self.check(state)
        finally:
            self.release(state)

    def run(self, rounds: int) -> None:
        try:
            self.benchmark.pedantic(
                self.timed, setup=self.setup, teardown=self.teardown, rounds=rounds, iterations=1
            )
        except BaseException:
            state, self.pending = self.pending, None  # the round's own error: no checks
            if state is not None:
                self.release(state)
            raise
        self.finish()  # after pytest-benchmark --benchmark-disable's single call
        self.benchmark.extra_info.update(self.meters.extra_info())


# ---------------------------------------------------------------------------------------------
# 1. Joining a group: from the consumer's construction to its first record


def _kcore_join(e: Env, extra: dict[str, Any]) -> tuple[Any, Any]:
    """The timed part: a new consumer in a new group, polled until it returns records; returns
    the consumer and its first record as (partition, offset, value)."""
    deadline = time.monotonic() + TIMEOUT_S
    c = kcore.Consumer(
        {
            "bootstrap.servers": e.broker.bootstrap,
            "group.id": _group_id("join"),
            "auto.offset.reset": "earliest",
            **extra,
        }
    )
    c.subscribe([e.join_topic])
    while not (records := c.poll(JOIN_POLL_S)):
        if time.monotonic() > deadline:
            c.close()
            raise TimeoutError(f"kcore: no record within {TIMEOUT_S:g}s of joining")
    r = records[0]
    assert r.topic == e.join_topic, r
    return c, (r.partition, r.offset, r.value)


def _confluent_join(e: Env, extra: dict[str, Any]) -> tuple[Any, Any]:
    deadline = time.monotonic() + TIMEOUT_S
    c = confluent.Consumer(
        {
            "bootstrap.servers": e.broker.bootstrap,
            "group.id": _group_id("join"),
            "auto.offset.reset": "earliest",
            **extra,
        }
    )
    c.subscribe([e.join_topic])
    while True:
        m = c.poll(JOIN_POLL_S)
        if m is not None:
            if m.error() is not None:
                c.close()
                raise AssertionError(f"confluent-kafka: {m.error()}")
            break
        if time.monotonic() > deadline:
            c.close()
            raise TimeoutError(f"confluent-kafka: no record within {TIMEOUT_S:g}s of joining")
    assert m.topic() == e.join_topic
    return c, (m.partition(), m.offset(), m.value())


def _check_first(e: Env, record: tuple[int, int, bytes]) -> None:
    partition, offset, value = record
    assert offset == 0, f"first record at offset {offset} of partition {partition}, want 0"
    assert value == e.first_values[partition], f"partition {partition}: wrong value {value!r}"


@dataclass
class JoinRound:
    consumer: Any = None
    record: tuple[int, int, bytes] | None = None


def _run_join(
    benchmark: Any, e: Env, join: Callable[[Env, dict[str, Any]], tuple[Any, Any]], extra: dict
) -> None:
    c, record = join(e, extra)  # priming (imports, the coordinator's code paths), untimed
    _check_first(e, record)
    c.close()

    def timed(state: JoinRound) -> None:
        state.consumer, state.record = join(e, extra)

    def check(state: JoinRound) -> None:
        assert state.record is not None, "the round did not finish"
        _check_first(e, state.record)

    def release(state: JoinRound) -> None:
        if state.consumer is not None:
            state.consumer.close()

    Rounds(e.broker, benchmark, JoinRound, timed, check, release).run(JOIN_ROUNDS)


KIP848 = {"group.protocol": "consumer"}


@JOIN
def test_kcore_join_classic(benchmark: Any, env: Env) -> None:
    _bench_info(
        benchmark,
        "kcore.join.classic",
        "kcore Consumer + subscribe + poll to the first record (classic)",
        "kcore",
        counterpart="confluent.join.classic",
    )
    _run_join(benchmark, env, _kcore_join, CLASSIC_TIMEOUTS)


@JOIN
def test_kcore_join_consumer_protocol(benchmark: Any, env: Env) -> None:
    _bench_info(
        benchmark,
        "kcore.join.consumer",
        "kcore Consumer + subscribe + poll to the first record (group.protocol=consumer)",
        "kcore",
        counterpart="confluent.join.consumer",
    )
    _run_join(benchmark, env, _kcore_join, KIP848)


@JOIN
def test_confluent_join_classic(benchmark: Any, env: Env) -> None:
    _need(confluent, "confluent-kafka")
    _bench_info(
        benchmark,
        "confluent.join.classic",
        "confluent-kafka Consumer + subscribe + poll to the first message (classic)",
        "confluent-kafka",
    )
    _run_join(benchmark, env, _confluent_join, CLASSIC_TIMEOUTS)


@JOIN
def test_confluent_join_consumer_protocol(benchmark: Any, env: Env) -> None:
    _need(confluent, "confluent-kafka")
    _bench_info(
        benchmark,
        "confluent.join.consumer",
        "confluent-kafka Consumer + subscribe + poll to the first message "
        "(group.protocol=consumer)",
        "confluent-kafka (group.protocol=consumer)",
    )
    _run_join(benchmark, env, _confluent_join, KIP848)


# ---------------------------------------------------------------------------------------------
# 2. A third member joins two that are consuming: until the group is balanced again


class Board:
    """What each member holds, as its listeners report it; waited on by the timed part."""

    def __init__(self, partitions: int) -> None:
        self.cv = threading.Condition()
        self.partitions = frozenset(range(partitions))
        self.owned: dict[int, frozenset[int]] = {}
        self.covered_at: float | None = None  # the brief's condition first held (perf_counter)

    def update(self, who: int, parts: set[int]) -> None:
        with self.cv:
            self.owned[who] = frozenset(parts)
            if self.covered_at is None and self.covered(MEMBERS):
                self.covered_at = time.perf_counter()
            self.cv.notify_all()

    def covered(self, members: int) -> bool:
        """``members`` members all hold partitions, disjoint, covering the topic."""
        held = [p for p in self.owned.values() if p]
        return (
            len(held) == members
            and sum(map(len, held)) == len(self.partitions)
            and frozenset().union(*held) == self.partitions
        )

    def balanced(self, members: int) -> bool:
        """Covered, and every member holds partitions / members of them."""
        share = len(self.partitions) // members
        return self.covered(members) and all(len(p) == share for p in self.owned.values())


class Member(threading.Thread):
    """One group member: subscribes when told to, then polls in a loop in this thread,
    keeping what it read and reporting what its listeners say it holds."""

    def __init__(self, client: Client, topic: str, group: str, board: Board, who: int) -> None:
        super().__init__(daemon=True, name=f"bench-member-{who}")
        self.client = client
        self.topic = topic
        self.board = board
        self.who = who
        self.consumer = client.make(group)
        self.go = threading.Event()
        self.stop_flag = threading.Event()
        self.held: set[int] = set()
        self.read: set[tuple[int, int]] = set()
        self.errors: list[Any] = []

    def assigned(self, partitions: list[Any]) -> None:
        self.held |= {tp.partition for tp in partitions}
        self.board.update(self.who, self.held)

    def revoked(self, partitions: list[Any]) -> None:
        self.held -= {tp.partition for tp in partitions}
        self.board.update(self.who, self.held)

    def run(self) -> None:
        try:
            self.go.wait()
            if self.stop_flag.is_set():
                return
            self.client.subscribe(self)
            while not self.stop_flag.is_set():
                self.read.update(self.client.poll(self))
        except BaseException as exc:  # reported by the round's checks
            self.errors.append(exc)
            with self.board.cv:
                self.board.cv.notify_all()

    def stop(self) -> None:
        self.stop_flag.set()
        self.go.set()
        self.join(TIMEOUT_S)
        assert not self.is_alive(), f"member {self.who} did not stop"


@dataclass
class Client:
    """How a member drives one client (kcore or confluent-kafka) with one configuration."""

    name: str
    bootstrap: str
    extra: dict[str, Any]

    def config(self, group: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            **self.extra,
        }

    def make(self, group: str) -> Any:
        raise NotImplementedError

    def subscribe(self, m: Member) -> None:
        raise NotImplementedError

    def poll(self, m: Member) -> list[tuple[int, int]]:
        raise NotImplementedError

    def assignment(self, m: Member) -> set[int]:
        raise NotImplementedError


class KcoreClient(Client):
    def make(self, group: str) -> Any:
        return kcore.Consumer(self.config(group))  # bootstraps

    def subscribe(self, m: Member) -> None:
        m.consumer.subscribe(
            [m.topic], on_assign=m.assigned, on_revoke=m.revoked, on_lost=m.revoked
        )

    def poll(self, m: Member) -> list[tuple[int, int]]:
        return [(r.partition, r.offset) for r in m.consumer.poll(MEMBER_POLL_S)]

    def assignment(self, m: Member) -> set[int]:
        return {tp.partition for tp in m.consumer.assignment()}


class ConfluentClient(Client):
    def make(self, group: str) -> Any:
        c = confluent.Consumer(self.config(group))
        c.list_topics(timeout=TIMEOUT_S)  # connected, as kcore's constructor is
        return c

    def subscribe(self, m: Member) -> None:
        m.consumer.subscribe(
            [m.topic],
            on_assign=lambda _c, ps: m.assigned(ps),
            on_revoke=lambda _c, ps: m.revoked(ps),
            on_lost=lambda _c, ps: m.revoked(ps),
        )

    def poll(self, m: Member) -> list[tuple[int, int]]:
        msg = m.consumer.poll(MEMBER_POLL_S)
        if msg is None:
            return []
        if msg.error() is not None:
            m.errors.append(msg.error())
            return []
        return [(msg.partition(), msg.offset())]

    def assignment(self, m: Member) -> set[int]:
        return {tp.partition for tp in m.consumer.assignment()}


@dataclass
class RebalanceRound:
    board: Board
    members: list[Member]
    t0: float = 0.0
    settled_s: float | None = None
    covered_s: float | None = None


def _wait(board: Board, members: list[Member], cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    with board.cv:
        while not cond():
            for m in members:
                if m.errors:
                    raise AssertionError(f"member {m.who}: {m.errors[0]!r}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what}: not within {TIMEOUT_S:g}s; held {board.owned}")
            board.cv.wait(min(left, 0.5))


def _close_all(members: list[Member]) -> None:
    """Stop the members' threads, then close their consumers side by side (each leaves the
    group; kcore's close can take a second, see docs/benchmarks-groups.md)."""
    for m in members:
        m.stop_flag.set()
        m.go.set()
    for m in members:
        m.join(TIMEOUT_S)
    with ThreadPoolExecutor(len(members)) as pool:
        list(pool.map(lambda m: m.consumer.close(), members))


def _run_rebalance(benchmark: Any, e: Env, client: Client) -> None:
    topic = e.rebalance_topic
    covered: list[float] = []

    def start() -> RebalanceRound:
        board = Board(REBALANCE_PARTITIONS)
        group = _group_id("rebalance")
        members: list[Member] = []
        try:
            members.extend(Member(client, topic, group, board, i) for i in range(MEMBERS))
            for m in members:
                m.start()
            for m in members[:2]:  # the first two, then wait for them to split the topic
                m.go.set()

            def ready() -> bool:
                read = members[0].read | members[1].read
                return board.balanced(2) and len(read) >= REBALANCE_RECORDS

            _wait(board, members, ready, "two members to split the topic and read it")
        except BaseException:
            _close_all(members)
            raise
        return RebalanceRound(board, members)

    def timed(state: RebalanceRound) -> None:
        board = state.board
        state.t0 = time.perf_counter()
        state.members[2].go.set()  # its thread subscribes, then polls
        _wait(board, state.members, lambda: board.balanced(MEMBERS), "the rebalance")
        state.settled_s = time.perf_counter() - state.t0

    def check(state: RebalanceRound) -> None:
        assert state.settled_s is not None, "the round did not finish"
        board, members = state.board, state.members
        for m in members:
            m.stop()
        for m in members:
            assert not m.errors, f"member {m.who}: {m.errors[:3]!r}"
            actual = client.assignment(m)
            assert actual == m.held, (
                f"member {m.who}: assignment() {sorted(actual)}, listeners say {sorted(m.held)}"
            )
        assert board.balanced(MEMBERS), board.owned
        read = set().union(*(m.read for m in members))
        assert len(read) == REBALANCE_RECORDS, f"{len(read)} records read, {REBALANCE_RECORDS}"
        assert board.covered_at is not None
        covered.append(board.covered_at - state.t0)

    Rounds(e.broker, benchmark, start, timed, check, lambda state: _close_all(state.members)).run(
        REBALANCE_ROUNDS
    )
    benchmark.extra_info["covered_s_rounds"] = covered


def _rebalance_test(
    benchmark: Any, env: Env, kind: str, key: str, label: str, impl: str, extra: dict
) -> None:
    if kind == "confluent":
        _need(confluent, "confluent-kafka")
        client: Client = ConfluentClient(kind, env.broker.bootstrap, extra)
        more = {}
    else:
        client = KcoreClient(kind, env.broker.bootstrap, extra)
        more = {"counterpart": key.replace("kcore.", "confluent.", 1)}
    _bench_info(benchmark, key, label, impl, protocol_settings=extra, **more)
    _run_rebalance(benchmark, env, client)


COOPERATIVE = {**CLASSIC_TIMEOUTS, "partition.assignment.strategy": "cooperative-sticky"}


@REBALANCE
def test_kcore_rebalance_default(benchmark: Any, env: Env) -> None:
    _rebalance_test(
        benchmark,
        env,
        "kcore",
        "kcore.rebalance.default",
        "kcore, 3rd member joins (default assignors: eager range)",
        "kcore",
        CLASSIC_TIMEOUTS,
    )


@REBALANCE
def test_kcore_rebalance_cooperative(benchmark: Any, env: Env) -> None:
    _rebalance_test(
        benchmark,
        env,
        "kcore",
        "kcore.rebalance.cooperative-sticky",
        "kcore, 3rd member joins (cooperative-sticky)",
        "kcore",
        COOPERATIVE,
    )


@REBALANCE
def test_kcore_rebalance_consumer_protocol(benchmark: Any, env: Env) -> None:
    _rebalance_test(
        benchmark,
        env,
        "kcore",
        "kcore.rebalance.consumer",
        "kcore, 3rd member joins (group.protocol=consumer)",
        "kcore",
        KIP848,
    )


@REBALANCE
def test_confluent_rebalance_default(benchmark: Any, env: Env) -> None:
    _rebalance_test(
        benchmark,
        env,
        "confluent",
        "confluent.rebalance.default",
        "confluent-kafka, 3rd member joins (default assignors: eager range)",
        "confluent-kafka",
        CLASSIC_TIMEOUTS,
    )


@REBALANCE
def test_confluent_rebalance_cooperative(benchmark: Any, env: Env) -> None:
    _rebalance_test(
        benchmark,
        env,
        "confluent",
        "confluent.rebalance.cooperative-sticky",
        "confluent-kafka, 3rd member joins (cooperative-sticky)",
        "confluent-kafka (cooperative-sticky)",
        COOPERATIVE,
    )


@REBALANCE
def test_confluent_rebalance_consumer_protocol(benchmark: Any, env: Env) -> None:
    _rebalance_test(
        benchmark,
        env,
        "confluent",
        "confluent.rebalance.consumer",
        "confluent-kafka, 3rd member joins (group.protocol=consumer)",
        "confluent-kafka (group.protocol=consumer)",
        KIP848,
    )


# ---------------------------------------------------------------------------------------------
# 3. Transactions of 1,000 records


@dataclass
class TxnEnv:
    broker: Broker
    values: list[bytes]


@pytest.fixture(scope="module")
def txn_env(env: Env) -> TxnEnv:
    """The 1,000 values, and the broker's transaction path warmed up: the first transactional
    id creates __transaction_state; then both clients take turns running transactions of
    1,000 records for TXN_WARM_UP_S in all, and the broker idles for a second."""
    values = make_values(TXN_RECORDS, seed=7)
    assert {len(v) for v in values} == {VALUE_SIZE}
    topic = _create(env.broker, "bench-txn-warm-up", TXN_PARTITIONS)
    k = kcore.Producer(_txn_config(env.broker, "kcore"))
    c = confluent.Producer(_txn_config(env.broker, "confluent")) if confluent else None
    try:
        k.init_transactions(TIMEOUT_S)
        if c is not None:
            c.init_transactions(TIMEOUT_S)
        deadline = time.monotonic() + TXN_WARM_UP_S
        while True:
            for _ in range(20):
                k.begin_transaction()
                k.send_batch(topic, values)
                k.commit_transaction(TIMEOUT_S)
            for _ in range(20 if c is not None else 0):
                c.begin_transaction()
                for v in values:
                    c.produce(topic, v)
                c.commit_transaction(TIMEOUT_S)
            if time.monotonic() > deadline:
                break
    finally:
        k.close()
    time.sleep(1.0)
    return TxnEnv(env.broker, values)


def _txn_config(broker: Broker, client: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": broker.bootstrap,
        "transactional.id": f"bench-txn-{client}-{uuid.uuid4().hex[:10]}",
        "linger.ms": LINGER_MS,
        "batch.size": BATCH_SIZE,
    }


def _count_committed(broker: Broker, topic: str) -> int:
    """The records a read_committed consumer reads from the whole topic."""
    got = broker.admin.list_offsets({(topic, p): "latest" for p in range(TXN_PARTITIONS)})
    ends = {p.partition: r.offset for p, r in got.items()}
    c = kcore.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        c.assign([(topic, p) for p in range(TXN_PARTITIONS)])
        c.seek_to_beginning()
        n = 0
        deadline = time.monotonic() + TIMEOUT_S
        while any(c.position((topic, p)) < end for p, end in ends.items()):
            n += len(c.poll(0.5, max_records=100_000))
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: not read to its end offsets {ends}")
        return n
    finally:
        c.close()


@dataclass
class TxnCounter:
    committed: int = 0


def _run_txn(
    benchmark: Any, t: TxnEnv, one_txn: Callable[[str], None], close: Callable[[], None]
) -> None:
    topic = _create(t.broker, "bench-txn", TXN_PARTITIONS)
    counter = TxnCounter()
    try:
        for _ in range(TXN_PRIME):
            one_txn(topic)
        counter.committed += TXN_PRIME

        def timed(state: TxnCounter) -> None:
            for _ in range(TXN_N):
                one_txn(topic)
            state.committed += TXN_N

        Rounds(t.broker, benchmark, lambda: counter, timed, lambda s: None, lambda s: None).run(
            TXN_ROUNDS
        )
    finally:
        close()
    n = _count_committed(t.broker, topic)
    want = counter.committed * TXN_RECORDS
    assert n == want, f"{topic}: {n} committed records read, want {want}"
    benchmark.extra_info["transactions_committed"] = counter.committed


def _txn_info(benchmark: Any, key: str, label: str, impl: str) -> None:
    items = TXN_N * TXN_RECORDS
    _bench_info(
        benchmark,
        key,
        label,
        impl,
        items=items,
        payload_bytes=items * VALUE_SIZE,
        transactions=TXN_N,
    )


@TXN
def test_kcore_txn_send(benchmark: Any, txn_env: TxnEnv) -> None:
    _txn_info(
        benchmark,
        "kcore.txn.send",
        f"kcore {TXN_N} x (begin, {TXN_RECORDS:,} send, commit)",
        "kcore",
    )
    p = kcore.Producer(_txn_config(txn_env.broker, "kcore"))
    p.init_transactions(TIMEOUT_S)
    values = txn_env.values

    def one_txn(topic: str) -> None:
        p.begin_transaction()
        send = p.send
        for v in values:
            send(topic, v)
        p.commit_transaction(TIMEOUT_S)

    _run_txn(benchmark, txn_env, one_txn, p.close)


@TXN
def test_kcore_txn_send_batch(benchmark: Any, txn_env: TxnEnv) -> None:
    _txn_info(
        benchmark,
        "kcore.txn.send_batch",
        f"kcore {TXN_N} x (begin, send_batch of {TXN_RECORDS:,}, commit)",
        "kcore",
    )
    p = kcore.Producer(_txn_config(txn_env.broker, "kcore"))
    p.init_transactions(TIMEOUT_S)
    values = txn_env.values
    results: list[Any] = []

    def one_txn(topic: str) -> None:
        p.begin_transaction()
        results.append(p.send_batch(topic, values))
        p.commit_transaction(TIMEOUT_S)

    _run_txn(benchmark, txn_env, one_txn, p.close)
    for r in results:  # committed, so every result is complete
        out = r.result(0)
        assert sum(count for _, _, count in out) == TXN_RECORDS, out


@TXN
def test_confluent_txn_produce(benchmark: Any, txn_env: TxnEnv) -> None:
    _need(confluent, "confluent-kafka")
    _txn_info(
        benchmark,
        "confluent.txn.produce",
        f"confluent-kafka {TXN_N} x (begin, {TXN_RECORDS:,} produce, commit)",
        "confluent-kafka",
    )
    p = confluent.Producer(_txn_config(txn_env.broker, "confluent"))
    p.init_transactions(TIMEOUT_S)
    values = txn_env.values

    def one_txn(topic: str) -> None:
        p.begin_transaction()
        produce = p.produce
        for v in values:
            produce(topic, v)
        p.commit_transaction(TIMEOUT_S)  # flushes first

    _run_txn(benchmark, txn_env, one_txn, lambda: p.flush(TIMEOUT_S))
