"""Choosing a partition the way the Java producer does.

Keyed records: ``toPositive(murmur2(key)) % partitions`` (the compiled codec computes it), so
they land where Java, librdkafka's ``murmur2_random`` and kafka-python put them. Records without
a key: the uniform sticky partitioner (KIP-480, KIP-794): stay on one partition until about
``batch.size`` bytes went to it, then move to another at random among those with a leader,
so batches fill up instead of one record going to each partition.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kcore.codec import partition_for_key

__all__ = ["Partitioner", "StickyPartitioner"]

# A user's partitioner: (topic, key bytes or None, value, number of partitions) -> partition.
Partitioner = Callable[[str, Any, Any, int], int]


class StickyPartitioner:
    def __init__(self, batch_size: int, ignore_keys: bool = False) -> None:
        self.batch_size = max(1, batch_size)
        self.ignore_keys = ignore_keys
        self._lock = threading.Lock()
        self._sticky: dict[str, tuple[int, int]] = {}  # topic -> (partition, bytes so far)

    def partition(
        self, topic: str, key: Any, size: int, partitions: int, available: Sequence[int]
    ) -> int:
        if key is not None and not self.ignore_keys:
            if isinstance(key, str):
                key = key.encode("utf-8")
            return partition_for_key(key, partitions)
        return self.sticky(topic, size, partitions, available)

    def sticky(self, topic: str, size: int, partitions: int, available: Sequence[int]) -> int:
        with self._lock:
            current = self._sticky.get(topic)
            if current is None or current[0] >= partitions or current[1] >= self.batch_size:
                current = (self._next(current, partitions, available), 0)
            partition, produced = current
            self._sticky[topic] = (partition, produced + size)
            return partition

    @staticmethod
    def _next(current: tuple[int, int] | None, partitions: int, available: Sequence[int]) -> int:
        choices = [p for p in available if p < partitions] or list(range(partitions))
        if current is not None and len(choices) > 1:
            choices = [p for p in choices if p != current[0]] or choices
        return random.choice(choices)
