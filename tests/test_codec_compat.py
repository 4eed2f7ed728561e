"""kcore's codec against the Python Kafka clients installed as oracles (no broker).

* v2 record batches: kcore's uncompressed batch is byte-for-byte what kafka-python and
  aiokafka (its compiled and its pure builder) write for the same records, producer state and
  flags; every codec decodes both ways, and where the peer's compressor is deterministic and
  frames as kcore does the compressed bytes are equal too (snappy and zstd).
* Legacy message sets (magic 0 and 1, plain and gzip/snappy/lz4 wrappers) built by the peers'
  LegacyRecordBatchBuilder decode to the right offsets, timestamps, keys and values; broken
  CRCs raise CrcMismatchError.
* Compression framing that other producers write: xerial snappy with any version fields, raw
  snappy, several zstd frames, zstd frames without a content size, LZ4 frames with other flags,
  and the decompression limit.
* CRC32C, murmur2 and the default partitioner against the crc32c / google_crc32c packages and
  kafka-python; ``append_many`` against the equivalent ``append`` loop for every input kind;
  ``decode_to_arrow`` against ``decode_records`` row for row.

Where kafka-python's own codecs need packages that kcore's dev extras do not pull in
(python-snappy, lz4, zstandard, xxhash), those cases are skipped, not failed: aiokafka (whose
codecs are cramjam, like kcore's) covers every codec regardless.
"""

from __future__ import annotations

import array
import gzip
import importlib.metadata
import random
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import cramjam
import crc32c as crc32c_pkg
import google_crc32c
import kafka.codec
import numpy as np
import pyarrow as pa
import pytest
from aiokafka import codec as aiokafka_codec
from aiokafka.record import default_records as aio_default
from aiokafka.record import legacy_records as aio_legacy
from aiokafka.record import memory_records as aio_memory
from kafka.partitioner.default import DefaultPartitioner
from kafka.partitioner.default import murmur2 as kafka_murmur2
from kafka.record import default_records as kp_default
from kafka.record import legacy_records as kp_legacy
from kafka.record.memory_records import MemoryRecords as KafkaPythonMemoryRecords

from kcore import _codec
from kcore.codec import (
    LegacyBatch,
    RecordBatch,
    RecordBatchBuilder,
    compress,
    crc32c,
    decode_batches,
    decode_records,
    decode_to_arrow,
    decompress,
    murmur2,
    partition_for_key,
)
from kcore.errors import CorruptRecordError, CrcMismatchError, DecompressionLimitError

CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
COMPRESSED = ["gzip", "snappy", "lz4", "zstd"]
HEADER_SIZE = 61  # v2 batch header
LENGTH, LEADER_EPOCH, CRC, ATTRIBUTES = slice(8, 12), slice(12, 16), slice(17, 21), 21

try:
    from aiokafka.record import _crecords as aio_c
except ImportError:  # pragma: no cover - aiokafka built without its extension
    aio_c = None


# -- the peers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    name: str
    builder: Any  # v2 DefaultRecordBatchBuilder
    batch: Any  # v2 DefaultRecordBatch (reader)
    legacy_builder: Any
    legacy_batch: Any
    memory_records: Any
    codecs: Any  # module with has_snappy() etc.
    # kafka-python writes 0 as the partition leader epoch; aiokafka and Java write -1
    # (RecordBatch.NO_PARTITION_LEADER_EPOCH). The broker overwrites the field either way.
    leader_epoch: int

    def has(self, codec: str) -> bool:
        return codec == "none" or getattr(self.codecs, f"has_{codec}")()

    def __str__(self) -> str:
        return self.name


PEERS = [
    Peer(
        "kafka-python",
        kp_default.DefaultRecordBatchBuilder,
        kp_default.DefaultRecordBatch,
        kp_legacy.LegacyRecordBatchBuilder,
        kp_legacy.LegacyRecordBatch,
        KafkaPythonMemoryRecords,
        kafka.codec,
        0,
    ),
    Peer(
        "aiokafka-py",
        aio_default._DefaultRecordBatchBuilderPy,
        aio_default._DefaultRecordBatchPy,
        aio_legacy._LegacyRecordBatchBuilderPy,
        aio_legacy._LegacyRecordBatchPy,
        aio_memory._MemoryRecordsPy,
        aiokafka_codec,
        -1,
    ),
]
if aio_c is not None:
    PEERS.append(
        Peer(
            "aiokafka-c",
            aio_c.DefaultRecordBatchBuilder,
            aio_c.DefaultRecordBatch,
            aio_c.LegacyRecordBatchBuilder,
            aio_c.LegacyRecordBatch,
            aio_c.MemoryRecords,
            aiokafka_codec,
            -1,
        )
    )


def need(peer: Peer, codec: str) -> None:
    # The peers' codec packages are dev dependencies (pyproject.toml): missing is a failure.
    assert peer.has(codec), f"{peer} has no {codec} codec: install kcore's [dev] extras"


# -- records -----------------------------------------------------------------------------------

BASE_TS = 1_700_000_000_000

# (key, value, timestamp, headers): None and b"" keys, values and header values, a header name
# that is empty and one that is not ASCII, timestamps that go backwards (negative deltas) and
# far forwards, and sizes that need multi-byte varints.
RECORDS: list[tuple[bytes | None, bytes | None, int, list]] = [
    (b"k0", b"v0", BASE_TS, [("a", b"1"), ("b", None)]),
    (None, b"v1", BASE_TS + 5, []),
    (b"", None, BASE_TS - 10, [("", b"")]),
    (b"k3", b"", BASE_TS + 3_600_000, [("é€", b"x" * 200)]),
    (None, None, BASE_TS + 1, [("n", None), ("n", None)]),
    (b"k" * 300, b"v" * 70_000, BASE_TS + 50, []),
    (
        b"k6",
        bytes(range(256)) * 3,
        BASE_TS - 100_000,
        [(f"h{i}", str(i).encode()) for i in range(20)],
    ),
]

# Repetitive enough that every peer's compressor shrinks it: the peers send a batch
# uncompressed when compression does not pay, and these tests need it compressed.
COMPRESSIBLE = [
    (
        None if i % 7 == 3 else b"" if i % 11 == 5 else b"key-%d" % i,
        None if i % 5 == 4 else b"" if i % 9 == 8 else b"value %d " % i + b"kafka " * (i * 5),
        BASE_TS + i * 13 - (400 if i % 6 == 2 else 0),
        [("trace", b"t-%d" % i)] + ([("null", None)] if i % 4 == 1 else []),
    )
    for i in range(60)
]

PRODUCER_STATES = {
    "plain": dict(producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=False),
    "idempotent": dict(
        producer_id=123_456_789_012, producer_epoch=7, base_sequence=42, transactional=False
    ),
    "transactional": dict(
        producer_id=2**62 + 5, producer_epoch=32_000, base_sequence=2**31 - 10, transactional=True
    ),
}


def expected(records, base_offset: int = 0) -> list[tuple]:
    return [(base_offset + i, ts, k, v, tuple(h)) for i, (k, v, ts, h) in enumerate(records)]


def kcore_batch(records, codec: str = "none", **kwargs) -> bytes:
    builder = RecordBatchBuilder(codec, **kwargs)
    for k, v, ts, h in records:
        builder.append(k, v, ts, h)
    return builder.build()


def peer_batch(peer: Peer, records, codec: str = "none", state: str = "plain") -> bytes:
    s = PRODUCER_STATES[state]
    builder = peer.builder(
        magic=2,
        compression_type=CODEC_IDS[codec],
        is_transactional=s["transactional"],
        producer_id=s["producer_id"],
        producer_epoch=s["producer_epoch"],
        base_sequence=s["base_sequence"],
        batch_size=1 << 30,
    )
    for i, (k, v, ts, h) in enumerate(records):
        assert builder.append(i, timestamp=ts, key=k, value=v, headers=h) is not None
    return bytes(builder.build())


def peer_batches(peer: Peer, buf: bytes) -> list:
    """The batches of ``buf`` as the peer's MemoryRecords splits it."""
    records = peer.memory_records(bytes(buf))
    out = []
    while records.has_next():
        out.append(records.next_batch())
    return out


def peer_records(peer: Peer, buf: bytes) -> list[tuple]:
    """Every record of ``buf`` as the peer decodes it (headers as a tuple)."""
    out = []
    for batch in peer_batches(peer, buf):
        for r in batch:
            out.append((r.offset, r.timestamp, r.key, r.value, tuple(r.headers)))
    return out


