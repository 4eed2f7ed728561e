"""Position validation after a leader change (KIP-320), without I/O.

A consumer's position carries the leader epoch of the record before it. When the partition
gets a new leader, the fetcher asks it (OffsetsForLeaderEpoch) where that epoch ends in its
log. If it ends below the position, the log was truncated under the consumer (an unclean
leader election) and records it read are gone: as Java, the consumer goes back to where the
logs diverge when it has an ``auto.offset.reset`` policy, and raises ``LogTruncationError``
under ``none``. :func:`judge` makes that decision; the fetcher sends and applies.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Diverged", "Truncated", "ValidationAsk", "judge"]


class ValidationAsk(NamedTuple):
    position: int  # the position being checked
    offset_epoch: int  # the leader epoch of the record before it
    current_leader_epoch: int  # the leader epoch the metadata names (fences stale leaders)


class Diverged(NamedTuple):
    """Truncation found: resume at ``offset`` (``epoch`` its leader epoch), where the new
    leader's log leaves the one read; ``offset`` -1: the leader does not know the epoch, so
    the divergence point is unknown (reset by ``auto.offset.reset``)."""

    offset: int
    epoch: int


class Truncated(NamedTuple):
    """Truncation found and ``auto.offset.reset`` is ``none``: the caller decides."""

    divergent: Diverged


def judge(
    ask: ValidationAsk, end_offset: int, end_epoch: int, reset_policy: str
) -> None | Diverged | Truncated:
    """The outcome of a validation: None (the position is valid), ``Diverged`` (seek there)
    or ``Truncated`` (report). ``end_offset``/``end_epoch``: the leader's answer, the end of
    the largest epoch it has at or below ``ask.offset_epoch`` (-1 when it has none)."""
    if end_offset < 0 or end_epoch < 0:
        found = Diverged(-1, -1)
    elif end_offset < ask.position:
        found = Diverged(end_offset, end_epoch)
    else:
        return None
    return Truncated(found) if reset_policy == "none" else found
