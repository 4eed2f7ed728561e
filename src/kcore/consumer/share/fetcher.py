"""Share fetching (KIP-932): ShareFetch to the leader of each assigned partition, in a share
session per leader, with the acknowledgements owed to that leader piggy-backed; ShareAcknowledge
for acknowledgements that cannot wait for a fetch (commit, close).

Session rules (:class:`ShareSession`, free of I/O): epoch 0 opens a session and carries no
acknowledgements; each answered request moves the epoch on (wrapping to 1 after the int32
maximum); -1 closes it. One request per leader at a time keeps the epochs in order.
SHARE_SESSION_NOT_FOUND and INVALID_SHARE_SESSION_EPOCH start a new session. A partition error
that says the metadata is stale asks for a refresh; the partition is then fetched from (and its
session entry moved to) whichever broker the metadata names as leader.

Only records inside the response's AcquiredRecords ranges are handed out, each with its
delivery count; the rest of a batch belongs to other members."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kcore.cluster.client import ClusterClient
from kcore.cluster.metadata import STALE_METADATA_CODES, apply_leader_hints
from kcore.codec import MAX_SHARE_GAPS, ColumnBuffer, RecordBatch, columnar_records, decode_batches
from kcore.consumer.collector import ConsumerRecord
from kcore.consumer.share.acknowledgements import (
    GAP,
    Acknowledgements,
    OffsetSpans,
    Run,
    ShareRecord,
    has_renew,
)
from kcore.consumer.share.arrow import arrow_run
from kcore.consumer.share.sizing import FetchSizing
from kcore.errors import (
    BrokerConnectionError,
    CorruptRecordError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    error_for_code,
)
from kcore.protocol import ApiKey
from kcore.protocol.messages.share_acknowledge_request import (
    AcknowledgementBatch as AckRequestBatch,
)
from kcore.protocol.messages.share_acknowledge_request import (
    AcknowledgePartition,
    AcknowledgeTopic,
    ShareAcknowledgeRequest,
)
from kcore.protocol.messages.share_fetch_request import (
    AcknowledgementBatch as FetchRequestBatch,
)
from kcore.protocol.messages.share_fetch_request import (
    FetchPartition,
    FetchTopic,
    ForgottenTopic,
    ShareFetchRequest,
)
from kcore.types import TopicPartition

log = logging.getLogger("kcore.consumer.share")

__all__ = ["AckResult", "ShareBuffer", "ShareFetcher", "ShareSession"]

INT32_MAX = 2**31 - 1
FINAL_EPOCH = -1
# The broker's group.share.record.lock.duration.ms default, until a leader says otherwise.
DEFAULT_ACQUISITION_LOCK_S = 30.0
# The session is gone or out of step on the broker: open a new one.
NEW_SESSION_CODES = frozenset(
    {
        ErrorCode.SHARE_SESSION_NOT_FOUND,
        ErrorCode.INVALID_SHARE_SESSION_EPOCH,
        # The member is between memberships (fenced, rejoining): the heartbeat sorts that
        # out; the fetch opens a new session meanwhile.
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.FENCED_MEMBER_EPOCH,
        ErrorCode.SHARE_SESSION_LIMIT_REACHED,
    }
)

# (partition, its acknowledgements, error or None): how acknowledgements sent together ended.
AckResult = tuple[TopicPartition, OffsetSpans, KafkaError | KcoreError | None]


class ShareSession:
    """One leader's share session, as this member sees it."""

    def __init__(self) -> None:
        self.epoch = 0
        self.partitions: set[TopicPartition] = set()

    @property
    def open(self) -> bool:
        return self.epoch > 0

    def advance(self) -> None:
        self.epoch = 1 if self.epoch >= INT32_MAX else self.epoch + 1

    def reset(self) -> None:
        self.epoch = 0
        self.partitions = set()


