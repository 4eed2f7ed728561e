"""``spark.readStream.format("kcore")``: micro-batches over offsets kept as the JVM source keeps
them (``{"topic": {"0": 42}}``, the next offset to read per partition), with its admission
control (``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger`` + ``maxTriggerDelay``),
Trigger.AvailableNow, partitions and topics that appear mid-stream (read from their earliest
offset) and data-loss checks.

Spark calls the offset methods in one long-lived driver process (which holds the admin client
between batches) and :meth:`read` on executors, with a pickled copy of the reader.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from kcore.errors import KcoreError

from .admission import delay_batch, rate_limit
from .offsets import OffsetRange, PartitionOffsets, offsets_from_dict, offsets_to_dict, split_ranges
from .options import ReadOptions, check_schema, parse_read_options
from .range_reader import KafkaInputPartition, arrow_schema, read_range
from .resolver import OffsetResolver, report_data_loss

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KafkaStreamReader", "plan_stream_batch"]

log = logging.getLogger("kcore.spark")


def _names(tps: Any) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps))


def plan_stream_batch(
    resolver: OffsetResolver, opts: ReadOptions, start: PartitionOffsets, end: PartitionOffsets
) -> list[OffsetRange]:
    """The ranges of a micro-batch from ``start`` to ``end``: partitions new since ``start``
    begin at their earliest offset; partitions gone, or whose offsets went backwards, are data
    loss (``failOnDataLoss``)."""
    fail = opts.fail_on_data_loss
    new = set(end) - set(start)
    new_start = resolver.earliest(new & resolver.topic_partitions()) if new else {}
    if set(new_start) != new:
        report_data_loss(
            f"Cannot find earliest offsets of {_names(new - set(new_start))}. "
            "Some data may have been missed",
            fail,
        )
    for tp, off in sorted(new_start.items()):
        if off != 0:
            report_data_loss(
                f"Added partition {tp.topic}-{tp.partition} starts from {off} instead of 0. "
                "Some data may have been missed",
                fail,
            )
    gone = set(start) - set(end)
    if gone:
        report_data_loss(f"{_names(gone)} are gone. Some data may have been missed", fail)
    ranges = []
    for tp in sorted(end):
        begin = start.get(tp, new_start.get(tp))
        if begin is None:
            continue
        if end[tp] < begin:
            report_data_loss(
                f"Partition {tp.topic}-{tp.partition}'s offset was changed from {begin} to "
                f"{end[tp]}, some data may have been missed",
                fail,
            )
        ranges.append(OffsetRange(tp.topic, tp.partition, begin, end[tp]))
    return split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.opts = parse_read_options(options, streaming=True)
        check_schema(schema, options)
        self.schema = schema
        self._arrow: pa.Schema | None = None
        # Driver-side state (not needed, and not shipped, on executors).
        self._resolver: OffsetResolver | None = None
        self._latest: PartitionOffsets = {}
        self._available_now = False
        self._target: PartitionOffsets | None = None  # Trigger.AvailableNow's end
        self._last_trigger_ms = 0
        self._initial: PartitionOffsets | None = None  # what initialOffset() returned
        self._group_offsets: PartitionOffsets = {}  # last committed to commitOffsetsToGroup
        self._group_failure: str | None = None  # why the last commit failed, if it did

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_resolver"] = None  # a live client: the executors never need it
        return state

    @property
    def resolver(self) -> OffsetResolver:
        if self._resolver is None:
            self._resolver = OffsetResolver(self.opts)
        return self._resolver

    # -- offsets (driver) -------------------------------------------------------------------

    def initialOffset(self) -> dict:
        starting = self.resolver.resolve(self.opts.starting, is_starting=True)
        self._initial = starting
        return offsets_to_dict(starting)

    def getDefaultReadLimit(self) -> ReadLimit:
        # Spark's Python API has no composite limit: with both options set, the reader applies
        # minOffsetsPerTrigger itself whenever Spark passes the default limit back.
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offsets_from_dict(start)
        # Spark asks for the next batch from where the last one ended only once that batch is
        # in its commit log, but calls commit() for it only when it plans another batch: an
        # idle query (or Trigger.AvailableNow's last batch) would never report its last
        # batch. So ``start`` is committed too, unless it is the query's initial offset
        # (no batch has completed yet).
        if begin != self._initial:
            self._commit_to_group(begin)
        if self._available_now:
            if self._target is None:  # what exists now is all this query will read
                self._target = self.resolver.fetch_latest(begin)
            latest = self._target
        else:
            latest = self.resolver.fetch_latest(begin)
        self._latest = latest
        return offsets_to_dict(self._admit(begin, latest, limit))

    def _admit(
        self, begin: PartitionOffsets, latest: PartitionOffsets, limit: ReadLimit
    ) -> PartitionOffsets:
        if isinstance(limit, ReadAllAvailable):
            return latest
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else None
        max_rows = max_rows if max_rows is not None else self.opts.max_offsets_per_trigger
        min_rows = min_rows if min_rows is not None else self.opts.min_offsets_per_trigger
        # Trigger.AvailableNow must end: it does not wait for a minimum to build up.
        if min_rows is not None and not self._available_now:
            now_ms = int(time.time() * 1000)
            skip, self._last_trigger_ms = delay_batch(
                min_rows,
                latest,
                begin,
                self.opts.max_trigger_delay_ms,
                self._last_trigger_ms,
                now_ms,
            )
            if skip:
                return begin
        if max_rows is None:
            return latest
        new = set(latest) - set(begin)
        new_start = self.resolver.earliest(new) if new else {}
        return rate_limit(max_rows, begin, latest, new_start)

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_dict(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        ranges = plan_stream_batch(
            self.resolver, self.opts, offsets_from_dict(start), offsets_from_dict(end)
        )
        return [KafkaInputPartition.of(r) for r in ranges]

    def commit(self, end: dict) -> None:
        """Spark has recorded every batch up to ``end`` as done. The query's offsets live in
        its checkpoint; with ``commitOffsetsToGroup`` they are also committed to the group."""
        self._commit_to_group(offsets_from_dict(end))

    def _commit_to_group(self, done: PartitionOffsets) -> None:
        """Commit ``done`` (the end of batches Spark has recorded as complete) to the
        ``commitOffsetsToGroup`` group. A failure (the group has active members, the broker
        refuses) is a warning: the group is a report for lag tools, the query goes on."""
        group = self.opts.commit_offsets_to_group
        if group is None or not done or done == self._group_offsets:
            return
        # Tried once per offsets, whatever the outcome: an idle query asks for the next batch
        # every few milliseconds, and would otherwise retry (and warn) as often.
        self._group_offsets = done
        try:
            self.resolver.commit_group_offsets(group, done)
        except KcoreError as exc:
            # The same failure again (the group still has members) is logged at debug level.
            said, self._group_failure = self._group_failure, str(exc)
            log.log(
                logging.DEBUG if said == str(exc) else logging.WARNING,
                "commitOffsetsToGroup: could not commit the query's offsets to group %r (the "
                "query goes on; its progress is in its checkpoint): %s",
                group,
                exc,
            )
            return
        self._group_failure = None

    def stop(self) -> None:
        if self._resolver is not None:
            self._resolver.close()
            self._resolver = None

    # -- data (executors) -------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, KafkaInputPartition):
            return iter(())
        if self._arrow is None:
            self._arrow = arrow_schema(self.schema)
        return read_range(partition, self.opts, self._arrow)
