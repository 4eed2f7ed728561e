"""A share consumer's records as one Arrow record batch: the columns of ``Consumer.poll_arrow``
(key, value, topic, partition, offset, timestamp, timestampType, headers, as the codec's
``ColumnarRecords.to_arrow`` makes them) and ``delivery_count``.

While the caller reads Arrow batches, a ShareFetch's acquired records are decoded by the codec
straight into these columns (an :class:`ArrowRun` a partition's answer); records made for
``poll`` are written into them by the codec when a ``poll_arrow`` takes them, and an
``ArrowRun`` a ``poll`` takes becomes records again."""

from __future__ import annotations

from typing import Any

from kcore.codec import ColumnarRecords, ColumnBuffer, record_columns
from kcore.consumer.share.acknowledgements import ArrowRun, Run, ShareRecord
from kcore.errors import KcoreError
from kcore.types import TopicPartition

__all__ = [
    "ARROW_COLUMNS",
    "arrow_run",
    "batch_offsets",
    "pyarrow_module",
    "records_to_arrow",
    "run_records",
    "runs_to_arrow",
]

ARROW_COLUMNS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
    "delivery_count",
)


def pyarrow_module() -> Any:
    """pyarrow, or a KcoreError saying poll_arrow needs it."""
    try:
        import pyarrow as pa
    except ImportError:
        raise KcoreError("poll_arrow() needs pyarrow: pip install pyarrow") from None
    return pa


def records_to_arrow(records: list[ShareRecord]) -> Any:
    """``records`` as a ``pyarrow.RecordBatch`` with :data:`ARROW_COLUMNS` (types as the
    codec's: binary key/value, string topic, int32 partition, int64 offset, UTC millisecond
    timestamp, int32 timestampType, list of {key: string, value: binary} headers; int32
    delivery_count). The columns are filled in the codec, in one pass over the records."""
    pyarrow_module()
    columns, counts = record_columns(records, _DELIVERY_COUNT)
    return columns.to_arrow(counts, "delivery_count")


_DELIVERY_COUNT = ShareRecord._fields.index("delivery_count")


def arrow_run(columns: ColumnarRecords, counts: ColumnBuffer) -> ArrowRun:
    """A partition's acquired records the codec wrote into ``columns`` (``counts``: their
    delivery counts) as an :class:`ArrowRun`."""
    with memoryview(columns.offset) as raw, raw.cast("q") as offsets:
        return ArrowRun(columns.to_arrow(counts, "delivery_count"), offsets.tolist())


def runs_to_arrow(runs: list[tuple[TopicPartition, Run]]) -> Any:
    """What a poll took, as one record batch: an :class:`ArrowRun`'s batch as it is (a slice
    of what the codec wrote, no copy) when the poll took from one run only."""
    batches = [run.batch if isinstance(run, ArrowRun) else records_to_arrow(run) for _, run in runs]
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return records_to_arrow([])
    pa = pyarrow_module()
    # One batch out of several: its columns copied once into one chunk each.
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def run_records(run: Run) -> list[ShareRecord]:
    """``run``'s records as :class:`ShareRecord` s (an :class:`ArrowRun` that a ``poll``
    rather than a ``poll_arrow`` took)."""
    if not isinstance(run, ArrowRun):
        return run
    batch = run.batch
    columns = [batch.column(name) for name in ARROW_COLUMNS]
    pa = pyarrow_module()
    columns[5] = columns[5].cast(pa.int64())  # the timestamp, as the records' milliseconds
    key, value, topic, partition, offset, timestamp, ts_type, headers, count = (
        c.to_pylist() for c in columns
    )
    return [
        ShareRecord(
            topic[i],
            partition[i],
            offset[i],
            timestamp[i],
            key[i],
            value[i],
            tuple((h["key"], h["value"]) for h in headers[i] or ()),
            count[i],
            ts_type[i],
        )
        for i in range(batch.num_rows)
    ]


def batch_offsets(batch: Any) -> dict[TopicPartition, list[int]]:
    """The offsets of the rows of a record batch with topic, partition and offset columns (one
    ``poll_arrow`` returned, or rows of it), by partition, in row order."""
    names = getattr(getattr(batch, "schema", None), "names", None)
    if names is None or not {"topic", "partition", "offset"} <= set(names):
        raise KcoreError(
            "acknowledge_batch() takes a record batch with topic, partition and offset "
            f"columns (as poll_arrow returns), got {type(batch).__name__}"
        )
    topic_column, partition_column = batch.column("topic"), batch.column("partition")
    offset_column = batch.column("offset")
    if topic_column.null_count or partition_column.null_count or offset_column.null_count:
        raise KcoreError("acknowledge_batch(): a row with no topic, partition or offset")
    pa = pyarrow_module()
    if not (pa.types.is_integer(partition_column.type) and pa.types.is_integer(offset_column.type)):
        raise KcoreError(
            "acknowledge_batch(): partition and offset must be integer columns, got "
            f"{partition_column.type} and {offset_column.type}"
        )
    offsets = offset_column.to_numpy().tolist()
    if not offsets:
        return {}
    # One partition's rows (what a poll of one partition's run gives): no grouping to do, and
    # the columns are compared in Arrow rather than read row by row.
    partitions = partition_column.to_numpy()
    if (partitions == partitions[0]).all():
        distinct = topic_column.unique()
        if len(distinct) == 1:
            return {TopicPartition(distinct[0].as_py(), int(partitions[0])): offsets}
    out: dict[TopicPartition, list[int]] = {}
    for topic, partition, offset in zip(
        topic_column.to_pylist(), partitions.tolist(), offsets, strict=True
    ):
        key = TopicPartition(topic, partition)
        got = out.get(key)
        if got is None:
            out[key] = [offset]
        else:
            got.append(offset)
    return out