class ShareBuffer:
    """Acquired records not handed out yet, as runs of one partition's records in offset order:
    filled on the event loop, taken by ``poll`` on the caller's thread. A run is kept with the
    index of its first record not taken (a fetch's run is thousands of records, a poll takes
    hundreds: slicing off the rest at each poll would copy it again and again).

    A run is a list of records, or an :class:`ArrowRun` (the records decoded straight into
    Arrow columns) while ``columnar`` is set: the caller's last poll was a ``poll_arrow``,
    so the next ones likely are too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # [partition, run, index of the first not taken]
        self._runs: collections.deque[list[Any]] = collections.deque()
        self._count = 0
        self.columnar = False

    def put(self, tp: TopicPartition, run: Run) -> None:
        with self._lock:
            self._runs.append([tp, run, 0])
            self._count += len(run)

    def take(self, limit: int) -> list[tuple[TopicPartition, Run]]:
        """Up to ``limit`` records, oldest first, as runs of one partition each."""
        out: list[tuple[TopicPartition, Run]] = []
        with self._lock:
            while limit > 0 and self._runs:
                run = self._runs[0]
                tp, records, first = run
                left = len(records) - first
                if left <= limit:
                    self._runs.popleft()
                    taken = _untaken(records, first)
                else:
                    taken = records[first : first + limit]
                    run[2] = first + limit
                out.append((tp, taken))
                limit -= len(taken)
                self._count -= len(taken)
        return out

    def drain(self) -> list[tuple[TopicPartition, Run]]:
        with self._lock:
            out = [(tp, _untaken(records, first)) for tp, records, first in self._runs]
            self._runs.clear()
            self._count = 0
            return out

    def __len__(self) -> int:
        return self._count

    def counts(self) -> dict[TopicPartition, int]:
        """Records waiting for poll, by partition."""
        out: dict[TopicPartition, int] = {}
        with self._lock:
            for tp, records, first in self._runs:
                out[tp] = out.get(tp, 0) + len(records) - first
        return out


def _untaken(records: Run, first: int) -> Run:
    """A run's records from ``first`` on (the run itself when none was taken)."""
    return records[first:] if first else records


