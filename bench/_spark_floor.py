"""Floors for bench/test_spark_bench.py: a Python data source with no Kafka client at all
(registered as ``format("kcore-bench-floor")``), so a round of it is what Spark alone costs a
Python source or sink.

* Write: it takes the same Arrow batches a ``format("kcore")`` write task gets and drops them
  (what Spark costs to make the rows and hand them to a Python worker).
* Write on the wire (``format("kcore-bench-wire")``): not a client either, but the least a
  Python sink does to get the rows into Kafka: each Arrow batch's rows put on their murmur2
  partitions and built into record batches of ``batch_size`` by kcore's compiled encoder (the
  same batches kcore's sink makes: a batch or more a partition an Arrow batch), a Produce
  request of one batch a partition (up to 1 MiB) written on one blocking connection, 5 out at
  a time, with acks=all and an idempotent producer id, as the sinks' defaults. No network
  thread, no accumulator, no futures, no retries: a round of it is Spark, the encoding, the
  socket and the broker, and kcore's sink over it is what its producer costs besides.
* Stream read: it is a streaming source of Kafka's schema whose micro-batches are planned as
  kcore's (``rows`` in all, ``maxOffsetsPerTrigger`` a batch, split into ``partitions`` input
  partitions) and whose tasks yield Arrow batches of ``batch_rows`` rows from memory, each
  with the key and value sizes given (what Spark costs to plan a Python stream's batches, run
  its tasks and take its Arrow batches in; no fetching, no decoding).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from _produce_floor import MAX_IN_FLIGHT, check_produced, init_producer_id, requests_of
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

# Kafka's source schema, as format("kcore") and format("kafka") give it.
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)


TIMEOUT_S = 120.0  # the wire floor's connection and answers


@dataclass
class RowsSeen(WriterCommitMessage):
    rows: int


class DroppingWriter(DataSourceArrowWriter):
    def __init__(self, rows: int) -> None:
        self.rows = rows  # what the job must hand over in all (option ``rows``)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RowsSeen:
        # Dropped unread: what a round costs is Spark making the rows and handing them over.
        return RowsSeen(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[Any]) -> None:
        seen = sum(m.rows for m in messages if m is not None)
        if seen != self.rows:
            raise RuntimeError(f"the floor's tasks were handed {seen} rows, not {self.rows}")

    def abort(self, messages: list[Any]) -> None:
        pass


class WireWriter(DataSourceArrowWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]
        self.partitions = int(options["partitions"])
        self.batch_size = int(options["batch_size"])
        self.rows = int(options["rows"])

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RowsSeen:
        from kcore.codec import RecordBatchBuilder, partitions_for_keys
        from kcore.network.blocking import BlockingBrokerConnection
        from kcore.protocol import ApiKey
        from kcore.protocol.messages import ProduceRequest
        from kcore.protocol.messages.produce_request import TopicProduceData

        host, port = self.bootstrap.split(",")[0].rsplit(":", 1)
        conn = BlockingBrokerConnection(host, int(port), timeout=TIMEOUT_S).open()
        try:
            version = conn.version_for(ApiKey.PRODUCE, max_version=12)  # topics by name
            producer_id, epoch = init_producer_id(conn)
            sequences = [0] * self.partitions
            waiting: deque[int] = deque()
            seen = 0
            for batch in iterator:
                n = batch.num_rows
                seen += n
                now = int(time.time() * 1000)
                keys, values = batch.column("key"), batch.column("value")
                parts = np.frombuffer(partitions_for_keys(keys, self.partitions), np.int32)
                order = np.argsort(parts.astype(np.uint16), kind="stable")
                keys, values, parts = keys.take(order), values.take(order), parts[order]
                starts = [0, *(np.flatnonzero(np.diff(parts)) + 1).tolist()]
                queues: dict[int, deque[bytes]] = {}
                for a, b in zip(starts, [*starts[1:], n], strict=True):
                    p, built = int(parts[a]), deque()
                    while a < b:
                        builder = RecordBatchBuilder(
                            "none",
                            producer_id=producer_id,
                            producer_epoch=epoch,
                            base_sequence=sequences[p],
                        )
                        taken = builder.append_many(keys, values, now, None, a, b, self.batch_size)
                        sequences[p] = (sequences[p] + taken) & 0x7FFFFFFF
                        built.append(builder.build())
                        a += taken
                    queues[p] = built
                for data in requests_of(queues):
                    request = ProduceRequest(
                        transactional_id=None,
                        acks=-1,
                        timeout_ms=30_000,
                        topic_data=[TopicProduceData(name=self.topic, partition_data=data)],
                    )
                    if len(waiting) == MAX_IN_FLIGHT:
                        check_produced(conn, waiting.popleft(), TIMEOUT_S)
                    correlation_id, frame = conn.prepare(request, version)
                    conn.send_prepared(frame)
                    waiting.append(correlation_id)
            while waiting:
                check_produced(conn, waiting.popleft(), TIMEOUT_S)
        finally:
            conn.close()
        return RowsSeen(seen)

    def commit(self, messages: list[Any]) -> None:
        seen = sum(m.rows for m in messages if m is not None)
        if seen != self.rows:
            raise RuntimeError(f"the wire floor's tasks wrote {seen} rows, not {self.rows}")

    def abort(self, messages: list[Any]) -> None:
        pass


@dataclass
class RowRange(InputPartition):
    partition: int
    start: int
    end: int


# Per Python worker, by (rows, key size, value size): the batch a stream task's batches are
# cut from (made once, reused).
_templates: dict[tuple[int, int, int], pa.RecordBatch] = {}


def _template_batch(rows: int, key_size: int, value_size: int) -> pa.RecordBatch:
    template = _templates.get((rows, key_size, value_size))
    if template is None:
        import numpy as np

        def binary(size: int) -> pa.Array:
            data = np.random.default_rng(rows).integers(0, 256, rows * size, dtype=np.uint8)
            offsets = np.arange(0, (rows + 1) * size, size, dtype=np.int32)
            return pa.Array.from_buffers(
                pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
            )

        now_us = 1_700_000_000_000_000
        template = _templates[rows, key_size, value_size] = pa.RecordBatch.from_arrays(
            [
                binary(key_size),
                binary(value_size),
                pa.array(["floor"] * rows, pa.string()),
                pa.array(np.zeros(rows, dtype=np.int32)),
                pa.array(np.arange(rows, dtype=np.int64)),
                pa.array(np.full(rows, now_us, dtype=np.int64)).cast(pa.timestamp("us", "UTC")),
                pa.array(np.zeros(rows, dtype=np.int32)),
            ],
            names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"],
        )
    return template


class FloorStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        # (Spark's options: case-insensitive keys)
        self.rows = int(options["rows"])
        self.per_trigger = int(options["maxOffsetsPerTrigger"])
        self.partitions_ = int(options.get("partitions", "8"))
        self.batch_rows = int(options.get("batch_rows", "8192"))
        self.key_size = int(options.get("key_size", "16"))
        self.value_size = int(options.get("value_size", "100"))

    def initialOffset(self) -> dict:
        return {"rows": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.per_trigger)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else self.rows
        return {"rows": min(self.rows, start["rows"] + most)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        first, last, n = start["rows"], end["rows"], self.partitions_
        bounds = [first + (last - first) * i // n for i in range(n + 1)]
        return [RowRange(i, bounds[i], bounds[i + 1]) for i in range(n)]

    def commit(self, end: dict) -> None:
        pass

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RowRange)
        template = _template_batch(self.batch_rows, self.key_size, self.value_size)
        at = partition.start
        while at < partition.end:
            n = min(self.batch_rows, partition.end - at)
            yield template.slice(0, n)
            at += n


class FloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kcore-bench-floor"

    def schema(self) -> str:
        return KAFKA_SCHEMA

    def writer(self, schema: Any, overwrite: bool) -> DroppingWriter:
        return DroppingWriter(int(self.options["rows"]))

    def streamReader(self, schema: Any) -> FloorStreamReader:
        return FloorStreamReader(self.options)


class WireFloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kcore-bench-wire"

    def schema(self) -> str:
        return KAFKA_SCHEMA

    def writer(self, schema: Any, overwrite: bool) -> WireWriter:
        return WireWriter(self.options)
