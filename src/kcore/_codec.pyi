"""Type stubs for the compiled codec (src/kcore/_codec.pyx)."""

from collections.abc import Sequence
from typing import Literal

from typing_extensions import Buffer

Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]
Header = tuple[str | bytes, Buffer | None]
Record = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]

COMPRESSION_CODECS: dict[str, int]

def decode_uvarint(buf: Buffer, pos: int = 0) -> tuple[int, int]: ...
def decode_varint(buf: Buffer, pos: int = 0) -> tuple[int, int]: ...
def decode_varlong(buf: Buffer, pos: int = 0) -> tuple[int, int]: ...
def encode_uvarint(value: int) -> bytes: ...
def encode_varint(value: int) -> bytes: ...
def encode_varlong(value: int) -> bytes: ...
def crc32c(data: Buffer, value: int = 0) -> int: ...
def murmur2(data: Buffer) -> int: ...
def partition_for_key(key: Buffer, num_partitions: int) -> int: ...

class RecordBatchBuilder:
    record_count: int
    base_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    codec: int
    def __init__(
        self,
        compression: Compression = "none",
        *,
        base_offset: int = 0,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        transactional: bool = False,
    ) -> None: ...
    def __len__(self) -> int: ...
    @property
    def size_in_bytes(self) -> int: ...
    def append(
        self,
        key: Buffer | None,
        value: Buffer | None,
        timestamp_ms: int,
        headers: Sequence[Header] | None = None,
    ) -> None: ...
    def build(self) -> bytes: ...

class RecordBatch:
    base_offset: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    @property
    def compression(self) -> str: ...
    @property
    def timestamp_type(self) -> int: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def is_control(self) -> bool: ...
    @property
    def last_offset(self) -> int: ...
    def records(self) -> list[Record]: ...

def decode_batches(buf: Buffer, allow_partial: bool = False) -> list[RecordBatch]: ...
