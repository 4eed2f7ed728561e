"""Taking records out of the fetch buffer for ``poll``, on the caller's thread (Java's
``FetchCollector``): the first queued data of a partition not paused is decoded (records, or
Arrow columns), handed out up to the poll's limit, and the partition's position moves past it.
Data made stale since it was fetched (a seek, an unassignment, a new leader) is dropped on the
way; a queued error is raised to a poll that has taken nothing yet."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from kcore.codec import columnar_records, decode_records
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
        self._value_bytes = 0.0  # value bytes a row in the last poll_arrow (sizes the next)
        self._used_up = False  # the take under way used up queued data
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
            if data.decoded is None and st.position != data.next_offset:
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
        self._used_up = True  # the fetcher is woken once the poll is done (_woken)

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

    @contextmanager
    def _woken(self) -> Iterator[None]:
        """Around a poll's take: if it used up queued data, the fetcher is woken once at the
        end (to read ahead again), not once per partition's data (each wake is a write to
        the event loop's self-pipe and a pass of its fetch loop)."""
        self._used_up = False
        try:
            yield
        finally:
            if self._used_up:
                self.wake()

    def take_records(self, max_records: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        with self._woken(), self.positions.locked():
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
                    data.next_offset = recs[data.taken - 1].offset + 1
                    st.took(data, data.next_offset)
                if data.taken >= len(recs):
                    self._finish(data, st)
                self._record_lag(st)
        self.consumed(len(out))
        return out

    def _decode(self, data: FetchedData) -> list[ConsumerRecord]:
        """The records still to hand out (at or after the fetch offset: a fetch may start
        inside a batch; after what poll_arrow took of it), made as ConsumerRecords by the
        codec; control batches are skipped (and, read_committed, the batches of aborted
        transactions)."""
        records = _records(data)
        return decode_records(  # type: ignore[no-any-return]
            memoryview(records)[data.position :] if data.position else records,
            True,  # a fetch response may end with a partial batch (the next fetch gets it whole)
            data.next_offset,
            check_crcs=self.check_crcs,
            record_type=ConsumerRecord,
            topic=data.tp.topic,
            partition=data.tp.partition,
        )

    def take_arrow(self, max_records: int) -> Any:
        """Up to ``max_records`` records as one Arrow record batch with Spark's columns: the
        records of every partition's data taken are decoded by the codec straight into the
        one set of column buffers the batch wraps (each value copied once, from the fetch
        response; no batch per partition to concatenate)."""
        cols = columnar_records()
        left = max_records
        with self._woken(), self.positions.locked():
            # The values' buffer in one piece: at most what is queued, and about what
            # max_records took in earlier calls.
            room = sum(len(d.records) - d.position for d in self.buffer.peek() if d.error is None)
            if self._value_bytes:
                room = min(room, int(max_records * self._value_bytes * 1.25) + 4096)
            cols.reserve_values(room)
            while left > 0:
                data = self._next_data(cols.num_rows > 0)
                if data is None:
                    break
                st = self.positions.require(data.tp)
                if data.decoded is not None:  # poll decoded it: the rest from its next record
                    data.decoded = None
                before = cols.num_rows
                try:
                    n, position, stopped, last = cols.append_from(
                        _records(data),
                        data.position,
                        min_offset=data.next_offset,
                        max_rows=left,
                        topic=data.tp.topic,
                        partition=data.tp.partition,
                        check_crcs=self.check_crcs,
                    )
                except Exception as exc:
                    n = cols.num_rows - before
                    if n:  # rows of whole batches before the fault: handed out
                        data.position = exc.resume_position  # type: ignore[attr-defined]
                        self._took(data, st, n, exc.resume_offset - 1)  # type: ignore[attr-defined]
                    if cols.num_rows:  # hand out what was taken; the next poll raises
                        break
                    raise _naming(exc, data) from None
                if n:
                    self._took(data, st, n, last)
                left -= n
                data.position = position
                if stopped < 0:
                    self._finish(data, st)
                self._record_lag(st)
        self.consumed(cols.num_rows)
        if cols.num_rows:
            self._value_bytes = len(cols.value_data) / cols.num_rows
        return cols.to_arrow()

    def _took(self, data: FetchedData, st: PartitionState, n: int, last: int) -> None:
        """poll_arrow handed out ``n`` records of ``data``, the last at offset ``last``."""
        data.next_offset = last + 1
        if self.on_taken is not None:
            self.on_taken(data.tp.topic, data.tp.partition, n)
        st.took(data, data.next_offset)


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


def _records(data: FetchedData) -> Any:
    """``data``'s record batches; read_committed, without those of aborted transactions."""
    if not data.aborted:
        return data.records
    if data.committed is None:
        from kcore.consumer.aborted import drop_aborted

        data.committed = drop_aborted(data.records, data.aborted)
    return data.committed
