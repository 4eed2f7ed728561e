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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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

# The statistics a sensor reports, each as "<sensor name>-<stat>".
TOTAL, RATE, AVG, MAX = "total", "rate", "avg", "max"


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


class Sensor:
    """Values recorded over time: their cumulative total, and count, sum and maximum per time
    window (Java's SampledStat with ``samples`` windows of ``window_s``)."""

    __slots__ = ("name", "stats", "total", "count", "_window_s", "_samples", "_windows")

    def __init__(self, name: str, stats: tuple[str, ...], window_s: float, samples: int) -> None:
        self.name = name
        self.stats = stats
        self.total = 0.0
        self.count = 0
        self._window_s = window_s
        self._samples = max(1, samples)
        # [start, count, sum, max], oldest first; at most ``samples`` of them
        self._windows: list[list[float]] = []

    def record(self, value: float, now: float) -> None:
        self.total += value
        self.count += 1
        last = self._window(now)
        last[1] += 1
        last[2] += value
        if value > last[3]:
            last[3] = value

    def record_many(self, values: Sequence[float], now: float) -> None:
        """``record`` of each of ``values`` (at least one), all at ``now``."""
        total = sum(values)
        self.total += total
        self.count += len(values)
        last = self._window(now)
        last[1] += len(values)
        last[2] += total
        top = max(values)
        if top > last[3]:
            last[3] = top

    def _window(self, now: float) -> list[float]:
        w = self._windows
        if not w or now - w[-1][0] >= self._window_s:
            w.append([now, 0.0, 0.0, -math.inf])
            if len(w) > self._samples:
                del w[0]
        return w[-1]

    def _live(self, now: float) -> list[list[float]]:
        oldest = now - self._samples * self._window_s
        return [s for s in self._windows if s[0] > oldest]

    def rate(self, now: float) -> float:
        """The values' sum per second over the windows."""
        return self._per_second(now, 2)

    def count_rate(self, now: float) -> float:
        """How many values per second over the windows."""
        return self._per_second(now, 1)

    def _per_second(self, now: float, field: int) -> float:
        live = self._live(now)
        if not live:
            return 0.0
        elapsed = now - live[0][0]
        # As Java's Rate: never less than (samples - 1) whole windows.
        full = int(elapsed // self._window_s)
        if full < self._samples - 1:
            elapsed += (self._samples - 1 - full) * self._window_s
        return sum(s[field] for s in live) / elapsed if elapsed > 0 else 0.0

    def avg(self, now: float) -> float:
        live = self._live(now)
        count = sum(s[1] for s in live)
        return sum(s[2] for s in live) / count if count else math.nan

    def max(self, now: float) -> float:
        live = self._live(now)
        return max((s[3] for s in live), default=math.nan) if live else math.nan

    def read(self, now: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for stat in self.stats:
            if stat == TOTAL:
                out[f"{self.name}-total"] = self.total
            elif stat == RATE:
                out[f"{self.name}-rate"] = self.rate(now)
            elif stat == AVG:
                out[f"{self.name}-avg"] = self.avg(now)
            else:
                out[f"{self.name}-max"] = self.max(now)
        return out


class ClientMetrics:
    """One client's sensors and gauges (its network layer's and its producer's or consumer's
    own). ``record`` makes a sensor on first use with the stats its name is declared with."""

    def __init__(self, window_s: float = 30.0, samples: int = 2) -> None:
        self._window_s = window_s
        self._samples = samples
        self._sensors: dict[str, Sensor] = {}
        self._gauges: dict[str, Callable[[], float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ClientMetrics:
        return cls(
            int(config.get("metrics.sample.window.ms", default_of("metrics.sample.window.ms")))
            / 1000,
            int(config.get("metrics.num.samples", default_of("metrics.num.samples"))),
        )

    def declare(self, name: str, *stats: str) -> None:
        with self._lock:
            if name not in self._sensors:
                self._sensors[name] = Sensor(name, stats, self._window_s, self._samples)

    def record(self, name: str, value: float = 1.0) -> None:
        self.record_all((name, value))

    def record_all(self, *values: tuple[str, float | list[float]]) -> None:
        """``record`` of each (name, value), at one time and under one lock: the producer
        records several per batch and per request. A list of values is each of them recorded
        (a request's batch sizes, say)."""
        now = time.monotonic()
        with self._lock:
            sensors = self._sensors
            for name, value in values:
                many = type(value) is list
                if many and not value:
                    continue
                sensor = sensors.get(name)
                if sensor is None:  # undeclared: every stat
                    sensor = sensors[name] = Sensor(
                        name, (TOTAL, RATE, AVG, MAX), self._window_s, self._samples
                    )
                if many:
                    sensor.record_many(value, now)  # type: ignore[arg-type]
                else:
                    sensor.record(value, now)  # type: ignore[arg-type]

    def count(self, name: str) -> float:
        """How many values ``name`` has recorded since the start (Java's CumulativeCount,
        e.g. ``fetch-total`` counted by the fetch-latency sensor)."""
        with self._lock:
            sensor = self._sensors.get(name)
            return float(sensor.count) if sensor is not None else 0.0

    def total(self, name: str) -> float:
        """The sum of the values ``name`` has recorded since the start (its ``-total``)."""
        with self._lock:
            sensor = self._sensors.get(name)
            return sensor.total if sensor is not None else 0.0

    def rate_of(self, name: str) -> float:
        """Values recorded per second over the windows (Java's Rate of a SampledStat count)."""
        now = time.monotonic()
        with self._lock:
            sensor = self._sensors.get(name)
            return sensor.count_rate(now) if sensor is not None else 0.0

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        self._gauges[name] = read

    def snapshot(self) -> dict[str, float]:
        """Every metric now, by name (sorted)."""
        now = time.monotonic()
        out: dict[str, float] = {}
        with self._lock:
            for sensor in self._sensors.values():
                out.update(sensor.read(now))
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
