"""KIP-714 client telemetry, sans-IO: what to ask the broker next and when, and what each answer
changes. No I/O and no event loop here; :mod:`kcore.cluster.telemetry_sender` drives it over a
client's connections.

The states (as Java's ``ClientTelemetryState``)::

    SUBSCRIPTION_NEEDED -> SUBSCRIPTION_IN_PROGRESS -> PUSH_NEEDED -> PUSH_IN_PROGRESS
          ^                                                               |
          +----------- UNKNOWN_SUBSCRIPTION_ID, an error, no metrics -----+
    (closing) TERMINATING_PUSH_NEEDED -> TERMINATING_PUSH_IN_PROGRESS -> TERMINATED

Rules kept (KIP-714 "Client behavior" and "Error handling"):
- The first GetTelemetrySubscriptions sends the zero client instance id; the broker assigns
  one, which every later request carries.
- The first push after the client's first subscription comes at a random 0.5..1.5 of the push
  interval (so clients started together do not push together), later pushes one interval
  after the previous answer.
- No requested metrics: nothing is pushed; the subscription is asked for again one push
  interval later. One empty string (or ``*``) requested: every metric; otherwise the metrics
  whose name starts with one of the requested prefixes.
- UNKNOWN_SUBSCRIPTION_ID, UNSUPPORTED_COMPRESSION_TYPE: ask for the subscription again at
  once. TELEMETRY_TOO_LARGE, THROTTLING_QUOTA_EXCEEDED: ask again after the push interval.
  INVALID_REQUEST, INVALID_RECORD, UNSUPPORTED_VERSION and any other error: stop for good
  (retrying cannot fix what the broker refused).
- No answer (connection failure, timeout): ask for the subscription again after
  ``retry.backoff.ms`` growing to ``retry.backoff.max.ms``.
- Closing sends one last push with ``Terminating`` set if there is a subscription with
  metrics; nothing is pushed after it.
"""

from __future__ import annotations

import enum
import logging
import math
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kcore.cluster.otlp import CUMULATIVE, DELTA, MetricPoint, encode_metrics_data
from kcore.codec import COMPRESSION_CODECS, compress
from kcore.errors import ErrorCode
from kcore.metrics import split_metric_key
from kcore.network.backoff import ExponentialBackoff
from kcore.protocol.messages import (
    GetTelemetrySubscriptionsRequest,
    GetTelemetrySubscriptionsResponse,
    PushTelemetryRequest,
    PushTelemetryResponse,
)
from kcore.protocol.types import ZERO_UUID, Message

__all__ = [
    "ClientTelemetry",
    "Subscription",
    "TelemetryPhase",
    "resource_attributes",
    "telemetry_attributes",
    "telemetry_name",
]

log = logging.getLogger("kcore.telemetry")

DOMAIN = "org.apache.kafka"
# When the broker gave no push interval to wait by (an error before any subscription).
DEFAULT_PUSH_INTERVAL_S = 300.0
# The first push's random share of the push interval (KIP-714).
FIRST_PUSH_JITTER = (0.5, 1.5)

