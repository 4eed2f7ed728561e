"""The share consumer's state machines, free of I/O: ShareGroupHeartbeat membership (join,
assignment, fencing, coordinator moves, authorization), share session epochs and the
acknowledgement book-keeping. Answers are the generated protocol messages, as the broker's
would decode; the end-to-end behaviour is tested against a real broker in
test_share_consumer.py."""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

import pytest

from kcore.consumer.share.acknowledgements import (
    GAP,
    Acknowledgements,
    AcknowledgeType,
    OffsetSpans,
    ShareRecord,
)
from kcore.consumer.share.fetcher import INT32_MAX, ShareSession
from kcore.consumer.share.membership import Outcome, ShareMembership
from kcore.consumer.share.sizing import MAX_POLLS_A_FETCH, FetchSizing
from kcore.errors import (
    AcknowledgementError,
    ErrorCode,
    GroupAuthorizationFailedError,
    KcoreError,
)
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
        for b in spans_of(acks).batches(AcknowledgementBatch)
    ]
    assert got == [(5, 7, [1]), (9, 10, [2, 3]), (12, 12, [0])]
    mixed = spans_of({1: 1, 2: 1, 3: 2, 4: 1, 6: 4, 7: 4})
    got = [
        (b.first_offset, b.last_offset, b.acknowledge_types)
        for b in mixed.batches(AcknowledgementBatch)
    ]
    assert got == [(1, 4, [1, 1, 2, 1]), (6, 7, [4])]


def record(offset: int, tp: tuple[str, int] = ("t", 0)) -> ShareRecord:
    return ShareRecord(tp[0], tp[1], offset, 0, None, b"v", (), 1)


def test_acknowledgements_once_per_delivery() -> None:
    acks = Acknowledgements()
    tp = TopicPartition("t", 0)
    acks.delivered([(tp, [record(1), record(2), record(3)])])
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
    acks.delivered([(tp, [record(4)])])
    acks.settle_all(AcknowledgeType.ACCEPT)
    assert acks.unacknowledged() == 0 and acks.take([tp]) == {tp: {4: 1}}


def test_whole_polls_settle_as_the_offset_sets_do() -> None:
    """Implicit mode keeps a poll's runs as they came; settling them (ACCEPT at the next poll,
    RELEASE at close) leaves the same pending acknowledgements as the sets of offsets do, gaps
    and several partitions and polls included; forget drops them."""
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    polls = [
        [(a, [record(1), record(2), record(4)]), (b, [record(7, ("t", 1))])],
        [(a, [record(5), record(6)])],
    ]
    outcomes = []
    for whole in (False, True):
        acks = Acknowledgements(whole_polls=whole)
        acks.add(a, [3], GAP)
        for runs in polls:
            acks.delivered(runs)
        assert acks.unacknowledged() == 6
        acks.settle_all(AcknowledgeType.ACCEPT)
        assert acks.unacknowledged() == 0
        acks.delivered([(b, [record(8, ("t", 1))])])
        acks.settle_all(AcknowledgeType.RELEASE)
        outcomes.append(acks.take([a, b]))
        acks.delivered([(a, [record(9)])])
        acks.forget()
        assert acks.unacknowledged() == 0 and not acks.has_pending()
    assert (
        outcomes[0]
        == outcomes[1]
        == {
            a: {3: GAP, 1: 1, 2: 1, 4: 1, 5: 1, 6: 1},
            b: {7: 1, 8: 2},
        }
    )


def _explicit_core(**extra: Any) -> Any:
    from kcore.consumer.share.core import ShareConsumerCore

    return ShareConsumerCore(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "group.id": "g",
            "share.acknowledgement.mode": "explicit",
            **extra,
        }
    )