def with_crc(batch: bytes | bytearray) -> bytes:
    """A v2 batch with its CRC recomputed (by the crc32c package, not by kcore)."""
    out = bytearray(batch)
    out[CRC] = struct.pack(">I", crc32c_pkg.crc32c(bytes(out[ATTRIBUTES:])))
    return bytes(out)


def with_payload(batch: bytes, payload: bytes) -> bytes:
    """``batch`` with its records section replaced by ``payload`` (length and CRC fixed)."""
    out = bytearray(batch[:HEADER_SIZE] + payload)
    out[LENGTH] = struct.pack(">i", len(out) - 12)
    return with_crc(out)


def records_section(records) -> bytes:
    return kcore_batch(records)[HEADER_SIZE:]


# -- v2 batches: bytes ---------------------------------------------------------------------


@pytest.mark.parametrize("state", list(PRODUCER_STATES))
@pytest.mark.parametrize("peer", PEERS, ids=str)
@pytest.mark.parametrize(
    "records", [RECORDS, RECORDS[:1], COMPRESSIBLE], ids=["mixed", "one", "many"]
)
def test_uncompressed_batch_bytes_equal_peer(peer, state, records):
    s = PRODUCER_STATES[state]
    theirs = peer_batch(peer, records, state=state)
    # Same as the peer once the peer's partition leader epoch is used (the CRC does not
    # cover it)...
    assert kcore_batch(records, partition_leader_epoch=peer.leader_epoch, **s) == theirs
    # ... and kcore's default is Java's -1: only those four bytes can differ.
    ours = kcore_batch(records, **s)
    assert ours[LEADER_EPOCH] == b"\xff\xff\xff\xff"
    assert ours[:12] + ours[16:] == theirs[:12] + theirs[16:]


def test_batch_header_fields_are_javas():
    """What Java's MemoryRecordsBuilder writes: base timestamp = the first record's, max
    timestamp = the largest, last offset delta, producer fields, attributes."""
    ours = kcore_batch(RECORDS, base_offset=1000, **PRODUCER_STATES["transactional"])
    (
        base_offset,
        length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_delta,
        base_ts,
        max_ts,
        pid,
        epoch,
        seq,
        count,
    ) = struct.unpack(">qiibIhiqqqhii", ours[:HEADER_SIZE])
    assert (base_offset, length, leader_epoch, magic) == (1000, len(ours) - 12, -1, 2)
    assert crc == crc32c_pkg.crc32c(ours[ATTRIBUTES:])
    assert attributes == 0x10  # transactional, CreateTime, no compression, not control
    assert (last_delta, count) == (len(RECORDS) - 1, len(RECORDS))
    assert base_ts == RECORDS[0][2] and max_ts == max(r[2] for r in RECORDS)
    assert (pid, epoch, seq) == (2**62 + 5, 32_000, 2**31 - 10)


@pytest.mark.parametrize("peer", PEERS, ids=str)
def test_peer_reads_kcore_batch_header(peer):
    batch = peer.batch(kcore_batch(RECORDS, base_offset=77, **PRODUCER_STATES["idempotent"]))
    assert batch.validate_crc()
    assert (batch.base_offset, batch.first_timestamp, batch.max_timestamp) == (
        77,
        RECORDS[0][2],
        max(r[2] for r in RECORDS),
    )
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (
        123_456_789_012,
        7,
        42,
    )
    assert not batch.is_transactional and batch.timestamp_type == 0


# -- v2 batches: every codec, both ways ------------------------------------------------------


def byte_equal(peer: Peer, codec: str) -> bool:
    """Whether the peer's compressed batch is byte-for-byte kcore's: both sides run the same
    compressor with the same framing. snappy: xerial framing, 32 KiB blocks, cramjam's snappy
    (kafka-python's python-snappy is cramjam from 0.7 on); zstd: one frame at level 3 with its
    content size (cramjam, or zstandard's libzstd for kafka-python). gzip never is (the peers
    use Python's zlib at level 9 with the current time in the header, kcore cramjam's deflate at
    Java's level 6), nor lz4 (the peers' frames carry a content size or block checksums; kcore
    writes Java's flags: independent 64 KiB blocks, nothing else)."""
    if codec == "zstd":
        return True
    if codec == "snappy":
        if peer.name != "kafka-python":
            return True
        version = importlib.metadata.version("python-snappy").split(".")
        return tuple(int(p) for p in version[:2]) >= (0, 7)
    return False


@pytest.mark.parametrize("codec", COMPRESSED)
@pytest.mark.parametrize("peer", PEERS, ids=str)
def test_compressed_batches_cross_decode(peer, codec):
    need(peer, codec)
    want = expected(COMPRESSIBLE)
    theirs = peer_batch(peer, COMPRESSIBLE, codec, state="idempotent")
    ours = kcore_batch(COMPRESSIBLE, codec, **PRODUCER_STATES["idempotent"])

    # kcore reads the peer's batch...
    [batch] = decode_batches(theirs)
    assert batch.compression == codec  # the peer did compress it
    assert batch.records() == want
    assert decode_records(theirs) == want
    # ... the peer reads kcore's...
    assert peer.batch(ours).validate_crc()
    assert peer_records(peer, ours) == want
    # ... the records inside are the same bytes, and so is the rest of the header.
    assert decompress(codec, theirs[HEADER_SIZE:]) == decompress(codec, ours[HEADER_SIZE:])
    assert decompress(codec, ours[HEADER_SIZE:]) == records_section(COMPRESSIBLE)
    assert theirs[:8] + theirs[16:17] + theirs[ATTRIBUTES:HEADER_SIZE] == (
        ours[:8] + ours[16:17] + ours[ATTRIBUTES:HEADER_SIZE]
    )
    if byte_equal(peer, codec):
        assert ours[:12] + ours[16:] == theirs[:12] + theirs[16:]


@pytest.mark.parametrize("codec", COMPRESSED)
def test_compressed_batch_of_large_records_round_trips(codec):
    """Past one compression block (xerial 32 KiB, LZ4 64 KiB) and with incompressible data."""
    rng = random.Random(codec)
    records = [
        (b"k%d" % i, rng.randbytes(100_000) if i % 2 else b"z" * 150_000, BASE_TS + i, [])
        for i in range(6)
    ]
    ours = kcore_batch(records, codec)
    assert decode_records(ours) == expected(records)
    peer = PEERS[-1]  # aiokafka: every codec is there
    assert peer_records(peer, ours) == expected(records)
    assert peer_records(peer, peer_batch(peer, records, codec)) == expected(records)


def test_empty_batch():
    raw = RecordBatchBuilder().build()
    [empty] = decode_batches(raw)
    assert (empty.record_count, empty.records(), decode_records(raw)) == (0, [], [])
    assert decode_to_arrow(raw).num_rows == 0


@pytest.mark.parametrize("codec", COMPRESSED)
def test_empty_compressed_batch(codec):
    raw = RecordBatchBuilder(codec).build()
    [empty] = decode_batches(raw)
    assert empty.record_count == 0
    assert empty.records() == []


def test_log_append_time_batch():
    lat = kcore_batch(RECORDS, log_append_time=True)
    [batch] = decode_batches(lat)
    assert batch.timestamp_type == 1
    # LogAppendTime: every record's timestamp is the batch's max timestamp (as Java reads it).
    want = [(o, batch.max_timestamp, k, v, h) for o, _, k, v, h in expected(RECORDS)]
    assert batch.records() == want
    for peer in PEERS:
        assert peer_records(peer, lat) == want


# -- legacy message sets (magic 0 and 1) -----------------------------------------------------

LEGACY = [
    (b"k0", b"v0" * 50, 1_600_000_000_000),
    (None, b"v1" * 50, 1_600_000_000_010),
    (b"", None, 1_600_000_000_005),
    (b"k3", b"", 1_600_000_000_020),
    (b"k4", b"value " * 300, 1_600_000_000_001),
]
BASE = 100  # where the message set starts in the log


def legacy_set(peer: Peer, magic: int, codec: str, records=LEGACY, base: int = BASE) -> bytes:
    """A message set as the broker stores it: plain messages carry absolute offsets; a
    compressed wrapper carries the last inner offset, and its inner messages absolute offsets
    (magic 0) or relative ones 0..n-1 (magic 1, as the producer wrote them)."""
    builder = peer.legacy_builder(
        magic=magic, compression_type=CODEC_IDS[codec], batch_size=1 << 30
    )
    for i, (k, v, ts) in enumerate(records):
        offset = i if codec != "none" and magic == 1 else base + i
        assert builder.append(offset, timestamp=ts, key=k, value=v) is not None
    raw = bytes(builder.build())
    if codec != "none":  # the wrapper's offset is not under its CRC
        raw = struct.pack(">q", base + len(records) - 1) + raw[8:]
    return raw


