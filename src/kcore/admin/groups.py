"""The admin client's group and record operations, as Java's Admin names them:
``list_groups`` (of any type) and ``list_consumer_groups`` (ListGroups on every broker),
``describe_consumer_groups`` (at each group's coordinator, see describe_groups.py),
``list_consumer_group_offsets`` and ``alter_consumer_group_offsets`` (OffsetFetch /
OffsetCommit from outside any membership, at the group's coordinator),
``delete_consumer_groups`` (DeleteGroups) and ``delete_records`` (DeleteRecords, at each
partition's leader). Share groups' operations are in share_groups.py."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kcore.admin.client_part import AdminClientPart
from kcore.admin.describe_groups import ConsumerGroupDescription, describe_group
from kcore.admin.types import AdminOperationError, TopicPartition
from kcore.cluster.coordinator import GROUP, CoordinatorLink
from kcore.cluster.group_offsets import GroupOffsets, MemberIdentity
from kcore.errors import (
    BrokerConnectionError,
    CommitFailedError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    error_for_code,
)
from kcore.network.retry import RetryPacing
from kcore.protocol import ApiKey
from kcore.protocol.messages.delete_groups_request import DeleteGroupsRequest
from kcore.protocol.messages.delete_records_request import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
)
from kcore.protocol.messages.list_groups_request import ListGroupsRequest
from kcore.protocol.messages.offset_delete_request import (
    OffsetDeleteRequest,
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
)

if TYPE_CHECKING:
    from kcore.cluster.client import ClusterClient

__all__ = ["ConsumerGroupListing", "GroupListing", "GroupOperations"]

L = TypeVar("L", bound="GroupListing")


@dataclass(frozen=True)
class GroupListing:
    """A group a broker coordinates. ``protocol_type`` is ``"consumer"`` for consumer groups,
    ``"share"`` for share groups and ``""`` for a group that only stores offsets; ``state``
    (Stable, Empty, ...) and ``type`` (classic, consumer, share, streams) come from brokers
    that report them (Kafka 2.6+ / 3.8+)."""

    group_id: str
    protocol_type: str
    state: str | None = None
    type: str | None = None


@dataclass(frozen=True)
class ConsumerGroupListing(GroupListing):
    """What ``list_consumer_groups`` returns (a :class:`GroupListing`)."""


# A group's protocol type by its type, for brokers before ListGroups v5 (no type filter).
PROTOCOL_TYPES = {"classic": "consumer", "consumer": "consumer", "share": "share"}
# What list_consumer_groups lists (Java's ListGroupsOptions.forConsumerGroups()): groups of
# these types whose protocol type is one of these ("": a group that only committed offsets).
CONSUMER_GROUP_TYPES = ("classic", "consumer")
CONSUMER_PROTOCOL_TYPES = frozenset({"consumer", ""})


class GroupOperations(AdminClientPart):
    """Part of :class:`~kcore.admin.AsyncAdminClient` (a base class of it): its group and
    record operations, kept in a file of their own."""

    cluster: ClusterClient
    default_timeout: float

    def _timeout(self, timeout: float | None) -> float:
        return self.default_timeout if timeout is None else timeout

    def _deadline(self, timeout: float | None) -> float:
        """When a call given ``timeout`` (default ``default.api.timeout.ms``) ends."""
        return time.monotonic() + self._timeout(timeout)

    async def list_groups(
        self,
        *,
        types: Iterable[str] | None = None,
        states: Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> list[GroupListing]:
        """The groups of every type (or of ``types``: ``"classic"``, ``"consumer"``,
        ``"share"``, ``"streams"``) in any state (or in ``states``: ``"Stable"``, ``"Empty"``,
        ...), as Java's ``listGroups``. Every broker is asked (each coordinates some groups). A
        broker that does not answer in time fails the call with ``AdminOperationError`` naming
        it, ``results`` holding the groups the others listed."""
        return await self._list_groups("list_groups", GroupListing, types, states, timeout=timeout)

    async def list_consumer_groups(
        self, *, timeout: float | None = None
    ) -> list[ConsumerGroupListing]:
        """The consumer groups (classic and consumer type, of the ``consumer`` protocol or none:
        groups that only committed offsets), as Java's ``listConsumerGroups``, which is
        ``listGroups(ListGroupsOptions.forConsumerGroups())``: no share, streams or Connect
        groups. Every broker is asked (each coordinates some groups). A broker that does not
        answer in time fails the call with ``AdminOperationError`` naming it, ``results``
        holding the groups the others listed."""
        return await self._list_groups(
            "list_consumer_groups",
            ConsumerGroupListing,
            CONSUMER_GROUP_TYPES,
            None,
            timeout=timeout,
            protocol_types=CONSUMER_PROTOCOL_TYPES,
        )

    async def _list_groups(
        self,
        what: str,
        listing: type[L],
        types: Iterable[str] | None,
        states: Iterable[str] | None,
        *,
        timeout: float | None,
        protocol_types: frozenset[str] | None = None,
    ) -> list[L]:
        """ListGroups on every broker, with the type filter where the broker takes it (v5),
        applied here too (an older broker lists every group), as is the state filter (names
        compared without case, which brokers' own filter does not promise) and
        ``protocol_types`` (a group's protocol type one of them)."""
        type_names = None if types is None else sorted({t.lower() for t in types})
        state_names = None if states is None else sorted({s.lower() for s in states})
        await self.cluster.ready(self._timeout(timeout))
        await self.cluster.refresh_metadata()
        brokers = list(self.cluster.metadata.brokers)

        def wanted(g: Any) -> bool:
            state = getattr(g, "group_state", "") or ""
            kind = getattr(g, "group_type", "") or ""
            if state_names is not None and state and state.lower() not in state_names:
                return False
            if protocol_types is not None and g.protocol_type not in protocol_types:
                return False
            if type_names is None:
                return True
            if kind:
                return kind.lower() in type_names
            # A broker before ListGroups v5 names no type: the protocol type tells it.
            return protocol_types is not None or g.protocol_type in {
                PROTOCOL_TYPES.get(t) for t in type_names
            }

        async def one(node: int) -> list[L]:
            async def attempt() -> list[L]:
                version = await self.cluster.version_for(node, ApiKey.LIST_GROUPS)
                request = ListGroupsRequest()
                if type_names is not None and version >= 5:
                    request.types_filter = list(type_names)
                response = await self.cluster.send(node, request, version)
                err = error_for_code(response.error_code)
                if err is not None:
                    raise err.with_message(f"node {node}: {err.message}")
                return [
                    listing(
                        g.group_id,
                        g.protocol_type,
                        getattr(g, "group_state", None) or None,
                        getattr(g, "group_type", None) or None,
                    )
                    for g in response.groups
                    if wanted(g)
                ]

            return await self._retrying(f"{what} (node {node})", attempt, timeout)

        outcomes = await asyncio.gather(*(one(n) for n in brokers), return_exceptions=True)
        groups: list[L] = []
        errors: dict[Any, KcoreError] = {}
        for node, outcome in zip(brokers, outcomes, strict=True):
            if isinstance(outcome, KcoreError):
                errors[f"node {node}"] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                groups.extend(outcome)
        groups.sort(key=lambda g: g.group_id)
        if errors:
            raise AdminOperationError(what, errors, groups)
        return groups

    async def describe_consumer_groups(
        self, group_ids: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, ConsumerGroupDescription]:
        """Each group's state, assignor and members with their partitions, by group id. A
        group that fails (one that does not exist: ``GroupIdNotFoundError``) fails alone:
        ``AdminOperationError`` names it, ``results`` holding the others."""
        ids = list(dict.fromkeys(group_ids))
        results: dict[str, ConsumerGroupDescription] = {}
        errors: dict[Any, KcoreError] = {}

        async def one(group_id: str) -> None:
            link = CoordinatorLink(self.cluster, group_id, GROUP)
            try:
                results[group_id] = await describe_group(link, group_id, self._timeout(timeout))
            except KcoreError as exc:
                errors[group_id] = exc

        await asyncio.gather(*(one(g) for g in ids))
        if errors:
            raise AdminOperationError("describe_consumer_groups", errors, results)
        return {g: results[g] for g in ids}

    def _offsets(self, group_id: str) -> GroupOffsets:
        return GroupOffsets(CoordinatorLink(self.cluster, group_id, GROUP), group_id)

    async def list_consumer_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        *,
        require_stable: bool = False,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets: of ``partitions`` (None where nothing is committed),
        or of every partition it has one for."""
        tps = None if partitions is None else [TopicPartition(*tp) for tp in partitions]
        return await self._offsets(group_id).fetch(tps, self._timeout(timeout), require_stable)

    async def alter_consumer_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        *,
        timeout: float | None = None,
    ) -> None:
        """Commit ``offsets`` (the next offset to read per partition) for the group, from
        outside it, as Java's: the broker takes it only while the group has no active
        member (stop its consumers first)."""
        wanted = {TopicPartition(*tp): int(o) for tp, o in offsets.items()}
        try:
            await self._offsets(group_id).commit(wanted, MemberIdentity(), self._timeout(timeout))
        except CommitFailedError:
            raise KcoreError(
                f"group {group_id!r} has active members: its offsets can be altered only while "
                "it is empty (stop its consumers first)"
            ) from None

    async def delete_consumer_groups(
        self, group_ids: Iterable[str], *, timeout: float | None = None
    ) -> None:
        """Delete each group (its committed offsets too), at its coordinator. A group that
        has members (NON_EMPTY_GROUP) or does not exist (GROUP_ID_NOT_FOUND) fails alone:
        ``AdminOperationError`` names it."""
        await self._delete_groups("delete_consumer_groups", group_ids, timeout)

    async def _delete_groups(
        self, what: str, group_ids: Iterable[str], timeout: float | None
    ) -> None:
        """DeleteGroups of each group at its coordinator (the broker deletes a group of any
        type); the groups that failed raise ``AdminOperationError`` named ``what``."""
        ids = list(dict.fromkeys(group_ids))
        errors: dict[Any, KcoreError] = {}

        async def one(group_id: str) -> None:
            link = CoordinatorLink(self.cluster, group_id, GROUP)
            backoff = RetryPacing.within(self._timeout(timeout), self.cluster.retry_backoff)
            while True:
                try:
                    response = await link.send(DeleteGroupsRequest(groups_names=[group_id]))
                    code = next((r.error_code for r in response.results), ErrorCode.NONE)
                except (BrokerConnectionError, KcoreTimeoutError) as exc:
                    if not await backoff.pause():
                        errors[group_id] = exc
                        return
                    continue
                if code == ErrorCode.NONE:
                    return
                if not (link.handle_error(code) and await backoff.pause()):
                    err = error_for_code(code)
                    assert err is not None
                    errors[group_id] = err.with_message(f"group {group_id!r}: {err.message}")
                    return

        await asyncio.gather(*(one(g) for g in ids))
        if errors:
            raise AdminOperationError(what, errors)

    async def delete_consumer_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition | tuple[str, int]],
        *,
        timeout: float | None = None,
    ) -> None:
        """Delete the group's committed offsets of these partitions, at its coordinator
        (OffsetDelete, what ``kafka-consumer-groups --delete-offsets`` does). The group may
        have members, but not consuming the topic: such a partition fails alone
        (``GroupSubscribedToTopicError``) in ``AdminOperationError``. A group that does not
        exist fails the call (``GroupIdNotFoundError``)."""
        tps = list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        if not tps:
            return
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in tps:
            by_topic[tp.topic].append(tp.partition)
        request = OffsetDeleteRequest(
            group_id=group_id,
            topics=[
                OffsetDeleteRequestTopic(
                    name=topic,
                    partitions=[OffsetDeleteRequestPartition(partition_index=p) for p in parts],
                )
                for topic, parts in by_topic.items()
            ],
        )
        link = CoordinatorLink(self.cluster, group_id, GROUP)
        backoff = RetryPacing.within(self._timeout(timeout), self.cluster.retry_backoff)
        while True:
            try:
                response = await link.send(request)
            except (BrokerConnectionError, KcoreTimeoutError):
                if not await backoff.pause():
                    raise
                continue
            code = response.error_code
            if code == ErrorCode.NONE:
                break
            if not (link.handle_error(code) and await backoff.pause()):
                err = error_for_code(code)
                assert err is not None
                raise err.with_message(f"group {group_id!r}: {err.message}")
        errors: dict[Any, KcoreError] = {}
        for topic in response.topics:
            for part in topic.partitions:
                err = error_for_code(part.error_code)
                if err is not None:
                    errors[TopicPartition(topic.name, part.partition_index)] = err
        if errors:
            raise AdminOperationError("delete_consumer_group_offsets", errors)

    async def delete_records(
        self,
        before: Mapping[TopicPartition | tuple[str, int], int],
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int]:
        """Delete the records before each offset (-1: before the high watermark, i.e. all);
        returns each partition's new low watermark (its first offset). Asked of each
        partition's leader; a leader that moved is found again."""
        wanted = {TopicPartition(*tp): int(o) for tp, o in before.items()}
        results: dict[TopicPartition, int] = {}
        final: dict[Any, KcoreError] = {}
        deadline = self._deadline(timeout)

        async def attempt() -> None:
            pending = {tp: o for tp, o in wanted.items() if tp not in results and tp not in final}
            if not pending:
                return
            left = max(0.0, deadline - time.monotonic() - 0.05)
            md = await self.cluster.wait_for_topics({tp.topic for tp in pending}, left, pending)
            by_leader: dict[int, dict[TopicPartition, int]] = defaultdict(dict)
            for tp, offset in pending.items():
                part = md.partition(tp.topic, tp.partition)
                if part is None:
                    final[tp] = error_for_code(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) or KafkaError()
                else:
                    by_leader[part.leader][tp] = offset
            retry: KcoreError | None = None
            for node, parts in by_leader.items():
                topics: dict[str, list[DeleteRecordsPartition]] = defaultdict(list)
                for tp, offset in parts.items():
                    topics[tp.topic].append(
                        DeleteRecordsPartition(partition_index=tp.partition, offset=offset)
                    )
                request = DeleteRecordsRequest(
                    topics=[DeleteRecordsTopic(name=t, partitions=ps) for t, ps in topics.items()],
                    timeout_ms=self._server_timeout_ms(deadline),
                )
                version = await self.cluster.version_for(node, ApiKey.DELETE_RECORDS)
                response = await self.cluster.send(node, request, version)
                for t in response.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.partition_index)
                        err = error_for_code(p.error_code)
                        if err is None:
                            results[tp] = p.low_watermark
                        elif err.retriable:
                            self.cluster.handle_error_code(p.error_code)
                            retry = err
                        else:
                            final[tp] = err.with_message(
                                f"{tp.topic}-{tp.partition}: {err.message}"
                            )
            if retry is not None:
                raise retry

        await self._retrying("delete_records", attempt, timeout)
        if final:
            raise AdminOperationError("delete_records", final, results)
        return results