# Java's metric group of each kcore metric (by the sensor or gauge name it comes from); the
# telemetry name is "org.apache.kafka." + the group without "-metrics" + "." + the metric
# name, dashes as dots (Java's TelemetryMetricNamingConvention). A name not listed is in the
# client's own group (producer-metrics, consumer-metrics, admin-client-metrics).
_CLIENT_GROUP = {
    "producer": "producer-metrics",
    "consumer": "consumer-metrics",
    "share_consumer": "consumer-share-metrics",
    "admin": "admin-client-metrics",
}
_CONSUMER_GROUPS = {
    "records-consumed": "consumer-fetch-manager-metrics",
    "bytes-consumed": "consumer-fetch-manager-metrics",
    "fetch-latency": "consumer-fetch-manager-metrics",
    "fetch-size": "consumer-fetch-manager-metrics",
    "fetch-throttle-time": "consumer-fetch-manager-metrics",
    "records-lag": "consumer-fetch-manager-metrics",
    "fetch": "consumer-fetch-manager-metrics",  # fetch-total, fetch-rate
    "commit-latency": "consumer-coordinator-metrics",
    "commit": "consumer-coordinator-metrics",  # commit-total, commit-rate
    "assigned-partitions": "consumer-coordinator-metrics",
}
# A share consumer's (KIP-932): Java's consumer-share-fetch-manager and -coordinator groups.
_SHARE_FETCH = "consumer-share-fetch-manager-metrics"
_SHARE_CONSUMER_GROUPS = {
    **{name: _SHARE_FETCH for name, group in _CONSUMER_GROUPS.items() if "fetch" in group},
    "records-per-request": _SHARE_FETCH,
    "acknowledgements-send": _SHARE_FETCH,
    "acknowledgements-error": _SHARE_FETCH,
    "assigned-partitions": "consumer-share-coordinator-metrics",
}
_GROUPS_OF = {"consumer": _CONSUMER_GROUPS, "share_consumer": _SHARE_CONSUMER_GROUPS}
_STAT_SUFFIXES = ("-total", "-rate", "-avg", "-max")


def telemetry_name(kind: str, name: str) -> str:
    """The name Java's client pushes metric ``name`` (a name, without tags) of a ``kind``
    client under (e.g. ``record-send-rate`` of a producer:
    ``org.apache.kafka.producer.record.send.rate``)."""
    group = _CLIENT_GROUP[kind]
    groups = _GROUPS_OF.get(kind)
    if groups is not None:
        base = name
        for suffix in _STAT_SUFFIXES:
            if name.endswith(suffix):
                base = name[: -len(suffix)]
                break
        group = groups.get(base, groups.get(name, group))
    group = group.removesuffix("-metrics")
    return f"{DOMAIN}.{group}.{name}".lower().replace("-", ".")


def telemetry_attributes(tags: Mapping[str, str]) -> dict[str, str]:
    """The data point attributes of a metric's tags: each tag's name in lower case with dashes
    as underscores, its value as it is (Java's TelemetryMetricNamingConvention)."""
    return {tag.lower().replace("-", "_"): value for tag, value in tags.items()}


def resource_attributes(kind: str, config: Mapping[str, Any]) -> dict[str, str]:
    """The resource attributes a client adds to its pushes (KIP-714's standard client resource
    labels; the broker adds the client id, address, software name and version itself)."""
    keys = {
        "producer": (("transactional.id", "transactional_id"),),
        "consumer": (
            ("group.id", "group_id"),
            ("group.instance.id", "group_instance_id"),
            ("client.rack", "client_rack"),
        ),
        "share_consumer": (("group.id", "group_id"), ("client.rack", "client_rack")),
    }.get(kind, ())
    out: dict[str, str] = {}
    for key, label in keys:
        value = config.get(key)
        if value:
            out[label] = str(value)
    return out


class TelemetryPhase(enum.Enum):
    SUBSCRIPTION_NEEDED = "subscription needed"
    SUBSCRIPTION_IN_PROGRESS = "subscription in progress"
    PUSH_NEEDED = "push needed"
    PUSH_IN_PROGRESS = "push in progress"
    TERMINATING_PUSH_NEEDED = "terminating push needed"
    TERMINATING_PUSH_IN_PROGRESS = "terminating push in progress"
    TERMINATED = "terminated"


@dataclass(frozen=True)
class Subscription:
    """One GetTelemetrySubscriptions answer."""

    subscription_id: int
    compression: str  # the codec pushes use: the first accepted one kcore has, else "none"
    push_interval_s: float
    max_bytes: int
    delta: bool
    requested: tuple[str, ...]

    @property
    def wants_nothing(self) -> bool:
        return not self.requested

    def wants(self, name: str) -> bool:
        if not self.requested:
            return False
        if self.requested in (("",), ("*",)):
            return True
        return any(name.startswith(prefix) for prefix in self.requested if prefix)


