"""The transactional producer's state machine (KIP-98), free of I/O: which calls are allowed
when, what the sender may send, and what a failure means for the transaction. The requests to
the coordinators that drive it are ``kcore.producer.transactions``; the sender asks it
``may_send(tp)`` before it takes a batch and tells it ``batch_failed``/``batch_dropped``.

States, as Java's TransactionManager: UNINITIALIZED -> READY (init_transactions) ->
IN_TRANSACTION (begin_transaction) -> COMMITTING / ABORTING -> READY. A failed produce (or
offset commit) inside a transaction makes it ABORTABLE_ERROR: commit raises, abort recovers.
Fencing (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH) and authorization failures of the
transactional id are FATAL_ERROR: every further transactional call raises.

With transaction protocol v1 a partition must be registered (AddPartitionsToTxn) before its
first batch: ``may_send`` notes an unregistered one, ``take_new_partitions`` hands the noted
ones to one request. With protocol v2 (KIP-890 part 2) the broker registers a partition on the
first Produce.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from kcore.errors import (
    ErrorCode,
    KafkaError,
    ProducerFencedError,
    TransactionAbortedError,
    TransactionStateError,
)
from kcore.types import TopicPartition

__all__ = ["TransactionStateMachine", "TxnState"]

log = logging.getLogger("kcore.producer.transactions")

# Error codes by what they mean for the transaction.
FENCED_CODES = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})
# Errors that, on the producer's side, fail the producer for good (any request, or Produce).
PRODUCE_FATAL_CODES = frozenset(
    {
        *FENCED_CODES,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.UNSUPPORTED_VERSION,
    }
)


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


def _label(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"


class TransactionStateMachine:
    """One transactional producer's transaction state (see the module docstring).
    ``on_state(state)`` is called after every transition."""

    def __init__(
        self,
        transactional_id: str,
        *,
        on_state: Callable[[TxnState], Any] | None = None,
    ) -> None:
        self.transactional_id = transactional_id
        self.on_state = on_state
        self.state = TxnState.UNINITIALIZED
        self.state_since = time.monotonic()  # when ``state`` was entered (statistics)
        self.last_error: BaseException | None = None
        self.version = 1  # the transaction protocol: 1, or 2 (KIP-890), chosen at init
        # The Produce versions the protocol allows (``version_for`` limits), chosen at init.
        self.produce_versions: dict[str, int] = {}
        self.can_bump_epoch = False  # the coordinator takes InitProducerId v3+ (KIP-360)
        self.epoch_bump_required = False  # a batch failed after it got sequence numbers
        self.started = False  # something was registered with the coordinator: EndTxn needed
        self.added: set[TopicPartition] = set()  # registered partitions (v1)
        self.pending: set[TopicPartition] = set()  # in an AddPartitionsToTxn in flight
        self.new: set[TopicPartition] = set()  # found by the sender, to be registered

    @property
    def v2(self) -> bool:
        return self.version >= 2

    @property
    def sending(self) -> bool:
        """Whether the transaction's batches may be sent (and partitions registered)."""
        return self.state in SENDING

    # -- transitions ------------------------------------------------------------------------------

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
            self.state_since = time.monotonic()
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

    def initialized(
        self, version: int, *, can_bump_epoch: bool, produce_versions: dict[str, int]
    ) -> None:
        """UNINITIALIZED -> READY: the producer has its id and epoch, and the coordinator's
        capabilities chose the transaction protocol."""
        self.version = version
        self.can_bump_epoch = can_bump_epoch
        self.produce_versions = produce_versions
        self._transition(TxnState.READY)

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

    # -- what the coordinator has of the transaction ----------------------------------------------

    def require_epoch_bump(self) -> None:
        """The transaction's end must leave the producer a new epoch (KIP-360)."""
        self.epoch_bump_required = True

    def producer_id_lost(self, error: BaseException) -> None:
        """The coordinator no longer knows the producer id (UNKNOWN_PRODUCER_ID,
        INVALID_PRODUCER_ID_MAPPING): abortable if the epoch can be bumped (the abort bumps
        it), else fatal."""
        if self.can_bump_epoch:
            self.epoch_bump_required = True
            self.abortable(error)
        else:
            self.fatal(error)

    def offsets_added(self) -> None:
        """A group's offsets joined the transaction: it needs an EndTxn."""
        self.started = True

    def take_new_partitions(self) -> list[TopicPartition]:
        """The partitions to register (v1) in one AddPartitionsToTxn, from now in flight."""
        tps = sorted(self.new)
        self.pending.update(tps)
        self.new.clear()
        return tps

    def partitions_added(self, tps: Iterable[TopicPartition]) -> None:
        """The coordinator registered ``tps``: their batches may go, and the transaction needs
        an EndTxn."""
        tps = list(tps)
        self.added.update(tps)
        self.started = True
        log.debug("added %s to the transaction", ", ".join(_label(tp) for tp in tps))

    def adding_ended(self, tps: Iterable[TopicPartition]) -> None:
        """The AddPartitionsToTxn for ``tps`` is no longer in flight (answered or not)."""
        self.pending.difference_update(tps)

    # -- what the sender asks and tells -----------------------------------------------------------

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