def legacy_expected(magic: int, records=LEGACY, base: int = BASE) -> list[tuple]:
    return [(base + i, ts if magic else -1, k, v, ()) for i, (k, v, ts) in enumerate(records)]


def peer_legacy_records(peer: Peer, raw: bytes) -> list[tuple]:
    return [
        (r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value, ())
        for batch in peer_batches(peer, raw)
        for r in batch
    ]


def legacy_cases():
    for peer in PEERS:
        for magic in (0, 1):
            for codec in ("none", "gzip", "snappy", "lz4"):
                if codec == "lz4" and magic == 0 and peer.name != "kafka-python":
                    continue  # aiokafka refuses LZ4 in magic 0 (KAFKA-3160's broken checksum)
                marks: list = []
                yield pytest.param(peer, magic, codec, marks=marks, id=f"{peer}-v{magic}-{codec}")


def need_legacy(peer: Peer, magic: int, codec: str) -> None:
    need(peer, codec)
    if codec == "lz4" and magic == 0 and kafka.codec.xxhash is None:
        pytest.fail("kafka-python writes magic 0 LZ4 only with the xxhash package ([dev] extras)")


@pytest.mark.parametrize("peer, magic, codec", list(legacy_cases()))
def test_legacy_message_set_decodes(peer, magic, codec):
    need_legacy(peer, magic, codec)
    raw = legacy_set(peer, magic, codec)
    want = legacy_expected(magic)
    batches = decode_batches(raw)
    assert all(isinstance(b, LegacyBatch) and b.magic == magic for b in batches)
    assert [b.compression for b in batches] == [codec] * len(batches)
    assert len(batches) == (len(LEGACY) if codec == "none" else 1)
    assert batches[-1].last_offset == BASE + len(LEGACY) - 1
    assert {b.timestamp_type for b in batches} == {0 if magic else -1}
    assert peer_legacy_records(peer, raw) == want  # the oracle agrees with the expectation
    assert [r for b in batches for r in b.records()] == want
    assert decode_records(raw) == want
    assert arrow_rows(decode_to_arrow(raw)) == want
    assert decode_records(raw, min_offset=BASE + 2) == want[2:]


def test_legacy_v1_log_append_time_message():
    """A plain magic 1 message flagged LogAppendTime carries the broker's time itself."""
    raw = bytearray(legacy_set(PEERS[0], 1, "none", LEGACY[:1]))
    raw[17] |= 0x08  # attributes
    raw[18:26] = struct.pack(">q", 1_650_000_000_000)
    raw[12:16] = struct.pack(">I", zlib.crc32(raw[16:]))
    [batch] = decode_batches(bytes(raw))
    assert batch.timestamp_type == 1
    assert decode_records(bytes(raw)) == [(BASE, 1_650_000_000_000, b"k0", b"v0" * 50, ())]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
def test_legacy_v1_log_append_time_wrapper(codec):
    """A LogAppendTime wrapper: every inner record takes the wrapper's timestamp."""
    raw = bytearray(legacy_set(PEERS[-1], 1, codec))
    raw[17] |= 0x08
    raw[18:26] = struct.pack(">q", 1_650_000_000_000)
    raw[12:16] = struct.pack(">I", zlib.crc32(raw[16:]))
    [batch] = decode_batches(bytes(raw))
    assert batch.timestamp_type == 1
    want = [(o, 1_650_000_000_000, k, v, h) for o, _, k, v, h in legacy_expected(1)]
    assert peer_legacy_records(PEERS[-1], bytes(raw)) == want
    assert batch.records() == want


def test_legacy_and_v2_mixed_in_one_fetch():
    """A log upgraded across formats: v0 then v1 message sets then v2 batches, in one buffer."""
    peer = PEERS[-1]
    v0 = legacy_set(peer, 0, "none", LEGACY[:2], base=0)
    v1 = legacy_set(peer, 1, "none", LEGACY[2:], base=2)
    v2 = kcore_batch(RECORDS, base_offset=len(LEGACY))
    raw = v0 + v1 + v2
    want = legacy_expected(0, LEGACY[:2], 0) + legacy_expected(1, LEGACY[2:], 2)
    want += expected(RECORDS, len(LEGACY))
    assert [type(b) for b in decode_batches(raw)] == [LegacyBatch] * len(LEGACY) + [RecordBatch]
    assert decode_records(raw) == want
    assert arrow_rows(decode_to_arrow(raw)) == want


def test_legacy_compressed_and_v2_mixed_in_one_fetch():
    peer = PEERS[-1]
    raw = legacy_set(peer, 0, "gzip", LEGACY[:2], base=0)
    raw += legacy_set(peer, 1, "snappy", LEGACY[2:], base=2)
    raw += kcore_batch(RECORDS, "lz4", base_offset=len(LEGACY))
    want = legacy_expected(0, LEGACY[:2], 0) + legacy_expected(1, LEGACY[2:], 2)
    want += expected(RECORDS, len(LEGACY))
    assert decode_records(raw) == want


def test_legacy_corrupt_crc_raises():
    raw = bytearray(legacy_set(PEERS[0], 1, "none"))
    second = 12 + struct.unpack(">i", raw[8:12])[0]  # where the second message starts
    raw[second + 40] ^= 0x01  # a byte of its value
    raw = bytes(raw)
    batches = decode_batches(raw)  # legacy CRCs are checked when the records are read
    assert batches[0].records() == legacy_expected(1)[:1]
    with pytest.raises(CrcMismatchError):
        batches[1].records()
    with pytest.raises(CrcMismatchError):
        decode_records(raw)
    with pytest.raises(CrcMismatchError):
        decode_to_arrow(raw)


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_corrupt_wrapper_crc_raises(magic):
    raw = bytearray(legacy_set(PEERS[-1], magic, "gzip"))
    raw[-3] ^= 0x40  # inside the compressed value
    with pytest.raises(CrcMismatchError):
        decode_batches(bytes(raw))[0].records()


def test_legacy_corrupt_inner_crc_raises():
    inner = bytearray(legacy_set(PEERS[-1], 1, "none", base=0))
    second = 12 + struct.unpack(">i", inner[8:12])[0]
    inner[second + 40] ^= 0x01
    # Wrap the damaged inner set ourselves: a magic 1 gzip message, CRC made by zlib.
    value = gzip.compress(bytes(inner))
    body = struct.pack(">bbqii", 1, 1, 0, -1, len(value)) + value
    raw = struct.pack(">qiI", len(LEGACY) - 1, len(body) + 4, zlib.crc32(body)) + body
    [batch] = decode_batches(raw)
    with pytest.raises(CrcMismatchError):
        batch.records()


def test_v2_corrupt_crc_raises():
    raw = bytearray(kcore_batch(RECORDS, "zstd"))
    raw[-1] ^= 0x01
    with pytest.raises(CrcMismatchError):
        decode_batches(bytes(raw))
    with pytest.raises(CrcMismatchError):
        decode_records(bytes(raw))
    assert decode_batches(bytes(raw), check_crcs=False)[0].record_count == len(RECORDS)


# -- compression framing other producers write -----------------------------------------------

SECTION = records_section(COMPRESSIBLE)


def decodes_with_payload(codec: str, payload: bytes) -> None:
    raw = with_payload(kcore_batch(COMPRESSIBLE, codec), payload)
    assert decode_records(raw) == expected(COMPRESSIBLE)
    assert arrow_rows(decode_to_arrow(raw)) == expected(COMPRESSIBLE)


@pytest.mark.parametrize(
    "version_fields",
    [
        struct.pack(">ii", 1, 1),
        struct.pack(">ii", 0, 0),
        struct.pack(">ii", 7, 3),
        struct.pack("<ii", 1, 1),  # little-endian, as some non-Java producers write
    ],
    ids=["1-1", "0-0", "7-3", "little-endian"],
)
def test_xerial_snappy_version_fields_are_ignored(version_fields):
    framed = compress("snappy", SECTION)
    assert framed[:8] == b"\x82SNAPPY\x00" and framed[8:16] == struct.pack(">ii", 1, 1)
    payload = framed[:8] + version_fields + framed[16:]
    assert decompress("snappy", payload) == SECTION
    decodes_with_payload("snappy", payload)


