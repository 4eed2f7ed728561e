"""OpenTelemetry for producers, consumers and share consumers (the ``kcore[otel]`` extra:
``opentelemetry-api``). kcore records through the API; the application's SDK (or agent)
exports, as for any library.

Turned on per client with ``otel.metrics.enable`` and ``otel.traces.enable``; the providers are
``otel.meter.provider`` / ``otel.tracer.provider`` or else the global ones. What is recorded:

- metrics of the messaging semantic conventions: ``messaging.client.sent.messages``,
  ``messaging.client.consumed.messages`` and ``messaging.client.operation.duration``, with
  ``messaging.system=kafka``, the topic, the partition, the consumer group and
  ``messaging.kafka.cluster.id`` once metadata named it;
- the client's own metrics (``metrics()``) as observable instruments named as KIP-714 pushes
  them (``org.apache.kafka.producer.record.send.rate``, ...), their tags (topic, partition) as
  attributes;
- a span per send (PRODUCER, ended at delivery) whose context goes into the record's headers,
  a span per poll that returned records (CONSUMER), linked to each record's sender span, and a
  span per share consumer ``commit_sync`` (CLIENT, operation type ``settle``).

Rules kept: nothing of OpenTelemetry is imported or called while both keys are off (the clients
hold ``None`` and test it once per batch or call). Metrics are recorded per batch (a produce
batch answered, a partition's records handed out by one poll), never per record. Trace context
is written and read by the global text-map propagator (W3C ``traceparent`` / ``tracestate`` by
default); a record's earlier context headers are replaced, not duplicated.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kcore._version import __version__
from kcore.metrics import split_metric_key
from kcore.types import TopicPartition

__all__ = ["ClientOTel", "trace_context"]

SYSTEM = "kafka"
SCOPE = "kcore"
# The messaging conventions' bucket advice for messaging.client.operation.duration (seconds).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
# How often new metric names (a sensor first recorded after the start) get instruments.
INSTRUMENT_REFRESH_S = 5.0
# How long one reading of metrics() serves the observable instruments (one collection reads
# every instrument in turn; this keeps it to one reading).
SNAPSHOT_TTL_S = 1.0
# The OpenTelemetry SDK's default span link limit.
DEFAULT_MAX_LINKS = 128


class _HeaderCarrier:
    """Record headers (``(key, bytes)`` pairs) as the propagator reads them (its Getter
    interface; not a subclass, so that this module loads without OpenTelemetry)."""

    @staticmethod
    def get(carrier: Sequence[tuple[str, Any]], key: str) -> list[str] | None:
        found = [_text(v) for k, v in carrier if k == key and v is not None]
        return found or None

    @staticmethod
    def keys(carrier: Sequence[tuple[str, Any]]) -> list[str]:
        return [k for k, _ in carrier]


_HEADERS: Any = _HeaderCarrier()


def _env_int(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, default)))
    except ValueError:
        return default


def header_pairs(row: Any) -> list[tuple[str, Any]]:
    """One record's headers as ``(key, value)`` pairs, from pairs or from an Arrow headers
    column's ``{key:, value:}`` dicts."""
    if not row:
        return []
    return [(h["key"], h["value"]) if isinstance(h, dict) else (h[0], h[1]) for h in row]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)


def trace_context(record_or_headers: Any) -> Any:
    """The OpenTelemetry context a record's headers carry (a ``ConsumerRecord`` or its
    headers), to start a processing span as a child of the sender's:
    ``tracer.start_as_current_span("process", context=kcore.trace_context(record))``."""
    from opentelemetry import propagate

    headers = getattr(record_or_headers, "headers", record_or_headers) or ()
    return propagate.extract(headers, getter=_HEADERS)


