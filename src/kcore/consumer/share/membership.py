"""Share group membership (KIP-932): one RPC, ShareGroupHeartbeat, joins (epoch 0), keeps the
member alive at the interval the broker sets, carries the partitions the broker assigned, and
leaves (epoch -1). There is no reconciliation: several members may read one partition, so an
assignment is taken as it comes.

:class:`ShareMembership` is the state machine, free of I/O (a request out, a response in, an
outcome back); :class:`ShareHeartbeat` drives it on the client's event loop."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from kcore.cluster.client import ClusterClient
from kcore.cluster.coordinator import REDISCOVER_CODES, CoordinatorLink
from kcore.consumer.group_consumer import FATAL_CODES, LEAVE_EPOCH, new_member_id, resolve_topic_ids
from kcore.errors import (
    BootstrapError,
    BrokerConnectionError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    error_for_code,
    error_name,
)
from kcore.network.events import wait_event
from kcore.network.retry import RetryPacing, is_retriable
from kcore.protocol.messages.share_group_heartbeat_request import ShareGroupHeartbeatRequest
from kcore.protocol.messages.share_group_heartbeat_response import ShareGroupHeartbeatResponse
from kcore.types import TopicPartition

log = logging.getLogger("kcore.consumer.share")

__all__ = ["Outcome", "ShareHeartbeat", "ShareMembership"]

# Codes after which the member starts over with epoch 0 (same member id): the broker dropped it.
REJOIN_CODES = frozenset({ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID})
SHARE_FATAL_CODES = FATAL_CODES | {ErrorCode.TOPIC_AUTHORIZATION_FAILED}


# While a member that joined waits for its first partitions it heartbeats again after a
# fifth of the time it has waited so far, at least EARLY_HEARTBEAT_MIN_S and at most the
# broker's interval: it learns of an assignment at most ~20% (or 100 ms) after the
# coordinator made it, whatever the broker's share.assignment.interval.ms.
EARLY_HEARTBEAT_MIN_S = 0.1
EARLY_HEARTBEAT_FRACTION = 0.2


class Outcome(enum.Enum):
    JOINED = "joined"  # answered; the assignment (if it changed) is in ``assigned_ids``
    REJOIN = "rejoin"  # fenced: join again at once
    REDISCOVER = "rediscover"  # the coordinator moved: find it, then retry
    RETRY = "retry"  # transient: back off, then retry
    FATAL = "fatal"  # ``ShareMembership.fatal`` says why; the membership is over


class ShareMembership:
    """The member's side of ShareGroupHeartbeat, without I/O."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.member_id = new_member_id()  # kept for the consumer's life, across rejoins
        self.epoch = 0
        self.interval_s = 5.0  # until the broker says
        self.topics: list[str] | None = None  # None: not subscribed
        self._topics_sent = False  # whether the broker has the current subscription
        # The broker's latest assignment (topic id, partitions); None: none received yet.
        self.assigned_ids: list[tuple[uuid.UUID, list[int]]] | None = None
        self.fatal: KcoreError | None = None
        # Between a join and its first partitions (see next_heartbeat_s): since when, on the
        # clock of next_heartbeat_s's caller (None: not asked yet).
        self._awaiting_partitions = False
        self._waiting_since: float | None = None

    @property
    def joined(self) -> bool:
        return self.epoch > 0

    @property
    def has_partitions(self) -> bool:
        return any(parts for _, parts in self.assigned_ids or ())

    def next_heartbeat_s(self, now: float) -> float:
        """How long from ``now`` (a monotonic clock) until the next heartbeat: the broker's
        interval, except while a member that joined has no partitions yet. The coordinator
        computes assignments apart from the heartbeats (every ``share.assignment.interval.ms``,
        1 s by default, KIP-1263), so the join's answer usually carries an empty one; waiting
        the whole heartbeat interval (5 s by default) would leave the member idle that long.
        The early waits grow with the time waited (see EARLY_HEARTBEAT_FRACTION): about ten
        requests in the first second, fewer and fewer after, none once partitions came."""
        if self._awaiting_partitions and self.joined and not self.has_partitions:
            if self._waiting_since is None:
                self._waiting_since = now
            waited = now - self._waiting_since
            early = max(EARLY_HEARTBEAT_MIN_S, waited * EARLY_HEARTBEAT_FRACTION)
            return min(early, self.interval_s)
        return self.interval_s

    def subscribe(self, topics: list[str]) -> None:
        self.topics = sorted(set(topics))
        self._topics_sent = False

    def unsubscribe(self) -> None:
        self.topics = None
        self.assigned_ids = None

    def request(self) -> ShareGroupHeartbeatRequest:
        """The next heartbeat: the subscription goes with a join and after it changed."""
        send_topics = self.epoch == 0 or not self._topics_sent
        return ShareGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.epoch,
            rack_id=None,
            subscribed_topic_names=list(self.topics or []) if send_topics else None,
        )

    def leave_request(self) -> ShareGroupHeartbeatRequest:
        return ShareGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=LEAVE_EPOCH
        )

    def left(self) -> None:
        self.epoch = 0
        self.assigned_ids = None

    def on_response(
        self, request: ShareGroupHeartbeatRequest, response: ShareGroupHeartbeatResponse
    ) -> Outcome:
        code = response.error_code
        if code == ErrorCode.NONE:
            if response.member_id:
                self.member_id = response.member_id
            if self.epoch == 0:  # joined (again): its partitions are asked for early
                self._awaiting_partitions, self._waiting_since = True, None
            self.epoch = response.member_epoch
            self.interval_s = max(response.heartbeat_interval_ms, 100) / 1000
            if request.subscribed_topic_names is not None and request.subscribed_topic_names == (
                self.topics or []
            ):
                self._topics_sent = True
            if response.assignment is not None:
                self.assigned_ids = [
                    (t.topic_id, list(t.partitions)) for t in response.assignment.topic_partitions
                ]
                if self.has_partitions:
                    self._awaiting_partitions = False
            return Outcome.JOINED
        if code in REJOIN_CODES:
            log.info(
                "share group %r: member %s dropped (%s); rejoining",
                self.group_id,
                self.member_id,
                error_name(code),
            )
            self.epoch = 0
            self.assigned_ids = []  # what it was given is no longer its own
            self._topics_sent = False
            return Outcome.REJOIN
        if code in REDISCOVER_CODES:
            return Outcome.REDISCOVER
        err = error_for_code(code, response.error_message)
        assert err is not None
        if code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS or (
            code not in SHARE_FATAL_CODES and err.retriable
        ):
            return Outcome.RETRY
        self.fatal = err.with_message(
            f"share group {self.group_id!r}, ShareGroupHeartbeat: {err.message}"
        )
        self.assigned_ids = []
        return Outcome.FATAL


