"""kcore's codec against its peers (aiokafka, kafka-python, crc32c, google-crc32c), measured in
the same run on the same data.

Groups (``@pytest.mark.benchmark(group=...)``) hold one workload each, so bench/report.py's
ratios compare like with like:

* ``encode:<codec>``: 100k records (16-byte key, 100-byte value, a timestamp each, no headers)
  into one v2 batch: kcore's ``append`` loop, ``append_many`` from lists / pyarrow / numpy, and
  the peers' ``DefaultRecordBatchBuilder.append`` loops, then ``build()``.
* ``decode:<codec>``: that batch back to every record's key and value: kcore's records,
  kcore's columnar decode (``decode_columns``, ``decode_to_arrow``) and the peers' record loops.
* ``decompress-java:<codec>:<size>``: one gzip, snappy, lz4 or zstd batch of log lines as
  Java's producer compresses it, decompressed; the floor: one pass into a buffer of that size.
* ``crc32c:64MiB`` and ``murmur2:100k-keys``.

Each benchmark then checks its output (outside the timed part): record count, every offset,
timestamp, key and value, the CRC, the codec; kcore's encodes also byte-for-byte against the
reference batch.

Run: ``pytest bench/test_codec_bench.py --benchmark-json=out.json && python bench/report.py
out.json`` (see docs/benchmarks-codec.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _checks import check_arrow, check_columns, check_encoded, check_rows
from _workload import CODEC_IDS, CODECS, CRC_BUFFER_SIZE, KEY_SIZE, VALUE_SIZE, Workload

from kcore.codec import (
    RecordBatchBuilder,
    crc32c,
    decode_batches,
    decode_columns,
    decode_records,
    decode_to_arrow,
    murmur2,
    partition_for_key,
)

# Big enough that no peer builder refuses an append: one batch holds all 100k records (~13 MB).
PEER_BATCH_SIZE = 256 * 1024 * 1024
NUM_PARTITIONS = 64


def _optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


aiokafka_records = _optional("aiokafka.record.default_records")
aiokafka_memory = _optional("aiokafka.record.memory_records")
aiokafka_util = _optional("aiokafka.record.util")
aiokafka_partitioner = _optional("aiokafka.partitioner")
kafka_records = _optional("kafka.record.default_records")
kafka_memory = _optional("kafka.record.memory_records")
kafka_codec = _optional("kafka.codec")
kafka_util = _optional("kafka.record.util")
kafka_partitioner = _optional("kafka.partitioner")
crc32c_pkg = _optional("crc32c")
google_crc32c = _optional("google_crc32c")

AIOKAFKA_COMPILED = aiokafka_records is not None and (
    aiokafka_records.DefaultRecordBatchBuilder.__module__.endswith("_crecords.default_records")
)
AIOKAFKA_LABEL = "aiokafka" if AIOKAFKA_COMPILED else "aiokafka (pure Python: no C extension)"


def _params(prefix: str, codecs: tuple[str, ...] = CODECS) -> list[Any]:
    return [
        pytest.param(c, id=c, marks=pytest.mark.benchmark(group=f"{prefix}:{c}")) for c in codecs
    ]


ENCODE = _params("encode")
DECODE = _params("decode")
ENCODE_NONE = _params("encode", ("none",))
DECODE_NONE = _params("decode", ("none",))
CRC_GROUP = pytest.mark.benchmark(group="crc32c:64MiB")
MURMUR_GROUP = pytest.mark.benchmark(group="murmur2:100k-keys")


def _info(
    benchmark: Any,
    key: str,
    label: str,
    *,
    impl: str,
    items: int | None = None,
    unit: str = "records",
    nbytes: int | None = None,
    **extra: Any,
) -> None:
    """What report.py needs: a stable ``key`` (goals refer to it), a label, who implements it
    (``kcore`` rows get ratios against every other implementation in the group), and the work
    done per call (``items`` of ``unit``, or ``nbytes``)."""
    benchmark.extra_info.update(
        key=key, label=label, impl=impl, items=items, unit=unit, nbytes=nbytes, **extra
    )


def _need(module: Any, what: str) -> None:
    if module is None:
        pytest.skip(f"{what} is not installed")


# ---------------------------------------------------------------------------------------------
# Encode: 100k records into one batch


@pytest.mark.parametrize("codec", ENCODE)
def test_encode_kcore_append(benchmark: Any, workload: Workload, batches: dict, codec: str):
    keys, values, timestamps = workload.keys, workload.values, workload.timestamps

    def run() -> bytes:
        b = RecordBatchBuilder(codec)
        for k, v, ts in zip(keys, values, timestamps, strict=True):
            b.append(k, v, ts)
        return b.build()

    _info(benchmark, "kcore.append", "kcore append() per record", impl="kcore", items=len(keys))
    out = benchmark(run)
    benchmark.extra_info["output_bytes"] = len(out)
    check_encoded(out, codec, workload, reference=batches[codec])


def _bulk(
    benchmark: Any, workload: Workload, batches: dict, codec: str, form: str, k: Any, v: Any, t: Any
) -> None:
    def run() -> bytes:
        b = RecordBatchBuilder(codec)
        b.append_many(k, v, t)
        return b.build()

    _info(
        benchmark,
        f"kcore.append_many.{form}",
        f"kcore append_many() from {form}",
        impl="kcore",
        items=len(workload),
    )
    out = benchmark(run)
    benchmark.extra_info["output_bytes"] = len(out)
    check_encoded(out, codec, workload, reference=batches[codec])


@pytest.mark.parametrize("codec", ENCODE)
def test_encode_kcore_append_many_lists(benchmark, workload, batches, codec):
    w = workload
    _bulk(benchmark, w, batches, codec, "lists", w.keys, w.values, w.timestamps)


@pytest.mark.parametrize("codec", ENCODE)
def test_encode_kcore_append_many_pyarrow(benchmark, workload, batches, codec):
    w = workload
    _bulk(benchmark, w, batches, codec, "pyarrow", w.keys_pa, w.values_pa, w.timestamps_pa)


@pytest.mark.parametrize("codec", ENCODE)
def test_encode_kcore_append_many_numpy(benchmark, workload, batches, codec):
    w = workload
    _bulk(benchmark, w, batches, codec, "numpy", w.keys_np, w.values_np, w.timestamps_np)


def _peer_encode(builder_cls: type, codec: str, workload: Workload) -> Callable[[], bytes]:
    keys, values, timestamps = workload.keys, workload.values, workload.timestamps
    codec_id = CODEC_IDS[codec]
    headers: list = []

    def run() -> bytes:
        # (magic, compression_type, is_transactional, producer_id, producer_epoch,
        #  base_sequence, batch_size); a refused append would show as a short batch in the check.
        b = builder_cls(2, codec_id, 0, -1, -1, -1, PEER_BATCH_SIZE)
        for offset, (k, v, ts) in enumerate(zip(keys, values, timestamps, strict=True)):
            b.append(offset, ts, k, v, headers)
        return b.build()

    return run


@pytest.mark.parametrize("codec", ENCODE)
def test_encode_aiokafka(benchmark, workload, codec):
    _need(aiokafka_records, "aiokafka")
    run = _peer_encode(aiokafka_records.DefaultRecordBatchBuilder, codec, workload)
    _info(
        benchmark,
        "aiokafka.append",
        f"{AIOKAFKA_LABEL} append() per record",
        impl="aiokafka",
        items=len(workload),
        builder=aiokafka_records.DefaultRecordBatchBuilder.__module__,
    )
    out = benchmark(run)
    benchmark.extra_info["output_bytes"] = len(out)
    check_encoded(out, codec, workload)


@pytest.mark.parametrize("codec", ENCODE_NONE)
def test_encode_aiokafka_pure_python(benchmark, workload, codec):
    """aiokafka's pure-Python builder (what it falls back to without its C extension); for
    reference, uncompressed only."""
    _need(aiokafka_records, "aiokafka")
    run = _peer_encode(aiokafka_records._DefaultRecordBatchBuilderPy, codec, workload)
    _info(
        benchmark,
        "aiokafka-py.append",
        "aiokafka pure-Python builder append() (reference)",
        impl="aiokafka-py",
        items=len(workload),
    )
    out = benchmark(run)
    benchmark.extra_info["output_bytes"] = len(out)
    check_encoded(out, codec, workload)


def _kafka_python_has(codec: str) -> None:
    _need(kafka_records, "kafka-python")
    if codec != "none" and not getattr(kafka_codec, f"has_{codec}")():
        pytest.skip(f"kafka-python has no {codec} library here (it needs its own codec package)")


@pytest.mark.parametrize("codec", ENCODE)
def test_encode_kafka_python(benchmark, workload, codec):
    _kafka_python_has(codec)
    run = _peer_encode(kafka_records.DefaultRecordBatchBuilder, codec, workload)
    _info(
        benchmark,
        "kafka-python.append",
        "kafka-python append() per record",
        impl="kafka-python",
        items=len(workload),
    )
    out = benchmark(run)
    benchmark.extra_info["output_bytes"] = len(out)
    check_encoded(out, codec, workload)


def test_uncompressed_encodings_agree(workload, batches):
    """Not a benchmark: uncompressed, every builder writes the very same bytes (so the encode
    benchmarks time the same output)."""
    keys, values, timestamps = workload.keys, workload.values, workload.timestamps
    b = RecordBatchBuilder("none")
    for k, v, ts in zip(keys, values, timestamps, strict=True):
        b.append(k, v, ts)
    assert b.build() == batches["none"], "kcore append() and append_many() differ"
    if aiokafka_records is not None:
        run = _peer_encode(aiokafka_records.DefaultRecordBatchBuilder, "none", workload)
        assert bytes(run()) == batches["none"], "kcore and aiokafka differ"


# ---------------------------------------------------------------------------------------------
# Decode: the batch back to every record's key and value


@pytest.mark.parametrize("codec", DECODE)
def test_decode_kcore_batches_records(benchmark, workload, batches, codec):
    buf = batches[codec]

    def run() -> list:
        out: list = []
        for batch in decode_batches(buf):
            out.extend(batch.records())
        return out

    _info(
        benchmark,
        "kcore.decode_batches",
        "kcore decode_batches() + records()",
        impl="kcore",
        items=len(workload),
        output="records",
    )
    check_rows(benchmark(run), workload)


@pytest.mark.parametrize("codec", DECODE)
def test_decode_kcore_batches_records_no_crc(benchmark, workload, batches, codec):
    """As above without the CRC check: the like-for-like row of the peers' no-CRC rows."""
    buf = batches[codec]

    def run() -> list:
        out: list = []
        for batch in decode_batches(buf, check_crcs=False):
            out.extend(batch.records())
        return out

    _info(
        benchmark,
        "kcore.decode_batches.no_crc",
        "kcore decode_batches(check_crcs=False) + records()",
        impl="kcore",
        items=len(workload),
        output="records",
    )
    check_rows(benchmark(run), workload)


