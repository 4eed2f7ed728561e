"""Spark's Arrow record batches into a kcore producer, column by column, and the check that
every record sent was delivered.

Rows are grouped by (topic, partition) and each group is one ``send_batch`` call: its key,
value and timestamp columns go to the compiled codec as Arrow arrays (a string column is read
as its UTF-8 bytes, no cast), so no Python code runs per row. Within a group the rows keep their
order, so rows with the same key stay in order, as with the JVM sink. The headers column
(``array<struct<key, value>>``) goes in as it is too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kcore.errors import ConfigError

from .write_options import WriteSettings

__all__ = ["RecordSender"]


class RecordSender:
    """Sends record batches with ``producer``; :meth:`finish` waits for them all and raises the
    first delivery error. Sending stops at the first error seen (as the JVM sink does)."""

    def __init__(self, producer: Any, settings: WriteSettings) -> None:
        self.producer = producer
        self.settings = settings
        self.records = 0
        self._pending: list[Any] = []  # SendBatchResult / DeliveryFuture, in send order

    def send(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        if n == 0:
            return
        cols = self.settings.columns
        topics = self.settings.topic or _topics(batch.column("topic"))
        partitions = _partitions(batch.column("partition")) if "partition" in cols else None
        stamps = (
            _timestamps(batch.column("timestamp"), self.records) if "timestamp" in cols else None
        )
        keys = batch.column("key") if "key" in cols else None
        values = batch.column("value")
        headers = batch.column("headers") if "headers" in cols else None
        send_batch = self.producer.send_batch
        for topic, partition, rows in _groups(topics, partitions, n):
            self._pending.append(
                send_batch(
                    topic,
                    _take(values, rows),
                    _take(keys, rows),
                    partition=partition,
                    timestamp_ms=_take(stamps, rows),
                    headers=_take(headers, rows),
                )
            )
        self.records += n
        self._pending = [r for r in self._pending if not _delivered(r)]  # fail fast

    def finish(self) -> None:
        """Wait for every record sent (bounded by the settings' timeout); raise the first
        delivery error."""
        self.producer.flush(self.settings.timeout_s)
        for result in self._pending:
            result.result(0)  # all done after flush: returns, or raises the delivery error
        self._pending = []


def _delivered(result: Any) -> bool:
    """Whether ``result`` is done (raising its delivery error if it failed)."""
    if not result.done():
        return False
    result.result(0)
    return True


def _topics(column: pa.Array) -> pa.Array:
    if column.null_count:
        raise ConfigError(
            "topic",
            "null topic present in the data. Use the topic option for setting a default topic.",
        )
    return column


def _partitions(column: pa.Array) -> np.ndarray | None:
    """Partitions as int64, -1 where null (the producer chooses); None if all are null."""
    if column.null_count == len(column):
        return None
    low = pc.min(column).as_py()
    if low is not None and low < 0:
        raise ConfigError("partition", f"invalid partition {low} in the data")
    return np.asarray(column.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _timestamps(column: pa.Array, first_row: int = 0) -> pa.Array | np.ndarray:
    """Record timestamps as the JVM sink makes them: microseconds divided by 1000, truncated
    towards zero (``KafkaWriteTask``), null as the time now. A double column is seconds since
    the epoch, cast first as Spark casts a double to a timestamp (truncated to microseconds;
    NaN and infinities are null). A timestamp before 1970 fails, naming its row (counted from
    ``first_row``): Kafka takes none (Java's ``ProducerRecord`` refuses it and so fails the
    JVM sink's task), so nothing of the batch is sent."""
    if pa.types.is_timestamp(column.type):
        micros = column.cast(pa.timestamp("us", column.type.tz), safe=False).cast(pa.int64())
        low = pc.min(micros).as_py()
        if low is None or low >= 0:
            return column  # send_batch floors it to ms: the same as truncating here
        given = micros.is_valid().to_numpy(zero_copy_only=False)
        micros_np = micros.fill_null(0).to_numpy(zero_copy_only=False)
    else:
        seconds = column.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls: NaN
        given = np.isfinite(seconds)
        micros_np = np.trunc(np.where(given, seconds, 0.0) * 1_000_000).astype(np.int64)
    ms = np.sign(micros_np) * (np.abs(micros_np) // 1000)  # towards zero, as Java's long /
    bad = np.flatnonzero(given & (ms < 0))
    if bad.size:
        row = int(bad[0])
        raise ConfigError(
            "timestamp",
            f"invalid timestamp {int(ms[row])} ms (before 1970-01-01T00:00:00Z) in row "
            f"{first_row + row} (from 0) of the task's rows, and {bad.size - 1} more in its "
            "Arrow batch; Kafka record timestamps must be non-negative or null. None of the "
            "batch's rows were sent",
        )
    return np.where(given, ms, int(time.time() * 1000))


def _groups(
    topics: str | pa.Array, partitions: np.ndarray | None, n: int
) -> Iterator[tuple[str, int | None, np.ndarray | None]]:
    """(topic, partition or None, row indices or None for all rows) per distinct pair, in
    first-row order; the indices of each in row order."""
    if isinstance(topics, str):
        names, codes = [topics], None
    else:
        encoded = topics.dictionary_encode()
        names = encoded.dictionary.to_pylist()
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    if partitions is None and len(names) == 1:
        yield names[0], None, None
        return
    key = codes << 32 if codes is not None else np.zeros(n, np.int64)
    if partitions is not None:
        key = key + partitions + 1
    order = np.argsort(key, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(key[order])) + 1)
    if len(groups) == 1:
        groups = [None]  # type: ignore[list-item]
    for rows in groups:
        first = 0 if rows is None else int(rows[0])
        topic = names[int(codes[first])] if codes is not None else names[0]
        p = int(partitions[first]) if partitions is not None else -1
        yield topic, (None if p < 0 else p), rows


def _take(column: Any, rows: np.ndarray | None) -> Any:
    if column is None or rows is None:
        return column
    return column.take(rows)
