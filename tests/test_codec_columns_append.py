"""ColumnarRecords.append_from: the records of several fetch responses (partitions) decoded
into one set of Arrow columns, a bounded number of rows a call, each call going on where the
last one stopped (the consumer's poll_arrow). No broker needed."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from kcore.codec import (
    RecordBatchBuilder,
    columnar_records,
    decode_columns,
    decode_records,
)
from kcore.errors import CorruptRecordError, CrcMismatchError

SPARK_COLUMNS = [
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
]


def batch(base: int, n: int, codec: str = "none", **kwargs) -> bytes:
    b = RecordBatchBuilder(codec, base_offset=base, **kwargs)
    for i in range(n):
        headers = [("h", b"%d" % i)] if i % 3 == 0 else []
        b.append(None if i % 2 else b"k%d" % (base + i), b"v%d" % (base + i), 1000 + i, headers)
    return bytes(b.build())


def take_all(
    cols, buf: bytes, min_offset: int, step: int, topic: str = "t", partition: int = 0
) -> list[int]:
    """append_from until ``buf`` is used up, ``step`` rows a call; the offsets appended."""
    got: list[int] = []
    position = 0
    while True:
        before = cols.num_rows
        n, position, stopped, last = cols.append_from(
            buf, position, min_offset=min_offset, max_rows=step, topic=topic, partition=partition
        )
        assert cols.num_rows == before + n and n <= step
        if n:
            offsets = list(memoryview(cols.offset).cast("q"))[before:]
            assert last == offsets[-1]
            got += offsets
            min_offset = last + 1
        if stopped < 0:
            return got
        assert stopped >= min_offset


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("step", [1, 4, 7, 1000])
def test_rows_in_steps_are_the_records_in_order(codec: str, step: int) -> None:
    data = batch(10, 9, codec) + batch(19, 5, codec) + batch(24, 1, codec)
    cols = columnar_records()
    assert take_all(cols, data, 12, step) == list(range(12, 25))
    rb = cols.to_arrow()
    rb.validate(full=True)
    assert rb.schema.names == SPARK_COLUMNS
    want = decode_records(data, min_offset=12)
    assert rb.column("value").to_pylist() == [r[3] for r in want]
    assert rb.column("key").to_pylist() == [r[2] for r in want]
    assert rb.column("headers").to_pylist() == [
        [{"key": k, "value": v} for k, v in r[4]] for r in want
    ]
    ref = decode_columns(data, min_offset=12).to_arrow()
    for name in ("key", "value", "offset", "timestamp", "timestampType", "headers"):
        assert rb.column(name).equals(ref.column(name)), name


def test_several_partitions_in_one_set_of_columns() -> None:
    cols = columnar_records()
    n, _, stopped, last = cols.append_from(batch(0, 4), topic="a", partition=3)
    assert (n, stopped, last) == (4, -1, 3)
    n, position, stopped, last = cols.append_from(
        batch(100, 6), min_offset=101, max_rows=2, topic="bb", partition=0
    )
    assert (n, position, stopped, last) == (2, 0, 103, 102)
    rb = cols.to_arrow()
    assert rb.column("topic").to_pylist() == ["a"] * 4 + ["bb"] * 2
    assert rb.column("partition").to_pylist() == [3] * 4 + [0] * 2
    assert rb.column("offset").to_pylist() == [0, 1, 2, 3, 101, 102]
    assert rb.schema.field("topic").type == pa.string()
    assert rb.schema.field("partition").type == pa.int32()


def test_no_rows_has_the_columns_too() -> None:
    rb = columnar_records().to_arrow()
    assert rb.num_rows == 0 and rb.schema.names == SPARK_COLUMNS


def test_control_batches_and_records_before_the_offset_are_skipped() -> None:
    b = RecordBatchBuilder(
        is_control=True, transactional=True, producer_id=5, producer_epoch=1, base_offset=3
    )
    b.append(struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 7), 2_000)
    control = bytes(b.build())
    data = batch(0, 3) + control + batch(4, 2)
    cols = columnar_records()
    assert take_all(cols, data, 1, 1) == [1, 2, 4, 5]


def test_a_trailing_partial_batch_is_left_alone() -> None:
    data = batch(0, 3) + batch(3, 3)[:-5]
    cols = columnar_records()
    n, position, stopped, _ = cols.append_from(data)
    assert (n, stopped) == (3, -1) and position == len(data)


def test_a_corrupt_batch_takes_out_its_rows_and_says_where_the_good_ones_end() -> None:
    good = batch(0, 3)
    bad = bytearray(batch(3, 3))
    bad[-1] ^= 0xFF  # the CRC no longer matches
    cols = columnar_records()
    with pytest.raises(CrcMismatchError) as info:
        cols.append_from(good + bytes(bad), topic="t")
    assert cols.num_rows == 3
    assert info.value.resume_position == len(good)  # type: ignore[attr-defined]
    assert info.value.resume_offset == 3  # type: ignore[attr-defined]
    assert cols.to_arrow().column("offset").to_pylist() == [0, 1, 2]
    # From there it raises again, appending nothing.
    with pytest.raises(CrcMismatchError):
        cols.append_from(good + bytes(bad), len(good), min_offset=3)
    assert cols.num_rows == 3


def test_a_record_that_does_not_parse_takes_out_the_rows_of_its_batch() -> None:
    """Rows of the batch at fault appended before the bad record come out again (with their
    validity bits), so the columns end at a batch boundary."""
    raw = bytearray(batch(3, 9))
    raw[-1] = 0x7F  # the last record's header count: negative
    cols = columnar_records()
    cols.append_from(batch(0, 3), topic="t")
    with pytest.raises(CorruptRecordError):
        cols.append_from(bytes(raw), check_crcs=False, topic="t")
    assert cols.num_rows == 3
    cols.append_from(batch(3, 9), topic="t")
    rb = cols.to_arrow()
    rb.validate(full=True)
    assert rb.column("offset").to_pylist() == list(range(12))
    assert rb.column("key").to_pylist() == [None if i % 2 else b"k%d" % i for i in [0, 1, 2]] + [
        None if i % 2 else b"k%d" % (3 + i) for i in range(9)
    ]


def test_columns_of_decode_columns_take_no_source_rows() -> None:
    with pytest.raises(ValueError):
        decode_columns(batch(0, 2)).append_from(batch(2, 2))


# to_arrow hands the columns to pyarrow through the Arrow C data interface (one import);
# to_arrow_by_columns wraps each buffer with a pyarrow call: the reference it must equal.


def columns_of(shape: str, rows: int):
    if shape == "decode_columns":
        return decode_columns(batch(0, rows) if rows else b"")
    if shape == "decode_columns_us":
        return decode_columns(batch(0, rows) if rows else b"", timestamp_unit="us")
    if shape == "decode_columns_no_headers":
        return decode_columns(batch(0, rows) if rows else b"", include_headers=False)
    cols = columnar_records()
    if rows:
        take_all(cols, batch(0, rows, "lz4"), 0, 7, topic="t\u00e9", partition=3)
        take_all(cols, batch(0, 5), 0, 3, topic="u", partition=9)
    return cols


@pytest.mark.parametrize(
    "shape", ["decode_columns", "decode_columns_us", "decode_columns_no_headers", "append_from"]
)
@pytest.mark.parametrize("rows", [0, 1, 9, 300])
def test_the_exported_batch_is_the_one_made_column_by_column(shape: str, rows: int) -> None:
    cols = columns_of(shape, rows)
    exported, reference = cols.to_arrow(), cols.to_arrow_by_columns()
    exported.validate(full=True)
    assert exported.schema == reference.schema and exported.equals(reference)
    assert exported.num_rows == cols.num_rows


def test_an_extra_int32_column_goes_last() -> None:
    from kcore.codec import record_columns

    records = [("t", 0, i, 1000 + i, b"k", b"v%d" % i, []) for i in range(20)]
    cols, _ = record_columns(records)
    counts = record_columns([(*r, i % 4 + 1) for i, r in enumerate(records)], 7)[1]
    got = cols.to_arrow(counts, "delivery_count")
    got.validate(full=True)
    assert got.schema.names == [*SPARK_COLUMNS, "delivery_count"]
    assert got.schema.field("delivery_count").type == pa.int32()
    assert got.column("delivery_count").to_pylist() == [i % 4 + 1 for i in range(20)]
    assert got.drop_columns(["delivery_count"]).equals(cols.to_arrow_by_columns())
    with pytest.raises(ValueError):
        record_columns(records[:5])[0].to_arrow(counts)  # a column needs its name
    short = record_columns([(*r, 1) for r in records[:5]], 7)[1]
    with pytest.raises(ValueError):
        cols.to_arrow(short, "delivery_count")  # 5 values for 20 rows


def test_an_exported_batch_outlives_its_columns_and_is_freed_on_any_thread() -> None:
    import sys
    import threading

    cols = columns_of("append_from", 50)
    expected = cols.to_arrow_by_columns().to_pylist()
    held = sys.getrefcount(cols)
    exported = cols.to_arrow()
    assert sys.getrefcount(cols) == held + 1  # the exported array holds the columns
    sliced = exported.slice(10, 5)
    del exported
    assert sys.getrefcount(cols) == held + 1
    box = [sliced]
    del sliced
    freer = threading.Thread(target=box.clear)  # the last reference dropped elsewhere
    freer.start()
    freer.join()
    assert sys.getrefcount(cols) == held
    # Dropped by the caller first: the batch keeps the columns' memory (new columns made
    # meanwhile take other blocks of the pool).
    exported = cols.to_arrow()
    del cols
    for _ in range(5):
        columns_of("append_from", 50)
    assert exported.to_pylist() == expected


def test_the_capsules_are_the_arrow_pycapsule_interface() -> None:
    from kcore.codec import ArrowColumns

    cols = columns_of("decode_columns", 9)
    schema_capsule, array_capsule = ArrowColumns(cols).__arrow_c_array__()
    assert type(schema_capsule).__name__ == type(array_capsule).__name__ == "PyCapsule"
    del schema_capsule, array_capsule  # never imported: the capsule releases the array
    assert pa.record_batch(ArrowColumns(cols)).equals(cols.to_arrow_by_columns())
    assert pa.table(ArrowColumns(cols)).num_rows == 9
