"""The fetcher: keeps one Fetch request in flight to every leader of an assigned partition, and
hands the record bytes that come back to ``poll`` (on the caller's thread) through the fetch
buffer (fetch_buffer.py). Each broker's fetches share a fetch session (KIP-227, see
fetch_session.py). Partitions without a position get one here: the group's committed offset,
or ``auto.offset.reset`` looked up with ListOffsets (kcore.cluster.offsets); a position whose
leader changed is checked first (validator.py).

Runs on the client's event loop. Positions (positions.py) move as ``poll`` hands records out;
the fetcher reads ahead of them: a partition is fetched again from the end of its queued data
while fewer than PREFETCH_RESPONSES of its responses wait (and the queue holds less than
``fetch.max.bytes``), so one busy partition keeps its broker's fetches answering at once instead
of waiting ``fetch.max.wait.ms`` on idle partitions. Queued data whose fetch offset no longer
matches the position when ``poll`` reaches it (a seek happened meanwhile) is dropped.

A broker fills ``max.partition.fetch.bytes`` for a partition with part of a batch when the next
batch is larger; only the first partition of a request gets a whole oversized batch (KIP-74).
So a partition that got only part of a batch asks for the whole batch's size next time (as
librdkafka grows its limit). Partitions are also named longest-waiting first (as Java rotates
them), which orders full requests; within a session the broker keeps its own order.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kcore.cluster.client import ClusterClient
from kcore.cluster.metadata import STALE_METADATA_CODES, apply_leader_hints
from kcore.cluster.offsets import OffsetLookup, OffsetLookupError, list_offsets
from kcore.codec import scan_complete_batches
from kcore.consumer.fetch_buffer import NO_PARTITION, FetchBuffer, FetchedData
from kcore.consumer.fetch_session import (
    FINAL_EPOCH,
    SESSION_ERROR_CODES,
    FetchSession,
    PartitionFetch,
)
from kcore.consumer.positions import PartitionState, Positions
from kcore.consumer.validation import ValidationAsk
from kcore.consumer.validator import PositionValidator
from kcore.errors import (
    BootstrapError,
    BrokerConnectionError,
    CorruptRecordError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    error_for_code,
)
from kcore.metrics import ClientMetrics
from kcore.network.events import wait_event
from kcore.network.retry import Deadline, RetryPacing, is_retriable
from kcore.protocol import ApiKey
from kcore.protocol.messages import FetchRequest
from kcore.protocol.messages.fetch_request import FetchPartition, FetchTopic, ForgottenTopic
from kcore.types import TopicPartition

__all__ = ["PREFETCH_RESPONSES", "Fetcher", "declare_fetch_metrics"]

BATCH_HEADER = 12  # base offset (8) and length (4): the same in magic 0, 1 and 2
# The shortest a batch's length field can be: a magic 0 message with neither key nor value
# (crc, magic, attributes and the two lengths), as Java's RECORD_OVERHEAD_V0.
MIN_BATCH_LENGTH = 14
MAX_INT32 = 2**31 - 1
PREFETCH_RESPONSES = 3  # per partition, queued ahead of poll
# While other partitions of a node are held back for what they have queued, a fetch of only
# partitions read to their end is put off this long and then asked not to wait at the broker
# (see _send_fetches).
HELD_BACK_WAIT_MS = 50
# Answers in a row holding only record batches that end before the fetch offset, after which
# each such answer stops the partition with CorruptRecordError. A broker answers from the batch
# that holds the offset, so one never sends such an answer; a peer that keeps doing so would
# have the consumer fetch the same offset again and again. The first ones are retried after
# the fetch-error backoff (in case a peer's glitch passes), never at once.
NO_PROGRESS_ANSWERS = 3

log = logging.getLogger("kcore.consumer")

TOPIC_ID_VERSION = 13


# The group's committed offsets of some partitions, each with its leader epoch (None: nothing
# committed).
CommittedLookup = Callable[
    [list[TopicPartition]], Awaitable[dict[TopicPartition, tuple[int, int] | None]]
]


def declare_fetch_metrics(metrics: ClientMetrics) -> None:
    """The sensors every consumer's fetching records, under Java's fetch-manager names (the
    plain and the share consumer's alike): records and bytes consumed, and each fetch's
    latency, size and throttle time, with the fetch count and rate they give."""
    metrics.declare("records-consumed", "total", "rate")
    metrics.declare("bytes-consumed", "total", "rate")
    metrics.declare("fetch-latency", "avg", "max")
    metrics.declare("fetch-size", "avg", "max")
    metrics.declare("fetch-throttle-time", "avg", "max")
    metrics.gauge("fetch-total", lambda: metrics.count("fetch-latency"))
    metrics.gauge("fetch-rate", lambda: metrics.rate_of("fetch-latency"))


@dataclass
class Fetcher:
    cluster: ClusterClient
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partition_max_bytes: int
    isolation_level: int
    reset_policy: str  # earliest, latest, none, by_duration
    reset_duration_s: float = 0.0  # by_duration's
    api_timeout_s: float = 60.0  # default.api.timeout.ms: how long an offset lookup may take
    positions: Positions = field(default_factory=Positions)  # what to fetch from where
    buffer: FetchBuffer = field(default_factory=FetchBuffer)  # what poll takes from
    _wakeup: asyncio.Event | None = None
    _busy_nodes: set[int] = field(default_factory=set)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _stopped: bool = False
    _sessions: dict[int, FetchSession] = field(default_factory=dict)
    _reset_task: asyncio.Task[None] | None = None
    _reported_no_position: set[TopicPartition] = field(default_factory=set)
    _last_reset_error: str | None = None
    _served: int = 0
    # Nodes whose fetch of caught-up partitions is put off (see _send_fetches): when it is due
    _put_off: dict[int, float] = field(default_factory=dict)
    # Set when the consumer has a group.id.
    committed_lookup: CommittedLookup | None = None
    validator: PositionValidator = field(init=False)  # checks positions after leader changes

    def __post_init__(self) -> None:
        self.validator = PositionValidator(
            self.cluster,
            self.positions,
            self.buffer,
            self.reset_policy,
            self._back_off,
            self.wakeup,
        )

    def wakeup(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def run(self) -> None:
        self._wakeup = asyncio.Event()
        self.buffer.start()
        self.cluster.cache.on_update.append(self.wakeup)  # a leader found: fetch from it now
        while not self._stopped:
            self._wakeup.clear()
            # Offset lookups run beside the fetches (a lookup may wait for a leader for a
            # while; the other partitions go on being fetched meanwhile).
            if self._reset_task is None or self._reset_task.done():
                if self.positions.lacking_position():
                    self._reset_task = asyncio.get_running_loop().create_task(self._reset_guarded())
                else:  # every partition has a position: report the next one to lose it
                    self._reported_no_position.clear()
            try:
                self._send_fetches()
            except Exception as exc:  # a bug must not stop fetching for good: report it
                log.exception("fetcher")
                self._deliver_error(KcoreError(f"the fetcher failed: {exc!r}"))
                await asyncio.sleep(self.cluster.retry_backoff.initial_ms / 1000)
            due = min(self._put_off.values(), default=math.inf) - time.monotonic()
            await wait_event(self._wakeup, min(0.5, due))

    def leader_epoch(self, tp: TopicPartition) -> int:
        """The partition leader's epoch in the current metadata (-1: unknown)."""
        info = self.cluster.metadata.partition(tp.topic, tp.partition)
        return info.leader_epoch if info is not None else -1

    def lacks_reset(self, tp: TopicPartition) -> bool:
        """``tp`` was found to have no committed offset under ``auto.offset.reset=none``."""
        return tp in self._reported_no_position

    async def _reset_guarded(self) -> None:
        """Partitions without a position get one (:meth:`_reset_positions`), the lookups
        retried until they do: after a backoff (retry.backoff.ms, growing to
        retry.backoff.max.ms while they keep failing), lasting failures reported to poll once.
        The fetch loop is woken only when there is news (a position found): waking it at every
        retry made an idle consumer spin a core."""
        pacing = RetryPacing(Deadline(math.inf), self.cluster.retry_backoff)
        while True:
            try:
                found = await self._reset_positions()
                self._last_reset_error = None
                if found:
                    self.wakeup()
                return
            except BootstrapError as exc:
                # The cluster not reached yet: poll returns nothing meanwhile, as Java's. A
                # bootstrap that waiting cannot fix reaches poll once and ends the lookups.
                if not is_retriable(exc):
                    self._report_reset_error(exc)
                    return
                log.info("fetcher: offset lookup: %s", exc)
            except (KafkaError, BrokerConnectionError, KcoreTimeoutError) as exc:
                if isinstance(exc, KafkaError) and not exc.retriable:
                    self._report_reset_error(exc)
                log.info("fetcher: offset lookup: %s", exc)
            except OffsetLookupError as exc:
                # The partitions that answered have their positions; those without a leader
                # (or another passing failure) are asked again; lasting failures (a partition
                # that does not exist) reach poll.
                lasting = {tp: e for tp, e in exc.errors.items() if not _passing(e)}
                if lasting:
                    self._report_reset_error(OffsetLookupError(lasting, exc.results))
                log.info("fetcher: offset lookup: %s", exc)
                if exc.results:
                    self.wakeup()  # those have positions: fetch them now
            except KcoreError as exc:
                self._report_reset_error(exc)
            except Exception as exc:  # a bug: reported, and the lookup goes on after a backoff
                log.exception("fetcher: offset lookup")
                self._deliver_error(KcoreError(f"the offset lookup failed: {exc!r}"))
            await pacing.pause()

    def _report_reset_error(self, exc: BaseException) -> None:
        """To poll once, not at every retry of the same failing lookup."""
        if str(exc) != self._last_reset_error:
            self._last_reset_error = str(exc)
            self._deliver_error(exc)

    async def _reset_positions(self) -> bool:
        """Partitions without a position get one: a pending seek_to_beginning/end, else the
        group's committed offset (manual assignment with a group.id), else
        ``auto.offset.reset``. True when some partition got one, or was sought to the other
        end during the lookup (the fetch loop, woken, looks it up at once, not at its next
        turn)."""
        found = await self._positions_from_committed()
        with self.positions.locked():
            # Not those still waiting for their committed offset (added during that lookup).
            todo = {
                tp: st.reset_to or self.reset_policy
                for tp, st in self.positions.items()
                if st.position is None and not (st.from_committed and st.reset_to is None)
            }
        if not todo:
            return False
        without = {tp for tp, policy in todo.items() if policy == "none"}
        new = without - self._reported_no_position
        self._reported_no_position = without  # once per partition, until it gets a position
        if new:
            self._deliver_error(NoOffsetForPartitionError(sorted(new)))
        todo = {tp: p for tp, p in todo.items() if p != "none"}
        if not todo:
            return found
        found_offsets = await self._look_up(todo)
        with self.positions.locked():
            for tp, result in found_offsets.offsets.items():
                st = self.positions.get(tp)
                # A seek meanwhile (to an offset, or to the other end) wins over this answer.
                if st is None or st.position is not None:
                    continue
                if todo.get(tp) == (st.reset_to or self.reset_policy):
                    st.seek(result.offset)  # no epoch, as Java's reset: nothing to validate
                found = True  # a position, or a new reset to look up
        found_offsets.result()  # raises OffsetLookupError naming the partitions that failed
        return found

    async def _look_up(self, todo: dict[TopicPartition, str]) -> OffsetLookup:
        """ListOffsets for the reset policies in ``todo`` (under this consumer's isolation
        level, as Java: "latest" is the last stable offset under read_committed). ``by_duration``
        asks for the first offset at or after now minus the duration; with no record that
        recent, the partition starts at its end (KIP-1106)."""
        since = int(time.time() * 1000 - self.reset_duration_s * 1000)
        specs: dict[TopicPartition | tuple[str, int], str | int] = {
            tp: since if where == "by_duration" else where for tp, where in todo.items()
        }
        found = await self._list_offsets(specs)
        too_late = [
            tp for tp, r in found.offsets.items() if todo[tp] == "by_duration" and r.offset < 0
        ]
        if too_late:
            ends = await self._list_offsets(dict.fromkeys(too_late, "latest"))
            for tp in too_late:
                del found.offsets[tp]
            found.offsets.update(ends.offsets)
            found.errors.update(ends.errors)
        return found

    async def _list_offsets(
        self, specs: dict[TopicPartition | tuple[str, int], str | int]
    ) -> OffsetLookup:
        """One round of ListOffsets (failures are retried by the reset loop, per partition,
        while the other partitions go on)."""
        return await list_offsets(
            self.cluster,
            specs,
            isolation_level=self.isolation_level,
            timeout=self.api_timeout_s,
            partial=True,
        )

    async def _positions_from_committed(self) -> bool:
        with self.positions.locked():
            wanted = [
                tp
                for tp, st in self.positions.items()
                if st.from_committed and st.position is None and st.reset_to is None
            ]
        if not wanted or self.committed_lookup is None:
            return False
        committed = await self.committed_lookup(wanted)  # errors: retried by the caller
        found = False
        with self.positions.locked():
            for tp in wanted:
                st = self.positions.get(tp)
                if st is None or not st.from_committed:
                    continue
                st.from_committed = False  # asked once; without a commit: auto.offset.reset
                found_offset = committed.get(tp)
                if found_offset is not None and st.position is None and st.reset_to is None:
                    # With its epoch, validated against the leader before the first fetch.
                    st.position, st.offset_epoch = found_offset
                    st.leader_epoch = -1
                    found = True
        return found

    def _send_fetches(self) -> None:
        md = self.cluster.metadata
        by_node: dict[int, dict[TopicPartition, PartitionFetch]] = {}
        to_validate: dict[int, dict[TopicPartition, ValidationAsk]] = {}
        with self.positions.locked():
            now = time.monotonic()
            # Positions first (KIP-320): whatever else holds a partition back (pause, a full
            # queue, a busy broker), one whose leader changed is checked before more of it is
            # fetched or handed out, and what was read ahead from the old leader is dropped.
            for tp, st in self.positions.items():
                if st.validating is not None or st.retry_at > now:
                    continue
                info = md.partition(tp.topic, tp.partition)
                leader = md.leader_for(tp.topic, tp.partition)
                if info is None or leader is None or not st.unvalidated(info.leader_epoch):
                    continue
                assert st.position is not None
                self.drop_queued(tp, keep_errors=True)
                st.validating = ValidationAsk(st.position, st.offset_epoch, info.leader_epoch)
                to_validate.setdefault(leader.node_id, {})[tp] = st.validating
            full = sum(st.queued_bytes for _, st in self.positions.items()) >= self.max_bytes
            ready: list[tuple[Any, TopicPartition, PartitionState]] = []
            held_back: set[TopicPartition] = set()  # fetchable but for what is queued already
            for tp, st in self.positions.items():
                if st.paused or st.position is None or st.validating is not None:
                    continue
                if st.retry_at > now:
                    continue
                if st.queued >= PREFETCH_RESPONSES or (full and st.queued):
                    held_back.add(tp)
                else:
                    ready.append((st.served, tp, st))
            ready.sort(key=lambda item: item[0])  # stable: assignment order among equals
            unread_nodes: set[int] = set()  # asked for a partition not known read to its end
            for _, tp, st in ready:
                leader = md.leader_for(tp.topic, tp.partition)
                if leader is None:
                    self.cluster.add_topics([tp.topic])
                    self.cluster.cache.request_update()
                    continue
                if leader.node_id in self._busy_nodes:
                    continue
                info = md.partition(tp.topic, tp.partition)
                current = info.leader_epoch if info is not None else -1
                assert not st.unvalidated(current)  # the loop above took every such partition
                st.leader_epoch = current  # no epoch to check the position by
                offset = st.fetch_position if st.fetch_position is not None else st.position
                assert offset is not None  # filtered above
                if not st.read_to(offset):
                    unread_nodes.add(leader.node_id)
                by_node.setdefault(leader.node_id, {})[tp] = PartitionFetch(
                    offset,
                    info.leader_epoch if info is not None else -1,
                    max(self.partition_max_bytes, st.batch_bytes),
                )
            # A node with held-back partitions: a fetch there would hold the node (one fetch
            # in flight a node) while poll drains them, for up to fetch.max.wait.ms when it
            # asks only for partitions read to their end. Such a fetch is put off for
            # HELD_BACK_WAIT_MS (a drained partition goes out with it meanwhile, at once) and
            # then waits at the broker for nothing; a fetch that also asks for unread data is
            # answered at once anyway, and waits at most HELD_BACK_WAIT_MS.
            waiting_nodes: set[int] = set()
            for tp in held_back:
                held_leader = md.leader_for(tp.topic, tp.partition)
                if held_leader is not None:
                    waiting_nodes.add(held_leader.node_id)
            caught_up_nodes = waiting_nodes.intersection(by_node) - unread_nodes
        for node in list(self._put_off):
            if node not in caught_up_nodes:
                del self._put_off[node]
        loop = asyncio.get_running_loop()
        for node, parts in by_node.items():
            max_wait_ms: int | None = None
            if node in caught_up_nodes:
                if now < self._put_off.setdefault(node, now + HELD_BACK_WAIT_MS / 1000):
                    continue
                del self._put_off[node]
                max_wait_ms = 0
            elif node in waiting_nodes:
                max_wait_ms = min(self.max_wait_ms, HELD_BACK_WAIT_MS)
            self._busy_nodes.add(node)
            task = loop.create_task(self._fetch(node, parts, max_wait_ms))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for node, asks in to_validate.items():
            task = loop.create_task(self.validator.validate(node, asks))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fetch(
        self, node: int, parts: dict[TopicPartition, PartitionFetch], max_wait_ms: int | None
    ) -> None:
        """``max_wait_ms``: the fetch's wait, when not fetch.max.wait.ms."""
        session = self._sessions.setdefault(node, FetchSession(node))
        try:
            await self._fetch_once(session, parts, max_wait_ms)
        except (BrokerConnectionError, KcoreTimeoutError, KafkaError) as exc:
            session.on_failure()
            log.debug("fetch from node %s failed: %s", node, exc)
            if isinstance(exc, KafkaError):
                self.cluster.handle_error_code(exc.code)
            await asyncio.sleep(self.cluster.retry_backoff.initial_ms / 1000)
        except asyncio.CancelledError:
            session.on_failure()
            raise
        except Exception as exc:  # a bug: report it, back off, go on
            session.on_failure()
            log.exception("fetch from node %s", node)
            self._deliver_error(KcoreError(f"fetching from node {node} failed: {exc!r}"))
            await asyncio.sleep(self.cluster.retry_backoff.maximum_ms / 1000)
        finally:
            self._busy_nodes.discard(node)
            self.wakeup()

    async def _fetch_once(
        self,
        session: FetchSession,
        wanted: dict[TopicPartition, PartitionFetch],
        max_wait_ms: int | None = None,
    ) -> None:
        node = session.node_id
        wait_ms = self.max_wait_ms if max_wait_ms is None else max_wait_ms
        version = await self.cluster.version_for(node, ApiKey.FETCH)
        md = self.cluster.metadata
        ids: dict[str, Any] = {}
        if version >= TOPIC_ID_VERSION:
            for topic in {tp.topic for tp in [*wanted, *session.partitions]}:
                tinfo = md.topics.get(topic)
                if tinfo is not None and tinfo.topic_id is not None:
                    ids[topic] = tinfo.topic_id
            if any(tp.topic not in ids for tp in wanted):
                self.cluster.cache.request_update()
                wanted = {tp: f for tp, f in wanted.items() if tp.topic in ids}
            if any(tp.topic not in ids for tp in session.partitions) or any(
                session.topic_ids.get(t, tid) != tid for t, tid in ids.items()
            ):
                # Cannot name what to forget, or a topic was re-created under a new id (the
                # broker's session holds the old one): start over with a full request.
                session.reset()
            session.topic_ids.update(ids)
        if not wanted and not session.partitions:
            return
        plan = session.plan(wanted, version)
        topics: dict[str, list[FetchPartition]] = {}
        for tp, f in plan.send.items():
            topics.setdefault(tp.topic, []).append(
                FetchPartition(
                    partition=tp.partition,
                    current_leader_epoch=f.leader_epoch,
                    fetch_offset=f.fetch_offset,
                    partition_max_bytes=f.max_bytes,
                )
            )
        forgotten: dict[str, list[int]] = {}
        for tp in plan.forget:
            forgotten.setdefault(tp.topic, []).append(tp.partition)
        if version >= TOPIC_ID_VERSION:
            fetch_topics = [FetchTopic(topic_id=ids[t], partitions=ps) for t, ps in topics.items()]
            forget = [ForgottenTopic(topic_id=ids[t], partitions=ps) for t, ps in forgotten.items()]
        else:
            fetch_topics = [FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()]
            forget = [ForgottenTopic(topic=t, partitions=ps) for t, ps in forgotten.items()]
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=wait_ms,
            min_bytes=self.min_bytes,
            max_bytes=self.max_bytes,
            isolation_level=self.isolation_level,
            session_id=plan.session_id,
            session_epoch=plan.epoch,
            topics=fetch_topics,
            forgotten_topics_data=forget,
        )
        timeout = self.cluster.settings.request_timeout_s + wait_ms / 1000
        started = time.monotonic()
        response = await self.cluster.send(node, request, version, timeout=timeout)
        metrics = self.cluster.metrics
        metrics.record("fetch-latency", (time.monotonic() - started) * 1000)
        metrics.record("fetch-throttle-time", response.throttle_time_ms or 0)
        metrics.record(
            "fetch-size",
            sum(len(p.records or b"") for t in response.responses for p in t.partitions),
        )
        if not session.on_response(response.error_code, response.session_id):
            if response.error_code in SESSION_ERROR_CODES:
                log.debug(
                    "node %s: fetch session gone (%s); starting a new one",
                    node,
                    response.error_code,
                )
                return
            err = error_for_code(response.error_code)
            raise err if err is not None else KcoreError("fetch failed")
        apply_leader_hints(self.cluster.cache, response)
        names_by_id = {tid: name for name, tid in ids.items()}
        queued: list[FetchedData] = []  # the partitions' data, for poll all at once
        # (under the positions' lock throughout: a seek cannot come between a partition's
        # state taking its data into account and the data reaching the buffer)
        with self.positions.locked():
            try:
                self._handle_response(response, wanted, names_by_id, queued)
            finally:
                self.buffer.add_all(queued)

    def _handle_response(
        self,
        response: Any,
        wanted: dict[TopicPartition, PartitionFetch],
        names_by_id: dict[Any, str],
        queued: list[FetchedData],
    ) -> None:
        """Each partition of a Fetch response; data for poll goes to ``queued``."""
        before = 0  # record bytes of the partitions answered before the one at hand
        for topic in response.responses:
            name = topic.topic or names_by_id.get(topic.topic_id, "")
            for p in topic.partitions:
                tp = TopicPartition(name, p.partition_index)
                asked = wanted.get(tp)
                size = len(p.records) if p.records is not None else 0
                if asked is not None:
                    # The most of this partition the broker could send: since KIP-74 (Fetch
                    # v3) at least the first batch of the first partition with data, whatever
                    # its size; after that, what is left of fetch.max.bytes, within the
                    # partition's own limit.
                    room = MAX_INT32
                    if before:
                        room = min(max(0, self.max_bytes - before), asked.max_bytes)
                    self._handle_partition(
                        tp, asked.fetch_offset, asked.leader_epoch, p, room, queued
                    )
                before += size

    def _handle_partition(
        self,
        tp: TopicPartition,
        offset: int,
        epoch: int,
        p: Any,
        room: int = MAX_INT32,
        queued: list[FetchedData] | None = None,
    ) -> None:
        """One partition of a Fetch response to a request made at ``offset`` under leader
        epoch ``epoch``; ``room``: the most of it the broker could have sent. Its data goes
        to ``queued`` (for the fetch buffer once the response is handled), else straight to
        the buffer."""
        code = p.error_code
        with self.positions.locked():
            st = self.positions.get(tp)
            expected = (
                st.fetch_position
                if st is not None and st.fetch_position is not None
                else (st.position if st is not None else None)
            )
            if st is None or expected != offset:
                return  # unassigned or sought meanwhile: the data is stale
            if st.validating is not None or epoch != st.leader_epoch:
                return  # from a leader since replaced (KIP-320): fetched again once checked
            st.high_watermark = p.high_watermark
            lso = getattr(p, "last_stable_offset", -1)
            st.lag_end = (
                lso if self.isolation_level and lso is not None and lso >= 0 else p.high_watermark
            )
            if code == ErrorCode.NONE:
                records = p.records
                if records is not None and len(records) > 0:
                    epochs: list[tuple[int, int]] = []
                    end, complete = _complete_end(records, epochs)
                    if not complete:  # only part of the next batch (its backoff keeps growing)
                        self._partial_batch(tp, st, offset, records, room)
                        return
                    st.batch_bytes = 0
                    st.partial_at = -1
                    if end <= offset:
                        # Whole batches, all before the offset: nothing to hand out and no
                        # offset to move past (a compacted batch still ends at its last
                        # offset, at or past the fetch offset: that is progress).
                        self._no_progress(tp, st, offset, end)
                        return
                    st.behind_at, st.behind_answers = -1, 0
                    if complete < len(records):
                        # What follows the whole batches (one cut short, or a corrupt length)
                        # is fetched again from ``end``: not for the decoder to trip on.
                        records = records[:complete]
                    self._served += 1
                    st.served = self._served
                    st.queued += 1
                    st.queued_bytes += len(records)
                    st.fetch_position = max(end, offset)
                    data = FetchedData(
                        tp,
                        offset,
                        records,
                        p.high_watermark,
                        max(end, offset),
                        epochs=epochs,
                        leader_epoch=epoch,
                    )
                    if self.isolation_level and p.aborted_transactions:
                        data.aborted = [
                            (a.producer_id, a.first_offset) for a in p.aborted_transactions
                        ]
                    if queued is not None:
                        queued.append(data)
                    else:
                        self.buffer.add(data)
                st.errors = 0
                return
            if code == ErrorCode.OFFSET_OUT_OF_RANGE:
                if st.position is not None and offset != st.position:
                    # A read-ahead fetch past what poll has not taken yet: forget the read-ahead
                    # and fetch again from the position, which decides about a reset.
                    self.drop_queued(tp)
                    return
                self.drop_queued(tp)
                if self.reset_policy == "none":
                    # As Java: the position stays where it is, and poll raises (naming the
                    # offset in ``partitions``) until the caller seeks.
                    error = OffsetOutOfRangeError(
                        f"{tp.topic}-{tp.partition}: offset {offset} is out of range and "
                        "auto.offset.reset is none: seek to a valid offset"
                    )
                    error.partitions = {tp: offset}  # type: ignore[attr-defined]  # as Java's
                    self._queue_partition_error(tp, error)
                    self._back_off(st)
                    return
                log.info(
                    "%s: offset %s out of range; resetting (%s)", tp, offset, self.reset_policy
                )
                st.seek(None)
                return
            if code in STALE_METADATA_CODES and self.leader_epoch(tp) != epoch:
                # The response named the new leader (KIP-951 hints, applied above): go to it
                # at once (once the position is checked there), not after a backoff.
                return
            self._partition_failed(tp, st, offset, code)

    def _partial_batch(
        self, tp: TopicPartition, st: PartitionState, offset: int, records: Any, room: int
    ) -> None:
        """An answer at ``offset`` that holds only part of a batch (positions locked). The
        first time, the batch is asked for whole at once (its header says how big it is: the
        broker cut it at a size limit). A length that no batch has, or only part of the batch
        again when the broker could have sent all of it (``room``), can never make progress:
        the partition stops with ``CorruptRecordError`` for poll (as Java's consumer raises
        CorruptRecordException, or "failed to make progress"), and is asked again only after
        a backoff. Only part again because other partitions took the response's room is
        fetched again after a backoff too, not at once in a loop."""
        name = f"{tp.topic}-{tp.partition}"
        length = _first_batch_length(records)
        declared = _first_batch_size(records)
        problem = None
        if length is not None and length < MIN_BATCH_LENGTH:
            problem = (
                f"corrupt record batch at offset {offset}: its length field says {length} "
                f"bytes (a batch has at least {MIN_BATCH_LENGTH})"
            )
        elif st.partial_at == offset and room >= declared:
            problem = (
                f"failed to make progress fetching offset {offset}: the broker answered "
                f"again with only {len(records)} bytes of a record batch whose header says "
                f"{declared}, though the fetch allowed all of it (a corrupt length, or a "
                "truncated log)"
            )
        if problem is not None:
            log.warning("%s: %s", name, problem)
            st.batch_bytes = 0
            st.partial_at = offset
            self._queue_partition_error(tp, CorruptRecordError(f"{name}: {problem}"))
            self._back_off(st)
            return
        if st.partial_at == offset:
            log.debug("%s: only part of the batch at offset %s again; backing off", name, offset)
            self._back_off(st)
        st.partial_at = offset
        st.batch_bytes = declared  # asked for whole next time

    def _no_progress(self, tp: TopicPartition, st: PartitionState, offset: int, end: int) -> None:
        """An answer at ``offset`` whose whole batches all end before it, the last at ``end``
        - 1 (positions locked). Java's consumer skips such batches and fetches again at once;
        here the partition is fetched again only after the fetch-error backoff, and from the
        NO_PROGRESS_ANSWERS-th such answer in a row on, each one stops the partition with
        ``CorruptRecordError`` for poll (until an answer makes progress or the caller seeks):
        never a silent loop of Fetch requests."""
        name = f"{tp.topic}-{tp.partition}"
        if st.behind_at != offset:
            st.behind_at, st.behind_answers = offset, 0
        st.behind_answers += 1
        if st.behind_answers >= NO_PROGRESS_ANSWERS:
            problem = (
                f"failed to make progress fetching offset {offset}: the broker answered "
                f"{st.behind_answers} times in a row with only record batches that end before "
                f"it (the last at offset {end - 1})"
            )
            log.warning("%s: %s", name, problem)
            self._queue_partition_error(tp, CorruptRecordError(f"{name}: {problem}"))
        else:
            log.debug(
                "%s: the answer at offset %s held only batches ending before it (the last at "
                "%s); backing off",
                name,
                offset,
                end - 1,
            )
        self._back_off(st)

    def _partition_failed(
        self, tp: TopicPartition, st: PartitionState, offset: int, code: int
    ) -> None:
        """A partition's fetch error (positions locked), as Java's FetchCollector: the partition is
        not fetched again until a backoff (retry.backoff.ms, growing to retry.backoff.max.ms while
        it keeps failing) has passed (not fetched again at once, in a loop). Stale metadata is
        refreshed; a corrupt batch and non-retriable errors reach poll, at most one queued per
        partition; an unknown server error is logged."""
        err = error_for_code(code)
        name = f"{tp.topic}-{tp.partition}"
        if code in STALE_METADATA_CODES or code == ErrorCode.KAFKA_STORAGE_ERROR:
            self.cluster.cache.request_update()
            log.debug("%s: fetch: %s; refreshing metadata", name, err.name if err else code)
        elif err is not None and (
            code == ErrorCode.CORRUPT_MESSAGE
            or (not err.retriable and code != ErrorCode.UNKNOWN_SERVER_ERROR)
        ):
            what = err.message
            if code == ErrorCode.CORRUPT_MESSAGE:
                what = f"the broker found a corrupt record fetching offset {offset}"
            self._queue_partition_error(tp, err.with_message(f"{name}: {what}"))
        else:
            log.warning("%s: fetch at offset %s: %s", name, offset, err.name if err else code)
        self._back_off(st)

    def _back_off(self, st: PartitionState) -> None:
        delay = self.cluster.retry_backoff.backoff_s(st.errors)
        st.errors += 1
        st.retry_at = time.monotonic() + delay
        asyncio.get_running_loop().call_later(delay, self.wakeup)

    def _queue_partition_error(self, tp: TopicPartition, error: KcoreError) -> None:
        """For poll: one at a time per partition (a partition failing again and again while
        the caller does not poll must not fill the queue)."""
        self.buffer.add_error(error, tp, once=True)

    def drop_queued(self, tp: TopicPartition, keep_errors: bool = False) -> None:
        """Forget what was fetched ahead for ``tp`` (positions locked), and its queued
        errors unless ``keep_errors``."""
        self.buffer.drain((tp,), keep_errors=keep_errors)
        st = self.positions.get(tp)
        if st is not None:
            st.queued = st.queued_bytes = 0
            st.fetch_position = None

    def _deliver_error(self, error: BaseException, tp: TopicPartition = NO_PARTITION) -> None:
        """A non-retriable error goes to the caller's next poll (``tp``: the partition it is
        about, if one; it is dropped if that partition is unassigned or sought first)."""
        self.buffer.add_error(error, tp)

    async def stop(self) -> None:
        self._stopped = True
        self.buffer.close()
        self.wakeup()
        if self._reset_task is not None:
            self._tasks.add(self._reset_task)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._close_sessions()

    async def _close_sessions(self) -> None:
        """Tell each broker its session is over (epoch -1), as Java does on close, so it frees
        the session's slot in its cache at once; best effort, a second at most."""

        async def close_one(session: FetchSession) -> None:
            version = await self.cluster.version_for(session.node_id, ApiKey.FETCH)
            request = FetchRequest(
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=self.max_bytes,
                isolation_level=self.isolation_level,
                session_id=session.session_id,
                session_epoch=FINAL_EPOCH,
                topics=[],
            )
            await self.cluster.send(session.node_id, request, version, timeout=1.0)

        live = [s for s in self._sessions.values() if s.session_id != 0]
        self._sessions.clear()
        if not live:
            return
        try:
            await asyncio.wait_for(
                asyncio.gather(*(close_one(s) for s in live), return_exceptions=True), 1.0
            )
        except asyncio.TimeoutError:
            pass


