"""The transactional producer's state machine (kcore.producer.txn_state) and the idempotent
producer's numbering (kcore.producer.idempotence) on their own: no broker, no event loop."""

from __future__ import annotations

import pytest

from kcore.errors import (
    InvalidProducerEpochError,
    KcoreError,
    MessageTooLargeError,
    ProducerFencedError,
    TopicAuthorizationFailedError,
    TransactionAbortedError,
    TransactionStateError,
    UnknownProducerIdError,
)
from kcore.producer.idempotence import IdempotenceState
from kcore.producer.txn_state import TransactionStateMachine, TxnState
from kcore.types import TopicPartition

S = TxnState
TP, TP2 = TopicPartition("t", 0), TopicPartition("t", 1)


def machine(version: int = 1, *, can_bump_epoch: bool = True) -> TransactionStateMachine:
    """A machine past init_transactions (READY), recording its transitions in ``seen``."""
    seen: list[TxnState] = []
    m = TransactionStateMachine("t-1", on_state=seen.append)
    m.seen = seen  # type: ignore[attr-defined]
    m.initialized(version, can_bump_epoch=can_bump_epoch, produce_versions={"max_version": 11})
    return m


def test_the_happy_path_and_the_states_it_passes() -> None:
    m = machine()
    assert m.state is S.READY and m.produce_versions == {"max_version": 11}
    m.begin()
    m.start_commit()
    m.start_commit()  # a commit that timed out goes on (no transition)
    m.complete()
    m.begin()
    m.start_abort()
    m.complete()
    assert m.seen == [  # type: ignore[attr-defined]
        S.READY,
        S.IN_TRANSACTION,
        S.COMMITTING,
        S.READY,
        S.IN_TRANSACTION,
        S.ABORTING,
        S.READY,
    ]


def test_calls_out_of_order_raise_and_change_nothing() -> None:
    fresh = TransactionStateMachine("t-1")
    with pytest.raises(TransactionStateError, match="init_transactions"):
        fresh.begin()
    with pytest.raises(TransactionStateError, match="init_transactions"):
        fresh.check_can_send()
    assert fresh.state is S.UNINITIALIZED
    m = machine()
    with pytest.raises(TransactionStateError, match="already called"):
        m.check_initializable()
    for call in (m.start_commit, m.start_abort, m.check_can_send):
        with pytest.raises(TransactionStateError):
            call()
    with pytest.raises(TransactionStateError, match="no transaction is open"):
        m.check_in_transaction("send_offsets_to_transaction")
    m.begin()
    with pytest.raises(TransactionStateError, match="already open"):
        m.begin()
    m.start_commit()
    with pytest.raises(TransactionStateError, match="commit_transaction"):
        m.begin()  # the previous transaction is still ending
    assert m.state is S.COMMITTING


def test_what_waiting_batches_fail_with_in_each_state() -> None:
    m = TransactionStateMachine("t-1")
    assert m.undrained_error() is None  # UNINITIALIZED: nothing is sent yet anyway
    m.initialized(1, can_bump_epoch=True, produce_versions={})
    assert isinstance(m.undrained_error(), TransactionAbortedError)  # outside a transaction
    m.begin()
    assert m.undrained_error() is None and m.sending
    m.start_abort()
    assert "aborted before" in str(m.undrained_error()) and not m.sending


def test_a_failed_batch_fails_the_transaction_not_the_producer() -> None:
    m = machine()
    m.begin()
    m.batch_failed(MessageTooLargeError("too big"), used_sequence=True)
    assert m.state is S.ABORTABLE_ERROR and m.epoch_bump_required
    with pytest.raises(TransactionStateError) as raised:
        m.check_can_send()
    assert raised.value.abortable and isinstance(raised.value.cause, MessageTooLargeError)
    assert "too big" in str(m.undrained_error())
    m.start_abort()
    m.batch_failed(KcoreError("in flight"), used_sequence=False)  # ignored while aborting
    assert m.state is S.ABORTING
    m.complete()
    assert m.state is S.READY and not m.epoch_bump_required and m.last_error is None


def test_a_batch_dropped_by_the_abort_asks_for_an_epoch_bump_only_if_it_was_numbered() -> None:
    m = machine()
    m.begin()
    m.start_abort()
    m.batch_dropped(used_sequence=False)
    assert not m.epoch_bump_required
    m.batch_dropped(used_sequence=True)
    assert m.epoch_bump_required and m.state is S.ABORTING


