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
from kcore.cluster.otel import ClientOTel
from kcore.cluster.telemetry_sender import TelemetrySender
from kcore.config import ClientConfig
from kcore.consumer.collector import ConsumerRecord, FetchCollector
from kcore.consumer.fetch_buffer import FetchBuffer
from kcore.consumer.fetcher import Fetcher, declare_fetch_metrics
from kcore.consumer.group import GroupCoordinator, Listener
from kcore.consumer.positions import PartitionState, Positions
from kcore.consumer.statistics import ConsumerStatistics
from kcore.consumer.tracing import observe_poll
from kcore.errors import KcoreError, NoOffsetForPartitionError
from kcore.metrics import metric_key
from kcore.network.retry import Deadline
from kcore.types import ListOffsetsResult, TopicPartition

log = logging.getLogger("kcore.consumer")

__all__ = ["AwaitData", "ConsumerCore", "ConsumerRecord", "PollPlan", "RunGroupStep", "tps"]

T = TypeVar("T")

POSITION_POLL_S = 0.01  # how often a caller waiting for a position looks again


def _declare_metrics(core: ConsumerCore) -> None:
    """The consumer's metrics, named as Java's consumer-fetch-manager-metrics and
    consumer-coordinator-metrics groups have them."""
    metrics = core.cluster.metrics
    declare_fetch_metrics(metrics)
    metrics.declare("records-lag", "max")
    metrics.declare("commit-latency", "avg", "max")
    metrics.gauge("commit-total", lambda: metrics.count("commit-latency"))
    metrics.gauge("commit-rate", lambda: metrics.rate_of("commit-latency"))
    metrics.gauge("assigned-partitions", lambda: len(core.positions))
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
        policy, duration_s = cfg.auto_offset_reset()
        self.positions = Positions()
        self.buffer = FetchBuffer()
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
            positions=self.positions,
            buffer=self.buffer,
        )
        self.collector = FetchCollector(
            self.fetcher, self.buffer, self.cluster.metrics, bool(cfg["check.crcs"]), self.wake
        )
        self._fetch_task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.group = GroupCoordinator(self.cluster, cfg, self) if cfg["group.id"] else None
        if self.group is not None:
            offsets, timeout = self.group.offsets, self.group.api_timeout_s
            self.fetcher.committed_lookup = lambda tps: offsets.fetch_with_epochs(tps, timeout)
        self.manual = False  # assign() was used (exclusive with subscribe, as in Java)
        self.closed = False
        self._closing: asyncio.Future[None] | None = None
        _declare_metrics(self)
        if self.cluster.statistics is not None:
            self.cluster.statistics.add_section(
                ConsumerStatistics(
                    self.positions,
                    self.cluster.cache,
                    self.cluster.metrics,
                    self.group,
                    read_committed=cfg["isolation.level"] == "read_committed",
                )
            )
        # KIP-714: the metrics a client-metrics subscription asks for, pushed on a timer; those
        # of metrics(), so the per-partition lag goes too (a point per partition).
        self.telemetry = TelemetrySender(self.cluster, "consumer", cfg, read_metrics=self.metrics)
        # OpenTelemetry (otel.metrics.enable / otel.traces.enable): None while both are off.
        self.otel = ClientOTel.of_client(
            "consumer",
            cfg,
            self.cluster,
            self.metrics,
            group_id=cfg["group.id"],
            tagged_names=("records-lag",),
        )
        if self.otel is not None and self.otel.metrics_on:
            self.collector.on_taken = self.otel.records_taken

    async def wait_until_ready(self, timeout: float | None) -> None:
        """Until the first bootstrap has succeeded, up to ``timeout`` (default
        default.api.timeout.ms); ``BootstrapError`` naming each address and why, when not."""
        await self.cluster.ready(timeout)

    async def start(self) -> None:
        """Start the bootstrap (in the background: this returns at once, as Java's constructor)
        and the fetcher, which fetches once the cluster answers; poll returns nothing until
        then. On failure the connections close."""
        self.loop = asyncio.get_running_loop()
        try:
            await self.cluster.start()
        except BaseException:
            await self.cluster.close()
            raise
        self._fetch_task = self.loop.create_task(self.fetcher.run())
        self.telemetry.start()
        if self.otel is not None:
            self.otel.start()
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
        await self.telemetry.close()
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
        # With a group.id, a new partition starts at the group's committed offset, if any.
        fresh = self.group is not None
        with self.positions.locked():
            self.positions.assign(wanted, lambda: PartitionState(from_committed=fresh))
            self.buffer.retain(set(wanted))
        self.cluster.add_topics({tp.topic for tp in wanted})
        self.wake()

    def assignment(self) -> set[TopicPartition]:
        return self.positions.partitions()

    # -- the group's view of the assignment (GroupCoordinator's Assignment protocol) ---------------

    def owned(self) -> set[TopicPartition]:
        return self.assignment()

    def positions_to_commit(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """The positions to commit, of the partitions that have one: each with the leader
        epoch of the record before it (-1: unknown), read together (KIP-320)."""
        return self.positions.for_commit(partitions)

    def add_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions the group gave this member: they start at the group's committed offset
        (looked up by the fetcher), else at ``auto.offset.reset``."""
        partitions = list(partitions)
        for tp in partitions:
            self.positions.add(tp, PartitionState(from_committed=True))
        self.cluster.add_topics({tp.topic for tp in partitions})
        self.wake()

    def interrupt_wait(self) -> None:
        self.buffer.wakeup()

    def remove_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        with self.positions.locked():
            for tp in partitions:
                if self.positions.remove(tp):
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

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        tp = TopicPartition(*tp)
        if offset < 0:
            raise KcoreError(f"seek to a negative offset ({offset})")
        with self.positions.locked():
            self.positions.require(tp).seek(offset)
            self._drop_buffered(tp)
        self.wake()

    def seek_to(self, partitions: Iterable[TopicPartition | tuple[str, int]], where: str) -> None:
        with self.positions.locked():
            for tp in tps(partitions) or list(self.positions):
                self.positions.require(tp).seek(None, where)
                self._drop_buffered(tp)
        self.wake()

    def _drop_buffered(self, tp: TopicPartition) -> None:
        self.fetcher.drop_queued(tp)
        st = self.positions.require(tp)
        st.errors, st.retry_at = 0, 0.0  # a seek is fetched at once, whatever failed before

    def position(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        """None while it is being looked up; raises ``NoOffsetForPartitionError`` once the
        lookup found nothing to start from and ``auto.offset.reset`` is ``none``."""
        tp = TopicPartition(*tp)
        with self.positions.locked():
            st = self.positions.require(tp)
            if (
                st.position is None
                and st.reset_to is None
                and not st.from_committed
                and self.fetcher.lacks_reset(tp)
            ):
                raise NoOffsetForPartitionError([tp])
            return st.position

    def wait_for_position(
        self, tp: TopicPartition | tuple[str, int], timeout: float
    ) -> Generator[float, None, int]:
        """:meth:`position`, waited for while it is looked up: yields how long to sleep before
        looking again (the facade sleeps its way), until ``timeout``."""
        deadline = Deadline(timeout)
        while (pos := self.position(tp)) is None:
            if deadline.expired():
                raise KcoreError(f"no position for {tp} within {timeout:g}s")
            yield POSITION_POLL_S
        return pos

    def pause(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        paused = set(tps(partitions))
        self.positions.set_paused(paused, True)
        self.buffer.own_bytes(paused)

    def resume(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        self.positions.set_paused(tps(partitions), False)
        self.wake()
        # A poll waiting now judged queued data by the pauses it saw when it began: it looks
        # again, so data of these partitions already queued is handed out at once.
        self.buffer.wakeup()

    def current_lag(self, tp: TopicPartition) -> int | None:
        return self.positions.lag(tp)

    def metrics(self) -> dict[str, float]:
        """The client's metrics, with each assigned partition's ``records-lag`` (Java's
        consumer-fetch-manager-metrics with topic and partition tags), named
        ``records-lag{topic=<topic>,partition=<n>}``, where its lag is known."""
        out = self.cluster.metrics.snapshot()
        for view in self.positions.offsets():
            lag = view.lag
            if lag is not None:
                tags = {"topic": view.tp.topic, "partition": str(view.tp.partition)}
                out[metric_key("records-lag", tags)] = lag
        return out

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

    async def partitions_for(self, topic: str, timeout: float | None = None) -> list[int]:
        await self.cluster.ready(timeout)  # BootstrapError at the bound, naming the addresses
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
        if len(self.positions):
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
        deadline = Deadline(timeout)
        otel = self.otel
        if otel is not None:
            started, started_ns = time.monotonic(), time.time_ns()
        while True:
            yield RunGroupStep(deadline.remaining())
            result = take()
            left = deadline.remaining()
            if got_some(result):
                if otel is not None:
                    observe_poll(otel, result, started, started_ns)
                return result
            if left <= 0:
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
        self.buffer.wait(timeout, self.positions.paused())

    async def wait_for_data_async(self, timeout: float) -> None:
        """:meth:`wait_for_data` for a caller on the event loop."""
        await self.buffer.wait_async(timeout, self.positions.paused())

    def take_records(self, max_records: int) -> list[ConsumerRecord]:
        return self.collector.take_records(max_records)

    def take_arrow(self, max_records: int) -> Any:
        return self.collector.take_arrow(max_records)

    @property
    def last_poll(self) -> float | None:
        return self.collector.last_poll


def _has_rows(rb: Any) -> bool:
    return bool(rb.num_rows)