def _first_batch_length(records: Any) -> int | None:
    """The length field of the first batch in ``records`` (None: not even a header)."""
    if len(records) < BATCH_HEADER:
        return None
    return int.from_bytes(records[8:12], "big", signed=True)


def _first_batch_size(records: Any) -> int:
    """Bytes of the first batch (or legacy message) in ``records``, header included; a
    corrupt length is left for the decoder to report."""
    if len(records) < BATCH_HEADER:
        return BATCH_HEADER
    length = int.from_bytes(records[8:12], "big", signed=True)
    return min(BATCH_HEADER + max(length, 0), MAX_INT32)


def _passing(error: BaseException) -> bool:
    """A failure that asking again may cure (no leader yet, a broker down, a timeout); not a
    partition the topic does not have (UNKNOWN_TOPIC_OR_PARTITION, retriable in Kafka's table,
    is reported: the caller assigned something that is not there)."""
    if isinstance(error, KafkaError):
        return error.retriable and error.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return isinstance(error, (BrokerConnectionError, KcoreTimeoutError))


def _complete_end(records: Any, epochs: list[tuple[int, int]] | None = None) -> tuple[int, int]:
    """The offset after the last complete batch in ``records`` and how many bytes the complete
    batches take (0: not even the first is whole). Reads only batch headers: base offset,
    length, magic and, in magic 2, the last offset delta; a magic 0/1 entry carries the last
    offset of what it wraps. ``epochs`` gets (last offset, leader epoch) of each run of
    batches with one partition leader epoch (magic 2 only; -1 for older batches). The codec
    scans (a response of 16 KiB batches has dozens a partition); this is its fallback for
    offsets at the int64 limits."""
    found = scan_complete_batches(records, epochs)
    if found is not None:
        return found  # type: ignore[no-any-return]
    if epochs is not None:
        epochs.clear()
    return _complete_end_python(records, epochs)


def _complete_end_python(
    records: Any, epochs: list[tuple[int, int]] | None = None
) -> tuple[int, int]:
    """:func:`_complete_end` in Python, with Python's unbounded ints."""
    pos, end, size = 0, -1, len(records)
    while pos + BATCH_HEADER <= size:
        length = int.from_bytes(records[pos + 8 : pos + 12], "big", signed=True)
        if length < MIN_BATCH_LENGTH or pos + BATCH_HEADER + length > size:
            break  # (a length no batch has ends the whole ones too: reported when fetched)
        base = int.from_bytes(records[pos : pos + 8], "big", signed=True)
        epoch = -1
        if length >= 15 and records[pos + 16] == 2:  # magic 2: lastOffsetDelta at 23
            delta = int.from_bytes(records[pos + 23 : pos + 27], "big", signed=True)
            end = max(end, base + delta + 1)
            epoch = int.from_bytes(records[pos + 12 : pos + 16], "big", signed=True)
        else:
            end = max(end, base + 1)
        if epochs is not None:
            if epochs and epochs[-1][1] == epoch:
                epochs[-1] = (end - 1, epoch)
            else:
                epochs.append((end - 1, epoch))
        pos += BATCH_HEADER + length
    return end, pos
