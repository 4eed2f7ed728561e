"""``kcore.Consumer`` (blocking) and ``kcore.AsyncConsumer``, with manual assignment: the caller
says which partitions to read (``assign``) and from where (``seek`` or ``auto.offset.reset``);
records come back one by one (``poll``) or as Arrow record batches (``poll_arrow``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import threading
import time
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from kcore.cluster.client import ClusterClient
from kcore.cluster.offsets import list_offsets
from kcore.codec import decode_columns, decode_records
from kcore.config import ClientConfig
from kcore.consumer.fetcher import FetchedData, Fetcher, PartitionState
from kcore.consumer.group import GroupCoordinator, Listener, drive_async, drive_sync
from kcore.errors import KcoreError, NoOffsetForPartitionError, WakeupError
from kcore.network.loop_thread import start_on_loop_thread
from kcore.network.process_local import ProcessLocal
from kcore.types import ConsumerGroupMetadata, ListOffsetsResult, TopicPartition

log = logging.getLogger("kcore.consumer")

__all__ = ["AsyncConsumer", "Consumer", "ConsumerRecord"]


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def _declare_metrics(core: ConsumerCore) -> None:
    """The consumer's metrics, named as Java's consumer-fetch-manager-metrics and
    consumer-coordinator-metrics groups have them."""
    metrics = core.cluster.metrics
    metrics.declare("records-consumed", "total", "rate")
    metrics.declare("bytes-consumed", "total", "rate")
    metrics.declare("fetch-latency", "avg", "max")
    metrics.declare("fetch-size", "avg", "max")
    metrics.declare("fetch-throttle-time", "avg", "max")
    metrics.declare("records-lag", "max")
    metrics.declare("commit-latency", "avg", "max")
    metrics.gauge("fetch-total", lambda: metrics.count("fetch-latency"))
    metrics.gauge("fetch-rate", lambda: metrics.rate_of("fetch-latency"))
    metrics.gauge("commit-total", lambda: metrics.count("commit-latency"))
    metrics.gauge("commit-rate", lambda: metrics.rate_of("commit-latency"))
    metrics.gauge("assigned-partitions", lambda: len(core.fetcher.states))
    metrics.gauge(
        "last-poll-seconds-ago",
        lambda: -1.0 if core.last_poll is None else time.monotonic() - core.last_poll,
    )


def _tps(partitions: Iterable[TopicPartition | tuple[str, int]]) -> list[TopicPartition]:
    return [TopicPartition(*tp) for tp in partitions]


Topics = Iterable[str] | str | re.Pattern[str]


def _subscription(topics: Topics) -> list[str] | str | re.Pattern[str]:
    """``subscribe``'s argument, an iterable made a list (empty: Java's unsubscribe)."""
    return topics if isinstance(topics, (str, re.Pattern)) else list(topics)


_LEAVE_TIMEOUT_S = 8  # close(): a dead coordinator must not hold it up longer


class ConsumerCore:
    """Assignment, positions and the poll logic; the fetcher runs on the event loop."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        cfg = config if isinstance(config, ClientConfig) else ClientConfig(config, role="consumer")
        self.config = cfg
        self.cluster = ClusterClient(cfg, auto_create=bool(cfg["allow.auto.create.topics"]))
        self.max_poll_records = int(cfg["max.poll.records"])
        self.check_crcs = bool(cfg["check.crcs"])
        policy, duration_s = cfg.auto_offset_reset()
        self.fetcher = Fetcher(
            self.cluster,
            max_wait_ms=int(cfg["fetch.max.wait.ms"]),
            min_bytes=int(cfg["fetch.min.bytes"]),
            max_bytes=int(cfg["fetch.max.bytes"]),
            partition_max_bytes=int(cfg["max.partition.fetch.bytes"]),
            isolation_level=1 if cfg["isolation.level"] == "read_committed" else 0,
            reset_policy=policy,
            reset_duration_s=duration_s or 0.0,
            api_timeout_s=int(cfg["default.api.timeout.ms"]) / 1000,
        )
        self._fetch_task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.group = GroupCoordinator(self.cluster, cfg, self) if cfg["group.id"] else None
        if self.group is not None:
            offsets, timeout = self.group.offsets, self.group.api_timeout_s
            self.fetcher.committed_lookup = lambda tps: offsets.fetch_with_epochs(tps, timeout)
        self.manual = False  # assign() was used (exclusive with subscribe, as in Java)
        self.last_poll: float | None = None
        self.closed = False
        self._closing: asyncio.Future[None] | None = None
        _declare_metrics(self)

    async def start(self) -> None:
        """Bootstrap and start the fetcher; on failure the connections close."""
        self.loop = asyncio.get_running_loop()
        try:
            await self.cluster.start()
        except BaseException:
            await self.cluster.close()
            raise
        self._fetch_task = self.loop.create_task(self.fetcher.run())
        if self.group is not None:
            self.group.loop = self.loop

    async def close(self) -> None:
        """Commit and leave (bounded), stop fetching, close the connections. Safe to cancel:
        the closing goes on in a task of its own, which a later close() waits for."""
        self.closed = True
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if self.group is not None:
            try:  # bounded: a dead coordinator must not hold close() up
                await asyncio.wait_for(self.group.close(commit=True), 8)
            except Exception as exc:  # closing goes on: the connections must be released
                log.warning(
                    "group %r: commit or leave on close failed: %s", self.group.group_id, exc
                )
        await self.fetcher.stop()
        if self._fetch_task is not None:
            self._fetch_task.cancel()
            await asyncio.gather(self._fetch_task, return_exceptions=True)
        await self.cluster.close()

    def wake(self) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.fetcher.wakeup)

    # -- assignment and positions (any thread) ----------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        if self.group is not None and self.group.subscribed:
            raise KcoreError("assign() on a subscribed consumer: unsubscribe first")
        wanted = _tps(partitions)
        if not wanted:  # as Java: assign([]) is unsubscribe()
            self.unassign()
            return
        self.manual = True
        f = self.fetcher
        with f.lock:
            old = f.states
            # With a group.id, a new partition starts at the group's committed offset, if any.
            fresh = self.group is not None
            f.states = {tp: old.get(tp) or PartitionState(from_committed=fresh) for tp in wanted}
            f.completed = type(f.completed)(d for d in f.completed if d.tp in f.states)
        self.cluster.add_topics({tp.topic for tp in wanted})
        self.wake()

    def assignment(self) -> set[TopicPartition]:
        with self.fetcher.lock:
            return set(self.fetcher.states)

    # -- the group's view of the assignment (GroupCoordinator's Assignment protocol) ---------------

    def owned(self) -> set[TopicPartition]:
        return self.assignment()

    def positions(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """The positions to commit, of the partitions that have one: each with the leader
        epoch of the record before it (-1: unknown), read together (KIP-320)."""
        with self.fetcher.lock:
            out = {}
            for tp in partitions:
                st = self.fetcher.states.get(tp)
                if st is not None and st.position is not None:
                    out[tp] = (st.position, st.offset_epoch)
            return out

    def add_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions the group gave this member: they start at the group's committed offset
        (looked up by the fetcher), else at ``auto.offset.reset``."""
        partitions = list(partitions)
        with self.fetcher.lock:
            for tp in partitions:
                self.fetcher.states[tp] = PartitionState(from_committed=True)
        self.cluster.add_topics({tp.topic for tp in partitions})
        self.wake()

    def interrupt_wait(self) -> None:
        self.fetcher.interrupt_wait()

    def remove_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        with self.fetcher.lock:
            for tp in partitions:
                if self.fetcher.states.pop(tp, None) is not None:
                    self.fetcher.drop_queued(tp)

    def unassign(self) -> None:
        """Drop a manual assignment (``unsubscribe()``, ``assign([])``)."""
        if self.manual:
            self.remove_partitions(self.owned())
            self.manual = False

    def subscribe(
        self,
        topics: Iterable[str] | str | re.Pattern[str],
        on_assign: Listener | None,
        on_revoke: Listener | None,
        on_lost: Listener | None,
    ) -> None:
        if self.group is None:
            raise KcoreError("subscribe() needs group.id in the consumer's config")
        if self.manual:
            raise KcoreError(
                "subscribe() on a consumer that used assign(): unsubscribe() (or assign([])) first"
            )
        self.group.subscribe(topics, on_assign, on_revoke, on_lost)
        self.wake()

    def leaving(self) -> GroupCoordinator | None:
        """The group to leave before an unsubscribe or close: one this consumer subscribed to."""
        group = self.group
        return group if group is not None and group.subscribed else None

    def require_group(self) -> GroupCoordinator:
        if self.group is None:
            raise KcoreError("offsets are committed to a group: set group.id")
        return self.group

    def _state(self, tp: TopicPartition) -> PartitionState:
        st = self.fetcher.states.get(tp)
        if st is None:
            raise KcoreError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return st

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        tp = TopicPartition(*tp)
        if offset < 0:
            raise KcoreError(f"seek to a negative offset ({offset})")
        with self.fetcher.lock:
            st = self._state(tp)
            st.seek(offset)
            self._drop_buffered(tp)
        self.wake()

    def seek_to(self, partitions: Iterable[TopicPartition | tuple[str, int]], where: str) -> None:
        with self.fetcher.lock:
            for tp in _tps(partitions) or list(self.fetcher.states):
                st = self._state(tp)
                st.seek(None, where)
                self._drop_buffered(tp)
        self.wake()

    def _drop_buffered(self, tp: TopicPartition) -> None:
        self.fetcher.drop_queued(tp)
        st = self.fetcher.states[tp]
        st.errors, st.retry_at = 0, 0.0  # a seek is fetched at once, whatever failed before

    def position(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        """None while it is being looked up; raises ``NoOffsetForPartitionError`` once the
        lookup found nothing to start from and ``auto.offset.reset`` is ``none``."""
        tp = TopicPartition(*tp)
        with self.fetcher.lock:
            st = self._state(tp)
            if (
                st.position is None
                and st.reset_to is None
                and not st.from_committed
                and self.fetcher.lacks_reset(tp)
            ):
                raise NoOffsetForPartitionError([tp])
            return st.position

    def pause(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        with self.fetcher.lock:
            paused = set(_tps(partitions))
            for tp in paused:
                self._state(tp).paused = True
            # What waits for a paused partition may wait long: keep its own bytes, not a view
            # that pins the whole response it came in (and the other partitions' data in it).
            for data in self.fetcher.completed:
                if data.tp in paused and isinstance(data.records, memoryview):
                    data.records = bytes(data.records)

    def resume(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        with self.fetcher.lock:
            for tp in _tps(partitions):
                self._state(tp).paused = False
        self.wake()

    # -- taking records (any thread) --------------------------------------------------------------

    def _next_data(self, have_records: bool = False) -> FetchedData | None:
        """The first queued data whose partition is not paused and still at the position the
        data was fetched from (stale data is dropped on the way). A queued error is raised, but
        only to a caller that has taken nothing yet (as Java's poll: records first, the error
        at the next call)."""
        while True:
            found, rescan = self._scan_queue(have_records)
            if not rescan:
                return found

    def _scan_queue(self, have_records: bool) -> tuple[FetchedData | None, bool]:
        """One pass of :meth:`_next_data`: (the data, False), or (None, True) when a partition's
        queued data was dropped on the way (the queue changed under the pass: scan again)."""
        f = self.fetcher
        for data in list(f.completed):
            if isinstance(data.error, NoOffsetForPartitionError):
                # Reported by the fetcher in the moment between assign() and seek(), say: it
                # holds only for partitions still without a position.
                still = [
                    tp
                    for tp in data.error.partitions
                    if tp in f.states and f.states[tp].position is None
                ]
                if not still:
                    f.completed.remove(data)
                    continue
                if still != data.error.partitions:
                    data.error = NoOffsetForPartitionError(still)
            if data.error is not None:
                if data.tp.partition >= 0 and data.tp not in f.states:
                    f.completed.remove(data)  # about a partition unassigned since
                    continue
                if have_records:
                    return None, False
                f.completed.remove(data)
                raise data.error
            st = f.states.get(data.tp)
            if st is None:
                f.completed.remove(data)  # unassigned since it was fetched
                continue
            if data.decoded is None and st.position != data.fetch_offset:
                f.drop_queued(data.tp)  # sought since it was fetched: all of it is stale
                self.wake()
                return None, True
            if st.unvalidated(f.leader_epoch(data.tp)):
                # The leader changed since this was fetched (KIP-320): the position is checked
                # with the new one first, and the old leader's read-ahead is not handed out.
                f.drop_queued(data.tp, keep_errors=True)
                self.wake()
                return None, True
            if st.paused:
                continue  # kept for resume, not handed out (as Java's pause)
            return data, False
        return None, False

    def _finish(self, data: FetchedData, st: PartitionState) -> None:
        """``data`` is used up: the position moves past its last batch (past control batches
        and compacted-away records too), where the next queued data starts."""
        self.fetcher.completed.remove(data)
        st.queued -= 1
        st.queued_bytes -= len(data.records)
        self.cluster.metrics.record("bytes-consumed", len(data.records))
        if data.end_offset > (st.position or 0):
            st.took(data, data.end_offset)
        self.wake()

    def _record_lag(self, st: PartitionState) -> None:
        """records-lag-max: how far a partition's position is behind its high watermark
        (read_committed: its last stable offset) after records were handed out."""
        if st.lag_end >= 0 and st.position is not None:
            self.cluster.metrics.record("records-lag", max(0, st.lag_end - st.position))

    def consumed(self, records: int) -> None:
        """A poll returned ``records``: counted, and the time of the poll kept."""
        self.last_poll = time.monotonic()
        if records:
            self.cluster.metrics.record("records-consumed", records)

    def current_lag(self, tp: TopicPartition) -> int | None:
        with self.fetcher.lock:
            st = self.fetcher.states.get(tp)
            if st is None or st.lag_end < 0 or st.position is None:
                return None
            return max(0, st.lag_end - st.position)

    async def edge_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], which: str, timeout: float
    ) -> dict[TopicPartition, int]:
        """``earliest`` or ``latest`` offsets; ``latest`` under this consumer's isolation.level
        (read_committed: the last stable offset), as Java's beginningOffsets/endOffsets."""
        found = await list_offsets(
            self.cluster,
            {TopicPartition(*tp): which for tp in partitions},
            isolation_level=self.fetcher.isolation_level,
            timeout=timeout,
        )
        return {tp: r.offset for tp, r in found.result().items()}

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition | tuple[str, int], int], timeout: float
    ) -> dict[TopicPartition, ListOffsetsResult]:
        """The first offset at or after each timestamp (ms), under read_uncommitted (as the
        offsets of records, not a transaction's end); -1 offsets where no record is that
        recent."""
        found = await list_offsets(self.cluster, timestamps, isolation_level=0, timeout=timeout)
        return found.result()

    async def partitions_for(self, topic: str) -> list[int]:
        md = await self.cluster.refresh_metadata([topic])
        info = md.topics.get(topic)
        return [] if info is None or info.error_code else sorted(info.partitions)

    def check_can_poll(self) -> None:
        """As Java's consumer: polling with neither a subscription nor an assignment is a
        mistake (it would wait out every timeout and return nothing), not an empty result.
        So is polling a closed consumer (it would return nothing for ever)."""
        if self.closed:
            raise KcoreError("the consumer is closed")
        if self.group is not None and self.group.subscribed:
            return
        with self.fetcher.lock:
            if self.fetcher.states:
                return
        raise KcoreError(
            "the consumer has no partitions assigned and no subscription: call assign() "
            "(or subscribe() with a group.id) before polling"
        )

    def take_records(self, max_records: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        with self.fetcher.lock:
            while len(out) < max_records:
                data = self._next_data(bool(out))
                if data is None:
                    break
                st = self.fetcher.states[data.tp]
                if data.decoded is None:
                    try:
                        data.decoded = self._decode(data)
                    except Exception:
                        if out:  # hand out what was taken; the next poll raises
                            break
                        raise
                    data.taken = 0
                recs = data.decoded
                n = min(max_records - len(out), len(recs) - data.taken)
                if n:
                    out.extend(recs[data.taken : data.taken + n])
                    data.taken += n
                    st.took(data, recs[data.taken - 1].offset + 1)
                if data.taken >= len(recs):
                    self._finish(data, st)
                self._record_lag(st)
        self.consumed(len(out))
        return out

    def _decode(self, data: FetchedData) -> list[ConsumerRecord]:
        """The records at or after the fetch offset (a fetch may start inside a batch), made
        as ConsumerRecords by the codec; control batches are skipped (and, read_committed,
        the batches of aborted transactions)."""
        return decode_records(  # type: ignore[no-any-return]
            _committed(data) if data.aborted else data.records,
            True,  # a fetch response may end with a partial batch (the next fetch gets it whole)
            data.fetch_offset,
            check_crcs=self.check_crcs,
            record_type=ConsumerRecord,
            topic=data.tp.topic,
            partition=data.tp.partition,
        )

    def take_arrow(self, max_records: int) -> Any:
        import pyarrow as pa

        batches: list[Any] = []
        left = max_records
        with self.fetcher.lock:
            while left > 0:
                data = self._next_data(bool(batches))
                if data is None:
                    break
                st = self.fetcher.states[data.tp]
                if data.decoded is None:
                    try:
                        records = _committed(data) if data.aborted else data.records
                        cols = decode_columns(
                            records, min_offset=data.fetch_offset, check_crcs=self.check_crcs
                        )
                    except Exception:
                        if batches:  # hand out what was taken; the next poll raises
                            break
                        raise
                    data.decoded = [cols.to_arrow()]
                    data.taken = 0
                rb = data.decoded[0]
                n = min(left, rb.num_rows - data.taken)
                if n > 0:
                    part = rb.slice(data.taken, n)
                    batches.append(_with_topic(part, data.tp))
                    data.taken += n
                    left -= n
                    st.took(data, part.column("offset")[n - 1].as_py() + 1)
                if data.taken >= rb.num_rows:
                    self._finish(data, st)
                self._record_lag(st)
        self.consumed(max_records - left)
        if not batches:
            return _empty_arrow()
        if len(batches) == 1:
            return batches[0]
        return pa.concat_batches(batches)


def _committed(data: FetchedData) -> Any:
    """read_committed: ``data``'s records without those of aborted transactions."""
    from kcore.consumer.aborted import drop_aborted

    assert data.aborted is not None
    return drop_aborted(data.records, data.aborted)


def _with_topic(rb: Any, tp: TopicPartition) -> Any:
    """Spark's Kafka source columns: key, value, topic, partition, offset, timestamp,
    timestampType (and headers)."""
    import numpy as np
    import pyarrow as pa

    n = rb.num_rows
    topic = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, np.int32)), pa.array([tp.topic], pa.string())
    ).cast(pa.string())
    arrays = [rb.column("key"), rb.column("value"), topic]
    arrays.append(pa.array(np.full(n, tp.partition, np.int32)))
    names = ["key", "value", "topic", "partition"]
    for name in rb.schema.names:
        if name not in ("key", "value"):
            arrays.append(rb.column(name))
            names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _empty_arrow() -> Any:
    from kcore.codec import decode_columns as dc

    return _with_topic(dc(b"").to_arrow(), TopicPartition("", 0))


