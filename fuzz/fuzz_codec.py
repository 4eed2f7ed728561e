"""Coverage-guided fuzzing of kcore's codec with atheris (libFuzzer for Python).

The contract is the one tests/test_codec_fuzz.py checks (and this harness imports its
``check_contract``, ``reseal`` and seeds from there, so the two never drift apart): decoding
any bytes succeeds or raises ``CorruptRecordError`` with a position. Anything else -- another
exception, a crash, an ASan report, an allocation over libFuzzer's -malloc_limit_mb -- is a
finding, and libFuzzer writes the input to ``crash-*`` / ``oom-*`` / ``timeout-*``.

Targets (``--target=NAME``):

  decode      the input as a Fetch response's records: every decoder, CRCs as they are
  sealed      the same after re-sealing every batch's CRC (CRC32C v2, CRC-32 magic 0/1), so
              the record parsers run rather than the CRC check
  records     the input is a v2 records section: byte 0 picks the codec and header bits, the
              rest is compressed with it and sealed into a batch
  legacy      the input is the inner message set of a compressed magic 0/1 wrapper (byte 0
              picks magic and codec), each inner message's CRC-32 sealed
  decompress  byte 0 picks the codec; decompress() of the rest, with a 1 MiB limit
  varint      decode_uvarint / decode_varint / decode_varlong at every position
  roundtrip   the input drives RecordBatchBuilder (records, headers, every builder
              argument, append_many); the batch must decode to what went in
  responses   byte 0 picks a version, the rest is a MetadataResponse body: the compiled
              decoder and the Python class must agree (kcore error class, or equal objects),
              and their answers must merge alike into the metadata cache

Known bugs (tests/test_codec_fuzz.py ``test_bug_*``) are stepped around unless
``--no-known-guards`` is given, so the fuzzer keeps looking for new ones. See fuzz/README.md
for how to run it, with or without an instrumented (clang, ASan, libFuzzer coverage) build.
"""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

TARGETS = (
    "decode",
    "sealed",
    "records",
    "legacy",
    "decompress",
    "varint",
    "roundtrip",
    "responses",
    "produce-responses",
)


def _parse_args(argv: list[str]) -> tuple[str, bool, str | None, list[str]]:
    target, guards, seeds, rest = "decode", True, None, [argv[0]]
    for arg in argv[1:]:
        if arg.startswith("--target="):
            target = arg.split("=", 1)[1]
        elif arg == "--no-known-guards":
            guards = False
        elif arg.startswith("--write-seeds="):
            seeds = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if target not in TARGETS:
        raise SystemExit(f"--target must be one of {', '.join(TARGETS)}")
    return target, guards, seeds, rest


TARGET, GUARDS, WRITE_SEEDS, LIBFUZZER_ARGV = _parse_args(sys.argv)

# Python-level coverage for kcore's own modules and the contract; the codec itself reports C
# coverage only when it was built with -fsanitize=fuzzer-no-link (fuzz/README.md).
with atheris.instrument_imports(
    include=[
        "kcore",
        "test_codec_fuzz",
        "test_protocol_compiled_decoders",
        "test_protocol_compiled_produce_response",
        "test_metadata_cache",
    ]
):
    import test_codec_fuzz as contract
    import test_metadata_cache as merges
    import test_protocol_compiled_decoders as responses
    import test_protocol_compiled_produce_response as produce_responses

    import kcore.codec as codec
    from kcore.errors import CorruptRecordError

LIMIT = contract.LIMIT
CODECS = contract.CODECS


def _expect(fn, *args, **kwargs):
    return contract._expect(fn, *args, **kwargs)


# --- targets ---------------------------------------------------------------------------------


def fuzz_decode(data: bytes) -> None:
    contract.check_contract(data)


def fuzz_sealed(data: bytes) -> None:
    contract.check_contract(contract.reseal(data))


_TEMPLATES = list(contract.V2_SEEDS.values())


