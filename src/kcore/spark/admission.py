"""Streaming admission control as the JVM Kafka source does it: ``maxOffsetsPerTrigger`` split
over partitions in proportion to their backlog, ``minOffsetsPerTrigger`` with
``maxTriggerDelay``. Pure functions of offsets and clock readings."""

from __future__ import annotations

import math
from collections.abc import Mapping

from kcore.types import TopicPartition

__all__ = ["delay_batch", "rate_limit"]


def rate_limit(
    limit: int,
    start: Mapping[TopicPartition, int],
    until: Mapping[TopicPartition, int],
    new_start: Mapping[TopicPartition, int],
) -> dict[TopicPartition, int]:
    """End offsets that admit about ``limit`` offsets in all, each partition getting its share
    of the backlog ``until - start`` (``new_start`` gives the start of partitions that
    ``start`` lacks). A partition with a backlog gets at least one offset."""
    sizes: dict[TopicPartition, int] = {}
    for tp, end in until.items():
        begin = start.get(tp, new_start.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = sum(sizes.values())
    if total < 1:
        return dict(until)
    out: dict[TopicPartition, int] = {}
    for tp, end in until.items():
        size = sizes.get(tp)
        if size is None:
            out[tp] = end
            continue
        begin = start.get(tp, new_start.get(tp))
        assert begin is not None  # a size exists only where a begin does
        prorate = limit * (size / total)
        # Don't starve small partitions: below one offset, round up.
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, begin + share)
    return out


def delay_batch(
    min_offsets: int,
    latest: Mapping[TopicPartition, int],
    start: Mapping[TopicPartition, int],
    max_delay_ms: int,
    last_trigger_ms: int,
    now_ms: int,
) -> tuple[bool, int]:
    """Whether to skip this trigger because fewer than ``min_offsets`` offsets are waiting,
    and the new last-trigger time. Once ``max_delay_ms`` passed since the last batch, a batch
    runs whatever the backlog (a new partition counts from offset 0, as the JVM source does)."""
    if now_ms - last_trigger_ms >= max_delay_ms:
        return False, now_ms
    waiting = sum(end - start.get(tp, 0) for tp, end in latest.items())
    if waiting < min_offsets:
        return True, last_trigger_ms
    return False, now_ms
