"""Transactions (KIP-98): the transactional producer's state machine and its requests to the
transaction coordinator (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn) and to a
group's coordinator (TxnOffsetCommit, KIP-447).

The state and its transitions are plain methods without I/O (``begin``, ``start_commit``,
``start_abort``, ``may_send``, ``batch_failed``, ...); the ``async`` methods do the requests
and run on the producer's event loop. The sender asks ``may_send(tp)`` before it takes a batch:
with transaction protocol v1 a partition must be registered first (AddPartitionsToTxn, the
partitions a drain found unregistered in one request); with protocol v2 (KIP-890 part 2:
``transaction.version`` >= 2, EndTxn v5, Produce v12) the broker registers a partition on the
first Produce, TxnOffsetCommit goes to the group coordinator without AddOffsetsToTxn, and the
coordinator bumps the producer epoch at every EndTxn (its answer carries the new one).

States, as Java's TransactionManager: UNINITIALIZED -> READY (init_transactions) ->
IN_TRANSACTION (begin_transaction) -> COMMITTING / ABORTING -> READY. A failed produce (or
offset commit) inside a transaction makes it ABORTABLE_ERROR: commit raises, abort recovers.
Fencing (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH) and authorization failures of the
transactional id are FATAL_ERROR: every further transactional call raises.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kcore.cluster.coordinator import GROUP, TRANSACTION, CoordinatorLink
from kcore.errors import (
    BrokerConnectionError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    ProducerFencedError,
    TransactionAbortedError,
    TransactionStateError,
    error_for_code,
)
from kcore.protocol import ApiKey
from kcore.protocol.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)
from kcore.protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnTopic
from kcore.protocol.messages.txn_offset_commit_request import (
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)
from kcore.types import ConsumerGroupMetadata, TopicPartition

if TYPE_CHECKING:
    from kcore.cluster.client import ClusterClient
    from kcore.producer.sender import Sender

__all__ = ["TransactionManager", "TxnState", "transaction_version"]

log = logging.getLogger("kcore.producer.transactions")

TRANSACTION_VERSION_FEATURE = "transaction.version"
# Highest versions of transaction protocol v1. AddPartitionsToTxn v4+ is for brokers only.
V1_MAX = {
    ApiKey.PRODUCE: 11,
    ApiKey.ADD_PARTITIONS_TO_TXN: 3,
    ApiKey.END_TXN: 4,
    ApiKey.TXN_OFFSET_COMMIT: 4,
}
V2_MIN = {ApiKey.PRODUCE: 12, ApiKey.END_TXN: 5, ApiKey.TXN_OFFSET_COMMIT: 5}
CONCURRENT_TXN_BACKOFF_S = 0.02  # Java's for the first AddPartitionsToTxn of a transaction

# Error codes by what they mean for a transactional request.
REFIND_CODES = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
FENCED_CODES = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})
FATAL_CODES = frozenset(
    {
        *FENCED_CODES,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.INVALID_TXN_STATE,
        ErrorCode.TRANSACTION_COORDINATOR_FENCED,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.INVALID_TRANSACTION_TIMEOUT,
        ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    }
)
ABORTABLE_CODES = frozenset(
    {
        ErrorCode.TRANSACTION_ABORTABLE,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.ILLEGAL_GENERATION,
        ErrorCode.FENCED_INSTANCE_ID,
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.OPERATION_NOT_ATTEMPTED,
    }
)
# Errors that, on the producer's side, fail the producer for good (any request, or Produce).
PRODUCE_FATAL_CODES = frozenset(
    {
        *FENCED_CODES,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.UNSUPPORTED_VERSION,
    }
)
# The coordinator lost the producer id: abortable if the epoch can be bumped (KIP-360).
BUMP_CODES = frozenset({ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.INVALID_PRODUCER_ID_MAPPING})


class TxnState(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING = "COMMITTING"
    ABORTING = "ABORTING"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


S = TxnState
# Where each state may be entered from (FATAL_ERROR from anywhere).
_ALLOWED: dict[TxnState, frozenset[TxnState]] = {
    S.READY: frozenset({S.UNINITIALIZED, S.COMMITTING, S.ABORTING}),
    S.IN_TRANSACTION: frozenset({S.READY}),
    S.COMMITTING: frozenset({S.IN_TRANSACTION}),
    S.ABORTING: frozenset({S.IN_TRANSACTION, S.ABORTABLE_ERROR}),
    S.ABORTABLE_ERROR: frozenset({S.IN_TRANSACTION, S.COMMITTING, S.ABORTABLE_ERROR}),
}
# States in which the sender may send the transaction's batches.
SENDING = frozenset({S.IN_TRANSACTION, S.COMMITTING})


class _Retry(Exception):
    """Internal: the request is to be sent again (``refind``: after a new coordinator lookup)."""

    def __init__(self, refind: bool, backoff_s: float | None = None) -> None:
        self.refind = refind
        self.backoff_s = backoff_s


def transaction_version(
    features: Mapping[str, int], api_versions: Mapping[int, tuple[int, int]]
) -> int:
    """2 when a broker offers transaction protocol v2 (KIP-890 part 2): ``transaction.version``
    finalized at 2 or more, EndTxn v5+ and Produce v12+; otherwise 1."""
    if features.get(TRANSACTION_VERSION_FEATURE, 0) < 2:
        return 1
    if api_versions.get(ApiKey.END_TXN, (0, -1))[1] < V2_MIN[ApiKey.END_TXN]:
        return 1
    if api_versions.get(ApiKey.PRODUCE, (0, -1))[1] < V2_MIN[ApiKey.PRODUCE]:
        return 1
    return 2


def _label(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"


class TransactionManager:
    """One transactional producer's transaction state (see the module docstring)."""

    def __init__(
        self,
        transactional_id: str,
        transaction_timeout_ms: int,
        cluster: ClusterClient,
        sender: Sender,
        *,
        on_state: Callable[[TxnState], Any] | None = None,
    ) -> None:
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.cluster = cluster
        self.sender = sender
        self.on_state = on_state
        self.state = TxnState.UNINITIALIZED
        self.last_error: BaseException | None = None
        self.version = 1  # the transaction protocol: 1, or 2 (KIP-890), chosen at init
        self.can_bump_epoch = False  # the coordinator takes InitProducerId v3+ (KIP-360)
        self.epoch_bump_required = False  # a batch failed after it got sequence numbers
        self.started = False  # something was registered with the coordinator: EndTxn needed
        self.added: set[TopicPartition] = set()  # registered partitions (v1)
        self.pending: set[TopicPartition] = set()  # in an AddPartitionsToTxn in flight
        self.new: set[TopicPartition] = set()  # found by the sender, to be registered
        self._txn_link = CoordinatorLink(cluster, transactional_id, TRANSACTION)
        self._group_links: dict[str, CoordinatorLink] = {}  # TxnOffsetCommit under v2
        self._add_task: asyncio.Task[None] | None = None

    # -- the state machine (no I/O) ---------------------------------------------------------------

    @property
    def v2(self) -> bool:
        return self.version >= 2

    def _transition(self, target: TxnState, error: BaseException | None = None) -> None:
        if target is not TxnState.FATAL_ERROR and self.state not in _ALLOWED[target]:
            raise TransactionStateError(
                f"transactional id {self.transactional_id!r}: cannot go from {self.state.value} "
                f"to {target.value}"
            )
        if target in (TxnState.FATAL_ERROR, TxnState.ABORTABLE_ERROR):
            self.last_error = error
        elif target is not TxnState.ABORTING:
            self.last_error = None
        if self.state is not target:
            log.debug(
                "transactional id %s: %s -> %s",
                self.transactional_id,
                self.state.value,
                target.value,
            )
        self.state = target
        if self.on_state is not None:
            self.on_state(target)

    def fatal(self, error: BaseException) -> None:
        if self.state is TxnState.FATAL_ERROR:
            return
        log.warning("transactional id %s: fatal error: %s", self.transactional_id, error)
        self._transition(TxnState.FATAL_ERROR, error)

    def abortable(self, error: BaseException) -> None:
        """A failure that fails this transaction, not the producer: abort_transaction recovers.
        Ignored while aborting (the transaction is being aborted anyway) and when fatal."""
        if self.state in (TxnState.ABORTING, TxnState.FATAL_ERROR):
            return
        if self.state in _ALLOWED[TxnState.ABORTABLE_ERROR]:
            log.info(
                "transactional id %s: transaction must abort: %s", self.transactional_id, error
            )
            self._transition(TxnState.ABORTABLE_ERROR, error)

    def fatal_error(self) -> BaseException:
        """A fresh exception for a call made after a fatal error, naming its cause."""
        cause = self.last_error
        what = (
            f"transactional id {self.transactional_id!r}: the producer failed for good "
            f"({cause}); close it"
        )
        if isinstance(cause, KafkaError):
            if cause.code in FENCED_CODES or isinstance(cause, ProducerFencedError):
                return ProducerFencedError(
                    f"transactional id {self.transactional_id!r}: fenced ({cause.name} from "
                    "the broker): a newer producer with the same transactional.id took over, "
                    "or the coordinator ended the transaction after transaction.timeout.ms; "
                    "close this producer"
                )
            return type(cause)(what)
        return TransactionStateError(what, cause, abortable=False)

    def _raise_if_failed(self, call: str) -> None:
        if self.state is TxnState.FATAL_ERROR:
            raise self.fatal_error()
        if self.state is TxnState.ABORTABLE_ERROR:
            raise TransactionStateError(
                f"{call}: the transaction failed ({self.last_error}); call abort_transaction()",
                self.last_error,
                abortable=True,
            )

    def check_can_send(self) -> None:
        """Raises unless records may be sent now (inside a transaction)."""
        if self.state is TxnState.IN_TRANSACTION:
            return
        self._raise_if_failed("send")
        if self.state is TxnState.UNINITIALIZED:
            raise TransactionStateError(
                "send: the producer has a transactional.id; call init_transactions() and "
                "begin_transaction() first"
            )
        raise TransactionStateError(
            f"send: a producer with a transactional.id sends only inside a transaction "
            f"(state {self.state.value}); call begin_transaction() first"
        )

    def check_initializable(self) -> None:
        if self.state is TxnState.FATAL_ERROR:
            raise self.fatal_error()
        if self.state is not TxnState.UNINITIALIZED:
            raise TransactionStateError(
                f"init_transactions() was already called (state {self.state.value})"
            )

    def begin(self) -> None:
        self._raise_if_failed("begin_transaction")
        if self.state is TxnState.UNINITIALIZED:
            raise TransactionStateError("begin_transaction: call init_transactions() first")
        if self.state is TxnState.IN_TRANSACTION:
            raise TransactionStateError("begin_transaction: a transaction is already open")
        if self.state in (TxnState.COMMITTING, TxnState.ABORTING):
            again = "commit" if self.state is TxnState.COMMITTING else "abort"
            raise TransactionStateError(
                f"begin_transaction: the previous transaction is still ending; call "
                f"{again}_transaction() again to finish it"
            )
        self._transition(TxnState.IN_TRANSACTION)

    def check_in_transaction(self, call: str) -> None:
        self._raise_if_failed(call)
        if self.state is not TxnState.IN_TRANSACTION:
            raise TransactionStateError(
                f"{call}: no transaction is open (state {self.state.value}); call "
                "begin_transaction() first"
            )

    def start_commit(self) -> None:
        """IN_TRANSACTION -> COMMITTING (or COMMITTING again: a commit that timed out goes on)."""
        if self.state is TxnState.COMMITTING:
            return
        self._raise_if_failed("commit_transaction")
        if self.state is not TxnState.IN_TRANSACTION:
            raise TransactionStateError(
                f"commit_transaction: no transaction is open (state {self.state.value})"
            )
        self._transition(TxnState.COMMITTING)

    def start_abort(self) -> None:
        """IN_TRANSACTION or ABORTABLE_ERROR -> ABORTING (or ABORTING again)."""
        if self.state is TxnState.ABORTING:
            return
        if self.state is TxnState.FATAL_ERROR:
            raise self.fatal_error()
        if self.state not in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR):
            raise TransactionStateError(
                f"abort_transaction: no transaction is open (state {self.state.value})"
            )
        self.new.clear()  # nothing more to register
        self._transition(TxnState.ABORTING)

    def complete(self) -> None:
        """The transaction ended (EndTxn answered, or there was nothing to end)."""
        self._transition(TxnState.READY)
        self.started = False
        self.epoch_bump_required = False
        self.added.clear()
        self.pending.clear()
        self.new.clear()

    def may_send(self, tp: TopicPartition) -> bool:
        """Whether the sender may take a batch of ``tp`` now. With protocol v1 an unregistered
        partition is noted for the next AddPartitionsToTxn and waits until it is registered."""
        if self.state not in SENDING:
            return False
        if self.v2:
            self.started = True  # the broker registers the partition with this Produce
            return True
        if tp in self.added:
            return True
        if tp not in self.pending:
            self.new.add(tp)
        return False

    def undrained_error(self) -> BaseException | None:
        """The error to fail waiting (unsent) batches with, when they may no longer be sent."""
        state = self.state
        if state in SENDING or state is TxnState.UNINITIALIZED:
            return None
        if state is TxnState.ABORTING:
            return TransactionAbortedError("the transaction was aborted before the record was sent")
        if state in (TxnState.ABORTABLE_ERROR, TxnState.FATAL_ERROR):
            return TransactionAbortedError(
                f"the transaction failed before the record was sent: {self.last_error}"
            )
        return TransactionAbortedError("the record was not sent inside a transaction")

    def batch_failed(self, error: BaseException, used_sequence: bool) -> None:
        """A batch of the transaction failed for good (the broker's error, or its delivery
        timeout): fencing and authorization errors are fatal, anything else fails the
        transaction (abortable). A batch that had sequence numbers leaves the partition's
        sequence unknown: the epoch must be bumped after the abort (protocol v1; v2's EndTxn
        bumps it anyway)."""
        if used_sequence:
            self.epoch_bump_required = True
        code = error.code if isinstance(error, KafkaError) else None
        if code == ErrorCode.INVALID_PRODUCER_EPOCH and (self.v2 or self.can_bump_epoch):
            # KIP-588, as Java's InvalidProducerEpochException: the coordinator bumped the
            # epoch (it aborted a transaction that ran past transaction.timeout.ms): the
            # transaction fails; abort_transaction recovers the producer.
            self.epoch_bump_required = True
            self.abortable(error)
        elif code in PRODUCE_FATAL_CODES:
            self.fatal(error)
        else:
            self.abortable(error)

    def batch_dropped(self, used_sequence: bool) -> None:
        """A batch failed because its transaction aborted (not an error of its own)."""
        if used_sequence:
            self.epoch_bump_required = True

    def take_new_partitions(self) -> list[TopicPartition]:
        tps = sorted(self.new)
        self.pending.update(tps)
        self.new.clear()
        return tps

    # -- requests ---------------------------------------------------------------------------------

    def _classify(self, call: str, codes: Iterable[int]) -> None:
        """Raise what the worst of ``codes`` means: _Retry, or the fatal/abortable error (after
        the state transition). Returns for no error."""
        codes = [c for c in codes if c]
        if not codes:
            return
        exceptions = {c: error_for_code(c) for c in codes}
        for code in codes:
            if code in FATAL_CODES:
                err = exceptions[code]
                assert err is not None
                err = err.with_message(f"{call}: {err.message}")
                self.fatal(err)
                raise self.fatal_error()
        if any(c in REFIND_CODES for c in codes):
            raise _Retry(refind=True)
        if any(c in BUMP_CODES for c in codes):
            code = next(c for c in codes if c in BUMP_CODES)
            err = exceptions[code]
            assert err is not None
            err = err.with_message(f"{call}: {err.message}")
            if self.can_bump_epoch:
                self.epoch_bump_required = True
                self.abortable(err)
                raise err
            self.fatal(err)
            raise self.fatal_error()
        others = [exceptions[c] for c in codes if c not in ABORTABLE_CODES]
        if others and all(e is not None and e.retriable for e in others):
            backoff = None
            if (
                ErrorCode.CONCURRENT_TRANSACTIONS in codes
                and call == "AddPartitionsToTxn"
                and not self.added
            ):
                backoff = CONCURRENT_TXN_BACKOFF_S  # the previous transaction is finishing
            raise _Retry(refind=False, backoff_s=backoff)
        picked = next((c for c in codes if c != ErrorCode.OPERATION_NOT_ATTEMPTED), codes[0])
        err = exceptions[picked]
        assert err is not None
        err = err.with_message(f"{call}: {err.message}")
        if picked in ABORTABLE_CODES:
            self.abortable(err)
            raise err
        self.fatal(err)  # an error Java does not expect either
        raise self.fatal_error()

    def _link(self, group: str | None) -> CoordinatorLink:
        """The transaction coordinator, or ``group``'s coordinator."""
        if group is None:
            return self._txn_link
        link = self._group_links.get(group)
        if link is None:
            link = self._group_links[group] = CoordinatorLink(self.cluster, group, GROUP)
        return link

    def _forget(self, group: str | None, why: str) -> None:
        self._link(group).mark_dead(why)

    async def _request(
        self,
        call: str,
        api_key: int,
        build: Callable[[int], Any],
        codes: Callable[[Any], Iterable[int]],
        *,
        group: str | None = None,
        alive: Callable[[], bool] | None = None,
        min_version: int | None = None,
        max_version: int | None = None,
    ) -> Any:
        """Send a request to the transaction coordinator (or ``group``'s coordinator) until an
        answer without a retriable error: NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE and lost
        connections look the coordinator up again; COORDINATOR_LOAD_IN_PROGRESS and
        CONCURRENT_TRANSACTIONS back off and retry on the same one. Runs until it succeeds,
        fails, or its caller's timeout cancels it; ``alive()`` false stops it."""
        attempt = 0
        while True:
            if alive is not None and not alive():
                raise KcoreError(f"{call}: no longer needed")
            attempt += 1
            try:
                link = self._link(group)
                version = await link.version(
                    api_key, min_version=min_version, max_version=max_version
                )
                response = await link.send(build(version), version)
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                self._forget(group, str(exc))
                log.debug("%s: %s; retrying", call, exc)
                await asyncio.sleep(self.cluster.retry_backoff.backoff_s(attempt - 1))
                continue
            except KafkaError as exc:  # from the coordinator lookup, or no common version
                if not exc.retriable:
                    self._classify(call, [exc.code])  # raises
                    raise
                self._forget(group, str(exc))
                await asyncio.sleep(self.cluster.retry_backoff.backoff_s(attempt - 1))
                continue
            try:
                self._classify(call, codes(response))
                return response
            except _Retry as retry:
                if retry.refind:
                    self._forget(group, "the coordinator moved")
                log.debug("%s: retrying (%s)", call, "refind" if retry.refind else "backoff")
                backoff = retry.backoff_s
                if backoff is None:
                    backoff = self.cluster.retry_backoff.backoff_s(attempt - 1)
                await asyncio.sleep(backoff)

    async def _init_producer_id(self, bump: bool) -> None:
        sender = self.sender

        def build(version: int) -> Any:
            request = InitProducerIdRequest(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self.transaction_timeout_ms,
            )
            if bump and version >= 3:
                request.producer_id = sender.producer_id
                request.producer_epoch = sender.producer_epoch
            return request

        response = await self._request(
            "InitProducerId", ApiKey.INIT_PRODUCER_ID, build, lambda r: [r.error_code]
        )
        sender.set_producer(response.producer_id, response.producer_epoch)
        log.info(
            "transactional id %s: producer id %s epoch %s",
            self.transactional_id,
            response.producer_id,
            response.producer_epoch,
        )

    async def initialize(self) -> None:
        """init_transactions: InitProducerId with the transactional id at its coordinator (which
        fences older producers of the id and finishes their open transaction), and the choice
        of transaction protocol from the coordinator's ApiVersions."""
        self.check_initializable()
        await self._init_producer_id(bump=False)
        conn = await self._txn_link.connection()
        self.version = transaction_version(conn.finalized_features, conn.api_versions)
        self.can_bump_epoch = conn.api_versions.get(ApiKey.INIT_PRODUCER_ID, (0, -1))[1] >= 3
        self.sender.configure_transactions(self.transactional_id, self.version)
        log.info(
            "transactional id %s: transaction protocol v%s", self.transactional_id, self.version
        )
        self._transition(TxnState.READY)

    def ensure_adding(self) -> None:
        """Start an AddPartitionsToTxn for the partitions the sender found, unless one is in
        flight (it picks up new ones when it is done). Called by the sender after a drain."""
        if not self.new or self.v2:
            return
        if self._add_task is not None and not self._add_task.done():
            return
        self._add_task = asyncio.get_running_loop().create_task(self._add_partitions())

    async def _add_partitions(self) -> None:
        try:
            while self.new and self.state in SENDING:
                tps = self.take_new_partitions()
                try:
                    await self._add(tps)
                finally:
                    self.pending.difference_update(tps)
        except KcoreError as exc:  # the state says what happened; batches wait or are failed
            log.debug("AddPartitionsToTxn: %s", exc)
        except Exception as exc:  # a bug: fail the transaction rather than leave it waiting
            log.exception("AddPartitionsToTxn")
            self.abortable(KcoreError(f"registering partitions failed: {exc!r}"))
        finally:
            self.sender.wakeup()

    async def _add(self, tps: list[TopicPartition]) -> None:
        sender = self.sender
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)

        def build(version: int) -> Any:
            return AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=self.transactional_id,
                v3_and_below_producer_id=sender.producer_id,
                v3_and_below_producer_epoch=sender.producer_epoch,
                v3_and_below_topics=[
                    AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in by_topic.items()
                ],
            )

        def codes(response: Any) -> list[int]:
            out = [response.error_code]
            for topic in response.results_by_topic_v3_and_below:
                out += [p.partition_error_code for p in topic.results_by_partition]
            return out

        await self._request(
            "AddPartitionsToTxn",
            ApiKey.ADD_PARTITIONS_TO_TXN,
            build,
            codes,
            alive=lambda: self.state in SENDING,
            max_version=V1_MAX[ApiKey.ADD_PARTITIONS_TO_TXN],
        )
        self.added.update(tps)
        self.started = True
        log.debug("added %s to the transaction", ", ".join(_label(tp) for tp in tps))

    async def send_offsets(
        self, offsets: Mapping[TopicPartition, int], group: ConsumerGroupMetadata
    ) -> None:
        """The consumed offsets of ``group``, committed with the transaction (KIP-98, KIP-447):
        v1 registers the group's offsets partition first (AddOffsetsToTxn); both then send
        TxnOffsetCommit to the group's coordinator."""
        self.check_in_transaction("send_offsets_to_transaction")
        sender = self.sender
        if not self.v2:

            def build_add(version: int) -> Any:
                return AddOffsetsToTxnRequest(
                    transactional_id=self.transactional_id,
                    producer_id=sender.producer_id,
                    producer_epoch=sender.producer_epoch,
                    group_id=group.group_id,
                )

            await self._request(
                f"AddOffsetsToTxn (group {group.group_id!r})",
                ApiKey.ADD_OFFSETS_TO_TXN,
                build_add,
                lambda r: [r.error_code],
            )
        self.started = True
        by_topic: dict[str, list[TxnOffsetCommitRequestPartition]] = {}
        for tp, offset in offsets.items():
            by_topic.setdefault(tp.topic, []).append(
                TxnOffsetCommitRequestPartition(
                    partition_index=tp.partition, committed_offset=offset
                )
            )

        def build_commit(version: int) -> Any:
            return TxnOffsetCommitRequest(
                transactional_id=self.transactional_id,
                group_id=group.group_id,
                producer_id=sender.producer_id,
                producer_epoch=sender.producer_epoch,
                generation_id=group.generation_id,
                member_id=group.member_id,
                group_instance_id=group.group_instance_id,
                topics=[
                    TxnOffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()
                ],
            )

        def codes(response: Any) -> list[int]:
            return [p.error_code for t in response.topics for p in t.partitions]

        await self._request(
            f"TxnOffsetCommit (group {group.group_id!r})",  # errors name the group, as Java's
            ApiKey.TXN_OFFSET_COMMIT,
            build_commit,
            codes,
            group=group.group_id,
            min_version=V2_MIN[ApiKey.TXN_OFFSET_COMMIT] if self.v2 else None,
            max_version=None if self.v2 else V1_MAX[ApiKey.TXN_OFFSET_COMMIT],
        )

    async def end(self, commit: bool) -> None:
        """EndTxn (when anything was registered), then READY. Protocol v2's EndTxn answer
        carries the epoch the coordinator bumped to. After an abort that left sequence numbers
        unknown (a batch failed after it was numbered) or that the coordinator could not place
        (UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_ID_MAPPING), and that no EndTxn bumped, the epoch
        is bumped with InitProducerId (KIP-360)."""
        sender = self.sender
        bumped = False
        # INVALID_PRODUCER_ID_MAPPING: the coordinator has no transaction to end (as Java:
        # straight to the epoch bump, which aborts whatever is left).
        lost = (
            isinstance(self.last_error, KafkaError)
            and self.last_error.code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        )
        if self.started and not (lost and not commit):

            def build(version: int) -> Any:
                return EndTxnRequest(
                    transactional_id=self.transactional_id,
                    producer_id=sender.producer_id,
                    producer_epoch=sender.producer_epoch,
                    committed=commit,
                )

            try:
                response = await self._request(
                    "EndTxn(commit)" if commit else "EndTxn(abort)",
                    ApiKey.END_TXN,
                    build,
                    lambda r: [r.error_code],
                    min_version=V2_MIN[ApiKey.END_TXN] if self.v2 else None,
                    max_version=None if self.v2 else V1_MAX[ApiKey.END_TXN],
                )
            except KafkaError as exc:
                if commit or exc.code not in BUMP_CODES or not self.can_bump_epoch:
                    raise
                self.epoch_bump_required = True  # an abort the coordinator cannot place
            else:
                if response.producer_id >= 0:  # v5: the epoch the coordinator bumped to
                    sender.set_producer(response.producer_id, response.producer_epoch)
                    bumped = True
        elif self.started:
            self.epoch_bump_required = True
        if not commit and self.epoch_bump_required and not bumped:
            if not self.can_bump_epoch:
                err = KcoreError(
                    "the aborted transaction left sequence numbers unknown and the coordinator "
                    "cannot bump the epoch (it needs InitProducerId v3+)"
                )
                self.fatal(err)
                raise self.fatal_error()
            await self._init_producer_id(bump=True)
        self.complete()
