"""A real Apache Kafka cluster for tests, started from the official jars (KRaft, no Docker).

``KafkaCluster`` runs one or more combined broker+controller nodes on 127.0.0.1 (or, with
``isolated_network=True``, each in a network namespace of its own, so tests can cut one off);
``ExternalCluster`` wraps an existing cluster (``KCORE_BOOTSTRAP``) and ``DockerKafkaCluster``
(``kcore.testing.docker``) one started by testcontainers. The pytest plugin
(``kcore.testing.pytest_plugin``) provides the fixtures ``kafka_cluster`` and ``kafka_cluster3``.
``kcore.testing.security`` makes test certificates and TLS/SASL listeners;
``spark_kafka_jars`` fetches Spark's JVM Kafka connector (the Spark benchmark's peer).
``SparkCluster`` runs a Spark standalone cluster (a master and workers) from the installed
pyspark; the plugin's ``spark_cluster`` fixture is one.
"""

from .cluster import (
    KAFKA_TOOLS,
    BaseCluster,
    ExternalCluster,
    KafkaCluster,
    KafkaNode,
    Listener,
    NetworkFault,
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
from .network import NetworkHost, NetworkSetupError, TestNetwork
from .security import (
    CertifiedKey,
    LocalPKI,
    PKIError,
    java_client_properties,
    sasl_listener,
    security_listeners,
    ssl_listener,
)
from .spark_cluster import SparkCluster
from .spark_jars import spark_kafka_jars
from .versions import KAFKA_VERSION

__all__ = [
    "KAFKA_TOOLS",
    "KAFKA_VERSION",
    "BaseCluster",
    "CertifiedKey",
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
    "LocalPKI",
    "NetworkFault",
    "NetworkHost",
    "NetworkSetupError",
    "PKIError",
    "SparkCluster",
    "TestNetwork",
    "java_client_properties",
    "java_executable",
    "kafka_libs",
    "sasl_listener",
    "security_listeners",
    "spark_kafka_jars",
    "ssl_listener",
]
