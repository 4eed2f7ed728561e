"""Start-up as Java and librdkafka users expect it: one config dict serves every client."""

from __future__ import annotations

import logging

import pytest

import kcore
from kcore.errors import ConfigError


def test_one_dict_builds_producer_consumer_and_admin(
    kafka_cluster, caplog: pytest.LogCaptureFixture
) -> None:
    topic = "startup-shared-dict"
    kafka_cluster.create_topic(topic, partitions=1)
    shared = {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "request.timeout.ms": "20000",
        "linger.ms": "5",  # producer
        "acks": "all",  # producer
        "group.id": "startup-shared",  # consumer
        "auto.offset.reset": "earliest",  # consumer
        "default.api.timeout.ms": "30000",  # admin and consumer
    }
    with caplog.at_level(logging.WARNING, logger="kcore.config"):
        with kcore.AdminClient(shared) as admin:
            assert topic in admin.list_topics()
        with kcore.Producer(shared) as producer:
            producer.send(topic, b"shared").result(timeout=30)
        with kcore.Consumer(shared) as consumer:
            consumer.subscribe([topic])
            got: list = []
            for _ in range(60):
                got += consumer.poll(0.5)
                if got:
                    break
            assert [r.value for r in got] == [b"shared"]
    logged = " ".join(r.getMessage() for r in caplog.records)
    for key in ("linger.ms", "group.id", "acks", "default.api.timeout.ms"):
        assert key in logged
    # Strict mode and typos are still refused, before any connection.
    with pytest.raises(ConfigError, match="group.id: a consumer setting, not a producer one"):
        kcore.Producer({**shared, "kcore.config.strict": "true"})
    with pytest.raises(ConfigError, match="did you mean 'linger.ms'"):
        kcore.Producer({**shared, "linger.msec": 5})
