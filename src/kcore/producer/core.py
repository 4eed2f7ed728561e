"""What the blocking and the asyncio producer share: config, partition choice, the accumulator,
the sender task and the cluster client (all on one event loop)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

from kcore._codec import record_size_upper_bound
from kcore.cluster.client import ClusterClient
from kcore.cluster.metadata import ClusterMetadata
from kcore.cluster.otel import ClientOTel
from kcore.cluster.telemetry_sender import TelemetrySender
from kcore.codec import partition_for_key
from kcore.config import ClientConfig
from kcore.errors import (
    KcoreError,
    KcoreTimeoutError,
    MessageTooLargeError,
    TransactionStateError,
)
from kcore.metrics import ClientMetrics
from kcore.network.retry import Deadline
from kcore.producer._sendpath import SendPath
from kcore.producer.accumulator import (
    BATCH_HEADER,
    RECORD_OVERHEAD,
    MemoryShortage,
    ProducerBatch,
    RecordAccumulator,
)
from kcore.producer.columns import ColumnAppender
from kcore.producer.idempotence import IdempotenceState
from kcore.producer.results import (
    BatchResult,
    DeliveryFuture,
    RecordMetadata,
    SendBatchResult,
    all_done,
)
from kcore.producer.sender import Sender
from kcore.producer.statistics import ProducerStatistics
from kcore.producer.tracing import traced_send, traced_send_batch
from kcore.producer.transactions import TransactionManager
from kcore.producer.txn_state import TransactionStateMachine, TxnState
from kcore.types import ConsumerGroupMetadata, TopicPartition

__all__ = ["ProducerCore"]

log = logging.getLogger("kcore.producer")

OnDelivery = Callable[[BaseException | None, RecordMetadata | None], Any]
# partitioner.class: (topic, key, value, number of partitions) -> partition.
Partitioner = Callable[[str, Any, Any, int], int]


class ProducerCore:
    def __init__(self, config: Mapping[str, Any]) -> None:
        cfg = config if isinstance(config, ClientConfig) else ClientConfig(config, role="producer")
        self.config = cfg
        self.cluster = ClusterClient(cfg, auto_create=True)  # as Java's producer
        self.batch_size = int(cfg["batch.size"])
        self.max_block_s = int(cfg["max.block.ms"]) / 1000
        self.key_serializer = cfg.get("key.serializer")
        self.value_serializer = cfg.get("value.serializer")
        self.custom_partitioner: Partitioner | None = cfg.get("partitioner.class")
        # Keyed records: murmur2 as Java (in SendPath and partitions_for_keys); unkeyed: the
        # uniform sticky partitioner whose state SendPath keeps (sticky_partition).
        self.ignore_keys = bool(cfg["partitioner.ignore.keys"])
        self.accumulator = RecordAccumulator(
            batch_size=self.batch_size,
            linger_s=int(cfg["linger.ms"]) / 1000,
            buffer_memory=int(cfg["buffer.memory"]),
            compression=str(cfg["compression.type"]),
            compression_level=_compression_level(cfg),
            # Batches of one partition in flight at once (the sender keeps their order).
            max_in_flight=int(cfg["max.in.flight.requests.per.connection"]),
        )
        self.accumulator.wake_sender = self.wake_sender
        # metadata.max.idle.ms: a topic not written to for that long is no longer refreshed
        # (the sender says when one is written to), as Java's ProducerMetadata.
        self.cluster.topic_idle_s = int(cfg["metadata.max.idle.ms"]) / 1000
        self.cluster.topic_in_use = self.accumulator.has_topic
        _declare_metrics(self.cluster.metrics, self.accumulator)
        # KIP-714: the metrics a client-metrics subscription asks for, pushed on a timer.
        self.telemetry = TelemetrySender(self.cluster, "producer", cfg)
        self._closing: asyncio.Future[None] | None = None
        self._flushing: asyncio.Future[None] | None = None  # close()'s flush
        self._forced = False  # a later close()'s deadline passed: fail what is left
        # AsyncProducer: an on_delivery that returns an awaitable is run as a task of the
        # producer's loop (the sync Producer calls callbacks on its network thread).
        self.async_callbacks = False
        self._callback_tasks: set[asyncio.Task[Any]] = set()
        self.idempotent = bool(cfg["enable.idempotence"])
        # The producer id, epoch and sequences: numbered by the sender, given by InitProducerId
        # (the sender's, or the transaction coordinator's).
        self.identity = IdempotenceState()
        # transactional.id: records are sent only inside transactions; the state machine says
        # when (kcore.producer.txn_state), the coordinator requests drive it
        # (kcore.producer.transactions).
        self.txn: TransactionStateMachine | None = None
        self.transactions: TransactionManager | None = None
        transactional_id = cfg.get("transactional.id")
        if transactional_id:
            self.txn = TransactionStateMachine(
                str(transactional_id), on_state=self._txn_state_changed
            )
            self.transactions = TransactionManager(
                self.txn,
                self.identity,
                self.cluster,
                int(cfg["transaction.timeout.ms"]),
                renumber_waiting=self.accumulator.reset_sequences,
                wake_sender=self.wake_sender,
            )
        self.sender = Sender(
            self.cluster,
            self.accumulator,
            acks=int(cfg["acks"]),
            request_timeout_s=int(cfg["request.timeout.ms"]) / 1000,
            delivery_timeout_s=int(cfg["delivery.timeout.ms"]) / 1000,
            idempotent=self.idempotent,
            max_request_size=int(cfg["max.request.size"]),
            retries=int(cfg["retries"]),
            max_in_flight=int(cfg["max.in.flight.requests.per.connection"]),
            identity=self.identity,
            txn=self.txn,
            register_partitions=(
                self.transactions.ensure_adding if self.transactions is not None else None
            ),
        )
        if self.cluster.statistics is not None:
            self.cluster.statistics.add_section(
                ProducerStatistics(
                    self.accumulator,
                    self.sender,
                    self.cluster.cache,
                    buffer_memory=int(cfg["buffer.memory"]),
                    identity=self.identity if self.idempotent or self.txn else None,
                    txn=self.txn,
                )
            )
        self._fast_path = (
            self.key_serializer is None
            and self.value_serializer is None
            and self.custom_partitioner is None
            and not self.ignore_keys
        )
        # The compiled per-record path; it hands anything unusual to ``slow_send``. With
        # transactions it is on only inside a transaction (the slow path checks the state).
        # As Java's ensureValidRecordSize: a record larger than max.request.size or than
        # buffer.memory fails at once (it could never be sent, or never fit the buffer).
        self.max_request_size = int(cfg["max.request.size"])
        self.buffer_memory = int(cfg["buffer.memory"])
        self.max_record_size = min(self.max_request_size, self.buffer_memory)
        self.send_path = SendPath(
            None,
            TopicPartition,
            self.accumulator.queues,
            self.cluster.cache,
            self.batch_size,
            enabled=self._fast_path and self.txn is None,
            # Without headers a record's size is at most its key and value plus 11 bytes of
            # varints (two lengths of up to 5, a header count of 1) over the fixed overheads:
            # up to this the compiled path cannot meet a record Java refuses; above, Python
            # checks the exact size.
            max_payload=self.max_record_size - RECORD_OVERHEAD - BATCH_HEADER - 11,
            new_batch=self.new_batch,
        )
        # send_batch: whole columns, chunk by chunk (kcore.producer.columns).
        self.columns = ColumnAppender(
            batch_size=self.batch_size,
            ignore_keys=self.ignore_keys,
            append_chunk=self._append_chunk,
            sticky_partition=self.send_path.sticky_partition,
            wake_sender=self.wake_sender,
            let_sender_start=self._let_sender_start,
        )
        # OpenTelemetry (otel.metrics.enable / otel.traces.enable): None while both are off.
        self.otel = ClientOTel.of_client(
            "producer", cfg, self.cluster, self.cluster.metrics.snapshot
        )
        # What Producer.send is: the compiled path, or it inside a span (otel.traces.enable).
        self.send: Callable[..., DeliveryFuture] = self.send_path.send
        if self.otel is not None:
            if self.otel.metrics_on:
                self.sender.on_batch_done = self.otel.batch_done
            if self.otel.traces_on:
                self.send = traced_send(self.otel, self.send_path.send)
        self.loop: asyncio.AbstractEventLoop | None = None
        # A wake-up of the sender handed to the loop from another thread and not run yet: a
        # second one would add nothing (the sender drains everything when it runs) but a
        # write to the loop's self-pipe, per new batch. (As Java's Selector.wakeup: once
        # until the next select.)
        self._wake_pending = False
        self._counts_memo: tuple[Any, dict[str, tuple[int, list[int]]]] = (None, {})
        self._sender_task: asyncio.Task[None] | None = None
        self.closed = False

    # -- lifecycle (on the loop) ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the bootstrap and the sender and return at once, as Java's constructor: the
        idempotent producer's id is fetched in the background (its batches wait for it, and
        expire at delivery.timeout.ms); send waits for the cluster up to max.block.ms."""
        self.loop = asyncio.get_running_loop()
        await self.cluster.start()
        self.telemetry.start()
        if self.otel is not None:
            self.otel.start()
        if self.idempotent and self.txn is None:  # (transactions: at init_transactions)
            self.sender.fetch_producer_id()
        self._sender_task = self.loop.create_task(self.sender.run())

    def futures_on_loop(self) -> None:
        """(AsyncProducer, once started) The futures ``send`` makes belong to the producer's
        loop from now on: asyncio futures of it (see DeliveryFuture)."""
        self.send_path.loop = self.loop

    async def topic_partitions(
        self, topic: str, partition: int | None = None
    ) -> tuple[int, list[int]]:
        """(partition count, partitions with a leader), waiting up to max.block.ms for the
        topic's metadata the first time, as Java's send does: for the topic to be known, not
        for every partition to have a leader (records for one without wait in the
        accumulator; unkeyed ones go to those with). An explicit ``partition`` beyond the
        count waits for a refresh that shows it (partitions added since), as Java's
        waitOnMetadata."""
        deadline = time.monotonic() + self.max_block_s
        md = self.cluster.metadata
        info = md.topics.get(topic)
        try:
            if info is None or not info.partitions:
                try:
                    md = await self.cluster.wait_for_topics([topic], self.max_block_s, ())
                except KcoreTimeoutError:
                    raise KcoreTimeoutError(
                        f"topic {topic!r} not in the metadata after max.block.ms "
                        f"({self.max_block_s:g}s): does it exist?"
                    ) from None
                info = md.topics[topic]
            if partition is not None and partition >= len(info.partitions):
                info = await self._wait_for_partition(topic, partition, deadline)
        except KcoreError as exc:
            self._failed_in_transaction(exc)
            raise
        return len(info.partitions), [p for p, i in info.partitions.items() if i.leader >= 0]

    def _failed_in_transaction(self, error: BaseException) -> None:
        """As Java: a send that fails inside a transaction (no metadata, buffer.memory full
        for max.block.ms) fails the transaction: a commit must not succeed without the
        record; abort_transaction recovers."""
        if self.txn is not None:
            self.txn.abortable(error)

    async def _wait_for_partition(self, topic: str, partition: int, deadline: float) -> Any:
        def count(md: ClusterMetadata) -> int:
            info = md.topics.get(topic)
            return len(info.partitions) if info is not None else 0

        md = await self.cluster.refresh_until([topic], lambda md: partition < count(md), deadline)
        if md is None:
            raise KcoreTimeoutError(  # Java's words
                f"Partition {partition} of topic {topic} with partition count "
                f"{count(self.cluster.metadata)} is not present in metadata after "
                f"{self.max_block_s * 1000:g} ms."
            )
        return md.topics[topic]

    def cached_partitions(
        self, topic: str, partition: int | None = None
    ) -> tuple[int, list[int]] | None:
        """The same from the metadata snapshot (any thread), or None if the topic is unknown,
        or ``partition`` is past its partition count (either way: fetch the metadata).
        Memoized per snapshot: a refresh makes a new snapshot object."""
        md = self.cluster.metadata
        memo = self._counts_memo
        if memo[0] is not md:
            memo = self._counts_memo = (md, {})
        counts = memo[1].get(topic)
        if counts is None:
            info = md.topics.get(topic)
            if info is None or not info.partitions:
                return None
            counts = len(info.partitions), [p for p, i in info.partitions.items() if i.leader >= 0]
            memo[1][topic] = counts
        if partition is not None and partition >= counts[0]:
            return None
        return counts

    async def flush(self, timeout: float | None) -> None:
        pending = self.accumulator.pending_results()
        if not pending:
            return
        self.accumulator.begin_flush()
        self.sender.wakeup()
        left = [len(pending)]
        try:
            try:
                await asyncio.wait_for(all_done(pending, left), timeout)
            except asyncio.TimeoutError:
                raise KcoreTimeoutError(
                    f"flush: {left[0]} batch(es) still undelivered after {timeout:g}s"
                ) from None
        finally:
            self.accumulator.end_flush()

    async def close(self, timeout: float | None) -> None:
        """Flush (up to ``timeout``), then stop. Safe to cancel: the closing goes on in a task
        of its own, which a later close() waits for (a close cut short by a caller's
        wait_for would otherwise leave the sender, its sockets and the records' futures
        behind, with every later close() returning at once)."""
        closing = self._closing
        if closing is None:
            closing = self._closing = asyncio.ensure_future(self._close(timeout))
        elif timeout is not None and not closing.done():
            # A second close with a deadline of its own (close(0) to force one that waits):
            # at that deadline what is not delivered fails, as Java's close(timeout) does.
            try:
                await asyncio.wait_for(asyncio.shield(closing), timeout)
                return
            except asyncio.TimeoutError:
                self._forced = True
                if self._flushing is not None:
                    self._flushing.cancel()
        await asyncio.shield(closing)

    async def _close(self, timeout: float | None) -> None:
        if self.closed:
            return
        txn = self.txn
        if txn is not None and txn.state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR):
            # As Java: an open transaction is aborted on close (best effort).
            try:
                await self.abort_transaction(timeout if timeout is not None else self.max_block_s)
            except KcoreError as exc:
                log.info("close: aborting the open transaction failed: %s", exc)
        self.closed = True
        self.send_path.enabled = False  # every send now takes the checked (and refused) path
        deadline = Deadline(math.inf if timeout is None else timeout)
        try:
            if not self._forced:  # (a forcing close may have come during the abort above)
                self._flushing = asyncio.ensure_future(self.flush(timeout))
                try:
                    await self._flushing
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    cancelling = getattr(task, "cancelling", lambda: 0)()
                    if not self._forced or cancelling:  # this close itself is cancelled
                        raise
            aborted = False
            # Records already told they timed out (delivery.timeout.ms passed while in flight)
            # may have requests out still: those count, within the same deadline.
            while self.accumulator.has_pending() and not self._forced:
                if deadline.expired():
                    aborted = True
                    break
                await asyncio.sleep(0.02)
        except KcoreTimeoutError:
            aborted = True
        aborted = aborted or self._forced  # (a forcing close: also during the flush or abort)
        self.accumulator.close()
        await self.sender.stop(abort=aborted)
        if aborted:
            # As Java's close(timeout): at the deadline what is not acknowledged fails now,
            # rather than after its request's request.timeout.ms.
            self.sender.cancel_in_flight()
        if self._sender_task is not None:
            try:
                await asyncio.wait_for(self._sender_task, 5)
            except (asyncio.TimeoutError, KcoreError):
                self._sender_task.cancel()
        await self.sender.wait_in_flight()
        # Anything still not done is failed, never dropped silently.
        for result in self.accumulator.pending_results():
            result.fail(KcoreError("the producer closed before the record was delivered"))
        await self.telemetry.close(deadline.remaining())
        await self.cluster.close()

    # -- sending (any thread) ---------------------------------------------------------------------

    def serialize(self, key: Any, value: Any) -> tuple[Any, Any]:
        if self.key_serializer is not None and key is not None:
            key = self.key_serializer(key)
        if self.value_serializer is not None and value is not None:
            value = self.value_serializer(value)
        return key, value

    def choose_partition(
        self, topic: str, key: Any, value: Any, partition: int | None, counts: tuple[int, list[int]]
    ) -> int:
        count, available = counts
        if partition is not None:
            if not 0 <= partition < count:
                raise KcoreError(
                    f"{topic} has {count} partitions; there is no partition {partition}"
                )
            return partition
        if self.custom_partitioner is not None:
            chosen = int(self.custom_partitioner(topic, key, value, count))
            if not 0 <= chosen < count:
                raise KcoreError(f"the partitioner chose {chosen}; {topic} has {count} partitions")
            return chosen
        if key is not None and not self.ignore_keys:
            if isinstance(key, str):
                key = key.encode("utf-8")
            return partition_for_key(key, count)
        size = RECORD_OVERHEAD + (len(value) if value is not None else 0)
        return self.send_path.sticky_partition(topic, count, available, size)

    def slow_send(
        self,
        counts: Callable[[str, int | None], tuple[int, list[int]]],
        topic: str,
        value: Any,
        key: Any,
        partition: int | None,
        timestamp_ms: int | None,
        headers: Sequence[tuple[str, Any]] | None,
        on_delivery: OnDelivery | None,
    ) -> DeliveryFuture:
        """Everything the compiled path leaves to Python: serializers, a custom partitioner,
        headers, callbacks, a new batch, a topic not yet in the metadata."""
        if self.txn is not None:  # (before waiting for a topic's metadata)
            self.txn.check_can_send()
        key, value = self.serialize(key, value)
        _check_payload("key", key)
        _check_payload("value", value)
        size = record_size_upper_bound(key, value, headers)
        if size > self.max_record_size:  # before choosing a partition, as Java's doSend
            return self.failed_future(
                topic,
                -1 if partition is None else partition,
                timestamp_ms,
                self.too_large(size),
                on_delivery,
            )
        p = self.choose_partition(topic, key, value, partition, counts(topic, partition))
        try:
            return self.append(topic, value, key, p, timestamp_ms, headers, on_delivery)
        except MemoryShortage as shortage:
            # (AsyncProducer) what is left to do, once memory is free: serializers and the
            # partitioner are not run again.
            shortage.retry = partial(
                self.append, topic, value, key, p, timestamp_ms, headers, on_delivery
            )
            raise

    def too_large(self, size: int) -> MessageTooLargeError:
        """Java's ensureValidRecordSize: max.request.size first, then buffer.memory."""
        which, limit = (
            ("max.request.size", self.max_request_size)
            if size > self.max_request_size
            else ("buffer.memory", self.buffer_memory)
        )
        return MessageTooLargeError(
            f"the record is {size} bytes when serialized, larger than {which} ({limit})"
        )

    def failed_future(
        self,
        topic: str,
        partition: int,
        timestamp_ms: int | None,
        error: BaseException,
        on_delivery: OnDelivery | None,
    ) -> DeliveryFuture:
        """A record refused before it was queued: a future that has failed (as Java's
        FutureFailure), its callback called with the error; inside a transaction, the
        transaction fails with it (a commit must not succeed without the record)."""
        self._failed_in_transaction(error)
        result = BatchResult()
        result.fail(error)
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        future = DeliveryFuture(result, 0, topic, partition, ts, self.send_path.loop)
        if on_delivery is not None:
            future.when_delivered(self._delivery_callback(on_delivery))
        return future

    def append(
        self,
        topic: str,
        value: Any,
        key: Any,
        partition: int,
        timestamp_ms: int | None,
        headers: Sequence[tuple[str, Any]] | None,
        on_delivery: OnDelivery | None,
    ) -> DeliveryFuture:
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        batch, index, wake = self._enqueue(
            TopicPartition(topic, partition), key, value, ts, headers
        )
        future = DeliveryFuture(batch.result, index, topic, partition, ts, self.send_path.loop)
        if on_delivery is not None:
            future.when_delivered(self._delivery_callback(on_delivery))
        if wake:
            self.wake_sender()
        return future

    def new_batch(
        self, tp: TopicPartition, key: bytes | None, value: bytes | None, timestamp_ms: int
    ) -> tuple[ProducerBatch, int] | None:
        """The compiled send path's record that needs a new batch (its partition's is full,
        closed or gone), already checked and partitioned there: appended as ``append`` does,
        returning ``(batch, index)``. None when only ``slow_send`` can take it: the
        AsyncProducer's loop short of memory, which waits elsewhere (MemoryShortage, whose
        ``retry`` slow_send sets)."""
        try:
            batch, index, wake = self._enqueue(tp, key, value, timestamp_ms, None)
        except MemoryShortage:
            return None
        if wake:
            self.wake_sender()
        return batch, index

    def _enqueue(
        self,
        tp: TopicPartition,
        key: Any,
        value: Any,
        timestamp_ms: int,
        headers: Sequence[tuple[str, Any]] | None,
    ) -> tuple[ProducerBatch, int, bool]:
        """One record into the accumulator, for ``append`` and ``new_batch`` alike: refused
        once closed or when the transaction cannot take it; a ``max.block.ms`` timeout fails
        the transaction (a commit must not succeed without the record)."""
        if self.closed:
            raise KcoreError("the producer is closed")
        if self.txn is not None:
            self.txn.check_can_send()
        try:
            return self.accumulator.append(tp, key, value, timestamp_ms, headers, self.max_block_s)
        except KcoreTimeoutError as exc:
            self._failed_in_transaction(exc)
            raise

    def _delivery_callback(
        self, on_delivery: OnDelivery
    ) -> Callable[[BaseException | None, RecordMetadata | None], None]:
        def call(error: BaseException | None, metadata: RecordMetadata | None) -> None:
            outcome = on_delivery(error, metadata)
            if inspect.isawaitable(outcome):
                self._run_callback(outcome)

        return call

    def _run_callback(self, outcome: Awaitable[Any]) -> None:
        """An ``async def`` on_delivery: an AsyncProducer runs it as a task of its loop (kept
        until done, its error logged); the sync Producer cannot await it, and says so."""
        loop = self.loop
        if not self.async_callbacks or loop is None or loop.is_closed():
            if inspect.iscoroutine(outcome):
                outcome.close()  # (no "never awaited" warning on top of the error)
            log.error(
                "on_delivery returned an awaitable, which the (sync) Producer does not await: "
                "pass a plain function, or use AsyncProducer"
            )
            return

        async def run() -> None:
            await outcome

        if self._on_loop():
            task = loop.create_task(run())
            self._callback_tasks.add(task)
            task.add_done_callback(self._callback_done)
        else:  # completed on another thread (a send that waited for memory off the loop)
            asyncio.run_coroutine_threadsafe(run(), loop).add_done_callback(self._callback_done)

    def _callback_done(self, task: Any) -> None:
        if isinstance(task, asyncio.Task):
            self._callback_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("on_delivery callback failed", exc_info=task.exception())

    # -- transactions (on the loop, except begin_transaction) ----------------------------------

    def _txn_state_changed(self, state: TxnState) -> None:
        # The compiled path does not look at the state: it is on only inside a transaction.
        self.send_path.enabled = (
            self._fast_path and state is TxnState.IN_TRANSACTION and not self.closed
        )
        self.wake_sender()

    def _require_txn(self, call: str) -> tuple[TransactionStateMachine, TransactionManager]:
        if self.txn is None or self.transactions is None:
            raise TransactionStateError(f"{call}: the producer has no transactional.id")
        if self.closed:
            raise KcoreError("the producer is closed")
        return self.txn, self.transactions

    async def _bounded(self, call: str, coro: Any, timeout: float | None) -> Any:
        """``coro`` within ``timeout`` (default max.block.ms, as Java's transactional calls)."""
        limit = self.max_block_s if timeout is None else timeout
        try:
            return await asyncio.wait_for(coro, limit)
        except asyncio.TimeoutError:
            retrying = self.transactions.retrying if self.transactions is not None else None
            last = f" (last: {retrying})" if retrying else ""
            raise KcoreTimeoutError(
                f"{call} did not finish within {limit:g}s{last}; call it again to go on"
            ) from None

    async def init_transactions(self, timeout: float | None) -> None:
        txn, requests = self._require_txn("init_transactions")
        txn.check_initializable()
        deadline = Deadline(self.max_block_s if timeout is None else timeout)
        await self.cluster.ready(deadline.remaining())  # BootstrapError at the bound
        await self._bounded(
            "init_transactions", requests.initialize(), max(deadline.remaining(), 0.0)
        )

    async def wait_until_ready(self, timeout: float | None) -> None:
        """Until the first bootstrap has succeeded and (idempotent producer) the producer id
        is there, up to ``timeout`` (default max.block.ms): ``BootstrapError`` naming each
        address and why, or what refused the producer id."""
        deadline = Deadline(self.max_block_s if timeout is None else timeout)
        await self.cluster.ready(deadline.remaining())
        if self.idempotent and self.txn is None:
            await self.sender.wait_for_producer_id(deadline)

    def begin_transaction(self) -> None:
        self._require_txn("begin_transaction")[0].begin()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        group_metadata: ConsumerGroupMetadata | str,
        timeout: float | None,
    ) -> None:
        txn, requests = self._require_txn("send_offsets_to_transaction")
        txn.check_in_transaction("send_offsets_to_transaction")
        group = (
            ConsumerGroupMetadata(group_metadata)
            if isinstance(group_metadata, str)
            else group_metadata
        )
        if not isinstance(group, ConsumerGroupMetadata) or not group.group_id:
            raise KcoreError(
                "send_offsets_to_transaction: group_metadata is a ConsumerGroupMetadata or "
                f"a group id, not {group_metadata!r}"
            )
        wanted: dict[TopicPartition, int] = {}
        for tp, offset in offsets.items():
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise KcoreError(f"send_offsets_to_transaction: offset {offset!r} for {tp}")
            wanted[TopicPartition(*tp)] = offset
        if not wanted:
            return
        # A timeout leaves the request going; commit_transaction waits for it.
        queued = requests.queue_offsets(wanted, group)
        await self._bounded("send_offsets_to_transaction", asyncio.shield(queued), timeout)

    async def commit_transaction(self, timeout: float | None) -> None:
        """Flush (every record of the transaction delivered), then EndTxn(commit). A record
        that failed makes it raise; the transaction must then be aborted."""
        txn, requests = self._require_txn("commit_transaction")
        txn.start_commit()

        async def commit() -> None:
            while self.accumulator.has_pending():  # (again for any append racing the start)
                await self.flush(None)
            if txn.state is not TxnState.COMMITTING:  # a record failed: abortable (or fatal)
                txn.start_commit()  # raises naming the cause
            await requests.end(commit=True)

        await self._bounded("commit_transaction", commit(), timeout)

    async def abort_transaction(self, timeout: float | None) -> None:
        """Unsent records fail (TransactionAbortedError), those in flight are waited for, then
        EndTxn(abort)."""
        txn, requests = self._require_txn("abort_transaction")
        txn.start_abort()
        self.sender.wakeup()  # it fails the waiting batches (the transaction is aborting)

        async def abort() -> None:
            while self.accumulator.has_pending():  # (in flight: waited for, not cut off)
                pending = self.accumulator.pending_results()
                await all_done(pending, [len(pending)])
            await requests.end(commit=False)

        await self._bounded("abort_transaction", abort(), timeout)

    def _on_loop(self) -> bool:
        """Whether this thread runs the producer's loop (the AsyncProducer's caller, the
        sender, callbacks) rather than being a caller's thread."""
        # (the private getter: None off a loop, where get_running_loop raises, and callers'
        # threads ask once a batch)
        return asyncio._get_running_loop() is self.loop

    def wake_sender(self) -> None:
        loop = self.loop
        if loop is None:
            return
        if self._on_loop():
            self.sender.wakeup()
        elif not self._wake_pending:
            self._wake_pending = True
            try:
                loop.call_soon_threadsafe(self._wake_on_loop)
            except RuntimeError:  # the loop is closed: nothing left to wake
                self._wake_pending = False

    def _wake_on_loop(self) -> None:
        # Cleared before the wake-up: a batch made after this line wakes the sender again,
        # one made before it is drained by the wake-up below.
        self._wake_pending = False
        self.sender.wakeup()

    def _let_sender_start(self) -> None:
        """Off the loop's thread: give up the GIL for a moment, so the sender sends the first
        chunk now. Encoding the next chunks holds the GIL, and a thread waiting for it gets
        it only after the interpreter's switch interval (5 ms), the request with it."""
        if not self._on_loop():
            time.sleep(0.0002)

    def append_batch(
        self,
        topic: str,
        values: Any,
        keys: Any,
        partition: int | None,
        timestamp_ms: Any,
        counts: tuple[int, list[int]],
        headers: Any = None,
    ) -> SendBatchResult:
        """send_batch: whole columns (``counts``: the topic's partition count and the
        partitions with a leader)."""
        if self.txn is not None:
            self.txn.check_can_send()
        if self.otel is not None and self.otel.traces_on:
            return traced_send_batch(
                self.otel,
                topic,
                len(values),
                headers,
                lambda traced: self.columns.append(
                    topic, values, keys, partition, timestamp_ms, counts, traced
                ),
            )
        return self.columns.append(topic, values, keys, partition, timestamp_ms, counts, headers)

    def _append_chunk(
        self,
        tp: TopicPartition,
        keys: Any,
        values: Any,
        ts: Any,
        headers: Any,
        start: int,
        stop: int,
        estimate: int,
        rows: Any = None,
    ) -> tuple[ProducerBatch, int]:
        """One chunk of send_batch's rows into a batch of its own, waiting for buffer.memory
        up to max.block.ms (which, inside a transaction, fails the transaction too)."""
        try:
            return self.accumulator.append_chunk(
                tp, keys, values, ts, headers, start, stop, estimate, self.max_block_s, rows
            )
        except KcoreTimeoutError as exc:
            self._failed_in_transaction(exc)
            raise


