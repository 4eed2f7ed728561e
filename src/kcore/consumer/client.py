"""``kcore.Consumer`` (blocking) and ``kcore.AsyncConsumer``, with manual assignment: the caller
says which partitions to read (``assign``) and from where (``seek`` or ``auto.offset.reset``);
records come back one by one (``poll``) or as Arrow record batches (``poll_arrow``).

Both are thin facades over :class:`~kcore.consumer.core.ConsumerCore`: what they add is how
they wait (the blocking one on its caller's thread, the asyncio one on its loop), each driving
the core's poll plan."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
import time
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from kcore.consumer.core import AwaitData, ConsumerCore, ConsumerRecord, PollPlan, tps
from kcore.consumer.group import Listener, drive_async, drive_sync
from kcore.errors import KcoreError, WakeupError
from kcore.network.loop_thread import start_on_loop_thread
from kcore.network.process_local import ProcessLocal
from kcore.types import ConsumerGroupMetadata, ListOffsetsResult, TopicPartition

T = TypeVar("T")

__all__ = ["AsyncConsumer", "Consumer", "ConsumerRecord"]


Topics = Iterable[str] | str | re.Pattern[str]


def _subscription(topics: Topics) -> list[str] | str | re.Pattern[str]:
    """``subscribe``'s argument, an iterable made a list (empty: Java's unsubscribe)."""
    return topics if isinstance(topics, (str, re.Pattern)) else list(topics)


_LEAVE_TIMEOUT_S = 8  # close(): a dead coordinator must not hold it up longer


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

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Wait until the cluster has answered, for a caller who wants to fail fast at
        start-up (the constructor returns at once and connects in the background, as Java's).
        Raises ``BootstrapError`` naming each bootstrap address and why it failed, at
        ``timeout`` (default ``default.api.timeout.ms``), or at once when waiting cannot help
        (TLS trust, credentials)."""
        self._loop.run(self._core.wait_until_ready(timeout))

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
        return self._loop.run(group.offsets.fetch(tps(partitions), t))

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
        waiting = self._core.wait_for_position(partition, timeout)
        while True:
            try:
                pause = next(waiting)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            time.sleep(pause)

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
        # The wait for the cluster raises BootstrapError just before the whole call's bound.
        return self._loop.run(self._core.partitions_for(topic, max(timeout - 0.1, 0.0)), timeout)

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to ``timeout`` seconds for some."""
        return self._drive(self._core.poll_records(timeout, max_records))

    def poll_arrow(self, timeout: float = 1.0, max_records: int | None = None) -> Any:
        """A ``pyarrow.RecordBatch`` (key, value, topic, partition, offset, timestamp,
        timestampType, headers), decoded column by column by the codec."""
        return self._drive(self._core.poll_arrow(timeout, max_records))

    def _drive(self, plan: PollPlan[T]) -> T:
        """Run a poll plan on this thread: a ``wakeup()`` is raised before each group step."""
        while True:
            try:
                effect = next(plan)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(effect, AwaitData):
                self._core.wait_for_data(effect.timeout)
            else:
                self._raise_if_woken()
                self._group_step(effect.timeout)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        while True:
            yield from self.poll(1.0)

    def metrics(self) -> dict[str, float]:
        """The consumer's metrics by their Java names (``records-consumed-rate``,
        ``records-lag-max``, ``fetch-latency-avg``, ``commit-latency-avg``, ...): see
        :mod:`kcore.metrics`), and each assigned partition's lag as
        ``records-lag{topic=<topic>,partition=<n>}``."""
        return self._core.metrics()

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
        """Start connecting in the background and return at once (as Java's constructor)."""
        await self._core.start()
        return self

    async def wait_until_ready(self, timeout: float | None = None) -> None:
        """As :meth:`Consumer.wait_until_ready`."""
        self._check_started()
        await self._core.wait_until_ready(timeout)

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
        return await group.offsets.fetch(tps(partitions), t)

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
        waiting = self._core.wait_for_position(partition, timeout)
        while True:
            try:
                pause = next(waiting)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            await asyncio.sleep(pause)

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
        return await self._drive(self._core.poll_records(timeout, max_records))

    async def poll_arrow(self, timeout: float = 1.0, max_records: int | None = None) -> Any:
        self._check_started()
        return await self._drive(self._core.poll_arrow(timeout, max_records))

    async def _drive(self, plan: PollPlan[T]) -> T:
        """Run a poll plan on the event loop."""
        while True:
            try:
                effect = next(plan)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(effect, AwaitData):
                await self._core.wait_for_data_async(effect.timeout)
            else:
                await self._group_step(effect.timeout)

    def metrics(self) -> dict[str, float]:
        """As :meth:`Consumer.metrics`."""
        return self._core.metrics()

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
