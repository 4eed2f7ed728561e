"""KIP-714 client telemetry without a broker: the OTLP encoder (decoded with the real
opentelemetry-proto package), the metric names, and the sans-IO state machine answer by answer.
tests/test_telemetry_broker.py runs it against a broker with a telemetry receiver."""

import uuid
from typing import Any

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kcore.cluster.otlp import CUMULATIVE, DELTA, MetricPoint, encode_metrics_data
from kcore.cluster.telemetry import (
    ClientTelemetry,
    TelemetryPhase,
    resource_attributes,
    telemetry_attributes,
    telemetry_name,
)
from kcore.codec import COMPRESSION_CODECS, decompress
from kcore.config import ClientConfig
from kcore.errors import ErrorCode, KcoreError
from kcore.metrics import metric_key, split_metric_key
from kcore.network.backoff import ExponentialBackoff
from kcore.protocol import ApiKey
from kcore.protocol.messages import (
    GetTelemetrySubscriptionsRequest,
    GetTelemetrySubscriptionsResponse,
    PushTelemetryRequest,
    PushTelemetryResponse,
)
from kcore.protocol.types import ZERO_UUID

INSTANCE = uuid.UUID("6f1c1f0e-8d1b-4f57-9a53-3c7e1d0f2a11")
START_NS = 1_700_000_000_000_000_000


def decode(payload: bytes) -> metrics_pb2.MetricsData:
    data = metrics_pb2.MetricsData()
    data.ParseFromString(payload)
    return data


def by_name(data: metrics_pb2.MetricsData) -> dict[str, metrics_pb2.Metric]:
    (rm,) = data.resource_metrics
    (sm,) = rm.scope_metrics
    return {m.name: m for m in sm.metrics}


# -- the encoder --------------------------------------------------------------------------------


def test_encoder_output_decodes_with_opentelemetry_proto():
    points = [
        MetricPoint("org.apache.kafka.producer.record.send.rate", 12.5, START_NS + 7),
        MetricPoint("org.apache.kafka.producer.zero", 0.0, START_NS + 7),
        MetricPoint(
            "org.apache.kafka.producer.record.send.total", 40.0, START_NS + 7, START_NS, DELTA
        ),
        MetricPoint(
            "org.apache.kafka.producer.request.total", 3.0, START_NS + 9, START_NS, CUMULATIVE
        ),
        MetricPoint("ünïcode.name", -1.25e300, 2**64 - 1),
    ]
    data = decode(encode_metrics_data({"transactional_id": "tx-1", "empty": ""}, points))
    (rm,) = data.resource_metrics
    attrs = {kv.key: kv.value.string_value for kv in rm.resource.attributes}
    assert attrs == {"transactional_id": "tx-1", "empty": ""}
    assert [kv.value.WhichOneof("value") for kv in rm.resource.attributes] == ["string_value"] * 2
    metrics = by_name(data)
    assert list(metrics) == [p.name for p in points]
    rate = metrics["org.apache.kafka.producer.record.send.rate"]
    assert rate.WhichOneof("data") == "gauge"
    (dp,) = rate.gauge.data_points
    assert dp.as_double == 12.5 and dp.time_unix_nano == START_NS + 7
    assert dp.start_time_unix_nano == 0 and dp.WhichOneof("value") == "as_double"
    (zero,) = metrics["org.apache.kafka.producer.zero"].gauge.data_points
    assert zero.WhichOneof("value") == "as_double" and zero.as_double == 0.0
    delta = metrics["org.apache.kafka.producer.record.send.total"]
    assert delta.WhichOneof("data") == "sum"
    assert delta.sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    assert delta.sum.is_monotonic
    (dp,) = delta.sum.data_points
    assert (dp.as_double, dp.start_time_unix_nano, dp.time_unix_nano) == (
        40.0,
        START_NS,
        START_NS + 7,
    )
    cumulative = metrics["org.apache.kafka.producer.request.total"].sum
    assert cumulative.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    (dp,) = metrics["ünïcode.name"].gauge.data_points
    assert dp.as_double == -1.25e300 and dp.time_unix_nano == 2**64 - 1


