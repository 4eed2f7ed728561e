"""What an executor does with one input partition: fetch the offsets ``[start, end)`` of one
Kafka partition with a kcore consumer and yield them as Arrow record batches typed as Spark
wants them (no row-by-row conversion anywhere).

The consumer has no ``auto.offset.reset``: an offset that is gone shows up as an error
(``OffsetOutOfRangeError``), which is then judged against the partition's available offsets, as
the JVM source judges an ``OffsetOutOfRangeException``: data loss (fail or warn and skip, per
``failOnDataLoss``) or a broker catching up (try again).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from kcore.admin.client import AdminClient
from kcore.admin.types import TopicPartition
from kcore.consumer.client import Consumer
from kcore.errors import (
    KcoreError,
    KcoreTimeoutError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)

from .clients import get_consumer
from .offsets import OffsetRange
from .options import ReadOptions
from .resolver import report_data_loss

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KafkaInputPartition", "arrow_schema", "read_range"]

POLL_WAIT_S = 0.5  # one poll's wait: short, so that a stall is noticed and judged
STALL_CHECK_S = 2.0  # no progress for this long: ask the broker what the partition holds
OUT_OF_RANGE_RETRIES = 3


@dataclass
class KafkaInputPartition(InputPartition):
    """One Spark task's share: offsets ``[start, end)`` of ``topic``-``partition``."""

    topic: str
    partition: int
    start: int
    end: int

    @classmethod
    def of(cls, rng: OffsetRange) -> KafkaInputPartition:
        return cls(rng.topic, rng.partition, rng.start, rng.end)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks a data source's batches against (its worker derives it
    the same way: UTC microsecond timestamps, ``element`` list items)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _to_spark(rb: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """The codec's batch as Spark's: headers dropped unless asked for, millisecond timestamps
    cast to microseconds, the headers list's item renamed. Whole columns, no copies per row."""
    return rb.select(target.names).cast(target)


def _position(consumer: Consumer, tp: TopicPartition) -> int | None:
    """The consumer's position, or None while it has none (after an offset went out of range)."""
    try:
        return consumer.position(tp, timeout=0)
    except KcoreError:
        return None


class _Judge:
    """Decides, from the partition's available offsets, what a failed or stalled read means.
    Its admin client is made only when needed (the common read never needs it)."""

    def __init__(self, opts: ReadOptions, tp: TopicPartition, end: int) -> None:
        self.opts = opts
        self.tp = tp
        self.end = end
        self.name = f"{tp.topic}-{tp.partition}"
        self._admin: AdminClient | None = None
        self._retries = 0

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()

    def _available(self) -> tuple[int, int]:
        if self._admin is None:
            self._admin = AdminClient(self.opts.admin_config())
        level = self.opts.isolation_level
        earliest = self._admin.list_offsets({self.tp: "earliest"}, isolation_level=level)
        latest = self._admin.list_offsets({self.tp: "latest"}, isolation_level=level)
        return earliest[self.tp].offset, latest[self.tp].offset

    def out_of_range(self, pos: int) -> int | None:
        """Where to go on after ``pos`` went out of range; None: nothing left to read."""
        earliest, latest = self._available()
        fail = self.opts.fail_on_data_loss
        if pos >= latest or earliest >= self.end:
            report_data_loss(
                f"Cannot fetch offset {pos} of {self.name} (available: [{earliest}, {latest})); "
                f"records in [{pos}, {self.end}) are skipped",
                fail,
            )
            return None
        if pos >= earliest:
            # The offset is there after all (e.g. a new leader catching up): ask again.
            self._retries += 1
            if self._retries > OUT_OF_RANGE_RETRIES:
                raise KcoreError(
                    f"offset {pos} of {self.name} keeps being out of range although the "
                    f"partition holds [{earliest}, {latest})"
                )
            time.sleep(0.1 * self._retries)
            return pos
        report_data_loss(
            f"Cannot fetch offsets [{pos}, {earliest}) of {self.name}: they are no longer in Kafka",
            fail,
        )
        return earliest

    def stalled(self, pos: int, waited_s: float) -> int | None:
        """Nothing arrives at ``pos``: go on waiting (``pos``), stop (None, the rest is gone) or
        time out after ``kafkaConsumer.pollTimeoutMs``."""
        earliest, latest = self._available()
        if pos < earliest or pos >= latest:
            return self.out_of_range(pos)
        if waited_s * 1000 >= self.opts.poll_timeout_ms:
            raise KcoreTimeoutError(
                f"Cannot fetch record for offset {pos} of {self.name} in "
                f"{self.opts.poll_timeout_ms} milliseconds"
            )
        return pos


def read_range(
    part: KafkaInputPartition, opts: ReadOptions, target: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The records of ``part`` as Arrow batches of schema ``target``, trimmed to its end."""
    if part.end <= part.start:
        return
    tp = TopicPartition(part.topic, part.partition)
    judge = _Judge(opts, tp, part.end)
    # A consumer of the executor's pool: its connections and metadata outlive the task.
    with get_consumer(opts.consumer_config()) as consumer:
        try:
            yield from _read(consumer, tp, part, judge, target)
        finally:
            judge.close()


def _read(
    consumer: Consumer,
    tp: TopicPartition,
    part: KafkaInputPartition,
    judge: _Judge,
    target: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """The read stops at the consumer's position, not at a record: the last offsets of a range
    may be transaction markers or compacted away."""
    import numpy as np

    consumer.assign([tp])
    consumer.seek(tp, part.start)
    pos = part.start
    progress_at = checked_at = time.monotonic()
    while pos < part.end:
        rb: Any
        out_of_range = False
        try:
            rb = consumer.poll_arrow(POLL_WAIT_S, max_records=part.end - pos)
        except (OffsetOutOfRangeError, NoOffsetForPartitionError):
            rb, out_of_range = None, True  # no auto.offset.reset: judged below
        now = time.monotonic()
        if rb is not None and rb.num_rows:
            offsets = rb.column("offset").to_numpy()
            n = int(np.searchsorted(offsets, part.end))
            if n:
                yield _to_spark(rb if n == rb.num_rows else rb.slice(0, n), target)
            pos = max(pos, int(offsets[-1]) + 1)
            progress_at = now
        moved = _position(consumer, tp)  # past markers and compacted-away offsets too
        if moved is not None and moved > pos:
            pos, progress_at = moved, now
        if pos >= part.end or (rb is not None and rb.num_rows):
            continue
        if out_of_range or moved is None:
            next_pos = judge.out_of_range(pos)
        elif now - progress_at >= STALL_CHECK_S and now - checked_at >= STALL_CHECK_S:
            checked_at = now
            next_pos = judge.stalled(pos, now - progress_at)
        else:
            continue
        if next_pos is None:
            return
        if next_pos != pos or out_of_range or moved is None:
            consumer.seek(tp, next_pos)
            pos = next_pos
