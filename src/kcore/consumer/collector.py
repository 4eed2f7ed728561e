"""Taking records out of the fetch buffer for ``poll``, on the caller's thread (Java's
``FetchCollector``): the first queued data of a partition not paused is decoded (records, or
Arrow columns), handed out up to the poll's limit, and the partition's position moves past it.
Data made stale since it was fetched (a seek, an unassignment, a new leader) is dropped on the
way; a queued error is raised to a poll that has taken nothing yet."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from kcore.codec import decode_columns, decode_records
from kcore.consumer.fetch_buffer import FetchBuffer, FetchedData
from kcore.consumer.fetcher import Fetcher
from kcore.consumer.positions import PartitionState
from kcore.errors import CorruptRecordError, NoOffsetForPartitionError
from kcore.metrics import ClientMetrics
from kcore.types import TopicPartition

__all__ = ["ConsumerRecord", "FetchCollector"]


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class FetchCollector:
    """``poll``'s side of the fetch buffer: :meth:`take_records` and :meth:`take_arrow`, each
    under the positions' lock (what is handed out and the positions it moves agree)."""

    def __init__(
        self,
        fetcher: Fetcher,
        buffer: FetchBuffer,
        metrics: ClientMetrics,
        check_crcs: bool,
        wake: Callable[[], None],
    ) -> None:
        self.fetcher = fetcher  # drops a partition's read-ahead; knows the leader epochs
        self.positions = fetcher.positions
        self.buffer = buffer
        self.metrics = metrics
        self.check_crcs = check_crcs
        self.wake = wake  # wakes the fetcher: a partition's read-ahead was used up or dropped
        self.last_poll: float | None = None  # when a poll last returned (time.monotonic())
        # Told how many records of a partition each poll handed out (topic, partition,
        # records): OpenTelemetry metrics; None while they are off.
        self.on_taken: Callable[[str, int, int], None] | None = None

    def _next_data(self, have_records: bool = False) -> FetchedData | None:
        """The first queued data whose partition is not paused and still at the position the
        data was fetched from (stale data is dropped on the way). A queued error is raised, but
        only to a caller that has taken nothing yet (as Java's poll: records first, the error
        at the next call)."""
        while True:
            found, rescan = self._scan_queue(have_records)
            if not rescan:
                return found

    def _scan_queue(self, have_records: bool) -> tuple[FetchedData | None, bool]:
        """One pass of :meth:`_next_data`: (the data, False), or (None, True) when a partition's
        queued data was dropped on the way (the queue changed under the pass: scan again)."""
        f = self.fetcher
        for data in self.buffer.peek():
            if isinstance(data.error, NoOffsetForPartitionError):
                # Reported by the fetcher in the moment between assign() and seek(), say: it
                # holds only for partitions still without a position.
                still = [tp for tp in data.error.partitions if self._lacks_position(tp)]
                if not still:
                    self.buffer.remove(data)
                    continue
                if still != data.error.partitions:
                    data.error = NoOffsetForPartitionError(still)
            if data.error is not None:
                if data.tp.partition >= 0 and data.tp not in self.positions:
                    self.buffer.remove(data)  # about a partition unassigned since
                    continue
                if have_records:
                    return None, False
                self.buffer.remove(data)
                raise data.error
            st = self.positions.get(data.tp)
            if st is None:
                self.buffer.remove(data)  # unassigned since it was fetched
                continue
            if data.decoded is None and st.position != data.fetch_offset:
                f.drop_queued(data.tp)  # sought since it was fetched: all of it is stale
                self.wake()
                return None, True
            if st.unvalidated(f.leader_epoch(data.tp)):
                # The leader changed since this was fetched (KIP-320): the position is checked
                # with the new one first, and the old leader's read-ahead is not handed out.
                f.drop_queued(data.tp, keep_errors=True)
                self.wake()
                return None, True
            if st.paused:
                continue  # kept for resume, not handed out (as Java's pause)
            return data, False
        return None, False

    def _lacks_position(self, tp: TopicPartition) -> bool:
        st = self.positions.get(tp)
        return st is not None and st.position is None

    def _finish(self, data: FetchedData, st: PartitionState) -> None:
        """``data`` is used up: the position moves past its last batch (past control batches
        and compacted-away records too), where the next queued data starts."""
        self.buffer.remove(data)
        st.queued -= 1
        st.queued_bytes -= len(data.records)
        self.metrics.record("bytes-consumed", len(data.records))
        if data.end_offset > (st.position or 0):
            st.took(data, data.end_offset)
        self.wake()

    def _record_lag(self, st: PartitionState) -> None:
        """records-lag-max: how far a partition's position is behind its high watermark
        (read_committed: its last stable offset) after records were handed out."""
        if st.lag_end >= 0 and st.position is not None:
            self.metrics.record("records-lag", max(0, st.lag_end - st.position))

    def consumed(self, records: int) -> None:
        """A poll returned ``records``: counted, and the time of the poll kept."""
        self.last_poll = time.monotonic()
        if records:
            self.metrics.record("records-consumed", records)

    def take_records(self, max_records: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        with self.positions.locked():
            while len(out) < max_records:
                data = self._next_data(bool(out))
                if data is None:
                    break
                st = self.positions.require(data.tp)
                if data.decoded is None:
                    try:
                        data.decoded = self._decode(data)
                    except Exception as exc:
                        if out:  # hand out what was taken; the next poll raises
                            break
                        raise _naming(exc, data) from None
                    data.taken = 0
                recs = data.decoded
                n = min(max_records - len(out), len(recs) - data.taken)
                if n:
                    out.extend(recs[data.taken : data.taken + n])
                    data.taken += n
                    if self.on_taken is not None:
                        self.on_taken(data.tp.topic, data.tp.partition, n)
                    st.took(data, recs[data.taken - 1].offset + 1)
                if data.taken >= len(recs):
                    self._finish(data, st)
                self._record_lag(st)
        self.consumed(len(out))
        return out

    def _decode(self, data: FetchedData) -> list[ConsumerRecord]:
        """The records at or after the fetch offset (a fetch may start inside a batch), made
        as ConsumerRecords by the codec; control batches are skipped (and, read_committed,
        the batches of aborted transactions)."""
        return decode_records(  # type: ignore[no-any-return]
            _committed(data) if data.aborted else data.records,
            True,  # a fetch response may end with a partial batch (the next fetch gets it whole)
            data.fetch_offset,
            check_crcs=self.check_crcs,
            record_type=ConsumerRecord,
            topic=data.tp.topic,
            partition=data.tp.partition,
        )

    def take_arrow(self, max_records: int) -> Any:
        import pyarrow as pa

        batches: list[Any] = []
        left = max_records
        with self.positions.locked():
            while left > 0:
                data = self._next_data(bool(batches))
                if data is None:
                    break
                st = self.positions.require(data.tp)
                if data.decoded is None:
                    try:
                        records = _committed(data) if data.aborted else data.records
                        cols = decode_columns(
                            records, min_offset=data.fetch_offset, check_crcs=self.check_crcs
                        )
                    except Exception as exc:
                        if batches:  # hand out what was taken; the next poll raises
                            break
                        raise _naming(exc, data) from None
                    data.decoded = [cols.to_arrow()]
                    data.taken = 0
                rb = data.decoded[0]
                n = min(left, rb.num_rows - data.taken)
                if n > 0:
                    part = rb.slice(data.taken, n)
                    batches.append(_with_topic(part, data.tp))
                    data.taken += n
                    left -= n
                    if self.on_taken is not None:
                        self.on_taken(data.tp.topic, data.tp.partition, n)
                    st.took(data, part.column("offset")[n - 1].as_py() + 1)
                if data.taken >= rb.num_rows:
                    self._finish(data, st)
                self._record_lag(st)
        self.consumed(max_records - left)
        if not batches:
            return _empty_arrow()
        if len(batches) == 1:
            return batches[0]
        return pa.concat_batches(batches)


def _naming(error: Exception, data: FetchedData) -> Exception:
    """A ``CorruptRecordError`` from the codec, its message prefixed with the partition and
    the offset fetched (the codec knows only a byte position); its class and position kept.
    Other errors as they are."""
    if not isinstance(error, CorruptRecordError):
        return error
    named = copy.copy(error)
    named.args = (
        f"{data.tp.topic}-{data.tp.partition}: fetched at offset {data.fetch_offset}: {error}",
    )
    return named


def _committed(data: FetchedData) -> Any:
    """read_committed: ``data``'s records without those of aborted transactions."""
    from kcore.consumer.aborted import drop_aborted

    assert data.aborted is not None
    return drop_aborted(data.records, data.aborted)


def _with_topic(rb: Any, tp: TopicPartition) -> Any:
    """Spark's Kafka source columns: key, value, topic, partition, offset, timestamp,
    timestampType (and headers)."""
    import numpy as np
    import pyarrow as pa

    n = rb.num_rows
    topic = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, np.int32)), pa.array([tp.topic], pa.string())
    ).cast(pa.string())
    arrays = [rb.column("key"), rb.column("value"), topic]
    arrays.append(pa.array(np.full(n, tp.partition, np.int32)))
    names = ["key", "value", "topic", "partition"]
    for name in rb.schema.names:
        if name not in ("key", "value"):
            arrays.append(rb.column(name))
            names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _empty_arrow() -> Any:
    from kcore.codec import decode_columns as dc

    return _with_topic(dc(b"").to_arrow(), TopicPartition("", 0))