def reference_with_group_id() -> tuple[Any, Any]:
    """The protobuf library's MetricsData with resource attribute group_id=g, and its one
    ScopeMetrics for the test to fill."""
    ref = metrics_pb2.MetricsData()
    rm = ref.resource_metrics.add()
    kv = rm.resource.attributes.add()
    kv.key, kv.value.string_value = "group_id", "g"
    return ref, rm.scope_metrics.add()


def test_encoder_matches_the_reference_encoding():
    """Byte for byte what the protobuf library writes for the same message."""
    point = MetricPoint("a.b", 2.0, START_NS, START_NS - 5, DELTA)
    ours = encode_metrics_data({"group_id": "g"}, [point, MetricPoint("c", 1.0, START_NS)])
    ref, sm = reference_with_group_id()
    m = sm.metrics.add()
    m.name = "a.b"
    m.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    m.sum.is_monotonic = True
    dp = m.sum.data_points.add()
    dp.start_time_unix_nano, dp.time_unix_nano, dp.as_double = START_NS - 5, START_NS, 2.0
    g = sm.metrics.add()
    g.name = "c"
    dp = g.gauge.data_points.add()
    dp.time_unix_nano, dp.as_double = START_NS, 1.0
    assert ours == ref.SerializeToString()


def attributes_of(dp) -> dict[str, str]:
    assert all(kv.value.WhichOneof("value") == "string_value" for kv in dp.attributes)
    return {kv.key: kv.value.string_value for kv in dp.attributes}


def test_points_of_one_name_are_one_metric_with_attributes():
    lag = "org.apache.kafka.consumer.fetch.manager.records.lag"
    points = [
        MetricPoint(lag, 5.0, START_NS, attributes={"topic": "orders", "partition": "0"}),
        MetricPoint("org.apache.kafka.consumer.other", 1.0, START_NS),
        MetricPoint(lag, 0.0, START_NS, attributes={"topic": "orders", "partition": "1"}),
        MetricPoint(lag, 7.0, START_NS, attributes={"topic": "audit", "partition": "0"}),
    ]
    metrics = by_name(decode(encode_metrics_data({}, points)))
    assert list(metrics) == [lag, "org.apache.kafka.consumer.other"]  # first appearance order
    got = [(attributes_of(dp), dp.as_double) for dp in metrics[lag].gauge.data_points]
    assert got == [
        ({"topic": "orders", "partition": "0"}, 5.0),
        ({"topic": "orders", "partition": "1"}, 0.0),
        ({"topic": "audit", "partition": "0"}, 7.0),
    ]
    (dp,) = metrics["org.apache.kafka.consumer.other"].gauge.data_points
    assert not dp.attributes


def test_attributes_match_the_reference_encoding():
    """Byte for byte what the protobuf library writes: a sum of two points with attributes
    (one of them an empty string) and a gauge."""
    tags = [{"topic": "t", "partition": "0"}, {"topic": "", "partition": "1"}]
    points = [
        MetricPoint("s", float(i), START_NS, START_NS - 1, DELTA, t) for i, t in enumerate(tags)
    ]
    ours = encode_metrics_data(
        {"group_id": "g"}, [*points, MetricPoint("g", 3.0, START_NS, attributes=tags[0])]
    )
    ref, sm = reference_with_group_id()
    m = sm.metrics.add()
    m.name = "s"
    for i, t in enumerate(tags):
        dp = m.sum.data_points.add()
        dp.start_time_unix_nano, dp.time_unix_nano, dp.as_double = START_NS - 1, START_NS, i
        for key, value in t.items():
            kv = dp.attributes.add()
            kv.key, kv.value.string_value = key, value
    m.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    m.sum.is_monotonic = True
    g = sm.metrics.add()
    g.name = "g"
    dp = g.gauge.data_points.add()
    dp.time_unix_nano, dp.as_double = START_NS, 3.0
    for key, value in tags[0].items():
        kv = dp.attributes.add()
        kv.key, kv.value.string_value = key, value
    assert ours == ref.SerializeToString()


