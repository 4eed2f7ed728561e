"""Offset lookup (ListOffsets), for every client that needs it: the consumer's resets and
``beginning_offsets``/``end_offsets``/``offsets_for_times``, and the admin's ``list_offsets``.

Each partition is asked of its leader, under the caller's isolation level and with the leader
epoch the metadata names (so a stale leader answers FENCED_LEADER_EPOCH instead of an old
offset). A leader that moved mid-call is found again and asked; partitions without a leader
are retried while the others are asked at once (as Java's PartitionLeaderStrategy). What
fails for good is returned per partition in :class:`OffsetLookup`, beside what answered.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from kcore.cluster.client import ClusterClient
from kcore.errors import (
    AdminOperationError,
    BrokerConnectionError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    LeaderNotAvailableError,
    error_for_code,
)
from kcore.network.retry import Deadline, retry
from kcore.protocol import ApiKey
from kcore.protocol.messages import ListOffsetsRequest
from kcore.protocol.messages.list_offsets_request import ListOffsetsPartition, ListOffsetsTopic
from kcore.types import ListOffsetsResult, OffsetSpec, TopicPartition

__all__ = ["ISOLATION_LEVELS", "OffsetLookup", "OffsetLookupError", "list_offsets"]

ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}
MAX_TIMESTAMP_VERSION = 7  # the first ListOffsets version that answers max_timestamp


class OffsetLookupError(AdminOperationError):
    """Some partitions' offsets could not be looked up: ``errors`` names why for each,
    ``results`` holds the partitions that answered. An ``AdminOperationError``, as the
    admin's ``list_offsets`` raises it."""

    def __init__(
        self,
        errors: Mapping[TopicPartition, KcoreError],
        results: Mapping[TopicPartition, ListOffsetsResult],
    ) -> None:
        super().__init__("list_offsets", errors, dict(results))


@dataclass
class OffsetLookup:
    """The outcome of :func:`list_offsets`: each partition is in ``offsets`` or in
    ``errors`` (the broker's ``KafkaError``, or what kept it from an answer)."""

    offsets: dict[TopicPartition, ListOffsetsResult] = field(default_factory=dict)
    errors: dict[TopicPartition, KcoreError] = field(default_factory=dict)

    def result(self) -> dict[TopicPartition, ListOffsetsResult]:
        """The offsets, or ``OffsetLookupError`` when some partition failed."""
        if self.errors:
            raise OffsetLookupError(self.errors, self.offsets)
        return self.offsets


