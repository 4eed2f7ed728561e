"""Soak run: mixed work against three real brokers while one of them is hit by a fault every
minute or so, for 20 minutes (not part of CI; the table it prints goes in docs/soak.md).

Work, all kcore, in this one process (whose memory is sampled every minute):

* an idempotent acks=all producer writing numbered records to ``soak-in`` (6 partitions,
  replication 3, min.insync.replicas 2) at a steady rate;
* a consumer group of two members reading ``soak-in``, committing each batch after it is
  processed;
* a consume-transform-produce application (its own group, read_committed, a transactional
  producer writing ``soak-out`` and committing its input offsets in the transaction).

Faults, in turn, each on a node picked at random: SIGKILL and restart after 15 s; a network
partition (the node's link down) for 15 s; a leader move (every partition's preferred
replica rotated, then a preferred election); a 2 Mbit/s throttle for 20 s.

At the end: records sent, acknowledged, read by the group, lost (acknowledged but never read:
must be 0), read twice (allowed only for records a member processed after its last
successful commit, counted apart), and the transactional output (read_committed: every input
record exactly once). ``--json`` writes everything measured.

    python bench/soak.py --minutes 20 --json soak.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import kcore
from kcore.admin import NewTopic
from kcore.errors import KcoreError, TransactionStateError
from kcore.testing import KafkaCluster

PARTITIONS = 6
SOURCE, SINK = "soak-in", "soak-out"
log = logging.getLogger("soak")


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rss_after_trim_mib() -> float:
    """RSS once glibc has handed back the free memory it keeps (malloc_trim): what live
    objects and buffers take. Without it, RSS also counts freed memory that the allocator's
    per-thread arenas keep for reuse, which creeps up for a long while in a process whose
    threads allocate and free at different rates."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        return float("nan")
    return rss_mib()


def counts(n: int) -> np.ndarray:
    """A count per record number, its pages written now so it adds nothing to RSS later."""
    a = np.empty(n, dtype=np.uint8)
    a.fill(0)
    return a


class Producer(threading.Thread):
    def __init__(self, bootstrap: str, rate: int, capacity: int) -> None:
        super().__init__(name="producer", daemon=True)
        self.producer = kcore.Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
             "linger.ms": 5, "request.timeout.ms": 10000}
        )  # fmt: skip
        self.rate, self.capacity = rate, capacity
        self.sent = 0
        self.refused = 0  # send() raised: the record was never accepted
        self.acked = counts(capacity)
        self.failures: list[str] = []
        self.stopping = threading.Event()

    def on_delivery(self, err: Any, metadata: Any, seq: int) -> None:
        if err is None:
            self.acked[seq] += 1
        else:
            self.failures.append(f"{seq}: {err!r}")

    def run(self) -> None:
        per_tick = max(1, self.rate // 100)
        next_tick = time.monotonic()
        while not self.stopping.is_set() and self.sent + per_tick < self.capacity:
            for _ in range(per_tick):
                seq = self.sent
                try:
                    self.producer.send(
                        SOURCE, b"%d" % seq, key=b"k%d" % (seq % 997),
                        on_delivery=lambda e, m, s=seq: self.on_delivery(e, m, s),
                    )  # fmt: skip
                except KcoreError as exc:
                    self.refused += 1
                    log.warning("send refused: %r", exc)
                    continue
                self.sent += 1
            next_tick += 0.01
            time.sleep(max(0.0, next_tick - time.monotonic()))

    def finish(self) -> None:
        self.stopping.set()
        self.join()
        self.producer.flush(300)
        self.producer.close()


class GroupMember(threading.Thread):
    """Reads SOURCE in group ``soak-readers``; commits each processed batch."""

    def __init__(self, bootstrap: str, name: str, read: np.ndarray) -> None:
        super().__init__(name=name, daemon=True)
        self.consumer = kcore.Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "soak-readers",
             "enable.auto.commit": False, "auto.offset.reset": "earliest",
             "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000}
        )  # fmt: skip
        self.read = read
        self.errors = 0
        self.commit_failures = 0
        self.uncommitted = 0  # records processed whose commit failed: may be read again
        self.stopping = threading.Event()

    def run(self) -> None:
        self.consumer.subscribe([SOURCE])
        while not self.stopping.is_set():
            try:
                records = self.consumer.poll(0.5)
            except KcoreError as exc:
                self.errors += 1
                log.info("%s: poll: %r", self.name, exc)
                continue
            if not records:
                continue
            offsets: dict[tuple[str, int], int] = {}
            for r in records:
                self.read[int(r.value)] += 1
                offsets[(r.topic, r.partition)] = r.offset + 1
            try:
                self.consumer.commit(offsets)
            except KcoreError as exc:
                self.commit_failures += 1
                self.uncommitted += len(records)
                log.info("%s: commit: %r", self.name, exc)
        self.consumer.close()


