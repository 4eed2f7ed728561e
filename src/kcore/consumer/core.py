"""The consumer's core, shared by the blocking ``Consumer`` and ``AsyncConsumer`` (thin facades in
client.py): the assignment and positions, the fetcher and the group, which run on the client's
event loop, and the poll logic, which runs on the caller's thread.

``poll`` and ``poll_arrow`` are written once, as :meth:`ConsumerCore.poll_plan`: a generator
that yields what a poll waits for (the group's step, data from the fetcher); the blocking
facade drives it on the caller's thread and the asyncio facade on its event loop, as the group
steps are driven (see group.py)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

from kcore.cluster.client import ClusterClient
from kcore.cluster.offsets import list_offsets
from kcore.codec import decode_columns, decode_records
from kcore.config import ClientConfig
from kcore.consumer.fetcher import FetchedData, Fetcher, PartitionState
from kcore.consumer.group import GroupCoordinator, Listener
from kcore.errors import KcoreError, NoOffsetForPartitionError
from kcore.types import ListOffsetsResult, TopicPartition

log = logging.getLogger("kcore.consumer")

__all__ = ["AwaitData", "ConsumerCore", "ConsumerRecord", "PollPlan", "RunGroupStep", "tps"]

T = TypeVar("T")


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


def tps(partitions: Iterable[TopicPartition | tuple[str, int]]) -> list[TopicPartition]:
    return [TopicPartition(*tp) for tp in partitions]


class RunGroupStep(NamedTuple):
    """A poll asks its driver to run the group's step (``GroupCoordinator.poll_step``) with up
    to ``timeout`` seconds for a rebalance."""

    timeout: float


class AwaitData(NamedTuple):
    """A poll asks its driver to wait up to ``timeout`` seconds for fetched data (or an error,
    or a wakeup)."""

    timeout: float


# What a poll yields to its driver, and what it returns.
PollPlan = Generator[RunGroupStep | AwaitData, None, T]


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
        wanted = tps(partitions)
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
            for tp in tps(partitions) or list(self.fetcher.states):
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
            paused = set(tps(partitions))
            for tp in paused:
                self._state(tp).paused = True
            # What waits for a paused partition may wait long: keep its own bytes, not a view
            # that pins the whole response it came in (and the other partitions' data in it).
            for data in self.fetcher.completed:
                if data.tp in paused and isinstance(data.records, memoryview):
                    data.records = bytes(data.records)

    def resume(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        with self.fetcher.lock:
            for tp in tps(partitions):
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

    def poll_plan(
        self, timeout: float, take: Callable[[], T], got_some: Callable[[T], bool]
    ) -> PollPlan[T]:
        """One poll: the group's step, then what ``take`` takes; while that is nothing and
        time is left, wait for data and try again. With a group the wait is cut short (0.1 s)
        so that the group's step runs often (a rebalance, auto-commit)."""
        self.check_can_poll()
        deadline = time.monotonic() + timeout
        while True:
            yield RunGroupStep(deadline - time.monotonic())
            result = take()
            left = deadline - time.monotonic()
            if got_some(result) or left <= 0:
                return result
            yield AwaitData(min(left, 0.1) if self.group else left)

    def poll_records(
        self, timeout: float, max_records: int | None
    ) -> PollPlan[list[ConsumerRecord]]:
        limit = max_records or self.max_poll_records
        return self.poll_plan(timeout, lambda: self.take_records(limit), bool)

    def poll_arrow(self, timeout: float, max_records: int | None) -> PollPlan[Any]:
        limit = max_records or 1 << 30
        return self.poll_plan(timeout, lambda: self.take_arrow(limit), _has_rows)

    def wait_for_data(self, timeout: float) -> None:
        """Block the caller's thread until data or an error is queued, ``interrupt_wait`` is
        called, or ``timeout`` passes."""
        self.fetcher.wait_for_data(timeout)

    async def wait_for_data_async(self, timeout: float) -> None:
        """:meth:`wait_for_data` for a caller on the event loop."""
        await self.fetcher.wait_for_data_async(timeout)

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


def _has_rows(rb: Any) -> bool:
    return bool(rb.num_rows)
