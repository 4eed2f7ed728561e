"""The benchmarks' data: constants, and the seeded 100k-record workload in every form the
benchmarks feed in (lists, numpy, pyarrow) with what a correct decode gives back."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

N_RECORDS = 100_000
KEY_SIZE = 16
VALUE_SIZE = 100
SEED = 0x6B636F7265  # "kcore"
BASE_TIMESTAMP_MS = 1_700_000_000_000
CRC_BUFFER_SIZE = 64 * 1024 * 1024
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
# Kafka's codec ids (the low bits of a batch's attributes), as the peers' builders take them.
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
# Values are drawn from 32 symbols (5 bits of entropy a byte), so they compress somewhat, as real
# payloads do; no NUL bytes, so numpy 'S' arrays (which drop trailing NULs) hold them exactly.
VALUE_ALPHABET = b"abcdefghijklmnopqrstuvwxyz012345"


@dataclass
class Workload:
    """100k records (16-byte keys, 100-byte values, a timestamp each, no headers) in every form
    the benchmarks feed in, and what a correct decode must give back."""

    keys: list[bytes]
    values: list[bytes]
    timestamps: list[int]
    keys_np: np.ndarray  # dtype S16
    values_np: np.ndarray  # dtype S100
    timestamps_np: np.ndarray  # int64
    keys_pa: pa.Array  # binary
    values_pa: pa.Array  # binary
    timestamps_pa: pa.Array  # int64
    offsets: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.values)


def build() -> Workload:
    rng = np.random.default_rng(SEED)
    alphabet = np.frombuffer(VALUE_ALPHABET, dtype=np.uint8)
    value_bytes = alphabet[rng.integers(0, len(alphabet), size=(N_RECORDS, VALUE_SIZE))]
    values_np = np.ascontiguousarray(value_bytes).view(f"S{VALUE_SIZE}").ravel()
    values = [bytes(row) for row in value_bytes]
    keys = [b"key-%012d" % i for i in rng.integers(0, 10**12, size=N_RECORDS).tolist()]
    assert all(len(k) == KEY_SIZE for k in keys)
    keys_np = np.array(keys, dtype=f"S{KEY_SIZE}")
    # A few records a millisecond, as a busy producer writes them: deltas of 0-2 ms.
    timestamps_np = BASE_TIMESTAMP_MS + np.cumsum(rng.integers(0, 3, size=N_RECORDS)).astype(
        np.int64
    )
    workload = Workload(
        keys=keys,
        values=values,
        timestamps=timestamps_np.tolist(),
        keys_np=keys_np,
        values_np=values_np,
        timestamps_np=timestamps_np,
        keys_pa=pa.array(keys, pa.binary()),
        values_pa=pa.array(values, pa.binary()),
        timestamps_pa=pa.array(timestamps_np, pa.int64()),
        offsets=list(range(N_RECORDS)),
    )
    # The array forms must hold exactly the list forms, or the bulk benchmarks compare unlike data.
    assert workload.values_np.tolist() == values and workload.keys_np.tolist() == keys
    assert workload.values_pa.to_pylist() == values and workload.keys_pa.to_pylist() == keys
    return workload