async def list_offsets(
    cluster: ClusterClient,
    specs: Mapping[TopicPartition | tuple[str, int], str | int],
    *,
    isolation_level: int,
    timeout: float,
    partial: bool = False,
) -> OffsetLookup:
    """The offset each spec names (see ``OffsetSpec``), asked of each partition's leader,
    retrying what may heal (no leader yet, a leader moved, a broker down) until ``timeout``.
    ``partial``: one round; retriable failures are not waited out but returned with the
    others, for a caller that retries them itself (the consumer's offset reset, which must
    not hold up other partitions' resets meanwhile). Raises only when the whole call failed
    before any partition had an outcome."""
    wanted = {TopicPartition(*tp): OffsetSpec.timestamp_for(s) for tp, s in specs.items()}
    found = OffsetLookup()
    results, final_errors = found.offsets, found.errors
    deadline = Deadline(timeout)

    async def attempt() -> None:
        pending = {
            tp: ts for tp, ts in wanted.items() if tp not in results and tp not in final_errors
        }
        if not pending:
            return
        # Just inside the call's deadline, so that a topic that never appears is named in
        # the timeout error (the call's own timeout would cut this wait short, unnamed).
        left = max(0.0, deadline.remaining() - 0.05)
        md = await cluster.wait_for_topics({tp.topic for tp in pending}, left, ())
        by_leader: dict[int, dict[TopicPartition, int]] = defaultdict(dict)
        again: dict[TopicPartition, KcoreError] = {}
        for tp, ts in pending.items():
            part = md.partition(tp.topic, tp.partition)
            if part is None:
                final_errors[tp] = (
                    error_for_code(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) or KafkaError()
                )
            elif part.leader < 0 or part.leader not in md.brokers:
                why = "has no leader"
                if part.leader in md.unusable_brokers:
                    why = (
                        f"has no leader that can be reached: broker {part.leader} is listed at "
                        f"an address that cannot be dialled ({md.unusable_brokers[part.leader]})"
                    )
                again[tp] = LeaderNotAvailableError(f"{tp.topic}-{tp.partition} {why}")
            else:
                by_leader[part.leader][tp] = ts
        nodes = list(by_leader)
        outcomes = await asyncio.gather(
            *(_list_offsets_at(cluster, n, by_leader[n], isolation_level) for n in nodes),
            return_exceptions=True,
        )
        for node, outcome in zip(nodes, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, (BrokerConnectionError, KcoreTimeoutError, KafkaError)):
                    raise outcome
                again.update(dict.fromkeys(by_leader[node], outcome))
                continue
            got, errors = outcome
            results.update(got)
            for tp in by_leader[node]:
                if tp not in got and tp not in errors:
                    # Asked again, as Java does: a partition the answer left out has no
                    # outcome yet (it was dropped from the result, silently).
                    again[tp] = KcoreTimeoutError(
                        f"node {node}'s ListOffsets answer left out {tp.topic}-{tp.partition}"
                    )
            for tp, err in errors.items():
                if err.retriable:
                    again[tp] = err
                else:
                    final_errors[tp] = err
        if again and partial:
            final_errors.update(again)  # the caller retries these (after what answered)
        elif again:
            cluster.cache.request_update()
            raise next(iter(again.values()))

    try:
        await retry(
            "list_offsets",
            attempt,
            deadline=deadline,
            backoff=cluster.retry_backoff,
            before_retry=lambda _exc: cluster.cache.request_update(),
        )
    except (KafkaError, BrokerConnectionError, KcoreTimeoutError) as exc:
        if not results and not final_errors:
            raise
        # The answers already in are kept; the rest fail with what stopped them.
        for tp in wanted:
            if tp not in results and tp not in final_errors:
                final_errors[tp] = exc
    return found


async def _list_offsets_at(
    cluster: ClusterClient, node: int, parts: Mapping[TopicPartition, int], level: int
) -> tuple[dict[TopicPartition, ListOffsetsResult], dict[TopicPartition, KafkaError]]:
    """One ListOffsets request to the leader ``node``: its answers and its partitions' errors."""
    md = cluster.metadata
    by_topic: dict[str, list[ListOffsetsPartition]] = defaultdict(list)
    for tp, ts in parts.items():
        info = md.partition(tp.topic, tp.partition)
        epoch = info.leader_epoch if info is not None else -1
        by_topic[tp.topic].append(
            ListOffsetsPartition(
                partition_index=tp.partition, current_leader_epoch=epoch, timestamp=ts
            )
        )
    min_version = MAX_TIMESTAMP_VERSION if OffsetSpec.MAX_TIMESTAMP in parts.values() else None
    version = await cluster.version_for(node, ApiKey.LIST_OFFSETS, min_version=min_version)
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=level,
        topics=[ListOffsetsTopic(name=t, partitions=p) for t, p in by_topic.items()],
    )
    response = await cluster.send(node, request, version)
    got: dict[TopicPartition, ListOffsetsResult] = {}
    errors: dict[TopicPartition, KafkaError] = {}
    for topic in response.topics:
        for p in topic.partitions:
            tp = TopicPartition(topic.name, p.partition_index)
            if p.error_code:
                cluster.handle_error_code(p.error_code)
                err = error_for_code(p.error_code)
                assert err is not None
                errors[tp] = err
            else:
                got[tp] = ListOffsetsResult(p.offset, p.timestamp, p.leader_epoch)
    return got, errors
