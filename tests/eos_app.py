"""A consume-transform-produce application for exactly-once tests: a kcore consumer in a group
and a transactional kcore producer committing its output and the group's input offsets together,
run as a child process (:class:`Processor`), and what the tests check it with (the group's
committed progress, a read_committed read of the output by kcore and by confluent-kafka)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer as ConfluentConsumer

import kcore
from kcore.errors import KcoreError

PROCESSOR = r"""
import json, logging, sys, kcore
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(name)s %(levelname)s %(message)s")
from kcore.errors import KcoreError, TransactionStateError
bootstrap, group, source, sink, txn_id = sys.argv[1:6]
extra = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
consumer = kcore.Consumer({
    "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
    "auto.offset.reset": "earliest", "isolation.level": "read_committed",
    "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
producer = kcore.Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                           "linger.ms": 5, "transaction.timeout.ms": 20000, **extra})
producer.init_transactions()
consumer.subscribe([source])
done = 0
while True:
    records = consumer.poll(0.5, max_records=2000)
    if not records:
        continue
    try:
        producer.begin_transaction()
        for r in records:
            producer.send(sink, r.value + b"!", key=r.key)
        offsets = {tp: consumer.position(tp) for tp in consumer.assignment()}
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        producer.commit_transaction()
        done += len(records)
        print(done, flush=True)
    except TransactionStateError as exc:
        if not exc.abortable:
            raise
        producer.abort_transaction()
        # Go back to what the group committed: the aborted output is invisible.
        for tp, offset in consumer.committed(consumer.assignment()).items():
            consumer.seek(tp, offset or 0)
    except KcoreError as exc:
        print("error", exc, file=sys.stderr, flush=True)
        producer.abort_transaction()
        for tp, offset in consumer.committed(consumer.assignment()).items():
            consumer.seek(tp, offset or 0)
"""


class Processor:
    def __init__(self, args: list[str], log: Path) -> None:
        # The processor's log goes to a file so that a timeout can show what it was doing.
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROCESSOR, *args],
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
        )
        self.done = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip().isdigit():
                self.done = int(line)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._log_file.close()

    def describe(self) -> str:
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        tail = self.log.read_text(errors="replace").splitlines()[-60:]
        return f"processor ({state}, {self.done} done), last lines of its log:\n" + "\n".join(tail)


class GroupProgress:
    """How many input records the group has committed (the sum of its committed offsets: the
    input is written without transactions, so offsets count records)."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        self._consumer = kcore.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        self._partitions = [(topic, p) for p in range(partitions)]
        self._last = 0
        self._checked = 0.0

    def committed(self) -> int:
        if time.monotonic() - self._checked >= 1:  # one OffsetFetch a second is plenty
            self._checked = time.monotonic()
            try:
                offsets = self._consumer.committed(self._partitions, timeout=10)
            except KcoreError:
                return self._last  # the coordinator moving after the broker restart: ask again
            self._last = sum(o or 0 for o in offsets.values())
        return self._last

    def __enter__(self) -> GroupProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._consumer.close()


def wait_for(cond, timeout: float, what: str, *processors: Processor) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            details = "\n".join(p.describe() for p in processors)
            raise AssertionError(f"timed out waiting for {what}\n{details}")
        time.sleep(0.2)


class ReadUntil:
    """When a read of ``n`` committed records is over: once it has ``n`` and a quiet second
    brought nothing more (a duplicate would show as more than ``n``), or after ``timeout``. A
    quiet window alone started before the first fetch, which on a loaded machine right after
    a broker restart (a new group joining, too) could come up empty."""

    def __init__(self, n: int, timeout: float = 120, quiet: float = 3) -> None:
        self.n, self.quiet = n, quiet
        self.deadline = time.monotonic() + timeout
        self.last = time.monotonic()

    def done(self, have: int, got_some: bool) -> bool:
        now = time.monotonic()
        if got_some:
            self.last = now
        return now > self.deadline or (have >= self.n and now - self.last >= self.quiet)


def read_committed_kcore(bootstrap: str, topic: str, partitions: int, n: int) -> list[bytes]:
    values: list[bytes] = []
    cfg = {
        "bootstrap.servers": bootstrap,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
    }
    with kcore.Consumer(cfg) as c:
        c.assign([(topic, p) for p in range(partitions)])
        until = ReadUntil(n)
        recs: list = []
        while not until.done(len(values), bool(recs)):
            recs = c.poll(0.5)
            values += [r.value for r in recs]
    return values


def read_committed_confluent(bootstrap: str, topic: str, n: int) -> list[bytes]:
    c = ConfluentConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    values: list[bytes] = []
    until = ReadUntil(n)
    msgs: list = []
    try:
        while not until.done(len(values), bool(msgs)):
            msgs = c.consume(10_000, 0.5)
            for m in msgs:
                if m.error() is None:
                    values.append(m.value())
    finally:
        c.close()
    return values