def _outcome(call: Any, *args: Any) -> str:
    try:
        call(*args)
    except Exception as exc:  # the outcome compared, whatever it is
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_the_compiled_acknowledge_does_what_the_checked_one_does() -> None:
    """Random acknowledgements (types as enums, ints and wrong values; records delivered or
    not, twice, renewed, of another kind) given to the compiled path of one core and to the
    checked Python path of another: the same outcome each time, the same state after."""
    rng = random.Random(7)
    compiled, checked = _explicit_core(), _explicit_core()
    fast = compiled.record_acknowledger.acknowledge
    tps = [TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)]
    kinds: list[Any] = [*AcknowledgeType, 1, 2, 3, 4, 0, 5, None, "ACCEPT", True]
    next_offset = 0
    for step in range(3000):
        roll = rng.random()
        if roll < 0.05:
            tp = rng.choice(tps)
            records = [record(next_offset + i, tp) for i in range(rng.randint(1, 5))]
            next_offset += len(records)
            for core in (compiled, checked):
                core.acks.delivered([(tp, records)])
            continue
        if roll < 0.08:
            for core in (compiled, checked):
                core.acks.sent(core.acks.take(tps))
            continue
        tp = rng.choice(tps)
        offset = rng.randrange(max(next_offset, 1))
        r: Any = record(offset, tp)
        if roll < 0.1:
            r = tuple(r)  # not a ShareRecord
        elif roll < 0.12:  # an offset no poll hands out: beyond 64 bits, negative, not an int
            r = r._replace(offset=rng.choice([2**70, -(2**70), -1, "7", 7.0]))
        kind = rng.choice(kinds)
        if rng.random() < 0.1:  # no type given: ACCEPT
            got, want = _outcome(fast, r), _outcome(checked.acknowledge, r, AcknowledgeType.ACCEPT)
        else:
            got, want = _outcome(fast, r, kind), _outcome(checked.acknowledge, r, kind)
        assert got == want, f"step {step}: compiled {got!r}, checked {want!r}"
        assert compiled.acks.unacknowledged() == checked.acks.unacknowledged()
        assert compiled.acks.pending_partitions() == checked.acks.pending_partitions()
    assert compiled.acks.take(tps) == checked.acks.take(tps)


def test_the_compiled_acknowledge_defaults_to_accept_and_refuses_once_closed() -> None:
    core = _explicit_core()
    tp = TopicPartition("t", 0)
    core.acks.delivered([(tp, [record(1), record(2), record(3)])])
    fast = core.record_acknowledger.acknowledge
    fast(record(1))
    fast(record(2), type=AcknowledgeType.REJECT)
    core.mark_closed()
    with pytest.raises(KcoreError, match="closed"):
        fast(record(3))
    assert core.acks.take([tp]) == {tp: {1: 1, 2: 3}}
    implicit = _explicit_core(**{"share.acknowledgement.mode": "implicit"})
    implicit.acks.delivered([(tp, [record(1)])])
    with pytest.raises(AcknowledgementError, match="explicit"):
        implicit.record_acknowledger.acknowledge(record(1))


def test_the_compiled_acknowledge_waits_for_a_held_lock() -> None:
    """While the event loop holds the state's lock, an acknowledge waits for it (the checked
    path, the GIL released meanwhile) rather than changing the state under it."""
    core = _explicit_core()
    tp = TopicPartition("t", 0)
    core.acks.delivered([(tp, [record(1)])])
    done = threading.Event()

    def acknowledge() -> None:
        core.record_acknowledger.acknowledge(record(1))
        done.set()

    with core.acks._lock:
        thread = threading.Thread(target=acknowledge)
        thread.start()
        assert not done.wait(0.2)
        assert not core.acks._pending  # (the state read as the lock's holder)
    thread.join(5)
    assert done.is_set() and core.acks.take([tp]) == {tp: {1: 1}}


def test_batch_offsets_by_partition_in_row_order() -> None:
    import pyarrow as pa

    from kcore.consumer.share.arrow import batch_offsets

    def batch(topics: list[Any], partitions: list[Any], offsets: list[Any], **types: Any) -> Any:
        return pa.record_batch(
            [
                pa.array(topics, pa.string()),
                pa.array(partitions, types.get("partition", pa.int32())),
                pa.array(offsets, types.get("offset", pa.int64())),
            ],
            names=["topic", "partition", "offset"],
        )

    one = batch(["t"] * 4, [1] * 4, [7, 5, 6, 9])
    assert batch_offsets(one) == {TopicPartition("t", 1): [7, 5, 6, 9]}
    assert batch_offsets(one.slice(1, 2)) == {TopicPartition("t", 1): [5, 6]}
    assert batch_offsets(one.slice(4)) == {}
    # The same partition number in two topics, and two partitions of one topic.
    mixed = batch(["t", "u", "t", "t", "u"], [1, 1, 1, 2, 1], [3, 4, 5, 6, 7])
    assert batch_offsets(mixed) == {
        TopicPartition("t", 1): [3, 5],
        TopicPartition("u", 1): [4, 7],
        TopicPartition("t", 2): [6],
    }
    table = pa.Table.from_batches([one.slice(0, 2), one.slice(2)])  # chunked columns
    assert batch_offsets(table) == {TopicPartition("t", 1): [7, 5, 6, 9]}
    with pytest.raises(KcoreError, match="no topic, partition or offset"):
        batch_offsets(batch(["t", None], [1, 1], [1, 2]))
    with pytest.raises(KcoreError, match="integer columns"):
        batch_offsets(batch(["t"], ["1"], [1], partition=pa.string()))
    with pytest.raises(KcoreError, match="record batch with topic, partition and offset"):
        batch_offsets(pa.record_batch([pa.array([1])], names=["offset"]))


