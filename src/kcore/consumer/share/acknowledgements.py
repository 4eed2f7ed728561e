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
import threading
from collections.abc import Iterable
from typing import Any, NamedTuple

from kcore.errors import AcknowledgementError
from kcore.types import TopicPartition

__all__ = [
    "GAP",
    "AcknowledgeType",
    "Acknowledgements",
    "AcknowledgementError",
    "ShareRecord",
    "ack_batches",
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


class Acknowledgements:
    """Owned by the share consumer core; the caller's thread and the event loop both use it, so
    every method takes the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._delivered: dict[TopicPartition, set[int]] = {}
        self._pending: dict[TopicPartition, dict[int, int]] = {}
        self._renewing: dict[TopicPartition, set[int]] = {}

    def delivered(self, records: Iterable[ShareRecord]) -> None:
        with self._lock:
            for r in records:
                self._delivered.setdefault(TopicPartition(r.topic, r.partition), set()).add(
                    r.offset
                )

    def acknowledge(self, tp: TopicPartition, offset: int, kind: int) -> None:
        with self._lock:
            owed = self._delivered.get(tp)
            if owed is None or offset not in owed:
                pending = self._pending.get(tp, {})
                if pending.get(offset) == AcknowledgeType.RENEW:
                    # A renewal not sent yet: the new acknowledgement replaces it.
                    pending[offset] = int(kind)
                    if kind != AcknowledgeType.RENEW:
                        self._renewing[tp].discard(offset)
                    return
                if offset in pending:
                    raise AcknowledgementError(
                        f"{tp.topic}-{tp.partition}@{offset} is acknowledged already"
                    )
                if offset in self._renewing.get(tp, ()):
                    raise AcknowledgementError(
                        f"{tp.topic}-{tp.partition}@{offset}: its RENEW is under way; "
                        "acknowledge it after the next poll or commit"
                    )
                raise AcknowledgementError(
                    f"{tp.topic}-{tp.partition}@{offset} was not delivered by this consumer "
                    "(or its delivery ended: acknowledged, or given up at close)"
                )
            if kind == AcknowledgeType.RENEW:
                # Still this consumer's to acknowledge once the renewal went out.
                self._renewing.setdefault(tp, set()).add(offset)
            owed.discard(offset)
            if not owed:
                del self._delivered[tp]
            self._pending.setdefault(tp, {})[offset] = int(kind)

    def acknowledge_many(self, records: Iterable[tuple[TopicPartition, int]], kind: int) -> None:
        """Each of ``records`` acknowledged as ``kind``, all or none: a record not delivered
        (its RENEW under way aside) refuses the lot. Only RENEW, or a record whose RENEW is
        not sent yet, goes one by one."""
        pairs = list(records)
        if len(set(pairs)) != len(pairs):
            raise AcknowledgementError("a record appears twice in one acknowledgement")
        refused: tuple[TopicPartition, int] | None = None
        with self._lock:
            missing = [(tp, o) for tp, o in pairs if o not in self._delivered.get(tp, ())]
            if not missing and kind != AcknowledgeType.RENEW:
                for tp, offset in pairs:
                    owed = self._delivered[tp]
                    owed.discard(offset)
                    if not owed:
                        del self._delivered[tp]
                    self._pending.setdefault(tp, {})[offset] = int(kind)
                return
            for tp, offset in missing:
                if self._pending.get(tp, {}).get(offset) != AcknowledgeType.RENEW:
                    refused = (tp, offset)
                    break
        if refused is not None:
            self.acknowledge(*refused, kind)  # raises (its record is not owed), changing nothing
        for tp, offset in pairs:
            self.acknowledge(tp, offset, kind)

    def unacknowledged(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._delivered.values())

    def settle_all(self, kind: int) -> None:
        """Every delivered record acknowledged as ``kind`` (implicit mode: ACCEPT at the next
        poll or commit; close: RELEASE)."""
        with self._lock:
            for tp, offsets in self._delivered.items():
                pending = self._pending.setdefault(tp, {})
                for offset in offsets:
                    pending[offset] = kind
            self._delivered.clear()

    def add(self, tp: TopicPartition, offsets: Iterable[int], kind: int) -> None:
        """Acknowledgements of records never delivered (gaps; a buffer released at close)."""
        with self._lock:
            pending = self._pending.setdefault(tp, {})
            for offset in offsets:
                pending[offset] = kind
            if not pending:
                del self._pending[tp]

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def pending_partitions(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._pending)

    def take(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, dict[int, int]]:
        """The pending acknowledgements of ``partitions``, removed (they are being sent)."""
        with self._lock:
            return {tp: self._pending.pop(tp) for tp in partitions if tp in self._pending}

    def sent(self, acks: dict[TopicPartition, dict[int, int]]) -> None:
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
                        self._delivered.setdefault(tp, set()).add(offset)
                if not renewing:
                    del self._renewing[tp]

    def forget(self) -> None:
        """At close: nothing is owed any more (the session's end released it)."""
        with self._lock:
            self._delivered.clear()
            self._pending.clear()
            self._renewing.clear()


def ack_batches(acks: dict[int, int], batch_type: Any) -> list[Any]:
    """Offsets and their acknowledgement types as the protocol's batches (``batch_type``: the
    ShareFetch or the ShareAcknowledge message's): runs of consecutive offsets, each with one
    type when the whole run shares it, else one type per offset."""
    out: list[Any] = []
    run: list[tuple[int, int]] = []
    for offset, kind in sorted(acks.items()):
        if run and offset != run[-1][0] + 1:
            out.append(_batch(run, batch_type))
            run = []
        run.append((offset, kind))
    if run:
        out.append(_batch(run, batch_type))
    return out


def _batch(run: list[tuple[int, int]], batch_type: Any) -> Any:
    kinds = [k for _, k in run]
    return batch_type(
        first_offset=run[0][0],
        last_offset=run[-1][0],
        acknowledge_types=kinds[:1] if len(set(kinds)) == 1 else kinds,
    )
