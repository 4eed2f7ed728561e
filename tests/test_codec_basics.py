"""The codec primitives the foundation relies on: known vectors from Kafka and the CRC32C
standard, varint edge cases, and v2 batch round trips. (The codec issue adds the rest.)"""

import struct

import pytest

from kcore import _codec
from kcore.codec import (
    RecordBatchBuilder,
    crc32c,
    crc32c_join,
    decode_batches,
    decode_uvarint,
    decode_varint,
    decode_varlong,
    encode_uvarint,
    encode_varint,
    encode_varlong,
    murmur2,
    partition_for_key,
    prepare_headers,
)
from kcore.errors import (
    CorruptRecordError,
    CrcMismatchError,
    TruncatedDataError,
    UnsupportedMagicError,
    VarintOverflowError,
)


def test_extension_is_compiled():
    # A silently missing extension would leave a slow path; the codec must be the .so.
    assert _codec.__file__.endswith(".so")


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", 0x00000000),
        (b"123456789", 0xE3069283),  # the standard CRC-32C check value
        (bytes(32), 0x8A9136AA),  # RFC 3720 B.4: 32 bytes of zeros
        (b"\xff" * 32, 0x62A8AB43),  # RFC 3720 B.4: 32 bytes of 0xff
        (bytes(range(32)), 0x46DD794E),  # RFC 3720 B.4: incrementing
        (bytes(range(31, -1, -1)), 0x113FDB5C),  # RFC 3720 B.4: decrementing
    ],
)
def test_crc32c_vectors(data, expected):
    assert crc32c(data) == expected
    assert crc32c(bytearray(data)) == expected
    assert crc32c(memoryview(data)) == expected


def test_crc32c_continues_and_handles_large_buffers():
    data = bytes(range(256)) * 1000
    assert crc32c(data[1000:], crc32c(data[:1000])) == crc32c(data)


@pytest.mark.parametrize("split", [0, 1, 7, 40, 1000, 65536, 200_000])
def test_crc32c_join_is_the_crc_of_both_parts_in_order(split):
    data = bytes((i * 131 + 7) % 251 for i in range(200_000 + 40))
    a, b = data[:split], data[split:]
    assert crc32c_join(crc32c(a), crc32c(b), len(b)) == crc32c(data)
    assert crc32c_join(crc32c(a), 0, 0) == crc32c(a)


def test_crc32c_join_takes_any_64_bit_length():
    """The join is a product in GF(2) (A's CRC times x^(8 * len(B)), plus B's), so it takes
    lengths no buffer has: joining in two steps equals joining the two lengths' sum, up to
    the 64th bit of a length."""
    a, b1, b2 = 0x12345678, 0x9ABCDEF0, 0x0F1E2D3C
    # (Lengths whose bits overlap: their sum carries into higher bits of the length.)
    for n1, n2 in ((3, 5), (2**40 + 7, 2**40 + 9), (2**62, 2**62), (2**63 - 1, 2**63)):
        two_steps = crc32c_join(crc32c_join(a, b1, n1), b2, n2)
        assert two_steps == crc32c_join(a, crc32c_join(b1, b2, n2), n1 + n2)


