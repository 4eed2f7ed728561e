"""What a share consumer owes the broker for the records it acquired, free of I/O.

Each record a ShareFetch acquired is, on this side, in one of three places: *buffered* (fetched,
not handed out yet), *delivered* (handed out by a poll, not acknowledged), or *pending* (an
acknowledgement waiting to go out, piggy-backed on the next ShareFetch to its leader or sent by
ShareAcknowledge). Rules kept here: a record is acknowledged at most once per delivery (RENEW
excepted: it keeps the record delivered); only records this consumer delivered can be
acknowledged; offsets of an acquired range that hold no record (compacted away, transaction
markers) are acknowledged as gaps at once."""

from __future__ import annotations

import enum
import operator
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from kcore.consumer.share._acknowledge import AcknowledgementState, OffsetSpans
from kcore.errors import AcknowledgementError
from kcore.types import TopicPartition

__all__ = [
    "GAP",
    "AcknowledgeType",
    "Acknowledgements",
    "AcknowledgementError",
    "ArrowRun",
    "OffsetSpans",
    "ShareRecord",
    "has_renew",
    "run_offsets",
]

GAP = 0  # the protocol's "no record at this offset" acknowledgement


class AcknowledgeType(enum.IntEnum):
    """How a record's delivery ends (the protocol's numbers)."""

    ACCEPT = 1  # processed: never delivered again
    RELEASE = 2  # not processed: delivered again (to any member), its delivery count up
    REJECT = 3  # unprocessable: never delivered again, archived
    RENEW = 4  # still processing: its acquisition lock starts again (KIP-1222)


class ShareRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    delivery_count: int  # 1 on the first delivery, more after releases or lock expiries
    timestamp_type: int = 0  # 0: the producer's create time; 1: the broker's log-append time


class ArrowRun:
    """Acquired records of one partition decoded straight into Arrow columns (what a share
    consumer buffers while its caller uses ``poll_arrow``): ``batch``, a ``pyarrow.RecordBatch``
    with the share consumer's Arrow columns, and ``offsets``, its rows' offsets. Sliced as a
    list of records is (a slice of the batch, no copy)."""

    __slots__ = ("batch", "offsets")

    def __init__(self, batch: Any, offsets: list[int]) -> None:
        self.batch = batch
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, part: slice) -> ArrowRun:
        start, stop, _ = part.indices(len(self.offsets))
        return ArrowRun(self.batch.slice(start, max(stop - start, 0)), self.offsets[part])


Run = list[ShareRecord] | ArrowRun  # one partition's records, in offset order


def run_offsets(run: Run) -> Iterable[int]:
    """The offsets of ``run``'s records, in order."""
    return run.offsets if isinstance(run, ArrowRun) else map(_OFFSET, run)


def add_run(spans: OffsetSpans, run: Run, kind: int) -> None:
    """``run``'s offsets added to ``spans`` with ``kind``: as one span when they are
    consecutive (the usual run: no gap inside it), else one by one."""
    if not len(run):
        return
    if isinstance(run, ArrowRun):
        first, last = run.offsets[0], run.offsets[-1]
    else:
        first, last = run[0][2], run[-1][2]
    if last - first + 1 == len(run):
        spans.add_span(first, last, kind)
    else:
        spans.update(run_offsets(run), kind)


