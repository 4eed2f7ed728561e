"""Type stubs for the compiled codec (src/kcore/_codec.pyx and src/kcore/_native/*.pxi)."""

from array import array
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from typing_extensions import Buffer

_T = TypeVar("_T", bound=tuple[Any, ...])

Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]
Header = tuple[str | bytes, Buffer | None]
Record = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]

COMPRESSION_CODECS: dict[str, int]
DEFAULT_MAX_DECOMPRESSED_SIZE: int
MAX_SHARE_GAPS: int
DEFAULT_COMPRESSION_LEVEL: int
XERIAL_MAGIC: bytes

def decode_uvarint(buf: Buffer, pos: int = 0) -> tuple[int, int]: ...
def decode_varint(buf: Buffer, pos: int = 0) -> tuple[int, int]: ...
def decode_varlong(buf: Buffer, pos: int = 0) -> tuple[int, int]: ...
def encode_uvarint(value: int) -> bytes: ...
def encode_varint(value: int) -> bytes: ...
def encode_varlong(value: int) -> bytes: ...
def crc32c(data: Buffer, value: int = 0) -> int: ...
def crc32c_software(data: Buffer, value: int = 0) -> int: ...
def crc32c_join(crc_a: int, crc_b: int, length_b: int) -> int: ...
def crc32c_implementation() -> Literal["hardware", "software"]: ...
def xxhash32(data: Buffer, seed: int = 0) -> int: ...
def murmur2(data: Buffer) -> int: ...
def partition_for_key(key: Buffer, num_partitions: int) -> int: ...
def partitions_for_keys(keys: Any, num_partitions: int) -> array[int]: ...
def prepare_headers(headers: Any, n: int) -> Any: ...
def compress(codec: Compression, data: Buffer, level: int = ...) -> bytes: ...
def decompress(codec: Compression, data: Buffer, max_size: int = ...) -> bytes: ...
def lz4_high_compression_available() -> bool: ...
def zstd_context_reuse_available() -> bool: ...
def set_buffer_pool_limit(limit_bytes: int) -> None: ...
def receive_buffer(size: int) -> ReceiveBuffer: ...
def scan_complete_batches(
    buf: Buffer, epochs: list[tuple[int, int]] | None = None
) -> tuple[int, int] | None: ...

class ReceiveBuffer(Buffer):
    def __init__(self, size: int) -> None: ...
    def __len__(self) -> int: ...

def set_arena_cache_limit(limit_bytes: int) -> None: ...
def record_size_upper_bound(
    key: Buffer | None, value: Buffer | None, headers: Sequence[Header] | None = None
) -> int: ...
def arena_cache_stats() -> dict[str, int]: ...

class ColumnBuffer(Buffer):
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class BatchBufferPool:
    held_bytes: int
    limit: int
    min_buffer: int
    max_buffer: int
    reuses: int
    def __init__(self, min_buffer: int = 65536, max_buffer: int = ..., limit: int = 0) -> None: ...
    def __len__(self) -> int: ...
    def trim(self, keep: int = 0) -> None: ...

