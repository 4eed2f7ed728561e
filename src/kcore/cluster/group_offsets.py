"""Committed offsets of a group: OffsetCommit and OffsetFetch against the group coordinator,
with the recovery the protocol asks for (re-discover a moved coordinator, back off while it
loads, fail a commit for good when the group has moved on). Used by the consumer's group and
by the admin client (whose commits come from outside any membership)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kcore.cluster.coordinator import CoordinatorLink
from kcore.errors import (
    BrokerConnectionError,
    CommitFailedError,
    ErrorCode,
    KafkaError,
    KcoreTimeoutError,
    RebalanceInProgressError,
    error_for_code,
    error_name,
)
from kcore.network.retry import RetryPacing
from kcore.protocol import ApiKey
from kcore.protocol.messages.offset_commit_request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kcore.protocol.messages.offset_fetch_request import (
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchRequestTopic,
    OffsetFetchRequestTopics,
)
from kcore.types import TopicPartition

log = logging.getLogger("kcore.cluster.group_offsets")

# The group moved on without this member: its commit can never succeed.
REBALANCED_CODES = frozenset(
    {ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH}
)


@dataclass(frozen=True)
class MemberIdentity:
    """Who commits: a member of the current generation (classic) or epoch (KIP-848), or a
    consumer outside any group membership (generation -1, member id '')."""

    generation: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class GroupOffsets:
    def __init__(self, link: CoordinatorLink, group_id: str) -> None:
        self.link = link
        self.group_id = group_id
        # The committed offset of each partition as last committed or fetched by this client
        # (the statistics' committed_offset). Only kept while statistics are on: None.
        self.known_committed: dict[TopicPartition, int] | None = None

    def keep_committed(self) -> None:
        """Keep the committed offsets seen from now on (statistics on)."""
        if self.known_committed is None:
            self.known_committed = {}

    def committed_offset(self, tp: TopicPartition) -> int | None:
        """``tp``'s committed offset as this client last committed or fetched it."""
        known = self.known_committed
        return None if known is None else known.get(tp)

    async def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        member: MemberIdentity,
        timeout: float | None,
        metadata: str | None = "",
        epochs: Mapping[TopicPartition, int] | None = None,
    ) -> None:
        """Commit ``offsets`` (the next offsets to read) with, from ``epochs``, the leader
        epoch of the record before each (KIP-320: a later reader checks the log was not
        truncated below it). Raises ``CommitFailedError`` when the group rebalanced since, and
        the partition's Kafka error for any other failure."""
        if not offsets:
            return
        by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
        for tp, offset in offsets.items():
            by_topic.setdefault(tp.topic, []).append(
                OffsetCommitRequestPartition(
                    partition_index=tp.partition,
                    committed_offset=offset,
                    committed_leader_epoch=-1 if epochs is None else epochs.get(tp, -1),
                    committed_metadata=metadata,
                )
            )
        request = OffsetCommitRequest(
            group_id=self.group_id,
            generation_id_or_member_epoch=member.generation,
            member_id=member.member_id,
            group_instance_id=member.group_instance_id,
            topics=[OffsetCommitRequestTopic(name=t, partitions=p) for t, p in by_topic.items()],
        )
        backoff = RetryPacing.within(timeout, self.link.cluster.retry_backoff)
        await self.link.cluster.ready(backoff.left())  # BootstrapError at the call's bound
        started = time.monotonic()
        while True:
            try:
                # v10 names topics by id; names keep this independent of the metadata.
                response = await self.link.send(request, max_version=9)
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                if not await backoff.pause():
                    raise KcoreTimeoutError(f"offset commit of {self.group_id!r}: {exc}") from exc
                continue
            codes = {
                p.error_code
                for t in response.topics
                for p in t.partitions
                if p.error_code != ErrorCode.NONE
            }
            if not codes:
                # Java's consumer-coordinator-metrics: a commit and how long it took.
                elapsed_ms = (time.monotonic() - started) * 1000
                self.link.cluster.metrics.record("commit-latency", elapsed_ms)
                if self.known_committed is not None:
                    self.known_committed.update(offsets)
                return
            code = next(iter(codes))
            if ErrorCode.REBALANCE_IN_PROGRESS in codes:
                # As Java: retriable once a poll has completed the rebalance (if the
                # partitions are still this member's).
                raise RebalanceInProgressError(
                    f"offset commit of group {self.group_id!r}: the group is rebalancing; "
                    "poll to rejoin, then commit again"
                )
            if any(c in REBALANCED_CODES for c in codes):
                raise CommitFailedError(
                    f"offset commit of group {self.group_id!r} failed: the group rebalanced "
                    f"({error_name(code)}) and the partitions may belong to another member now"
                )
            retry = all(
                self.link.handle_error(c) or c == ErrorCode.STALE_MEMBER_EPOCH or _retriable(c)
                for c in codes
            )
            if not retry or not await backoff.pause():
                err = error_for_code(code)
                assert err is not None
                raise err.with_message(f"offset commit of group {self.group_id!r}: {err.message}")

    async def fetch(
        self,
        partitions: Iterable[TopicPartition] | None,
        timeout: float | None,
        require_stable: bool = True,
    ) -> dict[TopicPartition, int | None]:
        """The committed offsets of ``partitions`` (None: nothing committed; ``partitions``
        None: every partition the group has an offset for). With ``require_stable`` a
        partition with offsets in an open transaction waits (KIP-447)."""
        found = await self.fetch_with_epochs(partitions, timeout, require_stable)
        return {tp: None if c is None else c[0] for tp, c in found.items()}

    async def fetch_with_epochs(
        self,
        partitions: Iterable[TopicPartition] | None,
        timeout: float | None,
        require_stable: bool = True,
    ) -> dict[TopicPartition, tuple[int, int] | None]:
        """As :meth:`fetch`, each offset with its committed leader epoch (-1: none)."""
        tps = None if partitions is None else list(partitions)
        if tps == []:
            return {}
        by_topic: dict[str, list[int]] | None = None
        if tps is not None:
            by_topic = {}
            for tp in tps:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
        backoff = RetryPacing.within(timeout, self.link.cluster.retry_backoff)
        await self.link.cluster.ready(backoff.left())  # BootstrapError at the call's bound
        while True:
            try:
                version = await self.link.version(ApiKey.OFFSET_FETCH, max_version=9)
                request = self._fetch_request(by_topic, version, require_stable)
                response = await self.link.send(request, version)
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                if not await backoff.pause():
                    raise KcoreTimeoutError(
                        f"committed offsets of {self.group_id!r}: {exc}"
                    ) from exc
                continue
            if version >= 8:
                group = response.groups[0]
                top_code, topics = group.error_code, group.topics
            else:
                top_code, topics = response.error_code, response.topics
            codes = {top_code} if top_code else set()
            out: dict[TopicPartition, tuple[int, int] | None] = {}
            for t in topics:
                for p in t.partitions:
                    if p.error_code:
                        codes.add(p.error_code)
                    offset = p.committed_offset
                    out[TopicPartition(t.name, p.partition_index)] = (
                        (offset, p.committed_leader_epoch) if offset >= 0 else None
                    )
            if not codes:
                if self.known_committed is not None:
                    self.known_committed.update((tp, c[0]) for tp, c in out.items() if c)
                return out if tps is None else {tp: out.get(tp) for tp in tps}
            code = next(iter(codes))
            # UNSTABLE_OFFSET_COMMIT: a transaction holding offsets for it is still open.
            retry = all(
                self.link.handle_error(c) or c == ErrorCode.UNSTABLE_OFFSET_COMMIT or _retriable(c)
                for c in codes
            )
            if not retry or not await backoff.pause():
                err = error_for_code(code)
                assert err is not None
                raise err.with_message(
                    f"committed offsets of group {self.group_id!r}: {err.message}"
                )

    def _fetch_request(
        self, by_topic: dict[str, list[int]] | None, version: int, require_stable: bool
    ) -> OffsetFetchRequest:
        # topics None: all of the group's (v2+)
        if version >= 8:
            group = OffsetFetchRequestGroup(
                group_id=self.group_id,
                topics=None
                if by_topic is None
                else [
                    OffsetFetchRequestTopics(name=t, partition_indexes=p)
                    for t, p in by_topic.items()
                ],
            )
            return OffsetFetchRequest(groups=[group], require_stable=require_stable)
        return OffsetFetchRequest(
            group_id=self.group_id,
            topics=None
            if by_topic is None
            else [
                OffsetFetchRequestTopic(name=t, partition_indexes=p) for t, p in by_topic.items()
            ],
            require_stable=require_stable,
        )


def _retriable(code: int) -> bool:
    err = error_for_code(code)
    return isinstance(err, KafkaError) and err.retriable


__all__ = ["GroupOffsets", "MemberIdentity"]
