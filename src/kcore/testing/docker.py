"""``DockerKafkaCluster``: a one-node Kafka started by testcontainers' Kafka module, behind the
:class:`~kcore.testing.cluster.BaseCluster` interface (``KCORE_TEST_BROKER=docker``).

Needs a Docker engine and ``pip install 'kcore[docker]'``; testcontainers is imported only when
the cluster starts. Its Kafka module runs Confluent's ``cp-kafka`` image (set another with
``KCORE_DOCKER_IMAGE``); brokers cannot be stopped, started or killed individually.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from .cluster import BaseCluster, PropertyValue, _prop_value
from .errors import ClusterControlError, ClusterStartError

# Confluent Platform 8.0 ships Apache Kafka 4.0 (KRaft only).
DEFAULT_IMAGE = "confluentinc/cp-kafka:8.0.0"

_FAST_SETTINGS: dict[str, PropertyValue] = {
    "offsets.topic.replication.factor": 1,
    "offsets.topic.num.partitions": 3,
    "transaction.state.log.replication.factor": 1,
    "transaction.state.log.min.isr": 1,
    "transaction.state.log.num.partitions": 3,
    "share.coordinator.state.topic.replication.factor": 1,
    "share.coordinator.state.topic.min.isr": 1,
    "group.initial.rebalance.delay.ms": 0,
    "num.partitions": 1,
}


def confluent_env_name(prop: str) -> str:
    """The cp-kafka image's environment variable for a broker property
    (``.`` -> ``_``, ``_`` -> ``__``, ``-`` -> ``___``, upper case, ``KAFKA_`` prefix)."""
    return "KAFKA_" + prop.replace("_", "__").replace("-", "___").replace(".", "_").upper()


class DockerKafkaCluster(BaseCluster):
    """One Kafka node in a Docker container (testcontainers). ``brokers`` must be 1."""

    def __init__(
        self,
        brokers: int = 1,
        *,
        image: str | None = None,
        broker_config: Mapping[str, PropertyValue] | None = None,
        heap: str | None = "512m",
        startup_timeout: float = 120.0,
    ) -> None:
        self.brokers = brokers
        self.image = image or os.environ.get("KCORE_DOCKER_IMAGE", DEFAULT_IMAGE)
        self.broker_config = dict(broker_config or {})
        self.heap = heap
        self.startup_timeout = startup_timeout
        self.kafka_version = None  # run_tool uses the default jars
        self.startup_seconds: float | None = None
        self._container: Any = None

    def __repr__(self) -> str:
        return f"<DockerKafkaCluster {self.image} {'running' if self._container else 'stopped'}>"

    def __enter__(self) -> DockerKafkaCluster:
        return self.start()

    def start(self) -> DockerKafkaCluster:
        if self._container is not None:
            return self
        if self.brokers != 1:
            raise ClusterStartError(
                f"KCORE_TEST_BROKER=docker runs a single node; {self.brokers} were asked for. "
                "Unset KCORE_TEST_BROKER to start a multi-node cluster from the Kafka jars."
            )
        try:
            from testcontainers.community.kafka import KafkaContainer  # newer testcontainers
        except ImportError:
            try:
                from testcontainers.kafka import KafkaContainer
            except ImportError as exc:
                raise ClusterStartError(
                    "KCORE_TEST_BROKER=docker needs testcontainers: pip install 'kcore[docker]'"
                ) from exc
        begin = time.monotonic()
        container = KafkaContainer(self.image).with_kraft()
        for key, value in {**_FAST_SETTINGS, **self.broker_config}.items():
            container.with_env(confluent_env_name(key), _prop_value(value))
        if self.heap:
            container.with_env("KAFKA_HEAP_OPTS", f"-Xmx{self.heap}")
        try:
            container.start(timeout=int(self.startup_timeout))
        except Exception as exc:
            logs = _container_logs(container, 40)
            try:
                container.stop()
            except Exception:  # noqa: BLE001 - the start error is the one to report
                pass
            raise ClusterStartError(
                f"the Kafka container ({self.image}) did not start: {exc}\n{logs}"
            ) from exc
        self._container = container
        self.startup_seconds = time.monotonic() - begin
        return self

    def stop(self, graceful: bool = False) -> None:
        container, self._container = self._container, None
        if container is not None:
            container.stop()

    def _require(self) -> Any:
        if self._container is None:
            raise ClusterControlError("the Docker Kafka cluster is not running")
        return self._container

    @property
    def bootstrap_servers(self) -> str:
        return str(self._require().get_bootstrap_server())

    @property
    def node_ids(self) -> list[int]:
        return [1]

    def _check_node(self, node_id: int) -> None:
        if node_id != 1:
            raise ClusterControlError(f"no node {node_id}: the Docker cluster has node 1 only")

    def broker_address(self, node_id: int) -> str:
        self._check_node(node_id)
        return self.bootstrap_servers

    def is_running(self, node_id: int) -> bool:
        self._check_node(node_id)
        if self._container is None:
            return False
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        return bool(wrapped.status == "running")

    def log_tail(self, node_id: int, lines: int = 50) -> str:
        self._check_node(node_id)
        return _container_logs(self._require(), lines)

    def _cannot(self, what: str, node_id: int | str) -> ClusterControlError:
        return ClusterControlError(
            f"cannot {what} {node_id} of a Docker Kafka cluster (KCORE_TEST_BROKER=docker); "
            "unset KCORE_TEST_BROKER to run brokers kcore.testing can control."
        )


def _container_logs(container: Any, lines: int) -> str:
    try:
        raw = container.get_wrapped_container().logs(tail=lines)
    except Exception as exc:  # noqa: BLE001 - logs are a courtesy in error messages
        return f"(no container logs: {exc})"
    return bytes(raw).decode(errors="replace")