@pytest.mark.parametrize("sizes", [[0], [1] * 3000, [100] * 400, [2047, 1, 2048, 5000], [70_000]])
def test_a_batch_checksummed_as_it_is_written_has_the_crc_of_its_bytes(sizes):
    # The builder checksums an uncompressed batch's records as they are written and joins
    # the header's CRC in front at build(): the CRC field must be that of the bytes built,
    # also when a built batch takes more records and is built again.
    builder = RecordBatchBuilder()
    built = []
    for i, size in enumerate(sizes):
        builder.append(b"k%d" % i if i % 3 else None, bytes([i % 256]) * size, 1_700_000_000 + i)
        if i in (len(sizes) // 2, len(sizes) - 1):
            built.append(builder.build())
    built.append(RecordBatchBuilder().build())  # no records at all
    for batch in built:
        assert struct.unpack(">I", batch[17:21])[0] == crc32c(batch[21:])
        (decoded,) = decode_batches(batch)
        records = decoded.records()
        assert [len(r[3]) for r in records] == sizes[: len(records)]


@pytest.mark.parametrize(
    "key, expected",
    [
        # Values the Java client's UtilsTest asserts for Utils.murmur2.
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
    ],
)
def test_murmur2_matches_java(key, expected):
    assert murmur2(key) == expected


def test_partition_for_key_is_java_to_positive_modulo():
    for key in (b"21", b"foobar", b"x" * 17):
        assert partition_for_key(key, 12) == (murmur2(key) & 0x7FFFFFFF) % 12


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16383, 16384, 2**31 - 1, 2**32 - 1])
def test_uvarint_round_trip(value):
    enc = encode_uvarint(value)
    assert decode_uvarint(enc) == (value, len(enc))
    assert decode_uvarint(b"\x00" + enc, 1) == (value, len(enc) + 1)


@pytest.mark.parametrize("value", [0, -1, 1, -64, 63, 64, -(2**31), 2**31 - 1])
def test_varint_zigzag_round_trip(value):
    enc = encode_varint(value)
    assert decode_varint(enc) == (value, len(enc))


@pytest.mark.parametrize("value", [0, -1, 1, 2**40, -(2**63), 2**63 - 1])
def test_varlong_zigzag_round_trip(value):
    enc = encode_varlong(value)
    assert decode_varlong(enc) == (value, len(enc))


def test_varint_known_encodings():
    assert encode_uvarint(300) == b"\xac\x02"
    assert encode_varint(-1) == b"\x01"
    assert encode_varint(1) == b"\x02"


def test_truncated_and_overflowing_varints_raise():
    with pytest.raises(TruncatedDataError) as exc:
        decode_uvarint(b"\x80\x80", 0)
    assert exc.value.position == 0
    with pytest.raises(VarintOverflowError):
        decode_uvarint(b"\xff\xff\xff\xff\x7f")
    with pytest.raises(VarintOverflowError):
        decode_varlong(b"\xff" * 10 + b"\x01")
    with pytest.raises(CorruptRecordError):
        decode_uvarint(b"", 0)


def test_batch_round_trip_keys_values_headers():
    b = RecordBatchBuilder(base_offset=100, producer_id=7, producer_epoch=1, base_sequence=3)
    b.append(b"k1", b"v1", 1_000, [("h1", b"x"), ("h2", None)])
    b.append(None, b"", 1_005)
    b.append(b"", None, 999)
    data = b.build()
    [batch] = decode_batches(data)
    assert (batch.base_offset, batch.last_offset, batch.record_count) == (100, 102, 3)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 1, 3)
    assert (batch.base_timestamp, batch.max_timestamp) == (1_000, 1_005)
    assert batch.records() == [
        (100, 1_000, b"k1", b"v1", (("h1", b"x"), ("h2", None))),
        (101, 1_005, None, b"", ()),
        (102, 999, b"", None, ()),
    ]


def test_batch_header_layout():
    b = RecordBatchBuilder(transactional=True)
    b.append(b"k", b"v", 5)
    data = b.build()
    base_offset, length, epoch, magic, crc, attrs = struct.unpack_from(">qiibIh", data)
    assert (base_offset, length, epoch, magic) == (0, len(data) - 12, -1, 2)
    assert attrs & 0x10  # transactional bit
    assert crc == crc32c(data[21:])


def test_corrupt_batches_raise_named_errors():
    b = RecordBatchBuilder()
    b.append(b"k", b"v", 5)
    data = b.build()
    with pytest.raises(TruncatedDataError):
        decode_batches(data[:-1])
    assert decode_batches(data + data[:30], allow_partial=True)[0].record_count == 1
    flipped = bytearray(data)
    flipped[-1] ^= 0xFF
    with pytest.raises(CrcMismatchError):
        decode_batches(bytes(flipped))
    wrong_magic = bytearray(data)
    wrong_magic[16] = 7
    with pytest.raises(UnsupportedMagicError) as exc:
        decode_batches(bytes(wrong_magic))
    assert exc.value.position == 0