@pytest.mark.parametrize("codec", DECODE)
def test_decode_kcore_decode_records(benchmark, workload, batches, codec):
    _info(
        benchmark,
        "kcore.decode_records",
        "kcore decode_records()",
        impl="kcore",
        items=len(workload),
        output="records",
    )
    check_rows(benchmark(decode_records, batches[codec]), workload)


@pytest.mark.parametrize("codec", DECODE)
def test_decode_kcore_columns(benchmark, workload, batches, codec):
    _info(
        benchmark,
        "kcore.decode_columns",
        "kcore decode_columns() (columnar)",
        impl="kcore",
        items=len(workload),
        output="columns",
    )
    check_columns(benchmark(decode_columns, batches[codec]), workload)


@pytest.mark.parametrize("codec", DECODE)
def test_decode_kcore_arrow(benchmark, workload, batches, codec):
    _info(
        benchmark,
        "kcore.decode_to_arrow",
        "kcore decode_to_arrow() (columnar)",
        impl="kcore",
        items=len(workload),
        output="arrow",
    )
    check_arrow(benchmark(decode_to_arrow, batches[codec]), workload)


def _peer_decode(
    memory_records_cls: type, buf: bytes, check_crcs: bool = True
) -> Callable[[], list]:
    """The peer's consumer path: MemoryRecords over the fetched bytes, batch by batch, each
    batch's CRC checked first as their consumers do by default (``check_crcs=True`` in aiokafka
    and kafka-python, as Java's ``check.crcs``), then every record's offset, timestamp, key and
    value pulled out (as kcore's records() tuples hold)."""

    def run() -> list:
        out: list = []
        records = memory_records_cls(buf)
        while (batch := records.next_batch()) is not None:
            if check_crcs and not batch.validate_crc():
                raise AssertionError("the peer found a CRC mismatch in kcore's batch")
            out.extend([(r.offset, r.timestamp, r.key, r.value) for r in batch])
        return out

    return run


