"""``GroupCoordinator``: the consumer's side of its group: the subscription, membership (classic
or KIP-848), the rebalance steps run inside ``poll`` (revoke, join, fetch committed offsets,
assign, with the caller's listeners), offset commits and auto-commit.

The steps are written once, as generators that yield the I/O they need (coroutines to run on
the event loop) and the listener calls to make; :func:`drive_sync` runs them for the blocking
``Consumer`` (listeners run in the caller's thread, so a listener may call ``commit``) and
:func:`drive_async` for ``AsyncConsumer``."""

from __future__ import annotations

import asyncio
import inspect
import logging
import operator
import re
import time
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kcore.cluster.client import ClusterClient
from kcore.cluster.coordinator import GROUP, CoordinatorLink
from kcore.cluster.group_offsets import GroupOffsets
from kcore.consumer.assignors import assignor_for
from kcore.consumer.group_classic import ClassicGroupMember
from kcore.consumer.group_consumer import ConsumerGroupMember
from kcore.errors import (
    CommitFailedError,
    KcoreError,
    KcoreTimeoutError,
    RebalanceInProgressError,
    TopicAuthorizationFailedError,
    WakeupError,
)
from kcore.network.retry import Deadline
from kcore.types import ConsumerGroupMetadata, TopicPartition

log = logging.getLogger("kcore.consumer.group")

Listener = Callable[[list[TopicPartition]], Any]


@dataclass
class ListenerCall:
    """A step asks its driver to call a rebalance listener (in the caller's context)."""

    fn: Listener
    partitions: list[TopicPartition]
    what: str


Step = Generator[Any, Any, Any]


class Assignment(Protocol):
    """What the group needs from the consumer's partition state."""

    def owned(self) -> set[TopicPartition]: ...
    def positions_to_commit(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]: ...
    def add_partitions(self, partitions: Iterable[TopicPartition]) -> None: ...
    def remove_partitions(self, partitions: Iterable[TopicPartition]) -> None: ...
    def interrupt_wait(self) -> None: ...