def test_acknowledge_many_is_all_or_nothing() -> None:
    acks = Acknowledgements()
    tp = TopicPartition("t", 0)
    acks.delivered([(tp, [record(1), record(2), record(3)])])
    acks.acknowledge(tp, 1, AcknowledgeType.ACCEPT)
    with pytest.raises(AcknowledgementError, match="already"):
        acks.acknowledge_many({tp: [1, 2, 3]}, AcknowledgeType.RELEASE)
    assert acks.unacknowledged() == 2  # nothing of the refused lot was taken
    with pytest.raises(AcknowledgementError, match="twice"):
        acks.acknowledge_many({tp: [2, 2]}, AcknowledgeType.RELEASE)
    acks.acknowledge_many({tp: [2, 3]}, AcknowledgeType.RENEW)  # one by one
    acks.sent(acks.take([tp]))
    acks.acknowledge_many({tp: [2, 3]}, AcknowledgeType.RELEASE)
    assert acks.unacknowledged() == 0
    assert acks.take([tp]) == {tp: {2: 2, 3: 2}}


def test_records_to_arrow_columns() -> None:
    import pyarrow as pa

    from kcore.consumer.share.arrow import ARROW_COLUMNS, batch_offsets, records_to_arrow

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
    assert batch_offsets(batch) == {TopicPartition("t", 1): [7], TopicPartition("t", 0): [8]}
    assert batch_offsets(batch.slice(1)) == {TopicPartition("t", 0): [8]}
    assert records_to_arrow([]).num_rows == 0


# -- the acquired records of a ShareFetch answer, made in the codec ------------------------------


