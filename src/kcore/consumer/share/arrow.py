"""A share consumer's records as one Arrow record batch: the columns of ``Consumer.poll_arrow``
(key, value, topic, partition, offset, timestamp, timestampType, headers, as the codec's
``ColumnarRecords.to_arrow`` makes them) and ``delivery_count``.

Rows come from the records a poll hands out (a share fetch hands out only the acquired offsets
of what it read, made as records in the codec), written into the columns by the codec."""

from __future__ import annotations

from typing import Any

from kcore.codec import record_columns
from kcore.consumer.share.acknowledgements import ShareRecord
from kcore.errors import KcoreError
from kcore.types import TopicPartition

__all__ = ["ARROW_COLUMNS", "batch_offsets", "records_to_arrow"]

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


def _pyarrow() -> Any:
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
    _pyarrow()
    columns, counts = record_columns(records, _DELIVERY_COUNT)
    return columns.to_arrow(counts, "delivery_count")


_DELIVERY_COUNT = ShareRecord._fields.index("delivery_count")


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
    pa = _pyarrow()
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