class Acknowledgements(AcknowledgementState):
    """Owned by the share consumer core; the caller's thread and the event loop both use it, so
    every method takes the lock. Partitions may be given as ``TopicPartition`` s or as plain
    ``(topic, partition)`` tuples (equal to them, and cheaper to make per record); what goes
    out (:meth:`take`, :meth:`pending_partitions`) is always ``TopicPartition`` s, with each
    partition's acknowledgements as an :class:`OffsetSpans`. The state (``_delivered``,
    ``_pending``, ``_renewing``, ``_lock``) lives in the compiled base, whose
    ``RecordAcknowledger`` does :meth:`acknowledge`'s common case without a Python frame.

    ``whole_polls`` (implicit mode): records are never acknowledged one by one, only all that
    a poll handed out at once (:meth:`settle_all`), so a poll's runs are kept as they came
    (``_handed``) rather than as offsets to look records up in."""

    def __init__(self, whole_polls: bool = False) -> None:
        super().__init__()
        self.whole_polls = whole_polls
        self._handed: list[tuple[TopicPartition, Run]] = []

    def delivered(self, runs: Iterable[tuple[TopicPartition, Run]]) -> None:
        """A poll handed ``runs`` (one partition's records each) out."""
        with self._lock:
            if self.whole_polls:
                self._handed.extend(runs)
                return
            for tp, run in runs:
                add_run(_spans_of(self._delivered, tp), run, 0)

    def acknowledge(self, tp: tuple[str, int], offset: int, kind: int) -> None:
        with self._lock:
            owed = self._delivered.get(tp)
            if owed is not None and offset in owed and kind != _RENEW:
                # The common case: a delivered record's first acknowledgement.
                owed.discard(offset)
                if not owed:
                    del self._delivered[tp]
                _spans_of(self._pending, tp).add(offset, kind)
                return
            self._acknowledge_other(tp, offset, kind, owed)

    def _acknowledge_other(
        self, tp: tuple[str, int], offset: int, kind: int, owed: OffsetSpans | None
    ) -> None:
        """RENEW, a renewal replaced, or a record this consumer may not acknowledge (raises).
        The lock is held."""
        if owed is None or offset not in owed:
            pending = self._pending.get(tp, _NONE)
            if pending.get(offset) == AcknowledgeType.RENEW:
                # A renewal not sent yet: the new acknowledgement replaces it.
                pending.add(offset, int(kind))
                if kind != AcknowledgeType.RENEW:
                    self._renewing[tp].discard(offset)
                return
            where = f"{tp[0]}-{tp[1]}@{offset}"
            if offset in pending:
                raise AcknowledgementError(f"{where} is acknowledged already")
            if offset in self._renewing.get(tp, ()):
                raise AcknowledgementError(
                    f"{where}: its RENEW is under way; acknowledge it after the next poll or commit"
                )
            raise AcknowledgementError(
                f"{where} was not delivered by this consumer "
                "(or its delivery ended: acknowledged, or given up at close)"
            )
        # RENEW: still this consumer's to acknowledge once the renewal went out.
        self._renewing.setdefault(tp, set()).add(offset)
        owed.discard(offset)
        if not owed:
            del self._delivered[tp]
        _spans_of(self._pending, tp).add(offset, int(kind))

    def acknowledge_many(self, offsets: Mapping[TopicPartition, list[int]], kind: int) -> None:
        """Each of ``offsets`` (by partition) acknowledged as ``kind``, all or none: a record
        not delivered (its RENEW under way aside) refuses the lot. Checked and applied per
        partition in bulk; only RENEW, or a record whose RENEW is not sent yet, goes one by
        one."""
        if any(len(set(offs)) != len(offs) for offs in offsets.values()):
            raise AcknowledgementError("a record appears twice in one acknowledgement")
        refused: tuple[TopicPartition, int] | None = None
        with self._lock:
            delivered = self._delivered
            if kind != _RENEW and all(
                tp in delivered and delivered[tp].issuperset(offs) for tp, offs in offsets.items()
            ):
                for tp, offs in offsets.items():
                    if not offs:
                        continue
                    owed = delivered[tp]
                    owed.difference_update(offs)
                    if not owed:
                        del delivered[tp]
                    _spans_of(self._pending, tp).update(offs, int(kind))
                return
            for tp, offs in offsets.items():
                owed = delivered.get(tp, _NONE)
                pending = self._pending.get(tp, _NONE)
                for offset in offs:
                    if offset not in owed and pending.get(offset) != _RENEW:
                        refused = (tp, offset)
                        break
                if refused is not None:
                    break
        if refused is not None:
            self.acknowledge(*refused, kind)  # raises (its record is not owed), changing nothing
        for tp, offs in offsets.items():
            for offset in offs:
                self.acknowledge(tp, offset, kind)

    def unacknowledged(self) -> int:
        with self._lock:
            handed = sum(len(run) for _, run in self._handed)
            return handed + sum(len(v) for v in self._delivered.values())

    def settle_all(self, kind: int) -> None:
        """Every delivered record acknowledged as ``kind`` (implicit mode: ACCEPT at the next
        poll or commit; close: RELEASE)."""
        with self._lock:
            for tp, owed in self._delivered.items():
                _spans_of(self._pending, tp).add_spans(owed, kind)
            for tp, run in self._handed:
                add_run(_spans_of(self._pending, tp), run, kind)
            self._delivered.clear()
            self._handed.clear()

    def add(self, tp: TopicPartition, offsets: Iterable[int], kind: int) -> None:
        """Acknowledgements of records never delivered (gaps; a buffer released at close)."""
        with self._lock:
            pending = _spans_of(self._pending, tp)
            pending.update(offsets, kind)
            if not pending:
                del self._pending[tp]

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def pending_partitions(self) -> set[TopicPartition]:
        with self._lock:
            return {TopicPartition(*tp) for tp in self._pending}

    def take(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, OffsetSpans]:
        """The pending acknowledgements of ``partitions``, removed (they are being sent)."""
        with self._lock:
            return {
                TopicPartition(*tp): self._pending.pop(tp)
                for tp in partitions
                if tp in self._pending
            }

    def sent(self, acks: Mapping[TopicPartition, OffsetSpans]) -> None:
        """``acks`` were answered (either way): renewed records are this consumer's to
        acknowledge again."""
        with self._lock:
            for tp, offsets in acks.items():
                renewing = self._renewing.get(tp)
                if not renewing:
                    continue
                for offset, kind in offsets.items():
                    if kind == AcknowledgeType.RENEW and offset in renewing:
                        renewing.discard(offset)
                        _spans_of(self._delivered, tp).add(offset)
                if not renewing:
                    del self._renewing[tp]

    def forget(self) -> None:
        """At close: nothing is owed any more (the session's end released it)."""
        with self._lock:
            self._delivered.clear()
            self._handed.clear()
            self._pending.clear()
            self._renewing.clear()


_OFFSET = operator.itemgetter(2)  # a ShareRecord's offset
_RENEW = int(AcknowledgeType.RENEW)  # as a plain int: compared once per acknowledgement
_NONE = OffsetSpans()  # read-only stand-in for a partition with nothing held


def _spans_of(table: dict[Any, OffsetSpans], tp: tuple[str, int]) -> OffsetSpans:
    """``tp``'s spans in ``table`` (the state's delivered or pending), made empty if none
    (the caller holds the lock)."""
    spans = table.get(tp)
    if spans is None:
        spans = table[tp] = OffsetSpans()
    return spans


def has_renew(acks: Mapping[TopicPartition, OffsetSpans]) -> bool:
    """Whether acknowledgements (taken for a request) hold a RENEW: the request must say so."""
    return any(_RENEW in offsets.kinds() for offsets in acks.values())
