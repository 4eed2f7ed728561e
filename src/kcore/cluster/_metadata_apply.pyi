"""Type stubs for the compiled metadata merge (src/kcore/cluster/_metadata_apply.pyx)."""

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

Row = TypeVar("Row", bound=tuple[Any, ...])

ROW_FIELDS: tuple[str, ...]

def partition_rows(
    topic: str,
    partitions: Sequence[Any],  # MetadataResponsePartition objects, or a StructArray of them
    cached: Mapping[int, Row] | None,
    row: type[Row],
    out: dict[int, Row],
    start: int,
    end: int,
) -> bool: ...
def rows_unchanged(
    partitions: Sequence[Any],
    cached: Mapping[int, Row],
    row: type[Row],
    start: int,
    end: int,
    cursor: int,
) -> int: ...