def test_the_columnar_decode_checks_crcs_unless_told_not_to():
    """decode_columns (poll_arrow's decoder) honours check.crcs as decode_records does."""
    from kcore.codec import decode_columns, decode_records

    b = RecordBatchBuilder()
    b.append(b"k", b"value", 5)
    flipped = bytearray(b.build())
    flipped[-3] ^= 0x01  # a bit of the value
    for decode in (decode_columns, decode_records):
        with pytest.raises(CrcMismatchError) as exc:
            decode(bytes(flipped))
        assert exc.value.position == 0
    cols = decode_columns(bytes(flipped), check_crcs=False)
    assert cols.to_arrow().column("value").to_pylist() == [b"valte"]


def test_build_hands_out_an_immutable_batch_and_the_builder_goes_on():
    """build() of an uncompressed batch returns the builder's own buffer (no copy); appending
    or building again must never change a batch already returned."""
    from kcore.codec import RecordBatchBuilder, decode_records

    b = RecordBatchBuilder()
    b.append(b"k", b"v", 5)
    first = b.build()
    snapshot = bytes(first)
    again = b.build()
    assert again == first
    for i in range(1000):  # enough to grow the buffer several times
        b.append(b"key-%d" % i, b"x" * 100, 6 + i)
    third = b.build()
    assert first == snapshot and again == snapshot
    assert decode_records(first) == [(0, 5, b"k", b"v", ())]
    records = decode_records(third)
    assert len(records) == 1001 and records[-1][:3] == (1000, 1005, b"key-999")
    hash(first)  # a returned batch behaves as any bytes


def test_a_large_batch_keeps_its_slack_and_is_still_an_exact_bytes() -> None:
    """A batch of over 1 MiB is handed out without shrinking its allocation (so repeated
    large builds reuse memory instead of faulting in fresh pages); the bytes object must
    still be exactly the batch: length, contents, hash, and what a copy of it decodes to."""
    from kcore.codec import decode_records

    keys = [b"key-%012d" % i for i in range(20_000)]
    values = [(b"%05d" % i) * 20 for i in range(20_000)]
    for _ in range(3):  # again and again: the memory of the last one comes back
        b = RecordBatchBuilder()
        b.append_many(keys, values, 1_700_000_000_000)
        batch = b.build()
        assert len(batch) > 1024 * 1024
        copy = bytes(bytearray(batch))
        assert batch == copy and hash(batch) == hash(copy)
        assert batch + b"" == copy and batch[-1:] == copy[-1:]
        struct_len = struct.unpack_from(">i", batch, 8)[0]
        assert struct_len == len(batch) - 12
        records = decode_records(batch)
        assert len(records) == 20_000 and records[-1][2:4] == (keys[-1], values[-1])
        b.append(b"one", b"more", 1_700_000_000_001)  # the builder goes on: a copy
        assert len(decode_records(b.build())) == 20_001
        assert bytes(bytearray(batch)) == copy  # the handed-out batch never changed