@pytest.mark.parametrize(
    "version,can_bump,fatal", [(2, False, False), (1, True, False), (1, False, True)]
)
def test_invalid_producer_epoch_from_produce_is_abortable_when_the_epoch_can_be_bumped(
    version: int, can_bump: bool, fatal: bool
) -> None:
    """KIP-588: the coordinator aborted the transaction after transaction.timeout.ms and bumped
    the epoch; only a producer that cannot bump it (v1 without InitProducerId v3) is fenced."""
    m = machine(version, can_bump_epoch=can_bump)
    m.begin()
    m.batch_failed(InvalidProducerEpochError("epoch"), used_sequence=False)
    assert m.state is (S.FATAL_ERROR if fatal else S.ABORTABLE_ERROR)
    if fatal:
        with pytest.raises(ProducerFencedError, match="t-1"):
            m.start_abort()
    else:
        assert m.epoch_bump_required
        m.start_abort()


def test_fatal_errors_make_every_later_call_raise_naming_the_cause() -> None:
    m = machine()
    m.begin()
    m.batch_failed(TopicAuthorizationFailedError("no"), used_sequence=False)
    assert m.state is S.ABORTABLE_ERROR  # abortable
    m.fatal(ProducerFencedError("fenced"))
    m.abortable(KcoreError("later"))  # ignored once fatal
    assert m.state is S.FATAL_ERROR
    for call in (m.begin, m.check_can_send, m.start_abort, m.start_commit, m.check_initializable):
        with pytest.raises(ProducerFencedError, match="t-1"):
            call()
    other = machine()
    other.fatal(KcoreError("a bug"))
    with pytest.raises(TransactionStateError, match="failed for good") as raised:
        other.begin()
    assert not raised.value.abortable


def test_a_lost_producer_id_is_abortable_only_if_the_epoch_can_be_bumped() -> None:
    for can_bump in (True, False):
        m = machine(can_bump_epoch=can_bump)
        m.begin()
        m.producer_id_lost(UnknownProducerIdError("lost"))
        assert m.state is (S.ABORTABLE_ERROR if can_bump else S.FATAL_ERROR)
        assert m.epoch_bump_required is can_bump


def test_v1_partitions_wait_for_registration_v2_do_not() -> None:
    v1 = machine(version=1)
    assert not v1.may_send(TP)  # READY: nothing is sent outside a transaction
    v1.begin()
    assert not v1.may_send(TP) and not v1.may_send(TP2) and v1.new == {TP, TP2}
    assert v1.take_new_partitions() == [TP, TP2] and v1.pending == {TP, TP2}
    assert not v1.may_send(TP) and not v1.new  # in flight: not asked for twice
    assert not v1.started
    v1.partitions_added([TP])
    v1.adding_ended([TP, TP2])  # TP2's request failed: asked for again at the next drain
    assert v1.may_send(TP) and v1.started
    assert not v1.may_send(TP2) and v1.new == {TP2}
    v1.start_abort()
    assert not v1.new  # nothing more to register
    v1.complete()
    assert not (v1.added or v1.pending or v1.started)
    v2 = machine(version=2)
    v2.begin()
    assert v2.may_send(TP) and v2.started and not v2.new


def test_offsets_alone_need_an_end_txn() -> None:
    m = machine()
    m.begin()
    assert not m.started
    m.offsets_added()
    assert m.started


def test_idempotence_numbers_per_partition_and_restarts_at_a_new_epoch() -> None:
    ids = IdempotenceState()
    ids.reset(7, 0)
    assert [ids.take_sequence(TP, 3), ids.take_sequence(TP, 2), ids.take_sequence(TP2, 1)] == [
        0,
        3,
        0,
    ]
    ids.sent(TP, 1.0, ids.producer)
    ids.written(TP, (7, 0))
    assert ids.has_written(TP) and not ids.has_written(TP2)
    ids.written(TP2, (6, 0))  # an older producer's batch: says nothing of this one
    assert not ids.has_written(TP2)
    ids.sequence_broke(TP)
    ids.reset(7, 1)
    assert ids.producer == (7, 1) and ids.take_sequence(TP, 1) == 0
    assert not ids.has_written(TP)
    assert ids.older_epoch_in_flight(TP) and not ids.earlier_in_flight(TP, 0.5)
    assert ids.earlier_in_flight(TP, 2.0) and ids.in_flight_producer(TP, 1.0) == (7, 0)
    ids.landed(TP, 1.0)
    assert not ids.older_epoch_in_flight(TP) and ids.in_flight_producer(TP, 1.0) is None
    assert ids.take_broken() == {TP} and ids.take_broken() == set()


def test_sequences_wrap_at_int32() -> None:
    ids = IdempotenceState()
    ids.reset(1, 0)
    ids.take_sequence(TP, 2**31 - 2)
    assert ids.take_sequence(TP, 5) == 2**31 - 2
    assert ids.take_sequence(TP, 1) == 3
