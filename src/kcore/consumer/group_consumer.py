"""``ConsumerGroupMember``: membership under the next-generation protocol
(``group.protocol=consumer``, KIP-848). One RPC, ConsumerGroupHeartbeat, joins, heartbeats and
carries the assignment the broker computed; the member reconciles (revokes what it lost, takes
what it got, inside ``poll``) and acknowledges by reporting what it owns in the next heartbeat.

The heartbeat runs on its own task on the event loop at the interval the broker sets."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from kcore.cluster.client import ClusterClient
from kcore.cluster.coordinator import CoordinatorLink
from kcore.cluster.group_offsets import MemberIdentity
from kcore.errors import (
    BootstrapError,
    BrokerConnectionError,
    ErrorCode,
    KafkaError,
    KcoreTimeoutError,
    error_for_code,
)
from kcore.network.events import wait_event
from kcore.network.retry import RetryPacing, is_retriable
from kcore.protocol import ApiKey
from kcore.protocol.messages.consumer_group_heartbeat_request import (
    ConsumerGroupHeartbeatRequest,
)
from kcore.protocol.messages.consumer_group_heartbeat_request import (
    TopicPartitions as OwnedTopicPartitions,
)
from kcore.types import TopicPartition

log = logging.getLogger("kcore.consumer.group")

LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2  # a static member steps out but keeps its place for a restart
FATAL_CODES = frozenset(
    {
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.GROUP_MAX_SIZE_REACHED,
        ErrorCode.FENCED_INSTANCE_ID,  # two processes share one group.instance.id
        ErrorCode.UNSUPPORTED_ASSIGNOR,
        ErrorCode.INVALID_REGULAR_EXPRESSION,
    }
)


def new_member_id() -> str:
    """v1+: the member makes its own id (Kafka's Uuid string form: base64url, no padding)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


async def resolve_topic_ids(
    cluster: ClusterClient, assigned: list[tuple[Any, list[int]]]
) -> set[TopicPartition]:
    """An assignment that names topics by id (KIP-848 and KIP-932 heartbeats), by name: the
    metadata is refreshed for ids it does not know yet; ids still unknown are left out (the
    next heartbeat resolves them). The topics found are tracked in the metadata."""
    names = cluster.cache.current.topic_names_by_id
    if any(tid not in names for tid, _ in assigned):
        names = (await cluster.refresh_metadata(None)).topic_names_by_id
    found = {
        TopicPartition(names[tid], p) for tid, parts in assigned if tid in names for p in parts
    }
    cluster.add_topics({tp.topic for tp in found})
    return found


class ConsumerGroupMember:
    def __init__(self, cluster: ClusterClient, link: CoordinatorLink, config: Any) -> None:
        self.cluster = cluster
        self.link = link
        self.group_id = str(config["group.id"])
        self.instance_id: str | None = config["group.instance.id"]
        self.rebalance_timeout_ms = int(config["max.poll.interval.ms"])
        self.server_assignor: str | None = config["group.remote.assignor"]
        self.member_id = new_member_id()
        self.epoch = 0
        self.interval_s = 5.0
        self.topics: list[str] | None = None
        self.regex: str | None = None
        # The broker's latest assignment for this member (None: none received yet), and what
        # the member owns after reconciling it (reported in heartbeats).
        self.target: set[TopicPartition] | None = None
        self._target_ids: list[Any] | None = None
        self.owned: set[TopicPartition] = set()
        self._report_owned = True
        self.lost = False
        self.fatal: BaseException | None = None
        self.left = False
        self.last_poll = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # Called when the target assignment changes or the member is fenced, so a poll waiting
        # for records reconciles at once instead of at its next wait slice.
        self.on_change: Callable[[], None] = lambda: None

    @property
    def identity(self) -> MemberIdentity:
        return MemberIdentity(self.epoch, self.member_id, self.instance_id)

    @property
    def joined(self) -> bool:
        return self.epoch > 0

    def subscribe(self, topics: list[str] | None, regex: str | None) -> None:
        self.topics, self.regex = topics, regex
        self.left = False
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def acknowledge(self, owned: set[TopicPartition]) -> None:
        """The caller reconciled: ``owned`` is what it holds now; tell the broker at once."""
        self.owned = set(owned)
        self._report_owned = True
        self.wake()

    async def _run(self) -> None:
        backoff = RetryPacing.within(None, self.cluster.retry_backoff)
        while self.fatal is None and not self.left:
            if time.monotonic() - self.last_poll > self.rebalance_timeout_ms / 1000:
                log.warning(
                    "group %r: no poll for max.poll.interval.ms (%d ms); leaving the group",
                    self.group_id,
                    self.rebalance_timeout_ms,
                )
                owned = bool(self.owned)
                await self.leave()
                self._fenced("poll timeout expired")
                self.lost = self.lost or owned  # (leave() forgot what it owned)
                self.left = False  # as Java's stale member: the next poll joins again
                return
            try:
                await self._heartbeat()
                backoff.reset()
            except _Retry as exc:
                log.debug("group %r: heartbeat: %s", self.group_id, exc)
                await backoff.pause()
                continue
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                log.debug("group %r: heartbeat failed: %s", self.group_id, exc)
                await backoff.pause()
                continue
            except asyncio.CancelledError:
                raise
            except BootstrapError as exc:
                # A cluster not reached yet: polls return nothing meanwhile, as Java's; one
                # that waiting cannot reach (TLS trust, credentials) ends the membership.
                if not is_retriable(exc):
                    self.fatal = exc
                    return
                log.debug("group %r: heartbeat: %s", self.group_id, exc)
                await backoff.pause()
                continue
            except KafkaError as exc:
                self.fatal = exc
                return
            except Exception as exc:  # a bug must not silently end the membership
                log.exception("group %r: heartbeat", self.group_id)
                self.fatal = exc
                return
            if self.epoch == 0:
                continue  # fenced: rejoin at once
            # Awake at the poll deadline too (the broker's interval is 5 s by default): a
            # member that stopped polling must leave when max.poll.interval.ms says.
            poll_due = self.last_poll + self.rebalance_timeout_ms / 1000 - time.monotonic()
            await wait_event(self._wake, max(0.0, min(self.interval_s, poll_due)))
            self._wake.clear()

    def _request(self, epoch: int) -> ConsumerGroupHeartbeatRequest:
        joining = epoch == 0
        owned = None
        if joining or self._report_owned:
            owned = self._owned_by_id()
        return ConsumerGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=epoch,
            instance_id=self.instance_id,
            rack_id=None,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            subscribed_topic_names=None if self.regex is not None else list(self.topics or []),
            subscribed_topic_regex=self.regex,
            server_assignor=self.server_assignor,
            topic_partitions=owned,
        )

    def _owned_by_id(self) -> list[OwnedTopicPartitions]:
        md = self.cluster.cache.current
        by_topic: dict[str, list[int]] = {}
        for tp in self.owned:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        out = []
        for topic, parts in sorted(by_topic.items()):
            info = md.topics.get(topic)
            if info is not None and info.topic_id is not None:
                out.append(OwnedTopicPartitions(topic_id=info.topic_id, partitions=sorted(parts)))
        return out

    async def _heartbeat(self) -> None:
        reported = self._report_owned
        version = await self.link.version(ApiKey.CONSUMER_GROUP_HEARTBEAT)
        if version == 0 and self.epoch == 0:
            self.member_id = ""  # v0: the broker names new members
        response = await self.link.send(self._request(self.epoch), version)
        code = response.error_code
        if code == ErrorCode.NONE:
            if response.member_id:
                self.member_id = response.member_id
            self.epoch = response.member_epoch
            self.interval_s = max(response.heartbeat_interval_ms, 100) / 1000
            if reported:
                self._report_owned = False
            if response.assignment is not None:
                self._target_ids = [
                    (t.topic_id, list(t.partitions)) for t in response.assignment.topic_partitions
                ]
            if self._target_ids is not None:
                before = self.target
                await self._resolve_target()
                if self.target != before:
                    self.on_change()
            return
        err = error_for_code(code, response.error_message)
        assert err is not None
        if code in (ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID):
            self._fenced(err.name)
            self.on_change()
            return
        if code == ErrorCode.UNRELEASED_INSTANCE_ID or self.link.handle_error(code):
            raise _Retry(err.name)
        if code in FATAL_CODES or not err.retriable:
            raise err.with_message(
                f"group {self.group_id!r}, ConsumerGroupHeartbeat: {err.message}"
            )
        raise _Retry(err.name)

    async def _resolve_target(self) -> None:
        """The assignment names topics by id: map them to names (the reconciliation waits for
        ids the metadata does not know yet)."""
        assert self._target_ids is not None
        self.target = await resolve_topic_ids(self.cluster, self._target_ids)

    def _fenced(self, why: str) -> None:
        """The broker dropped this member: what it owns is lost; it rejoins with epoch 0 and the
        same member id (KIP-848)."""
        log.info("group %r: member fenced (%s); rejoining", self.group_id, why)
        self.epoch = 0
        self.lost = self.lost or bool(self.owned)
        self.owned = set()
        self.target = None
        self._target_ids = None
        self._report_owned = True

    async def leave(self) -> None:
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            self._task = None
        self.left = True
        # What it was given belongs to the old membership: a later subscribe() must not take
        # it up again (it may be another member's by then).
        self.target = self._target_ids = None
        self.owned = set()
        self._report_owned = True
        if self.epoch <= 0 and self.instance_id is None:
            return
        epoch = LEAVE_STATIC_EPOCH if self.instance_id is not None else LEAVE_EPOCH
        try:
            await self.link.send(self._request(epoch), timeout=5)
        except Exception as exc:  # best effort: the session timeout removes it anyway
            log.info("group %r: leave heartbeat failed: %s", self.group_id, exc)
        self.epoch = 0


class _Retry(Exception):
    pass