@pytest.mark.parametrize("codec", DECODE)
def test_decode_aiokafka(benchmark, workload, batches, codec):
    _need(aiokafka_memory, "aiokafka")
    _info(
        benchmark,
        "aiokafka.decode",
        f"{AIOKAFKA_LABEL} MemoryRecords/DefaultRecordBatch validate_crc() + records",
        impl="aiokafka",
        items=len(workload),
        output="records",
    )
    check_rows(benchmark(_peer_decode(aiokafka_memory.MemoryRecords, batches[codec])), workload)


@pytest.mark.parametrize("codec", DECODE)
def test_decode_aiokafka_no_crc(benchmark, workload, batches, codec):
    """As above without the CRC check (``check_crcs=False``): the like-for-like peer of
    kcore's ``check_crcs=False`` row."""
    _need(aiokafka_memory, "aiokafka")
    _info(
        benchmark,
        "aiokafka.decode.no_crc",
        f"{AIOKAFKA_LABEL} MemoryRecords/DefaultRecordBatch records, no CRC check",
        impl="aiokafka",
        items=len(workload),
        output="records",
    )
    run = _peer_decode(aiokafka_memory.MemoryRecords, batches[codec], check_crcs=False)
    check_rows(benchmark(run), workload)


def _record_floor() -> Any:
    """bench/_record_floor.pyx, compiled on first use (pyximport: Cython and a C compiler)."""
    try:
        import pyximport

        pyximport.install(language_level=3, inplace=False)
        import _record_floor
    except Exception as exc:  # no compiler, no Cython
        pytest.skip(f"bench/_record_floor.pyx does not compile here: {exc}")
    return _record_floor