class GroupCoordinator:
    def __init__(self, cluster: ClusterClient, config: Any, assignment: Assignment) -> None:
        self.cluster = cluster
        self.config = config
        self.assignment = assignment
        self.group_id = str(config["group.id"])
        self.link = CoordinatorLink(cluster, self.group_id, GROUP)
        self.offsets = GroupOffsets(self.link, self.group_id)
        self.protocol = str(config["group.protocol"]).lower()
        self.member: ClassicGroupMember | ConsumerGroupMember
        if self.protocol == "consumer":
            self.member = ConsumerGroupMember(cluster, self.link, config)
        else:
            names = config["partition.assignment.strategy"]
            if isinstance(names, str):
                names = [n.strip() for n in names.split(",") if n.strip()]
            self.member = ClassicGroupMember(
                cluster, self.link, config, [assignor_for(n) for n in names]
            )
        self.member.on_change = assignment.interrupt_wait
        self.auto_commit = bool(config["enable.auto.commit"])
        self.auto_commit_interval_s = int(config["auto.commit.interval.ms"]) / 1000
        self.next_auto_commit = time.monotonic() + self.auto_commit_interval_s
        self.api_timeout_s = int(config["default.api.timeout.ms"]) / 1000
        self.topics: list[str] = []
        self.pattern: re.Pattern[str] | None = None
        self.on_assign: Listener | None = None
        self.on_revoke: Listener | None = None
        self.on_lost: Listener | None = None
        self.subscribed = False
        self._joined_topics: set[str] = set()  # what this member subscribed to at its last join
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the consumer's start
        self._listener_error: Exception | None = None  # raised when the poll step ends
        # Auto-commits in flight: the loop keeps only weak references to tasks; each future
        # holds its task until it is done.
        self._pending_commits: set[Any] = set()
        self._authorization_checked = -1  # the metadata answer last checked for denied topics
        self._poll_timeout = 0.0  # how long this poll may wait for a join
        # Rebalances seen (each assignment handed to this member, each revocation or loss of
        # partitions), the last when and why: the statistics' cgrp. Written by the poll's
        # steps, read by the statistics (plain values: a read sees one or the other).
        self.rebalances = 0
        self.rebalanced_at: float | None = None
        self.rebalance_reason = ""
        self._join_reason = ""

    # -- subscription (any thread) ----------------------------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str] | str | re.Pattern[str],
        on_assign: Listener | None,
        on_revoke: Listener | None,
        on_lost: Listener | None,
    ) -> None:
        if isinstance(topics, re.Pattern):
            self.pattern, self.topics = topics, []
        elif isinstance(topics, str) and topics.startswith("^"):
            self.pattern, self.topics = re.compile(topics), []  # librdkafka's convention
        elif isinstance(topics, str):
            self.pattern, self.topics = None, [topics]
        else:
            self.pattern, self.topics = None, sorted(set(topics))
        if self.pattern is not None:
            self.cluster.all_topics = True
            self.cluster.cache.request_update()
        else:
            self.cluster.add_topics(self.topics)
        self.on_assign, self.on_revoke, self.on_lost = on_assign, on_revoke, on_lost
        self.subscribed = True
        if isinstance(self.member, ConsumerGroupMember):
            regex = self.pattern.pattern if self.pattern is not None else None
            self.member.subscribe(self.topics if regex is None else None, regex)
        else:
            self.member.request_rejoin("subscription changed")

    def matched_topics(self) -> set[str]:
        md = self.cluster.cache.current
        if self.pattern is None:
            return set(self.topics)
        return {
            t for t, info in md.topics.items() if not info.is_internal and self.pattern.fullmatch(t)
        }

    def group_metadata(self) -> ConsumerGroupMetadata:
        ident = self.member.identity
        return ConsumerGroupMetadata(
            self.group_id, ident.generation, ident.member_id, ident.group_instance_id
        )

    # -- the step run by every poll ---------------------------------------------------------------

    def poll_step(self, timeout: float = 0.0) -> Step:
        """Everything group-related a poll does before it returns records; a classic
        rebalance is waited for up to ``timeout`` (what is left of the poll's), and goes on at
        the next poll. A listener's exception is raised once the step has finished (as Java's
        poll does)."""
        self._listener_error = None
        self._poll_timeout = timeout
        yield from self._poll_step()
        if self._listener_error is not None:
            error, self._listener_error = self._listener_error, None
            raise error

    def _listener(self, fn: Listener, partitions: list[TopicPartition], what: str) -> Step:
        try:
            yield ListenerCall(fn, partitions, what)
        except Exception as exc:  # the rebalance goes on; poll raises it at the end
            log.exception("%s listener failed", what)
            if self._listener_error is None:
                self._listener_error = exc

    def _poll_step(self) -> Step:
        member = self.member
        if member.fatal is not None:
            if isinstance(member, ClassicGroupMember):
                member.cancel_join()  # (its failed join's exception is the fatal one)
            raise member.fatal
        member.last_poll = time.monotonic()
        if self.subscribed:
            if isinstance(member, ClassicGroupMember):
                yield from self._classic_step(member)
            else:
                yield from self._consumer_protocol_step(member)
        if self.auto_commit and time.monotonic() >= self.next_auto_commit and not self._joining():
            self.next_auto_commit = time.monotonic() + self.auto_commit_interval_s
            self._commit_in_background(self.assignment.positions_to_commit(self.assignment.owned()))

    def _rebalanced(self, reason: str) -> None:
        self.rebalances += 1
        self.rebalanced_at = time.monotonic()
        self.rebalance_reason = reason

    def _lost_step(self) -> Step:
        owned = sorted(self.assignment.owned())
        if owned:
            self._rebalanced("partitions lost: the group dropped this member")
            # As Java: partitions lost get on_lost (falling back to on_revoke), and no commit.
            fn = self.on_lost or self.on_revoke
            if fn is not None:
                yield from self._listener(fn, owned, "on_lost")
            self.assignment.remove_partitions(owned)

    def _revoke_step(
        self, partitions: list[TopicPartition], deadline: Deadline | None = None
    ) -> Step:
        if not partitions:
            return
        self._rebalanced(self._join_reason or "partitions revoked")
        if self.auto_commit:
            try:
                yield _bounded(
                    self._commit_coro(self.assignment.positions_to_commit(partitions)), deadline
                )
            except WakeupError:
                raise
            except KcoreError as exc:
                log.warning("group %r: commit before revoke failed: %s", self.group_id, exc)
        if self.on_revoke is not None:
            yield from self._listener(self.on_revoke, partitions, "on_revoke")
        self.assignment.remove_partitions(partitions)

    def _assign_step(self, partitions: list[TopicPartition]) -> Step:
        # As Java: the partitions are this member's at once; the fetcher looks up their
        # committed offsets (then auto.offset.reset), retrying on errors. Fetching them here
        # first lost the partitions for good when that lookup failed (the join was done).
        self._rebalanced(self._join_reason or "partitions assigned")
        self.assignment.add_partitions(partitions)
        if self.on_assign is not None:
            yield from self._listener(self.on_assign, partitions, "on_assign")

    def _topic_snapshot(self, topics: set[str]) -> dict[str, int]:
        md = self.cluster.cache.current
        return {t: len(md.topics[t].partitions) for t in topics if t in md.topics}

    def _metadata_changed(self, member: ClassicGroupMember, topics: set[str]) -> bool:
        """A rejoin is due when the topics this member subscribes to changed (a pattern matched
        a new topic), or, for the leader, the partition counts its assignment used changed
        (the leader sees every member's topics). Followers do not compare partition counts:
        their metadata may lag the leader's, and a rejoin on that is a needless rebalance."""
        if topics != self._joined_topics:
            return True
        counts = member.assigned_counts
        return counts is not None and self._topic_snapshot(set(counts)) != counts

    def _check_topic_authorization(self) -> None:
        """As Java's classic consumer: subscribed topics (by name) that the metadata says this
        client may not access raise from poll, once per metadata refresh; the rest of the
        subscription is read meanwhile. (A pattern only matches topics the client may see;
        under KIP-848 the broker answers the heartbeat with the error itself.)"""
        cache = self.cluster.cache
        if self.pattern is not None or cache.updates == self._authorization_checked:
            return
        self._authorization_checked = cache.updates
        denied = sorted(cache.current.unauthorized_topics.intersection(self.topics))
        if denied:
            raise TopicAuthorizationFailedError(
                f"group {self.group_id!r}: not authorized to access subscribed topics: "
                + ", ".join(denied)
            )

    def _classic_step(self, member: ClassicGroupMember) -> Step:
        self._check_topic_authorization()
        if member.lost:
            yield from self._lost_step()
            member.lost = False
        topics = self.matched_topics()
        pending = member.join_pending  # joined meanwhile, maybe: its outcome is taken below
        if member.joined and not pending and self._metadata_changed(member, topics):
            member.request_rejoin("the subscribed topics or their partitions changed")
        if member.rejoin_reason is None and member.joined and not pending:
            return
        owned = self.assignment.owned()
        if not pending:
            self._join_reason = member.rejoin_reason or "joining the group"
        if not member.cooperative:
            yield from self._revoke_step(sorted(owned))  # eager: give everything up first
            owned = set()
        if not topics and self.pattern is None:
            return
        got = yield member.join_within(topics, owned, self._poll_timeout)
        if got is None:
            return  # still joining: this poll returns what it has
        member.join_taken()
        if not member.joined:
            # The group dropped the member between the join and this poll (a heartbeat's
            # UNKNOWN_MEMBER_ID, the poll timeout): that assignment is void, as Java's
            # hasGenerationReset; a rejoin is due.
            return
        assigned = set(got)
        self._joined_topics = set(member.join_topics)
        revoked = sorted(owned - assigned)
        added = sorted(assigned - owned)
        if revoked:  # cooperative: hand these over, then rejoin so they can be reassigned
            yield from self._revoke_step(revoked)
            member.request_rejoin("revoked partitions for another member")
        yield from self._assign_step(added)

    def _consumer_protocol_step(self, member: ConsumerGroupMember) -> Step:
        if not member.running and member.fatal is None and not member.left:
            yield member.start()
        if member.lost:
            yield from self._lost_step()
            member.lost = False
        target = member.target
        if target is None:
            return
        owned = self.assignment.owned()
        if target == owned and member.owned == owned:
            return
        epoch = member.epoch
        self._join_reason = "the group coordinator sent a new assignment"
        yield from self._revoke_step(sorted(owned - target))
        yield from self._assign_step(sorted(target - owned))
        if member.epoch == epoch and member.target is target:
            member.acknowledge(target)

    def statistics(self) -> dict[str, Any]:
        """The statistics' ``cgrp`` object (librdkafka's names; rebalance_age in ms)."""
        member = self.member
        if isinstance(member, ClassicGroupMember):
            join_state = (
                "steady" if member.joined else "wait-join" if member.join_pending else "init"
            )
        else:
            join_state = "steady" if member.running and member.target is not None else "init"
        out: dict[str, Any] = {
            "state": "up" if self.link.node_id is not None else "wait-coord",
            "join_state": join_state,
            "rebalance_cnt": self.rebalances,
            "rebalance_reason": self.rebalance_reason,
            "assignment_size": len(self.assignment.owned()),
        }
        if self.rebalanced_at is not None:
            out["rebalance_age"] = int((time.monotonic() - self.rebalanced_at) * 1000)
        return out

    # -- commits ----------------------------------------------------------------------------------

    def _joining(self) -> bool:
        """A classic member between a rejoin's start and its result (commits wait for it)."""
        member = self.member
        return (
            self.subscribed
            and isinstance(member, ClassicGroupMember)
            and (member.join_pending or not member.joined)
        )

    async def _commit_coro(self, offsets: Mapping[TopicPartition, tuple[int, int]]) -> None:
        """Commit ``offsets``: each an offset and the leader epoch of the record before it
        (KIP-320; -1 when unknown, as for offsets the caller names)."""
        if offsets and self._joining():
            # As Java: not sent (it would go out as generation -1 and fail as if the group had
            # moved on); the partitions are still this member's until the join says otherwise.
            raise RebalanceInProgressError(
                f"offset commit of group {self.group_id!r}: the group is rebalancing; poll to "
                "finish joining, then commit again"
            )
        plain = {tp: offset for tp, (offset, _) in offsets.items()}
        epochs = {tp: epoch for tp, (_, epoch) in offsets.items()}
        try:
            await self.offsets.commit(
                plain, self.member.identity, self.api_timeout_s, epochs=epochs
            )
        except (CommitFailedError, RebalanceInProgressError):
            if isinstance(self.member, ClassicGroupMember):
                self.member.request_rejoin("a commit found the group rebalanced")
            raise

    def commit_coro(
        self, offsets: Mapping[TopicPartition, int] | None
    ) -> Coroutine[Any, Any, None]:
        if offsets is None:
            return self._commit_coro(self.assignment.positions_to_commit(self.assignment.owned()))
        return self._commit_named(dict(offsets))

    async def _commit_named(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Offsets the caller names: no leader epoch (a bad offset fails the commit's future
        under ``asynchronous``, not the call)."""
        await self._commit_coro({tp: (operator.index(o), -1) for tp, o in offsets.items()})

    def _commit_in_background(self, offsets: Mapping[TopicPartition, tuple[int, int]]) -> None:
        """Auto-commit: fire and forget (a failure is logged; the next one carries on)."""
        if not offsets:
            return
        loop = self.loop
        if loop is None:
            return

        async def commit() -> None:
            try:
                await self._commit_coro(offsets)
            except Exception as exc:
                log.warning("group %r: auto-commit failed: %s", self.group_id, exc)

        fut = asyncio.run_coroutine_threadsafe(commit(), loop)
        self._pending_commits.add(fut)
        fut.add_done_callback(self._pending_commits.discard)

    async def close(self, commit: bool) -> None:
        """Commit (auto-commit only) and leave the group (if :meth:`leave_step` has not)."""
        if commit and self.auto_commit:
            try:
                await self._commit_coro(
                    self.assignment.positions_to_commit(self.assignment.owned())
                )
            except Exception as exc:
                log.warning("group %r: commit on close failed: %s", self.group_id, exc)
        if self.subscribed:
            self.subscribed = False
            await self.member.leave()

    def leave_step(self, timeout: float | None = None) -> Step:
        """``unsubscribe()`` and ``close()``, as Java's onLeavePrepare then LeaveGroup: what
        this member owns is given up first (committed under auto-commit, then ``on_revoke``;
        ``on_lost`` instead if the group already took it), then the member leaves. The group's
        I/O is bounded by ``timeout`` (not the listeners); a listener's exception is raised
        once the member has left."""
        if not self.subscribed:
            return
        deadline = None if timeout is None else Deadline(timeout)
        self._listener_error = None
        member = self.member
        if member.lost:
            yield from self._lost_step()
            member.lost = False
        else:
            yield from self._revoke_step(sorted(self.assignment.owned()), deadline)
        self.subscribed = False
        try:  # at least 2 s for it, even if the commit used the time up
            yield _bounded(
                member.leave(),
                deadline and Deadline.at_time(max(deadline.at, time.monotonic() + 2)),
            )
        except Exception as exc:  # best effort: the session timeout removes the member anyway
            log.info("group %r: leaving failed: %s", self.group_id, exc)
        if self._listener_error is not None:
            error, self._listener_error = self._listener_error, None
            raise error


async def _bounded(coro: Coroutine[Any, Any, Any], deadline: Deadline | None) -> Any:
    """``coro`` cut off at ``deadline`` (None: not cut off)."""
    if deadline is None:
        return await coro
    try:
        return await asyncio.wait_for(coro, max(0.0, deadline.remaining()))
    except asyncio.TimeoutError:
        raise KcoreTimeoutError("the group did not answer in time") from None


# -- drivers ---------------------------------------------------------------------------------------


def drive_sync(step: Step, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> Any:
    """Run a step from a blocking caller: its coroutines on the event loop (via ``run``), its
    listener calls here, in the caller's thread; each outcome goes back into the step."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = step.throw(error) if error is not None else step.send(value)
        except StopIteration as stop:
            return stop.value
        try:
            if isinstance(effect, ListenerCall):
                result = effect.fn(effect.partitions)
                value = run(result) if inspect.isawaitable(result) else result  # type: ignore[arg-type]
            else:
                value = run(effect)
            error = None
        except BaseException as exc:
            value, error = None, exc


async def drive_async(step: Step) -> Any:
    """:func:`drive_sync` for ``AsyncConsumer``: listeners may be coroutine functions."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = step.throw(error) if error is not None else step.send(value)
        except StopIteration as stop:
            return stop.value
        try:
            if isinstance(effect, ListenerCall):
                result = effect.fn(effect.partitions)
                value = await result if inspect.isawaitable(result) else result
            else:
                value = await effect
            error = None
        except BaseException as exc:
            value, error = None, exc