def test_empty_payload_decodes():
    data = decode(encode_metrics_data({}, []))
    (rm,) = data.resource_metrics
    assert not rm.resource.attributes and not rm.scope_metrics[0].metrics


# -- names and resource attributes ----------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, name, expected",
    [
        ("producer", "record-send-rate", "org.apache.kafka.producer.record.send.rate"),
        ("producer", "request-latency-avg", "org.apache.kafka.producer.request.latency.avg"),
        ("producer", "connection-count", "org.apache.kafka.producer.connection.count"),
        (
            "consumer",
            "records-lag-max",
            "org.apache.kafka.consumer.fetch.manager.records.lag.max",
        ),
        ("consumer", "fetch-total", "org.apache.kafka.consumer.fetch.manager.fetch.total"),
        (
            "consumer",
            "commit-latency-avg",
            "org.apache.kafka.consumer.coordinator.commit.latency.avg",
        ),
        (
            "consumer",
            "assigned-partitions",
            "org.apache.kafka.consumer.coordinator.assigned.partitions",
        ),
        ("consumer", "request-rate", "org.apache.kafka.consumer.request.rate"),
        ("consumer", "last-poll-seconds-ago", "org.apache.kafka.consumer.last.poll.seconds.ago"),
        ("admin", "request-total", "org.apache.kafka.admin.client.request.total"),
    ],
)
def test_telemetry_names_follow_javas_naming(kind, name, expected):
    assert telemetry_name(kind, name) == expected


@pytest.mark.parametrize(
    "key, name, tags",
    [
        ("records-lag-max", "records-lag-max", {}),
        (
            "records-lag{topic=orders.eu_1-x,partition=12}",
            "records-lag",
            {"topic": "orders.eu_1-x", "partition": "12"},
        ),
        ("m{a=}", "m", {"a": ""}),
    ],
)
def test_metric_keys_split_into_name_and_tags(key, name, tags):
    assert split_metric_key(key) == (name, tags)
    assert metric_key(name, tags) == key


@pytest.mark.parametrize(
    "key", ["{a=1}", "m{a=1", "m}", "m{a}", "m{=1}", "m{a=1,a=2}", "m{a=b=c}", "m{a={b}}"]
)
def test_malformed_metric_keys_are_a_kcore_error(key):
    with pytest.raises(KcoreError, match="metric key"):
        split_metric_key(key)


def test_tags_become_attributes_as_javas_do():
    assert telemetry_attributes({"topic": "Orders-1", "client-ID": "c"}) == {
        "topic": "Orders-1",
        "client_id": "c",
    }


def test_resource_attributes():
    consumer = ClientConfig(
        {
            "bootstrap.servers": "x:1",
            "group.id": "g1",
            "group.instance.id": "i1",
            "client.rack": "r1",
        },
        role="consumer",
    )
    assert resource_attributes("consumer", consumer) == {
        "group_id": "g1",
        "group_instance_id": "i1",
        "client_rack": "r1",
    }
    producer = ClientConfig({"bootstrap.servers": "x:1", "transactional.id": "t1"}, role="producer")
    assert resource_attributes("producer", producer) == {"transactional_id": "t1"}
    assert resource_attributes("producer", ClientConfig({"bootstrap.servers": "x:1"})) == {}


@pytest.mark.parametrize("role", ["producer", "consumer", "admin"])
def test_enable_metrics_push_config(role):
    default = ClientConfig({"bootstrap.servers": "x:1"}, role=role)["enable.metrics.push"]
    assert default is (role != "admin")  # as Java: the admin client does not push by default
    off = ClientConfig({"bootstrap.servers": "x:1", "enable.metrics.push": "false"}, role=role)
    assert off["enable.metrics.push"] is False


# -- the state machine ----------------------------------------------------------------------------

METRICS = {
    "record-send-total": 10.0,
    "record-send-rate": 2.5,
    "request-latency-avg": float("nan"),  # nothing recorded: not sent
    "request-total": 4.0,
}


