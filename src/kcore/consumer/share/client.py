"""``kcore.ShareConsumer`` (blocking) and ``kcore.AsyncShareConsumer``: a member of a share
group (KIP-932, "queues for Kafka").

Members of a share group read the same partitions together; the broker hands each record to
one member at a time (it *acquires* it for that member, under a lock that times out) and
counts its deliveries. The member acknowledges each record: ACCEPT (done), RELEASE (deliver
again), REJECT (never again), RENEW (keep the lock). With ``share.acknowledgement.mode=implicit``
(the default) what a poll returned is accepted at the next poll or commit; ``explicit`` needs
:meth:`ShareConsumer.acknowledge` for each record before the next poll.

Both are thin facades over :class:`~kcore.consumer.share.core.ShareConsumerCore`: the blocking
one runs the heartbeat and the fetches on an event loop of its own (a thread) while ``poll``
runs on the caller's thread; the asyncio one runs them on the caller's loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from kcore.cluster.client import ClusterClient
from kcore.consumer.share.acknowledgements import AcknowledgeType, ShareRecord
from kcore.consumer.share.core import (
    CLOSE_TIMEOUT_S,
    AcknowledgementCommitCallback,
    Fetch,
    SendPending,
    ShareConsumerCore,
    SharePollPlan,
    StartHeartbeat,
    topic_names,
)
from kcore.errors import KcoreError, KcoreTimeoutError, WakeupError
from kcore.network.loop_thread import start_on_loop_thread
from kcore.types import TopicPartition

__all__ = ["AcknowledgementCommitCallback", "AsyncShareConsumer", "ShareConsumer"]

T = TypeVar("T")


class ShareConsumer:
    """``kcore.ShareConsumer({"bootstrap.servers": ..., "group.id": ...})``: subscribe, poll,
    acknowledge. Java's config names and defaults (its ShareConsumer's keys)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._core = ShareConsumerCore(config)
        # The compiled path is the method itself: no Python frame per record acknowledged.
        self.acknowledge = self._core.record_acknowledger.acknowledge  # type: ignore[method-assign]
        self.config = self._core.config
        self._woken = threading.Event()
        self._loop = start_on_loop_thread("kcore-share-consumer", self._core.start)

    @property
    def cluster(self) -> ClusterClient:
        return self._core.cluster

    @property
    def member_id(self) -> str:
        return self._core.membership.member_id

    # -- subscription -------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | str) -> None:
        """Join the share group and read ``topics`` (names). ``subscribe([])`` unsubscribes."""
        self._core.check_open()
        names = topic_names(topics)
        if not names:
            self.unsubscribe()
            return
        self._core.subscribe(names)
        self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        async def start() -> None:
            self._core.start_heartbeat()

        self._loop.run(start())

    def subscription(self) -> set[str]:
        return self._core.subscription()

    def assignment(self) -> set[TopicPartition]:
        """The partitions the group assigned this member (others may read them too)."""
        return self._core.assignment()

    def unsubscribe(self) -> None:
        """Leave the group; records acquired and not acknowledged go back to the group."""
        self._core.check_open()
        if self._core.membership.topics is None:
            return
        self._core.run_callbacks(self._loop.run(self._core.leave(), CLOSE_TIMEOUT_S))

    # -- polling ------------------------------------------------------------------------------

    def poll(self, timeout: float = 1.0) -> list[ShareRecord]:
        """Records acquired for this member, waiting up to ``timeout`` seconds for some. In
        implicit mode the previous poll's records are accepted first; in explicit mode each of
        them must have been acknowledged. At most ``max.poll.records`` records."""
        return self._drive(self._core.poll_plan(timeout, None))

    def poll_arrow(self, timeout: float = 1.0, max_records: int | None = None) -> Any:
        """As :meth:`poll`, the records as one ``pyarrow.RecordBatch``: the columns of
        ``Consumer.poll_arrow`` (key, value, topic, partition, offset, timestamp,
        timestampType, headers) and ``delivery_count``; at most ``max_records`` rows
        (default ``max.poll.records``). Acknowledge its rows with :meth:`acknowledge_batch`
        or :meth:`acknowledge_offset`."""
        return self._drive(self._core.poll_arrow_plan(timeout, max_records))

    def _drive(self, plan: SharePollPlan[T]) -> T:
        """Run a poll plan on this thread, its loop steps on the client's loop thread; a
        ``wakeup()`` cuts a fetch round short."""
        self._core.check_open()
        self._raise_if_woken()
        while True:
            try:
                effect = next(plan)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(effect, Fetch):
                self._loop.run(self._core.fetcher.fetch(effect.timeout), interrupt=self._woken)
            elif isinstance(effect, SendPending):
                self._loop.submit(self._core.send_pending())
            else:
                assert isinstance(effect, StartHeartbeat)
                self._start_heartbeat()

    def __iter__(self) -> Iterator[ShareRecord]:
        while True:
            yield from self.poll(1.0)

    # -- acknowledging ------------------------------------------------------------------------

    def acknowledge(
        self, record: ShareRecord, type: AcknowledgeType | int = AcknowledgeType.ACCEPT
    ) -> None:
        """Explicit mode: end ``record``'s delivery as ``type`` (ACCEPT by default). Sent with
        the next poll's fetch to its leader, or by ``commit_sync``/``commit_async``."""
        self._core.acknowledge(record, type)

    def acknowledge_offset(
        self,
        topic: str,
        partition: int,
        offset: int,
        type: AcknowledgeType | int = AcknowledgeType.ACCEPT,
    ) -> None:
        """As :meth:`acknowledge`, the record named by topic, partition and offset (a row of a
        :meth:`poll_arrow` batch)."""
        self._core.acknowledge_offset(topic, partition, offset, type)

    def metrics(self) -> dict[str, float]:
        """The share consumer's metrics by their Java names (``records-consumed-rate``,
        ``fetch-latency-avg``, ``records-per-request-avg``, ``acknowledgements-send-total``,
        ``acknowledgements-error-total``, ``time-between-poll-avg``, ...) and the connection
        metrics every client has: see :mod:`kcore.metrics`."""
        return self._core.metrics()

    def acknowledge_batch(
        self, batch: Any, type: AcknowledgeType | int = AcknowledgeType.ACCEPT
    ) -> None:
        """As :meth:`acknowledge`, every row of ``batch`` (a :meth:`poll_arrow` record batch,
        or rows of one): all of them, or none when a row's record is not this consumer's to
        acknowledge."""
        self._core.acknowledge_batch(batch, type)

    def commit_sync(self, timeout: float | None = None) -> dict[TopicPartition, Exception | None]:
        """Send the acknowledgements made so far (implicit mode: of the last poll's records)
        and wait for the brokers: how each partition's ended (None: done)."""
        core = self._core
        started = core.prepare_commit()
        t = core.api_timeout_s if timeout is None else timeout
        return core.commit_results(self._loop.run(core.fetcher.commit(), t), started)

    def commit_async(self) -> None:
        """As :meth:`commit_sync` without waiting: the outcome goes to the acknowledgement
        commit callback, at a later poll or commit."""
        self._core.prepare_commit()
        self._loop.submit(self._core.send_pending())

    def set_acknowledgement_commit_callback(
        self, callback: AcknowledgementCommitCallback | None
    ) -> None:
        """``callback(offsets_by_partition, error)`` once per partition's acknowledgements
        sent together, on the thread of a later poll, commit or close."""
        self._core.callback = callback

    # -- wakeup, close --------------------------------------------------------------------------

    def wakeup(self) -> None:
        """From another thread: the blocking ``poll`` under way, or the next one, raises
        ``WakeupError``."""
        self._woken.set()

    def _raise_if_woken(self) -> None:
        if self._woken.is_set():
            self._woken.clear()
            raise WakeupError("wakeup() was called")

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Send what is owed (implicit mode: the last poll's records accepted; explicit: the
        unacknowledged ones released; fetched but not handed out: released), close the share
        sessions, leave the group and close the connections. The commit callback runs here
        for the last acknowledgements."""
        core = self._core
        if core.closed:
            return
        core.mark_closed()
        if not self._loop.is_running:
            return
        try:
            if core.started:
                core.settle_for_leaving()
                try:
                    results = self._loop.run(core.finish(timeout), timeout + 5)
                    core.run_callbacks()
                    core.run_callbacks(results)
                except KcoreError:
                    pass  # closing goes on: the connections must be released
            self._loop.run(core.close_cluster(), 15)
        finally:
            core.acks.forget()
            self._loop.close()

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncShareConsumer:
    """The asyncio flavour of :class:`ShareConsumer` (``await start()`` or ``async with``):
    the heartbeat and the fetches run on the caller's event loop; the commit callback runs
    on it too (within a later ``poll``, commit or ``close``)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._core = ShareConsumerCore(config)
        # The compiled path is the method itself: no Python frame per record acknowledged.
        self.acknowledge = self._core.record_acknowledger.acknowledge  # type: ignore[method-assign]
        self.config = self._core.config
        self._background: set[asyncio.Task[None]] = set()  # commit_async's sends
        self._closing: asyncio.Future[None] | None = None

    async def start(self) -> AsyncShareConsumer:
        """Start connecting in the background and return at once (as the blocking one's
        constructor)."""
        if not self._core.started:
            await self._core.start()
        return self

    async def __aenter__(self) -> AsyncShareConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_started(self) -> None:
        self._core.check_open()
        if not self._core.started:
            raise KcoreError("the AsyncShareConsumer is not started: await start() (or async with)")

    @property
    def cluster(self) -> ClusterClient:
        return self._core.cluster

    @property
    def member_id(self) -> str:
        return self._core.membership.member_id

    def subscribe(self, topics: Iterable[str] | str) -> None:
        """As :meth:`ShareConsumer.subscribe`, on the running loop; ``subscribe([])`` raises
        (leaving the group is I/O: ``await unsubscribe()``)."""
        self._check_started()
        names = topic_names(topics)
        if not names:
            raise KcoreError("subscribe([]) on an AsyncShareConsumer: await unsubscribe()")
        self._core.subscribe(names)
        self._core.start_heartbeat()

    def subscription(self) -> set[str]:
        return self._core.subscription()

    def assignment(self) -> set[TopicPartition]:
        return self._core.assignment()

    async def unsubscribe(self) -> None:
        """As :meth:`ShareConsumer.unsubscribe`."""
        self._check_started()
        if self._core.membership.topics is None:
            return
        self._core.run_callbacks(await asyncio.wait_for(self._core.leave(), CLOSE_TIMEOUT_S))

    async def poll(self, timeout: float = 1.0) -> list[ShareRecord]:
        """As :meth:`ShareConsumer.poll`."""
        return await self._drive(self._core.poll_plan(timeout, None))

    async def poll_arrow(self, timeout: float = 1.0, max_records: int | None = None) -> Any:
        """As :meth:`ShareConsumer.poll_arrow`."""
        return await self._drive(self._core.poll_arrow_plan(timeout, max_records))

    async def _drive(self, plan: SharePollPlan[T]) -> T:
        """Run a poll plan on this loop."""
        self._check_started()
        while True:
            try:
                effect = next(plan)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(effect, Fetch):
                await self._core.fetcher.fetch(effect.timeout)
            elif isinstance(effect, SendPending):
                self._spawn(self._core.send_pending())
            else:
                assert isinstance(effect, StartHeartbeat)
                self._core.start_heartbeat()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def __aiter__(self) -> AsyncShareConsumer:
        return self

    async def __anext__(self) -> list[ShareRecord]:
        """The next non-empty poll."""
        while True:
            records = await self.poll(1.0)
            if records:
                return records

    def acknowledge(
        self, record: ShareRecord, type: AcknowledgeType | int = AcknowledgeType.ACCEPT
    ) -> None:
        """As :meth:`ShareConsumer.acknowledge`."""
        self._core.acknowledge(record, type)

    def acknowledge_offset(
        self,
        topic: str,
        partition: int,
        offset: int,
        type: AcknowledgeType | int = AcknowledgeType.ACCEPT,
    ) -> None:
        """As :meth:`ShareConsumer.acknowledge_offset`."""
        self._core.acknowledge_offset(topic, partition, offset, type)

    def metrics(self) -> dict[str, float]:
        """As :meth:`ShareConsumer.metrics`."""
        return self._core.metrics()

    def acknowledge_batch(
        self, batch: Any, type: AcknowledgeType | int = AcknowledgeType.ACCEPT
    ) -> None:
        """As :meth:`ShareConsumer.acknowledge_batch`."""
        self._core.acknowledge_batch(batch, type)

    async def commit_sync(
        self, timeout: float | None = None
    ) -> dict[TopicPartition, Exception | None]:
        """As :meth:`ShareConsumer.commit_sync`."""
        self._check_started()
        core = self._core
        started = core.prepare_commit()
        t = core.api_timeout_s if timeout is None else timeout
        try:
            results = await asyncio.wait_for(core.fetcher.commit(), t)
        except asyncio.TimeoutError:
            raise KcoreTimeoutError(f"commit_sync did not finish within {t:g}s") from None
        return core.commit_results(results, started)

    def commit_async(self) -> None:
        """As :meth:`ShareConsumer.commit_async` (call it on the consumer's loop)."""
        self._check_started()
        self._core.prepare_commit()
        self._spawn(self._core.send_pending())

    def set_acknowledgement_commit_callback(
        self, callback: AcknowledgementCommitCallback | None
    ) -> None:
        """As :meth:`ShareConsumer.set_acknowledgement_commit_callback`; it runs on the loop."""
        self._core.callback = callback

    async def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """As :meth:`ShareConsumer.close`. Safe to cancel: the closing goes on in a task of
        its own, which a later close() waits for."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close(timeout))
        await asyncio.shield(self._closing)

    async def _close(self, timeout: float) -> None:
        core = self._core
        core.mark_closed()
        try:
            if core.started:
                for task in list(self._background):  # commit_async's sends end first
                    try:
                        await asyncio.wait_for(asyncio.shield(task), timeout)
                    except (asyncio.TimeoutError, KcoreError):
                        pass
                core.settle_for_leaving()
                try:
                    results = await asyncio.wait_for(core.finish(timeout), timeout + 5)
                    core.run_callbacks()
                    core.run_callbacks(results)
                except (asyncio.TimeoutError, KcoreError):
                    pass  # closing goes on: the connections must be released
            await core.close_cluster()
        finally:
            core.acks.forget()
