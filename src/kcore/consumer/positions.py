"""Positions: each assigned partition's state, as Java's ``SubscriptionState``: the position
(the next offset ``poll`` hands out) with its leader epochs (KIP-320), whether the partition is
paused, a pending reset (``seek_to_beginning``/``seek_to_end``, or a lookup of the group's
committed offset), and the fetcher's bookkeeping of what it read ahead of the position.

:class:`Positions` owns the states and the one lock that guards them. ``poll`` (the caller's
thread), the caller's ``seek``/``pause``/``assign`` and the fetcher (the event loop) read and
change them through it; work that must see a partition's state and the fetch buffer together
(a seek dropping what was read ahead, a response queued only if still wanted) holds
:meth:`Positions.locked` around both (lock order: positions, then the fetch buffer).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from kcore.consumer.fetch_buffer import FetchedData
from kcore.consumer.validation import ValidationAsk
from kcore.errors import KcoreError
from kcore.types import TopicPartition

__all__ = ["OffsetsView", "PartitionState", "Positions"]


class OffsetsView(NamedTuple):
    """A partition's offsets at one moment (what :meth:`Positions.offsets` reads)."""

    tp: TopicPartition
    position: int | None  # the next offset poll hands out (None: being looked up)
    next_fetch: int | None  # where the next fetch starts
    high_watermark: int  # as the last fetch saw it (-1: not yet)
    lag_end: int  # the high watermark, read_committed the last stable offset (-1: not yet)
    queued_bytes: int  # fetched and waiting for poll

    @property
    def lag(self) -> int | None:
        """records-lag: how far the position is behind ``lag_end``; None when not known."""
        if self.lag_end < 0 or self.position is None:
            return None
        return max(0, self.lag_end - self.position)


@dataclass
class PartitionState:
    position: int | None = None  # next offset to hand out; None: reset per auto.offset.reset
    paused: bool = False
    fetch_position: int | None = None  # where the next fetch starts; None: at ``position``
    queued: int = 0  # responses of it waiting in the queue
    queued_bytes: int = 0
    high_watermark: int = -1
    # Where lag is measured to: the high watermark, or read_committed the last stable offset
    # (as Java's records-lag and currentLag).
    lag_end: int = -1
    reset_to: str | None = None  # a pending seek_to_beginning/end ("earliest"/"latest")
    batch_bytes: int = 0  # size of the next batch, when the last fetch got only part of it
    # The fetch offset of the last answer that held only part of a batch (-1: none since the
    # last whole one): the same again, when the whole batch could have come, is an error.
    partial_at: int = -1
    # The fetch offset of the last answer whose whole batches all ended before it (-1: none
    # since one that made progress), and how many such answers came in a row: a few are
    # retried after a backoff, then each is an error (the fetcher's NO_PROGRESS_ANSWERS).
    behind_at: int = -1
    behind_answers: int = 0
    served: int = 0  # when it last had data queued (fetch order: longest waiting first)
    # With a group.id (assigned by hand or by the group): start from the group's committed
    # offset, if any, before auto.offset.reset (as Java does).
    from_committed: bool = False
    errors: int = 0  # fetch errors in a row (its backoff grows with them)
    retry_at: float = 0.0  # after a fetch error: not fetched again before (time.monotonic())
    # KIP-320, as Java's FetchPosition: the leader epoch of the record before ``position``
    # (-1: unknown), and the partition leader's epoch the position is known to be valid
    # under. When the metadata names a newer leader epoch, the position is validated with
    # OffsetsForLeaderEpoch before the partition is fetched again (see validation.py).
    offset_epoch: int = -1
    leader_epoch: int = -1
    validating: ValidationAsk | None = None  # the OffsetsForLeaderEpoch question out for it

    def seek(self, position: int | None, reset_to: str | None = None) -> None:
        """A new position (None: look one up), with no epoch: not validated (as Java's
        seek without a leader epoch)."""
        self.position, self.reset_to = position, reset_to
        self.offset_epoch = self.leader_epoch = -1
        self.validating = None
        self.behind_at, self.behind_answers = -1, 0  # a seek gives a stuck offset a new try

    def read_to(self, offset: int) -> bool:
        """Whether a fetch from ``offset`` is known to find nothing yet: the last answer's high
        watermark (read_committed: last stable offset) is not past it."""
        return 0 <= self.lag_end <= offset

    def unvalidated(self, current_leader_epoch: int) -> bool:
        """Whether the position must be checked under the leader of ``current_leader_epoch``
        before more of the partition is fetched or handed out: it has an epoch, and the leader
        changed since it was known valid (as Java's, any change: the metadata cache refuses
        older epochs, but a re-created topic starts again at 0)."""
        return (
            self.offset_epoch >= 0
            and self.position is not None
            and current_leader_epoch >= 0
            and current_leader_epoch != self.leader_epoch
        )

    def took(self, data: FetchedData, position: int) -> None:
        """``poll`` handed out ``data`` up to ``position``: the position takes the epoch of
        the record before it and is valid under the leader epoch the data was fetched under
        (older than the current one if the leader changed since: then it is checked)."""
        self.position = position
        self.offset_epoch = data.epoch_at(position - 1)
        self.leader_epoch = data.leader_epoch


