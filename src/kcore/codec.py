"""Public face of the compiled codec: record batches, CRC32C, varints and murmur2.

Everything here is implemented in ``kcore._codec`` (Cython); this module only names it."""

from ._codec import (
    COMPRESSION_CODECS,
    RecordBatch,
    RecordBatchBuilder,
    crc32c,
    decode_batches,
    decode_uvarint,
    decode_varint,
    decode_varlong,
    encode_uvarint,
    encode_varint,
    encode_varlong,
    murmur2,
    partition_for_key,
)

__all__ = [
    "COMPRESSION_CODECS",
    "RecordBatch",
    "RecordBatchBuilder",
    "crc32c",
    "decode_batches",
    "decode_uvarint",
    "decode_varint",
    "decode_varlong",
    "encode_uvarint",
    "encode_varint",
    "encode_varlong",
    "murmur2",
    "partition_for_key",
]