def _compression_for(accepted: list[int]) -> str:
    names = {code: name for name, code in COMPRESSION_CODECS.items()}
    for code in accepted:  # the broker lists them in its order of preference
        name = names.get(code)
        if name is not None and name != "none":
            return name
    return "none"


class ClientTelemetry:
    """The telemetry state of one client: its instance id, its subscription, when the next
    request is due and the last values of its pushed sums (for delta temporality).

    ``kind``: "producer", "consumer", "share_consumer" or "admin"; ``resource``: the resource
    attributes of every push; ``backoff``: the pauses after requests that got no answer;
    ``start_ns``: the client's start (wall clock), where cumulative sums start."""

    def __init__(
        self,
        kind: str,
        resource: Mapping[str, str],
        backoff: ExponentialBackoff,
        *,
        now: float,
        start_ns: int,
        rng: Callable[[float, float], float] = random.uniform,
    ) -> None:
        if kind not in _CLIENT_GROUP:
            raise ValueError(f"telemetry kind must be one of {sorted(_CLIENT_GROUP)}, not {kind!r}")
        self.kind = kind
        self.resource = dict(resource)
        self.phase = TelemetryPhase.SUBSCRIPTION_NEEDED
        self.instance_id: uuid.UUID = ZERO_UUID
        self.subscription: Subscription | None = None
        self.due = now
        self.pushes = 0  # pushes the broker accepted
        self._backoff = backoff
        self._failures = 0
        self._start_ns = start_ns
        self._rng = rng
        self._subscribed_before = False
        # metric key (tags and all: one per partition) -> (value, time) of each sum at the
        # last push: a delta push sends the change
        self._last_sums: dict[str, tuple[float, int]] = {}
        self._warned_too_large = False

    # -- what to do next ----------------------------------------------------------------------

    def wait_s(self, now: float) -> float | None:
        """Seconds until a request is due (0: now); None while one is in flight or when there
        is nothing more to do."""
        if self.phase not in (
            TelemetryPhase.SUBSCRIPTION_NEEDED,
            TelemetryPhase.PUSH_NEEDED,
            TelemetryPhase.TERMINATING_PUSH_NEEDED,
        ):
            return None
        return max(0.0, self.due - now)

    @property
    def finished(self) -> bool:
        return self.phase is TelemetryPhase.TERMINATED

    def next_request(
        self, now: float, wall_ns: int, read_metrics: Callable[[], Mapping[str, float]]
    ) -> Message | None:
        """The request due at ``now`` (None: none is). ``read_metrics`` is called only for a
        push: the client's metrics by their kcore names."""
        if self.due > now and self.phase is not TelemetryPhase.TERMINATING_PUSH_NEEDED:
            return None
        if self.phase is TelemetryPhase.SUBSCRIPTION_NEEDED:
            self.phase = TelemetryPhase.SUBSCRIPTION_IN_PROGRESS
            return GetTelemetrySubscriptionsRequest(client_instance_id=self.instance_id)
        if self.phase in (TelemetryPhase.PUSH_NEEDED, TelemetryPhase.TERMINATING_PUSH_NEEDED):
            terminating = self.phase is TelemetryPhase.TERMINATING_PUSH_NEEDED
            sub = self.subscription
            assert sub is not None
            payload = self._payload(sub, read_metrics(), wall_ns)
            if payload is None:  # nothing fits telemetry.max.bytes: skip this push
                if terminating:
                    self.phase = TelemetryPhase.TERMINATED
                else:
                    self.due = now + sub.push_interval_s
                return None
            self.phase = (
                TelemetryPhase.TERMINATING_PUSH_IN_PROGRESS
                if terminating
                else TelemetryPhase.PUSH_IN_PROGRESS
            )
            return PushTelemetryRequest(
                client_instance_id=self.instance_id,
                subscription_id=sub.subscription_id,
                terminating=terminating,
                compression_type=COMPRESSION_CODECS[sub.compression],
                metrics=payload,
            )
        return None

    # -- answers ------------------------------------------------------------------------------

    def on_response(self, response: Any, now: float) -> None:
        """Apply a GetTelemetrySubscriptions or PushTelemetry answer received at ``now``."""
        self._failures = 0
        if isinstance(response, GetTelemetrySubscriptionsResponse):
            self._on_subscription(response, now)
        elif isinstance(response, PushTelemetryResponse):
            self._on_push(response, now)
        else:
            raise TypeError(f"not a telemetry response: {type(response).__name__}")

    def on_no_answer(self, now: float, reason: str) -> None:
        """The request in flight (or the connection for it) failed without an answer."""
        if self.phase in (
            TelemetryPhase.TERMINATING_PUSH_NEEDED,
            TelemetryPhase.TERMINATING_PUSH_IN_PROGRESS,
            TelemetryPhase.TERMINATED,
        ):
            self.phase = TelemetryPhase.TERMINATED  # closing: no second try
            return
        wait = self._backoff.backoff_s(self._failures)
        self._failures += 1
        log.debug("telemetry request failed (%s); asking again in %.3gs", reason, wait)
        self.phase = TelemetryPhase.SUBSCRIPTION_NEEDED
        self.due = now + wait

    def stop(self) -> None:
        """Nothing more to do, ever: the broker has no telemetry APIs (no telemetry receiver),
        or the cluster cannot be reached in a way waiting cannot fix."""
        self.phase = TelemetryPhase.TERMINATED

    def close(self, now: float) -> bool:
        """The client is closing: whether a terminating push is to be sent now."""
        sub = self.subscription
        if (
            self.phase
            in (
                TelemetryPhase.PUSH_NEEDED,
                TelemetryPhase.PUSH_IN_PROGRESS,
            )
            and sub is not None
            and not sub.wants_nothing
        ):
            self.phase = TelemetryPhase.TERMINATING_PUSH_NEEDED
            self.due = now
            return True
        self.phase = TelemetryPhase.TERMINATED
        return False

    def _on_subscription(self, r: Any, now: float) -> None:
        """``r``: a GetTelemetrySubscriptionsResponse."""
        if self.phase is not TelemetryPhase.SUBSCRIPTION_IN_PROGRESS:
            return  # closed meanwhile
        if r.error_code != ErrorCode.NONE:
            self._on_error(r.error_code, now, "GetTelemetrySubscriptions")
            return
        if r.client_instance_id != ZERO_UUID:
            self.instance_id = r.client_instance_id
        sub = Subscription(
            subscription_id=r.subscription_id,
            compression=_compression_for(r.accepted_compression_types),
            push_interval_s=max(r.push_interval_ms, 0) / 1000 or DEFAULT_PUSH_INTERVAL_S,
            max_bytes=r.telemetry_max_bytes,
            delta=bool(r.delta_temporality),
            requested=tuple(r.requested_metrics),
        )
        self.subscription = sub
        if sub.wants_nothing:
            self.phase = TelemetryPhase.SUBSCRIPTION_NEEDED
            self.due = now + sub.push_interval_s
            return
        self.phase = TelemetryPhase.PUSH_NEEDED
        if self._subscribed_before:
            self.due = now + sub.push_interval_s
        else:
            self.due = now + sub.push_interval_s * self._rng(*FIRST_PUSH_JITTER)
        self._subscribed_before = True

    def _on_push(self, r: Any, now: float) -> None:
        """``r``: a PushTelemetryResponse."""
        if self.phase is TelemetryPhase.TERMINATING_PUSH_IN_PROGRESS:
            self.phase = TelemetryPhase.TERMINATED
            if r.error_code == ErrorCode.NONE:
                self.pushes += 1
            return
        if self.phase is not TelemetryPhase.PUSH_IN_PROGRESS:
            return
        sub = self.subscription
        assert sub is not None
        if r.error_code == ErrorCode.NONE:
            self.pushes += 1
            self.phase = TelemetryPhase.PUSH_NEEDED
            self.due = now + sub.push_interval_s
            return
        self._on_error(r.error_code, now, "PushTelemetry")

    def _on_error(self, code: int, now: float, what: str) -> None:
        sub = self.subscription
        interval = sub.push_interval_s if sub is not None else DEFAULT_PUSH_INTERVAL_S
        if code in (ErrorCode.UNKNOWN_SUBSCRIPTION_ID, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE):
            # The subscription changed (or the codec is refused): ask for it again at once.
            log.debug("%s: %s; asking for the subscription again", what, _name(code))
            self.phase, self.due = TelemetryPhase.SUBSCRIPTION_NEEDED, now
        elif code in (ErrorCode.TELEMETRY_TOO_LARGE, ErrorCode.THROTTLING_QUOTA_EXCEEDED):
            log.info("%s: %s; asking again in %gs", what, _name(code), interval)
            self.phase, self.due = TelemetryPhase.SUBSCRIPTION_NEEDED, now + interval
        else:
            log.error("%s: %s; no more client telemetry from this client", what, _name(code))
            self.phase = TelemetryPhase.TERMINATED

    # -- the payload --------------------------------------------------------------------------

    def _points(
        self, sub: Subscription, metrics: Mapping[str, float], wall_ns: int
    ) -> list[tuple[str, MetricPoint]]:
        """(metric key, point) of each subscribed metric with a value. A tagged key
        (``records-lag{topic=t,partition=0}``) is pushed under its name's telemetry name (the
        one a subscription's prefixes match) with its tags as the point's attributes."""
        points = []
        for key, value in metrics.items():
            if not math.isfinite(value):
                continue  # nothing recorded in the windows (NaN): not sent (sparse metrics)
            name, tags = split_metric_key(key)
            full = telemetry_name(self.kind, name)
            if not sub.wants(full):
                continue
            attributes = telemetry_attributes(tags)
            if not name.endswith("-total"):
                point = MetricPoint(full, value, wall_ns, attributes=attributes)
            elif sub.delta:
                last_value, last_ns = self._last_sums.get(key, (0.0, self._start_ns))
                point = MetricPoint(
                    full, value - last_value, wall_ns, last_ns, DELTA, attributes=attributes
                )
            else:
                point = MetricPoint(
                    full, value, wall_ns, self._start_ns, CUMULATIVE, attributes=attributes
                )
            points.append((key, point))
        return points

    def _payload(
        self, sub: Subscription, metrics: Mapping[str, float], wall_ns: int
    ) -> bytes | None:
        """The compressed MetricsData of the subscribed metrics, cut (halving the points) until
        it fits the broker's telemetry max bytes; None if not even one point fits. The sums
        sent are the base of the next delta (as Java's: whether or not the push succeeds)."""
        points = self._points(sub, metrics, wall_ns)
        while True:
            payload = encode_metrics_data(self.resource, (p for _, p in points))
            if sub.compression != "none":
                payload = compress(sub.compression, payload)  # type: ignore[arg-type]
            if sub.max_bytes <= 0 or len(payload) <= sub.max_bytes:
                break
            if not self._warned_too_large:
                self._warned_too_large = True
                log.warning(
                    "client telemetry: %d metric points take %d bytes, over the broker's %d; "
                    "sending fewer",
                    len(points),
                    len(payload),
                    sub.max_bytes,
                )
            if len(points) <= 1:
                return None
            points = points[: len(points) // 2]
        for key, point in points:
            if point.temporality is not None:
                self._last_sums[key] = (metrics[key], wall_ns)
        return payload


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error code {code}"