def raw_batch(base: int, deltas: list[int], last_delta: int | None = None) -> bytes:
    """A v2 batch (no compression) holding records at ``base + delta`` for each of ``deltas``
    (gaps where compaction removed records), its header ending at ``base + last_delta``."""
    import struct

    from kcore.codec import crc32c, encode_varint

    body = b""
    for i, delta in enumerate(deltas):
        value = b"v%d" % (base + delta)
        rec = (
            b"\x00"
            + encode_varint(i)  # timestamp delta
            + encode_varint(delta)
            + encode_varint(-1)  # no key
            + encode_varint(len(value))
            + value
            + encode_varint(0)  # no headers
        )
        body += encode_varint(len(rec)) + rec
    last = deltas[-1] if last_delta is None else last_delta
    after_crc = struct.pack(">hiqqqhii", 0, last, 1000, 1000 + len(deltas), -1, -1, -1, len(deltas))
    after_crc += body
    head = struct.pack(">qiib", base, 4 + 1 + 4 + len(after_crc), 0, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


def acquired(data: bytes, ranges: list[tuple[int, int, int]]) -> tuple[list[Any], list[int]]:
    from kcore.codec import decode_batches

    gaps: list[int] = []
    out: list[Any] = []
    for batch in decode_batches(data):
        out += batch.acquired_records(ShareRecord, "t", 0, ranges, gaps)
    return out, gaps


def reference(
    base: int, deltas: list[int], last: int, ranges: list[tuple[int, int, int]]
) -> tuple[list[tuple[int, int]], list[int]]:
    """What acquired_records must give: (offset, delivery count) of the records inside the
    ranges, and the offsets of the batch's span inside them holding no record."""
    present = {base + d for d in deltas}
    count = {o: c for first, end, c in ranges for o in range(first, end + 1)}
    records = [(o, count[o]) for o in sorted(present) if o in count]
    gaps = [o for o in range(base, base + last + 1) if o in count and o not in present]
    return records, gaps


@pytest.mark.parametrize(
    ("deltas", "last", "ranges"),
    [
        ([0, 1, 2, 3, 4], 4, [(100, 104, 1)]),  # the whole batch
        ([0, 1, 2, 3, 4], 4, [(98, 101, 1), (103, 110, 3)]),  # another member holds 102
        ([0, 2, 3, 7], 9, [(100, 109, 2)]),  # compacted: gaps inside and at the end
        ([0, 2, 3, 7], 9, [(101, 101, 1), (106, 108, 1)]),  # gaps only where acquired
        ([0, 1, 2], 2, [(90, 95, 1)]),  # ranges before the batch
        ([0, 1, 2], 2, [(103, 120, 1)]),  # ranges after it
        ([0, 1, 2], 2, []),
        ([5], 5, [(100, 105, 4)]),  # one record left at the end of its span
    ],
)
def test_acquired_records_are_the_records_inside_the_ranges(
    deltas: list[int], last: int, ranges: list[tuple[int, int, int]]
) -> None:
    records, gaps = acquired(raw_batch(100, deltas, last), ranges)
    want_records, want_gaps = reference(100, deltas, last, ranges)
    assert [(r.offset, r.delivery_count) for r in records] == want_records
    assert gaps == want_gaps
    for r in records:
        assert type(r) is ShareRecord
        assert (r.topic, r.partition, r.value, r.key, r.headers) == (
            "t",
            0,
            b"v%d" % r.offset,
            None,
            (),
        )
        assert r.timestamp == 1000 + deltas.index(r.offset - 100) and r.timestamp_type == 0


def random_acquisition(
    rng: random.Random,
) -> tuple[list[int], int, list[tuple[int, int, int]]]:
    """A compacted batch at offset 100 (its records' offset deltas, its last offset delta) and
    acquired ranges around it, at random."""
    n = rng.randint(1, 40)
    deltas = sorted(rng.sample(range(60), n))
    last = deltas[-1] + rng.choice([0, 0, rng.randint(1, 10)])
    ranges: list[tuple[int, int, int]] = []
    at = 100 + rng.randint(-10, 20)
    while at < 100 + last + 10 and rng.random() < 0.8:
        end = at + rng.randint(0, 15)
        ranges.append((at, end, rng.randint(1, 5)))
        at = end + rng.randint(1, 8)
    return deltas, last, ranges


def test_acquired_records_against_the_reference_on_random_batches() -> None:
    rng = random.Random(932)
    for _ in range(300):
        deltas, last, ranges = random_acquisition(rng)
        records, gaps = acquired(raw_batch(100, deltas, last), ranges)
        assert ([(r.offset, r.delivery_count) for r in records], gaps) == reference(
            100, deltas, last, ranges
        )


def test_acquired_records_refuse_an_implausible_span() -> None:
    """A hostile header claiming a span of billions of acquired offsets with no records is a
    CorruptRecordError, not a list of billions of gaps."""
    from kcore.errors import CorruptRecordError

    with pytest.raises(CorruptRecordError, match="acquired offsets with no record"):
        acquired(raw_batch(0, [0], 2**31 - 1), [(0, 2**40, 1)])
    with pytest.raises(TypeError, match="9 fields"):
        from kcore.codec import decode_batches

        (batch,) = decode_batches(raw_batch(0, [0]))
        batch.acquired_records(TopicPartition, "t", 0, [], [])


def acquired_columns(data: bytes, ranges: list[tuple[int, int, int]]) -> tuple[Any, list[int]]:
    """As ``acquired``, written by the codec straight into Arrow columns (poll_arrow's way)."""
    from kcore.codec import ColumnBuffer, columnar_records, decode_batches

    cols, counts, gaps = columnar_records(), ColumnBuffer(), []
    for batch in decode_batches(data):
        cols.append_acquired(batch, ranges, gaps, counts, "t", 0)
    return cols.to_arrow(counts, "delivery_count"), gaps


def test_acquired_columns_are_the_acquired_records_as_columns() -> None:
    """append_acquired on random compacted batches and ranges, and on batches with keys,
    headers, compression and log-append time: the same rows as acquired_records' records
    made into a batch, and the same gaps."""
    from kcore.codec import RecordBatchBuilder
    from kcore.consumer.share.arrow import records_to_arrow

    rng = random.Random(1206)
    cases: list[tuple[bytes, list[tuple[int, int, int]]]] = []
    for _ in range(200):
        deltas, last, ranges = random_acquisition(rng)
        cases.append((raw_batch(100, deltas, last), ranges))
    for compression in ("none", "gzip", "lz4", "zstd", "snappy"):
        for log_append in (False, True):
            data = b""
            for base in (0, 30):
                builder = RecordBatchBuilder(
                    compression, base_offset=base, log_append_time=log_append
                )
                for i in range(30):
                    headers = [(f"h{j}", None if j == 1 else b"x" * j) for j in range(i % 3)]
                    key = None if i % 4 == 0 else b"k%d" % i
                    builder.append(key, b"value %d" % (base + i), 5_000 + i, headers)
                data += builder.build()
            cases.append((data, [(3, 9, 1), (12, 40, 2), (45, 70, 7)]))
    for data, ranges in cases:
        records, gaps = acquired(data, ranges)
        batch, column_gaps = acquired_columns(data, ranges)
        assert column_gaps == gaps
        assert batch.equals(records_to_arrow(records)), (ranges, batch.to_pylist()[:3])


def test_arrow_runs_slice_and_turn_back_into_the_records() -> None:
    """An ArrowRun (a partition's records decoded into columns) sliced as the buffer slices
    runs, turned into records for a poll, and joined with other runs for a poll_arrow: the
    same records and rows as the records' way gives."""
    from kcore.codec import ColumnBuffer, RecordBatchBuilder, columnar_records, decode_batches
    from kcore.consumer.share.acknowledgements import ArrowRun, run_offsets
    from kcore.consumer.share.arrow import arrow_run, records_to_arrow, run_records, runs_to_arrow

    builder = RecordBatchBuilder("lz4", base_offset=10)
    for i in range(20):
        headers = [("a", b"1"), ("b", None)] if i % 2 else []
        builder.append(None if i % 3 == 0 else b"k%d" % i, b"v%d" % i, 7_000 + i, headers)
    data = builder.build()
    ranges = [(10, 17, 1), (20, 29, 3)]
    records, _ = acquired(data, ranges)
    cols, counts, gaps = columnar_records(), ColumnBuffer(), []
    for batch in decode_batches(data):
        cols.append_acquired(batch, ranges, gaps, counts, "t", 0)
    run = arrow_run(cols, counts)
    assert isinstance(run, ArrowRun) and len(run) == len(records) == 18
    assert list(run_offsets(run)) == [r.offset for r in records]
    assert run_records(run) == records
    for part in (slice(0, 5), slice(5, None), slice(3, 3), slice(16, 40)):
        piece = run[part]
        assert run_records(piece) == records[part]
        assert piece.batch.equals(records_to_arrow(records[part]))
    tp = TopicPartition("t", 0)
    joined = runs_to_arrow([(tp, run[:4]), (tp, records[4:9]), (tp, run[9:])])
    assert joined.equals(records_to_arrow(records))
    assert runs_to_arrow([(tp, run[2:6])]).equals(records_to_arrow(records[2:6]))
    assert runs_to_arrow([]).num_rows == 0


def test_acquired_columns_leave_nothing_of_a_corrupt_batch() -> None:
    """A batch whose records run past its end: the error, and the columns, counts and gaps as
    they were before it (the rows of the batch before it kept)."""
    from kcore.codec import ColumnBuffer, columnar_records, decode_batches
    from kcore.errors import CorruptRecordError

    good = raw_batch(100, [0, 1, 2])
    bad = bytearray(raw_batch(103, [0, 3], 5))
    bad[-1] = 0x10  # the last record claims 8 headers: they run past the batch's end
    cols, counts, gaps = columnar_records(), ColumnBuffer(), []
    (first,) = decode_batches(good)
    assert cols.append_acquired(first, [(100, 110, 2)], gaps, counts, "t", 0) == 3
    (second,) = decode_batches(bytes(bad), check_crcs=False)
    with pytest.raises(CorruptRecordError):
        cols.append_acquired(second, [(100, 110, 2)], gaps, counts, "t", 0)
    assert gaps == [] and cols.num_rows == 3 and len(counts) == 12
    batch = cols.to_arrow(counts, "delivery_count")
    assert batch.column("offset").to_pylist() == [100, 101, 102]
    assert batch.column("delivery_count").to_pylist() == [2, 2, 2]
    with pytest.raises(ValueError, match="columnar_records"):
        from kcore.codec import ColumnarRecords

        ColumnarRecords().append_acquired(first, [], [], ColumnBuffer(), "t", 0)


def test_uncovered_offsets_are_the_acquired_ones_outside_the_decoded_batches() -> None:
    from kcore.consumer.share.fetcher import _uncovered

    ranges = [(0, 9, 1), (20, 29, 1)]
    # Batches covering 2-4 and 6-24; the response's last whole batch ends at 26.
    assert _uncovered(ranges, [(6, 24), (2, 4)], 26) == [0, 1, 5, 25, 26]
    assert _uncovered(ranges, [], 5) == [0, 1, 2, 3, 4, 5]
    assert _uncovered(ranges, [(0, 40)], 40) == []
    from kcore.errors import CorruptRecordError

    with pytest.raises(CorruptRecordError, match="acquired offsets"):
        _uncovered([(0, 2**40, 1)], [], 2**40)  # a hostile control batch's span


def spans_of(kinds: dict[int, int]) -> OffsetSpans:
    spans = OffsetSpans()
    for offset, kind in kinds.items():
        spans.add(offset, kind)
    return spans


def test_offset_spans_hold_what_a_dict_of_offsets_holds() -> None:
    """Random adds (one offset, a span, several), kind changes and removals, in and out of
    offset order: the spans always hold what a dict of offset to kind holds, stay sorted,
    disjoint and merged, and read the same through every accessor."""
    rng = random.Random(7)
    for _ in range(300):
        spans, model = OffsetSpans(), {}
        for _ in range(rng.randint(1, 60)):
            step = rng.random()
            offset, kind = rng.randrange(100), rng.randrange(5)
            if step < 0.35:
                spans.add(offset, kind)
                model[offset] = kind
            elif step < 0.55:
                last = offset + rng.randrange(8)
                spans.add_span(offset, last, kind)
                model.update(dict.fromkeys(range(offset, last + 1), kind))
            elif step < 0.65:
                offsets = rng.sample(range(100), rng.randrange(6))
                spans.update(offsets, kind)
                model.update(dict.fromkeys(offsets, kind))
            elif step < 0.9:
                assert spans.discard(offset) == (offset in model)
                model.pop(offset, None)
            else:
                offsets = rng.sample(range(100), rng.randrange(6))
                spans.difference_update(offsets)
                for o in offsets:
                    model.pop(o, None)
            assert spans == model and len(spans) == len(model)
            listed = spans.span_list()
            assert all(lo <= hi for lo, hi, _ in listed)
            assert all(
                b[0] > a[1] + 1 or (b[0] == a[1] + 1 and b[2] != a[2])
                for a, b in zip(listed, listed[1:], strict=False)
            )
        assert list(spans) == sorted(model) and spans.items() == sorted(model.items())
        assert spans.kinds() == set(model.values())
        assert all(spans.count_of(k) == list(model.values()).count(k) for k in range(5))
        probe = rng.sample(range(-2, 104), 10)
        assert [o in spans for o in probe] == [o in model for o in probe]
        assert [spans.get(o) for o in probe] == [model.get(o) for o in probe]
        assert spans.issuperset(probe) == (set(probe) <= set(model))
        twin = OffsetSpans()
        twin.add_spans(spans, 3)
        assert twin == dict.fromkeys(model, 3)


def test_offset_spans_take_anything_as_an_offset_asked_about() -> None:
    spans = spans_of({5: 1})
    for stranger in ("5", 5.0, None, 2**70, -(2**70)):
        assert stranger not in spans and spans.get(stranger) is None
        assert spans.discard(stranger) is False
        with pytest.raises(KeyError):
            spans[stranger]
    assert spans[5] == 1 and spans == {5: 1} and spans == {5} and spans != {5: 2}


def test_share_buffer_hands_out_runs_of_one_partition_up_to_the_limit() -> None:
    from kcore.consumer.share.fetcher import ShareBuffer

    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    buf = ShareBuffer()
    buf.put(a, [record(o) for o in range(5)])
    buf.put(b, [record(o) for o in range(3)])
    assert len(buf) == 8
    first = buf.take(4)
    assert [(tp, [r.offset for r in rs]) for tp, rs in first] == [(a, [0, 1, 2, 3])]
    second = buf.take(10)
    assert [(tp, [r.offset for r in rs]) for tp, rs in second] == [(a, [4]), (b, [0, 1, 2])]
    assert len(buf) == 0 and buf.take(3) == [] and buf.drain() == []
    # A run taken a part at a time; what is left of it counted and drained as it stands.
    buf.put(a, [record(o) for o in range(10)])
    buf.put(b, [record(o) for o in range(2)])
    assert [r.offset for _, rs in buf.take(3) for r in rs] == [0, 1, 2]
    assert [r.offset for _, rs in buf.take(3) for r in rs] == [3, 4, 5]
    assert len(buf) == 6 and buf.counts() == {a: 4, b: 2}
    assert [(tp, [r.offset for r in rs]) for tp, rs in buf.drain()] == [
        (a, [6, 7, 8, 9]),
        (b, [0, 1]),
    ]
    assert len(buf) == 0 and buf.counts() == {}


def test_record_columns_match_the_records_field_by_field() -> None:
    """The codec's columns of records already made hold what the records hold, over mixed
    partitions, topics, None keys and values, headers and timestamp types."""
    import random

    from kcore.consumer.share.arrow import records_to_arrow

    rng = random.Random(7)
    rows = []
    for i in range(500):
        headers = tuple(
            (f"h{j}é", None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 5)))
            for j in range(rng.choice([0, 0, 1, 3]))
        )
        rows.append(
            ShareRecord(
                rng.choice(["a", "b", "ü"]),
                rng.randint(0, 3),
                i * 3,
                1_700_000_000_000 + i,
                None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 20)),
                None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 300)),
                headers,
                rng.randint(1, 5),
                rng.randint(0, 1),
            )
        )
    got = records_to_arrow(rows).to_pylist()
    for row, rec in zip(got, rows, strict=True):
        assert (row["topic"], row["partition"], row["offset"]) == rec[:3]
        assert int(row["timestamp"].timestamp() * 1000) == rec.timestamp
        assert (row["key"], row["value"]) == (rec.key, rec.value)
        assert [(h["key"], h["value"]) for h in row["headers"]] == list(rec.headers)
        assert (row["delivery_count"], row["timestampType"]) == (
            rec.delivery_count,
            rec.timestamp_type,
        )


