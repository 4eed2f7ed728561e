"""What an executor does with one input partition: fetch the offsets ``[start, end)`` of one
Kafka partition with a kcore consumer and yield them as Arrow record batches typed as Spark
wants them (no row-by-row conversion anywhere).

The consumer has no ``auto.offset.reset``: an offset that is gone shows up as an error
(``OffsetOutOfRangeError``), which is then judged against the partition's available offsets, as
the JVM source judges an ``OffsetOutOfRangeException``: data loss (fail or warn and skip, per
``failOnDataLoss``) or a broker catching up (try again). A truncated log (``LogTruncationError``,
after an unclean leader election) is always data loss. A read that stalls at or past the
partition's latest offset is judged only after ``kafkaConsumer.pollTimeoutMs``, as the JVM
consumer polls that long first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from kcore.admin.client import AdminClient
from kcore.consumer.client import Consumer
from kcore.errors import (
    KcoreError,
    KcoreTimeoutError,
    LogTruncationError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)
from kcore.types import TopicPartition

from . import worker_heap
from .clients import get_consumer
from .offsets import OffsetRange
from .options import ReadOptions
from .resolver import report_data_loss

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KafkaInputPartition", "arrow_schema", "read_range"]

POLL_WAIT_S = 0.5  # one poll's wait: short, so that a stall is noticed and judged
STALL_CHECK_S = 2.0  # no progress for this long: ask the broker what the partition holds
OUT_OF_RANGE_RETRIES = 3  # in a row, without progress in between


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
    cast to microseconds, the headers list's item renamed, no headers as null (the JVM source
    never returns an empty list). Whole columns, no copies per row."""
    import pyarrow as pa

    # Only the columns whose type differs are cast (the timestamps): a cast costs ~20 us a call
    # even when it changes nothing, ~0.1 ms a batch for the other six columns.
    columns = [
        column if column.type == field.type else column.cast(field.type)
        for column, field in zip(rb.select(target.names).columns, target, strict=True)
    ]
    if "headers" in target.names:
        i = target.get_field_index("headers")
        columns[i] = null_if_empty(columns[i])
    return pa.RecordBatch.from_arrays(columns, schema=target)


def null_if_empty(lists: pa.ListArray) -> pa.ListArray:
    """``lists`` with each empty list made null: a validity mask over the same values (only the
    offsets are rebuilt, rebased to 0: pyarrow takes no mask with sliced offsets)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = pc.equal(pc.list_value_length(lists), 0)
    if not pc.any(empty).as_py():
        return lists
    mask = pc.or_kleene(empty, lists.is_null())  # (a null list has a null length)
    offsets = lists.offsets
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    return type(lists).from_arrays(
        pc.subtract(offsets, pa.scalar(first, offsets.type)),
        lists.values.slice(first, last - first),
        type=lists.type,
        mask=mask,
    )


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

    def progressed(self) -> None:
        """Records came after an out-of-range error: it was passing, so the retry budget is
        for the next stretch without progress, not for the whole range."""
        self._retries = 0

    def out_of_range(self, pos: int, available: tuple[int, int] | None = None) -> int | None:
        """Where to go on after ``pos`` went out of range; None: nothing left to read.
        ``available``: the partition's ``(earliest, latest)`` if just asked."""
        earliest, latest = available if available is not None else self._available()
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

    def truncated(self, pos: int, error: LogTruncationError) -> int:
        """The log was truncated below ``pos`` (an unclean leader election): records already
        read may be gone, or replaced by others at the same offsets. Always data loss, whatever
        the partition's offsets look like now; without ``failOnDataLoss`` the read goes on from
        ``pos``, the position the consumer kept (offsets no longer there are judged then)."""
        diverged = error.divergent_offsets.get(self.tp)
        where = f"offset {diverged[0]}" if diverged else "an unknown offset"
        report_data_loss(
            f"The log of {self.name} was truncated below offset {pos} (it diverges from what "
            f"was read at {where}; an unclean leader election)",
            self.opts.fail_on_data_loss,
        )
        return pos

    def stalled(self, pos: int, waited_s: float) -> int | None:
        """Nothing has arrived at ``pos`` for ``waited_s``: go on waiting (``pos``), skip ahead
        or stop (None) if the records are gone, or time out after
        ``kafkaConsumer.pollTimeoutMs``. At or past the latest offset, loss is only concluded
        after that timeout, as the JVM consumer polls that long first: a new leader may report
        a lower end offset for a while (KAFKA-7703)."""
        earliest, latest = self._available()
        timed_out = waited_s * 1000 >= self.opts.poll_timeout_ms
        if pos < earliest or (pos >= latest and timed_out):
            return self.out_of_range(pos, (earliest, latest))
        if timed_out:
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
    worker_heap.after_task()


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
    # A short pollTimeoutMs (tests) must still be checked before it has long passed.
    check_every = min(STALL_CHECK_S, judge.opts.poll_timeout_ms / 1000)
    while pos < part.end:
        rb: Any = None
        out_of_range = False
        truncation: LogTruncationError | None = None
        try:
            rb = consumer.poll_arrow(POLL_WAIT_S, max_records=part.end - pos)
        except LogTruncationError as exc:  # before its base class: never a passing state
            truncation = exc
        except (OffsetOutOfRangeError, NoOffsetForPartitionError):
            out_of_range = True  # no auto.offset.reset: judged below
        now = time.monotonic()
        before = pos
        if rb is not None and rb.num_rows:
            offsets = rb.column("offset").to_numpy()
            n = int(np.searchsorted(offsets, part.end))
            if n:
                yield _to_spark(rb if n == rb.num_rows else rb.slice(0, n), target)
            pos = max(pos, int(offsets[-1]) + 1)
        moved = _position(consumer, tp)  # past markers and compacted-away offsets too
        if moved is not None and moved > pos:
            pos = moved
        if pos > before:
            progress_at = now
            judge.progressed()
        if pos >= part.end or (rb is not None and rb.num_rows):
            continue
        if truncation is not None:
            next_pos: int | None = judge.truncated(pos, truncation)
        elif out_of_range or moved is None:
            next_pos = judge.out_of_range(pos)
        elif now - progress_at >= check_every and now - checked_at >= check_every:
            checked_at = now
            next_pos = judge.stalled(pos, now - progress_at)
        else:
            continue
        if next_pos is None:
            return
        # A seek also ends the consumer's error state (it keeps a truncated position until then).
        if next_pos != pos or out_of_range or truncation is not None or moved is None:
            consumer.seek(tp, next_pos)
            pos = next_pos