def test_raw_snappy_decodes():
    payload = bytes(cramjam.snappy.compress_raw(SECTION))
    decodes_with_payload("snappy", payload)


def test_xerial_snappy_many_blocks_of_any_size():
    big = SECTION * 20  # kcore cuts 32 KiB blocks; another producer may cut any size
    blocks = [big[i : i + 10_000] for i in range(0, len(big), 10_000)]
    payload = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for block in blocks:
        c = bytes(cramjam.snappy.compress_raw(block))
        payload += struct.pack(">i", len(c)) + c
    assert decompress("snappy", payload) == big


def zstd_has_content_size(frame: bytes) -> bool:
    descriptor = frame[4]
    return bool(descriptor >> 6) or bool(descriptor & 0x20)  # FCS flag, or single segment


def zstd_payloads():
    yield (
        "two-frames",
        bytes(cramjam.zstd.compress(SECTION[:1000])) + bytes(cramjam.zstd.compress(SECTION[1000:])),
    )
    stream = cramjam.zstd.Compressor()
    stream.compress(SECTION)
    yield "cramjam-stream-no-size", bytes(stream.finish())
    try:
        import zstandard
    except ImportError:
        return
    yield "zstandard-no-size", zstandard.ZstdCompressor(write_content_size=False).compress(SECTION)
    yield "zstandard-checksum", zstandard.ZstdCompressor(write_checksum=True).compress(SECTION)
    out = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    yield "zstandard-chunks", out.compress(SECTION) + out.flush()


@pytest.mark.parametrize("name", [n for n, _ in zstd_payloads()])
def test_zstd_framing_variants_decode(name):
    payload = dict(zstd_payloads())[name]
    if "no-size" in name:
        assert not zstd_has_content_size(payload)
    if name == "two-frames":
        assert payload.count(b"\x28\xb5\x2f\xfd") >= 2
    assert decompress("zstd", payload) == SECTION
    decodes_with_payload("zstd", payload)


def lz4_payloads():
    yield "cramjam-frame", bytes(cramjam.lz4.compress(SECTION))
    c = cramjam.lz4.Compressor(content_checksum=True, block_linked=False)
    c.compress(SECTION)
    yield "cramjam-checksums", bytes(c.finish())
    try:
        import lz4.frame
    except ImportError:
        return
    yield "python-lz4-content-size", lz4.frame.compress(SECTION, block_linked=False)
    yield (
        "python-lz4-4mb-checksums",
        lz4.frame.compress(
            SECTION,
            block_linked=False,
            block_size=lz4.frame.BLOCKSIZE_MAX4MB,
            content_checksum=True,
            block_checksum=True,
        ),
    )


@pytest.mark.parametrize("name", [n for n, _ in lz4_payloads()])
def test_lz4_frames_with_other_flags_decode(name):
    payload = dict(lz4_payloads())[name]
    assert payload[4:6] != compress("lz4", SECTION)[4:6]  # other FLG/BD than kcore writes
    assert decompress("lz4", payload) == SECTION
    decodes_with_payload("lz4", payload)


def test_gzip_from_python_zlib_decodes():
    payload = gzip.compress(SECTION, compresslevel=9, mtime=1_234_567)
    decodes_with_payload("gzip", payload)
    two_members = gzip.compress(SECTION[:500]) + gzip.compress(SECTION[500:])
    decodes_with_payload("gzip", two_members)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_decompression_limit(codec):
    records = [(None, b"\x00" * 1_000_000, BASE_TS, [])]
    raw = kcore_batch(records, codec)
    size = len(records_section(records))
    assert len(raw) < 100_000  # highly compressible
    [batch] = decode_batches(raw, max_decompressed_size=size)
    assert batch.records()[0][3] == records[0][1]  # exactly at the limit is fine
    for limit in (size - 1, 65_536, 100):
        [batch] = decode_batches(raw, max_decompressed_size=limit)
        with pytest.raises(DecompressionLimitError):
            batch.records()
    with pytest.raises(DecompressionLimitError):
        decode_records(raw, max_decompressed_size=10_000)
    with pytest.raises(DecompressionLimitError):
        decode_to_arrow(raw, max_decompressed_size=10_000)
    with pytest.raises(DecompressionLimitError):
        decompress(codec, raw[HEADER_SIZE:], 10_000)


# -- CRC32C, murmur2, partitioner ---------------------------------------------------------------


@pytest.mark.parametrize(
    "data, want",
    [
        (b"123456789", 0xE3069283),
        (bytes(32), 0x8A9136AA),  # RFC 3720 B.4
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
        (  # RFC 3720 B.4: an iSCSI read command PDU
            bytes.fromhex(
                "01c00000000000000000000000000000"
                "14000000000004000000001400000018"
                "28000000000000000200000000000000"
            ),
            0xD9963A56,
        ),
    ],
    ids=["check", "zeros", "ones", "incrementing", "decrementing", "iscsi-read"],
)
def test_crc32c_known_vectors_on_every_buffer_kind(data, want):
    assert crc32c_pkg.crc32c(data) == want and google_crc32c.value(data) == want
    kinds = [
        data,
        bytearray(data),
        memoryview(data),
        np.frombuffer(data, dtype=np.uint8),
        array.array("B", data),
        memoryview(b"\x00" + data)[1:],  # an odd address
    ]
    for buf in kinds:
        assert crc32c(buf) == want, type(buf)
        assert _codec.crc32c_software(buf) == want, type(buf)


def test_crc32c_multibyte_arrays_are_their_bytes():
    arr = np.arange(1000, dtype=np.uint32)
    assert crc32c(arr) == crc32c_pkg.crc32c(arr.tobytes())
    assert crc32c(arr.reshape(10, 100)) == crc32c_pkg.crc32c(arr.tobytes())


def test_crc32c_strided_buffers_are_refused():
    # Non-contiguous memory has no single byte string to checksum: an error, never a guess.
    with pytest.raises((BufferError, ValueError, TypeError)):
        crc32c(memoryview(b"0123456789")[::2])
    with pytest.raises((BufferError, ValueError, TypeError)):
        crc32c(np.arange(100, dtype=np.uint8)[::3])


def test_crc32c_matches_packages_at_odd_offsets_and_lengths():
    rng = random.Random(3720)
    blob = rng.randbytes(300_000)
    view = memoryview(blob)
    cases = [(o, n) for o in range(17) for n in range(70)]
    cases += [(rng.randrange(64), rng.randrange(100_001)) for _ in range(200)]
    for offset, n in cases:
        piece = view[offset : offset + n]
        want = crc32c_pkg.crc32c(bytes(piece))
        assert crc32c(piece) == want, (offset, n)
        assert _codec.crc32c_software(piece) == want, (offset, n)
        seed = rng.getrandbits(32)
        assert crc32c(piece, seed) == google_crc32c.extend(seed, bytes(piece)), (offset, n)


def test_crc32c_large_input_and_continuation():
    big = random.Random(1).randbytes(8 << 20)
    want = crc32c_pkg.crc32c(big)
    assert crc32c(big) == want == google_crc32c.value(big)
    assert _codec.crc32c_software(big) == want
    assert crc32c(big[3_000_001:], crc32c(memoryview(big)[:3_000_001])) == want
    assert crc32c_pkg.crc32c(big[5:], value=crc32c(big[:5])) == want


def test_crc32c_implementation_is_known():
    assert _codec.crc32c_implementation() in ("hardware", "software")


def test_murmur2_and_partitioner_match_kafka_python():
    class Cluster:  # what kafka-python's DefaultPartitioner asks of its cluster metadata
        def __init__(self, n):
            self.n = n

        def topics(self):
            return {"t"}

        def partitions_for_topic(self, topic):
            return set(range(self.n))

        def available_partitions_for_topic(self, topic):
            return set(range(self.n))

    rng = random.Random(2)
    partitioner = DefaultPartitioner()
    keys = [rng.randbytes(rng.randrange(0, 100)) for _ in range(3000)]
    keys += [b"", b"\x00", b"\xff" * 4, "ключ".encode(), b"a-little-bit-long-string"]
    for key in keys:
        assert murmur2(key) & 0xFFFFFFFF == kafka_murmur2(key), key
        assert -(2**31) <= murmur2(key) < 2**31
        assert murmur2(bytearray(key)) == murmur2(memoryview(key)) == murmur2(key)
        n = rng.choice([1, 2, 3, 7, 12, 100, 1000])
        assert partition_for_key(key, n) == partitioner.partition(
            "t", key, key, None, None, Cluster(n)
        ), (key, n)


