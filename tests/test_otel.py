"""OpenTelemetry (otel.metrics.enable, otel.traces.enable) against a real broker, read with the
OpenTelemetry SDK's in-memory metric reader and span exporter: the messaging conventions'
metrics counted against what was sent and consumed, the client's own metrics under their
KIP-714 names, spans per send and per poll with trace context carried in record headers from
producer to consumer, share consumers' polls and commits, and nothing of OpenTelemetry loaded
while both keys are off."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from share_helpers import new_share_topic, one_partition_topic, produce

import kcore
import kcore.errors
from kcore.admin import NewTopic
from kcore.errors import ConfigError, MessageTooLargeError
from kcore.metrics import split_metric_key

N = 300
PARTITIONS = 3


def _topic(bootstrap: str, partitions: int = PARTITIONS) -> str:
    name = f"otel-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])
    return name


def _cluster_id(bootstrap: str) -> str:
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        return str(admin.describe_cluster().cluster_id)


class Telemetry:
    """An SDK meter provider with an in-memory reader and a tracer provider with an in-memory
    exporter, given to clients through their config (the global providers stay untouched)."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.spans = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.spans))

    def config(self, bootstrap: str, **extra: Any) -> dict[str, Any]:
        return {
            "bootstrap.servers": bootstrap,
            "otel.metrics.enable": True,
            "otel.traces.enable": True,
            "otel.meter.provider": self.meters,
            "otel.tracer.provider": self.tracers,
            **extra,
        }

    def points(self, name: str) -> list[Any]:
        """Every data point of metric ``name`` in one collection."""
        data = self.reader.get_metrics_data()
        out = []
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == name:
                        out.extend(m.data.data_points)
        return out

    def finished(self, kind: SpanKind | None = None) -> list[Any]:
        return [s for s in self.spans.get_finished_spans() if kind is None or s.kind == kind]


def _consume(config: dict[str, Any], topic: str, n: int, arrow: bool = False) -> list[Any]:
    got: list[Any] = []
    config = {"group.id": f"g-{uuid.uuid4().hex[:6]}", **config, "auto.offset.reset": "earliest"}
    with kcore.Consumer(config) as consumer:
        consumer.subscribe([topic])
        while (sum(rb.num_rows for rb in got) if arrow else len(got)) < n:
            if arrow:
                rb = consumer.poll_arrow(1.0)
                if rb.num_rows:
                    got.append(rb)
            else:
                got.extend(consumer.poll(1.0))
        if not arrow:
            assert len(got) == n
    return got


def test_producer_metrics_count_what_was_delivered(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs)
    otel = Telemetry()
    with kcore.Producer(otel.config(bs, **{"otel.traces.enable": False})) as producer:
        futures = [producer.send(topic, b"v%d" % i, b"k%d" % i) for i in range(N)]
        producer.flush(30)
        delivered = Counter(f.result(10).partition for f in futures)
        # record-send-total counts every attempt (as Java's): N, or more after retries.
        attempts = producer.metrics()["record-send-total"]
    cluster_id = _cluster_id(bs)

    sent = otel.points("messaging.client.sent.messages")
    by_partition = {p.attributes["messaging.destination.partition.id"]: p.value for p in sent}
    assert by_partition == {str(p): n for p, n in delivered.items()}
    for point in sent:
        assert point.attributes["messaging.system"] == "kafka"
        assert point.attributes["messaging.operation.name"] == "send"
        assert point.attributes["messaging.destination.name"] == topic
        assert point.attributes["messaging.kafka.cluster.id"] == cluster_id
        assert "error.type" not in point.attributes

    durations = otel.points("messaging.client.operation.duration")
    assert durations and all(p.attributes["messaging.operation.type"] == "send" for p in durations)
    # One duration per batch: at least one per partition written, at most one per record.
    assert len(delivered) <= sum(p.count for p in durations) <= N
    assert all(p.min >= 0 for p in durations)

    # The producer's own metrics, named as KIP-714 pushes them.
    (total,) = otel.points("org.apache.kafka.producer.record.send.total")
    assert total.value == attempts >= N
    assert total.attributes["client_id"]
    assert otel.points("org.apache.kafka.producer.request.latency.avg")
    assert not otel.spans.get_finished_spans()  # traces off


