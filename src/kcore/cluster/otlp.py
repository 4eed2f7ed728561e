"""The OpenTelemetry ``MetricsData`` protobuf (opentelemetry-proto ``metrics/v1/metrics.proto``)
that KIP-714 pushes carry, encoded by hand for the few messages needed: one ``ResourceMetrics``
with string resource attributes and one ``ScopeMetrics`` of ``Gauge`` and ``Sum`` metrics of
double ``NumberDataPoint``s with string attributes (a metric's tags, KIP-714). The points of one
name are one ``Metric`` with a data point each (one per partition of a per-partition metric).

The encoding is protobuf's wire format: each field a key (``field number << 3 | wire type``,
a varint) then its value; nested messages and strings are length-delimited; timestamps are
``fixed64`` nanoseconds since the epoch; doubles are little-endian IEEE 754. Fields at their
default (empty, zero) are left out, as protobuf encoders do.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "CUMULATIVE",
    "DELTA",
    "MetricPoint",
    "encode_metrics_data",
]

# AggregationTemporality (metrics.proto).
DELTA = 1
CUMULATIVE = 2

# Wire types.
_VARINT, _FIXED64, _LEN = 0, 1, 2

_DOUBLE = struct.Struct("<d")
_FIXED64_UINT = struct.Struct("<Q")


@dataclass(frozen=True)
class MetricPoint:
    """One metric at one time: a gauge (``temporality`` None) or a monotonic sum whose value
    covers ``start_ns`` .. ``time_ns`` (``DELTA``) or everything since ``start_ns``
    (``CUMULATIVE``). ``attributes``: the data point's (the metric's tags, e.g. ``topic`` and
    ``partition``); points of one name differ in them."""

    name: str
    value: float
    time_ns: int
    start_ns: int = 0
    temporality: int | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)


def _varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _key(out: bytearray, field: int, wire_type: int) -> None:
    _varint(out, (field << 3) | wire_type)


def _bytes_field(out: bytearray, field: int, data: bytes | bytearray) -> None:
    _key(out, field, _LEN)
    _varint(out, len(data))
    out += data


def _string_field(out: bytearray, field: int, text: str) -> None:
    if text:
        _bytes_field(out, field, text.encode("utf-8"))


def _fixed64_field(out: bytearray, field: int, value: int) -> None:
    if value:
        _key(out, field, _FIXED64)
        out += _FIXED64_UINT.pack(value)


def _key_value(key: str, value: str) -> bytes:
    # KeyValue {key = 1; AnyValue value = 2}, AnyValue {string_value = 1}
    any_value = bytearray()
    _bytes_field(any_value, 1, value.encode("utf-8"))  # (an empty string is still a value)
    kv = bytearray()
    _string_field(kv, 1, key)
    _bytes_field(kv, 2, any_value)
    return bytes(kv)


def _number_data_point(point: MetricPoint) -> bytes:
    # NumberDataPoint {start_time_unix_nano = 2; time_unix_nano = 3; as_double = 4;
    # attributes = 7} (in field order, as protobuf encoders write them)
    out = bytearray()
    _fixed64_field(out, 2, point.start_ns)
    _fixed64_field(out, 3, point.time_ns)
    _key(out, 4, _FIXED64)  # (in a oneof: written even when 0.0)
    out += _DOUBLE.pack(point.value)
    for key, value in point.attributes.items():
        _bytes_field(out, 7, _key_value(key, value))
    return bytes(out)


def _metric(name: str, temporality: int | None, points: list[MetricPoint]) -> bytes:
    # Metric {name = 1; gauge = 5; sum = 7}; Gauge {data_points = 1};
    # Sum {data_points = 1; aggregation_temporality = 2; is_monotonic = 3}
    data = bytearray()
    for point in points:
        _bytes_field(data, 1, _number_data_point(point))
    out = bytearray()
    _string_field(out, 1, name)
    if temporality is None:
        _bytes_field(out, 5, data)
    else:
        _key(data, 2, _VARINT)
        _varint(data, temporality)
        _key(data, 3, _VARINT)
        data.append(1)
        _bytes_field(out, 7, data)
    return bytes(out)


def encode_metrics_data(
    resource_attributes: Mapping[str, str], points: Iterable[MetricPoint]
) -> bytes:
    """``MetricsData {resource_metrics = 1}`` of one ``ResourceMetrics {resource = 1;
    scope_metrics = 2}``: ``Resource {attributes = 1}`` and ``ScopeMetrics {metrics = 2}``.
    The points of one name (and kind: gauge, delta or cumulative sum) make one ``Metric``, in
    the order of each name's first point."""
    resource = bytearray()
    for key, value in resource_attributes.items():
        _bytes_field(resource, 1, _key_value(key, value))
    metrics: dict[tuple[str, int | None], list[MetricPoint]] = {}
    for point in points:
        metrics.setdefault((point.name, point.temporality), []).append(point)
    scope = bytearray()
    for (name, temporality), of_name in metrics.items():
        _bytes_field(scope, 2, _metric(name, temporality, of_name))
    resource_metrics = bytearray()
    _bytes_field(resource_metrics, 1, resource)
    _bytes_field(resource_metrics, 2, scope)
    out = bytearray()
    _bytes_field(out, 1, resource_metrics)
    return bytes(out)
