"""Client metrics under Java's names: the windowed statistics without a broker, then what a
producer and a consumer report against a real one."""

from __future__ import annotations

import math
import threading
import time
import uuid

import pytest

import kcore
from kcore.admin import NewTopic, TopicPartition
from kcore.config import ClientConfig
from kcore.errors import ConfigError
from kcore.metrics import ClientMetrics, Sensor


def test_a_sensor_keeps_totals_and_windowed_stats_as_javas():
    s = Sensor("x", ("total", "rate", "avg", "max"), window_s=30.0, samples=2)
    assert s.read(0.0) == {
        "x-total": 0.0,
        "x-rate": 0.0,
        "x-avg": pytest.approx(math.nan, nan_ok=True),
        "x-max": pytest.approx(math.nan, nan_ok=True),
    }
    s.record(10, 100.0)
    s.record(30, 101.0)
    # A rate divides by at least (samples - 1) whole windows: 40 / 30 s in the first window.
    assert s.rate(101.0) == pytest.approx(40 / 31)
    assert s.avg(101.0) == 20 and s.max(101.0) == 30 and s.total == 40 and s.count == 2
    s.record(5, 131.0)  # a second window
    assert s.max(131.0) == 30 and s.avg(131.0) == pytest.approx(15)
    s.record(1, 162.0)  # a third: the first window is gone (2 kept)
    assert s.max(162.0) == 5 and s.total == 46
    assert s.avg(300.0) != s.avg(300.0)  # nothing in the live windows: NaN
    assert s.rate(300.0) == 0.0


def test_a_list_of_values_is_each_of_them_recorded():
    one, many = ClientMetrics(), ClientMetrics()
    for m in (one, many):
        m.declare("batch-size", "avg", "max")
    for v in (100.0, 16384.0, 7.0):
        one.record("batch-size", v)
    many.record_all(("batch-size", [100.0, 16384.0, 7.0]), ("record-send", []))
    assert many.snapshot() == one.snapshot()
    assert many.count("batch-size") == 3 and many.total("batch-size") == 16491.0


def test_sensors_recorded_from_many_threads_at_once_lose_nothing():
    """The compiled sensors take their lock without a Python call (the network thread records
    per request): threads recording at once, ints and floats, one by one and as lists, add
    up exactly."""
    m = ClientMetrics()
    m.declare("request", "total", "rate")

    def record() -> None:
        for i in range(2000):
            m.record_all(("request", 1), ("outgoing-byte", [1.5, 2.5]), ("undeclared", i % 7))

    threads = [threading.Thread(target=record) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert m.count("request") == 16_000 and m.total("request") == 16_000
    assert m.count("outgoing-byte") == 32_000 and m.total("outgoing-byte") == 64_000
    snap = m.snapshot()
    # An undeclared name gets every stat.
    assert snap["undeclared-max"] == 6 and snap["undeclared-total"] == 8 * sum(
        i % 7 for i in range(2000)
    )
    assert "request-avg" not in snap and snap["request-rate"] > 0
    with pytest.raises(TypeError):
        m.record_all(("request", "not a number"))
    m.record("request")  # the lock was let go
    assert m.count("request") == 16_001


def test_what_record_all_refuses_records_nothing_and_leaves_the_lock_free():
    """Bad pairs raise before anything is recorded (no partial record, no crash), and a
    number's own ``__float__`` runs before the sensors' lock is taken: one that records a
    metric itself, or empties the list it is in, does not hang or crash the client."""
    m = ClientMetrics()
    for bad in [("x",), ("x", 1, 2), ["x", 1], "x1", (), 5, (1, 2), (None, 1), ("x", None)]:
        with pytest.raises(TypeError):
            m.record_all(("good", 1), bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        m.record_all(("good", [1.0, "a"]))  # type: ignore[list-item]
    assert m.count("good") == 0 and m.snapshot() == {}

    class Reentrant:
        def __float__(self) -> float:
            m.record("inner")
            return 2.0

    values: list = []

    class Emptying:
        def __float__(self) -> float:
            values.clear()
            return 3.0

    values.extend([Emptying(), Emptying(), Emptying()])
    m.record_all(("x", Reentrant()), ("y", values))  # type: ignore[arg-type]
    assert m.total("x") == 2.0 and m.count("inner") == 1
    assert m.count("y") == 1 and m.total("y") == 3.0


def test_a_rate_counts_whole_windows_as_python_divides_floats():
    """Java's rule (a rate divides by at least samples - 1 whole windows) with the windows
    counted as ``elapsed // window`` in floats: at 1.0 s of 0.1 s windows that is 9, not 10."""
    s = Sensor("x", ("rate",), window_s=0.1, samples=11)
    s.record(1.0, 0.0)
    assert s.rate(1.0) == pytest.approx(1.0 / 1.1)


def test_client_metrics_snapshot_and_config():
    m = ClientMetrics.from_config(
        ClientConfig(
            {"bootstrap.servers": "127.0.0.1:9092", "metrics.sample.window.ms": 1000},
            role="producer",
        )
    )
    m.declare("record-send", "total", "rate")
    m.record("record-send", 5)
    m.gauge("buffer-total-bytes", lambda: 1024)
    m.gauge("broken", lambda: 1 / 0)
    snap = m.snapshot()
    assert snap["record-send-total"] == 5 and snap["record-send-rate"] > 0
    assert snap["buffer-total-bytes"] == 1024 and math.isnan(snap["broken"])
    assert list(snap) == sorted(snap)
    assert m.count("record-send") == 1 and m.count("nothing") == 0
    # Java's metrics settings are taken; its reporters are not (named).
    base = {"bootstrap.servers": "127.0.0.1:9092"}
    ClientConfig({**base, "metrics.recording.level": "DEBUG"}, role="consumer")
    with pytest.raises(ConfigError, match="metric.reporters"):
        ClientConfig({**base, "metric.reporters": "x.Y"}, role="consumer")


def _topic(bootstrap: str, partitions: int = 2, **config: str) -> str:
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1, config=config)])
    return name