def test_a_failed_batch_is_counted_with_its_error_type(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    # Records larger than the topic takes: the broker refuses their batches (MESSAGE_TOO_LARGE,
    # after the producer split them down to one record each).
    topic = f"otel-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient({"bootstrap.servers": bs}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, {"max.message.bytes": "200"})])
    otel = Telemetry()
    with kcore.Producer(otel.config(bs)) as producer:
        futures = [producer.send(topic, b"x" * 500) for _ in range(3)]
        errors = []
        for f in futures:
            with pytest.raises(kcore.errors.KcoreError) as failed:
                f.result(30)
            errors.append(type(failed.value).__name__)
    sent = otel.points("messaging.client.sent.messages")
    assert sum(p.value for p in sent) == 3
    assert {p.attributes["error.type"] for p in sent} == set(errors)
    spans = otel.finished(SpanKind.PRODUCER)
    assert len(spans) == 3
    assert all(s.status.status_code == StatusCode.ERROR for s in spans)
    assert {s.attributes["error.type"] for s in spans} == set(errors)


def _assert_consumed_per_partition(otel: Telemetry, written: Counter[int], group: str) -> None:
    """The consumed-records counter: one point per partition, as many as were written, each
    with the group's name and the receive operation."""
    consumed = otel.points("messaging.client.consumed.messages")
    assert {p.attributes["messaging.destination.partition.id"]: p.value for p in consumed} == {
        str(p): n for p, n in written.items()
    }
    for point in consumed:
        assert point.attributes["messaging.consumer.group.name"] == group
        assert point.attributes["messaging.operation.type"] == "receive"
        assert point.attributes["messaging.operation.name"] == "poll"


def test_consumer_metrics_count_what_polls_handed_out(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs)
    with kcore.Producer({"bootstrap.servers": bs}) as producer:
        futures = [producer.send(topic, b"v%d" % i, b"k%d" % i) for i in range(N)]
        producer.flush(30)
        written = Counter(f.result(10).partition for f in futures)
    otel = Telemetry()
    group = f"g-{uuid.uuid4().hex[:6]}"
    config = otel.config(bs, **{"group.id": group, "otel.traces.enable": False})
    got = Counter(r.partition for r in _consume(config, topic, N))
    assert got == written

    _assert_consumed_per_partition(otel, written, group)
    consumed = otel.points("messaging.client.consumed.messages")
    assert all(p.attributes["messaging.destination.name"] == topic for p in consumed)
    polls = [
        p
        for p in otel.points("messaging.client.operation.duration")
        if p.attributes["messaging.operation.name"] == "poll"
    ]
    assert polls and all(p.attributes["messaging.operation.type"] == "receive" for p in polls)
    (total,) = otel.points("org.apache.kafka.consumer.fetch.manager.records.consumed.total")
    assert total.value == N


def test_per_partition_lag_is_a_gauge_with_topic_and_partition(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 2)
    with kcore.Producer({"bootstrap.servers": bs}) as producer:
        for i in range(100):
            producer.send(topic, b"v", partition=i % 2)
        producer.flush(30)
    otel = Telemetry()
    config = otel.config(
        bs, **{"otel.traces.enable": False, "max.poll.records": 10, "auto.offset.reset": "earliest"}
    )
    with kcore.Consumer(config) as consumer:
        consumer.assign([(topic, 0), (topic, 1)])
        taken: list[Any] = []
        while len(taken) < 10:
            taken.extend(consumer.poll(1.0))
        lags = {
            split_metric_key(k)[1]["partition"]: v
            for k, v in consumer.metrics().items()
            if k.startswith("records-lag{")
        }
        points = otel.points("org.apache.kafka.consumer.fetch.manager.records.lag")
    assert points, "no per-partition lag"
    seen = {p.attributes["partition"]: p.value for p in points}
    assert {p.attributes["topic"] for p in points} == {topic}
    assert seen == lags
    assert sum(seen.values()) == 100 - len(taken)


def test_a_trace_crosses_producer_kafka_and_consumer(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs)
    otel = Telemetry()
    app = otel.tracers.get_tracer("app")
    delivered: list[Any] = []
    with kcore.Producer(otel.config(bs, **{"otel.metrics.enable": False})) as producer:
        with app.start_as_current_span("request") as request:
            futures = [
                producer.send(
                    topic,
                    b"v%d" % i,
                    headers=[("traceparent", b"00-stale-context"), ("app", b"1")],
                    on_delivery=lambda err, md: delivered.append((err, md)),
                )
                for i in range(20)
            ]
        producer.flush(30)
        metadata = [f.result(10) for f in futures]
    assert len(delivered) == 20 and all(err is None for err, _ in delivered)

    sends = otel.finished(SpanKind.PRODUCER)
    assert len(sends) == 20
    by_span = {s.context.span_id: s for s in sends}
    for span in sends:
        assert span.name == f"send {topic}"
        assert span.parent.span_id == request.get_span_context().span_id
        assert span.attributes["messaging.system"] == "kafka"
        assert span.attributes["messaging.destination.name"] == topic
        assert span.status.status_code != StatusCode.ERROR
    placed = [
        (
            int(s.attributes["messaging.destination.partition.id"]),
            s.attributes["messaging.kafka.offset"],
        )
        for s in sends
    ]
    assert sorted(placed) == sorted((m.partition, m.offset) for m in metadata)

    records = _consume(otel.config(bs, **{"otel.metrics.enable": False}), topic, 20)
    for record in records:
        keys = [k for k, _ in record.headers]
        assert keys.count("traceparent") == 1 and "app" in keys  # the stale one replaced
        context = trace.get_current_span(kcore.trace_context(record)).get_span_context()
        span = by_span[context.span_id]
        assert context.trace_id == request.get_span_context().trace_id
        assert int(span.attributes["messaging.destination.partition.id"]) == record.partition
        assert span.attributes["messaging.kafka.offset"] == record.offset
    polls = otel.finished(SpanKind.CONSUMER)
    assert polls
    linked = {link.context.span_id for p in polls for link in p.links}
    assert linked == set(by_span)
    for poll in polls:
        assert poll.name == f"poll {topic}"
        assert poll.attributes["messaging.operation.type"] == "receive"
        assert poll.attributes["messaging.batch.message_count"] >= len(poll.links) > 0
        assert poll.start_time <= poll.end_time


def test_a_poll_span_links_up_to_the_link_limit(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    otel = Telemetry()
    with kcore.Producer(otel.config(bs, **{"otel.metrics.enable": False})) as producer:
        for i in range(N):
            producer.send(topic, b"v%d" % i)
        producer.flush(30)
    config = otel.config(bs, **{"otel.metrics.enable": False, "max.poll.records": 1000})
    _consume(config, topic, N)
    polls = otel.finished(SpanKind.CONSUMER)
    assert sum(p.attributes["messaging.batch.message_count"] for p in polls) == N
    # Every record has a context of its own: each poll links min(its records, 128) of them.
    for poll in polls:
        assert len(poll.links) == min(128, poll.attributes["messaging.batch.message_count"])
    assert any(len(p.links) == 128 for p in polls)


def test_send_batch_is_one_span_and_arrow_polls_link_to_it(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs)
    otel = Telemetry()
    config = otel.config(bs, **{"otel.metrics.enable": False})
    # Half the records come from upstream with a context of their own (as records a Spark job
    # passes on do): the batch span links to it, and the records carry the batch span's.
    with otel.tracers.get_tracer("app").start_as_current_span("upstream") as upstream:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    upstream_headers = [{"key": k, "value": v.encode()} for k, v in carrier.items()]
    headers = pa.array(
        [
            [{"key": "h", "value": b"%d" % i}] + (upstream_headers if i % 2 else [])
            for i in range(N)
        ],
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
    )
    with kcore.Producer(config) as producer:
        result = producer.send_batch(topic, [b"v%d" % i for i in range(N)], headers=headers)
        producer.flush(30)
        assert sum(n for _, _, n in result.result(10)) == N
    (span,) = otel.finished(SpanKind.PRODUCER)
    assert span.attributes["messaging.batch.message_count"] == N
    assert [link.context.span_id for link in span.links] == [upstream.get_span_context().span_id]
    assert span.status.status_code != StatusCode.ERROR

    batches = _consume(config, topic, N, arrow=True)
    rows = [row for rb in batches for row in rb.column("headers").to_pylist()]
    assert len(rows) == N
    for row in rows:
        pairs = [(h["key"], h["value"]) for h in row]
        assert [k for k, _ in pairs].count("h") == 1
        assert [k for k, _ in pairs].count("traceparent") == 1
        context = trace.get_current_span(kcore.trace_context(pairs)).get_span_context()
        assert context.span_id == span.context.span_id
    polls = otel.finished(SpanKind.CONSUMER)
    assert polls and {link.context.span_id for p in polls for link in p.links} == {
        span.context.span_id
    }


def test_a_refused_send_ends_its_span_with_the_error(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    otel = Telemetry()
    with kcore.Producer(otel.config(bs)) as producer:
        producer.send(topic, b"ok").result(30)
        with pytest.raises(MessageTooLargeError):
            producer.send(topic, b"x" * 2_000_000).result(10)
    spans = otel.finished(SpanKind.PRODUCER)
    assert len(spans) == 2
    failed = [s for s in spans if s.status.status_code == StatusCode.ERROR]
    assert len(failed) == 1
    assert failed[0].attributes["error.type"] == "MessageTooLargeError"


def test_async_clients_trace_and_count_too(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs)
    otel = Telemetry()

    async def run() -> list[Any]:
        async with kcore.AsyncProducer(otel.config(bs)) as producer:
            futures = [await producer.send(topic, b"v%d" % i) for i in range(50)]
            await asyncio.gather(*futures)
        got: list[Any] = []
        config = otel.config(bs, **{"auto.offset.reset": "earliest"})
        async with kcore.AsyncConsumer(config) as consumer:
            consumer.assign([(topic, p) for p in range(PARTITIONS)])
            while len(got) < 50:
                got.extend(await consumer.poll(1.0))
        return got

    records = asyncio.run(run())
    assert len(records) == 50
    sends = {s.context.span_id for s in otel.finished(SpanKind.PRODUCER)}
    assert len(sends) == 50
    assert {
        trace.get_current_span(kcore.trace_context(r)).get_span_context().span_id for r in records
    } == sends
    assert sum(p.value for p in otel.points("messaging.client.sent.messages")) == 50
    assert sum(p.value for p in otel.points("messaging.client.consumed.messages")) == 50


def _share_poll(consumer: Any, want: int, explicit: bool = False) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 60
    while len(got) < want and time.monotonic() < deadline:
        records = consumer.poll(0.5)
        if explicit:
            for r in records:
                consumer.acknowledge(r, kcore.AcknowledgeType.ACCEPT)
        got.extend(records)
    assert len(got) >= want, f"{len(got)} of {want} records"
    return got


def test_a_share_consumer_counts_links_and_settles(kafka_cluster):
    """A share consumer's polls are counted per partition and traced (CONSUMER spans linked to
    the senders' spans) as a consumer's are; its commit_sync is a settle operation: a duration
    and a CLIENT span counting the acknowledgements it sent; the client's own metrics are there
    under the share consumer's KIP-714 names."""
    bs = kafka_cluster.bootstrap_servers
    topic, group = new_share_topic(kafka_cluster)
    otel = Telemetry()
    with kcore.Producer(otel.config(bs, **{"otel.metrics.enable": False})) as producer:
        futures = [producer.send(topic, b"v%d" % i, partition=i % 2) for i in range(N)]
        producer.flush(30)
        written = Counter(f.result(10).partition for f in futures)
    sends = {s.context.span_id for s in otel.finished(SpanKind.PRODUCER)}
    assert len(sends) == N

    # Polls of at most 100 records: each poll span links every record's sender (limit 128).
    extra = {"group.id": group, "share.acknowledgement.mode": "explicit", "max.poll.records": 100}
    with kcore.ShareConsumer(otel.config(bs, **extra)) as consumer:
        consumer.subscribe([topic])
        got = _share_poll(consumer, N, explicit=True)
        committed = consumer.commit_sync(30)
        assert committed and all(err is None for err in committed.values())
    assert Counter(r.partition for r in got) == written  # each delivered once

    _assert_consumed_per_partition(otel, written, group)
    durations = otel.points("messaging.client.operation.duration")
    by_type = Counter(p.attributes["messaging.operation.type"] for p in durations)
    assert set(by_type) == {"receive", "settle"}
    (settle,) = [p for p in durations if p.attributes["messaging.operation.type"] == "settle"]
    assert settle.count == 1 and "error.type" not in settle.attributes
    assert settle.attributes["messaging.operation.name"] == "commit"
    assert settle.attributes["messaging.destination.name"] == topic
    (total,) = otel.points("org.apache.kafka.consumer.share.fetch.manager.records.consumed.total")
    assert total.value == len(got)
    (acks,) = otel.points(
        "org.apache.kafka.consumer.share.fetch.manager.acknowledgements.send.total"
    )
    assert acks.value == len(got)

    polls = otel.finished(SpanKind.CONSUMER)
    assert sum(p.attributes["messaging.batch.message_count"] for p in polls) == len(got)
    assert {link.context.span_id for p in polls for link in p.links} == sends
    assert all(p.name == f"poll {topic}" for p in polls)
    (commit,) = otel.finished(SpanKind.CLIENT)
    assert commit.name == f"commit {topic}"
    assert commit.attributes["messaging.operation.type"] == "settle"
    assert commit.attributes["messaging.consumer.group.name"] == group
    # What the fetches did not carry: at least the last poll's acknowledgements.
    assert 1 <= commit.attributes["messaging.batch.message_count"] <= len(got)
    assert commit.status.status_code != StatusCode.ERROR


def test_a_share_commit_that_fails_carries_its_error(kafka_cluster):
    """A member acknowledges records after their acquisition locks expired (they are no
    longer its to acknowledge): its commit_sync's settle duration and span carry the error."""
    bs = kafka_cluster.bootstrap_servers
    _, group = new_share_topic(kafka_cluster)
    topic = one_partition_topic(kafka_cluster, group, lock_ms=1000)
    produce(bs, topic, 10, partitions=1)
    otel = Telemetry()
    config = otel.config(bs, **{"group.id": group, "share.acknowledgement.mode": "explicit"})
    with kcore.ShareConsumer(config) as late:
        late.subscribe([topic])
        held = _share_poll(late, 1)
        time.sleep(2.5)  # not polling: nothing is fetched again, the locks run out
        for r in held:
            late.acknowledge(r, kcore.AcknowledgeType.ACCEPT)
        results = late.commit_sync(30)
    errors = {type(err).__name__ for err in results.values() if err is not None}
    assert errors, results
    (settle,) = [
        p
        for p in otel.points("messaging.client.operation.duration")
        if p.attributes["messaging.operation.type"] == "settle"
    ]
    assert settle.attributes["error.type"] in errors
    (commit,) = otel.finished(SpanKind.CLIENT)
    assert commit.status.status_code == StatusCode.ERROR
    assert commit.attributes["error.type"] == settle.attributes["error.type"]


def test_async_share_consumer_counts_too(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic, group = new_share_topic(kafka_cluster)
    produce(bs, topic, 50)
    otel = Telemetry()

    async def run() -> int:
        got = 0
        async with kcore.AsyncShareConsumer(otel.config(bs, **{"group.id": group})) as c:
            c.subscribe([topic])
            deadline = time.monotonic() + 60
            while got < 50 and time.monotonic() < deadline:
                batch = await c.poll_arrow(0.5)
                got += batch.num_rows
            await c.commit_sync(30)
        return got

    got = asyncio.run(run())
    assert got >= 50
    assert sum(p.value for p in otel.points("messaging.client.consumed.messages")) == got
    assert (
        sum(
            p.attributes["messaging.batch.message_count"]
            for p in otel.finished()
            if p.kind == SpanKind.CONSUMER
        )
        == got
    )
    assert [s.name for s in otel.finished(SpanKind.CLIENT)] == [f"commit {topic}"]


def test_nothing_of_opentelemetry_is_loaded_while_off(kafka_cluster):
    """The zero-cost rule: a producer and a consumer with both keys off import nothing of
    OpenTelemetry, and the producer's send is the compiled path itself."""
    topic = _topic(kafka_cluster.bootstrap_servers, 1)
    script = textwrap.dedent(
        f"""
        import sys
        import kcore
        from kcore.producer._sendpath import SendPath
        config = {{"bootstrap.servers": {kafka_cluster.bootstrap_servers!r}}}
        with kcore.Producer(config) as p:
            assert p._core.otel is None
            assert p.send == p._core.send_path.send
            p.send({topic!r}, b"v").result(30)
        with kcore.Consumer({{**config, "auto.offset.reset": "earliest"}}) as c:
            c.assign([({topic!r}, 0)])
            assert c._core.otel is None
            while not c.poll(1.0):
                pass
        with kcore.ShareConsumer({{**config, "group.id": "g"}}) as s:
            s.subscribe([{topic!r}])
            assert s._core.otel is None
            s.poll(0.1)
            s.commit_sync(30)
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        assert not loaded, loaded
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_config_is_checked():
    with pytest.raises(ConfigError, match="otel.meter.provider.*get_meter"):
        kcore.Producer({"bootstrap.servers": "127.0.0.1:1", "otel.meter.provider": object()})
    with pytest.raises(ConfigError, match="otel.traces.enable"):
        kcore.Consumer({"bootstrap.servers": "127.0.0.1:1", "otel.traces.enable": "yes"})
    # Without the API installed, turning it on says what to install.
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None
        import kcore
        from kcore.errors import ConfigError
        try:
            kcore.Producer({"bootstrap.servers": "127.0.0.1:1", "otel.metrics.enable": True})
        except ConfigError as e:
            print(e)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "kcore[otel]" in out.stdout, out.stderr