class ShareHeartbeat:
    """Runs a :class:`ShareMembership` on the event loop: heartbeats at the broker's interval
    (at once after a change), and tells ``on_assignment`` the partitions assigned whenever
    they change (an empty set when fenced or failed)."""

    def __init__(
        self,
        cluster: ClusterClient,
        link: CoordinatorLink,
        membership: ShareMembership,
        on_assignment: Callable[[set[TopicPartition]], None],
        max_poll_interval_s: float = 300.0,
        before_poll_timeout_leave: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.link = link
        self.membership = membership
        self.on_assignment = on_assignment
        self.assigned: set[TopicPartition] = set()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.connect_error: BaseException | None = None  # a bootstrap waiting cannot fix
        # max.poll.interval.ms: a member that stops polling leaves the group (its records go
        # to the others); its next poll joins again.
        self.max_poll_interval_s = max_poll_interval_s
        self.last_poll = time.monotonic()
        self.left_for_poll_timeout = False
        # Run before leaving for not polling: the consumer gives back what it holds.
        self.before_poll_timeout_leave = before_poll_timeout_leave

    def polled(self) -> bool:
        """The application polled (any thread): the member is alive. Returns whether it had
        left for not polling (the caller starts it again, on the event loop)."""
        self.last_poll = time.monotonic()
        left, self.left_for_poll_timeout = self.left_for_poll_timeout, False
        return left

    def start(self) -> None:
        """Heartbeat from now on; when already heartbeating, once more at once (the
        subscription changed). A new task's first heartbeat goes at once: a wake left set
        would send a second one right after it."""
        if self._task is None or self._task.done():
            self._wake.clear()
            self._task = asyncio.get_running_loop().create_task(self._run())
        else:
            self.wake()

    def wake(self) -> None:
        self._wake.set()

    def _assign(self, partitions: set[TopicPartition]) -> None:
        if partitions != self.assigned:
            self.assigned = partitions
            self.on_assignment(set(partitions))

    async def _run(self) -> None:
        m = self.membership
        backoff = RetryPacing.within(None, self.cluster.retry_backoff)
        while m.fatal is None and m.topics is not None:
            if time.monotonic() - self.last_poll > self.max_poll_interval_s:
                log.warning(
                    "share group %r: no poll for max.poll.interval.ms (%d ms); leaving the group",
                    m.group_id,
                    self.max_poll_interval_s * 1000,
                )
                if self.before_poll_timeout_leave is not None:
                    try:
                        await self.before_poll_timeout_leave()
                    except Exception:  # noqa: BLE001 - leaving matters more
                        log.exception("share group %r: giving records back", m.group_id)
                await self._send_leave(5.0)
                self.left_for_poll_timeout = True
                return
            request = m.request()
            try:
                response = await self.link.send(request)
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                log.debug("share group %r: heartbeat failed: %s", m.group_id, exc)
                await backoff.pause()
                continue
            except BootstrapError as exc:
                if not is_retriable(exc):
                    self.connect_error = exc
                    self._assign(set())
                    return
                await backoff.pause()
                continue
            except KafkaError as exc:  # the coordinator lookup's (e.g. the group denied)
                if exc.retriable:
                    await backoff.pause()
                    continue
                m.fatal = exc
                self._assign(set())
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not silently end the membership
                log.exception("share group %r: heartbeat", m.group_id)
                m.fatal = KcoreError(f"share group {m.group_id!r}: heartbeat failed: {exc!r}")
                self._assign(set())
                return
            outcome = m.on_response(request, response)
            if outcome is Outcome.JOINED:
                backoff.reset()
                if m.assigned_ids is not None:
                    self._assign(await resolve_topic_ids(self.cluster, m.assigned_ids))
                # Awake at the poll deadline too, to leave on time.
                poll_due = self.last_poll + self.max_poll_interval_s - time.monotonic()
                next_s = m.next_heartbeat_s(time.monotonic())
                await wait_event(self._wake, max(0.0, min(next_s, poll_due + 0.01)))
                self._wake.clear()
            elif outcome is Outcome.REJOIN:
                self._assign(set())
            elif outcome is Outcome.REDISCOVER:
                self.link.mark_dead(error_name(response.error_code))
                await backoff.pause()
            elif outcome is Outcome.RETRY:
                await backoff.pause()
            else:
                self._assign(set())
                return

    async def leave(self, timeout: float) -> None:
        """Stop heartbeating and leave the group (best effort within ``timeout``: the session
        timeout removes the member anyway)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.left_for_poll_timeout = False
        await self._send_leave(timeout)

    async def _send_leave(self, timeout: float) -> None:
        m = self.membership
        if m.joined:
            try:
                await self.link.send(m.leave_request(), timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - best effort, as the docstring says
                log.info("share group %r: leave heartbeat failed: %s", m.group_id, exc)
        m.left()
        self._assign(set())