@pytest.mark.parametrize("codec", DECODE_NONE)
def test_decode_floor_objects_only(benchmark, workload, codec):
    """Not a decoder: the records' objects alone, made from parsed columns (the least any
    decoder returning these records does). report.py holds the decode goal against it."""
    floor = _record_floor()
    keys = workload.keys_np.view(np.uint8)
    values = workload.values_np.view(np.uint8)
    timestamps = np.ascontiguousarray(workload.timestamps_np, dtype=np.int64)
    _info(
        benchmark,
        "floor.decode_records",
        "the records' objects alone, no decoding (floor)",
        impl="floor",
        items=len(workload),
        output="records",
    )
    check_rows(
        benchmark(floor.make_records, keys, KEY_SIZE, values, VALUE_SIZE, timestamps),
        workload,
    )


@pytest.mark.parametrize("codec", DECODE_NONE)
def test_decode_aiokafka_pure_python(benchmark, workload, batches, codec):
    """aiokafka's pure-Python batch reader, for reference (uncompressed only)."""
    _need(aiokafka_records, "aiokafka")
    buf = batches[codec]
    batch_cls = aiokafka_records._DefaultRecordBatchPy

    def run() -> list:
        return [(r.offset, r.timestamp, r.key, r.value) for r in batch_cls(buf)]

    _info(
        benchmark,
        "aiokafka-py.decode",
        "aiokafka pure-Python DefaultRecordBatch records (reference)",
        impl="aiokafka-py",
        items=len(workload),
        output="records",
    )
    check_rows(benchmark(run), workload)


@pytest.mark.parametrize("codec", DECODE)
def test_decode_kafka_python(benchmark, workload, batches, codec):
    _kafka_python_has(codec)
    _info(
        benchmark,
        "kafka-python.decode",
        "kafka-python MemoryRecords/DefaultRecordBatch validate_crc() + records",
        impl="kafka-python",
        items=len(workload),
        output="records",
    )
    check_rows(benchmark(_peer_decode(kafka_memory.MemoryRecords, batches[codec])), workload)


# ---------------------------------------------------------------------------------------------
# One large compressed batch as Java's producer writes it (gzip: one member; snappy: xerial
# framing, 32 KiB blocks; lz4: 64 KiB blocks, no content size; zstd: no content size), of log
# lines that shrink 4-41x, decompressed: each implementation's call that returns the bytes. The
# floor: the codec's one pass into a buffer of the exact size, allocated in the call.

BIG_BATCH_SIZES = (16_384, 262_144, 1_048_576)
BIG_BATCH_CODECS = ("gzip", "snappy", "lz4", "zstd")
zstandard = _optional("zstandard")
cramjam = _optional("cramjam")
aiokafka_codec = _optional("aiokafka.codec")