def new_telemetry(kind: str = "producer", jitter: float = 1.0) -> ClientTelemetry:
    return ClientTelemetry(
        kind,
        {"transactional_id": "t"},
        ExponentialBackoff(100, 1000, jitter=0),
        now=0.0,
        start_ns=START_NS,
        rng=lambda lo, hi: jitter,
    )


def subscription(
    *,
    sub_id: int = 7,
    metrics: list[str] | None = None,
    interval_ms: int = 1000,
    compression: list[int] | None = None,
    delta: bool = True,
    max_bytes: int = 1 << 20,
    error: int = ErrorCode.NONE,
    instance: uuid.UUID = INSTANCE,
) -> GetTelemetrySubscriptionsResponse:
    return GetTelemetrySubscriptionsResponse(
        error_code=error,
        client_instance_id=instance,
        subscription_id=sub_id,
        accepted_compression_types=[4, 3, 1, 2] if compression is None else compression,
        push_interval_ms=interval_ms,
        telemetry_max_bytes=max_bytes,
        delta_temporality=delta,
        requested_metrics=["org.apache.kafka.producer."] if metrics is None else metrics,
    )


def subscribed(t: ClientTelemetry, now: float = 0.0, **kw) -> None:
    req = t.next_request(now, START_NS, lambda: METRICS)
    assert isinstance(req, GetTelemetrySubscriptionsRequest)
    t.on_response(subscription(**kw), now)


def push(t: ClientTelemetry, now: float, wall_ns: int, metrics=None) -> PushTelemetryRequest:
    req = t.next_request(now, wall_ns, lambda: METRICS if metrics is None else metrics)
    assert isinstance(req, PushTelemetryRequest), req
    return req


def payload_of(req: PushTelemetryRequest) -> dict[str, metrics_pb2.Metric]:
    codecs = {v: k for k, v in COMPRESSION_CODECS.items()}
    data = req.metrics
    if req.compression_type:
        data = decompress(codecs[req.compression_type], data)
    return by_name(decode(data))


def test_requests_and_responses_are_the_generated_classes():
    assert GetTelemetrySubscriptionsRequest.API_KEY == ApiKey.GET_TELEMETRY_SUBSCRIPTIONS
    assert PushTelemetryRequest.API_KEY == ApiKey.PUSH_TELEMETRY


def test_first_request_asks_with_the_zero_instance_id_then_the_assigned_one():
    t = new_telemetry()
    assert t.wait_s(0.0) == 0.0
    first = t.next_request(0.0, START_NS, lambda: METRICS)
    assert isinstance(first, GetTelemetrySubscriptionsRequest)
    assert first.client_instance_id == ZERO_UUID
    assert t.wait_s(0.0) is None  # in flight
    t.on_response(subscription(metrics=[]), 0.0)
    assert t.instance_id == INSTANCE
    # no metrics wanted: ask again one push interval later, with the assigned id
    assert t.phase is TelemetryPhase.SUBSCRIPTION_NEEDED
    assert t.next_request(0.5, START_NS, lambda: METRICS) is None
    again = t.next_request(1.0, START_NS, lambda: METRICS)
    assert isinstance(again, GetTelemetrySubscriptionsRequest)
    assert again.client_instance_id == INSTANCE
    # the broker answers later requests with the zero id: the assigned one stays
    t.on_response(subscription(metrics=[], instance=ZERO_UUID), 1.0)
    assert t.instance_id == INSTANCE


def test_first_push_is_jittered_then_every_interval_with_subscribed_metrics_only():
    t = new_telemetry(jitter=1.5)
    subscribed(t, interval_ms=2000)
    assert t.phase is TelemetryPhase.PUSH_NEEDED
    assert t.wait_s(0.0) == 3.0  # 1.5 x the interval
    assert t.next_request(2.9, START_NS, lambda: METRICS) is None
    req = push(t, 3.0, START_NS + 10)
    assert req.client_instance_id == INSTANCE and req.subscription_id == 7
    assert not req.terminating
    assert req.compression_type == COMPRESSION_CODECS["zstd"]  # the broker's first choice
    metrics = payload_of(req)
    assert sorted(metrics) == [
        "org.apache.kafka.producer.record.send.rate",
        "org.apache.kafka.producer.record.send.total",
        "org.apache.kafka.producer.request.total",
    ]
    t.on_response(PushTelemetryResponse(), 3.2)
    assert t.pushes == 1 and t.wait_s(3.2) == pytest.approx(2.0)


