"""The floor of a producer cell: what the broker takes to write a cell's records when the
client does nothing at all. Not a client: the record batches and the Produce requests are all
built before the clock starts (untimed), and the timed part only writes the ready frames on one
connection, ``max.in.flight`` of them out at a time, and reads the answers. So its wall time is
the broker's (and the loopback's) for those records, and the best client's time over it is the
most any client could gain on that cell, in that run, on that broker.

It batches as a client with the cell's settings would at its best: batches filled to
``batch.size`` (measured in built bytes, so compressed batches hold as many records as fit
compressed), unkeyed records a batch per partition in turn (sticky partitioning), keyed records
on their murmur2 partition; each request holds at most one batch a partition (the broker takes
one a partition) and at most ``max.request.size`` bytes, as Java's sender drains. With
idempotence it asks for a producer id and numbers the batches; ``acks`` is the cell's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from kcore.codec import RecordBatchBuilder, partition_for_key
from kcore.errors import ErrorCode
from kcore.network.blocking import BlockingBrokerConnection
from kcore.protocol import ApiKey
from kcore.protocol.messages import InitProducerIdRequest, ProduceRequest
from kcore.protocol.messages.produce_request import PartitionProduceData, TopicProduceData

MAX_REQUEST_SIZE = 1_048_576  # Java's max.request.size default, which every client here keeps
MAX_IN_FLIGHT = 5  # Java's max.in.flight.requests.per.connection default
BATCH_OVERHEAD = 61  # a record batch's header

Keys = list[bytes] | None


def init_producer_id(conn: BlockingBrokerConnection) -> tuple[int, int]:
    """An idempotent producer id and epoch from the broker behind ``conn``."""
    deadline = time.monotonic() + 30
    while True:  # a young broker answers COORDINATOR_LOAD_IN_PROGRESS for a while
        got = conn.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1))
        if got.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            break
        if time.monotonic() > deadline:
            raise AssertionError("InitProducerId: the coordinator never finished loading")
        time.sleep(0.1)
    assert got.error_code == ErrorCode.NONE, got
    return got.producer_id, got.producer_epoch


class ProduceFloor:
    def __init__(self, bootstrap: str, settings: dict[str, Any], timeout_s: float) -> None:
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        self.timeout_s = timeout_s
        self.conn = BlockingBrokerConnection(host, int(port), timeout=timeout_s).open()
        # Produce v13 names topics by id; v12 by name, which saves a metadata lookup here.
        self.version = self.conn.version_for(ApiKey.PRODUCE, max_version=12)
        self.batch_size = int(settings.get("batch.size", 16384))
        self.codec = str(settings.get("compression.type", "none"))
        acks = str(settings.get("acks", "all"))
        # (acks=0 gets no answers to wait for: no cell uses it)
        assert acks in ("all", "-1", "1"), f"the floor does not do acks={acks}"
        self.acks = 1 if acks == "1" else -1
        self.producer = (-1, -1)
        if settings.get("enable.idempotence", False):
            self.producer = init_producer_id(self.conn)
        self.sequences: dict[int, int] = {}
        self.frames: list[tuple[int, bytearray]] = []

    def close(self) -> None:
        self.conn.close()

    def _trial_size(self, keys: Keys, values: list[bytes], start: int, stop: int, now: int) -> int:
        trial = RecordBatchBuilder(self.codec)
        trial.append_many(None if keys is None else keys[start:stop], values[start:stop], now)
        return len(trial.build())

    def _chunks(self, keys: Keys, values: list[bytes], now: int) -> list[tuple[int, int]]:
        """``values`` cut into runs, each the most records whose built batch stays within
        batch.size (at least one), found by trial builds: the next trial is estimated from the
        bytes a record took in the last one, then narrowed between what fit and what did not."""
        out = []
        start, n = 0, len(values)
        while start < n:
            fits, too_many = 1, n - start + 1  # counts known to fit / not to fit
            count = 1
            while True:
                size = self._trial_size(keys, values, start, start + count, now)
                if size <= self.batch_size:
                    fits = max(fits, count)
                elif count > 1:
                    too_many = min(too_many, count)
                if too_many - fits <= 1:
                    break
                per_record = max(1.0, (size - BATCH_OVERHEAD) / count)
                guess = int((self.batch_size - BATCH_OVERHEAD) / per_record)
                count = min(max(guess, fits + 1), too_many - 1)  # strictly between the two
                if size <= self.batch_size and count == fits + 1 and guess <= fits:
                    count = (fits + too_many) // 2  # the estimate stalls: halve the gap
            out.append((start, start + fits))
            start += fits
        return out

    def _build(
        self, partition: int, keys: Keys, values: list[bytes], start: int, stop: int, now: int
    ) -> bytes:
        sequence = -1
        if self.producer[0] >= 0:
            sequence = self.sequences.get(partition, 0)
            self.sequences[partition] = sequence + stop - start
        builder = RecordBatchBuilder(
            self.codec,
            producer_id=self.producer[0],
            producer_epoch=self.producer[1],
            base_sequence=sequence,
        )
        builder.append_many(None if keys is None else keys[start:stop], values[start:stop], now)
        return builder.build()

    def prepare(self, topic: str, partitions: int, values: list[bytes], keys: Keys) -> None:
        """Build the batches and requests for ``values`` (untimed)."""
        now = int(time.time() * 1000)
        queues: dict[int, deque[bytes]] = {}
        if keys is None:
            # Sticky: a batch's worth of records to a partition, the next to the next one.
            for number, (start, stop) in enumerate(self._chunks(None, values, now)):
                partition = number % partitions
                batch = self._build(partition, None, values, start, stop, now)
                queues.setdefault(partition, deque()).append(batch)
        else:
            by_partition: dict[int, tuple[list[bytes], list[bytes]]] = {}
            for key, value in zip(keys, values, strict=True):
                ks, vs = by_partition.setdefault(partition_for_key(key, partitions), ([], []))
                ks.append(key)
                vs.append(value)
            for partition, (ks, vs) in sorted(by_partition.items()):
                queues[partition] = deque(
                    self._build(partition, ks, vs, start, stop, now)
                    for start, stop in self._chunks(ks, vs, now)
                )
        self.frames = []
        for parts in requests_of(queues):
            request = ProduceRequest(
                transactional_id=None,
                acks=self.acks,
                timeout_ms=int(self.timeout_s * 1000),
                topic_data=[TopicProduceData(name=topic, partition_data=parts)],
            )
            self.frames.append(self.conn.prepare(request, self.version))

    def produce(self) -> int:
        """Write the prepared requests, ``MAX_IN_FLIGHT`` out at a time; the requests written."""
        frames, self.frames = self.frames, []
        waiting: deque[int] = deque()
        for correlation_id, frame in frames:
            if len(waiting) == MAX_IN_FLIGHT:
                self._check(waiting.popleft())
            self.conn.send_prepared(frame)
            waiting.append(correlation_id)
        while waiting:
            self._check(waiting.popleft())
        return len(frames)

    def _check(self, correlation_id: int) -> None:
        check_produced(self.conn, correlation_id, self.timeout_s)


def requests_of(queues: dict[int, deque[bytes]]) -> Iterator[list[PartitionProduceData]]:
    """The partition data of each Produce request for ``queues`` (partition -> its built
    batches, in order; their deques are emptied): one batch a partition a request, up to
    max.request.size, as Java's sender drains; partitions a request had no room for go first
    in the next one."""
    while queues:
        size, parts = 0, []
        for partition, queue in queues.items():
            if parts and size + len(queue[0]) > MAX_REQUEST_SIZE:
                break
            records = queue.popleft()
            size += len(records)
            parts.append(PartitionProduceData(index=partition, records=records))
        taken = [p.index for p in parts]  # (in request order: the ones left go last)
        in_request = set(taken)
        left = {p: q for p, q in queues.items() if p not in in_request}
        left.update((p, queues[p]) for p in taken if queues[p])
        queues = left
        yield parts


def check_produced(conn: BlockingBrokerConnection, correlation_id: int, timeout_s: float) -> None:
    """Fails unless every partition of the Produce answer to ``correlation_id`` took its batch
    (no retries: a floor's round fails)."""
    response = conn.receive(correlation_id, timeout_s).body
    for t in response.responses:
        for p in t.partition_responses:
            if p.error_code != ErrorCode.NONE:
                raise AssertionError(f"partition {p.index}: {p.error_code}")
