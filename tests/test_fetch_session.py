"""The fetch session's state machine (KIP-227) and the fetcher's batch-header reading, without
sockets: what a request names, forgets and carries as session id and epoch."""

from __future__ import annotations

from kcore.codec import RecordBatchBuilder
from kcore.consumer.fetch_session import FetchSession, PartitionFetch
from kcore.consumer.fetcher import _complete_end, _first_batch_size
from kcore.types import TopicPartition

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
V = 16  # a Fetch version with sessions


def fetch(offset: int, epoch: int = 0, size: int = 1 << 20) -> PartitionFetch:
    return PartitionFetch(offset, epoch, size)


def test_first_request_is_full_and_asks_for_a_session() -> None:
    s = FetchSession(1)
    plan = s.plan({A0: fetch(0), A1: fetch(5)}, V)
    assert (plan.session_id, plan.epoch, plan.full) == (0, 0, True)
    assert plan.send == {A0: fetch(0), A1: fetch(5)} and plan.forget == []
    assert s.on_response(0, 77)
    assert (s.session_id, s.epoch) == (77, 1)


def test_incremental_requests_name_only_changes_and_forget_the_rest() -> None:
    s = FetchSession(1)
    s.plan({A0: fetch(0), A1: fetch(5), B0: fetch(9)}, V)
    s.on_response(0, 77)
    # A0 moved on, A1 unchanged, B0 no longer wanted (its data waits in the queue)
    plan = s.plan({A0: fetch(100), A1: fetch(5)}, V)
    assert (plan.session_id, plan.epoch, plan.full) == (77, 1, False)
    assert plan.send == {A0: fetch(100)} and plan.forget == [B0]
    assert s.on_response(0, 77)
    assert s.epoch == 2
    # a grown size limit or a new leader epoch is a change too
    plan = s.plan({A0: fetch(100, size=4 << 20), A1: fetch(5, epoch=3), B0: fetch(20)}, V)
    assert plan.send == {A0: fetch(100, size=4 << 20), A1: fetch(5, epoch=3), B0: fetch(20)}
    assert plan.forget == []
    s.on_response(0, 77)
    # nothing changed: an empty incremental request (the broker still answers with new data)
    plan = s.plan({A0: fetch(100, size=4 << 20), A1: fetch(5, epoch=3), B0: fetch(20)}, V)
    assert plan.send == {} and plan.forget == [] and plan.epoch == 3


def test_session_errors_and_failures_start_over_with_a_full_request() -> None:
    for error in (70, 71):  # FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH
        s = FetchSession(1)
        s.plan({A0: fetch(0)}, V)
        s.on_response(0, 77)
        s.plan({A0: fetch(10)}, V)
        assert not s.on_response(error, 0)
        plan = s.plan({A0: fetch(10)}, V)
        assert (plan.session_id, plan.epoch, plan.full) == (0, 0, True)
        assert plan.send == {A0: fetch(10)}
    s = FetchSession(1)
    s.plan({A0: fetch(0)}, V)
    s.on_response(0, 77)
    s.plan({A0: fetch(10)}, V)
    s.on_failure()  # e.g. the request timed out: the broker's view is unknown
    plan = s.plan({A0: fetch(10), A1: fetch(0)}, V)
    assert plan.full and plan.send == {A0: fetch(10), A1: fetch(0)}


def test_broker_without_room_for_a_session_and_old_versions() -> None:
    s = FetchSession(1)
    s.plan({A0: fetch(0)}, V)
    assert s.on_response(0, 0)  # no session created: keep sending full requests
    plan = s.plan({A0: fetch(10)}, V)
    assert (plan.session_id, plan.epoch, plan.full) == (0, 0, True)
    old = FetchSession(2).plan({A0: fetch(0)}, 6)  # before Fetch v7: no sessions at all
    assert (old.session_id, old.epoch, old.full) == (0, -1, True)


def test_epoch_wraps_to_one() -> None:
    s = FetchSession(1, session_id=5, epoch=2**31 - 1)
    s.plan({}, V)
    s.on_response(0, 5)
    assert s.epoch == 1


def _batch(base: int, n: int, value_size: int = 50) -> bytes:
    b = RecordBatchBuilder("none", base_offset=base)
    for i in range(n):
        b.append(None, b"v" * value_size, 1000 + i)
    return b.build()


def test_batch_headers_give_the_end_of_complete_batches() -> None:
    one, two = _batch(10, 5), _batch(15, 7)
    assert _complete_end(one + two) == (22, len(one) + len(two))
    # a trailing partial batch is not counted; the size of a partial first batch is known
    assert _complete_end(one + two[:30]) == (15, len(one))
    assert _complete_end(two[:30]) == (-1, 0)
    assert _first_batch_size(two[:30]) == len(two)
    assert _complete_end(b"") == (-1, 0)


def test_batch_headers_of_legacy_messages() -> None:
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    for magic in (0, 1):
        builder = LegacyRecordBatchBuilder(magic, 0, 1 << 20)
        for i in range(3):
            builder.append(i, 1000 if magic else None, None, b"value %d" % i)
        buf = bytes(builder.build())
        # each message is its own entry; the next offset follows the last one
        assert _complete_end(buf)[0] == 3 and _complete_end(buf)[1] == len(buf)


def test_batch_headers_at_the_int64_limits_are_scanned_in_python() -> None:
    """The codec's header scan leaves offsets it cannot add to in int64 to the Python scan,
    which gives what Python's ints give (a hostile broker's garbage, never a crash)."""
    import struct

    from kcore.codec import scan_complete_batches

    top = bytearray(_batch(0, 3))
    struct.pack_into(">q", top, 0, 2**63 - 2)
    epochs: list[tuple[int, int]] = []
    assert scan_complete_batches(bytes(top)) is None
    first = _batch(0, 1)
    assert _complete_end(first + bytes(top), epochs) == (2**63 + 1, len(first) + len(top))
    assert epochs[-1][0] == 2**63