def fuzz_records(data: bytes) -> None:
    if not data:
        return
    sel = data[0]
    template = _TEMPLATES[(sel >> 3) % len(_TEMPLATES)]
    name = CODECS[sel % 5]
    attributes = (sel & 0x38) if sel & 0x80 else 0  # timestamp type, transactional, control
    section = data[1:]
    records = codec.decode_batches(template)[0].record_count
    if sel & 0x40:
        records = len(section) // 3  # any count, within the guard's bounds
    batch = contract.v2_with_records(
        template,
        section,
        name,
        attributes=attributes | codec.COMPRESSION_CODECS[name],
        record_count=records,
        last_offset_delta=max(records - 1, -1),
    )
    contract.check_contract(batch)


def _legacy_message(offset: int, magic: int, attributes: int, key, value, ts: int) -> bytes:
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", ts)
    for field in (key, value):
        body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    body = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(body)) + body


def fuzz_legacy(data: bytes) -> None:
    """A compressed magic 0/1 wrapper around a message set made from the input: each chunk of
    the input (split at 0xff bytes) is a sealed inner message, so the inner parser runs."""
    if len(data) < 2:
        return
    sel = data[0]
    magic = sel & 1
    name = ("gzip", "snappy", "lz4")[(sel >> 1) % 3]
    inner = b""
    for i, chunk in enumerate(data[1:].split(b"\xff")[:16]):
        if sel & 0x80 and i == 0:
            inner += chunk  # raw bytes among the messages
            continue
        half = len(chunk) // 2
        key = None if chunk[:1] == b"\0" else chunk[:half]
        inner += _legacy_message(i, magic, 0, key, chunk[half:], 1_000 + i)
    if sel & 0x40:
        inner = inner[: len(inner) - (sel & 0x0F)]
    wrapper_value = codec.compress(name, inner)
    wrapper = _legacy_message(
        len(data), magic, codec.COMPRESSION_CODECS[name], None, wrapper_value, 5
    )
    contract.check_contract(wrapper)


def fuzz_decompress(data: bytes) -> None:
    if not data:
        return
    name = contract.COMPRESSED[data[0] % 4]
    payload = data[1:]
    if data[0] & 0x80:
        payload = contract.FRAME_PREFIXES[name] + payload
    for limit in (LIMIT, 64):
        out = _expect(codec.decompress, name, payload, limit)
        assert out is None or (type(out) is bytes and len(out) <= limit)


def fuzz_varint(data: bytes) -> None:
    data = data[:48]  # every position of a short buffer: longer ones only add positions
    for pos in range(len(data) + 2):
        for fn, max_bytes, bits, signed in (
            (codec.decode_uvarint, 5, 32, False),
            (codec.decode_varint, 5, 32, True),
            (codec.decode_varlong, 10, 64, True),
        ):
            expected = contract.reference_varint(data, pos, max_bytes, bits)
            try:
                got = fn(data, pos)
            except CorruptRecordError:
                assert expected is None, (fn.__name__, data.hex(), pos)
                continue
            assert expected is not None, (fn.__name__, data.hex(), pos)
            value, end = expected
            assert got == ((contract._unzigzag(value) if signed else value), end)