def test_producer_metrics(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs)
    config = {"bootstrap.servers": bs, "linger.ms": 5, "compression.type": "lz4"}
    with kcore.Producer(config) as producer:
        for i in range(2000):
            producer.send(topic, b"value-%06d " % i + b"x" * 100)
        producer.flush(30)
        m = producer.metrics()
        # Counted per send, as Java's: a retried record again. (A retry is possible: the
        # broker may answer NOT_LEADER_OR_FOLLOWER for a topic it has not made yet.)
        assert m["record-send-total"] == 2000 + m["record-retry-total"]
        assert m["record-send-rate"] > 0 and m["record-error-total"] == 0
        assert 0 < m["batch-size-avg"] <= m["batch-size-max"]
        assert 0 < m["compression-rate-avg"] < 1  # lz4 on repetitive values
        assert m["request-latency-avg"] > 0 and m["request-latency-max"] >= m["request-latency-avg"]
        assert m["records-per-request-avg"] >= 1
        assert m["outgoing-byte-total"] > 0 and m["incoming-byte-total"] > 0
        assert m["request-total"] >= 2 and m["connection-count"] >= 1
        assert m["buffer-total-bytes"] == m["buffer-available-bytes"] == 32 << 20
        assert m["waiting-threads"] == 0 and m["produce-throttle-time-max"] == 0
    # A record the topic refuses (max.message.bytes) fails and is counted.
    small = _topic(bs, 1, **{"max.message.bytes": "1000"})
    with kcore.Producer({"bootstrap.servers": bs}) as producer:
        future = producer.send(small, b"y" * 5000)
        with pytest.raises(kcore.errors.KcoreError):
            future.result(30)
        assert producer.metrics()["record-error-total"] == 1


def test_consumer_metrics_and_current_lag(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    with kcore.Producer({"bootstrap.servers": bs}) as producer:
        for i in range(500):
            producer.send(topic, b"%d" % i)
    tp = TopicPartition(topic, 0)
    config = {
        "bootstrap.servers": bs,
        "group.id": f"g-{topic}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    with kcore.Consumer(config) as consumer:
        consumer.assign([tp])
        assert consumer.current_lag(tp) is None  # nothing fetched yet
        assert consumer.metrics()["last-poll-seconds-ago"] == -1
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < 100 and time.monotonic() < deadline:
            got += consumer.poll(1.0, max_records=100 - len(got))
        assert len(got) == 100
        assert consumer.current_lag(tp) == 400  # as the last fetch saw the log
        m = consumer.metrics()
        assert m["records-lag-max"] == 400 and m["assigned-partitions"] == 1
        while len(got) < 500 and time.monotonic() < deadline:
            got += consumer.poll(1.0)
        assert len(got) == 500 and consumer.current_lag(tp) == 0
        consumer.commit()
        m = consumer.metrics()
        assert m["records-consumed-total"] == 500 and m["records-consumed-rate"] > 0
        assert m["bytes-consumed-total"] > 500
        assert m["fetch-total"] >= 1 and m["fetch-latency-avg"] >= 0 and m["fetch-size-max"] > 0
        assert m["commit-total"] == 1 and m["commit-latency-avg"] > 0
        assert 0 <= m["last-poll-seconds-ago"] < 30
        assert m["fetch-throttle-time-max"] == 0