class Transformer(threading.Thread):
    """SOURCE -> SINK exactly once: read_committed group ``soak-eos``, a transactional
    producer committing output and input offsets together."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(name="transformer", daemon=True)
        self.bootstrap = bootstrap
        self.committed = 0
        self.aborted = 0
        self.restarts = 0
        self.restart_reasons: list[str] = []
        self.stopping = threading.Event()

    def _clients(self) -> tuple[kcore.Consumer, kcore.Producer]:
        consumer = kcore.Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": "soak-eos",
             "enable.auto.commit": False, "auto.offset.reset": "earliest",
             "isolation.level": "read_committed", "session.timeout.ms": 10000,
             "heartbeat.interval.ms": 1000}
        )  # fmt: skip
        producer = kcore.Producer(
            {"bootstrap.servers": self.bootstrap, "transactional.id": "soak-eos",
             "linger.ms": 5, "transaction.timeout.ms": 30000, "request.timeout.ms": 10000}
        )  # fmt: skip
        producer.init_transactions()
        consumer.subscribe([SOURCE])
        return consumer, producer

    def run(self) -> None:
        consumer, producer = self._clients()
        while not self.stopping.is_set():
            try:
                records = consumer.poll(0.5, max_records=2000)
                if not records:
                    continue
                producer.begin_transaction()
                for r in records:
                    producer.send(SINK, r.value + b"!", key=r.key)
                offsets = {tp: consumer.position(tp) for tp in consumer.assignment()}
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                producer.commit_transaction()
                self.committed += 1
            except KcoreError as exc:
                # An abortable failure: abort, and read again from what the group committed.
                # A fatal one (fenced, INVALID_TXN_STATE, ...: the abort fails too): new
                # clients, as an application does; the new producer's init_transactions ends
                # whatever the old one left open.
                if not self._abort(consumer, producer, exc):
                    log.warning("transformer: %r; new clients", exc)
                    self.restarts += 1
                    self.restart_reasons.append(repr(exc)[:300])
                    for closing in (producer, consumer):
                        try:
                            closing.close()
                        except KcoreError:
                            pass
                    consumer, producer = self._clients()
        producer.close()
        consumer.close()

    def _abort(self, consumer: kcore.Consumer, producer: kcore.Producer, exc: Exception) -> bool:
        """Abort and rewind; False when that fails too (the producer failed for good)."""
        if isinstance(exc, TransactionStateError) and not exc.abortable:
            return False
        log.info("transformer: abort after %r", exc)
        try:
            producer.abort_transaction()
            for tp, offset in consumer.committed(consumer.assignment()).items():
                consumer.seek(tp, offset or 0)
        except KcoreError as again:
            log.info("transformer: abort/rewind failed too: %r", again)
            return False
        self.aborted += 1
        return True


class Faults(threading.Thread):
    KINDS = ("kill", "partition", "leader move", "throttle")

    def __init__(self, cluster: KafkaCluster, every: float, seed: int) -> None:
        super().__init__(name="faults", daemon=True)
        self.cluster, self.every = cluster, every
        self.rng = random.Random(seed)
        self.done: list[dict[str, Any]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        n = 0
        while True:
            if self.stopping.wait(self.every):
                return
            kind = self.KINDS[n % len(self.KINDS)]
            n += 1
            node = self.rng.choice(self.cluster.node_ids)
            start = time.monotonic()
            try:
                getattr(self, "_" + kind.replace(" ", "_"))(node)
                outcome = "ok"
            except Exception as exc:  # noqa: BLE001 - recorded; the run goes on
                outcome = repr(exc)
            self.done.append(
                {"at": time.strftime("%H:%M:%S"), "kind": kind, "node": node,
                 "seconds": round(time.monotonic() - start, 1), "outcome": outcome}
            )  # fmt: skip
            log.warning("fault %s on node %d: %s", kind, node, outcome)

    def _kill(self, node: int) -> None:
        self.cluster.kill_broker(node)
        self.stopping.wait(15)
        self.cluster.start_broker(node)

    def _partition(self, node: int) -> None:
        with self.cluster.partition(node):
            self.stopping.wait(15)

    def _throttle(self, node: int) -> None:
        with self.cluster.throttle(node, rate="2mbit"):
            self.stopping.wait(20)

    def _leader_move(self, node: int) -> None:
        with kcore.AdminClient({"bootstrap.servers": self.cluster.bootstrap_servers}) as admin:
            moves = {}
            for topic in (SOURCE, SINK):
                for p in admin.describe_topics([topic])[topic].partitions:
                    replicas = list(p.replicas)
                    shift = self.rng.randrange(1, len(replicas))
                    moves[(topic, p.partition)] = replicas[shift:] + replicas[:shift]
            admin.alter_partition_reassignments(moves)
            admin.elect_leaders(list(moves))


def wait_until(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True


def read_sink(bootstrap: str, capacity: int) -> np.ndarray:
    out = counts(capacity)
    with kcore.Consumer(
        {"bootstrap.servers": bootstrap, "isolation.level": "read_committed",
         "auto.offset.reset": "earliest"}
    ) as consumer:  # fmt: skip
        tps = [(SINK, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        quiet = time.monotonic()
        while time.monotonic() - quiet < 5:
            records = consumer.poll(0.5)
            if records:
                quiet = time.monotonic()
            for r in records:
                out[int(r.value[:-1])] += 1
            if all(consumer.position(tp) >= ends[tp] for tp in ends):
                break
    return out


def markdown(result: dict[str, Any]) -> str:
    """The tables for docs/soak.md."""
    rows = [
        ("records sent (accepted by send)", result["sent"]),
        ("refused by send", result["send_refused"]),
        ("acknowledged", result["acked"]),
        ("delivery failures", result["delivery_failures"]),
        ("acknowledged twice", result["acked_twice"]),
        ("read by the group (distinct)", result["group_read_distinct"]),
        ("**lost** (acknowledged, never read)", result["group_lost"]),
        ("read twice", result["group_read_twice"]),
        ("processed, then their commit failed (may be read again)",
         result["group_uncommitted_windows"]),
        ("group commit failures / poll errors",
         f"{result['group_commit_failures']} / {result['group_poll_errors']}"),
        ("transactional output, distinct (read_committed)", result["eos_output_distinct"]),
        ("**missing** from the output", result["eos_output_missing"]),
        ("**twice** in the output", result["eos_output_twice"]),
        ("transactions committed / aborted / client restarts",
         f"{result['eos_transactions']} / {result['eos_aborts']} / {result['eos_restarts']}"),
    ]  # fmt: skip
    out = ["| | |", "|---|---:|"] + [f"| {k} | {v:,} |" if isinstance(v, int) else
                                      f"| {k} | {v} |" for k, v in rows]  # fmt: skip
    out += ["", "| minute | RSS MiB | after malloc_trim | sent | acknowledged | read by the group "
            "| transactions (aborted, restarts) |",
            "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    out += [
        f"| {s['minute']} | {s['rss_mib']} | {s.get('rss_trimmed_mib', '')} | {s['sent']:,} | "
        f"{s['acked']:,} | {s['read']:,} | "
        f"{s['transactions']:,} ({s.get('aborts', 0)}, {s.get('restarts', 0)}) |"
        for s in result["samples"]
    ]
    out += ["", "| at | fault | node | seconds | outcome |", "|---|---|---:|---:|---|"]
    out += [
        f"| {f['at']} | {f['kind']} | {f['node']} | {f['seconds']} | {f['outcome']} |"
        for f in result["faults"]
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--fault-every", type=float, default=60, help="seconds between faults")
    ap.add_argument("--rate", type=int, default=2000, help="records per second produced")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--markdown", help="write the tables for docs/soak.md here")
    ap.add_argument("--from-json", help="only render --markdown from an earlier run's --json")
    args = ap.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            rendered = markdown(json.load(f))
        if args.markdown:
            with open(args.markdown, "w") as out:
                out.write(rendered)
        else:
            print(rendered)
        return 0
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    seconds = args.minutes * 60
    capacity = int(args.rate * (seconds + 120) * 1.2)
    samples: list[dict[str, Any]] = []
    with KafkaCluster(3, isolated_network=True) as cluster:
        bootstrap = cluster.bootstrap_servers
        with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topics(
                [NewTopic(t, PARTITIONS, 3, config={"min.insync.replicas": "2"})
                 for t in (SOURCE, SINK)]
            )  # fmt: skip
        read = counts(capacity)
        producer = Producer(bootstrap, args.rate, capacity)
        members = [GroupMember(bootstrap, f"member-{i}", read) for i in (1, 2)]
        transformer = Transformer(bootstrap)
        faults = Faults(cluster, args.fault_every, args.seed)
        workers = [producer, *members, transformer, faults]
        begin = time.monotonic()
        for w in workers:
            w.start()

        def sample(final: bool = False) -> None:
            minute: float | str = round((time.monotonic() - begin) / 60, 1)
            if final:  # after the drain: the end phase's own clients are open too
                minute = f"end ({minute})"
            rss = rss_mib()
            samples.append(
                {"minute": minute, "rss_mib": round(rss, 1),
                 "rss_trimmed_mib": round(rss_after_trim_mib(), 1),
                 "sent": producer.sent, "acked": int(producer.acked.sum()),
                 "read": int(np.count_nonzero(read)), "transactions": transformer.committed,
                 "aborts": transformer.aborted, "restarts": transformer.restarts}
            )  # fmt: skip
            print(json.dumps(samples[-1]), file=sys.stderr, flush=True)

        sample()
        while time.monotonic() - begin < seconds:
            time.sleep(min(60.0, seconds - (time.monotonic() - begin)) or 0.1)
            sample()
        faults.stopping.set()
        faults.join()
        cluster.heal()
        for node in cluster.node_ids:
            if not cluster.is_running(node):
                cluster.start_broker(node)
        producer.finish()
        acked = producer.acked
        want = np.flatnonzero(acked)
        wait_until(lambda: bool(np.all(read[want] > 0)), 300)
        for m in members:
            m.stopping.set()
        for m in members:
            m.join(120)
        with kcore.Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-eos"}) as probe:
            tps = [(SOURCE, p) for p in range(PARTITIONS)]
            ends = probe.end_offsets(tps)
            wait_until(
                lambda: all((probe.committed(tps).get(tp) or 0) >= ends[tp] for tp in ends), 300
            )
        transformer.stopping.set()
        transformer.join(120)
        sample(final=True)
        output = read_sink(bootstrap, capacity)

    sent = producer.sent
    lost = int(np.count_nonzero((acked > 0) & (read == 0)))
    twice = int(np.sum(np.maximum(read.astype(np.int64) - 1, 0)))
    result = {
        "minutes": args.minutes,
        "rate": args.rate,
        "sent": sent,
        "send_refused": producer.refused,
        "acked": int(np.count_nonzero(acked)),
        "acked_twice": int(np.count_nonzero(acked > 1)),
        "delivery_failures": len(producer.failures),
        "delivery_failure_examples": producer.failures[:5],
        "group_read_distinct": int(np.count_nonzero(read)),
        "group_lost": lost,
        "group_read_twice": twice,
        "group_uncommitted_windows": sum(m.uncommitted for m in members),
        "group_commit_failures": sum(m.commit_failures for m in members),
        "group_poll_errors": sum(m.errors for m in members),
        "eos_output_distinct": int(np.count_nonzero(output)),
        "eos_output_missing": int(np.count_nonzero((acked > 0) & (output == 0))),
        "eos_output_twice": int(np.count_nonzero(output > 1)),
        "eos_output_unacked": int(np.count_nonzero((output > 0) & (acked == 0))),
        "eos_transactions": transformer.committed,
        "eos_aborts": transformer.aborted,
        "eos_restarts": transformer.restarts,
        "eos_restart_reasons": transformer.restart_reasons,
        "faults": faults.done,
        "samples": samples,
    }
    for key in ("rss_mib", "rss_trimmed_mib"):
        steady = [s[key] for s in samples if isinstance(s["minute"], float) and s["minute"] >= 3]
        if steady:
            growth = round(100 * (max(steady) / steady[0] - 1), 1)
            result[f"{key.removesuffix('_mib')}_growth_after_minute_3_pct"] = growth
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(result))
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples",)}, indent=1))
    ok = (
        lost == 0
        and result["delivery_failures"] == 0
        and result["eos_output_missing"] == 0
        and result["eos_output_twice"] == 0
        and result["acked_twice"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
