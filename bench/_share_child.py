"""One round of bench/test_share_bench.py in a process of its own: ``members`` share consumers
of one client (threads of this process, or processes of their own) read a topic as a fresh
share group until ``records`` records were accepted, and the round's figures are printed as
one JSON line.

Usage: ``python bench/_share_child.py '<json spec>'`` with keys ``client`` (``kcore`` or
``confluent``), ``bootstrap``, ``topic``, ``group``, ``records``, ``members``, ``spread``
(``threads`` or ``processes``), ``ack`` (``explicit`` or ``implicit``), ``config`` (extra
consumer settings, the same for every client) and, for kcore, ``api`` (``arrow``: ``poll_arrow``
and ``acknowledge_batch`` instead of ``poll`` and ``acknowledge``).

The timed part runs from the moment every member exists (created, not yet subscribed) to the
one at which the last member's acknowledgements of the N-th record were answered by the broker
(``commit_sync``): joining the group, the fetches and the acknowledgements are inside it;
creating and closing the consumers are not. ``after_first_s`` is the same end measured from
the first poll (of any member) that returned records: the round without the join. A record
counts once accepted: in explicit mode when ``acknowledge(record, ACCEPT)`` was called for
it, in implicit mode when the poll after the one that returned it (or the final
``commit_sync``) accepts it. In implicit mode the members stop polling once together they
received N records, and each one's ``commit_sync`` accepts its last poll's: one more poll
would wait its whole timeout for records that are not coming.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import threading
import time
from typing import Any

TIMEOUT_S = 240.0
# Short, for every client: a member whose partitions ran dry waits in poll while the others
# finish, and only notices the round is over when its poll returns. At 0.5 s that idle wait
# was up to 0.5 s of a several-member round (~25% of a 2-member round, for both clients).
POLL_TIMEOUT_S = float(os.environ.get("KCORE_BENCH_SHARE_POLL_TIMEOUT", "0.05"))


class Count:
    """A count the members add to: a multiprocessing Value when they are processes (``shared``),
    else an int under a lock."""

    def __init__(self, shared: Any = None) -> None:
        self.shared = shared
        self.local = 0
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        if self.shared is not None:
            with self.shared.get_lock():
                self.shared.value += n
        else:
            with self.lock:
                self.local += n

    @property
    def value(self) -> int:
        return int(self.shared.value) if self.shared is not None else self.local


class Tally:
    """Records accepted by all members together; the round is over once it reaches N."""

    def __init__(
        self,
        target: int,
        shared: Any = None,
        first_shared: Any = None,
        received_shared: Any = None,
    ) -> None:
        self.target = target
        self.accepted = Count(shared)
        self.received = Count(received_shared)  # records the members' polls returned
        self.first_shared = first_shared  # (processes) when the first member got records
        self.first_local = 0.0
        self.lock = threading.Lock()

    def got_records(self) -> None:
        """A member's poll returned records: the first such moment of the round is kept
        (perf_counter is the system's monotonic clock, the same in every process)."""
        now = time.perf_counter()
        if self.first_shared is not None:
            with self.first_shared.get_lock():
                if not self.first_shared.value:
                    self.first_shared.value = now
        else:
            with self.lock:
                if not self.first_local:
                    self.first_local = now

    @property
    def first(self) -> float:
        return float(self.first_shared.value) if self.first_shared is not None else self.first_local

    def add(self, n: int) -> None:
        self.accepted.add(n)

    @property
    def total(self) -> int:
        return self.accepted.value

    def done(self) -> bool:
        return self.total >= self.target

    def add_received(self, n: int) -> None:
        self.received.add(n)

    def all_received(self) -> bool:
        """Whether the members' polls returned N records between them."""
        return self.received.value >= self.target


def _open(spec: dict[str, Any]) -> Any:
    config = {
        "bootstrap.servers": spec["bootstrap"],
        "group.id": spec["group"],
        "share.acknowledgement.mode": spec["ack"],
        **spec["config"],
    }
    if spec["client"] == "kcore":
        import kcore

        if spec.get("api") == "arrow":
            # Imported before the timed part, as the clients themselves are: pyarrow's import
            # (and pyarrow.compute's, on the first batch acknowledged) costs ~0.15 s of CPU
            # once per process, and every round is a new process.
            import pyarrow
            import pyarrow.compute  # noqa: F401

            pyarrow.array([0]).unique()
        return kcore.ShareConsumer(config)
    import confluent_kafka

    return confluent_kafka.ShareConsumer(config)


def _member(spec: dict[str, Any], consumer: Any, tally: Tally, start: Any) -> None:
    """Poll until the group has accepted N records, acknowledging as ``spec["ack"]`` says."""
    explicit = spec["ack"] == "explicit"
    kcore_client = spec["client"] == "kcore"
    arrow = spec.get("api") == "arrow"  # kcore: poll_arrow, acknowledge_batch
    start.wait()
    deadline = time.monotonic() + TIMEOUT_S
    consumer.subscribe([spec["topic"]])
    owed = 0  # implicit mode: records of the last poll, accepted by the next poll or commit
    seen = False  # whether a poll of this member returned records yet
    while not tally.done() and (explicit or not tally.all_received()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{tally.total} of {tally.target} records after {TIMEOUT_S:g}s")
        if arrow:
            batch = consumer.poll_arrow(POLL_TIMEOUT_S)
            if owed:
                tally.add(owed)  # this poll accepted them
                owed = 0
            got = batch.num_rows
            if got and not seen:
                seen = True
                tally.got_records()
            if explicit and got:
                consumer.acknowledge_batch(batch)
                tally.add(got)
            elif not explicit:
                owed = got
                tally.add_received(got)
            continue
        records = consumer.poll(POLL_TIMEOUT_S)
        if owed:
            tally.add(owed)  # this poll accepted them
            owed = 0
        if kcore_client:
            got = len(records)
        else:
            got = 0
            for m in records:
                if m.error() is None:
                    got += 1
                elif explicit:
                    raise RuntimeError(f"confluent-kafka: {m.error()}")
        if got and not seen:
            seen = True
            tally.got_records()
        if explicit:
            ack = consumer.acknowledge
            for record in records:
                ack(record)
            if got:
                tally.add(got)
        else:
            owed = got
            tally.add_received(got)
    results = consumer.commit_sync()
    for tp, error in (results or {}).items():
        if error is not None:
            raise RuntimeError(f"acknowledgement of {tp} failed: {error}")
    if owed:
        tally.add(owed)


def _threads(spec: dict[str, Any]) -> dict[str, Any]:
    tally = Tally(spec["records"])
    consumers = [_open(spec) for _ in range(spec["members"])]
    start = threading.Event()
    errors: list[BaseException] = []

    def run(consumer: Any) -> None:
        try:
            _member(spec, consumer, tally, start)
        except BaseException as e:  # noqa: BLE001 - reported by the round
            errors.append(e)
            tally.add(spec["records"])  # stop the others

    threads = [threading.Thread(target=run, args=(c,)) for c in consumers]
    for t in threads:
        t.start()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    start.set()
    for t in threads:
        t.join()
    end = time.perf_counter()
    cpu = time.process_time() - cpu0
    for c in consumers:
        c.close()
    if errors:
        raise errors[0]
    return {
        "wall_s": end - t0,
        "after_first_s": end - tally.first,
        "cpu_s": cpu,
        "records": tally.total,
    }


def _process_member(
    spec: dict[str, Any],
    shared: Any,
    first: Any,
    received: Any,
    ready: Any,
    start: Any,
    out: Any,
) -> None:
    consumer = _open(spec)
    tally = Tally(spec["records"], shared, first, received)
    ready.put(True)
    try:
        cpu0 = time.process_time()
        _member(spec, consumer, tally, start)
        out.put(("ok", time.process_time() - cpu0))
    except BaseException as e:  # noqa: BLE001 - reported by the round
        tally.add(spec["records"])
        out.put(("error", repr(e)))
    finally:
        consumer.close()


def _processes(spec: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")  # no client state (threads, sockets) shared by a fork
    shared, first, received = ctx.Value("q", 0), ctx.Value("d", 0.0), ctx.Value("q", 0)
    ready, out, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_process_member, args=(spec, shared, first, received, ready, start, out))
        for _ in range(spec["members"])
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    t0 = time.perf_counter()
    start.set()
    results = [out.get(timeout=TIMEOUT_S + 30) for _ in procs]
    end = time.perf_counter()
    for p in procs:
        p.join(60)
    failed = [r for kind, r in results if kind == "error"]
    if failed:
        raise RuntimeError(f"member failed: {failed[0]}")
    return {
        "wall_s": end - t0,
        "after_first_s": end - float(first.value),
        "cpu_s": sum(r for _, r in results),
        "records": int(shared.value),
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    got = _processes(spec) if spec["spread"] == "processes" else _threads(spec)
    print(json.dumps(got))


if __name__ == "__main__":
    main()