def test_record_columns_refuse_what_is_not_a_record() -> None:
    from kcore.codec import record_columns

    with pytest.raises(TypeError, match="at least 8 fields"):
        record_columns([("t", 0, 1, 2, None, b"v", ())], 7)
    with pytest.raises(TypeError, match="key and value bytes"):
        record_columns([("t", 0, 1, 2, "not bytes", b"v", ())])


def test_a_member_without_partitions_asks_early_after_joining() -> None:
    """The coordinator assigns apart from the heartbeats: after the join (an empty
    assignment) the member asks again after a fifth of the time it has waited (at least
    100 ms, at most the broker's interval); once partitions came, and after a rejoin's own
    early waits, the interval is kept."""
    m = ShareMembership("g")
    m.subscribe(["a"])
    assert m.on_response(m.request(), answer(epoch=2, parts=[])) is Outcome.JOINED
    assert m.interval_s == 1.0
    # The clock starts at the first question.
    waits = [m.next_heartbeat_s(t) for t in (100.0, 100.1, 100.5, 101.0, 103.0, 110.0)]
    assert waits == pytest.approx([0.1, 0.1, 0.1, 0.2, 0.6, 1.0])
    m = ShareMembership("g")
    m.subscribe(["a"])
    m.on_response(m.request(), answer(epoch=2, parts=[]))
    assert m.next_heartbeat_s(5.0) == 0.1
    m.on_response(m.request(), answer(epoch=3, parts=[0]))
    assert m.next_heartbeat_s(5.1) == 1.0
    # Partitions taken away later: the interval still (the member is not joining).
    m.on_response(m.request(), answer(epoch=4, parts=[]))
    assert m.next_heartbeat_s(6.0) == 1.0
    # Fenced, then joined again: early again, from the new join.
    assert m.on_response(m.request(), answer(ErrorCode.FENCED_MEMBER_EPOCH)) is Outcome.REJOIN
    m.on_response(m.request(), answer(epoch=5, parts=[]))
    assert m.next_heartbeat_s(20.0) == 0.1


