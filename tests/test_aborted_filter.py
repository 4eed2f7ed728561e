"""read_committed's filter (kcore.consumer.aborted), without a broker: batches built by the
codec as a transactional producer and the transaction coordinator's markers write them, and
the Fetch response's aborted-transaction list, as Java's CompletedFetch reads them."""

from __future__ import annotations

import struct

import pytest

from kcore.codec import RecordBatchBuilder, decode_batches, decode_columns, decode_records
from kcore.consumer.aborted import committed_batches, drop_aborted

TS = 1_700_000_000_000
ABORT, COMMIT = 0, 1


def data(base: int, count: int, pid: int = -1, transactional: bool = True) -> bytes:
    """``count`` records at ``base`` from producer ``pid`` (-1: no producer id)."""
    builder = RecordBatchBuilder(
        base_offset=base,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=0 if pid >= 0 else -1,
        transactional=transactional and pid >= 0,
    )
    for i in range(count):
        builder.append(b"p%d" % pid, b"%d" % (base + i), TS + base + i)
    return builder.build()


def marker(offset: int, pid: int, kind: int) -> bytes:
    """A control batch (COMMIT or ABORT marker) of producer ``pid`` at ``offset``."""
    builder = RecordBatchBuilder(
        base_offset=offset,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=-1,
        transactional=True,
        is_control=True,
    )
    builder.append(struct.pack(">hh", 0, kind), struct.pack(">hi", 0, 0), TS + offset)
    return builder.build()


def offsets(records: object) -> list[int]:
    return [r[0] for r in decode_records(records)]


def kept_offsets(buf: bytes, aborted: list[tuple[int, int]]) -> list[int]:
    """Offsets of the records read_committed hands out, by way of committed_batches."""
    batches = decode_batches(buf, True)
    return [r[0] for b in committed_batches(batches, aborted) for r in b.records()]


def test_no_aborted_transactions_keeps_every_data_batch():
    buf = data(0, 2, pid=1) + marker(2, 1, COMMIT) + data(3, 1) + data(4, 2, pid=2)
    assert kept_offsets(buf, []) == [0, 1, 3, 4, 5]
    assert drop_aborted(buf, []) is buf  # nothing dropped: no copy
    assert offsets(drop_aborted(buf, [])) == [0, 1, 3, 4, 5]


def test_an_aborted_transaction_is_dropped_up_to_its_abort_marker():
    buf = (
        data(0, 3, pid=1)  # aborted
        + marker(3, 1, ABORT)
        + data(4, 2, pid=2)  # committed
        + marker(6, 2, COMMIT)
    )
    assert kept_offsets(buf, [(1, 0)]) == [4, 5]
    assert offsets(drop_aborted(buf, [(1, 0)])) == [4, 5]


def test_interleaved_producers_on_one_partition():
    buf = (
        data(0, 1, pid=1)
        + data(1, 1, pid=2)
        + data(2, 2, pid=1)
        + data(4, 1, pid=3)  # a third transaction, aborted too
        + marker(5, 1, ABORT)
        + data(6, 1, pid=2)
        + marker(7, 2, COMMIT)
        + marker(8, 3, ABORT)
    )
    aborted = [(3, 4), (1, 0)]  # any order
    assert kept_offsets(buf, aborted) == [1, 6]
    assert offsets(drop_aborted(buf, aborted)) == [1, 6]


def test_one_producer_commit_abort_commit():
    """The aborted entry applies from its first offset on: the same producer id's committed
    transactions before it and after its marker are kept."""
    buf = (
        data(0, 2, pid=7)
        + marker(2, 7, COMMIT)
        + data(3, 2, pid=7)
        + marker(5, 7, ABORT)
        + data(6, 1, pid=7)
        + marker(7, 7, COMMIT)
    )
    assert kept_offsets(buf, [(7, 3)]) == [0, 1, 6]
    assert offsets(drop_aborted(buf, [(7, 3)])) == [0, 1, 6]


def test_two_aborted_transactions_of_one_producer():
    buf = (
        data(0, 1, pid=7)
        + marker(1, 7, ABORT)
        + data(2, 1, pid=7)
        + marker(3, 7, COMMIT)
        + data(4, 1, pid=7)
        + marker(5, 7, ABORT)
    )
    assert kept_offsets(buf, [(7, 4), (7, 0)]) == [2]


def test_a_transaction_that_began_before_the_fetched_range():
    """A response's list names transactions that overlap its range, also those that began
    earlier (first_offset below the fetch offset)."""
    buf = data(10, 2, pid=1) + marker(12, 1, ABORT) + data(13, 1, pid=2)
    assert kept_offsets(buf, [(1, 4)]) == [13]


def test_marker_in_a_later_response():
    """The aborted transaction goes on past the end of these records: still dropped."""
    buf = data(0, 2, pid=2) + data(2, 3, pid=1)
    assert kept_offsets(buf, [(1, 2)]) == [0, 1]


def test_non_transactional_batches_are_kept():
    """An idempotent (non-transactional) batch of a producer id named aborted is kept, and so
    are batches without a producer id."""
    buf = (
        data(0, 1, pid=1)
        + data(1, 1, pid=1, transactional=False)
        + data(2, 1)
        + marker(3, 1, ABORT)
    )
    assert kept_offsets(buf, [(1, 0)]) == [1, 2]


def test_drop_aborted_keeps_runs_and_leaves_out_a_partial_tail():
    kept1 = data(0, 2, pid=2)
    gone = data(2, 2, pid=1)
    kept2 = data(4, 1, pid=2) + data(5, 1)
    tail = data(6, 3, pid=2)
    buf = kept1 + gone + kept2 + tail[: len(tail) // 2]
    out = drop_aborted(buf, [(1, 2)])
    assert bytes(out) == kept1 + kept2
    assert offsets(out) == [0, 1, 4, 5]
    # one kept run: a view into the input, not a copy
    only = drop_aborted(kept1 + gone, [(1, 2)])
    assert isinstance(only, memoryview) and bytes(only) == kept1


def test_everything_aborted():
    buf = data(0, 2, pid=1) + marker(2, 1, ABORT)
    assert kept_offsets(buf, [(1, 0)]) == []
    assert offsets(drop_aborted(buf, [(1, 0)])) == []


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_filtered_records_decode_as_columns(compression):
    def compressed(base: int, count: int, pid: int) -> bytes:
        builder = RecordBatchBuilder(
            compression,
            base_offset=base,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        )
        for i in range(count):
            builder.append(None, b"v%d" % (base + i), TS)
        return builder.build()

    buf = (
        compressed(0, 3, 1)
        + compressed(3, 3, 2)
        + marker(6, 1, ABORT)
        + compressed(7, 2, 2)
        + marker(9, 2, COMMIT)
    )
    out = drop_aborted(buf, [(1, 0)])
    cols = decode_columns(out, min_offset=4).to_arrow()
    assert cols.column("offset").to_pylist() == [4, 5, 7, 8]
    assert cols.column("value").to_pylist() == [b"v4", b"v5", b"v7", b"v8"]