# -- append_many == the append loop ----------------------------------------------------------

VALUES = [b"a", None, b"", b"xyz" * 40, None, b"q", b"\x00tail\x00", b"v" * 200]
KEYS = [None, b"k1", b"", b"k3", b"k4", None, b"k6", b"k7"]
TIMESTAMPS = [BASE_TS + d for d in (0, 5, -3, 100_000, 7, 7, -50_000, 1)]


def loop_batch(keys, values, timestamps, codec: str = "none") -> bytes:
    builder = RecordBatchBuilder(codec, base_offset=9, producer_id=4, producer_epoch=1)
    for i, value in enumerate(values):
        ts = timestamps if isinstance(timestamps, int) else int(timestamps[i])
        builder.append(None if keys is None else keys[i], value, ts)
    return builder.build()


def many_batch(keys, values, timestamps, codec: str = "none") -> bytes:
    builder = RecordBatchBuilder(codec, base_offset=9, producer_id=4, producer_epoch=1)
    builder.append_many(keys, values, timestamps)
    return builder.build()


def arrow(values, type_):
    return pa.array(values, type_)


def strs(values):
    return [None if v is None else v.decode("latin-1") for v in values]


def fixed(values):
    return np.array([b"" if v is None else v for v in values], dtype="S200")


APPEND_MANY_CASES = {
    # name: (keys, values, equivalent keys, equivalent values)
    "lists": (KEYS, VALUES, KEYS, VALUES),
    "tuples-bytearray-memoryview": (
        tuple(None if k is None else bytearray(k) for k in KEYS),
        tuple(None if v is None else memoryview(v) for v in VALUES),
        KEYS,
        VALUES,
    ),
    "no-keys": (None, VALUES, None, VALUES),
    "numpy-S": (
        fixed(KEYS),
        fixed(VALUES),
        [bytes(x) for x in fixed(KEYS)],  # numpy drops trailing NULs, and so does kcore
        [bytes(x) for x in fixed(VALUES)],
    ),
    "numpy-S-strided": (
        None,
        fixed([v for v in VALUES for _ in (0, 1)])[::2],
        None,
        [bytes(x) for x in fixed(VALUES)],
    ),
    "numpy-object": (np.array(KEYS, dtype=object), np.array(VALUES, dtype=object), KEYS, VALUES),
    "arrow-binary": (arrow(KEYS, pa.binary()), arrow(VALUES, pa.binary()), KEYS, VALUES),
    "arrow-large-binary": (
        arrow(KEYS, pa.large_binary()),
        arrow(VALUES, pa.large_binary()),
        KEYS,
        VALUES,
    ),
    "arrow-string": (
        arrow(strs(KEYS), pa.string()),
        arrow(strs(VALUES), pa.string()),
        [None if k is None else k.decode("latin-1").encode() for k in KEYS],
        [None if v is None else v.decode("latin-1").encode() for v in VALUES],
    ),
    "arrow-large-string": (
        None,
        arrow(["é", None, "", "日本"] * 2, pa.large_string()),
        None,
        [b"\xc3\xa9", None, b"", "日本".encode()] * 2,
    ),
    "arrow-sliced": (
        arrow([b"pad", None, *KEYS, b"pad"], pa.binary()).slice(2, len(KEYS)),
        arrow([None, b"pad", *VALUES, None], pa.binary()).slice(2, len(VALUES)),
        KEYS,
        VALUES,
    ),
    "arrow-sliced-past-nulls": (
        None,
        arrow([None] * 9 + [b"a", b"b", b"", b"c", b"d", b"e", b"f", b"g"], pa.binary()).slice(9),
        None,
        [b"a", b"b", b"", b"c", b"d", b"e", b"f", b"g"],
    ),
    "arrow-chunked": (
        pa.chunked_array([arrow(KEYS[:3], pa.binary()), arrow(KEYS[3:], pa.binary())]),
        pa.chunked_array([arrow(VALUES[:5], pa.binary()), arrow(VALUES[5:], pa.binary())]),
        KEYS,
        VALUES,
    ),
    "arrow-all-empty": (None, arrow([b""] * 8, pa.binary()), None, [b""] * 8),
    "arrow-all-null": (None, arrow([None] * 8, pa.binary()), None, [None] * 8),
}

TIMESTAMP_CASES = {
    "int": BASE_TS,
    "list": TIMESTAMPS,
    "numpy-int64": np.array(TIMESTAMPS, dtype=np.int64),
    "numpy-int64-strided": np.array([t for t in TIMESTAMPS for _ in (0, 1)], dtype=np.int64)[::2],
    "numpy-big-endian": np.array(TIMESTAMPS, dtype=">i8"),
    "arrow-int64": pa.array(TIMESTAMPS, pa.int64()),
}


@pytest.mark.parametrize("ts_case", list(TIMESTAMP_CASES))
@pytest.mark.parametrize("case", list(APPEND_MANY_CASES))
def test_append_many_equals_append_loop(case, ts_case):
    keys, values, want_keys, want_values = APPEND_MANY_CASES[case]
    timestamps = TIMESTAMP_CASES[ts_case]
    want = loop_batch(want_keys, want_values, timestamps)
    assert many_batch(keys, values, timestamps) == want
    assert len(decode_records(want)) == len(want_values)


@pytest.mark.parametrize("ts_case", ["int", "list", "numpy-int64-strided", "arrow-int64"])
@pytest.mark.parametrize("case", list(APPEND_MANY_CASES))
@pytest.mark.parametrize(("start", "stop"), [(0, 8), (2, 7), (3, 3), (5, -1), (0, 1)])
def test_append_many_of_a_range_equals_it_of_the_slice(case, ts_case, start, stop):
    """send_batch's chunks: rows start:stop of full-length columns, none of them sliced."""
    keys, values, want_keys, want_values = APPEND_MANY_CASES[case]
    timestamps = TIMESTAMP_CASES[ts_case]
    end = len(want_values) if stop == -1 else stop
    want = loop_batch(
        None if want_keys is None else want_keys[start:end],
        want_values[start:end],
        timestamps if isinstance(timestamps, int) else TIMESTAMPS[start:end],
    )
    builder = RecordBatchBuilder("none", base_offset=9, producer_id=4, producer_epoch=1)
    assert builder.append_many(keys, values, timestamps, None, start, stop) == end - start
    assert builder.build() == want


def test_append_many_of_a_range_takes_its_rows_headers():
    values = [b"v%d" % i for i in range(6)]
    pairs = [None, [("a", b"1")], [], [("b", None), ("c", b"3")], None, [("d", b"4")]]
    arrow_headers = pa.array(
        [None if h is None else [{"key": k, "value": v} for k, v in h] for h in pairs],
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
    )
    want = RecordBatchBuilder()
    for i in range(1, 5):
        want.append(None, values[i], BASE_TS, pairs[i] or None)
    for headers in (pairs, tuple(pairs), arrow_headers):
        builder = RecordBatchBuilder()
        builder.append_many(None, values, BASE_TS, headers, 1, 5)
        assert decode_records(builder.build()) == decode_records(want.build())


@pytest.mark.parametrize(
    "case", ["lists", "tuples-bytearray-memoryview", "numpy-S", "arrow-sliced"]
)
@pytest.mark.parametrize("max_bytes", [1, 61 + 40, 61 + 150, 400, 10_000])
def test_append_many_up_to_max_bytes_stops_before_the_record_that_would_pass_it(case, max_bytes):
    """Calls with max_bytes fill batches one after another: each as large as it may be (the
    next record would not fit), none over the limit unless a single record is, and together
    the same records as one call."""
    keys, values, want_keys, want_values = APPEND_MANY_CASES[case]
    start, batches = 0, []
    while start < len(want_values):
        builder = RecordBatchBuilder("none", base_offset=9, producer_id=4, producer_epoch=1)
        added = builder.append_many(keys, values, TIMESTAMPS, None, start, -1, max_bytes)
        assert added >= 1
        assert builder.size_in_bytes <= max_bytes or added == 1
        if start + added < len(want_values):  # the next record did not fit
            probe = RecordBatchBuilder("none", base_offset=9, producer_id=4, producer_epoch=1)
            probe.append_many(keys, values, TIMESTAMPS, None, start, start + added + 1)
            assert probe.size_in_bytes > max_bytes
        batches.append(builder.build())
        start += added
    got = [record for batch in batches for record in decode_records(batch)]
    want = decode_records(loop_batch(want_keys, want_values, TIMESTAMPS))
    assert [r[1:] for r in got] == [r[1:] for r in want]  # (offsets restart per batch)