def _log_lines(size: int) -> bytes:
    lines = b"".join(
        b"2026-12-02T16:%02d:%02d.%03dZ INFO [worker-%d] org.example.Stage - batch id=%d ok\n"
        % (i % 60, i % 59, i % 1000, i % 8, i)
        for i in range(size // 60 + 1)
    )
    return lines[:size]


@pytest.fixture(
    scope="module",
    params=[(c, n) for c in BIG_BATCH_CODECS for n in BIG_BATCH_SIZES],
    ids=lambda p: f"{p[0]}-{p[1] // 1024}KiB",
)
def big_batch(request: Any) -> tuple[str, bytes, bytes]:
    """(codec, the payload as Java's producer compresses it, the data)."""
    import gzip

    from kcore.codec import compress

    codec, size = request.param
    data = _log_lines(size)
    if codec == "gzip":
        payload = gzip.compress(data, 6)  # GZIPOutputStream's one member
    elif codec in ("snappy", "lz4"):
        payload = compress(codec, data)  # Java's framings (xerial; LZ4 without a content size)
    else:
        _need(zstandard, "zstandard")
        payload = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(data)
    return codec, payload, data


def _big(benchmark: Any, batch: tuple[str, bytes, bytes], fn: Any, **info: Any) -> None:
    codec, payload, data = batch
    benchmark.group = f"decompress-java:{codec}:{len(data) // 1024}KiB"
    ratio = round(len(data) / len(payload), 1)
    _info(benchmark, nbytes=len(data), items=None, unit="bytes", ratio=ratio, **info)
    assert bytes(benchmark(fn, payload)) == data


def test_big_batch_kcore(benchmark, big_batch):
    from kcore.codec import decompress

    codec = big_batch[0]
    _big(
        benchmark,
        big_batch,
        lambda p: decompress(codec, p),
        key="kcore.decompress-java",
        label="kcore decompress",
        impl="kcore",
    )


def test_big_batch_floor(benchmark, big_batch):
    """One pass into a buffer of the exact size (known here, not from the payload; snappy's
    blocks found before the clock starts)."""
    codec, _, data = big_batch
    size = len(data)
    if codec == "zstd":
        context = zstandard.ZstdDecompressor()

        def run(p: bytes) -> Any:
            return context.decompress(p, max_output_size=max(size, 1))
    elif codec == "snappy":  # xerial: a big-endian length, then a raw snappy block
        blocks, pos, payload = [], 16, big_batch[1]
        while pos < len(payload):
            n = int.from_bytes(payload[pos : pos + 4], "big")
            blocks.append(payload[pos + 4 : pos + 4 + n])
            pos += 4 + n
        lengths = [cramjam.snappy.decompress_raw_len(b) for b in blocks]

        def run(p: bytes) -> Any:
            out = np.empty(size, dtype=np.uint8)
            at = 0
            for block, n in zip(blocks, lengths, strict=True):
                at += cramjam.snappy.decompress_raw_into(block, out[at : at + n])
            return out
    else:
        _need(cramjam, "cramjam")
        into = cramjam.gzip.decompress_into if codec == "gzip" else cramjam.lz4.decompress_into

        def run(p: bytes) -> Any:
            out = np.empty(size, dtype=np.uint8)
            return out[: into(p, out)]

    _big(
        benchmark,
        big_batch,
        run,
        key="floor.decompress-java",
        label="one pass, exact size",
        impl="floor",
    )


@pytest.mark.parametrize("peer", ["aiokafka", "kafka-python"])
def test_big_batch_peer(benchmark, big_batch, peer):
    """The peers' own decode functions (aiokafka: gzip through GzipFile, lz4 and zstd through
    cramjam; kafka-python: GzipFile, lz4, a zstandard stream reader)."""
    module = aiokafka_codec if peer == "aiokafka" else kafka_codec
    _need(module, peer)
    fn = getattr(module, f"{big_batch[0]}_decode")
    _big(
        benchmark, big_batch, fn, key=f"{peer}.decompress-java", label=f"{peer} *_decode", impl=peer
    )


# ---------------------------------------------------------------------------------------------
# CRC32C over 64 MiB


def _crc(benchmark: Any, fn: Callable[[bytes], int], buf: bytes, expected: int, **info: Any):
    _info(benchmark, nbytes=CRC_BUFFER_SIZE, items=None, unit="bytes", **info)
    got = benchmark(fn, buf)
    assert got == expected, f"CRC32C {got:#010x}, expected {expected:#010x}"


@CRC_GROUP
def test_crc32c_kcore(benchmark, crc_buffer, crc_expected):
    assert crc32c(b"123456789") == 0xE3069283
    _crc(
        benchmark,
        crc32c,
        crc_buffer,
        crc_expected,
        key="kcore.crc32c",
        label="kcore crc32c()",
        impl="kcore",
    )


@CRC_GROUP
def test_crc32c_crc32c_package(benchmark, crc_buffer, crc_expected):
    _need(crc32c_pkg, "crc32c")
    _crc(
        benchmark,
        crc32c_pkg.crc32c,
        crc_buffer,
        crc_expected,
        key="crc32c.crc32c",
        label="crc32c package crc32c.crc32c()",
        impl="crc32c",
        package=True,
    )


@CRC_GROUP
def test_crc32c_google(benchmark, crc_buffer, crc_expected):
    _need(google_crc32c, "google-crc32c")
    _crc(
        benchmark,
        google_crc32c.value,
        crc_buffer,
        crc_expected,
        key="google_crc32c.value",
        label=f"google_crc32c.value() ({google_crc32c.implementation})",
        impl="google-crc32c",
        package=True,
    )


@CRC_GROUP
def test_crc32c_aiokafka(benchmark, crc_buffer, crc_expected):
    _need(aiokafka_util, "aiokafka")
    fn = aiokafka_util.calc_crc32c
    _crc(
        benchmark,
        fn,
        crc_buffer,
        crc_expected,
        key="aiokafka.calc_crc32c",
        label=f"aiokafka record.util.calc_crc32c ({fn.__name__}) (reference)",
        impl="aiokafka",
    )


@CRC_GROUP
def test_crc32c_kafka_python(benchmark, crc_buffer, crc_expected):
    _need(kafka_util, "kafka-python")
    if kafka_util.crc32c_c is None:
        pytest.skip("kafka-python's CRC32C is pure Python without the crc32c package (too slow)")
    _crc(
        benchmark,
        kafka_util.calc_crc32c,
        crc_buffer,
        crc_expected,
        key="kafka-python.calc_crc32c",
        label="kafka-python record.util.calc_crc32c (= crc32c package) (reference)",
        impl="kafka-python",
    )


# ---------------------------------------------------------------------------------------------
# murmur2 over 100k keys


def _murmur(benchmark: Any, run: Callable[[], list], workload: Workload, **info: Any) -> list:
    _info(benchmark, items=len(workload), unit="keys", **info)
    return benchmark(run)


@MURMUR_GROUP
def test_murmur2_kcore(benchmark, workload, murmur2_expected):
    keys = workload.keys
    got = _murmur(
        benchmark,
        lambda: [murmur2(k) for k in keys],
        workload,
        key="kcore.murmur2",
        label="kcore murmur2() per key",
        impl="kcore",
    )
    _same_hashes(got, murmur2_expected)


@MURMUR_GROUP
def test_murmur2_kcore_partition_for_key(benchmark, workload, murmur2_expected):
    keys = workload.keys
    got = _murmur(
        benchmark,
        lambda: [partition_for_key(k, NUM_PARTITIONS) for k in keys],
        workload,
        key="kcore.partition_for_key",
        label=f"kcore partition_for_key(key, {NUM_PARTITIONS}) per key",
        impl="kcore",
    )
    want = [(h & 0x7FFFFFFF) % NUM_PARTITIONS for h in murmur2_expected]
    assert got == want, "partition_for_key disagrees with the Java partitioner's formula"


@MURMUR_GROUP
def test_murmur2_kafka_python(benchmark, workload, murmur2_expected):
    _need(kafka_partitioner, "kafka-python")
    fn, keys = kafka_partitioner.murmur2, workload.keys
    got = _murmur(
        benchmark,
        lambda: [fn(k) for k in keys],
        workload,
        key="kafka-python.murmur2",
        label="kafka-python kafka.partitioner.murmur2 per key",
        impl="kafka-python",
    )
    _same_hashes(got, murmur2_expected)


@MURMUR_GROUP
def test_murmur2_aiokafka(benchmark, workload, murmur2_expected):
    _need(aiokafka_partitioner, "aiokafka")
    fn, keys = aiokafka_partitioner.murmur2, workload.keys
    got = _murmur(
        benchmark,
        lambda: [fn(k) for k in keys],
        workload,
        key="aiokafka.murmur2",
        label="aiokafka aiokafka.partitioner.murmur2 per key",
        impl="aiokafka",
    )
    _same_hashes(got, murmur2_expected)


def _same_hashes(got: list[int], want_unsigned: list[int]) -> None:
    """kcore returns Java's signed int32, the peers an unsigned one: compare the 32 bits."""
    assert len(got) == len(want_unsigned)
    for i, (g, w) in enumerate(zip(got, want_unsigned, strict=True)):
        if g & 0xFFFFFFFF != w:
            raise AssertionError(f"key {i}: murmur2 {g} ({g & 0xFFFFFFFF:#x}), expected {w:#x}")
