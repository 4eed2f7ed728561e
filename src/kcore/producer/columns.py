"""``send_batch``'s columns: values, keys, timestamps and headers given whole (lists, numpy or
pyarrow arrays) are checked, normalised (timestamps to int64 milliseconds), grouped by
partition (keyed records hashed in one compiled call, send order kept within a partition) and
appended chunk by chunk, each chunk one batch filled up to ``batch.size`` by the compiled
``append_many``. Rows are offered in windows sized by what the previous chunk took, so that
input the codec converts (Python headers, numpy object arrays) is converted about once."""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Iterator
from typing import Any

from kcore.codec import partitions_for_keys, prepare_headers
from kcore.errors import KcoreError
from kcore.producer.accumulator import RECORD_OVERHEAD, ProducerBatch
from kcore.producer.results import SendBatchResult
from kcore.types import TopicPartition

__all__ = ["ColumnAppender"]

# Queue rows ``start:stop`` of these columns (``stop`` -1: all; with ``rows``, an int64 array or
# None, the rows ``rows[start:stop]``) to one partition, in one batch of at most about
# ``estimate`` bytes: (the batch, how many rows it took). The accumulator's append_chunk,
# waiting for buffer.memory up to max.block.ms.
AppendChunk = Callable[
    [TopicPartition, Any, Any, Any, Any, int, int, int, Any], tuple[ProducerBatch, int]
]
# (topic, partition count, partitions with a leader, bytes about to be added) -> the uniform
# sticky partitioner's partition.
StickyPartition = Callable[[str, int, list[int], int], int]