def test_append_many_stopping_at_max_bytes_lets_go_of_the_buffers_it_holds():
    """The record that does not fit was read through the buffer protocol (bytearray keys and
    values): stopping there must release both, or the bytearrays could not be resized."""
    keys = [bytearray(b"k%d" % i) for i in range(4)]
    values = [bytearray(b"v" * 50) for _ in range(4)]
    builder = RecordBatchBuilder()
    assert builder.append_many(keys, values, BASE_TS, None, 0, -1, 61 + 130) == 2
    for b in keys + values:
        b.extend(b"more")  # BufferError if an export were still held


def test_a_batch_filled_to_max_bytes_keeps_its_buffer():
    """A record ending exactly at max_bytes, in a buffer of exactly that size, is written
    without growing the buffer (write_record asks for what it writes, not 5 bytes more)."""
    values = [b"x" * 40] * 1000
    builder = RecordBatchBuilder()
    added = builder.append_many(None, values, BASE_TS, None, 0, -1, 8192)
    # Again, into a buffer of exactly the size those records reach, limited to it.
    exact = builder.size_in_bytes
    again = RecordBatchBuilder(capacity=exact)
    assert again.append_many(None, values, BASE_TS, None, 0, -1, exact) == added
    assert again.size_in_bytes == exact
    assert again.capacity == exact, again.capacity


@pytest.mark.parametrize(("start", "stop"), [(-1, 3), (4, 3), (0, 9), (9, -1)])
def test_append_many_refuses_rows_outside_the_columns(start, stop):
    builder = RecordBatchBuilder()
    with pytest.raises(ValueError, match="rows"):
        builder.append_many(None, VALUES, BASE_TS, None, start, stop)
    with pytest.raises(ValueError, match="header lists"):
        builder.append_many(None, VALUES, BASE_TS, [None] * 7, 1, 3)
    assert builder.record_count == 0


@pytest.mark.parametrize("codec", COMPRESSED)
def test_append_many_compressed_equals_append_loop(codec):
    keys, values, want_keys, want_values = APPEND_MANY_CASES["arrow-sliced"]
    assert many_batch(keys, values, TIMESTAMPS, codec) == loop_batch(
        want_keys, want_values, TIMESTAMPS, codec
    )


def test_append_many_after_append_continues_the_batch():
    builder = RecordBatchBuilder()
    builder.append(b"first", b"x", BASE_TS + 10)
    builder.append_many(KEYS, VALUES, TIMESTAMPS)
    builder.append(None, b"last", BASE_TS - 1, [("h", None)])
    want = RecordBatchBuilder()
    want.append(b"first", b"x", BASE_TS + 10)
    for k, v, ts in zip(KEYS, VALUES, TIMESTAMPS, strict=True):
        want.append(k, v, ts)
    want.append(None, b"last", BASE_TS - 1, [("h", None)])
    assert builder.build() == want.build()


def test_append_many_numpy_unicode_is_not_written_as_ucs4():
    builder = RecordBatchBuilder()
    try:
        builder.append_many(None, np.array(["ab", "c"]), BASE_TS)
    except TypeError:
        return  # refusing it is fine
    assert [r[3] for r in decode_records(builder.build())] == [b"ab", b"c"]


def test_append_many_takes_numpy_scalar_timestamp():
    builder = RecordBatchBuilder()
    builder.append_many(None, [b"a", b"b"], np.int64(BASE_TS))
    assert [r[1] for r in decode_records(builder.build())] == [BASE_TS, BASE_TS]


# -- decode_to_arrow == decode_records -------------------------------------------------------


def arrow_rows(table) -> list[tuple]:
    """Arrow rows as decode_records tuples: timestamps back to epoch milliseconds."""
    cols = table.to_pydict()
    ts = table.column("timestamp").cast(pa.int64()).to_pylist()
    headers = cols.get("headers", [[]] * table.num_rows)
    return [
        (
            cols["offset"][i],
            ts[i],
            cols["key"][i],
            cols["value"][i],
            tuple((h["key"], h["value"]) for h in headers[i]),
        )
        for i in range(table.num_rows)
    ]


def control_batch(base_offset: int, commit: bool = True) -> bytes:
    """A transaction marker as the broker writes it: control key (version 0, type), value
    (version 0, coordinator epoch)."""
    builder = RecordBatchBuilder(
        base_offset=base_offset,
        producer_id=99,
        producer_epoch=3,
        transactional=True,
        is_control=True,
    )
    builder.append(struct.pack(">hh", 0, 1 if commit else 0), struct.pack(">hi", 0, 5), BASE_TS)
    return builder.build()


def arrow_buffers():
    yield "plain", kcore_batch(RECORDS)
    for codec in COMPRESSED:
        yield codec, kcore_batch(COMPRESSIBLE, codec, base_offset=10)
    yield "log-append-time", kcore_batch(RECORDS, log_append_time=True)
    yield (
        "transaction",
        kcore_batch(COMPRESSIBLE[:5], "lz4", base_offset=0, **PRODUCER_STATES["transactional"])
        + control_batch(5)
        + kcore_batch(RECORDS, "snappy", base_offset=6)
        + control_batch(13, commit=False),
    )
    yield "legacy-v0", legacy_set(PEERS[-1], 0, "none")
    yield "legacy-v1", legacy_set(PEERS[-1], 1, "none")
    yield "empty", b""


