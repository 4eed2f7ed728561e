"""Client metrics under the Java client's names (``record-send-rate``, ``records-lag-max``,
``request-latency-avg``, ...), read with ``Producer.metrics()`` / ``Consumer.metrics()``.

As Java's: a rate, average or maximum covers the last ``metrics.num.samples`` windows of
``metrics.sample.window.ms`` (2 of 30 s by default), a ``-total`` everything since the client
started, and a rate divides by at least ``num.samples - 1`` whole windows (so it reads low in a
client's first 30 s, as Java's does). An average or maximum with nothing recorded in its
windows is NaN. Recording happens per request or per batch, never per record, under a lock
(the network thread and the caller's both record).

A metric with tags (Java's per-partition ``records-lag``) has its tags in its key, as
``name{tag=value,...}`` (:func:`metric_key`); :func:`split_metric_key` reads one back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from kcore._metrics import Sensor, SensorSet
from kcore.config import default_of
from kcore.errors import KcoreError

__all__ = [
    "ClientMetrics",
    "ConnectionCounters",
    "Sensor",
    "WindowStats",
    "metric_key",
    "split_metric_key",
]


def metric_key(name: str, tags: Mapping[str, str]) -> str:
    """The key of metric ``name`` with ``tags`` (``records-lag{topic=orders,partition=0}``),
    the tags in the order given; just ``name`` without tags."""
    if not tags:
        return name
    return name + "{" + ",".join(f"{k}={v}" for k, v in tags.items()) + "}"


def split_metric_key(key: str) -> tuple[str, dict[str, str]]:
    """A metric key's name and tags: ``records-lag{topic=orders,partition=0}`` is
    ``("records-lag", {"topic": "orders", "partition": "0"})``, ``records-lag-max`` is
    ``("records-lag-max", {})``. Tag values cannot hold ``,`` ``=`` ``{`` ``}`` (topic names,
    the only tag values with user text, cannot); a key that breaks that is a KcoreError."""
    brace = key.find("{")
    if brace < 0:
        if "}" in key:
            raise KcoreError(f"metric key {key!r}: '}}' without '{{'")
        return key, {}
    if not key.endswith("}") or brace == 0:
        raise KcoreError(f"metric key {key!r} is not name{{tag=value,...}}")
    tags: dict[str, str] = {}
    body = key[brace + 1 : -1]
    for pair in body.split(",") if body else ():
        tag, eq, value = pair.partition("=")
        if not eq or not tag or any(c in pair for c in "{}") or "=" in value or tag in tags:
            raise KcoreError(f"metric key {key!r}: tag {pair!r} is not one tag=value")
        tags[tag] = value
    return key[:brace], tags


class ClientMetrics(SensorSet):
    """One client's sensors (compiled: kcore._metrics.SensorSet, which records, counts and
    reads them) and gauges (its network layer's and its producer's or consumer's own)."""

    def __init__(self, window_s: float = 30.0, samples: int = 2) -> None:
        self._gauges: dict[str, Callable[[], float]] = {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ClientMetrics:
        return cls(
            int(config.get("metrics.sample.window.ms", default_of("metrics.sample.window.ms")))
            / 1000,
            int(config.get("metrics.num.samples", default_of("metrics.num.samples"))),
        )

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        self._gauges[name] = read

    def snapshot(self) -> dict[str, float]:
        """Every metric now, by name (sorted)."""
        out: dict[str, float] = self.read_sensors()
        for name, read in list(self._gauges.items()):
            try:
                out[name] = float(read())
            except Exception:  # noqa: BLE001 - a gauge of a closing client: not there now
                out[name] = math.nan
        return dict(sorted(out.items()))


# -- statistics (statistics.interval.ms, stats_cb) ------------------------------------------------

# The percentiles of a window's values, as librdkafka's window stats name them.
_PERCENTILES = (("p50", 50.0), ("p75", 75.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0),
                ("p99_99", 99.99))  # fmt: skip


class WindowStats:
    """Values recorded since the statistics were last taken (librdkafka's window stats: each
    emitted document covers one statistics interval). Recorded and taken on one thread (the
    client's event loop): no lock."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: list[int] = []

    def record(self, value: int) -> None:
        self._values.append(value)

    def take(self) -> dict[str, int]:
        """min, max, avg, sum, cnt and percentiles (nearest rank) of the window's values, all
        0 for an empty window (as librdkafka's); the next window starts empty."""
        values, self._values = sorted(self._values), []
        count = len(values)
        if not count:
            return {"min": 0, "max": 0, "avg": 0, "sum": 0, "cnt": 0} | {
                name: 0 for name, _ in _PERCENTILES
            }
        total = sum(values)
        out = {
            "min": values[0],
            "max": values[-1],
            "avg": total // count,
            "sum": total,
            "cnt": count,
        }
        for name, pct in _PERCENTILES:
            out[name] = values[min(count - 1, max(0, math.ceil(pct / 100 * count) - 1))]
        return out


class ConnectionCounters:
    """What one broker connection key did over the client's life, across reconnects (the
    statistics' ``brokers`` entries). Kept only while statistics are on; recorded by the
    connection on the client's event loop, read there too."""

    __slots__ = (
        "state",
        "state_since",
        "tx",
        "txbytes",
        "txerrs",
        "req_timeouts",
        "rx",
        "rxbytes",
        "rxerrs",
        "connects",
        "disconnects",
        "requests",
        "rtt_us",
        "throttle_ms",
    )

    def __init__(self) -> None:
        self.state = "INIT"  # librdkafka's broker states: INIT, CONNECT, UP, DOWN
        self.state_since = time.monotonic()
        self.tx = self.txbytes = self.txerrs = self.req_timeouts = 0
        self.rx = self.rxbytes = self.rxerrs = 0
        self.connects = self.disconnects = 0
        self.requests: dict[str, int] = {}  # requests sent, by API name
        self.rtt_us = WindowStats()
        self.throttle_ms = WindowStats()

    def set_state(self, state: str) -> None:
        if state != self.state:
            self.state, self.state_since = state, time.monotonic()

    def sent(self, api_name: str, size: int) -> None:
        self.tx += 1
        self.txbytes += size
        self.requests[api_name] = self.requests.get(api_name, 0) + 1

    def answered(self, rtt_s: float, throttle_ms: int) -> None:
        self.rx += 1
        self.rtt_us.record(int(rtt_s * 1_000_000))
        self.throttle_ms.record(throttle_ms)