class ShareFetcher:
    """Runs on the client's event loop; the consumer's poll asks it for a round of fetches."""

    def __init__(
        self,
        cluster: ClusterClient,
        group_id: str,
        member_id: Callable[[], str],
        acks: Acknowledgements,
        buffer: ShareBuffer,
        config: Any,
    ) -> None:
        self.cluster = cluster
        self.group_id = group_id
        self.member_id = member_id
        self.acks = acks
        self.buffer = buffer
        self.max_wait_ms = int(config["fetch.max.wait.ms"])
        self.min_bytes = int(config["fetch.min.bytes"])
        self.max_bytes = int(config["fetch.max.bytes"])
        self.max_records = int(config["max.poll.records"])
        self.record_limit = config["share.acquire.mode"] == "record_limit"
        self.sizing = FetchSizing(self.max_records, self.record_limit)
        self.check_crcs = bool(config["check.crcs"])
        self.assigned: set[TopicPartition] = set()
        self.sessions: dict[int, ShareSession] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._inflight: dict[int, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()  # acknowledgements sent on their own
        self._sending: asyncio.Task[Any] | None = None  # the send_pending round under way
        self._changed = asyncio.Event()
        # Acknowledgement outcomes not yet reported to the application (the commit callback
        # runs on its thread); a fatal fetch error to raise from poll.
        self.results: collections.deque[AckResult] = collections.deque()
        self.error: KcoreError | None = None
        # How long a record stays acquired for this member unacknowledged, as the leader
        # last said (ShareFetch's AcquisitionLockTimeoutMs); until then the broker's default.
        self.acquisition_lock_s = DEFAULT_ACQUISITION_LOCK_S

    def set_assignment(self, partitions: set[TopicPartition]) -> None:
        self.assigned = partitions
        self._changed.set()

    # -- where things go ----------------------------------------------------------------------

    def _leaders(self, partitions: Iterable[TopicPartition]) -> dict[int, set[TopicPartition]]:
        md = self.cluster.metadata
        out: dict[int, set[TopicPartition]] = {}
        missing = False
        for tp in partitions:
            leader = md.leader_for(tp.topic, tp.partition)
            if leader is None:
                missing = True
                continue
            out.setdefault(leader.node_id, set()).add(tp)
        if missing:
            self.cluster.cache.request_update()
        return out

    def _topic_ids(self) -> tuple[dict[str, Any], dict[Any, str]]:
        topics = self.cluster.metadata.topics
        ids = {name: t.topic_id for name, t in topics.items() if t.topic_id is not None}
        return ids, {tid: name for name, tid in ids.items()}

    def _session(self, node: int) -> tuple[ShareSession, asyncio.Lock]:
        if node not in self.sessions:
            self.sessions[node] = ShareSession()
            self._locks[node] = asyncio.Lock()
        return self.sessions[node], self._locks[node]

    # -- fetching -----------------------------------------------------------------------------

    async def fetch(self, timeout: float) -> None:
        """Start a ShareFetch on every leader without one in flight, and wait until records
        are buffered, every fetch has answered, or ``timeout``. Fetches outlive a wait cut
        short: what they acquire is buffered for the next poll."""
        deadline = time.monotonic() + max(timeout, 0.0)
        max_wait_ms = min(self.max_wait_ms, int(timeout * 1000))
        loop = asyncio.get_running_loop()
        by_node = self._leaders(self.assigned)
        for node in by_node:
            task = self._inflight.get(node)
            if task is None or task.done():
                self._inflight[node] = loop.create_task(self._fetch_node(node, max_wait_ms))
        # Acknowledgements for partitions no fetch goes to: sent on their own.
        stray = self.acks.pending_partitions() - {tp for tps in by_node.values() for tp in tps}
        if stray:
            task = loop.create_task(self._acknowledge_in_background(stray))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        self._changed.clear()
        while not len(self.buffer):
            left = deadline - time.monotonic()
            tasks = [t for t in self._inflight.values() if not t.done()]
            if left <= 0 or self.error is not None:
                return
            if not tasks:
                if by_node:
                    return  # every fetch answered, none with records
                if self.assigned:  # leaders not known yet: the metadata refresh finds them
                    await asyncio.sleep(min(left, 0.1))
                    return
                # Nothing assigned (yet): wait for an assignment.
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    return
                return
            await asyncio.wait(tasks, timeout=left, return_when=asyncio.FIRST_COMPLETED)

    async def _fetch_node(self, node: int, max_wait_ms: int) -> None:
        session, lock = self._session(node)
        async with lock:
            try:
                await self._fetch_once(node, session, max_wait_ms)
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                log.debug("share fetch from node %d failed: %s", node, exc)
                session.reset()
                await asyncio.sleep(self.cluster.retry_backoff.initial_ms / 1000)
            except asyncio.CancelledError:
                raise
            except KcoreError as exc:
                self.error = exc
            except Exception as exc:  # a bug must surface in poll, not vanish in a task
                log.exception("share fetch from node %d", node)
                self.error = KcoreError(f"share fetch failed: {exc!r}")

    async def _fetch_once(self, node: int, session: ShareSession, max_wait_ms: int) -> None:
        wanted = self._leaders(self.assigned).get(node, set())
        if not wanted and not session.open:
            return
        ids, names = self._topic_ids()
        wanted = {tp for tp in wanted if tp.topic in ids}
        acks: dict[TopicPartition, OffsetSpans] = {}
        if session.open:
            # Acknowledgements ride along only for partitions the session fetches anyway.
            acks = self.acks.take(tp for tp in self.acks.pending_partitions() if tp in wanted)
            listed = (wanted - session.partitions) | set(acks)
            forget = session.partitions - wanted
        else:
            listed, forget = set(wanted), set()
        if not listed and not forget and not wanted:
            return
        epoch = session.epoch
        request = ShareFetchRequest(
            group_id=self.group_id,
            member_id=self.member_id(),
            share_session_epoch=epoch,
            max_wait_ms=max_wait_ms,
            min_bytes=self.min_bytes,
            max_bytes=self.max_bytes,
            max_records=self.sizing.max_records(self.acquisition_lock_s),
            batch_size=self.max_records,
            share_acquire_mode=1 if self.record_limit else 0,
            is_renew_ack=has_renew(acks),
            topics=[
                FetchTopic(
                    topic_id=ids[topic],
                    partitions=[
                        FetchPartition(
                            partition_index=tp.partition,
                            acknowledgement_batches=(
                                acks[tp].batches(FetchRequestBatch) if tp in acks else []
                            ),
                        )
                        for tp in sorted(tps)
                    ],
                )
                for topic, tps in _by_topic(listed).items()
            ],
            forgotten_topics_data=[
                ForgottenTopic(topic_id=ids[topic], partitions=sorted(tp.partition for tp in tps))
                for topic, tps in _by_topic(forget).items()
                if topic in ids
            ],
        )
        version = await self.cluster.version_for(node, ApiKey.SHARE_FETCH)
        timeout = self.cluster.settings.request_timeout_s + max_wait_ms / 1000
        started = time.monotonic()
        try:
            response = await self.cluster.send(node, request, version, timeout=timeout)
        except (BrokerConnectionError, KcoreTimeoutError) as exc:
            self._report(acks, exc)
            raise
        metrics = self.cluster.metrics
        metrics.record("fetch-latency", (time.monotonic() - started) * 1000)
        metrics.record("fetch-throttle-time", response.throttle_time_ms or 0)
        self.acks.sent(acks)
        code = response.error_code
        if code != ErrorCode.NONE:
            err = _error(code, response.error_message, "ShareFetch")
            self._report(acks, err)
            if code in NEW_SESSION_CODES:
                log.info("share session on node %d: %s; opening a new one", node, err.name)
                session.reset()
                await asyncio.sleep(self.cluster.retry_backoff.initial_ms / 1000)
                return
            if self.cluster.handle_error_code(code) or err.retriable:
                await asyncio.sleep(self.cluster.retry_backoff.initial_ms / 1000)
                return
            raise err
        session.partitions = (session.partitions | listed) - forget
        session.advance()
        if response.acquisition_lock_timeout_ms > 0:
            self.acquisition_lock_s = response.acquisition_lock_timeout_ms / 1000
        apply_leader_hints(self.cluster.cache, response)
        answered: set[TopicPartition] = set()
        stale = False
        results: list[AckResult] = []
        fetched_bytes = fetched_records = 0
        for topic in response.responses:
            name = names.get(topic.topic_id)
            if name is None:
                continue
            for p in topic.partitions:
                tp = TopicPartition(name, p.partition_index)
                if tp in acks:
                    answered.add(tp)
                    ack_err = None
                    if p.acknowledge_error_code != ErrorCode.NONE:
                        ack_err = _error(
                            p.acknowledge_error_code, p.acknowledge_error_message, "acknowledge"
                        )
                    results.append((tp, acks[tp], ack_err))
                partition_stale, buffered = self._partition(tp, p)
                stale = stale or partition_stale
                fetched_records += buffered
                fetched_bytes += len(p.records or b"")
        results.extend((tp, acks[tp], None) for tp in set(acks) - answered)
        self._count_acks(results)
        self.results.extend(results)
        if fetched_records:
            self.sizing.answered(time.monotonic() - started)
        metrics.record("fetch-size", fetched_bytes)
        metrics.record("records-per-request", fetched_records)
        metrics.record("bytes-consumed", fetched_bytes)
        if stale:  # a pause for the metadata refresh, rather than asking the old leader again
            await asyncio.sleep(self.cluster.retry_backoff.initial_ms / 1000)

    def _partition(self, tp: TopicPartition, p: Any) -> tuple[bool, int]:
        """One partition of a ShareFetch answer: its records buffered, its gaps owed. Returns
        whether it said the metadata is stale, and how many records it buffered (counted
        here: the caller's poll takes from the buffer meanwhile)."""
        code = p.error_code
        if code != ErrorCode.NONE:
            if code in STALE_METADATA_CODES:
                self.cluster.handle_error_code(code)
                return True, 0
            err = _error(code, p.error_message, f"ShareFetch of {tp.topic}-{tp.partition}")
            if not err.retriable:
                self.error = err
            return False, 0
        if not p.acquired_records or not p.records:
            return False, 0
        ranges = sorted(
            (a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records
        )
        first_acquired = ranges[0][0]
        out: list[ShareRecord] = []
        gaps: list[int] = []  # acquired offsets that hold no record
        spans: list[tuple[int, int]] = []  # offsets the data batches decoded here cover
        covered = -1  # the last offset of the last whole batch in the response
        batches = decode_batches(p.records, True, check_crcs=self.check_crcs)
        # Straight into Arrow columns while the caller reads Arrow batches (a magic 0/1
        # message, which no Kafka 4 log holds, sends the partition the records' way).
        columnar = self.buffer.columnar and all(isinstance(b, RecordBatch) for b in batches)
        cols = columnar_records() if columnar else None
        counts = ColumnBuffer() if columnar else None
        for batch in batches:
            covered = max(covered, batch.next_offset - 1)
            if batch.is_control or batch.next_offset <= first_acquired:
                continue
            if isinstance(batch, RecordBatch):
                if cols is not None and counts is not None:
                    cols.append_acquired(batch, ranges, gaps, counts, tp.topic, tp.partition)
                else:
                    out += batch.acquired_records(ShareRecord, tp.topic, tp.partition, ranges, gaps)
                spans.append((batch.base_offset, batch.next_offset - 1))
            else:  # magic 0 or 1: one record per offset, made the plain way
                for rec in batch.records_as(ConsumerRecord, tp.topic, tp.partition):
                    count = _delivery_count(ranges, rec.offset)
                    if count:
                        out.append(ShareRecord._make((*rec, count, batch.timestamp_type)))
                        spans.append((rec.offset, rec.offset))
        # Acquired offsets no decoded batch covers (transaction markers, batches compacted
        # away) are acknowledged as gaps too, so that they do not come back; only up to the
        # last batch the response carried whole (a batch cut short at its end is fetched
        # again).
        gaps += _uncovered(ranges, spans, covered)
        if gaps:
            self.acks.add(tp, gaps, GAP)
        run: Run = out
        if cols is not None and counts is not None and cols.num_rows:
            run = arrow_run(cols, counts)
        if run:
            self.buffer.put(tp, run)
        return False, len(run)

    # -- acknowledging ------------------------------------------------------------------------

    async def send_pending(self) -> None:
        """Everything owed, by ShareAcknowledge, the outcomes kept for the commit callback. One
        such round at a time: what becomes owed while it is under way goes in its next request
        (or with a fetch), not in a request of its own queued behind it."""
        if self._sending is not None:
            return
        self._sending = asyncio.current_task()
        try:
            while self.acks.has_pending():
                self.results.extend(await self.acknowledge())
        finally:
            self._sending = None

    async def _acknowledge_in_background(self, partitions: set[TopicPartition]) -> None:
        self.results.extend(await self.acknowledge(partitions))

    async def commit(self) -> list[AckResult]:
        """A commit_sync: every acknowledgement made so far, sent and answered, and how each
        ended. A round already under way in the background (send_pending, or one for
        partitions no fetch goes to) may have taken some of them: it is waited for, and the
        outcomes not yet reported (its own among them) are this commit's too, rather than
        left for the callback alone; then what is still owed is sent."""
        me = asyncio.current_task()
        rounds = [t for t in (self._sending, *self._background) if t is not None and t is not me]
        rounds = [t for t in rounds if not t.done()]
        if rounds:
            await asyncio.wait(rounds)
        out = self.take_results()
        out += await self.acknowledge()
        return out

    def take_results(self) -> list[AckResult]:
        """The outcomes not yet reported, removed (popped one by one: the caller's thread and
        the event loop both take from the queue)."""
        out: list[AckResult] = []
        results = self.results
        while results:
            out.append(results.popleft())
        return out

    async def acknowledge(
        self, partitions: Iterable[TopicPartition] | None = None, *, final: bool = False
    ) -> list[AckResult]:
        """Send the pending acknowledgements (of ``partitions``; default all) by
        ShareAcknowledge to each partition's leader, and return how each ended. ``final``
        closes every share session (epoch -1), acknowledgements or not."""
        chosen = self.acks.pending_partitions() if partitions is None else set(partitions)
        acks = self.acks.take(chosen)
        by_node = self._leaders(acks)
        results: list[AckResult] = []
        for tp in set(acks) - {tp for tps in by_node.values() for tp in tps}:
            results.append((tp, acks[tp], KcoreError(f"{tp}: no leader known to acknowledge to")))
        nodes = set(by_node) | (set(self.sessions) if final else set())
        outcomes = await asyncio.gather(
            *(
                self._acknowledge_node(
                    n, {tp: acks[tp] for tp in by_node.get(n, set())}, final=final
                )
                for n in nodes
            ),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                log.info("share acknowledge failed: %s", outcome)
                continue
            results.extend(outcome)
        self.acks.sent(acks)
        self._count_acks(results)
        return results

    async def _acknowledge_node(
        self, node: int, acks: dict[TopicPartition, OffsetSpans], *, final: bool
    ) -> list[AckResult]:
        session, lock = self._session(node)
        async with lock:
            if not session.open:
                if not acks:
                    return []
                err = KcoreError(f"no share session with node {node} to acknowledge in")
                return [(tp, offsets, err) for tp, offsets in acks.items()]
            ids, names = self._topic_ids()
            request = ShareAcknowledgeRequest(
                group_id=self.group_id,
                member_id=self.member_id(),
                share_session_epoch=FINAL_EPOCH if final else session.epoch,
                is_renew_ack=has_renew(acks),
                topics=[
                    AcknowledgeTopic(
                        topic_id=ids[topic],
                        partitions=[
                            AcknowledgePartition(
                                partition_index=tp.partition,
                                acknowledgement_batches=acks[tp].batches(AckRequestBatch),
                            )
                            for tp in sorted(tps)
                        ],
                    )
                    for topic, tps in _by_topic(acks).items()
                    if topic in ids
                ],
            )
            version = await self.cluster.version_for(node, ApiKey.SHARE_ACKNOWLEDGE)
            try:
                response = await self.cluster.send(node, request, version)
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                session.reset()
                return [(tp, offsets, exc) for tp, offsets in acks.items()]
            code = response.error_code
            if code != ErrorCode.NONE:
                session.reset()
                err = _error(code, response.error_message, "ShareAcknowledge")
                return [(tp, offsets, err) for tp, offsets in acks.items()]
            if final:
                session.reset()
            else:
                session.advance()
            out: list[AckResult] = []
            answered: set[TopicPartition] = set()
            for topic in response.responses:
                name = names.get(topic.topic_id)
                for p in topic.partitions:
                    tp = TopicPartition(name or "", p.partition_index)
                    if tp not in acks:
                        continue
                    answered.add(tp)
                    perr = None
                    if p.error_code != ErrorCode.NONE:
                        perr = _error(p.error_code, p.error_message, "acknowledge")
                        self.cluster.handle_error_code(p.error_code)
                    out.append((tp, acks[tp], perr))
            out.extend((tp, acks[tp], None) for tp in set(acks) - answered)
            return out

    def _report(self, acks: dict[TopicPartition, OffsetSpans], err: KcoreError) -> None:
        results: list[AckResult] = [(tp, offsets, err) for tp, offsets in acks.items()]
        self._count_acks(results)
        self.results.extend(results)

    def _count_acks(self, results: list[AckResult]) -> None:
        """Java's acknowledgements-send and -error sensors: records whose acknowledgements
        were answered, and those of them that failed (gaps, which no record holds, aside)."""
        metrics = self.cluster.metrics
        for _, offsets, err in results:
            n = len(offsets) - offsets.count_of(GAP)
            if n:
                metrics.record("acknowledgements-send", n)
                if err is not None:
                    metrics.record("acknowledgements-error", n)

    async def stop(self, wait_s: float) -> None:
        """Let the fetches under way answer (up to ``wait_s``), then cancel what is left."""
        tasks = [t for t in self._inflight.values() if not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=wait_s)
        for task in self._inflight.values():
            task.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        self._inflight.clear()


def _delivery_count(ranges: list[tuple[int, int, int]], offset: int) -> int:
    """The delivery count of ``offset`` if it is inside ``ranges``, else 0."""
    for first, last, count in ranges:
        if first <= offset <= last:
            return count
    return 0


def _uncovered(
    ranges: list[tuple[int, int, int]], spans: list[tuple[int, int]], covered: int
) -> list[int]:
    """The offsets of ``ranges`` up to ``covered`` outside every one of ``spans``."""
    out: list[int] = []

    def add(lo: int, hi: int) -> None:
        if len(out) + hi - lo + 1 > MAX_SHARE_GAPS:
            raise CorruptRecordError(
                f"a ShareFetch answer leaves {hi - lo + 1} acquired offsets ({lo}-{hi}) with "
                "no record: not batches a broker wrote"
            )
        out.extend(range(lo, hi + 1))

    spans = sorted(spans)
    for first, last, _ in ranges:
        lo, hi = first, min(last, covered)
        for span_lo, span_hi in spans:
            if lo > hi:
                break
            if span_hi < lo:
                continue
            if span_lo > hi:
                break
            add(lo, min(span_lo - 1, hi))
            lo = span_hi + 1
        add(lo, hi)
    return out


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[TopicPartition]]:
    out: dict[str, list[TopicPartition]] = {}
    for tp in partitions:
        out.setdefault(tp.topic, []).append(tp)
    return out


def _error(code: int, message: str | None, where: str) -> KafkaError:
    err = error_for_code(code, message)
    assert err is not None
    return err.with_message(f"{where}: {err.message}")
