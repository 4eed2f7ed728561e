"""``describe_consumer_groups``: a consumer group's state, assignor and members with their
partitions, asked of its coordinator as Java's Admin does: ConsumerGroupDescribe (KIP-848
groups) first, and DescribeGroups for a classic group (the broker answers GROUP_ID_NOT_FOUND to
the first for one) or a broker without the new API. A classic member's partitions are decoded
from its ConsumerProtocol assignment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kcore.admin.types import TopicPartition
from kcore.cluster.consumer_protocol import decode_assignment
from kcore.cluster.coordinator import CoordinatorLink
from kcore.errors import (
    BrokerConnectionError,
    ErrorCode,
    GroupIdNotFoundError,
    KcoreError,
    KcoreTimeoutError,
    UnsupportedVersionError,
    error_for_code,
    error_name,
)
from kcore.network.retry import RetryPacing
from kcore.protocol import ApiKey
from kcore.protocol.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest
from kcore.protocol.messages.describe_groups_request import DescribeGroupsRequest

__all__ = ["ConsumerGroupDescription", "MemberDescription", "describe_group"]


@dataclass(frozen=True)
class MemberDescription:
    """One member: ``assignment`` the partitions it has; in a KIP-848 group also
    ``target_assignment`` (those it is moving to) and its ``member_epoch``."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: frozenset[TopicPartition]
    target_assignment: frozenset[TopicPartition] | None = None
    member_epoch: int | None = None


@dataclass(frozen=True)
class ConsumerGroupDescription:
    """As Java's: ``type`` is ``"classic"`` or ``"consumer"`` (KIP-848); ``state`` the
    broker's name for it (Stable, Empty, PreparingRebalance, CompletingRebalance, Assigning,
    Reconciling, ...); ``partition_assignor`` the assignor in use; ``coordinator`` the node id.
    ``is_simple_consumer_group``: a group that only stores offsets (empty protocol type).
    ``group_epoch`` and ``target_assignment_epoch`` are a KIP-848 group's."""

    group_id: str
    is_simple_consumer_group: bool
    members: tuple[MemberDescription, ...]
    partition_assignor: str
    state: str
    coordinator: int
    type: str
    group_epoch: int | None = None
    target_assignment_epoch: int | None = None


def _partitions(assignment: Any) -> frozenset[TopicPartition]:
    return frozenset(
        TopicPartition(t.topic_name, p) for t in assignment.topic_partitions for p in t.partitions
    )


def _from_consumer_group(g: Any, coordinator: int) -> ConsumerGroupDescription:
    members = tuple(
        MemberDescription(
            m.member_id,
            m.instance_id,
            m.client_id,
            m.client_host,
            _partitions(m.assignment),
            _partitions(m.target_assignment),
            m.member_epoch,
        )
        for m in g.members
    )
    return ConsumerGroupDescription(
        g.group_id,
        False,
        members,
        g.assignor_name,
        g.group_state,
        coordinator,
        "consumer",
        g.group_epoch,
        g.assignment_epoch,
    )


def _classic_assignment(protocol_type: str, data: bytes) -> frozenset[TopicPartition]:
    if protocol_type != "consumer" or not data:
        return frozenset()
    try:
        return frozenset(decode_assignment(data)[0])
    except KcoreError:  # not ConsumerProtocol bytes after all: as Java, no partitions
        return frozenset()


def _from_classic_group(g: Any, coordinator: int) -> ConsumerGroupDescription:
    members = tuple(
        MemberDescription(
            m.member_id,
            m.group_instance_id,
            m.client_id,
            m.client_host,
            _classic_assignment(g.protocol_type, m.member_assignment),
        )
        for m in g.members
    )
    return ConsumerGroupDescription(
        g.group_id,
        g.protocol_type == "",
        members,
        g.protocol_data,
        g.group_state,
        coordinator,
        "classic",
    )


async def describe_group(
    link: CoordinatorLink, group_id: str, timeout: float | None
) -> ConsumerGroupDescription:
    """Describe one group at its coordinator, retrying coordinator moves and loads until
    ``timeout``. Raises ``GroupIdNotFoundError`` for a group that does not exist (as Java 4),
    and ``KcoreError`` for a group that is not a consumer group."""
    backoff = RetryPacing.within(timeout, link.cluster.retry_backoff)
    classic = False
    while True:
        try:
            node = await link.node(backoff.left())
            if not classic:
                try:
                    await link.version(ApiKey.CONSUMER_GROUP_DESCRIBE)
                except UnsupportedVersionError:  # a broker before Kafka 3.7
                    classic = True
                    continue
                response = await link.send(
                    ConsumerGroupDescribeRequest(
                        group_ids=[group_id], include_authorized_operations=False
                    ),
                    timeout=_request_timeout(link, backoff),
                )
                g = response.groups[0]
                # A classic group (or none), or a broker that advertises the API without the
                # consumer protocol enabled (Kafka 3.8/3.9 by default): ask the classic way.
                if g.error_code in (ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.UNSUPPORTED_VERSION):
                    classic = True
                    continue
                if g.error_code == ErrorCode.NONE:
                    return _from_consumer_group(g, node)
            else:
                response = await link.send(
                    DescribeGroupsRequest(groups=[group_id], include_authorized_operations=False),
                    timeout=_request_timeout(link, backoff),
                )
                g = response.groups[0]
                if g.error_code == ErrorCode.NONE:
                    if g.group_state == "Dead":  # brokers before 4.0 say so of no group
                        raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
                    if g.protocol_type not in ("consumer", ""):
                        raise KcoreError(
                            f"group {group_id!r} is not a consumer group (its protocol type is "
                            f"{g.protocol_type!r})"
                        )
                    return _from_classic_group(g, node)
        except (BrokerConnectionError, KcoreTimeoutError) as exc:
            if not await backoff.pause():
                raise KcoreTimeoutError(f"describing group {group_id!r}: {exc}") from exc
            continue
        code = g.error_code
        if link.handle_error(code):
            if await backoff.pause():
                continue
            # As Java's: a coordinator that stayed away (loading, moving) is a timeout.
            raise KcoreTimeoutError(
                f"describing group {group_id!r}: the coordinator was not available in time "
                f"(last: {error_name(code)})"
            )
        err = error_for_code(code)
        assert err is not None
        said = getattr(g, "error_message", None)
        if code == ErrorCode.GROUP_ID_NOT_FOUND:
            raise GroupIdNotFoundError(said or f"group {group_id!r} does not exist")
        raise err.with_message(f"group {group_id!r}: {said or err.message}")


def _request_timeout(link: CoordinatorLink, backoff: RetryPacing) -> float:
    """request.timeout.ms, or what is left of the call if less."""
    limit = link.cluster.settings.request_timeout_s
    left = backoff.left()
    return limit if left is None else max(min(limit, left), 0.001)
