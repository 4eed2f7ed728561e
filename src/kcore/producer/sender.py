"""The sender: takes ready batches from the accumulator, groups them by partition leader, and
sends one Produce request per broker; handles the answers (retries, metadata refreshes, leader
hints, idempotent sequences and epoch bumps).

Runs on the client's event loop. With idempotence (the default) each batch gets its sequence
when first sent and keeps it through retries, so a retry the broker already wrote is dropped
as a duplicate. Up to ``max.in.flight.requests.per.connection`` Produce requests to a broker,
and as many batches of a partition, are in flight at once; order holds because sequences are
given out in queue order when batches are taken (not when their request is built), a retried
batch goes out only once nothing else of its partition is in flight, after an epoch bump
nothing new goes out for a partition until its batches of the old epoch have come back (a
bump renumbers only the partitions whose sequence broke, and batches the broker rejected,
never one sent and left unanswered; other retries keep their numbering, so one the broker
already wrote comes back DUPLICATE_SEQUENCE_NUMBER), and a partition has one batch in flight until
one of the current producer id and epoch is written
(before that the leader takes any first sequence, so a later batch could overtake).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kcore.cluster.client import ClusterClient
from kcore.cluster.metadata import apply_leader_hints
from kcore.errors import (
    BrokerConnectionError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    error_for_code,
)
from kcore.metrics import ClientMetrics
from kcore.network.connection import BrokerConnection
from kcore.network.events import WakeTimer
from kcore.network.retry import Deadline, is_retriable, retry
from kcore.producer.accumulator import ProducerBatch, RecordAccumulator
from kcore.producer.idempotence import IdempotenceState
from kcore.producer.txn_state import TransactionStateMachine
from kcore.protocol import ApiKey
from kcore.protocol.messages import InitProducerIdRequest, ProduceRequest
from kcore.protocol.messages.produce_request import PartitionProduceData, TopicProduceData
from kcore.types import TopicPartition

__all__ = ["Sender"]

log = logging.getLogger("kcore.producer")

# A batch over the topic's max.message.bytes (or the broker's message.max.bytes): one of several
# records is split and sent again, as Java does.
TOO_LARGE = frozenset({ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE})
# Answers that mean the broker's idea of this partition's sequence differs from ours.
SEQUENCE_ERRORS = frozenset(
    {
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
        ErrorCode.UNKNOWN_PRODUCER_ID,
        ErrorCode.INVALID_PRODUCER_EPOCH,
    }
)
TOPIC_ID_VERSION = 13  # Produce v13 names topics by id
EXPIRY_CHECK_S = 0.05  # how often waiting batches are checked against delivery.timeout.ms


class Sender:
    def __init__(
        self,
        cluster: ClusterClient,
        accumulator: RecordAccumulator,
        *,
        acks: int,
        request_timeout_s: float,
        delivery_timeout_s: float,
        idempotent: bool,
        max_request_size: int = 1048576,
        retries: int = 2**31 - 1,
        max_in_flight: int = 5,
        identity: IdempotenceState | None = None,
        txn: TransactionStateMachine | None = None,
        register_partitions: Callable[[], None] | None = None,
    ) -> None:
        """``identity``: the producer id, epoch and sequences (a fresh one if not given).
        ``txn`` (with transactional.id): batches are sent only inside a transaction, to
        partitions it registered, with the transactional id; ``register_partitions()`` is
        called after each drain to register what ``txn.may_send`` found unregistered."""
        self.cluster = cluster
        # The client's metrics (a sender made without a ClusterClient records into its own).
        self.metrics: ClientMetrics = getattr(cluster, "metrics", None) or ClientMetrics()
        self.acc = accumulator
        self.acks = acks
        self.request_timeout_s = request_timeout_s
        self.delivery_timeout_s = delivery_timeout_s
        self.idempotent = idempotent
        self.max_request_size = max_request_size
        self.retries = retries
        # Produce requests started and not answered, per node: at max.in.flight, that node's
        # batches wait in the accumulator (as Java's sender drains only for a node that can
        # take another request), so the next request carries every batch that became ready
        # meanwhile instead of one request each queueing for a connection slot.
        self.max_in_flight = max(1, max_in_flight)
        self._node_requests: dict[int, int] = defaultdict(int)
        # The nodes with max.in.flight requests out, kept with _node_requests: the loop asks
        # whether every broker is busy at each turn.
        self._busy_nodes: set[int] = set()
        # Of those, the ones a task sends (see _start_produce), per node.
        self._node_tasks: dict[int, int] = defaultdict(int)
        # The last drain left a batch that an event wakes this loop for: an answer from a node
        # at the limit, or a leader's connection opening.
        self._held_for_event = False
        # Leaders whose connection is being opened for a batch waiting in the accumulator.
        self._awaited_connections: set[int] = set()
        # Whether each leader seen can take batches, kept only during _drain (one synchronous
        # pass on this thread, so nothing changes under it; a drain asks for every ready
        # partition, most of them on a few nodes); and the leader each batch was taken for,
        # kept from a drain until the _dispatch of its batches takes them over.
        self._drain_nodes: dict[int, bool] | None = None
        self._drain_leaders: dict[TopicPartition, int] = {}
        self.identity = identity if identity is not None else IdempotenceState()
        self._wakeup = asyncio.Event()
        self._wake_timer = WakeTimer(self._wakeup)
        # Requests in flight: a task each, or a future standing for one sent from a callback.
        self._tasks: set[asyncio.Future[Any]] = set()
        self._stopping = False
        # An epoch bump renumbers the waiting batches of the partitions whose sequence broke
        # (identity.sequence_broke). Other partitions' retries keep their producer id, epoch
        # and sequence, as Java's: renumbered, a batch the broker already wrote (its answer
        # lost) would be written again.
        self._epoch_bump: asyncio.Task[None] | None = None
        # The Produce version last chosen, with the connection and the broker versions it was
        # chosen from (a producer outside a transaction asks once a request).
        self._produce_version_for: tuple[Any, Any, int] | None = None
        # A failure the producer cannot go on from (the epoch bump failed): fails everything.
        self._fatal: BaseException | None = None
        # The last failure of an InitProducerId being retried: what a wait for it names.
        self._pid_failure: BaseException | None = None
        # Batches taken to be sent and not answered yet: their records fail at
        # delivery.timeout.ms even while their request is out, as Java's (KIP-91).
        self._sent: set[ProducerBatch] = set()
        self._next_in_flight_check = 0.0
        self._next_expiry_check = 0.0
        self.txn = txn
        self.transactional_id = txn.transactional_id if txn is not None else None
        self.register_partitions = register_partitions
        # Per partition, the records delivered and their batches' bytes (uncompressed, record
        # framing included), for the statistics; None while statistics are off.
        self.delivered: dict[TopicPartition, list[int]] | None = None
        # Told of every batch answered or failed (its partition, records, when it was
        # created, error): OpenTelemetry metrics; None while they are off.
        self.on_batch_done: (
            Callable[[TopicPartition, int, float, BaseException | None], None] | None
        ) = None

    def wakeup(self) -> None:
        self._wakeup.set()

    def count_deliveries(self) -> None:
        """Keep :attr:`delivered` from now on (statistics on)."""
        if self.delivered is None:
            self.delivered = {}

    def in_flight_records(self) -> tuple[int, int]:
        """Records sent and not answered yet, and their bytes (the statistics' msg_cnt counts
        them with those waiting in the accumulator, as librdkafka's does)."""
        sent = list(self._sent)
        return sum(b.records for b in sent), sum(b.builder.size_in_bytes for b in sent)

    # -- producer id ------------------------------------------------------------------------------

    async def init_producer_id(self, timeout: float | None = None) -> None:
        """InitProducerId; with a current id and epoch it asks for an epoch bump (KIP-360).
        Retried until ``timeout`` (None: for as long as it takes), then ``KcoreTimeoutError``
        naming the last failure."""
        deadline = Deadline(math.inf if timeout is None else timeout)

        def failed(exc: BaseException) -> None:
            self._pid_failure = exc

        try:
            response = await retry(
                "InitProducerId",
                self._init_producer_id_once,
                deadline=deadline,
                backoff=self.cluster.retry_backoff,
                before_retry=failed,
                bound_attempts=False,  # each request keeps request.timeout.ms
            )
        except (KcoreError, TimeoutError) as exc:
            if not is_retriable(exc):
                raise
            # At the deadline, whatever the last failure was: a timeout that names it.
            last = (
                exc.__cause__
                if isinstance(exc, KcoreTimeoutError) and str(exc.__cause__ or "")
                else exc
            )
            raise KcoreTimeoutError(
                f"no producer id (InitProducerId) within {timeout:g}s; last: {last}"
            ) from exc
        self.identity.reset(response.producer_id, response.producer_epoch)
        log.debug("producer id %s epoch %s", response.producer_id, response.producer_epoch)

    async def _init_producer_id_once(self) -> Any:
        node = self.cluster.least_loaded_node()
        if node is None:
            await self.cluster.refresh_metadata()
            node = self.cluster.least_loaded_node()
            if node is None:
                raise BrokerConnectionError("cluster", "connect", "no broker to ask")
        version = await self.cluster.version_for(node, ApiKey.INIT_PRODUCER_ID)
        request = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1)
        identity = self.identity
        if version >= 3 and identity.producer_id >= 0:
            request.producer_id = identity.producer_id
            request.producer_epoch = identity.epoch
        response = await self.cluster.send(node, request, version)
        if response.error_code:
            err = error_for_code(response.error_code)
            assert err is not None
            if response.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
                raise err.with_message(
                    "the idempotent producer may not get a producer id: its principal "
                    "needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic "
                    "(or set enable.idempotence=false)"
                )
            raise err
        return response

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            if not self._stopping:
                # Cancelled without close(): an AsyncProducer's event loop ended under it
                # (asyncio.run cancels what is left). What was not delivered fails, loudly,
                # rather than leaving its futures unanswered.
                pending = self.acc.pending_results()
                ended = KcoreError(
                    "the producer's event loop ended before close(): its records were not "
                    "all delivered (close or flush an AsyncProducer before the loop ends)"
                )
                if pending:
                    log.warning("%s (%d batches)", ended, len(pending))
                self._stopping = True
                self.acc.close(ended)
                for result in pending:
                    if not result.done:
                        result.fail(ended)
            raise
        except Exception as exc:
            # A fatal error (or a bug) must not leave callers waiting forever: fail what waits
            # to be sent, refuse more. Batches in flight are settled by their answers (one
            # the broker wrote must not be reported failed), then whatever is left fails.
            if exc is self._fatal:
                log.error("%s", exc)
                error: BaseException = exc
            else:
                log.exception("the producer's sender stopped")
                error = KcoreError(f"the producer's sender stopped: {exc!r}")
            self._stopping = True  # (no epoch bump from here on)
            self.acc.close(error)
            for batch in self.acc.abort_all():
                self._fail(batch, error)
            await self.wait_in_flight()
            for batch in self.acc.abort_all():  # requeued by those answers
                self._fail(batch, error)
            for result in self.acc.pending_results():  # taken from the queues, not sent
                result.fail(error)
        finally:
            self._wake_timer.cancel()

    async def _run(self) -> None:
        while True:
            if self._fatal is not None:
                raise self._fatal
            now = time.monotonic()
            self._expire(now)
            if self._stopping and not self.acc.has_pending():
                return
            txn = self.txn
            if txn is not None:
                error = txn.undrained_error()
                if error is not None:  # aborting, failed, or not in a transaction
                    for batch in self.acc.abort_all():
                        self._drop(batch, error)
            self._held_for_event = False
            batches: list[ProducerBatch] = []
            if self._every_node_busy():
                # Nothing could go: drain and next_ready_in walk every partition with a batch
                # (thousands, keyed over many partitions), and the sender turns for each new
                # batch. An answer frees a node and wakes this loop.
                self._held_for_event = True
                wait: float | None = 0.0
            else:
                batches = self._drain(now)
                if batches:
                    self._dispatch(batches)
                if self.register_partitions is not None:
                    self.register_partitions()  # what the drain found unregistered (v1)
                wait = self.acc.next_ready_in(time.monotonic())
            if wait is not None and wait <= 0 and not batches:
                # Ready but held back (leader unknown, a retry waiting for its partition's
                # batches in flight): until an answer arrives, or briefly. For a node at
                # max.in.flight an answer is what frees it, for a leader being connected to its
                # connection opening (either wakes this loop), so the poll is slower: it only
                # bounds how late another node's batch may go meanwhile.
                wait = 0.05 if self._held_for_event else 0.005
            timeout = 1.0 if wait is None else min(max(wait, 0.0005), 1.0)
            if self._sent and self.txn is None:
                timeout = min(timeout, 0.1)  # in-flight records' delivery.timeout.ms
            self._wakeup.clear()
            if wait is None or wait > 0:
                await self._wake_timer.wait(timeout)
            else:
                await asyncio.sleep(0)  # more may be ready: drain again after replies

    def _every_node_busy(self) -> bool:
        """Whether every broker has max.in.flight requests out (so no batch can go now)."""
        busy = self._busy_nodes
        if not busy:
            return False
        brokers = self.cluster.metadata.brokers
        return 0 < len(brokers) <= len(busy) and all(node in busy for node in brokers)

    def _drain(self, now: float) -> list[ProducerBatch]:
        """The batches ready to go now; _dispatch sends them (to the leaders they were taken
        for, kept until that dispatch)."""
        self._drain_nodes = {}
        self._drain_leaders.clear()
        try:
            return self.acc.drain(now, self._sendable)
        finally:
            self._drain_nodes = None

    def _sendable(self, tp: TopicPartition, head: ProducerBatch, in_flight: int) -> bool:
        if self._epoch_bump is not None:
            return False
        if in_flight:
            if head.attempts:  # a retry: only once every earlier batch has come back
                return False
            # (only an idempotent producer's batches are numbered, so have an epoch)
            if self.idempotent and self.identity.older_epoch_in_flight(tp):
                return False  # old-epoch batches come back first and are renumbered first
            if self.idempotent and not self.identity.has_written(tp):
                # Until a batch of ours is written, the partition's leader has no state for
                # this producer id and accepts any first sequence: a later batch could land
                # before an earlier one that failed (e.g. NOT_LEADER on a new topic).
                return False
        leader = self.cluster.metadata.leader_for(tp.topic, tp.partition)
        if leader is None:
            self.cluster.add_topics([tp.topic])
            self.cluster.cache.request_update()
            return False
        # (may_send first: it registers a transaction's new partition, which can go on while
        # the node is busy.)
        if self.txn is not None and not self.txn.may_send(tp):
            return False
        node = leader.node_id
        nodes = self._drain_nodes
        if nodes is None:  # (asked outside a drain)
            return self._node_takes_batches(node)
        ok = nodes.get(node)
        if ok is None:
            ok = nodes[node] = self._node_takes_batches(node)
        if ok:
            self._drain_leaders[tp] = node
        return ok

    def _node_takes_batches(self, node: int) -> bool:
        """Whether batches led by ``node`` may be taken now (asked once a node a drain)."""
        if self._node_requests.get(node, 0) >= self.max_in_flight:
            self._held_for_event = True  # an answer wakes the sender: no need to poll
            return False
        if self.cluster.is_blacked_out(node) or self.cluster.ready_connection(node) is None:
            # As Java's sender, batches are taken only for a leader connected now: taken for one
            # being connected to, they would wait for that connection (up to
            # socket.connection.setup.timeout.ms, to a leader that went away) instead of going
            # to the leader the next metadata names.
            failure = self.cluster.last_failure(node)
            if failure is not None and not is_retriable(failure):
                # Rejected credentials, say: the request task meets it again (after the
                # backoff) and fails the batch with it, rather than it waiting out
                # delivery.timeout.ms.
                return True
            self._await_connection(node, failure)
            return False
        return True

    def _await_connection(self, node: int, last_failure: BaseException | None) -> None:
        """Open the connection to ``node`` for the batches waiting for it, and drain again
        once it is ready (a failed attempt backs off, and asks for fresh metadata)."""
        self._held_for_event = True
        if node in self._awaited_connections:
            return
        self._awaited_connections.add(node)
        if last_failure is not None:
            # Its last connection failed: the leader may have moved (an attempt to one cut off
            # lasts up to the setup timeout, and nothing else would ask meanwhile).
            self.cluster.cache.request_update()

        def done(opened: bool) -> None:
            self._awaited_connections.discard(node)
            if opened:  # (after a failure the node backs off: the next poll tries again)
                self.wakeup()

        try:
            self.cluster.open_soon(node, done)
        except KcoreError:  # the client is closing: its close fails what waits
            self._awaited_connections.discard(node)

    def _expire(self, now: float) -> None:
        # The walk over every partition's queue, at most every EXPIRY_CHECK_S (not every turn
        # of the loop: thousands of partitions, a turn per answer and per new batch): a
        # waiting batch fails at most that late after delivery.timeout.ms.
        if now >= self._next_expiry_check:
            self._next_expiry_check = now + EXPIRY_CHECK_S
            for batch in self.acc.expire(now, self.delivery_timeout_s):
                self._fail(batch, self._timed_out(batch, self._why_waiting(batch.tp)))
        # Not in a transaction: ending one must wait for the answers of its requests in flight
        # (a Produce landing after the abort marker would be a hanging transaction), and the
        # records' results are what that waits on.
        if self._sent and self.txn is None and now >= self._next_in_flight_check:
            self._next_in_flight_check = now + 0.1
            for batch in [b for b in self._sent if now - b.created > self.delivery_timeout_s]:
                if not batch.result.done:
                    # Only its records are told (they may yet be written: a timeout, as Java's):
                    # the batch stays in flight, with its memory, order and sequence, until its
                    # answer, which then settles it (it is not sent again).
                    batch.result.fail(self._timed_out(batch, " (its request is unanswered)"))

    def _why_waiting(self, tp: TopicPartition) -> str:
        """What kept a partition's batch in the accumulator, if known: for a timeout's text."""
        leader = self.cluster.metadata.leader_for(tp.topic, tp.partition)
        if leader is None:
            return " (no leader is known for the partition)"
        failure = self.cluster.last_failure(leader.node_id)
        if failure is not None:
            return f" (its leader, node {leader.node_id}, cannot be reached: {failure})"
        return ""

    def _timed_out(self, batch: ProducerBatch, detail: str = "") -> KcoreTimeoutError:
        return KcoreTimeoutError(
            f"{batch.tp.topic}-{batch.tp.partition}: {batch.records} record(s) not delivered "
            f"within delivery.timeout.ms ({self.delivery_timeout_s:g}s){detail}"
        )

    def _dispatch(self, batches: list[ProducerBatch]) -> None:
        by_node: dict[int, list[ProducerBatch]] = defaultdict(list)
        now = time.monotonic()
        # The last drain's leaders, taken over: a later dispatch finds none of them stale.
        leaders, self._drain_leaders = self._drain_leaders, {}
        touched = None
        for batch in batches:
            tp = batch.tp
            if tp.topic != touched:  # (metadata.max.idle.ms; a drain's batches run by topic)
                touched = tp.topic
                self.cluster.touch_topic(touched, now)
            node = leaders.get(tp)  # the leader _drain took it for
            if node is None:  # (a batch handed over otherwise: its leader looked up now)
                leader = self.cluster.metadata.leader_for(tp.topic, tp.partition)
                if leader is None:
                    self.acc.requeue(batch, time.monotonic())
                    continue
                node = leader.node_id
            self._assign_sequence(batch)  # now, in queue order, not when a request is built
            self._sent.add(batch)
            by_node[node].append(batch)
        for node, group in by_node.items():
            # Requests of at most max.request.size (always at least one batch each), as Java.
            request: list[ProducerBatch] = []
            size = 0
            for batch in group:
                batch_size = self._wire_size(batch)
                if request and size + batch_size > self.max_request_size:
                    self._start_produce(node, request)
                    request, size = [], 0
                request.append(batch)
                size += batch_size
            self._start_produce(node, request)

    def _wire_size(self, batch: ProducerBatch) -> int:
        """The batch's size in a request: built now (compressed, with its sequence), so that
        compressed batches are packed by what they weigh on the wire, as Java packs them by
        their estimated compressed size; by their uncompressed size, lz4 batches of the
        records' usual ratio went one to a request, and the broker paid for three times the
        requests. A build that fails fails again in _produce_request, which fails that batch."""
        try:
            return len(self._payload(batch))
        except Exception:
            return batch.builder.size_in_bytes

    def _start_produce(self, node: int, batches: list[ProducerBatch]) -> None:
        requests = self._node_requests[node] = self._node_requests[node] + 1
        if requests >= self.max_in_flight:
            self._busy_nodes.add(node)
        # Sent at once only while no task of this node's is out: a task may still be on its
        # way to the connection (opening it, say), and a request sent at once would overtake
        # it, its batches with it.
        if self.acks != 0 and not self._node_tasks[node]:
            conn = self.cluster.ready_connection(node)
            if conn is not None and self._produce_now(conn, node, batches):
                return
        self._node_tasks[node] += 1
        task = asyncio.get_running_loop().create_task(self._produce(node, batches))
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._produce_done(t, node, batches, by_task=True))

    def _produce_done(
        self,
        task: asyncio.Future[None],
        node: int,
        batches: list[ProducerBatch],
        *,
        by_task: bool = False,
    ) -> None:
        self._tasks.discard(task)
        requests = self._node_requests[node] = self._node_requests[node] - 1
        if requests < self.max_in_flight:
            self._busy_nodes.discard(node)
        if by_task:
            self._node_tasks[node] -= 1
        self.wakeup()  # the node can take another request
        if task.cancelled():
            # close(timeout) ran out (cancel_in_flight), perhaps before the task even started:
            # as Java's close, what is not acknowledged fails now.
            error = KcoreError("the producer closed before the record was acknowledged")
            for batch in batches:
                if batch.in_flight:
                    self._fail(batch, error)

    def _produce_now(self, conn: BrokerConnection, node: int, batches: list[ProducerBatch]) -> bool:
        """The request for ``batches`` sent from this turn of the loop when its connection
        can take it at once: no task, no coroutine (a request's asyncio steps were a large
        part of the sender's time with small requests). Its answer is handled by a callback;
        a future stands for it in ``_tasks`` (what close cancels and waits for). False:
        nothing was sent nor changed (the connection cannot take it now)."""
        try:
            version = self._produce_version(conn)
        except KafkaError:
            return False  # (the task's path reports it)
        if not conn.can_send_now():
            return False
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tasks.add(done)

        def finished(f: asyncio.Future[None]) -> None:
            self._produce_done(f, node, batches)

        done.add_done_callback(finished)
        sent: list[ProducerBatch] = batches
        try:
            request, sent = self._produce_request(batches, version)
            if request is None:
                done.set_result(None)
                return True
            self._sending(sent)
            started = time.monotonic()

            def answered(response: Any, error: BaseException | None) -> None:
                if done.done():  # cancelled by close(): its batches failed then
                    return
                # The node takes another request from now, counted before the answer is
                # settled: the sender's wake-up from settling it then finds the node free, and
                # sends in that turn (one turn of the sender an answer, not two).
                done.remove_done_callback(finished)
                done.set_result(None)
                self._produce_done(done, node, batches)
                try:
                    if error is None:
                        self._produce_answered(response, sent, version, started)
                    elif isinstance(error, BrokerConnectionError | KcoreTimeoutError):
                        self._retry_all(sent, error)
                    else:
                        raise error
                except Exception as exc:
                    self._produce_failed(node, sent, exc)

            if not self.cluster.send_now(conn, node, request, version, answered):
                # (cannot happen: can_send_now said yes, and its yes holds for this turn)
                self._retry_all(sent, KcoreError("the connection could not take the request"))
                done.set_result(None)
        except Exception as exc:
            self._produce_failed(node, sent, exc)
            if not done.done():
                done.set_result(None)
        return True

    def _produce_version(self, conn: BrokerConnection) -> int:
        if self.txn is not None:  # (its limits may change: chosen every time)
            return int(conn.version_for(ApiKey.PRODUCE, **self.txn.produce_versions))
        last = self._produce_version_for
        # (a connection's versions are replaced, not changed, when it negotiates again)
        if last is not None and last[0] is conn and last[1] is conn.api_versions:
            return last[2]
        version = int(conn.version_for(ApiKey.PRODUCE))
        self._produce_version_for = (conn, conn.api_versions, version)
        return version

    def _assign_sequence(self, batch: ProducerBatch) -> None:
        if not self.idempotent:
            return
        identity = self.identity
        if batch.sequence is None:
            batch.sequence = identity.take_sequence(batch.tp, batch.records)
            batch.producer = identity.producer
            batch.payload = None
        assert batch.producer is not None
        identity.sent(batch.tp, batch.order, batch.producer)

    def _payload(self, batch: ProducerBatch) -> bytes:
        if batch.payload is None:
            if self.idempotent:
                assert batch.sequence is not None and batch.producer is not None
                batch.builder.set_producer(*batch.producer, batch.sequence, self.txn is not None)
            batch.payload = batch.builder.build()
        return batch.payload

    async def _produce(self, node: int, batches: list[ProducerBatch]) -> None:
        try:
            await self._produce_once(node, batches)
        except Exception as exc:
            self._produce_failed(node, batches, exc)

    def _produce_failed(self, node: int, batches: list[ProducerBatch], exc: Exception) -> None:
        # A bug (or e.g. MemoryError building a batch) must not leave batches counted in
        # flight forever: fail those not answered yet.
        log.error("producing to node %s failed", node, exc_info=exc)
        for batch in batches:
            if batch.in_flight:
                self._fail(batch, KcoreError(f"sending the batch failed: {exc!r}"))

    async def _produce_once(self, node: int, batches: list[ProducerBatch]) -> None:
        try:
            # One connection for the version and the request (one lookup, not two).
            conn = await self.cluster.connection(node)
            version = self._produce_version(conn)
        except (BrokerConnectionError, KcoreTimeoutError, KafkaError) as exc:
            self._retry_all(batches, exc)
            return
        request, sent = self._produce_request(batches, version)
        if request is None:
            return
        self._sending(sent)
        started = time.monotonic()
        try:
            response = await self.cluster.send_on(conn, node, request, version)
        except (BrokerConnectionError, KcoreTimeoutError) as exc:
            self._retry_all(sent, exc)
            return
        # Let go of the request (it holds every batch's bytes) before the batches land, so
        # that a delivered batch's buffer is free to go back to the producer's pool.
        del request
        self._produce_answered(response, sent, version, started)

    def _sending(self, sent: list[ProducerBatch]) -> None:
        for batch in sent:
            # From now on the broker may write it, whatever comes back but a sequence error
            # (an answer lost; REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND or
            # NOT_LEADER_OR_FOLLOWER after the leader appended): an epoch bump must not
            # renumber it.
            if batch.sequence is not None:
                batch.maybe_written = True

    def _produce_answered(
        self, response: Any, sent: list[ProducerBatch], version: int, started: float
    ) -> None:
        if response is None:  # acks=0: the broker does not answer
            for batch in sent:
                self._written(batch)
            self._settle_written([(batch, -1, -1) for batch in sent])
            return
        self.metrics.record_all(
            ("request-latency", (time.monotonic() - started) * 1000),
            ("produce-throttle-time", response.throttle_time_ms or 0),
        )
        self._handle_response(response, sent, version)

    def _produce_request(
        self, batches: list[ProducerBatch], version: int
    ) -> tuple[Any, list[ProducerBatch]]:
        """The Produce request for ``batches`` and the batches it carries (some may fail or
        be put back on the way); None when none is left to send."""
        by_topic: dict[str, list[ProducerBatch]] = defaultdict(list)
        compressed = self.acc.compression != "none"
        for batch in batches:
            batch.attempts += 1
            by_topic[batch.tp.topic].append(batch)
        md = self.cluster.metadata
        topic_data = []
        sent: list[ProducerBatch] = []  # what the request carries (and its answer settles)
        sizes: list[float] = []  # the batches' built sizes, and how well each compressed
        rates: list[float] = []
        for topic, group in by_topic.items():
            topic_id = None
            if version >= TOPIC_ID_VERSION:
                info = md.topics.get(topic)
                if info is None or info.topic_id is None:
                    self._retry_all(group, KcoreError(f"no topic id known for {topic}"))
                    continue
                topic_id = info.topic_id
            parts = []
            for b in group:
                if b.result.done:
                    # Its records were told it timed out while this waited for a connection:
                    # not sent now (as Java's expired batches).
                    self._fail(b, self._timed_out(b))
                    continue
                try:
                    payload = self._payload(b)
                except Exception as exc:  # e.g. its builder ran out of memory: this batch only
                    self._fail(b, KcoreError(f"{b.tp.topic}-{b.tp.partition}: {exc}"))
                    continue
                parts.append(PartitionProduceData(index=b.tp.partition, records=payload))
                sizes.append(len(payload))
                raw = b.builder.size_in_bytes
                if raw > 0:  # 1.0 uncompressed, as Java's
                    rates.append(len(payload) / raw if compressed else 1.0)
                part = md.partition(b.tp.topic, b.tp.partition)
                b.leader_epoch = part.leader_epoch if part is not None else -1
                sent.append(b)
            if not parts:
                continue
            if topic_id is not None:
                topic_data.append(TopicProduceData(topic_id=topic_id, partition_data=parts))
            else:
                topic_data.append(TopicProduceData(name=topic, partition_data=parts))
        if not sent:
            return None, sent
        records = sum(b.records for b in sent)
        # A batch goes out (again): its records, its size and how well it compressed; all of a
        # request's at once (one lock, one clock read).
        self.metrics.record_all(
            ("record-send", records),
            ("batch-size", sizes),
            ("compression-rate", rates),
            ("records-per-request", records),
        )
        request = ProduceRequest(
            transactional_id=self.transactional_id,
            acks=self.acks,
            timeout_ms=int(self.request_timeout_s * 1000),
            topic_data=topic_data,
        )
        return request, sent

    def _handle_response(self, response: Any, batches: list[ProducerBatch], version: int) -> None:
        # (TopicPartition is a named tuple: a (name, index) tuple finds its batch)
        pending: dict[tuple[str, int], ProducerBatch] = {b.tp: b for b in batches}
        if apply_leader_hints(self.cluster.cache, response):
            log.debug("leader hints applied from a produce response")
        bump = False
        written: list[tuple[ProducerBatch, int, int]] = []
        for topic in response.responses:
            name = topic.name
            if not name:  # (Produce v13+ names topics by id)
                name = self.cluster.metadata.topic_names_by_id.get(topic.topic_id, "")
            for p in topic.partition_responses:
                batch = pending.pop((name, p.index), None)
                if batch is None:
                    continue
                code = p.error_code
                if code == ErrorCode.NONE:
                    self._written(batch)
                    written.append((batch, p.base_offset, p.log_append_time_ms))
                elif code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                    # Already written by an earlier attempt: delivered, offset unknown.
                    self._written(batch)
                    written.append((batch, p.base_offset if p.base_offset >= 0 else -1, -1))
                elif code in SEQUENCE_ERRORS and self.idempotent:
                    self._land(batch)
                    # Not written, nor by an earlier attempt (that would have come back
                    # DUPLICATE_SEQUENCE_NUMBER): an epoch bump may renumber it.
                    batch.maybe_written = False
                    if batch.result.done:  # timed out in flight: not sent again
                        self._fail(batch, self._timed_out(batch))
                    elif not self.identity.is_current(batch.producer):
                        # Rejected under an older epoch (so not written): renumbered under
                        # the current one when it goes again.
                        batch.sequence = None
                        self.acc.requeue(batch, time.monotonic())
                    elif self._earlier_pending(batch):
                        # An earlier batch of the partition is being retried (so the broker
                        # saw a gap): just go again after it.
                        self.acc.requeue(batch, time.monotonic())
                    elif self.txn is not None:
                        # A transaction does not bump its epoch in flight: the batch fails and
                        # with it the transaction (INVALID_PRODUCER_EPOCH: fenced, fatal).
                        err = error_for_code(code)
                        assert err is not None
                        self._fail(batch, err)
                    else:
                        bump = True
                        self.identity.sequence_broke(batch.tp)
                        self.acc.requeue(batch, time.monotonic())
                else:
                    err = error_for_code(code)
                    assert err is not None
                    if p.error_message:
                        err = err.with_message(p.error_message)
                    if p.record_errors:
                        self._fail_records(batch, err, p.record_errors)
                    elif code in TOO_LARGE and batch.records > 1 and not batch.result.done:
                        self._split(batch, err)
                    else:
                        self._retry_or_fail(batch, err)
        self._settle_written(written)
        for batch in pending.values():  # not in the answer at all
            self._retry_or_fail(batch, KcoreError("the broker did not answer for the partition"))
        if bump:
            self._start_epoch_bump()

    def _fail_records(self, batch: ProducerBatch, error: KafkaError, named: Any) -> None:
        """KIP-467: the broker refused the batch (none of it written) and named the records
        that caused it. As Java, each named record fails with the broker's error and its
        message about it, the others with a plain ``KcoreError`` (Java's ``KafkaException``)
        saying they went down with them, so that the error's class singles out the records
        at fault; not retried (the same batch would be refused again)."""
        own: dict[int, BaseException] = {
            e.batch_index: error.with_message(e.batch_index_error_message or error.message)
            for e in named
            if 0 <= e.batch_index < batch.records
        }
        if not own:  # it named none of this batch's records: the batch's error for all
            self._fail(batch, error)
            return
        first = own[min(own)]
        others = KcoreError(
            f"{batch.tp.topic}-{batch.tp.partition}: not written: the record was part of a "
            f"batch with invalid records ({first})"
        )
        self._fail(batch, others, own)

    def _split(self, batch: ProducerBatch, error: KafkaError) -> None:
        """The broker refused the batch as too large (so wrote none of it): its records go
        again in two halves that keep its sequence range, so the batches after it, which come
        back OUT_OF_ORDER_SEQUENCE_NUMBER meanwhile, go again after the halves with their own."""
        self._land(batch)
        try:
            halves = self.acc.split(batch)
        except Exception as exc:
            # It cannot be split (out of memory; a header key that is not UTF-8, which the
            # decoder refuses): its records fail with the broker's answer.
            self._fail(
                batch, error.with_message(f"{error.message}; the batch could not be split: {exc!r}")
            )
            return
        log.warning(
            "%s-%s: a batch of %d records was too large for the broker; sending it in two "
            "(%d and %d records)",
            batch.tp.topic,
            batch.tp.partition,
            batch.records,
            halves[0].records,
            halves[1].records,
        )
        self.wakeup()

    def _land(self, batch: ProducerBatch) -> None:
        self._sent.discard(batch)
        self.identity.landed(batch.tp, batch.order)

    def _earlier_pending(self, batch: ProducerBatch) -> bool:
        return self.identity.earlier_in_flight(batch.tp, batch.order) or self.acc.waiting_earlier(
            batch.tp, batch.order
        )

    def fetch_producer_id(self) -> None:
        """The idempotent producer's first id, in the background as an epoch bump is: batches
        wait for it (and expire at delivery.timeout.ms) while no broker answers."""
        self._start_epoch_bump(first=True)

    async def wait_for_producer_id(self, deadline: Deadline) -> None:
        """Until the idempotent producer has its id, up to ``deadline``: raises the failure
        that refused it for good (e.g. ``ClusterAuthorizationFailedError``), or at the
        deadline ``KcoreTimeoutError`` naming the last failure."""
        task = self._epoch_bump
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=max(deadline.remaining(), 0.0))
        if self._fatal is not None:
            raise self._fatal
        if self.identity.producer_id < 0:
            raise KcoreTimeoutError(
                f"no producer id (InitProducerId) within {deadline.timeout:g}s; "
                f"last: {self._pid_failure or 'no answer'}"
            )

    def _start_epoch_bump(self, first: bool = False) -> None:
        if self._epoch_bump is not None or self._fatal is not None or self._stopping:
            return

        async def bump() -> None:
            try:
                # Retriable failures are retried (meanwhile waiting batches expire at
                # delivery.timeout.ms, and the producer goes on once a broker answers).
                await self.init_producer_id()
                self.acc.reset_sequences(self.identity.take_broken())
            except Exception as exc:
                # Refused for good (e.g. not authorized): the producer cannot go on with broken
                # sequences; every record waiting to be sent fails with the cause (the first
                # id's refusal as it is: no sequence broke).
                self._fatal = (
                    exc if first else KcoreError(f"the producer's epoch bump failed: {exc!r}")
                )
            finally:
                self._epoch_bump = None
                self.wakeup()

        self._epoch_bump = asyncio.get_running_loop().create_task(bump())

    def _retry_all(self, batches: list[ProducerBatch], exc: BaseException) -> None:
        for batch in batches:
            self._retry_or_fail(batch, exc)

    def _retry_or_fail(self, batch: ProducerBatch, exc: BaseException) -> None:
        retriable = not isinstance(exc, KafkaError) or exc.retriable
        if isinstance(exc, KafkaError):
            self.cluster.handle_error_code(exc.code)
        else:
            self.cluster.cache.request_update()
        now = time.monotonic()
        self._land(batch)
        attempts = batch.attempts - batch.free_attempts
        if retriable and attempts <= self.retries and now - batch.created < self.delivery_timeout_s:
            log.debug("retrying %s after %s", batch.tp, exc)
            backoff = self.cluster.retry_backoff.backoff_s(max(attempts - 1, 0))
            part = self.cluster.metadata.partition(batch.tp.topic, batch.tp.partition)
            if part is not None and 0 <= batch.leader_epoch < part.leader_epoch:
                backoff = (
                    0.0  # KIP-951, as Java: a new leader is known already (a hint in the answer)
                )
            self.acc.requeue(batch, now + backoff)
            self.metrics.record("record-retry", batch.records)
            self.wakeup()
            return
        self._fail(batch, exc)

    def _written(self, batch: ProducerBatch) -> None:
        """The broker wrote ``batch``: its partition's state and the statistics now, in the
        answer's order; its memory and result with the answer's others (_settle_written)."""
        if self.delivered is not None:
            counts = self.delivered.get(batch.tp)
            if counts is None:
                counts = self.delivered[batch.tp] = [0, 0]
            counts[0] += batch.records
            counts[1] += batch.builder.size_in_bytes
        if self.on_batch_done is not None:
            self.on_batch_done(batch.tp, batch.records, batch.created, None)
        self._land(batch)
        self.identity.written(batch.tp, batch.producer)

    def _settle_written(self, written: list[tuple[ProducerBatch, int, int]]) -> None:
        """An answer's written batches (``_written`` already): memory back under one lock,
        then each result completed (base offset, log append time), then one wake-up."""
        if not written:
            return
        self.acc.done_all([batch for batch, _, _ in written])
        for batch, base_offset, log_append_time in written:
            batch.result.complete(base_offset, log_append_time)
        self.wakeup()

    def _fail(
        self,
        batch: ProducerBatch,
        exc: BaseException,
        record_errors: dict[int, BaseException] | None = None,
    ) -> None:
        self._land(batch)
        self.acc.done(batch)
        self.metrics.record("record-error", batch.records)
        if self.on_batch_done is not None:
            self.on_batch_done(batch.tp, batch.records, batch.created, exc)
        batch.result.fail(exc, record_errors)
        if self.txn is not None:
            # The transaction fails with it (no epoch bump in flight; abort bumps if needed).
            self.txn.batch_failed(exc, self._numbered(batch))
            self.wakeup()
            return
        if (
            self.idempotent
            and batch.sequence is not None
            and self.identity.is_current(batch.producer)
            and not self._stopping
        ):
            # Later batches' sequences no longer follow on, and a sequence must never be used
            # twice in one epoch (the broker would take a reuse for a duplicate of what it has
            # and drop it): a new epoch renumbers this partition's batches (KIP-360).
            self.identity.sequence_broke(batch.tp)
            self._start_epoch_bump()
        self.wakeup()

    def _numbered(self, batch: ProducerBatch) -> bool:
        return batch.sequence is not None and self.identity.is_current(batch.producer)

    def _drop(self, batch: ProducerBatch, exc: BaseException) -> None:
        """Fail a waiting batch of a transaction that aborted or failed (not its own error)."""
        self._land(batch)
        self.acc.done(batch)
        self.metrics.record("record-error", batch.records)
        if self.on_batch_done is not None:
            self.on_batch_done(batch.tp, batch.records, batch.created, exc)
        batch.result.fail(exc)
        if self.txn is not None:
            self.txn.batch_dropped(self._numbered(batch))

    async def stop(self, abort: bool = False) -> None:
        self._stopping = True
        if self._epoch_bump is not None:  # nothing is left to send with the id it would get
            self._epoch_bump.cancel()
        if abort:
            for batch in self.acc.abort_all():
                self._fail(batch, KcoreError("the producer was closed before the record was sent"))
        self.wakeup()

    def cancel_in_flight(self) -> None:
        """Stop waiting for the Produce requests in flight (their records fail)."""
        for task in list(self._tasks):
            task.cancel()

    async def wait_in_flight(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