def test_prefixes_pick_metrics_and_empty_string_or_star_means_all():
    for requested, expected in [
        (["org.apache.kafka.producer.record."], 2),
        (["org.apache.kafka.producer.request.total", "nothing.matches"], 1),
        ([""], 3),
        (["*"], 3),
        (["org.apache.kafka.consumer."], 0),
    ]:
        t = new_telemetry()
        subscribed(t, metrics=requested)
        assert len(payload_of(push(t, 1.0, START_NS))) == expected, requested


def test_delta_temporality_sends_changes_and_cumulative_sends_totals():
    t = new_telemetry()
    subscribed(t, delta=True)
    first = payload_of(push(t, 1.0, START_NS + 100))
    (dp,) = first["org.apache.kafka.producer.record.send.total"].sum.data_points
    assert (dp.as_double, dp.start_time_unix_nano, dp.time_unix_nano) == (
        10.0,
        START_NS,
        START_NS + 100,
    )
    t.on_response(PushTelemetryResponse(), 1.0)
    second = payload_of(push(t, 2.0, START_NS + 200, {**METRICS, "record-send-total": 16.0}))
    total = second["org.apache.kafka.producer.record.send.total"]
    assert total.sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    (dp,) = total.sum.data_points
    assert (dp.as_double, dp.start_time_unix_nano, dp.time_unix_nano) == (
        6.0,
        START_NS + 100,
        START_NS + 200,
    )
    (gauge,) = second["org.apache.kafka.producer.record.send.rate"].gauge.data_points
    assert gauge.as_double == 2.5

    c = new_telemetry()
    subscribed(c, delta=False)
    payload_of(push(c, 1.0, START_NS + 100))
    c.on_response(PushTelemetryResponse(), 1.0)
    again = payload_of(push(c, 2.0, START_NS + 200, {**METRICS, "record-send-total": 16.0}))
    total = again["org.apache.kafka.producer.record.send.total"].sum
    assert total.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    (dp,) = total.data_points
    assert (dp.as_double, dp.start_time_unix_nano) == (16.0, START_NS)


@pytest.mark.parametrize(
    "accepted, chosen",
    [([], "none"), ([1, 4], "gzip"), ([3], "lz4"), ([2], "snappy"), ([0], "none")],
)
def test_compression_is_the_first_accepted_one(accepted, chosen):
    t = new_telemetry()
    subscribed(t, compression=accepted)
    req = push(t, 1.0, START_NS)
    assert req.compression_type == COMPRESSION_CODECS[chosen]
    assert "org.apache.kafka.producer.record.send.rate" in payload_of(req)


@pytest.mark.parametrize(
    "error", [ErrorCode.UNKNOWN_SUBSCRIPTION_ID, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE]
)
def test_changed_subscription_is_asked_for_at_once(error):
    t = new_telemetry()
    subscribed(t)
    push(t, 1.0, START_NS)
    t.on_response(PushTelemetryResponse(error_code=error), 1.1)
    assert t.phase is TelemetryPhase.SUBSCRIPTION_NEEDED and t.wait_s(1.1) == 0.0
    req = t.next_request(1.1, START_NS, lambda: METRICS)
    assert isinstance(req, GetTelemetrySubscriptionsRequest)
    t.on_response(subscription(sub_id=8, metrics=[""]), 1.2)
    # not the client's first subscription: the next push one interval on, no jitter
    assert t.wait_s(1.2) == pytest.approx(1.0)
    assert push(t, 2.2, START_NS).subscription_id == 8


