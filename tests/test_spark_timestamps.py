"""The Spark sink's record timestamps, as the JVM sink makes them (no Spark session needed):
timestamp columns floored to milliseconds, double columns cast as Spark casts a double to a
timestamp, nulls (and NaN, infinities) as the time now."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from kcore.producer.core import _milliseconds
from kcore.spark.record_sender import _timestamps


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_a_timestamp_column_is_floored_to_milliseconds_by_send_batch() -> None:
    # Microseconds, as Spark's Arrow batches carry them; before 1970 too (floor, not truncation).
    column = pa.array([-1500, -1, 0, 1999, 1_700_000_000_123_999], pa.timestamp("us", "UTC"))
    got = _milliseconds(_timestamps(column))
    assert got.tolist() == [-2, -1, 0, 1, 1_700_000_000_123]


def test_a_null_timestamp_is_the_time_now() -> None:
    before = _now_ms()
    got = _milliseconds(_timestamps(pa.array([None, 5000], pa.timestamp("us", "UTC"))))
    assert before <= got[0] <= _now_ms() and got[1] == 5


def test_double_seconds_are_cast_as_spark_casts_them() -> None:
    before = _now_ms()
    seconds = [-0.0005, -1.0015, 1.9999, 1_700_000_000.123456, None, float("nan"), float("inf")]
    got = _timestamps(pa.array(seconds, pa.float64()))
    assert isinstance(got, np.ndarray) and got.dtype == np.int64
    assert got[:4].tolist() == [-1, -1002, 1999, 1_700_000_000_123]
    assert all(before <= t <= _now_ms() for t in got[4:])