def test_append_many_from_lists_matches_append_for_every_kind_of_item() -> None:
    """Lists of exact bytes, None and ints of up to two digits take append_many's inline
    reads; everything else (bytes-likes, str, bytes subclasses, large or negative ints, bool)
    the general path. Both must write what append writes, byte for byte."""

    class Sub(bytes):
        pass

    timestamps = [0, 1, 2**30 - 1, 2**30, 2**60 - 1, 2**60, 2**63 - 1, -1, -(2**40), True]
    timestamps += [1_700_000_000_000 + i for i in range(6)]
    kinds = [b"k", None, bytearray(b"ba"), "text", memoryview(b"mv"), Sub(b"sub"), b"", b"x" * 300]
    keys = [kinds[i % len(kinds)] for i in range(len(timestamps))]
    values = [kinds[(i + 3) % len(kinds)] for i in range(len(timestamps))]
    for key_column, value_column in ((keys, values), (tuple(keys), tuple(values)), (None, values)):
        bulk = RecordBatchBuilder()
        bulk.append_many(key_column, value_column, timestamps)
        one_by_one = RecordBatchBuilder()
        for i, ts in enumerate(timestamps):
            key = None if key_column is None else key_column[i]
            value = value_column[i]
            one_by_one.append(  # (append takes no str; append_many writes one as UTF-8)
                key.encode() if isinstance(key, str) else key,
                value.encode() if isinstance(value, str) else value,
                int(ts),
            )
        assert bulk.build() == one_by_one.build()
    # Without the bool the list is all exact ints, read in the loop itself (two 30-bit digits
    # inline, anything else through the C API); with it, converted up front.
    plain_ints = [t for t in timestamps if type(t) is int]
    n = len(plain_ints)
    bulk = RecordBatchBuilder()
    bulk.append_many(keys[:n], values[:n], plain_ints)
    one_by_one = RecordBatchBuilder()
    for key, value, ts in zip(keys[:n], values[:n], plain_ints, strict=True):
        one_by_one.append(
            key.encode() if isinstance(key, str) else key,
            value.encode() if isinstance(value, str) else value,
            ts,
        )
    assert bulk.build() == one_by_one.build()
    with pytest.raises(OverflowError):
        RecordBatchBuilder().append_many([b"k"], [b"v"], [2**63])


def test_records_made_as_a_named_tuple() -> None:
    """decode_records(record_type=...) makes each record as the caller's NamedTuple directly
    (the consumer's ConsumerRecord), equal to wrapping the plain tuples; records before
    min_offset are skipped, control batches too; the objects stay out of the GC."""
    import gc
    from typing import NamedTuple

    from kcore.codec import decode_records

    class Rec(NamedTuple):
        topic: str
        partition: int
        offset: int
        timestamp: int
        key: bytes | None
        value: bytes | None
        headers: tuple

    out = b""
    for codec in ("none", "lz4"):
        b = RecordBatchBuilder(codec, base_offset=len(out) and 3)
        b.append(b"k", None, 5, headers=[("h", b"v"), ("n", None)])
        b.append(None, b"", 6)
        b.append(b"k2", b"v" * 300, 7)
        out += b.build()
    plain = decode_records(out)
    made = decode_records(out, record_type=Rec, topic="t", partition=2)
    assert made == [Rec("t", 2, *r) for r in plain]
    assert all(type(r) is Rec for r in made) and not any(gc.is_tracked(r) for r in made)
    assert [r.offset for r in decode_records(out, min_offset=1, record_type=Rec)] == [1, 2, 3, 4, 5]
    with pytest.raises(TypeError, match="tuple subclass"):
        decode_records(out, record_type=dict)

    class Short(NamedTuple):
        a: int

    with pytest.raises(TypeError, match="7 fields"):
        decode_records(out, record_type=Short)
    del made
    gc.collect()


def test_release_frees_the_buffer_and_ends_the_builder() -> None:
    """release() (the producer's, once a batch landed) drops the buffer now; the record count
    stays, and a later append or build is a clear error, not a write to freed memory."""
    b = RecordBatchBuilder()
    b.append(b"k", b"v" * 1000, 5)
    built = b.build()
    b.release()
    b.release()  # twice is fine
    assert b.record_count == 1 and decode_batches(built)[0].records()[0][3] == b"v" * 1000
    with pytest.raises(ValueError, match="released"):
        b.append(b"k", b"v", 6)
    with pytest.raises(ValueError, match="released"):
        b.append_many(None, [b"v"], 6)
    with pytest.raises(ValueError, match="released"):
        b.build()


