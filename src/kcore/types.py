"""Basic values every client layer shares: partitions, offsets, group identity.

Rule: this module imports only ``kcore.errors``; cluster, producer, consumer, admin, spark and
cli all import from here, never from each other for these names.
"""

from __future__ import annotations

from typing import NamedTuple

from kcore.errors import KcoreError

__all__ = [
    "ConsumerGroupMetadata",
    "ListOffsetsResult",
    "OffsetSpec",
    "TopicPartition",
]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class ConsumerGroupMetadata(NamedTuple):
    """A group member's identity, as a transactional producer's ``send_offsets_to_transaction``
    needs it so that a zombie member's offsets are fenced (KIP-447)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class OffsetSpec:
    """What ``list_offsets`` asks for: ``"earliest"``, ``"latest"``, ``"max_timestamp"``, or an
    int timestamp (ms) for the first offset at or after it."""

    EARLIEST = -2
    LATEST = -1
    MAX_TIMESTAMP = -3
    NAMES = {"earliest": EARLIEST, "latest": LATEST, "max_timestamp": MAX_TIMESTAMP}

    @classmethod
    def timestamp_for(cls, spec: str | int) -> int:
        if isinstance(spec, bool):
            raise KcoreError(f"not an offset spec: {spec!r}")
        if isinstance(spec, int):
            if spec < 0:
                raise KcoreError(f"a timestamp offset spec must be >= 0, got {spec}")
            return spec
        try:
            return cls.NAMES[spec]
        except KeyError:
            raise KcoreError(
                f"unknown offset spec {spec!r}: use earliest, latest, max_timestamp or a timestamp"
            ) from None


class ListOffsetsResult(NamedTuple):
    offset: int
    timestamp: int
    leader_epoch: int
