"""``spark.read.format("kcore")``: the driver resolves the start and end offsets of every
partition with an admin client and cuts them into input partitions; each executor task reads
its range (:mod:`.range_reader`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from kcore.errors import KcoreError

from .offsets import OffsetRange, split_ranges
from .options import ReadOptions, check_schema, parse_read_options
from .range_reader import KafkaInputPartition, arrow_schema, read_range
from .resolver import OffsetResolver

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KafkaBatchReader", "plan_batch"]


def plan_batch(resolver: OffsetResolver, opts: ReadOptions) -> list[OffsetRange]:
    """The offset ranges of a batch read, split for ``minPartitions`` and
    ``maxRecordsPerPartition``."""
    start = resolver.resolve(opts.starting, is_starting=True)
    end = resolver.resolve(opts.ending, is_starting=False)
    if set(start) != set(end):  # partitions added or removed between the two lookups
        raise KcoreError(
            "different topic partitions for the starting offsets "
            f"({sorted(start)}) and the ending offsets ({sorted(end)}); try again"
        )
    ranges = []
    for tp in sorted(start):
        if end[tp] < start[tp]:
            raise KcoreError(
                f"{tp.topic}-{tp.partition}: the starting offset {start[tp]} "
                f"({opts.starting.option}) is after the ending offset {end[tp]} "
                f"({opts.ending.option})"
            )
        ranges.append(OffsetRange(tp.topic, tp.partition, start[tp], end[tp]))
    return split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)


class KafkaBatchReader(DataSourceReader):
    """Options are checked when the reader is made (Spark reports the error at ``load()``'s
    planning); brokers are asked only in :meth:`partitions`."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.opts = parse_read_options(options, streaming=False)
        check_schema(schema, options)
        self.schema = schema
        self._arrow: pa.Schema | None = None

    def partitions(self) -> list[InputPartition]:
        with OffsetResolver(self.opts) as resolver:
            ranges = plan_batch(resolver, self.opts)
        return [KafkaInputPartition.of(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, KafkaInputPartition):
            return iter(())  # Spark's placeholder when there is nothing to read
        if self._arrow is None:
            self._arrow = arrow_schema(self.schema)
        return read_range(partition, self.opts, self._arrow)
