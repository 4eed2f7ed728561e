"""Public face of the compiled codec: record batches, CRC32C, varints, murmur2, compression
framing and the columnar decode.

Everything here is implemented in ``kcore._codec`` (Cython); this module names it and adds the
one piece that needs numpy (``columns_as_numpy``)."""

from __future__ import annotations

from typing import Any

from ._codec import (
    COMPRESSION_CODECS,
    DEFAULT_COMPRESSION_LEVEL,
    DEFAULT_MAX_DECOMPRESSED_SIZE,
    MAX_SHARE_GAPS,
    ArrowColumns,
    ColumnarRecords,
    ColumnBuffer,
    LegacyBatch,
    RecordBatch,
    RecordBatchBuilder,
    arena_cache_stats,
    columnar_records,
    compress,
    crc32c,
    crc32c_implementation,
    crc32c_join,
    decode_batches,
    decode_columns,
    decode_records,
    decode_to_arrow,
    decode_uvarint,
    decode_varint,
    decode_varlong,
    decompress,
    encode_uvarint,
    encode_varint,
    encode_varlong,
    lz4_high_compression_available,
    murmur2,
    partition_for_key,
    partitions_for_keys,
    prepare_headers,
    receive_buffer,
    record_columns,
    scan_complete_batches,
    set_arena_cache_limit,
    set_buffer_pool_limit,
    zstd_context_reuse_available,
)

__all__ = [
    "COMPRESSION_CODECS",
    "DEFAULT_COMPRESSION_LEVEL",
    "DEFAULT_MAX_DECOMPRESSED_SIZE",
    "MAX_SHARE_GAPS",
    "ArrowColumns",
    "ColumnarRecords",
    "ColumnBuffer",
    "LegacyBatch",
    "RecordBatch",
    "RecordBatchBuilder",
    "arena_cache_stats",
    "columnar_records",
    "columns_as_numpy",
    "compress",
    "crc32c",
    "crc32c_implementation",
    "crc32c_join",
    "decode_batches",
    "decode_columns",
    "decode_records",
    "decode_to_arrow",
    "decode_uvarint",
    "decode_varint",
    "decode_varlong",
    "decompress",
    "encode_uvarint",
    "encode_varint",
    "encode_varlong",
    "lz4_high_compression_available",
    "murmur2",
    "partition_for_key",
    "partitions_for_keys",
    "prepare_headers",
    "receive_buffer",
    "record_columns",
    "scan_complete_batches",
    "set_arena_cache_limit",
    "set_buffer_pool_limit",
    "zstd_context_reuse_available",
]


def columns_as_numpy(cols: ColumnarRecords) -> dict[str, Any]:
    """The fixed-width columns of :func:`decode_columns` as numpy arrays over the same memory
    (no copy): ``offset`` and ``timestamp`` (int64), ``timestamp_type`` (int32), and the
    ``key``/``value`` offsets (int32, n+1 entries) and data (uint8)."""
    import numpy as np

    return {
        "offset": np.frombuffer(memoryview(cols.offset), dtype=np.int64),
        "timestamp": np.frombuffer(memoryview(cols.timestamp), dtype=np.int64),
        "timestamp_type": np.frombuffer(memoryview(cols.timestamp_type), dtype=np.int32),
        "key_offsets": np.frombuffer(memoryview(cols.key_offsets), dtype=np.int32),
        "key_data": np.frombuffer(memoryview(cols.key_data), dtype=np.uint8),
        "value_offsets": np.frombuffer(memoryview(cols.value_offsets), dtype=np.int32),
        "value_data": np.frombuffer(memoryview(cols.value_data), dtype=np.uint8),
    }
