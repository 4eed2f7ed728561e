"""Output checks for the codec benchmarks, run outside the timed region: a broken fast path
must fail its benchmark, not look fast. Encoded batches are read back by aiokafka's decoder (not
kcore's), so kcore's encoder is checked against an independent implementation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from _workload import CODEC_IDS, KEY_SIZE, VALUE_SIZE, Workload


def _first_diff(got: Sequence[Any], want: Sequence[Any]) -> str:
    if len(got) != len(want):
        return f"{len(got)} items, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            return f"first difference at index {i}: {g!r} != {w!r}"
    return "no difference"


def _same(what: str, got: Sequence[Any], want: Sequence[Any]) -> None:
    if got != want:
        raise AssertionError(f"{what}: {_first_diff(got, want)}")


def check_rows(rows: Sequence[Sequence[Any]], workload: Workload) -> None:
    """``rows`` are per-record tuples starting (offset, timestamp, key, value[, headers])."""
    assert len(rows) == len(workload), f"{len(rows)} records decoded, expected {len(workload)}"
    _same("offsets", [r[0] for r in rows], workload.offsets)
    _same("timestamps", [r[1] for r in rows], workload.timestamps)
    _same("keys", [r[2] for r in rows], workload.keys)
    _same("values", [r[3] for r in rows], workload.values)
    for i, r in enumerate(rows):
        if not isinstance(r[2], bytes) or not isinstance(r[3], bytes):
            raise AssertionError(f"record {i}: key/value are {type(r[2])}/{type(r[3])}")
        if len(r) > 4 and len(r[4]) != 0:
            raise AssertionError(f"record {i} has headers {r[4]!r}; the workload has none")


def check_encoded(
    buf: bytes | bytearray, codec: str, workload: Workload, reference: bytes | None = None
) -> None:
    """``buf`` is one v2 batch holding the whole workload, compressed with ``codec``, with a
    valid CRC, as aiokafka's decoder reads it; and equals ``reference`` if one is given."""
    from aiokafka.record.memory_records import MemoryRecords

    data = bytes(buf)
    length = int.from_bytes(data[8:12], "big", signed=True) + 12
    assert length == len(data), f"batch length field says {length} bytes, buffer has {len(data)}"
    records = MemoryRecords(data)
    found = []
    while (batch := records.next_batch()) is not None:
        found.append(batch)
    assert len(found) == 1, f"{len(found)} batches, expected 1"
    batch = found[0]
    assert batch.magic == 2
    assert batch.validate_crc(), "batch CRC does not match its bytes"
    assert batch.compression_type == CODEC_IDS[codec], (
        f"batch compression is {batch.compression_type}, expected {CODEC_IDS[codec]} ({codec})"
    )
    check_rows([(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch], workload)
    if reference is not None and data != reference:
        raise AssertionError(
            f"batch differs from the reference encoding ({len(data)} vs {len(reference)} bytes): "
            + _first_diff(data, reference)
        )


def check_columns(cols: Any, workload: Workload) -> None:
    """A kcore ``ColumnarRecords`` holding the workload."""
    n = len(workload)
    assert cols.num_rows == n, f"{cols.num_rows} rows, expected {n}"
    assert cols.key_nulls == 0 and cols.value_nulls == 0 and cols.num_headers == 0
    offset = np.frombuffer(memoryview(cols.offset), dtype=np.int64)
    assert np.array_equal(offset, np.arange(n, dtype=np.int64)), "offset column is wrong"
    timestamp = np.frombuffer(memoryview(cols.timestamp), dtype=np.int64)
    assert np.array_equal(timestamp, workload.timestamps_np), "timestamp column is wrong"
    for name, items, size in (
        ("key", workload.keys, KEY_SIZE),
        ("value", workload.values, VALUE_SIZE),
    ):
        offsets = np.frombuffer(memoryview(getattr(cols, f"{name}_offsets")), dtype=np.int32)
        assert np.array_equal(offsets, np.arange(n + 1, dtype=np.int32) * size), (
            f"{name}_offsets column is wrong"
        )
        assert bytes(memoryview(getattr(cols, f"{name}_data"))) == b"".join(items), (
            f"{name}_data column is wrong"
        )


def check_arrow(rb: Any, workload: Workload) -> None:
    """A ``pyarrow.RecordBatch`` from kcore's ``decode_to_arrow`` holding the workload."""
    import pyarrow as pa

    n = len(workload)
    assert rb.num_rows == n, f"{rb.num_rows} rows, expected {n}"
    assert rb.column("key").equals(workload.keys_pa), "key column is wrong"
    assert rb.column("value").equals(workload.values_pa), "value column is wrong"
    assert rb.column("offset").equals(pa.array(np.arange(n, dtype=np.int64))), "offset is wrong"
    ts = rb.column("timestamp").cast(pa.int64())
    assert ts.equals(workload.timestamps_pa), "timestamp column is wrong"
    assert rb.column("timestampType").to_numpy().max() == 0
