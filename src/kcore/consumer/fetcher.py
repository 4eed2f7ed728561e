"""The fetcher: keeps one Fetch request in flight to every leader of an assigned partition, and
hands the record bytes that come back to ``poll`` (on the caller's thread) through a queue.

Runs on the client's event loop. Positions are owned by ``poll``: a fetch is made from the
position at the time, and data whose fetch offset no longer matches the position (a seek
happened meanwhile) is dropped. A partition with data waiting in the queue is not fetched
again until ``poll`` has taken it (prefetching one response per partition ahead of the caller).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kcore.admin.async_client import AsyncAdminClient
from kcore.admin.types import TopicPartition
from kcore.cluster.client import ClusterClient
from kcore.cluster.metadata import STALE_METADATA_CODES, apply_leader_hints
from kcore.errors import (
    BrokerConnectionError,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    error_for_code,
)
from kcore.protocol.messages import FetchRequest
from kcore.protocol.messages.fetch_request import FetchPartition, FetchTopic

__all__ = ["FetchedData", "Fetcher", "PartitionState"]

log = logging.getLogger("kcore.consumer")

OFFSET_OUT_OF_RANGE = 1
TOPIC_ID_VERSION = 13


@dataclass
class PartitionState:
    position: int | None = None  # next offset to hand out; None: reset per auto.offset.reset
    paused: bool = False
    buffered: bool = False  # data for it waits in the queue
    high_watermark: int = -1
    reset_to: str | None = None  # a pending seek_to_beginning/end ("earliest"/"latest")


@dataclass
class FetchedData:
    tp: TopicPartition
    fetch_offset: int
    records: Any  # bytes or memoryview of record batches
    high_watermark: int
    decoded: list[Any] | None = None  # poll's cache of the decoded records
    taken: int = 0
    error: BaseException | None = None


@dataclass
class Fetcher:
    cluster: ClusterClient
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partition_max_bytes: int
    isolation_level: int
    reset_policy: str
    states: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    lock: threading.Condition = field(default_factory=threading.Condition)
    completed: deque[FetchedData] = field(default_factory=deque)
    _wakeup: asyncio.Event | None = None
    _busy_nodes: set[int] = field(default_factory=set)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _admin: AsyncAdminClient | None = None
    _stopped: bool = False

    def wakeup(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def run(self) -> None:
        self._wakeup = asyncio.Event()
        self._admin = AsyncAdminClient(self.cluster.config, cluster=self.cluster)
        while not self._stopped:
            self._wakeup.clear()
            try:
                await self._reset_positions()
                self._send_fetches()
            except (KafkaError, BrokerConnectionError, KcoreTimeoutError) as exc:
                log.info("fetcher: %s", exc)
                await asyncio.sleep(self.cluster.retry_backoff.initial_ms / 1000)
            try:
                await asyncio.wait_for(self._wakeup.wait(), 0.5)
            except asyncio.TimeoutError:
                pass

    async def _reset_positions(self) -> None:
        """Partitions without a position get one: a pending seek_to_beginning/end, else
        ``auto.offset.reset``."""
        with self.lock:
            todo = {
                tp: st.reset_to or self.reset_policy
                for tp, st in self.states.items()
                if st.position is None
            }
        if not todo:
            return
        if any(policy == "none" for policy in todo.values()):
            missing = sorted(f"{tp.topic}-{tp.partition}" for tp, p in todo.items() if p == "none")
            self._deliver_error(
                KcoreError(
                    f"no position for {', '.join(missing)} and auto.offset.reset is none: "
                    "seek first"
                )
            )
            todo = {tp: p for tp, p in todo.items() if p != "none"}
        if not todo:
            return
        assert self._admin is not None
        specs: dict[TopicPartition | tuple[str, int], str | int] = {}
        for tp, where in todo.items():
            specs[tp] = where
        offsets = await self._admin.list_offsets(specs)
        with self.lock:
            for tp, result in offsets.items():
                st = self.states.get(tp)
                if st is not None and st.position is None:
                    st.position = result.offset
                    st.reset_to = None

    def _send_fetches(self) -> None:
        md = self.cluster.metadata
        by_node: dict[int, dict[TopicPartition, int]] = {}
        with self.lock:
            for tp, st in self.states.items():
                if st.paused or st.buffered or st.position is None:
                    continue
                leader = md.leader_for(tp.topic, tp.partition)
                if leader is None:
                    self.cluster.add_topics([tp.topic])
                    self.cluster.cache.request_update()
                    continue
                if leader.node_id in self._busy_nodes:
                    continue
                by_node.setdefault(leader.node_id, {})[tp] = st.position
        for node, parts in by_node.items():
            self._busy_nodes.add(node)
            task = asyncio.get_running_loop().create_task(self._fetch(node, parts))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fetch(self, node: int, parts: dict[TopicPartition, int]) -> None:
        try:
            await self._fetch_once(node, parts)
        except (BrokerConnectionError, KcoreTimeoutError) as exc:
            log.debug("fetch from node %s failed: %s", node, exc)
            await asyncio.sleep(self.cluster.retry_backoff.initial_ms / 1000)
        finally:
            self._busy_nodes.discard(node)
            self.wakeup()

    async def _fetch_once(self, node: int, parts: dict[TopicPartition, int]) -> None:
        version = await self.cluster.version_for(node, 1)
        md = self.cluster.metadata
        topics: dict[str, list[Any]] = {}
        for tp, offset in parts.items():
            info = md.partition(tp.topic, tp.partition)
            topics.setdefault(tp.topic, []).append(
                FetchPartition(
                    partition=tp.partition,
                    current_leader_epoch=info.leader_epoch if info is not None else -1,
                    fetch_offset=offset,
                    partition_max_bytes=self.partition_max_bytes,
                )
            )
        fetch_topics = []
        for topic, fparts in topics.items():
            if version >= TOPIC_ID_VERSION:
                tinfo = md.topics.get(topic)
                if tinfo is None or tinfo.topic_id is None:
                    self.cluster.cache.request_update()
                    continue
                fetch_topics.append(FetchTopic(topic_id=tinfo.topic_id, partitions=fparts))
            else:
                fetch_topics.append(FetchTopic(topic=topic, partitions=fparts))
        if not fetch_topics:
            return
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=self.max_wait_ms,
            min_bytes=self.min_bytes,
            max_bytes=self.max_bytes,
            isolation_level=self.isolation_level,
            session_id=0,
            session_epoch=-1,  # no fetch session (KIP-227): every fetch names its partitions
            topics=fetch_topics,
        )
        timeout = self.cluster.settings.request_timeout_s + self.max_wait_ms / 1000
        response = await self.cluster.send(node, request, version, timeout=timeout)
        if response.error_code:
            err = error_for_code(response.error_code)
            raise err if err is not None else KcoreError("fetch failed")
        apply_leader_hints(self.cluster.cache, response)
        names_by_id = {t.topic_id: n for n, t in md.topics.items() if t.topic_id}
        for topic in response.responses:
            name = topic.topic or names_by_id.get(topic.topic_id, "")
            for p in topic.partitions:
                tp = TopicPartition(name, p.partition_index)
                fetched_at = parts.get(tp)
                if fetched_at is None:
                    continue
                self._handle_partition(tp, fetched_at, p)

    def _handle_partition(self, tp: TopicPartition, offset: int, p: Any) -> None:
        code = p.error_code
        with self.lock:
            st = self.states.get(tp)
            if st is None or st.position != offset:
                return  # unassigned or sought meanwhile: the data is stale
            st.high_watermark = p.high_watermark
            if code == 0:
                records = p.records
                if records is not None and len(records) > 0:
                    st.buffered = True
                    self.completed.append(FetchedData(tp, offset, records, p.high_watermark))
                    self.lock.notify_all()
                return
            if code == OFFSET_OUT_OF_RANGE:
                log.info(
                    "%s: offset %s out of range; resetting (%s)", tp, offset, self.reset_policy
                )
                st.position = None
                return
        if code in STALE_METADATA_CODES:
            self.cluster.cache.request_update()
            return
        err = error_for_code(code)
        if err is not None and not err.retriable:
            self._deliver_error(type(err)(f"{tp.topic}-{tp.partition}: {err.message}"))

    def _deliver_error(self, error: BaseException) -> None:
        """A non-retriable error goes to the caller's next poll."""
        with self.lock:
            self.completed.append(FetchedData(TopicPartition("", -1), -1, b"", -1, error=error))
            self.lock.notify_all()

    async def stop(self) -> None:
        self._stopped = True
        self.wakeup()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def wait_for_data(self, timeout: float) -> None:
        """Block the caller until data or an error is queued, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while not self.completed:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped:
                    return
                self.lock.wait(left)
