"""``ClassicGroupMember``: membership in a group under the classic protocol (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup), with client-side assignment by the elected leader.

It runs on the event loop. The join is driven from ``poll`` (as in Java, where rebalances only
progress inside poll); heartbeats run on their own timer in a task, so that a slow caller
between polls keeps its session (up to ``max.poll.interval.ms``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from kcore.cluster.client import ClusterClient
from kcore.cluster.coordinator import CoordinatorLink
from kcore.cluster.group_offsets import MemberIdentity
from kcore.consumer.assignors import (
    Assignor,
    MemberSubscription,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from kcore.errors import (
    BootstrapError,
    BrokerConnectionError,
    ErrorCode,
    KafkaError,
    KcoreTimeoutError,
    error_for_code,
)
from kcore.network.retry import RetryPacing, is_retriable
from kcore.protocol import ApiKey
from kcore.protocol.messages.heartbeat_request import HeartbeatRequest
from kcore.protocol.messages.join_group_request import JoinGroupRequest, JoinGroupRequestProtocol
from kcore.protocol.messages.leave_group_request import LeaveGroupRequest
from kcore.protocol.messages.leave_group_request import MemberIdentity as LeaveMember
from kcore.protocol.messages.sync_group_request import (
    SyncGroupRequest,
    SyncGroupRequestAssignment,
)
from kcore.types import TopicPartition

log = logging.getLogger("kcore.consumer.group")

# Errors that end the consumer's group membership for good: surfaced to the caller.
FATAL_CODES = frozenset(
    {
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
        ErrorCode.INVALID_GROUP_ID,
        ErrorCode.INVALID_SESSION_TIMEOUT,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.GROUP_MAX_SIZE_REACHED,
        # Two processes share one group.instance.id: an application error.
        ErrorCode.FENCED_INSTANCE_ID,
    }
)


class ClassicGroupMember:
    def __init__(
        self,
        cluster: ClusterClient,
        link: CoordinatorLink,
        config: Any,
        assignors: list[Assignor],
    ) -> None:
        self.cluster = cluster
        self.link = link
        self.group_id = str(config["group.id"])
        self.instance_id: str | None = config["group.instance.id"]
        self.session_timeout_ms = int(config["session.timeout.ms"])
        self.rebalance_timeout_ms = int(config["max.poll.interval.ms"])
        self.heartbeat_interval_s = int(config["heartbeat.interval.ms"]) / 1000
        self.assignors = assignors
        # Cooperative rebalancing only when every configured assignor supports it (as Java).
        self.cooperative = all(a.rebalance_protocol == "cooperative" for a in assignors)
        self.member_id = ""
        self.generation = -1
        self.protocol_name: str | None = None
        self.joined = False
        self.rejoin_reason: str | None = "first join"
        self.lost = False  # the group dropped this member: its partitions are another's now
        self.fatal: BaseException | None = None
        self.last_poll = time.monotonic()
        # The leader: the partition count of every member's topic that its assignment used
        # (None when not the leader). A change in them calls for a rejoin, as in Java.
        self.assigned_counts: dict[str, int] | None = None
        # Eager members revoke everything before rejoining; the sticky assignor's user data
        # still names what they held.
        self.last_assignment: list[TopicPartition] = []
        self._heartbeats: asyncio.Task[None] | None = None
        self._join_task: asyncio.Task[list[TopicPartition]] | None = None  # join_within's
        self.join_topics: set[str] = set()  # what that join subscribes to
        # Called when a rejoin becomes due (the heartbeat found the group rebalancing, say), so
        # a poll waiting for records joins at once instead of at its next wait slice.
        self.on_change: Callable[[], None] = lambda: None

    @property
    def identity(self) -> MemberIdentity:
        if not self.joined:
            return MemberIdentity(-1, self.member_id, self.instance_id)
        return MemberIdentity(self.generation, self.member_id, self.instance_id)

    def request_rejoin(self, reason: str) -> None:
        if self.rejoin_reason is None:
            log.info("group %r: rejoining (%s)", self.group_id, reason)
            self.rejoin_reason = reason
            self.on_change()

    def _reset(self, reason: str, forget_member_id: bool) -> None:
        """The group no longer knows this member (or this generation): what it held is lost."""
        was = self.joined
        self.joined = False
        self.generation = -1
        if forget_member_id:
            self.member_id = ""
        self.lost = self.lost or was
        self.request_rejoin(reason)

    def _raise_fatal(self, code: int, during: str) -> None:
        err = error_for_code(code)
        assert err is not None
        exc = err.with_message(f"group {self.group_id!r}, {during}: {err.message}")
        self.fatal = exc
        raise exc

    # -- join and sync ----------------------------------------------------------------------------

    async def join_within(
        self, topics: set[str], owned: Iterable[TopicPartition], timeout: float
    ) -> list[TopicPartition] | None:
        """:meth:`join` as a task that outlives a poll (as Java's join future): waits for it up
        to ``timeout`` and returns the assignment, or None while it is still joining (the next
        poll waits on the same join; a rebalance can take up to the rebalance timeout)."""
        task = self._join_task
        if task is None:
            self.join_topics = set(topics)
            task = self._join_task = asyncio.get_running_loop().create_task(
                self.join(topics, owned)
            )
        done, _ = await asyncio.wait({task}, timeout=max(timeout, 0.0))
        if not done:
            return None
        # Kept until the step has used the result (join_taken): a poll interrupted on the way
        # (wakeup) finds it again instead of losing the assignment.
        return task.result()

    def join_taken(self) -> None:
        self._join_task = None

    @property
    def join_pending(self) -> bool:
        """A join started by :meth:`join_within` whose outcome no poll has taken yet."""
        return self._join_task is not None

    def cancel_join(self) -> None:
        task, self._join_task = self._join_task, None
        if task is not None:
            if task.done():
                if not task.cancelled():
                    task.exception()  # retrieved: no "never retrieved" warning
            else:
                task.cancel()

    async def join(self, topics: set[str], owned: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Join (or rejoin) the group and return this member's assignment."""
        self.stop_heartbeats()
        owned_list = sorted(owned) if self.cooperative else []
        backoff = RetryPacing.within(None, self.cluster.retry_backoff)
        while True:
            if self.fatal is not None:
                raise self.fatal
            self.joined = False
            try:
                assignment = await self._join_once(topics, owned_list)
            except (BrokerConnectionError, KcoreTimeoutError, BootstrapError, _Retry) as exc:
                # (a cluster not reached yet: polls return nothing meanwhile, as Java's; one
                # that waiting cannot reach, e.g. TLS trust, is raised)
                if isinstance(exc, BootstrapError) and not is_retriable(exc):
                    raise
                log.debug("group %r: join attempt failed: %s", self.group_id, exc)
                await backoff.pause()
                continue
            except _Rejoin:
                continue
            self.joined = True
            self.rejoin_reason = None
            self.lost = False
            self.last_poll = time.monotonic()
            self._start_heartbeats()
            self.last_assignment = assignment
            return assignment

    async def _join_once(
        self, topics: set[str], owned: list[TopicPartition]
    ) -> list[TopicPartition]:
        request = JoinGroupRequest(
            group_id=self.group_id,
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
            protocol_type="consumer",
            protocols=[
                JoinGroupRequestProtocol(
                    name=a.name,
                    metadata=encode_subscription(
                        Subscription(
                            topics=sorted(topics),
                            user_data=a.subscription_user_data(
                                topics,
                                owned if self.cooperative else self.last_assignment,
                                self.generation,
                            ),
                            owned_partitions=owned,
                            generation_id=self.generation,
                        )
                    ),
                )
                for a in self.assignors
            ],
            reason=self.rejoin_reason,
        )
        # The coordinator answers when every member has joined: up to the rebalance timeout.
        wait = self.rebalance_timeout_ms / 1000 + 5
        response = await self.link.send(request, timeout=wait)
        code = response.error_code
        if code == ErrorCode.MEMBER_ID_REQUIRED:  # KIP-394: the first join only gets a member id
            self.member_id = response.member_id
            raise _Rejoin
        if code:
            self._join_error(code, "JoinGroup")
        self.member_id = response.member_id
        self.generation = response.generation_id
        self.protocol_name = response.protocol_name
        self.assigned_counts = None
        assignments: list[SyncGroupRequestAssignment] = []
        if response.leader == self.member_id and not getattr(response, "skip_assignment", False):
            assignments = await self._lead(response.members)
        sync = SyncGroupRequest(
            group_id=self.group_id,
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
            protocol_type="consumer",
            protocol_name=self.protocol_name,
            assignments=assignments,
        )
        response = await self.link.send(sync)
        if response.error_code:
            self._join_error(response.error_code, "SyncGroup")
        if not response.assignment:
            return []
        partitions, _user_data = decode_assignment(bytes(response.assignment))
        return partitions

    def _join_error(self, code: int, during: str) -> None:
        if code in FATAL_CODES:
            self._raise_fatal(code, during)
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            raise _Rejoin
        if code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.REBALANCE_IN_PROGRESS):
            raise _Rejoin
        if self.link.handle_error(code):
            raise _Retry(during)
        err = error_for_code(code)
        if isinstance(err, KafkaError) and err.retriable:
            raise _Retry(during)
        self._raise_fatal(code, during)

    async def _lead(self, members: list[Any]) -> list[SyncGroupRequestAssignment]:
        """The leader's job: run the chosen assignor over every member's subscription."""
        assignor = next(a for a in self.assignors if a.name == self.protocol_name)
        subs = [
            MemberSubscription(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                subscription=decode_subscription(bytes(m.metadata)),
            )
            for m in members
        ]
        topics = {t for s in subs for t in s.subscription.topics}
        self.cluster.add_topics(topics)
        # The cache serves when it knows every topic (the periodic refresh and partition-count
        # checks keep it current); a refresh here could wait behind a fetch the broker holds
        # for fetch.max.wait.ms, and every member waits for the leader's SyncGroup.
        md = self.cluster.cache.current
        if not topics <= md.topics.keys():
            md = await self.cluster.refresh_metadata(topics)
        counts = {t: len(md.topics[t].partitions) for t in topics if t in md.topics}
        self.assigned_counts = counts
        plan = assignor.assign(counts, subs)
        log.info(
            "group %r generation %d: leader assigned %s",
            self.group_id,
            self.generation,
            {m: len(p) for m, p in plan.items()},
        )
        return [
            SyncGroupRequestAssignment(
                member_id=m.member_id, assignment=encode_assignment(plan.get(m.member_id, []))
            )
            for m in subs
        ]

    # -- heartbeats -------------------------------------------------------------------------------

    def _start_heartbeats(self) -> None:
        self._heartbeats = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    def stop_heartbeats(self) -> None:
        if self._heartbeats is not None:
            # Not from the heartbeat task itself (a poll timeout leaves from there): cancelled,
            # it never got to send the LeaveGroup nor to mark the partitions lost.
            if self._heartbeats is not asyncio.current_task():
                self._heartbeats.cancel()
            self._heartbeats = None

    async def _heartbeat_loop(self) -> None:
        backoff = RetryPacing.within(None, self.cluster.retry_backoff)
        while self.joined and self.fatal is None:
            if time.monotonic() - self.last_poll > self.rebalance_timeout_ms / 1000:
                # As Java: a caller that stopped polling gives its partitions up to the group.
                log.warning(
                    "group %r: no poll for max.poll.interval.ms (%d ms); leaving the group",
                    self.group_id,
                    self.rebalance_timeout_ms,
                )
                await self.leave("consumer poll timeout has expired")
                self.lost = True  # it was joined: what it owned is the group's again
                self._reset("poll timeout expired", forget_member_id=True)
                return
            try:
                response = await self.link.send(
                    HeartbeatRequest(
                        group_id=self.group_id,
                        generation_id=self.generation,
                        member_id=self.member_id,
                        group_instance_id=self.instance_id,
                    )
                )
                code = response.error_code
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                log.debug("group %r: heartbeat failed: %s", self.group_id, exc)
                await backoff.pause()
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not silently end the heartbeats
                log.exception("group %r: heartbeat", self.group_id)
                self.fatal = exc
                return
            if code == ErrorCode.NONE:
                backoff.reset()
            elif code == ErrorCode.REBALANCE_IN_PROGRESS:
                self.request_rejoin("the group is rebalancing")
            elif code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID):
                err = error_for_code(code)
                self._reset(
                    f"heartbeat: {err.name if err else code}", code == ErrorCode.UNKNOWN_MEMBER_ID
                )
                return
            elif code in FATAL_CODES:
                err = error_for_code(code)
                assert err is not None
                self.fatal = err.with_message(f"group {self.group_id!r}, heartbeat: {err.message}")
                return
            elif self.link.handle_error(code):
                await backoff.pause()
                continue
            await asyncio.sleep(self.heartbeat_interval_s)

    async def leave(self, reason: str = "the consumer is being closed") -> None:
        """LeaveGroup, so the group rebalances now rather than after the session timeout.
        Static members (group.instance.id) send none (KIP-345, as Java's maybeLeaveGroup): a
        restart, or a poll after the poll timeout, within the session timeout gets their
        partitions back without a rebalance."""
        self.stop_heartbeats()
        self.cancel_join()
        if self.member_id and self.instance_id is None:
            await self._send_leave(reason)
        self.joined = False
        self.generation = -1
        self.member_id = ""

    async def _send_leave(self, reason: str) -> None:
        try:
            version = await self.link.version(ApiKey.LEAVE_GROUP)
            if version >= 3:  # KIP-345: a list of members
                who = [LeaveMember(member_id=self.member_id, group_instance_id=self.instance_id)]
                if version >= 5:
                    who[0].reason = reason
                request = LeaveGroupRequest(group_id=self.group_id, members=who)
            else:
                request = LeaveGroupRequest(group_id=self.group_id, member_id=self.member_id)
            await self.link.send(request, version, timeout=5)
        except Exception as exc:  # best effort: the session timeout removes it anyway
            log.info("group %r: LeaveGroup failed: %s", self.group_id, exc)


class _Retry(Exception):
    """A retriable failure: back off, then try again."""


class _Rejoin(Exception):
    """Join again at once (new member id, new generation)."""