def _check_payload(name: str, data: Any) -> None:
    """A key or value must be bytes-like or None; say which, and how to fix text."""
    if data is None or isinstance(data, (bytes, bytearray, memoryview)):
        return
    if isinstance(data, str):
        raise TypeError(
            f"the record's {name} is a str; encode it (e.g. {name}.encode()) or set "
            f"{name}.serializer"
        )
    try:
        memoryview(data)
    except TypeError:
        raise TypeError(
            f"the record's {name} must be bytes-like or None, not {type(data).__name__} "
            f"(or set {name}.serializer)"
        ) from None


def _compression_level(cfg: Any) -> int:
    """compression.gzip.level / compression.lz4.level / compression.zstd.level (KIP-390) for
    the configured codec, as it is (zstd's -1 is a level); the codec's default for the others.
    (An LZ4 HC level without the lz4 package was refused with the config.)"""
    from kcore.codec import DEFAULT_COMPRESSION_LEVEL

    codec = str(cfg["compression.type"])
    if codec not in ("gzip", "lz4", "zstd"):
        return DEFAULT_COMPRESSION_LEVEL
    return int(cfg[f"compression.{codec}.level"])


def _declare_metrics(metrics: ClientMetrics, acc: RecordAccumulator) -> None:
    """The producer's metrics, named as Java's producer-metrics group has them."""
    metrics.declare("record-send", "total", "rate")
    metrics.declare("record-retry", "total", "rate")
    metrics.declare("record-error", "total", "rate")
    metrics.declare("batch-size", "avg", "max")
    metrics.declare("compression-rate", "avg")
    metrics.declare("records-per-request", "avg")
    metrics.declare("request-latency", "avg", "max")
    metrics.declare("produce-throttle-time", "avg", "max")
    metrics.gauge("buffer-total-bytes", lambda: acc.buffer_memory)
    metrics.gauge("buffer-available-bytes", lambda: acc.available_bytes)
    metrics.gauge("waiting-threads", lambda: acc.waiting)
    metrics.gauge("bufferpool-wait-time-ns-total", lambda: acc.wait_ns_total)