class RecordBatchBuilder:
    record_count: int
    base_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    is_control: bool
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
        is_control: bool = False,
        compression_level: int = ...,
        partition_leader_epoch: int = -1,
        log_append_time: bool = False,
        pool: BatchBufferPool | None = None,
        capacity: int = 0,
        max_capacity: int = 0,
    ) -> None: ...
    def __len__(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    def set_producer(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        transactional: bool = False,
    ) -> None: ...
    @property
    def size_in_bytes(self) -> int: ...
    @property
    def compression(self) -> Compression: ...
    def append(
        self,
        key: Buffer | None,
        value: Buffer | None,
        timestamp_ms: int,
        headers: Sequence[Header] | None = None,
    ) -> int: ...
    def append_many(
        self,
        keys: Any,
        values: Any,
        timestamp_ms: int | Any,
        headers: Any = None,
        start: int = 0,
        stop: int = -1,
        max_bytes: int = 0,
        rows: Any = None,
    ) -> int: ...
    def build(self) -> bytes: ...
    def release(self) -> None: ...

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
    position: int
    size_in_bytes: int
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
    @property
    def next_offset(self) -> int: ...
    def control_type(self) -> str | None: ...
    def records(self) -> list[Record]: ...
    def records_as(
        self,
        record_type: type[_T],
        topic: str | None,
        partition: int | None,
        min_offset: int = -1,
    ) -> list[_T]: ...
    def acquired_records(
        self,
        record_type: type[_T],
        topic: str | None,
        partition: int | None,
        ranges: list[tuple[int, int, int]],
        gaps: list[int],
    ) -> list[_T]: ...

class LegacyBatch:
    last_offset: int
    magic: int
    crc: int
    attributes: int
    timestamp: int
    position: int
    size_in_bytes: int
    @property
    def compression(self) -> str: ...
    @property
    def timestamp_type(self) -> int: ...
    @property
    def is_control(self) -> bool: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    def records(self) -> list[Record]: ...
    def records_as(
        self,
        record_type: type[_T],
        topic: str | None,
        partition: int | None,
        min_offset: int = -1,
    ) -> list[_T]: ...

class ColumnarRecords:
    num_rows: int
    offset: ColumnBuffer
    timestamp: ColumnBuffer
    timestamp_type: ColumnBuffer
    key_offsets: ColumnBuffer
    key_data: ColumnBuffer
    key_validity: ColumnBuffer
    value_offsets: ColumnBuffer
    value_data: ColumnBuffer
    value_validity: ColumnBuffer
    header_offsets: ColumnBuffer
    header_key_offsets: ColumnBuffer
    header_key_data: ColumnBuffer
    header_value_offsets: ColumnBuffer
    header_value_data: ColumnBuffer
    header_value_validity: ColumnBuffer
    key_nulls: int
    value_nulls: int
    header_value_nulls: int
    num_headers: int
    include_headers: bool
    with_source: bool
    partition: ColumnBuffer
    topic_offsets: ColumnBuffer
    topic_data: ColumnBuffer
    def reserve_values(self, nbytes: int) -> None: ...
    def append_from(
        self,
        buf: Buffer,
        start: int = 0,
        *,
        min_offset: int = -1,
        max_rows: int = -1,
        topic: str = "",
        partition: int = 0,
        skip_control: bool = True,
        check_crcs: bool = True,
        max_decompressed_size: int = ...,
    ) -> tuple[int, int, int, int]: ...
    def append_acquired(
        self,
        batch: RecordBatch,
        ranges: list[tuple[int, int, int]],
        gaps: list[int],
        counts: ColumnBuffer,
        topic: str,
        partition: int,
    ) -> int: ...
    def to_arrow(self, extra: ColumnBuffer | None = None, extra_name: str | None = None) -> Any: ...
    def to_arrow_by_columns(self) -> Any: ...

class ArrowColumns:
    """Columns as Arrow data (the Arrow PyCapsule interface)."""

    def __init__(
        self,
        cols: ColumnarRecords,
        extra: ColumnBuffer | None = None,
        extra_name: str | None = None,
    ) -> None: ...
    def __arrow_c_array__(self, requested_schema: object = None) -> tuple[object, object]: ...

def columnar_records() -> ColumnarRecords: ...
def record_columns(
    records: list[Any], count_field: int = -1
) -> tuple[ColumnarRecords, ColumnBuffer]: ...
def decode_batches(
    buf: Buffer,
    allow_partial: bool = False,
    *,
    check_crcs: bool = True,
    max_decompressed_size: int = ...,
) -> list[RecordBatch | LegacyBatch]: ...
def decode_records(
    buf: Buffer,
    allow_partial: bool = True,
    min_offset: int = -1,
    skip_control: bool = True,
    max_decompressed_size: int = ...,
    *,
    check_crcs: bool = True,
    record_type: type[tuple[Any, ...]] | None = None,
    topic: str | None = None,
    partition: int | None = None,
) -> list[Any]: ...
def decode_columns(
    buf: Buffer,
    *,
    min_offset: int = -1,
    skip_control: bool = True,
    include_headers: bool = True,
    allow_partial: bool = True,
    timestamp_unit: Literal["ms", "us"] = "ms",
    max_decompressed_size: int = ...,
    check_crcs: bool = True,
) -> ColumnarRecords: ...
def decode_to_arrow(buf: Buffer, **options: Any) -> Any: ...