def test_a_new_heartbeat_task_sends_one_join_then_waits_early() -> None:
    """start() of a new heartbeat task sends the join once: a wake left set by start() sent a
    second heartbeat right behind it, which used up the first early wait. (Lower bounds only:
    a loaded machine can only delay the heartbeats.)"""
    import asyncio
    import time
    from types import SimpleNamespace

    from kcore.consumer.share.membership import ShareHeartbeat
    from kcore.network.backoff import ExponentialBackoff

    sent: list[float] = []

    class Link:
        async def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(time.monotonic())
            return answer(epoch=2)  # joined, no assignment yet

    async def main() -> None:
        m = ShareMembership("g")
        m.subscribe(["a"])
        cluster = SimpleNamespace(retry_backoff=ExponentialBackoff(100, 1000))
        hb = ShareHeartbeat(cluster, Link(), m, lambda _: None)  # type: ignore[arg-type]
        hb.start()
        await asyncio.sleep(0.35)
        await hb.leave(0.1)

    asyncio.run(main())
    assert len(sent) >= 2
    assert sent[1] - sent[0] >= 0.08  # the first early wait (100 ms), not at once
    assert len(sent) <= 5  # join, then early heartbeats every 100 ms or more (and the leave)


def test_commit_sync_waits_for_a_background_round_and_reports_its_outcomes() -> None:
    # A poll may start a background round (send_pending) that keeps sending what becomes owed
    # while it runs, the acknowledgements of the records that poll returned among them. A
    # commit_sync right after must still wait for them and say how they ended: an empty
    # answer was possible (seen on a loaded machine).
    import asyncio

    from kcore.consumer.share.acknowledgements import AcknowledgeType
    from kcore.consumer.share.fetcher import ShareBuffer, ShareFetcher

    ACCEPT = AcknowledgeType.ACCEPT

    config = {
        "fetch.max.wait.ms": 500,
        "fetch.min.bytes": 1,
        "fetch.max.bytes": 1 << 20,
        "max.poll.records": 500,
        "share.acquire.mode": "batch_optimized",
        "check.crcs": True,
    }
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)

    async def scenario() -> tuple[list[Any], list[Any]]:
        acks = Acknowledgements()
        fetcher = ShareFetcher(None, "g", lambda: "m", acks, ShareBuffer(), config)  # type: ignore[arg-type]
        broker_answers = asyncio.Event()
        sent: list[Any] = []

        async def acknowledge(partitions: Any = None, *, final: bool = False) -> list[Any]:
            taken = acks.take(acks.pending_partitions())
            sent.append(taken)
            await broker_answers.wait()
            return [(tp, offsets, None) for tp, offsets in taken.items()]

        fetcher.acknowledge = acknowledge  # type: ignore[method-assign]
        acks.add(a, [1, 2], ACCEPT)  # owed when the poll started the round
        round_ = asyncio.ensure_future(fetcher.send_pending())
        await asyncio.sleep(0)
        acks.add(b, [7], ACCEPT)  # acknowledged by the application after that poll
        commit = asyncio.ensure_future(fetcher.commit())
        await asyncio.sleep(0.01)
        assert not commit.done()  # waiting for the round under way
        broker_answers.set()
        results = await commit
        await round_
        return results, sent

    results, sent = asyncio.run(scenario())
    assert {tp: set(offsets) for tp, offsets, _ in results} == {a: {1, 2}, b: {7}}
    assert all(err is None for _, _, err in results)
    assert sum(len(s) for s in sent) == 2  # each partition's acknowledgements sent once


