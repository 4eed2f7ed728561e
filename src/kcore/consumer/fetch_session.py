"""The client side of a fetch session (KIP-227), free of I/O.

A consumer keeps one session with each broker it fetches from. The first (full) request names
every partition and asks the broker for a session; later (incremental) requests name only the
partitions whose fetch position, leader epoch or size limit changed, plus the partitions to
forget, and the broker answers only for partitions with something new. On a session error, a
failed request or an unanswered one, the next request is a full one again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kcore.errors import ErrorCode
from kcore.types import TopicPartition

__all__ = ["FINAL_EPOCH", "FetchPlan", "FetchSession", "PartitionFetch", "SESSION_ERROR_CODES"]

# The broker lost or does not know our session: start a new one.
SESSION_ERROR_CODES = frozenset(
    {ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH}
)
FIRST_SESSION_VERSION = 7  # Fetch v7 added session ids and epochs
INITIAL_EPOCH = 0  # "full request; create a session"
NO_SESSION_EPOCH = -1  # "full request; no session"
FINAL_EPOCH = -1  # with a session id: "close this session"
MAX_EPOCH = 2**31 - 1


class PartitionFetch(NamedTuple):
    """What a fetch asks of one partition."""

    fetch_offset: int
    leader_epoch: int
    max_bytes: int


class FetchPlan(NamedTuple):
    """One request's worth: the session fields, the partitions to name, those to forget."""

    session_id: int
    epoch: int
    send: dict[TopicPartition, PartitionFetch]
    forget: list[TopicPartition]
    full: bool


@dataclass
class FetchSession:
    """One broker's session. ``plan`` a request, send it, then ``on_response`` or ``on_failure``
    (exactly one request in flight per session, as the fetcher keeps one per broker)."""

    node_id: int
    session_id: int = 0
    epoch: int = INITIAL_EPOCH
    # What the broker holds for us once the request in flight succeeds.
    partitions: dict[TopicPartition, PartitionFetch] = field(default_factory=dict)
    _pending: dict[TopicPartition, PartitionFetch] | None = None
    topic_ids: dict[str, Any] = field(default_factory=dict)  # the ids the session names

    def plan(self, wanted: dict[TopicPartition, PartitionFetch], version: int) -> FetchPlan:
        self._pending = dict(wanted)
        if version < FIRST_SESSION_VERSION:
            self.session_id, self.epoch = 0, INITIAL_EPOCH
            return FetchPlan(0, NO_SESSION_EPOCH, dict(wanted), [], True)
        if self.session_id == 0 or self.epoch == INITIAL_EPOCH:
            return FetchPlan(0, INITIAL_EPOCH, dict(wanted), [], True)
        send = {tp: f for tp, f in wanted.items() if self.partitions.get(tp) != f}
        forget = [tp for tp in self.partitions if tp not in wanted]
        return FetchPlan(self.session_id, self.epoch, send, forget, False)

    def on_response(self, error_code: int, session_id: int) -> bool:
        """Record the broker's answer; False when the session is gone (the partitions' data in
        that response, if any, is still good only when the error code is 0)."""
        if error_code:
            self.reset()
            return False
        self.partitions = self._pending or {}
        self._pending = None
        if self.epoch == INITIAL_EPOCH or self.session_id == 0:
            self.session_id = session_id
            self.epoch = 1 if session_id else INITIAL_EPOCH
        else:
            self.epoch = 1 if self.epoch >= MAX_EPOCH else self.epoch + 1
        return True

    def on_failure(self) -> None:
        """The request failed or went unanswered: the broker's state is unknown."""
        self.reset()

    def reset(self) -> None:
        """Next request is a full one asking for a new session (the broker evicts the old)."""
        self.session_id, self.epoch = 0, INITIAL_EPOCH
        self.partitions = {}
        self._pending = None
        self.topic_ids = {}