class Consumer(ProcessLocal):
    """``kcore.Consumer({"bootstrap.servers": ...})``: manual assignment (``assign``) or a
    consumer group (``group.id`` and ``subscribe``). Java's config names and defaults. Pickles
    as its config; a forked child's copy rebuilds itself on first use."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._process_local(config)
        self._core = ConsumerCore(config)
        self._woken = threading.Event()
        self._loop = start_on_loop_thread("kcore-consumer", self._core.start)

    @property
    def cluster(self) -> Any:
        return self._core.cluster

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read these partitions (no group membership). ``assign([])`` is ``unsubscribe()``."""
        partitions = list(partitions)
        if not partitions:
            self.unsubscribe()
            return
        self._core.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return self._core.assignment()

    # -- consumer groups --------------------------------------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str] | str | re.Pattern[str],
        on_assign: Listener | None = None,
        on_revoke: Listener | None = None,
        on_lost: Listener | None = None,
    ) -> None:
        """Join ``group.id`` and read ``topics`` (names, or a regular expression: a compiled
        pattern or a string starting with ``^``). The group assigns the partitions; the
        listeners run inside ``poll``, in this thread, with a list of ``TopicPartition``:
        ``on_revoke`` before partitions go (after auto-commit has committed them),
        ``on_assign`` when partitions arrive, ``on_lost`` when the group has already given
        them to another member (default: ``on_revoke``). ``subscribe([])`` is
        ``unsubscribe()``."""
        topics = _subscription(topics)
        if topics == []:
            self.unsubscribe()
            return
        self._core.subscribe(topics, on_assign, on_revoke, on_lost)

    def unsubscribe(self) -> None:
        """Stop reading: a subscription's partitions are committed (auto-commit) and revoked
        (``on_revoke`` runs here) and the member leaves its group; a manual assignment is
        dropped. A listener's exception is raised after leaving."""
        self._core.unassign()
        group = self._core.leaving()
        if group is not None:
            drive_sync(group.leave_step(), self._loop.run)

    def commit(
        self,
        offsets: Mapping[TopicPartition | tuple[str, int], int] | None = None,
        asynchronous: bool = False,
        timeout: float | None = None,
    ) -> concurrent.futures.Future[None] | None:
        """Commit ``offsets`` (the next offset to read per partition; default: the positions
        of every assigned partition). Blocks until done, unless ``asynchronous``, which returns
        a future. Raises ``CommitFailedError`` if the group rebalanced since."""
        group = self._core.require_group()
        parts = None if offsets is None else {TopicPartition(*tp): o for tp, o in offsets.items()}
        coro = group.commit_coro(parts)
        if asynchronous:
            return self._loop.submit(coro)
        self._loop.run(coro, timeout)
        return None

    def committed(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where nothing is committed)."""
        group = self._core.require_group()
        t = group.api_timeout_s if timeout is None else timeout
        return self._loop.run(group.offsets.fetch(_tps(partitions), t))

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member's identity, for a transactional producer's send_offsets_to_transaction."""
        return self._core.require_group().group_metadata()

    def _group_step(self, timeout: float = 0.0) -> None:
        if self._core.group is not None:
            drive_sync(self._core.group.poll_step(timeout), self._run_waking)

    def _run_waking(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """``self._loop.run``, given up on (the coroutine cancelled, ``WakeupError``) when
        :meth:`wakeup` is called meanwhile."""
        return self._loop.run(coro, interrupt=self._woken)

    def wakeup(self) -> None:
        """From another thread: the blocking call under way (``poll``, a rebalance inside it),
        or the next one, raises ``WakeupError`` (Java's ``WakeupException``), e.g. to shut a
        polling loop down."""
        self._woken.set()
        self._core.interrupt_wait()

    def _raise_if_woken(self) -> None:
        if self._woken.is_set():
            self._woken.clear()
            raise WakeupError("wakeup() was called")

    # -- positions --------------------------------------------------------------------------------

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        self._core.seek(partition, offset)

    def seek_to_beginning(self, partitions: Iterable[Any] = ()) -> None:
        self._core.seek_to(partitions, "earliest")

    def seek_to_end(self, partitions: Iterable[Any] = ()) -> None:
        self._core.seek_to(partitions, "latest")

    def position(self, partition: TopicPartition | tuple[str, int], timeout: float = 60) -> int:
        """The next offset to be handed out (looked up first if it is not known yet)."""
        deadline = time.monotonic() + timeout
        while (pos := self._core.position(partition)) is None:
            if time.monotonic() > deadline:
                raise KcoreError(f"no position for {partition} within {timeout:g}s")
            time.sleep(0.01)
        return pos

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition | tuple[str, int], int], timeout: float = 60
    ) -> dict[TopicPartition, ListOffsetsResult]:
        return self._loop.run(self._core.offsets_for_times(timestamps, timeout))

    def pause(self, partitions: Iterable[Any]) -> None:
        self._core.pause(partitions)

    def resume(self, partitions: Iterable[Any]) -> None:
        self._core.resume(partitions)

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timeout: float = 60
    ) -> dict[TopicPartition, int]:
        """Each partition's first offset (Java's ``beginningOffsets``)."""
        return self._loop.run(self._core.edge_offsets(partitions, "earliest", timeout))

    def end_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timeout: float = 60
    ) -> dict[TopicPartition, int]:
        """Each partition's end: the next offset to be written, or with read_committed the
        last stable offset (Java's ``endOffsets``)."""
        return self._loop.run(self._core.edge_offsets(partitions, "latest", timeout))

    def partitions_for(self, topic: str, timeout: float = 60) -> list[int]:
        """The topic's partition numbers from fresh metadata (Java's ``partitionsFor``); empty
        if the topic does not exist."""
        return self._loop.run(self._core.partitions_for(topic), timeout)

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to ``timeout`` seconds for some."""
        self._core.check_can_poll()
        limit = max_records or self._core.max_poll_records
        deadline = time.monotonic() + timeout
        while True:
            self._raise_if_woken()
            self._group_step(deadline - time.monotonic())
            records = self._core.take_records(limit)
            left = deadline - time.monotonic()
            if records or left <= 0:
                return records
            self._core.fetcher.wait_for_data(min(left, 0.1) if self._core.group else left)

    def poll_arrow(self, timeout: float = 1.0, max_records: int | None = None) -> Any:
        """A ``pyarrow.RecordBatch`` (key, value, topic, partition, offset, timestamp,
        timestampType, headers), decoded column by column by the codec."""
        self._core.check_can_poll()
        limit = max_records or 1 << 30
        deadline = time.monotonic() + timeout
        while True:
            self._raise_if_woken()
            self._group_step(deadline - time.monotonic())
            rb = self._core.take_arrow(limit)
            left = deadline - time.monotonic()
            if rb.num_rows or left <= 0:
                return rb
            self._core.fetcher.wait_for_data(min(left, 0.1) if self._core.group else left)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        while True:
            yield from self.poll(1.0)

    def metrics(self) -> dict[str, float]:
        """The consumer's metrics by their Java names (``records-consumed-rate``,
        ``records-lag-max``, ``fetch-latency-avg``, ``commit-latency-avg``, ...): see
        :mod:`kcore.metrics`."""
        return self._core.cluster.metrics.snapshot()

    def current_lag(self, partition: TopicPartition | tuple[str, int]) -> int | None:
        """How many records ``partition`` is behind its high watermark (read_committed: its
        last stable offset) as the last fetch saw it, without asking the broker; None when
        not known yet (Java's ``currentLag``)."""
        return self._core.current_lag(TopicPartition(*partition))

    def close(self) -> None:
        """Leave the group as :meth:`unsubscribe` does (within 8 s of group I/O; listeners
        run here), commit a manual assignment's positions under auto-commit, close the
        connections. A listener's exception is raised once all that is done."""
        if not self._loop.is_running:
            return
        error: Exception | None = None
        try:
            group = self._core.leaving()
            if group is not None:
                try:
                    drive_sync(group.leave_step(_LEAVE_TIMEOUT_S), self._loop.run)
                except Exception as exc:  # a listener's: closing goes on first
                    error = exc
            self._loop.run(self._core.close(), 15)
        finally:
            self._loop.close()
        if error is not None:
            raise error

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncConsumer:
    """The asyncio flavour of :class:`Consumer` (``await start()`` or ``async with``)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._core = ConsumerCore(config)
        self._step_task: asyncio.Future[Any] | None = None  # a poll's group step (see there)
        self._closing: asyncio.Future[None] | None = None

    async def start(self) -> AsyncConsumer:
        await self._core.start()
        return self

    async def __aenter__(self) -> AsyncConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """As :meth:`Consumer.assign`; ``assign([])`` on a subscribed consumer raises (leaving
        the group is I/O: ``await unsubscribe()``)."""
        partitions = list(partitions)
        if not partitions:
            self._refuse_leaving("assign([])")
        self._core.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return self._core.assignment()

    def subscribe(
        self,
        topics: Iterable[str] | str | re.Pattern[str],
        on_assign: Listener | None = None,
        on_revoke: Listener | None = None,
        on_lost: Listener | None = None,
    ) -> None:
        """As :meth:`Consumer.subscribe`; listeners may be coroutine functions.
        ``subscribe([])`` drops a manual assignment, and on a subscribed consumer raises
        (``await unsubscribe()``)."""
        topics = _subscription(topics)
        if topics == []:
            self._refuse_leaving("subscribe([])")
            self._core.unassign()
            return
        self._core.subscribe(topics, on_assign, on_revoke, on_lost)

    def _refuse_leaving(self, call: str) -> None:
        if self._core.leaving() is not None:
            raise KcoreError(
                f"{call} unsubscribes, and leaving the group is I/O: await unsubscribe()"
            )

    async def unsubscribe(self) -> None:
        """As :meth:`Consumer.unsubscribe`; listeners may be coroutine functions."""
        await self._finish_pending_step()
        self._core.unassign()
        group = self._core.leaving()
        if group is not None:
            await drive_async(group.leave_step())

    async def commit(
        self, offsets: Mapping[TopicPartition | tuple[str, int], int] | None = None
    ) -> None:
        group = self._core.require_group()
        parts = None if offsets is None else {TopicPartition(*tp): o for tp, o in offsets.items()}
        await group.commit_coro(parts)

    async def committed(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        group = self._core.require_group()
        t = group.api_timeout_s if timeout is None else timeout
        return await group.offsets.fetch(_tps(partitions), t)

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self._core.require_group().group_metadata()

    async def _finish_pending_step(self) -> None:
        """Wait for a group step an earlier, cancelled poll left running (its listener's
        error, if any, is raised here)."""
        pending = self._step_task
        if pending is not None:
            try:
                await asyncio.shield(pending)
            finally:
                if pending.done():
                    self._step_task = None

    async def _group_step(self, timeout: float = 0.0) -> None:
        """The group's part of a poll, as a task: a poll cancelled meanwhile (asyncio.wait_for
        around it) leaves the step running, listeners and all, and the next poll waits for it
        before a step of its own, as Java's poll always completes a rebalance it began (a
        step cut short ran its listeners again, or left partitions unassigned)."""
        group = self._core.group
        if group is None:
            return
        await self._finish_pending_step()
        task = asyncio.ensure_future(drive_async(group.poll_step(timeout)))
        self._step_task = task
        try:
            await asyncio.shield(task)
        finally:
            if task.done():
                self._step_task = None

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        self._core.seek(partition, offset)

    def seek_to_beginning(self, partitions: Iterable[Any] = ()) -> None:
        self._core.seek_to(partitions, "earliest")

    def seek_to_end(self, partitions: Iterable[Any] = ()) -> None:
        self._core.seek_to(partitions, "latest")

    async def position(
        self, partition: TopicPartition | tuple[str, int], timeout: float = 60
    ) -> int:
        """The next offset to be handed out (looked up first if it is not known yet)."""
        deadline = time.monotonic() + timeout
        while (pos := self._core.position(partition)) is None:
            if time.monotonic() > deadline:
                raise KcoreError(f"no position for {partition} within {timeout:g}s")
            await asyncio.sleep(0.01)
        return pos

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition | tuple[str, int], int], timeout: float = 60
    ) -> dict[TopicPartition, ListOffsetsResult]:
        return await self._core.offsets_for_times(timestamps, timeout)

    def pause(self, partitions: Iterable[Any]) -> None:
        self._core.pause(partitions)

    def resume(self, partitions: Iterable[Any]) -> None:
        self._core.resume(partitions)

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timeout: float = 60
    ) -> dict[TopicPartition, int]:
        return await self._core.edge_offsets(partitions, "earliest", timeout)

    async def end_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timeout: float = 60
    ) -> dict[TopicPartition, int]:
        return await self._core.edge_offsets(partitions, "latest", timeout)

    async def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition numbers from fresh metadata (Java's ``partitionsFor``); empty
        if the topic does not exist."""
        return await self._core.partitions_for(topic)

    def _check_started(self) -> None:
        if self._core.loop is None and not self._core.closed:
            raise KcoreError("the AsyncConsumer is not started: await start() (or async with)")

    async def poll(
        self, timeout: float = 1.0, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        self._check_started()
        self._core.check_can_poll()
        limit = max_records or self._core.max_poll_records
        deadline = time.monotonic() + timeout
        while True:
            await self._group_step(deadline - time.monotonic())
            records = self._core.take_records(limit)
            left = deadline - time.monotonic()
            if records or left <= 0:
                return records
            await self._core.fetcher.wait_for_data_async(
                min(left, 0.1) if self._core.group else left
            )

    async def poll_arrow(self, timeout: float = 1.0, max_records: int | None = None) -> Any:
        self._check_started()
        self._core.check_can_poll()
        deadline = time.monotonic() + timeout
        while True:
            await self._group_step(deadline - time.monotonic())
            rb = self._core.take_arrow(max_records or 1 << 30)
            left = deadline - time.monotonic()
            if rb.num_rows or left <= 0:
                return rb
            await self._core.fetcher.wait_for_data_async(
                min(left, 0.1) if self._core.group else left
            )

    def metrics(self) -> dict[str, float]:
        """As :meth:`Consumer.metrics`."""
        return self._core.cluster.metrics.snapshot()

    def current_lag(self, partition: TopicPartition | tuple[str, int]) -> int | None:
        """As :meth:`Consumer.current_lag`."""
        return self._core.current_lag(TopicPartition(*partition))

    async def close(self) -> None:
        """As :meth:`Consumer.close`. Safe to cancel: the whole closing (listeners, commit,
        leave, connections) goes on in a task of its own, which a later close() waits for."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        error: Exception | None = None
        step = self._step_task
        if step is not None and not step.done():
            # A poll's group step that a cancellation left running: it finishes (bounded)
            # before the leave, so no listener runs twice or alongside the leave's.
            try:
                await asyncio.wait_for(asyncio.shield(step), _LEAVE_TIMEOUT_S)
            except asyncio.TimeoutError:
                step.cancel()
            except Exception as exc:  # noqa: BLE001 - a listener's: raised once closed
                error = exc
        elif step is not None and not step.cancelled() and step.exception() is not None:
            error = error or step.exception()  # type: ignore[assignment]
        self._step_task = None
        group = self._core.leaving()
        if group is not None and self._core.loop is not None:
            try:
                await drive_async(group.leave_step(_LEAVE_TIMEOUT_S))
            except Exception as exc:  # a listener's: closing goes on first
                error = error or exc
        await self._core.close()
        if error is not None:
            raise error
