"""The idempotent producer's identity and numbering: its producer id and epoch, the next
sequence of each partition, and what the sender needs to know to keep sequences in order
across retries and epoch bumps (which partitions have batches of which epoch in flight, where
a batch of the current epoch was written, whose sequence broke).

One owner for all of it (Java keeps it in its ``TransactionManager``, transactional or not):
the sender numbers and lands batches through it, the idempotent producer's InitProducerId and
the transaction coordinator's answers give it a new id or epoch. No I/O, no locks: it is used
on the producer's event loop only.
"""

from __future__ import annotations

import time
from collections import defaultdict

from kcore.types import TopicPartition

__all__ = ["IdempotenceState"]

SEQUENCE_MASK = 0x7FFFFFFF  # sequences are int32 and wrap to 0, as Java's


class IdempotenceState:
    __slots__ = (
        "_broken",
        "_in_flight",
        "_next",
        "_written",
        "assignments",
        "assigned_at",
        "epoch",
        "producer_id",
    )

    def __init__(self) -> None:
        self.producer_id = -1
        self.epoch = -1
        # How many producer ids or epochs were taken, the last when (time.monotonic(); None:
        # none yet): the statistics' epoch_cnt and idemp_stateage.
        self.assignments = 0
        self.assigned_at: float | None = None
        self._next: dict[TopicPartition, int] = defaultdict(int)
        # Batches in flight per partition: creation order -> (producer id, epoch) of their
        # sequence.
        self._in_flight: dict[TopicPartition, dict[float, tuple[int, int]]] = {}
        # Partitions where a batch of the current producer id and epoch has been written.
        self._written: set[TopicPartition] = set()
        # Partitions whose sequence broke (a numbered batch failed, or the broker saw a gap):
        # the next epoch bump renumbers their waiting batches.
        self._broken: set[TopicPartition] = set()

    @property
    def producer(self) -> tuple[int, int]:
        """The current (producer id, epoch)."""
        return self.producer_id, self.epoch

    def is_current(self, producer: tuple[int, int] | None) -> bool:
        return producer == (self.producer_id, self.epoch)

    def reset(self, producer_id: int, epoch: int) -> None:
        """A new producer id or epoch: every partition's sequence starts again at 0, and no
        partition has a batch of it written yet."""
        self.producer_id = producer_id
        self.epoch = epoch
        self.assignments += 1
        self.assigned_at = time.monotonic()
        self._next.clear()
        self._written.clear()

    def take_sequence(self, tp: TopicPartition, records: int) -> int:
        """The first sequence of a batch of ``records`` for ``tp`` (which then follows on)."""
        sequence = self._next[tp]
        self._next[tp] = (sequence + records) & SEQUENCE_MASK
        return sequence

    # -- batches in flight ------------------------------------------------------------------------

    def sent(self, tp: TopicPartition, order: float, producer: tuple[int, int]) -> None:
        """A batch (``order``: its creation order) went out numbered under ``producer``."""
        self._in_flight.setdefault(tp, {})[order] = producer

    def landed(self, tp: TopicPartition, order: float) -> None:
        """A batch came back (or will not come back): it is no longer in flight."""
        flying = self._in_flight.get(tp)
        if flying is not None:
            flying.pop(order, None)
            if not flying:
                del self._in_flight[tp]

    def older_epoch_in_flight(self, tp: TopicPartition) -> bool:
        """Whether a batch of ``tp`` numbered under an older id or epoch is in flight (they
        come back, and are renumbered, before new-epoch batches go)."""
        current = self.producer
        return any(p != current for p in self._in_flight.get(tp, {}).values())

    def earlier_in_flight(self, tp: TopicPartition, order: float) -> bool:
        """Whether a batch of ``tp`` created before ``order`` is in flight."""
        return any(o < order for o in self._in_flight.get(tp, ()))

    def in_flight_producer(self, tp: TopicPartition, order: float) -> tuple[int, int] | None:
        """The (producer id, epoch) the batch ``order`` of ``tp`` is in flight under."""
        return self._in_flight.get(tp, {}).get(order)

    # -- what the broker has of this producer -----------------------------------------------------

    def written(self, tp: TopicPartition, producer: tuple[int, int] | None) -> None:
        """A batch numbered under ``producer`` was written to ``tp``."""
        if producer == self.producer:
            self._written.add(tp)

    def has_written(self, tp: TopicPartition) -> bool:
        """Whether the leader of ``tp`` has a batch of the current id and epoch: until then it
        takes any first sequence, so a later batch could land before an earlier one."""
        return tp in self._written

    def sequence_broke(self, tp: TopicPartition) -> None:
        """``tp``'s sequences no longer follow on: the next epoch bump renumbers it."""
        self._broken.add(tp)

    def is_broken(self, tp: TopicPartition) -> bool:
        return tp in self._broken

    def take_broken(self) -> set[TopicPartition]:
        """The partitions whose sequence broke since the last call (an epoch bump renumbers
        their waiting batches)."""
        broken, self._broken = self._broken, set()
        return broken