class ClientOTel:
    """One producer's, consumer's or share consumer's instruments and tracer. Made only when
    one of the two keys is on (:meth:`of_client`); called by the client's batch and poll
    owners."""

    def __init__(
        self,
        kind: str,
        config: Mapping[str, Any],
        *,
        client_id: str,
        read_metrics: Callable[[], dict[str, float]],
        cluster_id: Callable[[], str | None],
        group_id: str | None = None,
        tagged_names: Sequence[str] = (),
    ) -> None:
        """``tagged_names``: metrics that appear later, per tag (per-partition lag with its
        assignment), instrumented from the start."""
        self.kind = kind
        self.client_id = client_id
        self.group_id = group_id or None
        self._read_metrics = read_metrics
        self._tagged_names = tuple(tagged_names)
        self._cluster_id = cluster_id
        self.metrics_on = bool(config.get("otel.metrics.enable"))
        self.traces_on = bool(config.get("otel.traces.enable"))
        self._attrs: dict[tuple[str, int, str | None], dict[str, Any]] = {}
        self._send_attrs: dict[str, dict[str, Any]] = {}  # a one-record send span's, by topic
        self._lock = threading.Lock()
        self._instrumented: set[str] = set()
        self._next_refresh = 0.0
        self._snapshot: tuple[float, dict[str, list[tuple[float, dict[str, str]]]]] = (-1.0, {})
        if self.metrics_on:
            from opentelemetry import metrics

            provider = config.get("otel.meter.provider") or metrics.get_meter_provider()
            self.meter = provider.get_meter(SCOPE, __version__)
            self.sent = self.meter.create_counter(
                "messaging.client.sent.messages",
                unit="{message}",
                description="Records the producer got acknowledged, or failed to send.",
            )
            self.consumed = self.meter.create_counter(
                "messaging.client.consumed.messages",
                unit="{message}",
                description="Records polls handed out.",
            )
            self.duration = self.meter.create_histogram(
                "messaging.client.operation.duration",
                unit="s",
                description="A produce batch from its first record to its answer; a poll that "
                "returned records, from its call to its return.",
                explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
            )
        if self.traces_on:
            from opentelemetry import propagate, trace

            provider = config.get("otel.tracer.provider") or trace.get_tracer_provider()
            self.tracer = provider.get_tracer(SCOPE, __version__)
            self._trace = trace
            self._propagator = propagate.get_global_textmap()
            self._context_keys = frozenset(self._propagator.fields)
            # The SDK's span link limit (OTEL_SPAN_LINK_COUNT_LIMIT, default 128).
            self.max_links = _env_int("OTEL_SPAN_LINK_COUNT_LIMIT", DEFAULT_MAX_LINKS)

    @classmethod
    def of_client(
        cls,
        kind: str,
        config: Mapping[str, Any],
        cluster: Any,
        read_metrics: Callable[[], dict[str, float]],
        *,
        group_id: str | None = None,
        tagged_names: Sequence[str] = (),
    ) -> ClientOTel | None:
        """A client's (``cluster``: its ClusterClient, for the client id and the cluster id),
        or None while both keys are off."""
        if not (config["otel.metrics.enable"] or config["otel.traces.enable"]):
            return None
        return cls(
            kind,
            config,
            client_id=cluster.settings.client_id,
            read_metrics=read_metrics,
            cluster_id=lambda: cluster.cache.current.cluster_id,
            group_id=group_id,
            tagged_names=tagged_names,
        )

    # -- attributes -------------------------------------------------------------------------------

    def attributes(
        self, topic: str, partition: int, operation: str, error: str | None = None
    ) -> dict[str, Any]:
        """The metric attributes of one partition's operation (cached: a few partitions, many
        batches)."""
        key = (topic, partition, error if operation == "send" else operation)
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = {
                "messaging.system": SYSTEM,
                "messaging.operation.name": operation,
                "messaging.operation.type": "send" if operation == "send" else "receive",
                "messaging.destination.name": topic,
                "messaging.destination.partition.id": str(partition),
            }
            if self.group_id is not None and operation != "send":
                attrs["messaging.consumer.group.name"] = self.group_id
            cluster_id = self._cluster_id()
            if cluster_id:
                attrs["messaging.kafka.cluster.id"] = cluster_id
            if error is not None:
                attrs["error.type"] = error
            if cluster_id:  # kept once complete: until metadata names the cluster, made anew
                self._attrs[key] = attrs
        return attrs

    # -- metrics: per produce batch, per partition of a poll, per poll ----------------------------

    def batch_done(
        self, tp: TopicPartition, records: int, created: float, error: BaseException | None
    ) -> None:
        """A produce batch was answered (``created``: time.monotonic() of its first record)."""
        now = time.monotonic()
        attrs = self.attributes(
            tp.topic, tp.partition, "send", None if error is None else type(error).__name__
        )
        self.sent.add(records, attrs)
        self.duration.record(now - created, attrs)
        self._maybe_refresh(now)

    def records_taken(self, topic: str, partition: int, records: int) -> None:
        """A poll handed out ``records`` of one partition."""
        self.consumed.add(records, self.attributes(topic, partition, "poll"))

    def poll_done(self, started: float, topic: str | None) -> None:
        """A poll that returned records (``started``: time.monotonic() of its call)."""
        now = time.monotonic()
        attrs = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "poll",
            "messaging.operation.type": "receive",
        }
        if topic is not None:
            attrs["messaging.destination.name"] = topic
        if self.group_id is not None:
            attrs["messaging.consumer.group.name"] = self.group_id
        self.duration.record(now - started, attrs)
        self._maybe_refresh(now)

    def commit_done(
        self,
        started: float,
        started_ns: int,
        topics: Sequence[str],
        count: int,
        error: BaseException | None,
    ) -> None:
        """A share consumer's ``commit_sync`` answered (``started``: its call, as
        time.monotonic() and time.time_ns()): ``count`` acknowledgements of ``topics``,
        ``error`` the first partition's failure. Operation ``commit``, type ``settle``: its
        duration, and with traces on a CLIENT span over it."""
        attrs: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "commit",
            "messaging.operation.type": "settle",
        }
        if len(topics) == 1:
            attrs["messaging.destination.name"] = topics[0]
        if self.group_id is not None:
            attrs["messaging.consumer.group.name"] = self.group_id
        cluster_id = self._cluster_id()
        if cluster_id:
            attrs["messaging.kafka.cluster.id"] = cluster_id
        if error is not None:
            attrs["error.type"] = type(error).__name__
        if self.metrics_on:
            now = time.monotonic()
            self.duration.record(now - started, attrs)
            self._maybe_refresh(now)
        if self.traces_on:
            span = self.tracer.start_span(
                f"commit {topics[0]}" if len(topics) == 1 else "commit",
                kind=self._trace.SpanKind.CLIENT,
                attributes={
                    **attrs,
                    "messaging.batch.message_count": count,
                    "messaging.client.id": self.client_id,
                },
                start_time=started_ns,
            )
            if error is not None:
                span.record_exception(error)
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(error)))
            span.end()

    # -- metrics: the client's own (metrics()) as observable instruments --------------------------

    def start(self) -> None:
        """Instruments for the metrics the client has now; later names are added as they
        appear (checked at most every INSTRUMENT_REFRESH_S, when a batch or poll is recorded)."""
        if self.metrics_on:
            self._maybe_refresh(time.monotonic())

    def _maybe_refresh(self, now: float) -> None:
        if now < self._next_refresh:
            return
        self._next_refresh = now + INSTRUMENT_REFRESH_S
        from kcore.cluster.telemetry import telemetry_name

        names = {split_metric_key(key)[0] for key in self._read_metrics()}
        names.update(self._tagged_names)
        with self._lock:
            new = names - self._instrumented
            self._instrumented |= new
        for name in sorted(new):
            otel_name = telemetry_name(self.kind, name)
            observe = self._observer(name)
            if name.endswith("-total"):
                self.meter.create_observable_counter(otel_name, [observe])
            else:
                self.meter.create_observable_gauge(otel_name, [observe])

    def _observer(self, name: str) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation

        def observe(_options: Any) -> Iterable[Any]:
            for value, tags in self._values().get(name, ()):
                yield Observation(value, {"client_id": self.client_id, **tags})

        return observe

    def _values(self) -> dict[str, list[tuple[float, dict[str, str]]]]:
        """metrics() by metric name (values with their tags), read at most once a
        SNAPSHOT_TTL_S; NaN (nothing recorded in the windows) left out."""
        now = time.monotonic()
        with self._lock:
            taken, by_name = self._snapshot
            if now - taken < SNAPSHOT_TTL_S:
                return by_name
        by_name = {}
        for key, value in self._read_metrics().items():
            if math.isfinite(value):
                name, tags = split_metric_key(key)
                by_name.setdefault(name, []).append((value, tags))
        with self._lock:
            self._snapshot = (now, by_name)
        return by_name

    # -- traces -----------------------------------------------------------------------------------

    def send_span(
        self,
        topic: str,
        count: int = 1,
        upstream: Iterable[Sequence[tuple[str, Any]] | None] = (),
    ) -> tuple[Any, list[tuple[str, bytes]]]:
        """A started PRODUCER span for a send of ``count`` records to ``topic`` (a child of
        the caller's current span), and the headers that carry its context. ``upstream``: the
        records' own headers; a context they carry already (records passed on, as a Spark job
        reading one topic and writing another does) becomes a link of the span, so the trace
        goes on through it."""
        attrs = self._send_attrs.get(topic) if count == 1 else None
        if attrs is None:
            attrs = {
                "messaging.system": SYSTEM,
                "messaging.operation.name": "send",
                "messaging.operation.type": "send",
                "messaging.destination.name": topic,
                "messaging.client.id": self.client_id,
            }
            cluster_id = self._cluster_id()
            if cluster_id:
                attrs["messaging.kafka.cluster.id"] = cluster_id
            if count != 1:
                attrs["messaging.batch.message_count"] = count
            elif cluster_id:  # kept once complete (the SDK copies what a span is given)
                self._send_attrs[topic] = attrs
        span = self.tracer.start_span(
            f"send {topic}",
            kind=self._trace.SpanKind.PRODUCER,
            attributes=attrs,
            links=self._links(upstream),
        )
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return span, [(k, v.encode()) for k, v in carrier.items()]

    def _links(self, headers: Iterable[Sequence[tuple[str, Any]] | None]) -> list[Any]:
        """A link to each distinct valid context the headers carry, up to the span link limit
        (the SDK would drop the rest: they are not extracted at all)."""
        from opentelemetry import propagate

        links: list[Any] = []
        seen = set()
        for h in headers:
            if len(links) >= self.max_links:
                break
            if not h or not any(k in self._context_keys for k, _ in h):
                continue
            ctx = self._trace.get_current_span(
                propagate.extract(h, getter=_HEADERS)
            ).get_span_context()
            if ctx.is_valid and (ctx.trace_id, ctx.span_id) not in seen:
                seen.add((ctx.trace_id, ctx.span_id))
                links.append(self._trace.Link(ctx))
        return links

    def with_context(
        self, headers: Iterable[tuple[str, Any]] | None, context: list[tuple[str, bytes]]
    ) -> list[tuple[str, Any]]:
        """``headers`` with the span's context headers in place of any earlier ones."""
        if not headers:
            return list(context)
        return [h for h in headers if h[0] not in self._context_keys] + context

    def end_send_span(
        self, span: Any, error: BaseException | None, partition: int = -1, offset: int = -1
    ) -> None:
        if error is not None:
            span.set_attribute("error.type", type(error).__name__)
            span.record_exception(error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(error)))
        elif offset >= 0:
            span.set_attributes(
                {
                    "messaging.destination.partition.id": str(partition),
                    "messaging.kafka.offset": offset,
                }
            )
        elif partition >= 0:
            span.set_attribute("messaging.destination.partition.id", str(partition))
        span.end()

    def poll_span(
        self,
        started_ns: int,
        topics: Sequence[str],
        count: int,
        headers: Iterable[Sequence[tuple[str, Any]] | None],
    ) -> None:
        """A CONSUMER span for a poll that returned ``count`` records: from the poll's call to
        now, linked to the sender span each record's headers name (distinct ones, up to the
        span link limit; the records past it are not read)."""
        links = self._links(headers)
        attrs: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "poll",
            "messaging.operation.type": "receive",
            "messaging.batch.message_count": count,
            "messaging.client.id": self.client_id,
        }
        name = "poll"
        if len(topics) == 1:
            attrs["messaging.destination.name"] = topics[0]
            name = f"poll {topics[0]}"
        if self.group_id is not None:
            attrs["messaging.consumer.group.name"] = self.group_id
        cluster_id = self._cluster_id()
        if cluster_id:
            attrs["messaging.kafka.cluster.id"] = cluster_id
        span = self.tracer.start_span(
            name,
            kind=self._trace.SpanKind.CONSUMER,
            attributes=attrs,
            links=links,
            start_time=started_ns,
        )
        span.end()