@pytest.mark.parametrize("name", [n for n, _ in arrow_buffers()])
def test_decode_to_arrow_equals_decode_records(name):
    buf = dict(arrow_buffers())[name]
    records = decode_records(buf)
    table = decode_to_arrow(buf)
    assert arrow_rows(table) == records
    assert table.schema.names == ["key", "value", "offset", "timestamp", "timestampType", "headers"]
    assert table.column("timestamp").type == pa.timestamp("ms", tz="UTC")
    # min_offset in the middle of a batch, and past every record
    offsets = [r[0] for r in records]
    for cut in sorted({*offsets[:: max(1, len(offsets) // 5)], (offsets or [0])[-1] + 1}):
        assert arrow_rows(decode_to_arrow(buf, min_offset=cut)) == decode_records(
            buf, min_offset=cut
        )
        assert [r[0] for r in decode_records(buf, min_offset=cut)] == [
            o for o in offsets if o >= cut
        ]
    # microseconds and no headers
    us = decode_to_arrow(buf, timestamp_unit="us", include_headers=False)
    assert "headers" not in us.schema.names
    assert us.column("timestamp").cast(pa.int64()).to_pylist() == [
        r[1] * 1000 if r[1] >= 0 else r[1] for r in records
    ]


def test_decode_to_arrow_control_batches():
    buf = dict(arrow_buffers())["transaction"]
    data = decode_records(buf)
    assert [r[0] for r in data] == list(range(5)) + list(range(6, 13))
    with_control = decode_records(buf, skip_control=False)
    assert [r[0] for r in with_control] == list(range(14))
    assert arrow_rows(decode_to_arrow(buf, skip_control=False)) == with_control
    assert [b.control_type() for b in decode_batches(buf)] == [None, "commit", None, "abort"]


def test_decode_to_arrow_timestamp_type_column():
    buf = kcore_batch(RECORDS[:2]) + kcore_batch(RECORDS[:2], base_offset=2, log_append_time=True)
    buf += legacy_set(PEERS[-1], 1, "none", LEGACY[:2], base=4)
    assert decode_to_arrow(buf).column("timestampType").to_pylist() == [0, 0, 1, 1, 0, 0]


def test_decode_to_arrow_magic0_timestamp_type_is_none():
    buf = legacy_set(PEERS[-1], 0, "none", LEGACY[:2])
    assert {b.timestamp_type for b in decode_batches(buf)} == {-1}
    assert decode_to_arrow(buf).column("timestampType").to_pylist() == [-1, -1]


@pytest.mark.parametrize(
    ("codec", "levels"),
    [("gzip", (1, 9)), ("lz4", (1, 12, 17)), ("zstd", (-5, -1, 1, 19))],
    ids=["gzip", "lz4-hc", "zstd"],
)
def test_compression_levels_are_honoured_and_read_by_peers(codec, levels):
    """compression.<codec>.level (KIP-390): each level gives its own output (zstd's negative
    levels are real, faster ones; lz4 levels other than 9 are LZ4 HC, as Java's producer makes
    them), and the batches read back, in kcore and in aiokafka."""
    default = kcore_batch(COMPRESSIBLE * 20, codec)
    sizes = {}
    for level in levels:
        ours = kcore_batch(COMPRESSIBLE * 20, codec, compression_level=level)
        assert decode_records(ours) == expected(COMPRESSIBLE * 20)
        assert peer_records(PEERS[-1], ours) == expected(COMPRESSIBLE * 20)
        sizes[level] = len(ours)
    assert len(set(sizes.values()) | {len(default)}) > 1, sizes  # the level changed something
    if codec == "lz4":
        # 9 is Java's default level: the fast compressor, as with no level at all.
        assert kcore_batch(COMPRESSIBLE * 20, codec, compression_level=9) == default
    if codec == "zstd":
        # -1 is one of zstd's levels (a faster one), not "the default" (3).
        assert sizes[-1] != len(default)
        assert kcore_batch(COMPRESSIBLE * 20, codec, compression_level=3) == default


def test_zstd_contexts_kept_per_thread_round_trip_and_read_by_peers():
    """With the zstandard package (kcore[zstd]) each thread keeps its own zstd contexts: many
    threads compressing and decompressing at once each get their own bytes back, and what
    they write is one frame stating its size, which cramjam reads too."""
    import threading

    from kcore.codec import zstd_context_reuse_available

    assert zstd_context_reuse_available()  # (the dev environment installs zstandard)
    sections = [SECTION[i * 100 :] + bytes([i]) * 5_000 for i in range(8)]
    failures: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for level in (3, 1, 3, 19):
                payload = compress("zstd", sections[i], level)
                assert zstd_has_content_size(payload)
                assert decompress("zstd", payload) == sections[i]
                assert bytes(cramjam.zstd.decompress(payload)) == sections[i]
        except BaseException as exc:  # noqa: BLE001 (reported below)
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


@pytest.mark.parametrize("delta", [-1, 1, 1 << 20])
def test_zstd_frame_stating_a_wrong_size_is_a_corrupt_batch(delta):
    """A frame whose header states another content size than its blocks hold fails as a
    corrupt batch (a kcore error naming the codec), not as the zstd package's error."""
    import zstandard

    data = SECTION[:4_000]
    frame = bytearray(zstandard.ZstdCompressor(level=3).compress(data))
    descriptor = frame[4]
    # A 2-byte size (stored less 256) right after it: a single segment, no window byte.
    assert descriptor >> 6 == 1 and descriptor & 0x20
    assert int.from_bytes(frame[5:7], "little") + 256 == len(data)
    frame[5:7] = (len(data) - 256 + delta).to_bytes(2, "little") if delta < 60_000 else b"\xff\xff"
    with pytest.raises(CorruptRecordError, match="zstd"):
        decompress("zstd", bytes(frame))
    with pytest.raises(CorruptRecordError):
        decode_batches(with_payload(kcore_batch(COMPRESSIBLE, "zstd"), bytes(frame)))[0].records()


def test_zstd_frames_without_a_size_expanding_past_the_first_guess():
    """A frame that states no size (Java's) and expands further than the first guess still
    decodes whole, and one that expands past the limit is refused as such."""
    import zstandard

    big = bytes(3_000_000)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(big)
    assert not zstd_has_content_size(frame) and len(frame) * 8 < 65_536
    assert decompress("zstd", frame) == big
    with pytest.raises(DecompressionLimitError):
        decompress("zstd", frame, max_size=1_000_000)


def _mutants_raise_only_kcore_errors(
    codec: str, frame: bytes, seed: object, count: int, max_size: int
) -> None:
    """``count`` copies of ``frame`` with 1-3 random bytes changed each: decompressed, or
    refused with kcore's errors (corrupt, or the limit); never the codec's own error."""
    rng = random.Random(seed)
    for _ in range(count):
        bad = bytearray(frame)
        for _ in range(rng.randint(1, 3)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        try:
            out = decompress(codec, bytes(bad), max_size=max_size)
        except (CorruptRecordError, DecompressionLimitError):
            continue
        assert isinstance(out, bytes) and len(out) <= max_size


def _zstd_no_size_frames() -> list[tuple[str, bytes, bytes]]:
    """Frames that state no content size (as Java's producer writes them), over block shapes:
    compressed blocks far past 8x and 64 KiB, raw blocks (data that does not compress), RLE
    blocks, a content checksum, a dictionary id, an empty frame."""
    import zstandard

    rng = random.Random(25)
    samples = [b"stage done id=%d status=OK worker-%d" % (i, i % 8) for i in range(2_000)]
    dictionary = zstandard.train_dictionary(4_096, samples)
    logs = b"".join(
        b"2026-12-02T16:%02d:%02d INFO [worker-%d] stage done id=%d status=OK\n"
        % (i % 60, i % 59, i % 8, i)
        for i in range(30_000)
    )
    noise = rng.randbytes(300_000)
    shapes = {
        "logs-16KiB": logs[:16_384],
        "logs-256KiB": logs[:262_144],
        "logs-1MiB": logs[:1_048_576],
        "noise-300KB": noise,
        "zeros-2MB": bytes(2_000_000),
        "mixed": noise[:70_000] + bytes(500_000) + logs[:200_000],
        "one-byte": b"x",
        "empty": b"",
        "records": SECTION,
    }
    out = []
    for name, data in shapes.items():
        for extra, options in (
            ("", {}),
            ("-checksum", {"write_checksum": True}),
            ("-dict-id", {"write_dict_id": True, "dict_data": dictionary}),
        ):
            if extra == "-dict-id" and name not in ("logs-256KiB", "one-byte"):
                continue
            compressor = zstandard.ZstdCompressor(level=3, write_content_size=False, **options)
            out.append((name + extra, compressor.compress(data), data))
        # Written a chunk at a time (one frame, no size): as a streaming producer writes it
        chunks = zstandard.ZstdCompressor(write_content_size=False).compressobj()
        streamed = b"".join(
            chunks.compress(data[i : i + 10_000]) for i in range(0, len(data), 10_000)
        )
        out.append((name + "-streamed", streamed + chunks.flush(), data))
    return out


def test_zstd_frames_without_a_size_decode_in_one_pass_whatever_their_blocks():
    """A frame that states no size is decompressed into the most its blocks can hold (read
    from the block headers), so a batch that expands past the first guess is not decompressed
    twice; every block shape gives back its bytes, equal to cramjam's reading."""
    cases = _zstd_no_size_frames()
    assert {name for name, _, _ in cases} >= {"logs-1MiB", "noise-300KB", "zeros-2MB", "empty"}
    for name, frame, data in cases:
        assert not zstd_has_content_size(frame), name
        if "-dict-id" in name:
            # Needs the dictionary, which Kafka never uses: refused as corrupt, not a crash.
            with pytest.raises(CorruptRecordError, match="zstd"):
                decompress("zstd", frame)
            continue
        assert decompress("zstd", frame) == data, name
        assert bytes(cramjam.zstd.decompress(frame)) == data, name
        if data == SECTION:  # a batch of records as Java's producer compresses it
            batch = with_payload(kcore_batch(COMPRESSIBLE, "zstd"), frame)
            assert decode_batches(batch)[0].records() == expected(COMPRESSIBLE)


def test_zstd_frames_without_a_size_that_lie_or_end_early_are_corrupt():
    """Each prefix of a frame without a size, a frame followed by bytes that are no frame,
    and frames whose block headers were changed: a kcore error (corrupt, or the limit),
    never a crash nor zstd's own error; two whole frames decode as their concatenation."""
    import zstandard

    data = b"".join(b"row %d of a table, compressible\n" % i for i in range(20_000))
    frame = zstandard.ZstdCompressor(write_content_size=False, write_checksum=True).compress(data)
    for cut in sorted({1, 4, 5, 6, 7, 8, 9, len(frame) // 2, len(frame) - 4, len(frame) - 1}):
        with pytest.raises(CorruptRecordError):
            decompress("zstd", frame[:cut])
    with pytest.raises(CorruptRecordError):
        decompress("zstd", frame + b"\x00\x01\x02")
    assert decompress("zstd", frame + frame) == data + data
    _mutants_raise_only_kcore_errors("zstd", frame, 7, 300, 4 << 20)
    with pytest.raises(DecompressionLimitError):
        decompress("zstd", frame, max_size=len(data) - 1)
    assert decompress("zstd", frame, max_size=len(data)) == data


def _log_lines(size: int) -> bytes:
    return b"".join(
        b"2026-12-02T16:%02d:%02d INFO [worker-%d] stage done id=%d status=OK\n"
        % (i % 60, i % 59, i % 8, i)
        for i in range(size // 50 + 1)
    )[:size]


def _gzip_and_lz4_frames() -> list[tuple[str, str, bytes, bytes]]:
    """(codec, name, frame, data): what producers write, over sizes and ratios past the
    first guess (4x), and the frame options the headers read for a bound describe."""
    import lz4.frame

    rng = random.Random(26)
    noise = rng.randbytes(200_000)
    shapes = {
        "logs-16KiB": _log_lines(16_384),
        "logs-256KiB": _log_lines(262_144),
        "logs-1MiB": _log_lines(1_048_576),
        "zeros-3MB": bytes(3_000_000),
        "noise-200KB": noise,
        "mixed": noise[:70_000] + bytes(400_000) + _log_lines(100_000),
        "one-byte": b"x",
        "empty": b"",
        "records": SECTION,
    }
    out = []
    for name, data in shapes.items():
        out.append(("gzip", name, gzip.compress(data, 6), data))  # one member, as Java's
        out.append(("gzip", name + "-kcore", compress("gzip", data), data))
        out.append(("lz4", name + "-kcore", compress("lz4", data), data))  # as Java's
        for option, kwargs in (
            ("size", {"store_size": True}),
            ("checksums", {"block_checksum": True, "content_checksum": True}),
            ("4MiB-blocks", {"block_size": lz4.frame.BLOCKSIZE_MAX4MB}),
            (
                "256KiB-independent",
                {"block_size": lz4.frame.BLOCKSIZE_MAX256KB, "block_linked": False},
            ),
        ):
            out.append(("lz4", f"{name}-{option}", lz4.frame.compress(data, **kwargs), data))
    # Several gzip members: the trailer states the last one's size only
    out.append(
        (
            "gzip",
            "members",
            gzip.compress(bytes(300_000)) + gzip.compress(b"tail"),
            bytes(300_000) + b"tail",
        )
    )
    return out


def test_gzip_and_lz4_batches_decompress_into_what_their_headers_state():
    """gzip's trailer states its member's size and an LZ4 frame's headers bound it (its
    content size, or its blocks' sizes and maximum), so a batch that shrank past the first
    guess (4x) is not decompressed twice; every shape gives back its bytes, as cramjam's
    own reading, and a batch of records compressed so decodes."""
    for codec, name, frame, data in _gzip_and_lz4_frames():
        assert decompress(codec, frame) == data, (codec, name)
        reference = cramjam.gzip.decompress if codec == "gzip" else cramjam.lz4.decompress
        assert bytes(reference(frame)) == data, (codec, name)
        if data == SECTION:
            batch = with_payload(kcore_batch(COMPRESSIBLE, codec), frame)
            assert decode_batches(batch)[0].records() == expected(COMPRESSIBLE), (codec, name)


@pytest.mark.parametrize("codec", ["gzip", "lz4"])
def test_gzip_and_lz4_headers_that_lie_or_end_early_are_corrupt(codec):
    """Every prefix, trailing garbage, a stated size changed both ways, and 300 frames with
    random bytes changed (LZ4: 1,000 more of one block, which python-lz4 reads): kcore's
    errors (corrupt, or the limit), never a crash, a hang or the codec's own error; the limit
    holds whatever the headers state."""
    import lz4.frame

    data = _log_lines(300_000)
    frames = (
        [gzip.compress(data)]
        if codec == "gzip"
        else [
            compress("lz4", data),
            lz4.frame.compress(data, store_size=True, block_checksum=True),
        ]
    )
    if codec == "lz4":  # one block: read by python-lz4 (larger frames: by cramjam)
        small = _log_lines(16_384)
        for frame in (compress("lz4", small), lz4.frame.compress(small, content_checksum=True)):
            _mutants_raise_only_kcore_errors(codec, frame, 16, 1_000, 1 << 20)
    for frame in frames:
        for cut in sorted({1, 4, 6, 7, 11, 18, len(frame) // 2, len(frame) - 4, len(frame) - 1}):
            with pytest.raises(CorruptRecordError):
                decompress(codec, frame[:cut])
        with pytest.raises(CorruptRecordError):
            decompress(codec, frame + b"\x07\x00\x01\x02")
        with pytest.raises(DecompressionLimitError):
            decompress(codec, frame, max_size=len(data) - 1)
        assert decompress(codec, frame, max_size=len(data)) == data
        _mutants_raise_only_kcore_errors(codec, frame, codec, 300, 4 << 20)
    # The stated size is only where decompression starts: too small, the buffer grows; too
    # large or past the limit, it is not believed.
    if codec == "gzip":
        frame = bytearray(gzip.compress(data))
        for stated in (1, len(data) // 10, len(data) * 3, 2**32 - 1):
            frame[-4:] = stated.to_bytes(4, "little")
            with pytest.raises(CorruptRecordError):  # (zlib checks the trailer)
                decompress(codec, bytes(frame))
    else:
        frame = bytearray(lz4.frame.compress(data, store_size=True))
        for stated in (1, len(data) // 10, len(data) * 3, 2**40):
            frame[6:14] = stated.to_bytes(8, "little")
            try:
                assert decompress(codec, bytes(frame), max_size=4 << 20) == data
            except CorruptRecordError:  # (the header's checksum no longer matches)
                pass


def test_zstd_without_the_zstandard_package_uses_cramjam():
    """Without zstandard (kcore[zstd]) zstd batches go through cramjam as before: the same
    frames, read the same way."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['zstandard'] = None\n"
        "from kcore.codec import compress, decompress, zstd_context_reuse_available\n"
        "import cramjam\n"
        "assert not zstd_context_reuse_available()\n"
        "data = bytes(range(256)) * 64\n"
        "for level in (3, 1, -5):\n"
        "    payload = compress('zstd', data, level)\n"
        "    assert decompress('zstd', payload) == data\n"
        "    assert bytes(cramjam.zstd.decompress(payload)) == data\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    # A zstandard older than kcore[zstd] asks for (no allow_extra_data): cramjam too.
    old = code.replace(
        "sys.modules['zstandard'] = None",
        "import types; sys.modules['zstandard'] = types.SimpleNamespace(__version__='0.17.0')",
    )
    subprocess.run([sys.executable, "-c", old], check=True, timeout=120)


def test_lz4_without_the_lz4_package_uses_cramjam():
    """Without python-lz4 (kcore[lz4]) LZ4 batches are read by cramjam, into what their
    headers state: every frame shape of the tests above, the same bytes back."""
    import pickle
    import subprocess
    import sys

    code = (
        "import sys, pickle; frames = pickle.load(sys.stdin.buffer)\n"
        "sys.modules['lz4'] = None; sys.modules['lz4.frame'] = None\n"
        "from kcore.codec import decompress\n"
        "for name, frame, data in frames:\n"
        "    assert decompress('lz4', frame) == data, name\n"
        "print(len(frames))\n"
    )
    frames = [(n, f, d) for c, n, f, d in _gzip_and_lz4_frames() if c == "lz4"]
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(frames),
        capture_output=True,
        check=True,
        timeout=120,
    )
    assert int(done.stdout) == len(frames) > 30


def test_lz4_high_compression_without_the_lz4_package_is_a_config_error():
    """cramjam has no LZ4 HC: without the lz4 package a level other than 9 is refused, naming
    the setting and the package (and the producer refuses it when it is made)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['lz4'] = None\n"
        "from kcore.codec import RecordBatchBuilder, lz4_high_compression_available\n"
        "from kcore.errors import ConfigError\n"
        "assert not lz4_high_compression_available()\n"
        "b = RecordBatchBuilder('lz4', compression_level=12); b.append(None, b'x' * 100, 0)\n"
        "try:\n"
        "    b.build()\n"
        "except ConfigError as e:\n"
        "    assert e.key == 'compression.lz4.level' and 'pip install lz4' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
        "b = RecordBatchBuilder('lz4', compression_level=9); b.append(None, b'x' * 100, 0)\n"
        "b.build()  # the default level needs nothing more\n"
        "import kcore\n"
        "try:\n"
        "    kcore.Producer({'bootstrap.servers': '127.0.0.1:1', 'compression.type': 'lz4',\n"
        "                    'compression.lz4.level': 3})\n"
        "except ConfigError as e:\n"
        "    assert e.key == 'compression.lz4.level', e\n"
        "else:\n"
        "    raise SystemExit('the producer took it')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