@pytest.mark.parametrize(
    "error", [ErrorCode.TELEMETRY_TOO_LARGE, ErrorCode.THROTTLING_QUOTA_EXCEEDED]
)
def test_too_large_or_throttled_waits_a_push_interval(error):
    t = new_telemetry()
    subscribed(t, interval_ms=5000)
    push(t, 5.0, START_NS)
    t.on_response(PushTelemetryResponse(error_code=error), 5.0)
    assert t.phase is TelemetryPhase.SUBSCRIPTION_NEEDED
    assert t.wait_s(5.0) == pytest.approx(5.0)


@pytest.mark.parametrize(
    "error",
    [
        ErrorCode.INVALID_RECORD,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ],
)
def test_errors_retrying_cannot_fix_stop_telemetry(error):
    t = new_telemetry()
    subscribed(t)
    push(t, 1.0, START_NS)
    t.on_response(PushTelemetryResponse(error_code=error), 1.0)
    assert t.finished and t.wait_s(100.0) is None
    assert t.next_request(100.0, START_NS, lambda: METRICS) is None
    assert not t.close(100.0)  # nothing to terminate


def test_subscription_errors():
    t = new_telemetry()
    t.next_request(0.0, START_NS, lambda: METRICS)
    t.on_response(subscription(error=ErrorCode.THROTTLING_QUOTA_EXCEEDED), 0.0)
    assert t.phase is TelemetryPhase.SUBSCRIPTION_NEEDED and t.wait_s(0.0) == 300.0
    t.next_request(300.0, START_NS, lambda: METRICS)
    t.on_response(subscription(error=ErrorCode.INVALID_REQUEST), 300.0)
    assert t.finished


def test_no_answer_backs_off_and_asks_for_the_subscription_again():
    t = new_telemetry()
    t.next_request(0.0, START_NS, lambda: METRICS)
    t.on_no_answer(0.0, "connection refused")
    assert t.wait_s(0.0) == pytest.approx(0.1)
    t.next_request(0.1, START_NS, lambda: METRICS)
    t.on_no_answer(0.1, "connection refused")
    assert t.wait_s(0.1) == pytest.approx(0.2)  # growing, by retry.backoff.ms
    assert isinstance(
        t.next_request(0.35, START_NS, lambda: METRICS), GetTelemetrySubscriptionsRequest
    )
    t.on_response(subscription(), 0.35)
    push(t, 1.35, START_NS)
    t.on_no_answer(1.35, "timed out")
    assert t.phase is TelemetryPhase.SUBSCRIPTION_NEEDED
    assert t.wait_s(1.35) == pytest.approx(0.1)  # an answer in between reset the backoff


def test_unsupported_broker_ends_telemetry_quietly():
    t = new_telemetry()
    t.stop()
    assert t.finished and t.wait_s(0.0) is None and not t.close(0.0)


def test_close_sends_one_terminating_push():
    t = new_telemetry()
    subscribed(t)
    assert t.close(0.2)
    assert t.wait_s(0.2) == 0.0  # at once, not at the push interval
    req = push(t, 0.2, START_NS)
    assert req.terminating and req.subscription_id == 7
    assert "org.apache.kafka.producer.record.send.rate" in payload_of(req)
    t.on_response(PushTelemetryResponse(), 0.3)
    assert t.finished and t.pushes == 1
    assert t.next_request(10.0, START_NS, lambda: METRICS) is None


def test_close_during_a_push_still_terminates_and_a_failed_one_is_not_retried():
    t = new_telemetry()
    subscribed(t)
    push(t, 1.0, START_NS)  # its answer never comes (the task was cancelled)
    assert t.close(1.0)
    assert push(t, 1.0, START_NS).terminating
    t.on_no_answer(1.0, "closed")
    assert t.finished


def test_close_without_a_subscription_with_metrics_pushes_nothing():
    t = new_telemetry()
    assert not t.close(0.0) and t.finished
    t = new_telemetry()
    subscribed(t, metrics=[])
    assert not t.close(0.0) and t.finished


