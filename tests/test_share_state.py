"""The share consumer's state machines, free of I/O: ShareGroupHeartbeat membership (join,
assignment, fencing, coordinator moves, authorization), share session epochs and the
acknowledgement book-keeping. Answers are the generated protocol messages, as the broker's
would decode; the end-to-end behaviour is tested against a real broker in
test_share_consumer.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kcore.consumer.share.acknowledgements import (
    GAP,
    Acknowledgements,
    AcknowledgeType,
    ShareRecord,
    ack_batches,
)
from kcore.consumer.share.fetcher import INT32_MAX, ShareSession
from kcore.consumer.share.membership import Outcome, ShareMembership
from kcore.errors import AcknowledgementError, ErrorCode, GroupAuthorizationFailedError
from kcore.protocol.messages.share_fetch_request import AcknowledgementBatch
from kcore.protocol.messages.share_group_heartbeat_response import (
    Assignment,
    ShareGroupHeartbeatResponse,
    TopicPartitions,
)
from kcore.types import TopicPartition

TOPIC_ID = uuid.uuid4()


def answer(code: int = ErrorCode.NONE, epoch: int = 1, parts: list[int] | None = None) -> Any:
    assignment = None
    if parts is not None:
        assignment = Assignment(
            topic_partitions=[TopicPartitions(topic_id=TOPIC_ID, partitions=parts)]
        )
    return ShareGroupHeartbeatResponse(
        error_code=code,
        member_epoch=epoch,
        heartbeat_interval_ms=1000,
        assignment=assignment,
    )


def test_membership_joins_then_heartbeats_without_repeating_the_subscription() -> None:
    m = ShareMembership("g")
    m.subscribe(["b", "a", "a"])
    join = m.request()
    assert (join.member_epoch, join.subscribed_topic_names) == (0, ["a", "b"])
    assert join.member_id == m.member_id and len(m.member_id) == 22  # a Uuid, base64
    assert m.on_response(join, answer(epoch=3, parts=[0, 1])) is Outcome.JOINED
    assert m.joined and m.epoch == 3 and m.interval_s == 1.0
    assert m.assigned_ids == [(TOPIC_ID, [0, 1])]
    beat = m.request()
    assert (beat.member_epoch, beat.subscribed_topic_names) == (3, None)
    # No assignment in an answer: the last one stands.
    assert m.on_response(beat, answer(epoch=3)) is Outcome.JOINED
    assert m.assigned_ids == [(TOPIC_ID, [0, 1])]
    m.subscribe(["a", "c"])
    assert m.request().subscribed_topic_names == ["a", "c"]
    leave = m.leave_request()
    assert (leave.member_epoch, leave.member_id) == (-1, m.member_id)


@pytest.mark.parametrize("code", [ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID])
def test_membership_fenced_rejoins_with_epoch_0_and_the_same_member_id(code: int) -> None:
    m = ShareMembership("g")
    m.subscribe(["a"])
    m.on_response(m.request(), answer(epoch=5, parts=[0]))
    member_id = m.member_id
    assert m.on_response(m.request(), answer(code)) is Outcome.REJOIN
    assert m.epoch == 0 and m.assigned_ids == [] and m.member_id == member_id
    rejoin = m.request()
    assert (rejoin.member_epoch, rejoin.subscribed_topic_names) == (0, ["a"])


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (ErrorCode.NOT_COORDINATOR, Outcome.REDISCOVER),
        (ErrorCode.COORDINATOR_NOT_AVAILABLE, Outcome.REDISCOVER),
        (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, Outcome.RETRY),
        (ErrorCode.GROUP_AUTHORIZATION_FAILED, Outcome.FATAL),
        (ErrorCode.GROUP_MAX_SIZE_REACHED, Outcome.FATAL),
        (ErrorCode.INVALID_REQUEST, Outcome.FATAL),
    ],
)
def test_membership_errors(code: int, outcome: Outcome) -> None:
    m = ShareMembership("g1")
    m.subscribe(["a"])
    assert m.on_response(m.request(), answer(code)) is outcome
    assert (m.fatal is not None) == (outcome is Outcome.FATAL)
    if code == ErrorCode.GROUP_AUTHORIZATION_FAILED:
        assert isinstance(m.fatal, GroupAuthorizationFailedError)
        assert "'g1'" in str(m.fatal)


def test_session_epochs_open_move_on_and_wrap() -> None:
    s = ShareSession()
    assert not s.open and s.epoch == 0
    s.advance()
    assert s.open and s.epoch == 1
    s.epoch = INT32_MAX
    s.advance()
    assert s.epoch == 1  # never back to 0, which would open a new session
    s.partitions.add(TopicPartition("a", 0))
    s.reset()
    assert (s.epoch, s.partitions) == (0, set())


def test_ack_batches_merge_runs_of_offsets() -> None:
    acks = {5: 1, 6: 1, 7: 1, 9: 2, 10: 3, 12: GAP}
    got = [
        (b.first_offset, b.last_offset, b.acknowledge_types)
        for b in ack_batches(acks, AcknowledgementBatch)
    ]
    assert got == [(5, 7, [1]), (9, 10, [2, 3]), (12, 12, [0])]


def record(offset: int) -> ShareRecord:
    return ShareRecord("t", 0, offset, 0, None, b"v", (), 1)


def test_acknowledgements_once_per_delivery() -> None:
    acks = Acknowledgements()
    tp = TopicPartition("t", 0)
    acks.delivered([record(1), record(2), record(3)])
    acks.acknowledge(tp, 1, AcknowledgeType.ACCEPT)
    with pytest.raises(AcknowledgementError, match="already"):
        acks.acknowledge(tp, 1, AcknowledgeType.REJECT)
    with pytest.raises(AcknowledgementError, match="not delivered"):
        acks.acknowledge(tp, 99, AcknowledgeType.ACCEPT)
    # RENEW keeps the record this consumer's: a later acknowledgement replaces it, or, once
    # the renewal went out, ends the delivery.
    acks.acknowledge(tp, 2, AcknowledgeType.RENEW)
    acks.acknowledge(tp, 2, AcknowledgeType.REJECT)
    acks.acknowledge(tp, 3, AcknowledgeType.RENEW)
    sent = acks.take([tp])
    assert sent == {tp: {1: 1, 2: 3, 3: 4}}
    with pytest.raises(AcknowledgementError, match="RENEW"):
        acks.acknowledge(tp, 3, AcknowledgeType.ACCEPT)
    acks.sent(sent)
    assert acks.unacknowledged() == 1
    acks.acknowledge(tp, 3, AcknowledgeType.ACCEPT)
    assert acks.take([tp]) == {tp: {3: 1}}
    acks.delivered([record(4)])
    acks.settle_all(AcknowledgeType.ACCEPT)
    assert acks.unacknowledged() == 0 and acks.take([tp]) == {tp: {4: 1}}


def test_acknowledge_many_is_all_or_nothing() -> None:
    acks = Acknowledgements()
    tp = TopicPartition("t", 0)
    acks.delivered([record(1), record(2), record(3)])
    acks.acknowledge(tp, 1, AcknowledgeType.ACCEPT)
    with pytest.raises(AcknowledgementError, match="already"):
        acks.acknowledge_many([(tp, 1), (tp, 2), (tp, 3)], AcknowledgeType.RELEASE)
    assert acks.unacknowledged() == 2  # nothing of the refused lot was taken
    with pytest.raises(AcknowledgementError, match="twice"):
        acks.acknowledge_many([(tp, 2), (tp, 2)], AcknowledgeType.RELEASE)
    acks.acknowledge_many([(tp, 2), (tp, 3)], AcknowledgeType.RENEW)  # one by one
    acks.sent(acks.take([tp]))
    acks.acknowledge_many([(tp, 2), (tp, 3)], AcknowledgeType.RELEASE)
    assert acks.unacknowledged() == 0
    assert acks.take([tp]) == {tp: {2: 2, 3: 2}}


def test_records_to_arrow_columns() -> None:
    import pyarrow as pa

    from kcore.consumer.share.arrow import ARROW_COLUMNS, batch_positions, records_to_arrow

    rows = [
        ShareRecord("t", 1, 7, 1000, b"k", None, (("h", b"x"), ("n", None)), 2, 1),
        record(8),
    ]
    batch = records_to_arrow(rows)
    assert batch.schema.names == list(ARROW_COLUMNS)
    assert batch.schema.field("timestamp").type == pa.timestamp("ms", tz="UTC")
    got = batch.to_pylist()
    assert got[0]["headers"] == [{"key": "h", "value": b"x"}, {"key": "n", "value": None}]
    assert [r["delivery_count"] for r in got] == [2, 1]
    assert [r["timestampType"] for r in got] == [1, 0]
    assert [r["value"] for r in got] == [None, b"v"]
    assert batch_positions(batch) == [(TopicPartition("t", 1), 7), (TopicPartition("t", 0), 8)]
    assert records_to_arrow([]).num_rows == 0
