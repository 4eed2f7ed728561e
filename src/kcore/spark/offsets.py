"""Per-partition offsets as the JVM Kafka source spells them, and how a read is cut into ranges.

The JSON shape ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest) is that of the JVM
connector's ``startingOffsets``/``endingOffsets`` options and of its streaming checkpoints, so a
checkpoint written by one can be read by the other. Pure functions: no client, no Spark.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kcore.errors import ConfigError
from kcore.types import TopicPartition

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetRange",
    "PartitionOffsets",
    "offsets_from_dict",
    "offsets_to_dict",
    "parse_assign",
    "parse_partition_offsets",
    "split_ranges",
]

EARLIEST = -2
LATEST = -1

PartitionOffsets = dict[TopicPartition, int]

_OFFSETS_EXAMPLE = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}'
_ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[2,4]}'


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_partition_offsets(text: str, option: str) -> PartitionOffsets:
    """``{"topic": {"0": 23}}`` as a map; ``option`` names the option in the error."""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError
        out: PartitionOffsets = {}
        for topic, parts in raw.items():
            if not isinstance(parts, dict):
                raise ValueError
            for part, value in parts.items():
                if not _is_int(value):
                    raise ValueError
                out[TopicPartition(topic, int(part))] = value
        return out
    except ValueError:  # json.JSONDecodeError is one
        raise ConfigError(option, f"expected e.g. {_OFFSETS_EXAMPLE}, got {text!r}") from None


def parse_assign(text: str, option: str = "assign") -> list[TopicPartition]:
    """The ``assign`` option: ``{"topic": [0, 1]}``."""
    if not text.strip().startswith("{"):
        raise ConfigError(option, f"no topic partitions to assign in {text!r}")
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError
        out: list[TopicPartition] = []
        for topic, parts in raw.items():
            if not isinstance(parts, list) or not all(_is_int(p) for p in parts):
                raise ValueError
            out.extend(TopicPartition(topic, p) for p in parts)
        return list(dict.fromkeys(out))
    except ValueError:
        raise ConfigError(option, f"expected e.g. {_ASSIGN_EXAMPLE}, got {text!r}") from None


def offsets_to_dict(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """The JSON-ready form, topics and partitions sorted so that equal offsets serialize
    equally (Spark compares a batch's offsets as JSON text)."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def offsets_from_dict(raw: Mapping[str, Any]) -> PartitionOffsets:
    """Back from the JSON-ready form (Spark hands offsets over as ``json.loads`` output)."""
    return {
        TopicPartition(topic, int(part)): int(offset)
        for topic, parts in raw.items()
        for part, offset in parts.items()
    }


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        # An estimate of the record count: compaction and transaction markers leave gaps.
        return self.end - self.start


def _divide(rng: OffsetRange, parts: int) -> Iterator[OffsetRange]:
    """``parts`` consecutive pieces of ``rng``; the last takes the rounding remainder."""
    remaining = rng.size
    start = rng.start
    for part in range(parts):
        this = remaining // (parts - part)
        remaining -= this
        end = min(start + this, rng.end)
        yield OffsetRange(rng.topic, rng.partition, start, end)
        start = end


def _part_count(size: int, total: int, min_parts: int) -> int:
    # Scala's math.round rounds halves up; Python's round() would round them to even.
    return max(math.floor(size / total * min_parts + 0.5), 1)


def split_ranges(
    ranges: Iterable[OffsetRange],
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[OffsetRange]:
    """Spark partitions for ``ranges``, as the JVM source's KafkaOffsetRangeCalculator cuts
    them: empty ranges dropped; each range cut into pieces of at most
    ``max_records_per_partition`` offsets; then, while there are fewer than ``min_partitions``
    ranges, the large ones cut in proportion to their size (small ones stay whole), so that
    there are about ``min_partitions``."""
    out = [r for r in ranges if r.size > 0]
    if max_records_per_partition is not None:
        out = [p for r in out for p in _divide(r, -(-r.size // max_records_per_partition))]
    if min_partitions is None or min_partitions <= len(out):
        return out
    total = sum(r.size for r in out)
    unsplit = [_part_count(r.size, total, min_partitions) == 1 for r in out]
    split_total = total - sum(r.size for r, keep in zip(out, unsplit, strict=True) if keep)
    split_min = max(min_partitions - sum(unsplit), 1)
    pieces: list[OffsetRange] = []
    for r, keep in zip(out, unsplit, strict=True):
        parts = 1 if keep else _part_count(r.size, split_total, split_min)
        pieces.extend(_divide(r, parts))
    return [p for p in pieces if p.size > 0]
