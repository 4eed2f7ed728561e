"""``kcore.Producer`` (blocking, thread-safe) and ``kcore.AsyncProducer`` (asyncio)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, cast

from kcore.errors import KcoreError
from kcore.network.loop_thread import start_on_loop_thread
from kcore.network.process_local import ProcessLocal
from kcore.producer.accumulator import MemoryShortage
from kcore.producer.core import OnDelivery, ProducerCore
from kcore.producer.results import DeliveryFuture, SendBatchResult
from kcore.types import ConsumerGroupMetadata, TopicPartition

__all__ = ["AsyncProducer", "Producer"]

log = logging.getLogger("kcore.producer")


class Producer(ProcessLocal):
    """``kcore.Producer({"bootstrap.servers": ...})``: Java producer semantics (``acks=all``,
    idempotence on, ``linger.ms=5``, ``batch.size=16384`` by default). ``send`` may be called
    from any thread; records are batched per partition in compiled builders and sent by a
    network thread. Pickles as its config; a forked child's copy rebuilds itself on first use."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._process_local(config)
        self._core = ProducerCore(config)
        self._core.send_path.slow = partial(self._core.slow_send, self._counts)
        # The compiled path is the method itself: no Python frame per record (unless a span
        # is made per record: otel.traces.enable).
        self.send = self._core.send  # type: ignore[method-assign]
        self._loop = start_on_loop_thread("kcore-producer", self._core.start)

    @property
    def cluster(self) -> Any:
        return self._core.cluster

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Wait until the cluster has answered, for a caller who wants to fail fast at
        start-up (the constructor returns at once and connects in the background, as Java's;
        ``send`` waits up to ``max.block.ms``); an idempotent producer also waits for its
        producer id. Raises ``BootstrapError`` naming each bootstrap address and why it failed,
        at ``timeout`` (default ``max.block.ms``), or at once when waiting cannot help (TLS
        trust, credentials); what refused the producer id (``ClusterAuthorizationFailedError``),
        or ``KcoreTimeoutError`` naming the last failure to get it."""
        self._loop.run(self._core.wait_until_ready(timeout))

    def _counts(self, topic: str, partition: int | None = None) -> tuple[int, list[int]]:
        counts = self._core.cached_partitions(topic, partition)
        if counts is None:
            counts = self._loop.run(self._core.topic_partitions(topic, partition))
        return counts

    def send(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, Any]] | None = None,
        on_delivery: OnDelivery | None = None,
    ) -> DeliveryFuture:
        """Queue one record; returns a future whose ``result(timeout)`` is its
        :class:`~kcore.producer.RecordMetadata`. Blocks (up to ``max.block.ms``) only while
        the topic's metadata is first fetched or ``buffer.memory`` is full. (Replaced per
        instance by the compiled send path, which has this signature.)"""
        return self._core.send_path.send(
            topic, value, key, partition, timestamp_ms, headers, on_delivery
        )

    def send_batch(
        self,
        topic: str,
        values: Any,
        keys: Any = None,
        *,
        partition: int | None = None,
        timestamp_ms: Any = None,
        headers: Any = None,
    ) -> SendBatchResult:
        """Queue many records in one call: ``values`` (and ``keys``) are lists, numpy
        fixed-width bytes arrays or pyarrow binary arrays; ``timestamp_ms`` one int or a
        column (ints in milliseconds, or a pyarrow timestamp or numpy datetime64 column, nulls
        taken as now); ``headers`` a pyarrow ``list<struct<key, value>>`` array (Spark's headers
        column) or one entry per record (None or ``(key, value)`` pairs). Keyed records go
        to their murmur2 partitions, the rest sticky."""
        return self._core.append_batch(
            topic, values, keys, partition, timestamp_ms, self._counts(topic, partition), headers
        )

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued and wait for it (``KcoreTimeoutError`` after ``timeout``)."""
        self._loop.run(self._core.flush(timeout))

    # -- transactions (transactional.id set; see docs/transactions.md) ----------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """Once, before the first transaction: get the transactional id's producer id and epoch
        from its coordinator, which fences any older producer with the same id and ends its
        open transaction. ``timeout`` defaults to ``max.block.ms``."""
        self._loop.run(self._core.init_transactions(timeout))

    def begin_transaction(self) -> None:
        """Open a transaction: records sent from now on belong to it (no request is made)."""
        self._core.begin_transaction()

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        group_metadata: ConsumerGroupMetadata | str,
        timeout: float | None = None,
    ) -> None:
        """Commit a consumer group's offsets (the next offset to read, per partition) as part of
        the transaction: they count only if it commits. ``group_metadata`` is the consumer's
        :class:`~kcore.ConsumerGroupMetadata` (its generation fences zombies, KIP-447) or a
        group id."""
        self._loop.run(self._core.send_offsets_to_transaction(offsets, group_metadata, timeout))

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Deliver every record of the transaction (flush), then commit it. If a record failed,
        this raises and the transaction must be aborted. After a timeout, calling it again
        goes on where it stopped."""
        self._loop.run(self._core.commit_transaction(timeout))

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: records not sent yet fail (``TransactionAbortedError``),
        those in flight are waited for, then the coordinator aborts what was written."""
        self._loop.run(self._core.abort_transaction(timeout))

    def metrics(self) -> dict[str, float]:
        """The producer's metrics by their Java names (``record-send-rate``,
        ``request-latency-avg``, ``buffer-available-bytes``, ...): see :mod:`kcore.metrics`."""
        return self._core.cluster.metrics.snapshot()

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued (up to ``timeout``), then fail what is left; nothing is
        dropped silently. Called from a delivery callback (the network thread), it cannot
        wait: as Java, it closes with a timeout of 0 and returns at once."""
        if self._loop.is_running and self._loop.on_own_thread:
            if self._core.closed:
                return  # a close is under way (its flush called this callback): it finishes
            log.warning("close() from a delivery callback: closing without waiting (timeout 0)")
            self._loop.close_from_own_thread(self._core.close(0))
            return
        if self._loop.is_running:
            try:
                self._loop.run(self._core.close(timeout))
            finally:
                self._loop.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncProducer:
    """The asyncio flavour: ``await AsyncProducer(config).start()`` or ``async with``;
    ``await send(...)`` returns a :class:`DeliveryFuture` that is an asyncio future of the
    producer's loop (``await`` it, ``asyncio.gather`` many: a batch's records wake their loop
    once, not once each; see DeliveryFuture for cancelling and other loops)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._core = ProducerCore(config)
        self._core.send_path.slow = partial(self._core.slow_send, self._cached_counts)
        self._core.async_callbacks = True
        # Where a call waits for buffer.memory: one thread, so such calls keep their order.
        # The event loop must not wait (it runs the sender that frees the memory).
        self._waiter: concurrent.futures.ThreadPoolExecutor | None = None

    def _cached_counts(self, topic: str, partition: int | None = None) -> tuple[int, list[int]]:
        counts = self._core.cached_partitions(topic)
        if counts is None:  # send() fetched it just before; a refresh dropped it since
            raise KcoreError(f"topic {topic!r} left the metadata; send again")
        return counts

    async def start(self) -> AsyncProducer:
        """Start connecting in the background and return at once (as Java's constructor)."""
        await self._core.start()
        self._core.accumulator.no_wait_thread = threading.get_ident()
        self._core.futures_on_loop()
        return self

    async def wait_until_ready(self, timeout: float | None = None) -> None:
        """As :meth:`Producer.wait_until_ready`."""
        self._check_loop()
        await self._core.wait_until_ready(timeout)

    def _check_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the producer started on, which must be the caller's (its sender and
        connections live there)."""
        loop = self._core.loop
        if loop is None:
            raise KcoreError("the AsyncProducer is not started: await start() (or async with)")
        if asyncio.get_running_loop() is not loop:
            raise KcoreError(
                "the AsyncProducer is used from an event loop other than the one it started on"
            )
        return loop

    async def _off_loop(self, call: Callable[[], Any]) -> Any:
        """``call`` on the waiting thread, where it may block for buffer.memory (up to
        max.block.ms) while this loop's sender frees it."""
        if self._waiter is None:
            self._waiter = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="kcore-producer-wait"
            )
        return await asyncio.get_running_loop().run_in_executor(self._waiter, call)

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _counts(self, topic: str, partition: int | None = None) -> tuple[int, list[int]]:
        counts = self._core.cached_partitions(topic, partition)
        if counts is None:
            counts = await self._core.topic_partitions(topic, partition)
        return counts

    async def send(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, Any]] | None = None,
        on_delivery: OnDelivery | None = None,
    ) -> DeliveryFuture:
        core = self._core
        if core.loop is not asyncio._get_running_loop():
            self._check_loop()  # (raises: not started, or another loop)
        # The metadata, fetched on first use; after that no coroutine of its own a record.
        if core.cached_partitions(topic, partition) is None:
            await core.topic_partitions(topic, partition)
        send = core.send
        try:
            return send(topic, value, key, partition, timestamp_ms, headers, on_delivery)
        except MemoryShortage as shortage:  # nothing was queued: again, where it may wait
            return await self._off_loop(
                shortage.retry
                or partial(send, topic, value, key, partition, timestamp_ms, headers, on_delivery)
            )

    async def send_batch(
        self,
        topic: str,
        values: Any,
        keys: Any = None,
        *,
        partition: int | None = None,
        timestamp_ms: Any = None,
        headers: Any = None,
    ) -> SendBatchResult:
        self._check_loop()
        if self._core.closed:
            raise KcoreError("the producer is closed")
        counts = await self._counts(topic, partition)
        # Chunk by chunk on the waiting thread: a call larger than the free buffer.memory
        # waits there for the sender (on this loop) to free some, as the sync Producer's
        # caller waits for its network thread.
        return cast(
            SendBatchResult,
            await self._off_loop(
                partial(
                    self._core.append_batch,
                    topic,
                    values,
                    keys,
                    partition,
                    timestamp_ms,
                    counts,
                    headers,
                )
            ),
        )

    async def flush(self, timeout: float | None = None) -> None:
        self._check_loop()
        await self._core.flush(timeout)

    # -- transactions (as :class:`Producer`'s) ----------------------------------------------------

    async def init_transactions(self, timeout: float | None = None) -> None:
        await self._core.init_transactions(timeout)

    async def begin_transaction(self) -> None:
        self._core.begin_transaction()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        group_metadata: ConsumerGroupMetadata | str,
        timeout: float | None = None,
    ) -> None:
        await self._core.send_offsets_to_transaction(offsets, group_metadata, timeout)

    async def commit_transaction(self, timeout: float | None = None) -> None:
        await self._core.commit_transaction(timeout)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        await self._core.abort_transaction(timeout)

    def metrics(self) -> dict[str, float]:
        """As :meth:`Producer.metrics`."""
        return self._core.cluster.metrics.snapshot()

    async def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout``) and stop; safe to cancel (the closing goes on, and a later
        close() waits for it)."""
        if self._core.loop is None:  # never started: nothing runs
            await self._core.cluster.close()
            return
        self._check_loop()
        try:
            await self._core.close(timeout)
        finally:
            # The waiting thread goes once the closing is done (also after a cancelled close).
            closing, waiter = self._core._closing, self._waiter
            if closing is not None and waiter is not None:
                closing.add_done_callback(lambda _: waiter.shutdown(wait=False))
