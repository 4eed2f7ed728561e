"""A real Apache Kafka cluster for tests, started from the official jars (KRaft, no Docker).

``KafkaCluster`` runs one or more combined broker+controller nodes on 127.0.0.1;
``ExternalCluster`` wraps an existing cluster (``KCORE_BOOTSTRAP``) and ``DockerKafkaCluster``
(``kcore.testing.docker``) one started by testcontainers. The pytest plugin
(``kcore.testing.pytest_plugin``) provides the fixtures ``kafka_cluster`` and ``kafka_cluster3``.
"""

from .cluster import (
    KAFKA_TOOLS,
    BaseCluster,
    ExternalCluster,
    KafkaCluster,
    KafkaNode,
    Listener,
)
from .docker import DockerKafkaCluster
from .errors import (
    ClusterControlError,
    ClusterError,
    ClusterStartError,
    KafkaJarsError,
    KafkaToolError,
)
from .jars import java_executable, kafka_libs
from .versions import KAFKA_VERSION

__all__ = [
    "KAFKA_TOOLS",
    "KAFKA_VERSION",
    "BaseCluster",
    "ClusterControlError",
    "ClusterError",
    "ClusterStartError",
    "DockerKafkaCluster",
    "ExternalCluster",
    "KafkaCluster",
    "KafkaJarsError",
    "KafkaNode",
    "KafkaToolError",
    "Listener",
    "java_executable",
    "kafka_libs",
]
