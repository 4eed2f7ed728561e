"""The admin client's share-group operations (KIP-932), as Java's Admin names them:
``list_share_groups`` (ListGroups filtered to share groups), ``describe_share_groups``
(ShareGroupDescribe), ``list_share_group_offsets`` (DescribeShareGroupOffsets: each
share-partition's start offset, and its lag from brokers that report it, KIP-1226),
``alter_share_group_offsets`` (AlterShareGroupOffsets), ``delete_share_group_offsets``
(DeleteShareGroupOffsets) and ``delete_share_groups`` (DeleteGroups). All but the listing are
asked of the group's coordinator, found again when it moves."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kcore.admin.client_part import AdminClientPart
from kcore.admin.groups import GroupListing
from kcore.admin.types import AdminOperationError, TopicPartition
from kcore.cluster.coordinator import GROUP, CoordinatorLink
from kcore.errors import (
    BrokerConnectionError,
    ErrorCode,
    GroupIdNotFoundError,
    KcoreError,
    KcoreTimeoutError,
    NonEmptyGroupError,
    UnsupportedVersionError,
    error_for_code,
    error_name,
)
from kcore.network.retry import RetryPacing
from kcore.protocol.messages.alter_share_group_offsets_request import (
    AlterShareGroupOffsetsRequest,
    AlterShareGroupOffsetsRequestPartition,
    AlterShareGroupOffsetsRequestTopic,
)
from kcore.protocol.messages.delete_share_group_offsets_request import (
    DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsRequestTopic,
)
from kcore.protocol.messages.describe_share_group_offsets_request import (
    DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsRequestGroup,
    DescribeShareGroupOffsetsRequestTopic,
)
from kcore.protocol.messages.share_group_describe_request import ShareGroupDescribeRequest

if TYPE_CHECKING:
    from kcore.cluster.client import ClusterClient

__all__ = [
    "ShareGroupDescription",
    "ShareGroupOperations",
    "ShareMemberDescription",
    "SharePartitionOffsetInfo",
]


@dataclass(frozen=True)
class ShareMemberDescription:
    """One member of a share group: ``assignment`` the partitions it fetches from (a partition
    may be assigned to several members of the group at once)."""

    member_id: str
    client_id: str
    host: str
    assignment: frozenset[TopicPartition]
    member_epoch: int
    rack_id: str | None = None
    subscribed_topics: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShareGroupDescription:
    """As Java's ``ShareGroupDescription``: ``state`` the broker's name for it (Empty, Stable,
    Dead, ...), ``coordinator`` the node id, ``partition_assignor`` the broker's assignor
    (``simple``), ``group_epoch`` and ``target_assignment_epoch`` its epochs."""

    group_id: str
    state: str
    coordinator: int
    members: tuple[ShareMemberDescription, ...]
    partition_assignor: str
    group_epoch: int
    target_assignment_epoch: int
    type: str = "share"


@dataclass(frozen=True)
class SharePartitionOffsetInfo:
    """A share-partition's state, as Java's ``SharePartitionOffsetInfo``: ``start_offset`` (the
    share-partition start offset: records before it are done with), ``leader_epoch`` and
    ``lag`` (the records from the start offset to the high watermark not yet acknowledged,
    KIP-1226; None from a broker that does not report it, before Kafka 4.2)."""

    start_offset: int
    leader_epoch: int | None
    lag: int | None


def _group_error(group_id: str, code: int, message: str | None) -> KcoreError:
    """The kcore error of a group-level error code, saying which group."""
    if code == ErrorCode.NON_EMPTY_GROUP:
        return NonEmptyGroupError(
            f"share group {group_id!r} has active members: its offsets can be altered and it "
            "can be deleted only while it is empty (stop its share consumers first)"
        )
    if code == ErrorCode.GROUP_ID_NOT_FOUND:
        # The broker says so of a group of another type too ("... is not a share group").
        return GroupIdNotFoundError(
            f"share group {group_id!r}: {message}"
            if message
            else f"group {group_id!r} does not exist"
        )
    err = error_for_code(code)
    assert err is not None
    return err.with_message(f"share group {group_id!r}: {message or err.message}")


class ShareGroupOperations(AdminClientPart):
    """Part of :class:`~kcore.admin.AsyncAdminClient` (a base class of it): its share-group
    operations, kept in a file of their own."""

    cluster: ClusterClient
    default_timeout: float

    async def _at_coordinator(
        self,
        link: CoordinatorLink,
        request: Any,
        outcome: Callable[[Any], tuple[int, str | None]],
        timeout: float | None,
    ) -> Any:
        """``request`` to the group's coordinator until its group-level error code (what
        ``outcome`` reads from the response, with the message) is none, or one a retry does
        not heal (raised as kcore's error). Coordinator moves, loads and lost connections are
        retried until ``timeout``."""
        group_id = link.key
        backoff = RetryPacing.within(self._timeout(timeout), self.cluster.retry_backoff)
        while True:
            try:
                response = await link.send(request)
            except UnsupportedVersionError as exc:
                raise UnsupportedVersionError(
                    f"share group {group_id!r}: the group's coordinator does not support "
                    f"{type(request).__name__} (share groups need Kafka 4.1 or later): {exc}"
                ) from None
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                if not await backoff.pause():
                    raise KcoreTimeoutError(f"share group {group_id!r}: {exc}") from exc
                continue
            code, message = outcome(response)
            if code == ErrorCode.NONE:
                return response
            if link.handle_error(code):
                if await backoff.pause():
                    continue
                raise KcoreTimeoutError(
                    f"share group {group_id!r}: the coordinator was not available in time "
                    f"(last: {error_name(code)})"
                )
            raise _group_error(group_id, code, message)

    if TYPE_CHECKING:  # GroupOperations', a base of AsyncAdminClient beside this one

        async def list_groups(
            self,
            *,
            types: Iterable[str] | None = None,
            states: Iterable[str] | None = None,
            timeout: float | None = None,
        ) -> list[GroupListing]: ...

    def _link(self, group_id: str) -> CoordinatorLink:
        return CoordinatorLink(self.cluster, group_id, GROUP)

    async def list_share_groups(
        self, *, states: Iterable[str] | None = None, timeout: float | None = None
    ) -> list[GroupListing]:
        """The share groups (in ``states``: ``"Empty"``, ``"Stable"``, ...; default any), as
        Java's ``listGroups`` for ``GroupType.SHARE``: every broker is asked. A broker that
        does not answer in time fails the call with ``AdminOperationError`` naming it,
        ``results`` holding the groups the others listed."""
        return await self.list_groups(types=["share"], states=states, timeout=timeout)

    async def describe_share_groups(
        self, group_ids: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, ShareGroupDescription]:
        """Each share group's state, epochs and members with their assignments, by group id.
        A group that fails fails alone: ``AdminOperationError`` names it, ``results`` holding
        the others. One that does not exist, or is not a share group, fails with
        ``GroupIdNotFoundError`` (the broker's message says which)."""
        ids = list(dict.fromkeys(group_ids))
        results: dict[str, ShareGroupDescription] = {}
        errors: dict[Any, KcoreError] = {}

        async def one(group_id: str) -> None:
            link = self._link(group_id)
            request = ShareGroupDescribeRequest(
                group_ids=[group_id], include_authorized_operations=False
            )

            def outcome(response: Any) -> tuple[int, str | None]:
                g = response.groups[0]
                return g.error_code, g.error_message

            try:
                response = await self._at_coordinator(link, request, outcome, timeout)
                coordinator = await link.node(self._timeout(timeout))  # (the one that answered)
            except KcoreError as exc:
                errors[group_id] = exc
                return
            results[group_id] = _description(response.groups[0], coordinator)

        await asyncio.gather(*(one(g) for g in ids))
        if errors:
            raise AdminOperationError("describe_share_groups", errors, results)
        return {g: results[g] for g in ids}

    async def list_share_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, SharePartitionOffsetInfo | None]:
        """The group's share-partition start offsets and lags: of ``partitions`` (None where
        the group has no start offset for one), or of every partition it has one for (none of
        a group that does not exist). A partition the broker could not answer for fails alone
        in ``AdminOperationError``, ``results`` holding the others."""
        tps = (
            None
            if partitions is None
            else list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        )
        topics = None
        if tps is not None:
            if not tps:
                return {}
            by_topic: dict[str, list[int]] = defaultdict(list)
            for tp in tps:
                by_topic[tp.topic].append(tp.partition)
            topics = [
                DescribeShareGroupOffsetsRequestTopic(topic_name=t, partitions=ps)
                for t, ps in by_topic.items()
            ]
        request = DescribeShareGroupOffsetsRequest(
            groups=[DescribeShareGroupOffsetsRequestGroup(group_id=group_id, topics=topics)]
        )

        def outcome(response: Any) -> tuple[int, str | None]:
            g = response.groups[0]
            return g.error_code, g.error_message

        response = await self._at_coordinator(self._link(group_id), request, outcome, timeout)
        results: dict[TopicPartition, SharePartitionOffsetInfo | None] = {}
        errors: dict[Any, KcoreError] = {}
        for topic in response.groups[0].topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.topic_name, p.partition_index)
                err = error_for_code(p.error_code)
                if err is not None:
                    errors[tp] = err.with_message(
                        f"{tp.topic}-{tp.partition}: {p.error_message or err.message}"
                    )
                elif p.start_offset < 0:  # the group has no state for it (yet)
                    results[tp] = None
                else:
                    results[tp] = SharePartitionOffsetInfo(
                        p.start_offset,
                        p.leader_epoch if p.leader_epoch >= 0 else None,
                        p.lag if p.lag >= 0 else None,  # -1: not reported (v0) or unknown
                    )
        if errors:
            raise AdminOperationError("list_share_group_offsets", errors, results)
        if tps is not None:
            return {tp: results.get(tp) for tp in tps}
        return dict(sorted(results.items()))

    async def alter_share_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        *,
        timeout: float | None = None,
    ) -> None:
        """Set the share-partition start offset of each partition (the next record the group
        delivers), as Java's: the broker takes it only while the group has no active member
        (``NonEmptyGroupError`` otherwise: stop its share consumers first). A group that does
        not exist is made, as Kafka does. A partition that failed (one that does not exist)
        fails alone in ``AdminOperationError``."""
        wanted = {TopicPartition(*tp): int(o) for tp, o in offsets.items()}
        bad = {tp: o for tp, o in wanted.items() if o < 0}
        if bad:
            tp, o = next(iter(bad.items()))
            raise KcoreError(
                f"alter_share_group_offsets: the start offset of {tp.topic}-{tp.partition} must "
                f"be 0 or more, not {o}"
            )
        if not wanted:
            return
        by_topic: dict[str, list[AlterShareGroupOffsetsRequestPartition]] = defaultdict(list)
        for tp, o in wanted.items():
            by_topic[tp.topic].append(
                AlterShareGroupOffsetsRequestPartition(partition_index=tp.partition, start_offset=o)
            )
        request = AlterShareGroupOffsetsRequest(
            group_id=group_id,
            topics=[
                AlterShareGroupOffsetsRequestTopic(topic_name=t, partitions=ps)
                for t, ps in by_topic.items()
            ],
        )
        response = await self._at_coordinator(
            self._link(group_id), request, lambda r: (r.error_code, r.error_message), timeout
        )
        errors: dict[Any, KcoreError] = {}
        for topic in response.responses:
            for p in topic.partitions:
                err = error_for_code(p.error_code)
                if err is not None:
                    tp = TopicPartition(topic.topic_name, p.partition_index)
                    errors[tp] = err.with_message(
                        f"{tp.topic}-{tp.partition}: {p.error_message or err.message}"
                    )
        if errors:
            raise AdminOperationError("alter_share_group_offsets", errors)

    async def delete_share_group_offsets(
        self, group_id: str, topics: Iterable[str], *, timeout: float | None = None
    ) -> None:
        """Delete the group's share-partition state of every partition of ``topics`` (what
        ``kafka-share-groups --delete-offsets`` does): the group no longer consumes them from
        where it was. The broker takes it only while the group has no active member
        (``NonEmptyGroupError``). A topic that failed fails alone in ``AdminOperationError``."""
        names = list(dict.fromkeys(topics))
        if not names:
            return
        request = DeleteShareGroupOffsetsRequest(
            group_id=group_id,
            topics=[DeleteShareGroupOffsetsRequestTopic(topic_name=t) for t in names],
        )
        response = await self._at_coordinator(
            self._link(group_id), request, lambda r: (r.error_code, r.error_message), timeout
        )
        errors: dict[Any, KcoreError] = {}
        for topic in response.responses:
            err = error_for_code(topic.error_code)
            if err is not None:
                errors[topic.topic_name] = err.with_message(
                    f"{topic.topic_name}: {topic.error_message or err.message}"
                )
        if errors:
            raise AdminOperationError("delete_share_group_offsets", errors)

    async def delete_share_groups(
        self, group_ids: Iterable[str], *, timeout: float | None = None
    ) -> None:
        """Delete each share group (its share-partition state too), at its coordinator, as
        Java's (DeleteGroups: the broker does not check the group's type). A group that has
        members (NON_EMPTY_GROUP) or does not exist (GROUP_ID_NOT_FOUND) fails alone:
        ``AdminOperationError`` names it."""
        await self._delete_groups("delete_share_groups", group_ids, timeout)


def _description(g: Any, coordinator: int) -> ShareGroupDescription:
    members = tuple(
        ShareMemberDescription(
            m.member_id,
            m.client_id,
            m.client_host,
            frozenset(
                TopicPartition(t.topic_name, p)
                for t in m.assignment.topic_partitions
                for p in t.partitions
            ),
            m.member_epoch,
            m.rack_id,
            tuple(m.subscribed_topic_names),
        )
        for m in g.members
    )
    return ShareGroupDescription(
        g.group_id,
        g.group_state,
        coordinator,
        members,
        g.assignor_name,
        g.group_epoch,
        g.assignment_epoch,
    )