def fuzz_roundtrip(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    name = CODECS[fdp.ConsumeIntInRange(0, 4)]
    kwargs = {
        "base_offset": fdp.ConsumeIntInRange(0, 2**62),
        "producer_id": fdp.ConsumeIntInRange(-1, 2**63 - 1),
        "producer_epoch": fdp.ConsumeIntInRange(-1, 2**15 - 1),
        "base_sequence": fdp.ConsumeIntInRange(-(2**31), 2**31 - 1),
        "transactional": fdp.ConsumeBool(),
        "is_control": fdp.ConsumeBool(),
        "partition_leader_epoch": fdp.ConsumeIntInRange(-(2**31), 2**31 - 1),
        "log_append_time": fdp.ConsumeBool(),
    }
    bulk = fdp.ConsumeBool()
    b = codec.RecordBatchBuilder(name, **kwargs)
    rows = []
    for _ in range(fdp.ConsumeIntInRange(0 if name == "none" else 1, 20)):
        key = None if fdp.ConsumeBool() else fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
        value = None if fdp.ConsumeBool() else fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 80))
        ts = fdp.ConsumeIntInRange(-(2**63), 2**63 - 1)
        headers = []
        if not bulk:
            for _ in range(fdp.ConsumeIntInRange(0, 3)):
                hkey = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 10))
                hval = None if fdp.ConsumeBool() else fdp.ConsumeBytes(8)
                headers.append((hkey, hval))
        rows.append((key, value, ts, tuple(headers)))
    if bulk:
        b.append_many([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    else:
        for key, value, ts, headers in rows:
            b.append(key, value, ts, list(headers))
    built = b.build()
    max_ts = max([-1] + [r[2] for r in rows])
    expected = [
        (
            kwargs["base_offset"] + i,
            max_ts if kwargs["log_append_time"] else ts,
            key,
            value,
            headers,
        )
        for i, (key, value, ts, headers) in enumerate(rows)
    ]
    [batch] = codec.decode_batches(built)
    assert batch.records() == expected, (built.hex(), expected)
    assert list(batch) == expected
    assert codec.decode_records(built, skip_control=False) == expected
    assert codec.decode_columns(built, skip_control=False).num_rows == len(rows)


def fuzz_responses(data: bytes) -> None:
    """Byte 0 picks the version; the rest is a MetadataResponse body for both its decoders,
    which must agree (tests/test_protocol_compiled_decoders.py's contract), and whose answers
    must merge alike into the metadata cache (tests/test_metadata_cache.py)."""
    if not data:
        return
    cls = responses.MetadataResponse
    version = _version(cls, data[0])
    responses.check_decoders_agree(cls, data[1:], version)
    merges.check_merges_agree(data[1:], version)


def fuzz_produce_responses(data: bytes) -> None:
    """Byte 0 picks the version; the rest is a ProduceResponse body for both its decoders,
    which must agree (tests/test_protocol_compiled_produce_response.py)."""
    if data:
        cls = produce_responses.ProduceResponse
        responses.check_decoders_agree(cls, data[1:], _version(cls, data[0]))


def _version(cls, byte: int) -> int:
    """A valid version of ``cls``, picked by ``byte``."""
    lo, hi = cls.VALID_VERSIONS
    return lo + byte % (hi - lo + 1)


FUZZERS = {
    "decode": fuzz_decode,
    "sealed": fuzz_sealed,
    "records": fuzz_records,
    "legacy": fuzz_legacy,
    "decompress": fuzz_decompress,
    "varint": fuzz_varint,
    "roundtrip": fuzz_roundtrip,
    "responses": fuzz_responses,
    "produce-responses": fuzz_produce_responses,
}


def write_seeds(directory: str) -> None:
    """Write a starting corpus: the valid batches and messages the tests use."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    seeds = dict(contract.ALL_SEEDS)
    for name, seed in contract.V2_SEEDS.items():
        seeds[f"section-{name}"] = bytes([0]) + contract.records_section(seed)
    for name in contract.COMPRESSED:
        seeds[f"compressed-{name}"] = bytes([contract.COMPRESSED.index(name)]) + codec.compress(
            name, contract.records_section(contract.V2_SEEDS["none"])
        )
    for i, (version, body) in enumerate(responses.ENCODINGS):
        lo = responses.MetadataResponse.VALID_VERSIONS[0]
        seeds[f"metadata-{i}"] = bytes([version - lo]) + body
    for i, (version, body) in enumerate(produce_responses.ENCODINGS):
        lo = produce_responses.ProduceResponse.VALID_VERSIONS[0]
        seeds[f"produce-{i}"] = bytes([version - lo]) + body
    for name, seed in seeds.items():
        (out / f"seed-{name}").write_bytes(seed)


def main() -> None:
    if WRITE_SEEDS:
        write_seeds(WRITE_SEEDS)
        return
    from kcore import _codec

    guards = "on" if GUARDS else "off"
    print(f"kcore fuzz target {TARGET!r}, known-bug guards {guards}, {_codec.__file__}")
    atheris.Setup(LIBFUZZER_ARGV, FUZZERS[TARGET])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