def test_a_failed_resize_loses_the_batch_loudly_not_into_freed_memory(tmp_path) -> None:
    """When growing the batch fails (out of memory), CPython frees the object: the builder
    must then raise on every use, naming the lost records, and never touch the old buffer.
    Run in a child with a capped address space, so the allocation really fails."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import resource
        from kcore.codec import RecordBatchBuilder
        b = RecordBatchBuilder()
        for i in range(3):
            b.append(b"k", b"v" * 100, i)
        big = memoryview(bytearray(256 << 20))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + (64 << 20), hard))
        try:
            b.append(b"k", big, 9)
        except MemoryError:
            print("first: MemoryError")
        for call in (lambda: b.append(b"k", b"v", 10), b.build):
            try:
                call()
            except MemoryError as exc:
                print("then:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout.splitlines()
        == ["first: MemoryError"]
        + ["then: this batch builder ran out of memory; its 3 record(s) are lost"] * 2
    )


def _headers_one_by_one(rows, values):
    b = RecordBatchBuilder()
    for value, headers in zip(values, rows, strict=True):
        b.append(None, value, 7, headers)
    return b.build()


def test_append_many_takes_headers_as_arrow_lists_or_python_pairs() -> None:
    """append_many's headers, as Spark's list<struct<key, value>> column (any offsets
    width, sliced, chunked, fields in either order) or per-record Python pairs, encode byte
    for byte as append() with the same headers."""
    import pyarrow as pa

    rows = [[("a", b"1"), ("b", None)], None, [], [("c", b"")], [("d" * 300, b"x" * 200)]] * 7
    values = [b"v%d" % i for i in range(len(rows))]
    expected = _headers_one_by_one(rows, values)

    def arrow(key_type, value_type, list_type=pa.list_, value_first=False):
        fields = [("key", key_type), ("value", value_type)]
        struct = pa.struct(fields[::-1] if value_first else fields)
        data = [None if r is None else [{"key": k, "value": v} for k, v in r] for r in rows]
        return pa.array(data, list_type(struct))

    forms = {
        "python": rows,
        "list<string, binary>": arrow(pa.string(), pa.binary()),
        "large": arrow(pa.large_string(), pa.large_binary(), pa.large_list),
        "binary key": arrow(pa.binary(), pa.binary()),
        "value first": arrow(pa.string(), pa.binary(), value_first=True),
        "chunked": pa.chunked_array(
            [arrow(pa.string(), pa.binary())[:9], arrow(pa.string(), pa.binary())[9:]]
        ),
    }
    for form, headers in forms.items():
        b = RecordBatchBuilder()
        b.append_many(None, values, 7, headers)
        assert b.build() == expected, form
    sliced = arrow(pa.string(), pa.binary()).slice(3, 11)
    b = RecordBatchBuilder()
    b.append_many(None, values[3:14], 7, sliced)
    assert b.build() == _headers_one_by_one(rows[3:14], values[3:14])


def test_append_many_through_rows_matches_the_rows_taken() -> None:
    """``rows`` reorders: entries start:stop of it pick the columns' rows (keys, values,
    per-record times, Python or Arrow headers), byte for byte as the taken columns; a row
    number out of range, or rows not an int64 array, raise before anything is written."""
    import numpy as np
    import pyarrow as pa

    n = 40
    keys = [None if i % 7 == 0 else b"k%d" % i for i in range(n)]
    values = [b"v%d" % i for i in range(n)]
    times = np.arange(1_700_000_000_000, 1_700_000_000_000 + n, dtype=np.int64)
    py_headers = [[("h", b"%d" % i)] if i % 3 else None for i in range(n)]
    entry = pa.struct([("key", pa.string()), ("value", pa.binary())])
    arrow_headers = pa.array(
        [None if r is None else [{"key": k, "value": v} for k, v in r] for r in py_headers],
        pa.list_(entry),
    )
    rows = np.random.default_rng(5).permutation(n).astype(np.int64)
    start, stop = 5, 30
    taken = rows[start:stop].tolist()
    for headers in (None, py_headers, arrow_headers):
        want = RecordBatchBuilder()
        want.append_many(
            [keys[i] for i in taken],
            [values[i] for i in taken],
            times[taken],
            None if headers is None else [py_headers[i] for i in taken],
        )
        got = RecordBatchBuilder()
        assert got.append_many(keys, values, times, headers, start, stop, 0, rows) == len(taken)
        assert got.build() == want.build()
    # Times as a list of ints (read in the loop), and a batch limit that stops part way.
    want = RecordBatchBuilder()
    want.append_many([keys[i] for i in taken], [values[i] for i in taken], times[taken])
    got = RecordBatchBuilder()
    assert got.append_many(keys, values, times.tolist(), None, start, stop, 0, rows) == 25
    assert got.build() == want.build()
    limit = 200
    part = RecordBatchBuilder()
    took = part.append_many(keys, values, times.tolist(), None, start, stop, limit, rows)
    assert 0 < took < len(taken)
    want = RecordBatchBuilder()
    first = taken[:took]
    want.append_many([keys[i] for i in first], [values[i] for i in first], times[first])
    assert part.build() == want.build()
    for bad, error in ((np.array([0, n], dtype=np.int64), IndexError), ([0, 1], TypeError)):
        b = RecordBatchBuilder()
        with pytest.raises(error):
            b.append_many(keys, values, 0, None, 0, 2, 0, bad)
        assert b.record_count == 0


def test_append_many_rejects_bad_headers() -> None:
    import pyarrow as pa

    b = RecordBatchBuilder()
    with pytest.raises(ValueError, match="2 header lists for 3 values"):
        b.append_many(None, [b"a", b"b", b"c"], 7, [None, None])
    with pytest.raises(TypeError, match="list<struct<key, value>>"):
        b.append_many(None, [b"a"], 7, pa.array([b"x"]))
    null_key = pa.array(
        [[{"key": None, "value": b"v"}]],
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
    )
    with pytest.raises(ValueError, match="header key is null"):
        b.append_many(None, [b"a"], 7, null_key)
    with pytest.raises(TypeError, match="header values are bytes"):
        b.append_many(None, [b"a"], 7, [[("k", "str value")]])
    entry = pa.struct([("key", pa.string()), ("value", pa.binary())])
    null_entry = pa.ListArray.from_arrays(
        [0, 3], pa.array([{"key": "k", "value": b"v"}, None, {"key": "k2", "value": b"2"}], entry)
    )
    with pytest.raises(ValueError, match="header key is null"):
        b.append_many(None, [b"a"], 7, null_entry)
    with pytest.raises(ValueError, match="header key is null"):
        prepare_headers(null_entry, 1)
    assert prepare_headers([None, [("k", bytearray(b"v"))], []], 3) == [None, [(b"k", b"v")], None]


def test_record_size_upper_bound_is_javas_estimate():
    """AbstractRecords.estimateSizeInBytesUpperBound for one record in a v2 batch of its own:
    61 (batch header) + 21 (record overhead) + zigzag length varint and bytes per field (a
    null is 1) + the header count and each header's key and value. Buffers count their bytes."""
    from array import array

    from kcore._codec import record_size_upper_bound as size

    assert size(None, b"x" * 100) == 61 + 21 + 1 + (2 + 100) + 1
    assert size(b"k", b"x" * 100, [("h", b"v"), ("i", None)]) == 61 + 21 + 2 + 102 + 1 + 4 + 3
    assert size(None, array("q", [0] * 4)) == 61 + 21 + 1 + (1 + 32) + 1
    assert size(b"", None) == 61 + 21 + 1 + 1 + 1
    assert size(None, b"x" * 64) == 61 + 21 + 1 + (2 + 64) + 1  # 64 zigzags to 128: 2 bytes