def test_poll_arrow_without_pyarrow_is_refused_before_any_fetch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """poll_arrow with pyarrow missing: a KcoreError naming it, and the fetches keep making
    records (nothing is decoded into columns that could not become a batch)."""
    import sys

    core = _explicit_core()
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow: ImportError
    with pytest.raises(KcoreError, match="needs pyarrow"):
        core.poll_arrow_plan(0, None)
    assert not core.buffer.columnar


def test_what_is_owed_waits_for_a_fetch_a_tenth_of_the_lock_at_most_half_a_second() -> None:
    from kcore.consumer.share.core import ack_linger_s

    assert ack_linger_s(30.0) == 0.5  # the broker's default lock
    assert ack_linger_s(10.0) == 0.5
    assert ack_linger_s(2.0) == pytest.approx(0.2)
    assert ack_linger_s(1.0) == pytest.approx(0.1)


def take_buffer(sizing: FetchSizing, start: float, polls: int, each: int, apart_s: float) -> None:
    """``polls`` polls of ``each`` records, ``apart_s`` apart, the last one emptying the buffer."""
    for i in range(polls):
        sizing.taken(start + i * apart_s, each, (polls - i - 1) * each)


def test_a_fetch_asks_for_max_poll_records_until_a_rate_is_measured() -> None:
    sizing = FetchSizing(500, record_limit=False)
    assert sizing.max_records(30.0) == 500
    sizing.answered(0.005)
    assert sizing.max_records(30.0) == 500  # a round trip, no rate yet
    # One poll that empties the buffer measures nothing: no time passed between two takes.
    sizing.taken(1.0, 300, 0)
    assert sizing.max_records(30.0) == 500


