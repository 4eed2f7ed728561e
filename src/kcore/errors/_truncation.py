"""The consumer's log-truncation error (KIP-320): a subclass of the generated
``OffsetOutOfRangeError``, so it lives apart from the bases that module builds on."""

from __future__ import annotations

from typing import Any

from ._codes import OffsetOutOfRangeError


class LogTruncationError(OffsetOutOfRangeError):
    """The log was truncated below a consumed position (an unclean leader election), and
    ``auto.offset.reset`` is ``none`` (Java's ``LogTruncationException``). ``partitions`` maps
    each partition to its position, as ``OffsetOutOfRangeError``'s do; ``divergent_offsets``
    to ``(offset, leader_epoch)``, the first offset the new leader does not share, or None
    when the leader could not say. The position stays until the caller seeks."""

    def __init__(
        self,
        message: str | None = None,
        partitions: dict[Any, int] | None = None,
        divergent_offsets: dict[Any, tuple[int, int] | None] | None = None,
    ) -> None:
        super().__init__(message)
        self.partitions = dict(partitions or {})
        self.divergent_offsets = dict(divergent_offsets or {})
