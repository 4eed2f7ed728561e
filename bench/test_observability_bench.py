"""What observability costs kcore's producer, consumer and share consumer: each with everything
off, with librdkafka-style statistics (``statistics.interval.ms`` 1000, a callback that parses the
JSON), with OpenTelemetry metrics (the SDK's MeterProvider, a reader collecting every second),
with OpenTelemetry traces (the SDK's TracerProvider, a batch span processor feeding an exporter
that drops what it gets) and with all three; against one real broker, in one run.

The variants alternate round by round (off, stats, metrics, traces, all, off, ...), so a slow
spell of the shared machine lands on every variant alike. Each round:

* ``send``: a fresh producer sends N 100-byte values (``KCORE_BENCH_OBS_N``, default 200,000),
  unkeyed, to a 6-partition topic and flushes; ``batch.size`` is Java's default 16,384, so
  the per-batch hooks (metrics) run as often as a default producer makes batches;
* ``poll`` / ``poll_arrow``: a fresh consumer reads the N records of a topic written once by a
  producer with traces on (so every record carries a ``traceparent`` header and a consumer with
  traces on links every record: the worst case), assigned all partitions, no group;
* share ``poll``: a fresh share consumer in a new share group reads the same N records
  (implicit acknowledgement) and commits, timed from its first records.

The send table has one more row: the SDK alone making N spans like the send spans (started,
context injected, attributes set, ended) with no client, which bounds what "otel traces" can
cost any client that makes a span per record.

Producers and consumers are created and connected outside the timed part. The table gives
each variant's median wall time, its ratio to "off" in the same run (above 1.00: slower) and
the process CPU time (every thread: the caller's, the network thread, the SDK's). Timings are
never asserted; the records' count is.

Run: ``pytest bench/test_observability_bench.py -s`` (the table is printed at the end, and
kept in ``--benchmark-json``'s extra_info).
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import kcore
from kcore.admin import NewTopic

pytestmark = [pytest.mark.broker, pytest.mark.slow]

N = int(os.environ.get("KCORE_BENCH_OBS_N", "200000"))
ROUNDS = int(os.environ.get("KCORE_BENCH_OBS_ROUNDS", "5"))
VALUE_SIZE = 100
PARTITIONS = 6
VARIANTS = ("off", "stats", "otel metrics", "otel traces", "all")
SDK_FLOOR = "SDK spans alone (no client)"
TIMEOUT_S = 120.0


class DroppingSpanExporter(SpanExporter):
    """An exporter that takes spans and keeps nothing (what is measured is kcore's work and the
    SDK's, not a network exporter's)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class DroppingMetricExporter(ConsoleMetricExporter):
    """A periodic reader's exporter that keeps nothing."""

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        return MetricExportResult.SUCCESS


def _stats_cb(document: str) -> None:
    json.loads(document)


class Telemetry:
    """One SDK meter and tracer provider for the whole run."""

    def __init__(self) -> None:
        self.spans = DroppingSpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(BatchSpanProcessor(self.spans))
        reader = PeriodicExportingMetricReader(
            DroppingMetricExporter(), export_interval_millis=1000
        )
        self.meters = MeterProvider(metric_readers=[reader])

    def config(self, variant: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if variant in ("stats", "all"):
            out.update({"statistics.interval.ms": 1000, "stats_cb": _stats_cb})
        if variant in ("otel metrics", "all"):
            out.update({"otel.metrics.enable": True, "otel.meter.provider": self.meters})
        if variant in ("otel traces", "all"):
            out.update({"otel.traces.enable": True, "otel.tracer.provider": self.tracers})
        return out

    def close(self) -> None:
        self.tracers.shutdown()
        self.meters.shutdown()


@pytest.fixture(scope="module")
def setup(kafka_cluster: Any) -> Iterator[tuple[str, Telemetry, str, list[bytes]]]:
    bootstrap = kafka_cluster.bootstrap_servers
    telemetry = Telemetry()
    values = [(b"%08d" % i).ljust(VALUE_SIZE, b"x") for i in range(N)]
    source = f"obs-read-{uuid.uuid4().hex[:6]}"
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(source, PARTITIONS, 1)])
    config = {"bootstrap.servers": bootstrap, **telemetry.config("otel traces")}
    with kcore.Producer(config) as producer:
        for i, v in enumerate(values):
            producer.send(source, v, partition=i % PARTITIONS)
        producer.flush(TIMEOUT_S)
    yield bootstrap, telemetry, source, values
    telemetry.close()


def _alternate(
    rounds: int, run: Callable[[str], tuple[float, float]], variants: tuple[str, ...] = VARIANTS
) -> dict[str, list[tuple[float, float]]]:
    """Every variant once a round, in turn: (wall s, CPU s) of each."""
    out: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for _ in range(rounds):
        for variant in variants:
            out[variant].append(run(variant))
    return out


def _sdk_spans_alone(telemetry: Telemetry) -> tuple[float, float]:
    """The SDK's own part of "otel traces" on the send loop: N PRODUCER spans with a send
    span's attributes, each started, injected into a carrier, given a partition and offset and
    ended, with no client (what any client pays for a span per record)."""
    tracer = telemetry.tracers.get_tracer("floor")
    attrs = {
        "messaging.system": "kafka",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "t",
        "messaging.client.id": "c",
        "messaging.kafka.cluster.id": "x",
    }

    def run() -> None:
        for i in range(N):
            span = tracer.start_span("send t", kind=trace.SpanKind.PRODUCER, attributes=attrs)
            propagate.inject({}, context=trace.set_span_in_context(span))
            span.set_attributes(
                {"messaging.destination.partition.id": "0", "messaging.kafka.offset": i}
            )
            span.end()

    return _timed(run)


