"""The Spark sink's record timestamps, as the JVM sink makes them (no Spark session needed):
timestamp columns truncated to milliseconds (microseconds / 1000, as ``KafkaWriteTask``),
double columns cast as Spark casts a double to a timestamp, nulls (and NaN, infinities) as the
time now, and a timestamp before 1970 refused (Kafka takes no negative timestamp)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from kcore.errors import ConfigError
from kcore.producer.columns import _milliseconds
from kcore.spark.record_sender import RecordSender, _timestamps
from kcore.spark.write_options import WriteSettings

MICROS = pa.timestamp("us", "UTC")


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_a_timestamp_column_is_truncated_to_milliseconds() -> None:
    # Microseconds, as Spark's Arrow batches carry them. Not negative: handed on as it is.
    column = pa.array([0, 1999, 1_700_000_000_123_999], MICROS)
    assert _timestamps(column) is column
    assert _milliseconds(_timestamps(column)).tolist() == [0, 1, 1_700_000_000_123]
    # Less than 1 ms before 1970: 0 ms, as Java's long division truncates towards zero.
    got = _milliseconds(_timestamps(pa.array([-999, -1, None, 1999], MICROS)))
    assert got[[0, 1, 3]].tolist() == [0, 0, 1] and abs(got[2] - _now_ms()) < 60_000


def test_a_null_timestamp_is_the_time_now() -> None:
    before = _now_ms()
    got = _milliseconds(_timestamps(pa.array([None, 5000], MICROS)))
    assert before <= got[0] <= _now_ms() and got[1] == 5


def test_double_seconds_are_cast_as_spark_casts_them() -> None:
    before = _now_ms()
    seconds = [-0.0005, 0.0015, 1.9999, 1_700_000_000.123456, None, float("nan"), float("inf")]
    got = _timestamps(pa.array(seconds, pa.float64()))
    assert isinstance(got, np.ndarray) and got.dtype == np.int64
    assert got[:4].tolist() == [0, 1, 1999, 1_700_000_000_123]
    assert all(before <= t <= _now_ms() for t in got[4:])


@pytest.mark.parametrize(
    "column",
    [
        pa.array([5000, None, -1000, -5000], MICROS),
        pa.array([5.0, None, -0.0015, -1.0], pa.float64()),
    ],
)
def test_a_timestamp_before_1970_fails_naming_the_column_and_row(column: pa.Array) -> None:
    with pytest.raises(ConfigError, match=r"^timestamp: invalid timestamp -1 ms .* row 12 "):
        _timestamps(column, first_row=10)


class _Producer:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_batch(self, *args: Any, **kwargs: Any) -> Any:
        self.sent.append(args)
        raise AssertionError("nothing may be sent")


def test_a_batch_with_a_timestamp_before_1970_sends_nothing() -> None:
    settings = WriteSettings(
        producer_config={},
        topic="t",
        columns=frozenset({"value", "timestamp"}),
        transactional_id_prefix=None,
        timeout_s=1.0,
    )
    producer = _Producer()
    batch = pa.record_batch(
        {"value": pa.array([b"a", b"b"]), "timestamp": pa.array([0, -2_000_000], MICROS)}
    )
    with pytest.raises(ConfigError, match="invalid timestamp -2000 ms .* row 1 "):
        RecordSender(producer, settings).send(batch)
    assert producer.sent == []