class Positions:
    """The assigned partitions' states (insertion order: the assignment's), thread-safe."""

    def __init__(self) -> None:
        self._states: dict[TopicPartition, PartitionState] = {}
        self._lock = threading.RLock()

    def locked(self) -> threading.RLock:
        """Held (``with positions.locked():``) to read or change several partitions, or a
        partition together with the fetch buffer, at once; every method takes it too."""
        return self._lock

    # -- reading --------------------------------------------------------------------------------

    def get(self, tp: TopicPartition) -> PartitionState | None:
        with self._lock:
            return self._states.get(tp)

    def require(self, tp: TopicPartition) -> PartitionState:
        """``tp``'s state; ``KcoreError`` when it is not assigned."""
        with self._lock:
            st = self._states.get(tp)
        if st is None:
            raise KcoreError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return st

    def __contains__(self, tp: object) -> bool:
        with self._lock:
            return tp in self._states

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[TopicPartition]:
        """The assigned partitions (a copy)."""
        with self._lock:
            return iter(list(self._states))

    def items(self) -> list[tuple[TopicPartition, PartitionState]]:
        with self._lock:
            return list(self._states.items())

    def partitions(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._states)

    def paused(self) -> set[TopicPartition]:
        with self._lock:
            return {tp for tp, st in self._states.items() if st.paused}

    def lacking_position(self) -> bool:
        """Some partition waits for a position (a reset or a committed offset lookup)."""
        with self._lock:
            return any(st.position is None for st in self._states.values())

    def for_commit(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """The positions to commit, of the partitions that have one: each with the leader
        epoch of the record before it (-1: unknown), read together (KIP-320)."""
        with self._lock:
            out = {}
            for tp in partitions:
                st = self._states.get(tp)
                if st is not None and st.position is not None:
                    out[tp] = (st.position, st.offset_epoch)
            return out

    def lag(self, tp: TopicPartition) -> int | None:
        """How far ``tp``'s position is behind its high watermark (read_committed: its last
        stable offset) as the last fetch saw it; None when not known."""
        with self._lock:
            st = self._states.get(tp)
            if st is None or st.lag_end < 0 or st.position is None:
                return None
            return max(0, st.lag_end - st.position)

    def offsets(self) -> list[OffsetsView]:
        """Each assigned partition's offsets as they are now (statistics, per-partition
        metrics), read together."""
        with self._lock:
            return [
                OffsetsView(
                    tp,
                    st.position,
                    st.fetch_position if st.fetch_position is not None else st.position,
                    st.high_watermark,
                    st.lag_end,
                    st.queued_bytes,
                )
                for tp, st in self._states.items()
            ]

    # -- changing -------------------------------------------------------------------------------

    def assign(
        self, partitions: Iterable[TopicPartition], fresh: Callable[[], PartitionState]
    ) -> None:
        """Exactly ``partitions`` from now on: those kept keep their state, new ones get
        ``fresh()``."""
        with self._lock:
            old = self._states
            self._states = {tp: old.get(tp) or fresh() for tp in partitions}

    def add(self, tp: TopicPartition, state: PartitionState) -> None:
        """``tp`` (again) with ``state``."""
        with self._lock:
            self._states[tp] = state

    def remove(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` was assigned."""
        with self._lock:
            return self._states.pop(tp, None) is not None

    def set_paused(self, partitions: Iterable[TopicPartition], paused: bool) -> None:
        """``KcoreError`` at the first one not assigned."""
        with self._lock:
            for tp in partitions:
                self.require(tp).paused = paused