def _table(title: str, times: dict[str, list[tuple[float, float]]]) -> str:
    off = statistics.median(w for w, _ in times["off"])
    lines = [
        f"\n{title} ({N:,} records of {VALUE_SIZE} B, {ROUNDS} rounds a variant, alternating)",
        "| variant | median wall | vs off | median CPU | records/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for variant, rows in times.items():
        wall = statistics.median(w for w, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        lines.append(
            f"| {variant} | {wall:.3f} s | {wall / off:.2f}x | {cpu:.3f} s | {N / wall:,.0f} |"
        )
    return "\n".join(lines)


def _timed(call: Callable[[], None]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def _report(benchmark: Any, title: str, times: dict[str, list[tuple[float, float]]]) -> None:
    table = _table(title, times)
    print(table)
    benchmark.extra_info["table"] = table
    benchmark.extra_info["medians"] = {
        v: statistics.median(w for w, _ in rows) for v, rows in times.items()
    }


def test_send_overhead(benchmark: Any, setup: tuple[str, Telemetry, str, list[bytes]]) -> None:
    bootstrap, telemetry, _, values = setup

    def one(variant: str) -> tuple[float, float]:
        if variant == SDK_FLOOR:
            return _sdk_spans_alone(telemetry)
        topic = f"obs-send-{uuid.uuid4().hex[:6]}"
        with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
        config = {"bootstrap.servers": bootstrap, **telemetry.config(variant)}
        with kcore.Producer(config) as producer:
            producer.send(topic, b"prime").result(TIMEOUT_S)
            send = producer.send

            def run() -> None:
                for v in values:
                    send(topic, v)
                producer.flush(TIMEOUT_S)

            measured = _timed(run)
        with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
            ends = admin.list_offsets({(topic, p): "latest" for p in range(PARTITIONS)})
            assert sum(o.offset for o in ends.values()) == N + 1
            admin.delete_topics([topic])
        return measured

    times: dict[str, list[tuple[float, float]]] = {}
    benchmark.pedantic(
        lambda: times.update(_alternate(ROUNDS, one, (*VARIANTS, SDK_FLOOR))),
        rounds=1,
        iterations=1,
    )
    _report(benchmark, "send loop, batch.size 16384, linger.ms 5, acks all", times)


def _consume(
    bootstrap: str, source: str, config: dict[str, Any], arrow: bool
) -> tuple[float, float]:
    consumer = kcore.Consumer({"bootstrap.servers": bootstrap, **config})
    try:
        consumer.partitions_for(source)  # connected before the timed part
        consumer.assign([(source, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        got = [0]

        def run() -> None:
            deadline = time.monotonic() + TIMEOUT_S
            while got[0] < N and time.monotonic() < deadline:
                if arrow:
                    got[0] += consumer.poll_arrow(1.0).num_rows
                else:
                    got[0] += len(consumer.poll(1.0, 10_000))

        measured = _timed(run)
        assert got[0] == N
        return measured
    finally:
        consumer.close()


@pytest.mark.parametrize("arrow", [False, True], ids=["poll", "poll_arrow"])
def test_poll_overhead(
    benchmark: Any, setup: tuple[str, Telemetry, str, list[bytes]], arrow: bool
) -> None:
    bootstrap, telemetry, source, _ = setup

    def one(variant: str) -> tuple[float, float]:
        return _consume(bootstrap, source, telemetry.config(variant), arrow)

    times: dict[str, list[tuple[float, float]]] = {}
    benchmark.pedantic(lambda: times.update(_alternate(ROUNDS, one)), rounds=1, iterations=1)
    what = "poll_arrow" if arrow else "poll (10,000 records a call)"
    _report(benchmark, f"{what}, every record with a traceparent header", times)


def _share_consume(bootstrap: str, source: str, config: dict[str, Any]) -> tuple[float, float]:
    """A new share group reads the N records (implicit acknowledgement) and commits; timed from
    the first poll that returned records (joining the group left out: it is the broker's
    assignment, not the client's work) to the commit's answer."""
    group = f"obs-share-{uuid.uuid4().hex[:6]}"
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.alter_configs({("group", group): {"share.auto.offset.reset": "earliest"}})
    consumer = kcore.ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, **config})
    try:
        consumer.subscribe([source])
        deadline = time.monotonic() + TIMEOUT_S
        got = 0
        while not got and time.monotonic() < deadline:
            got = len(consumer.poll(1.0))

        def run() -> None:
            nonlocal got
            while got < N and time.monotonic() < deadline:
                got += len(consumer.poll(1.0))
            consumer.commit_sync(TIMEOUT_S)

        measured = _timed(run)
        assert got == N
        return measured
    finally:
        consumer.close()


def test_share_poll_overhead(
    benchmark: Any, setup: tuple[str, Telemetry, str, list[bytes]]
) -> None:
    bootstrap, telemetry, source, _ = setup

    def one(variant: str) -> tuple[float, float]:
        return _share_consume(bootstrap, source, telemetry.config(variant))

    times: dict[str, list[tuple[float, float]]] = {}
    benchmark.pedantic(lambda: times.update(_alternate(ROUNDS, one)), rounds=1, iterations=1)
    _report(
        benchmark,
        "share consumer poll (500 records a call, implicit), from its first records",
        times,
    )