def test_a_fast_member_asks_for_what_it_takes_in_a_few_round_trips() -> None:
    sizing = FetchSizing(500, record_limit=False)
    sizing.answered(0.010)
    # 10 polls of 500, 1 ms apart: 4,500 records (the last poll's are not processed yet) in
    # 9 ms: 500,000 a second; four 10 ms round trips of that is 20,000.
    take_buffer(sizing, 1.0, 10, 500, 0.001)
    assert sizing.rate == pytest.approx(500_000)
    assert sizing.max_records(30.0) == 20_000
    # Never more than MAX_POLLS_A_FETCH polls' worth, nor what it takes in a tenth of the
    # acquisition lock.
    sizing.answered(0.100)  # smoothed: 55 ms
    assert sizing.max_records(30.0) == MAX_POLLS_A_FETCH * 500
    assert sizing.max_records(0.2) == 10_000  # 20 ms of taking
    assert sizing.max_records(0.001) == 500  # never fewer than max.poll.records


def test_a_slow_member_and_record_limit_mode_ask_for_max_poll_records() -> None:
    slow = FetchSizing(500, record_limit=False)
    slow.answered(0.010)
    take_buffer(slow, 1.0, 10, 500, 1.0)  # 500 records a second
    assert slow.max_records(30.0) == 500
    fixed = FetchSizing(500, record_limit=True)  # the caller asked for that bound
    fixed.answered(0.010)
    take_buffer(fixed, 1.0, 10, 500, 0.001)
    assert fixed.max_records(30.0) == 500


def test_the_rate_follows_the_member_smoothed() -> None:
    sizing = FetchSizing(100, record_limit=False)
    sizing.answered(0.010)
    take_buffer(sizing, 1.0, 5, 100, 0.001)  # 100,000 a second
    take_buffer(sizing, 2.0, 5, 100, 0.004)  # 25,000 a second: halfway there
    assert sizing.rate == pytest.approx(62_500)
    # A buffer refilled while being taken from is measured as one.
    sizing.taken(3.0, 100, 100)
    sizing.taken(3.001, 100, 300)
    sizing.taken(3.002, 100, 0)
    assert sizing.rate == pytest.approx((62_500 + 100_000) / 2)