def test_payload_over_max_bytes_is_cut_to_fit():
    many = {f"m{i:03d}-rate": float(i) for i in range(200)}
    t = new_telemetry()
    subscribed(t, metrics=[""], compression=[], max_bytes=2000)
    req = push(t, 1.0, START_NS, many)
    assert 0 < len(req.metrics) <= 2000
    assert 0 < len(payload_of(req)) < 200
    tiny = new_telemetry()
    subscribed(tiny, metrics=[""], compression=[], max_bytes=10)
    assert tiny.next_request(1.0, START_NS, lambda: many) is None  # nothing fits: skipped
    assert tiny.phase is TelemetryPhase.PUSH_NEEDED and tiny.wait_s(1.0) == pytest.approx(1.0)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        new_telemetry("streams")


# -- per-partition metrics ------------------------------------------------------------------------

LAG = "org.apache.kafka.consumer.fetch.manager.records.lag"


def lag_key(topic: str, partition: int) -> str:
    return f"records-lag{{topic={topic},partition={partition}}}"


CONSUMER_METRICS = {
    "records-lag-max": 9.0,
    lag_key("orders", 0): 9.0,
    lag_key("orders", 1): 0.0,
    lag_key("audit", 0): 4.0,
    "fetch-total": 3.0,
}


def test_a_subscription_to_records_lag_gets_one_metric_with_a_point_per_partition():
    t = new_telemetry("consumer")
    subscribed(t, metrics=[LAG])
    metrics = payload_of(push(t, 1.0, START_NS, CONSUMER_METRICS))
    # the prefix matches records.lag and records.lag.max, not fetch.total
    assert sorted(metrics) == [LAG, LAG + ".max"]
    lag = metrics[LAG]
    assert lag.WhichOneof("data") == "gauge"
    got = {
        (a["topic"], int(a["partition"])): dp.as_double
        for dp in lag.gauge.data_points
        for a in [attributes_of(dp)]
    }
    assert got == {("orders", 0): 9.0, ("orders", 1): 0.0, ("audit", 0): 4.0}
    assert all(dp.time_unix_nano == START_NS for dp in lag.gauge.data_points)
    (dp,) = metrics[LAG + ".max"].gauge.data_points
    assert dp.as_double == 9.0 and not dp.attributes


def test_subscription_prefixes_match_the_name_not_the_tags():
    t = new_telemetry("consumer")
    subscribed(t, metrics=[LAG + "{", "org.apache.kafka.consumer.fetch.manager.records.lag.orders"])
    assert payload_of(push(t, 1.0, START_NS, CONSUMER_METRICS)) == {}


def test_delta_sums_of_tagged_keys_are_kept_apart():
    """A per-partition sum: each partition's delta is against its own last value."""
    name = "org.apache.kafka.consumer.fetch.manager.records.consumed.total"
    a, b = (
        "records-consumed-total{topic=t,partition=0}",
        "records-consumed-total{topic=t,partition=1}",
    )
    t = new_telemetry("consumer")
    subscribed(t, metrics=[name], delta=True)
    payload_of(push(t, 1.0, START_NS + 100, {a: 10.0, b: 100.0}))
    t.on_response(PushTelemetryResponse(), 1.0)
    second = payload_of(push(t, 2.0, START_NS + 200, {a: 13.0, b: 150.0}))
    total = second[name].sum
    assert total.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    got = {attributes_of(dp)["partition"]: dp.as_double for dp in total.data_points}
    assert got == {"0": 3.0, "1": 50.0}
    assert {dp.start_time_unix_nano for dp in total.data_points} == {START_NS + 100}
    # a partition that was not in the last push starts from the client's start
    t.on_response(PushTelemetryResponse(), 2.0)
    c = "records-consumed-total{topic=t,partition=2}"
    third = payload_of(push(t, 3.0, START_NS + 300, {a: 13.0, b: 150.0, c: 5.0}))
    got = {
        attributes_of(dp)["partition"]: (dp.as_double, dp.start_time_unix_nano)
        for dp in third[name].sum.data_points
    }
    assert got == {"0": (0.0, START_NS + 200), "1": (0.0, START_NS + 200), "2": (5.0, START_NS)}