class ColumnAppender:
    """Appends whole columns for one producer. ``wake_sender()``: a chunk (a full batch) is
    ready; ``let_sender_start()``: called after the first of several chunks, so the sender
    may take it while the rest are encoded."""

    def __init__(
        self,
        *,
        batch_size: int,
        ignore_keys: bool,
        append_chunk: AppendChunk,
        sticky_partition: StickyPartition,
        wake_sender: Callable[[], None],
        let_sender_start: Callable[[], None],
    ) -> None:
        self.batch_size = batch_size
        self.ignore_keys = ignore_keys
        self.append_chunk = append_chunk
        self.sticky_partition = sticky_partition
        self.wake_sender = wake_sender
        self.let_sender_start = let_sender_start

    def append(
        self,
        topic: str,
        values: Any,
        keys: Any,
        partition: int | None,
        timestamp_ms: Any,
        counts: tuple[int, list[int]],
        headers: Any = None,
    ) -> SendBatchResult:
        """Columns in: split by partition, then into chunks of about ``batch.size``, each one
        compiled ``append_many`` call. ``counts``: the topic's partition count and the
        partitions with a leader."""
        n = len(values)
        # Checked before any chunk is queued (a bad input found in a later chunk would leave
        # the earlier ones sent): lengths, and the headers whole.
        if keys is not None and len(keys) != n:
            raise ValueError(f"{len(keys)} keys for {n} values")
        headers = prepare_headers(headers, n)
        if isinstance(timestamp_ms, numbers.Integral):  # also numpy's integer scalars
            timestamp_ms = int(timestamp_ms)
        elif _is_datetime64_scalar(timestamp_ms):  # one time for all, as one int is
            ms = _milliseconds(timestamp_ms.reshape(1))[0]
            timestamp_ms = int(ms)
        elif timestamp_ms is not None:
            if not hasattr(timestamp_ms, "__len__"):  # an iterator: its values, once
                timestamp_ms = list(timestamp_ms)
            timestamp_ms = _milliseconds(timestamp_ms)
            if len(timestamp_ms) != n:
                raise ValueError(f"{len(timestamp_ms)} timestamps for {n} values")
        out = SendBatchResult(topic)
        if n == 0:
            return out
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        per_record = (
            RECORD_OVERHEAD
            + _mean_size(values, n)
            + (_mean_size(keys, n) if keys is not None else 0)
            + _mean_headers_size(headers, n)
        )
        # Rows a batch takes by the estimate, which is an upper bound (RECORD_OVERHEAD counts
        # the longest varints). A chunk is offered more rows than that and ends at batch.size
        # exactly; then the next is offered about what it took (_next_window).
        chunk = max(1, self.batch_size // per_record)
        window, first = 2 * chunk, True
        count, available = counts
        if partition is not None and not 0 <= partition < count:  # as send's check
            raise KcoreError(f"{topic} has {count} partitions; there is no partition {partition}")

        def append_rows(
            to: int | None,
            k: Any,
            v: Any,
            t: Any,
            h: Any,
            lo: int = 0,
            hi: int | None = None,
            rows: Any = None,
        ) -> Iterator[None]:
            """Rows ``lo:hi`` of these columns (all of them by default; with ``rows``, the
            rows ``rows[lo:hi]``), chunk by chunk, to partition ``to`` (None: the sticky
            partitioner's choice for each chunk); a step per chunk queued."""
            nonlocal window, first
            start, size = lo, len(v) if hi is None else hi
            while start < size:
                stop = min(size, start + window)
                estimate = min(stop - start, chunk) * per_record
                p = (
                    to
                    if to is not None
                    else self.sticky_partition(topic, count, available, self.batch_size)
                )
                taken = self._chunk(out, topic, p, k, v, t, h, start, stop, estimate, rows)
                if first and taken < n:
                    self.let_sender_start()
                first = False
                window = _next_window(window, stop - start, taken, chunk)
                start += taken
                yield

        try:
            if partition is not None or keys is None or self.ignore_keys:
                # One partition for everything given, or sticky chunks for unkeyed records.
                for _ in append_rows(partition, keys, values, ts, headers):
                    pass
            else:
                import numpy as np

                parts = np.frombuffer(partitions_for_keys(keys, count), dtype=np.int32)
                if (parts < 0).any():  # null keys: sticky, as for unkeyed records
                    parts = parts.copy()
                    parts[parts < 0] = self.sticky_partition(topic, count, available, 0)
                # Stable, so send order holds within a partition. Partition numbers fit 16 bits
                # (a topic has at most a few thousand), for which numpy's stable sort is a
                # radix sort: ~6x faster than on int32 at 10,000 rows.
                sort_key = parts.astype(np.uint16) if count <= 1 << 16 else parts
                order = np.argsort(sort_key, kind="stable")
                sorted_parts = parts[order]
                starts = [0, *(np.flatnonzero(np.diff(sorted_parts)) + 1).tolist()]
                ends = [*starts[1:], n]
                # The partitions' chunks are queued in turn, a batch of each, as a send loop
                # queues them: a produce request then carries a batch of every partition
                # ready, not many requests a batch of one partition each.
                rows = t_all = None
                if type(values) in (list, tuple) and (keys is None or type(keys) in (list, tuple)):
                    t_all = ts if isinstance(ts, int) else _signed_int64(ts)
                if t_all is not None:
                    # Python sequences stay as they are, read through the sorted row numbers:
                    # copies in partition order cost a take each and, being containers of
                    # every record, 15-40 ms of the collector's time per 200,000 rows.
                    rows = order.astype(np.int64, copy=False)
                    k, v, t, h = keys, values, t_all, headers
                else:
                    # Arrays (and sequences whose times are not all signed ints, which the
                    # checked path refuses): one take per column in partition order.
                    k, v = _take(keys, order), _take(values, order)
                    t = ts if isinstance(ts, int) else _take(ts, order)
                    h = _take(headers, order) if headers is not None else None
                # Each partition's rows are a range of that order.
                feeds = [
                    append_rows(int(sorted_parts[a]), k, v, t, h, a, b, rows)
                    for a, b in zip(starts, ends, strict=True)
                ]
                while feeds:
                    feeds = [feed for feed in feeds if next(feed, _DONE) is not _DONE]
        except Exception as exc:
            # Bad content (a value of the wrong type, say) in a later chunk: the earlier
            # chunks are queued and will be delivered; say which, and hand over their result.
            if len(out):
                exc.queued = out  # type: ignore[attr-defined]
                note = (
                    f"send_batch: {len(out)} of the {n} records (the chunks before this error) "
                    "were queued and will be sent; the exception's .queued is their result"
                )
                if hasattr(exc, "add_note"):  # Python 3.11+
                    exc.add_note(note)
            raise
        self.wake_sender()
        return out

    def _chunk(
        self,
        out: SendBatchResult,
        topic: str,
        partition: int,
        keys: Any,
        values: Any,
        ts: Any,
        headers: Any,
        start: int,
        stop: int,
        estimate: int,
        rows: Any = None,
    ) -> int:
        """Queue as many of rows ``start:stop`` (of ``rows``, if given) as fit one batch;
        returns how many."""
        if rows is not None:
            k, v, t, h = keys, values, ts, headers  # read in place, through ``rows``
        elif (
            type(values) in (list, tuple)
            and (keys is None or type(keys) in (list, tuple))
            and isinstance(ts, int)
            and headers is None
        ):
            # Lists are read in place, by row: a slice takes and drops a reference per value
            # (~7% of send_batch's CPU for 1,000,000 values).
            k, v, t, h = keys, values, ts, headers
        else:
            # Arrays slice without copying; anything else append_many converts whole, so a
            # chunk converts only its own rows.
            k = keys[start:stop] if keys is not None else None
            v = values[start:stop]
            t = ts if isinstance(ts, int) else ts[start:stop]
            h = headers[start:stop] if headers is not None else None
            start, stop = 0, -1
        batch, taken = self.append_chunk(
            TopicPartition(topic, partition), k, v, t, h, start, stop, estimate, rows
        )
        out.add(partition, taken, batch.result)
        self.wake_sender()  # a chunk is a full batch: ready to go now
        return taken


def _milliseconds(column: Any) -> Any:
    """A column of times (pyarrow ``timestamp``, numpy ``datetime64``) as int64 milliseconds
    since the epoch, null or NaT as the time now (as Spark's Kafka sink); other columns as
    they are (ints in milliseconds)."""
    if type(column).__module__.startswith("pyarrow"):
        import pyarrow as pa

        if pa.types.is_timestamp(column.type):  # UTC instants: through numpy, which floors
            column = column.to_numpy(zero_copy_only=False)  # (nulls: NaT)
    dtype = getattr(column, "dtype", None)
    if getattr(dtype, "kind", "") == "M":  # numpy datetime64
        import numpy as np

        ms = column.astype("datetime64[ms]")  # floors sub-millisecond parts, as Java's
        nat = np.isnat(ms)
        ms = ms.view("int64")
        if nat.any():
            ms = np.where(nat, int(time.time() * 1000), ms)
        return np.ascontiguousarray(ms)
    return column


def _is_datetime64_scalar(value: Any) -> bool:
    return type(value).__name__ == "datetime64" and type(value).__module__ == "numpy"


def _mean_size(column: Any, n: int) -> int:
    """Average bytes per item of a column, cheaply."""
    if column is None or n == 0:
        return 0
    nbytes = getattr(column, "nbytes", None)  # numpy and pyarrow
    if isinstance(nbytes, int) and nbytes > 0:
        return max(1, nbytes // n)
    sample = [column[i] for i in range(0, n, max(1, n // 16))]
    sizes = [len(x) for x in sample if x is not None]
    return max(1, sum(sizes) // len(sizes)) if sizes else 1


def _mean_headers_size(headers: Any, n: int) -> int:
    """Average encoded bytes of a record's headers (their count included), cheaply."""
    if headers is None or n == 0:
        return 0
    nbytes = getattr(headers, "nbytes", None)  # pyarrow: data, offsets, validity
    if isinstance(nbytes, int):
        return 1 + nbytes // n
    sample = [headers[i] for i in range(0, n, max(1, n // 16))]
    total = sum(
        2 + len(k) + (len(v) if v is not None else 0) for entry in sample for k, v in entry or ()
    )
    return 1 + total // len(sample)


def _next_window(window: int, offered: int, taken: int, chunk: int) -> int:
    """Rows to offer send_batch's next chunk, after one was offered ``offered`` rows (the
    window, or fewer at the end of the rows) and took ``taken``. Input that append_many
    converts (Python headers, numpy object arrays) is converted a window at a time, so
    offering far more than a batch takes would convert rows twice."""
    if taken < offered:  # the batch filled: about what it took, never under the estimate's
        return max(chunk, taken + taken // 4 + 1)  # (a lone large record takes 1)
    if offered < window:  # the rows (a partition's group) ran out first: nothing learnt
        return window
    return 2 * window  # it took every row offered: records smaller than the estimate said


_DONE = object()  # a feed of append_rows has queued all its chunks


def _signed_int64(column: Any) -> Any:
    """A numpy array or Python sequence of signed integers as one contiguous int64 array (read
    by every chunk through send_batch's row numbers), else None: other columns (floats,
    unsigned, ints past 64 bits, nulls) keep the path that checks them chunk by chunk."""
    import numpy as np

    if not isinstance(column, np.ndarray):
        if type(column) not in (list, tuple):
            return None
        column = np.array(column)  # Python ints past int64: dtype object
    if column.dtype.kind != "i":
        return None
    return np.ascontiguousarray(column, dtype=np.int64)


def _take(column: Any, indices: Any) -> Any:
    if hasattr(column, "take"):  # pyarrow (and numpy, whose take copies)
        return column.take(indices)
    from operator import itemgetter

    # A tuple, not a list: the collector stops tracking a tuple of bytes once it has seen it,
    # where it would walk a list of 200,000 keys at every collection it survives (~15 ms).
    if len(indices) == 1:
        return (column[int(indices[0])],)
    return itemgetter(*indices.tolist())(column)
