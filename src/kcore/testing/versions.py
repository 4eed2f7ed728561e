"""The Apache Kafka release kcore's generated protocol is built from and tests run against."""

import os

# 4.3.1 is the newest release whose broker artifacts are all on Maven Central.
DEFAULT_KAFKA_VERSION = "4.3.1"
# As the environment had it at import; kafka_version() reads it each time.
KAFKA_VERSION = os.environ.get("KCORE_KAFKA_VERSION", DEFAULT_KAFKA_VERSION)


def kafka_version() -> str:
    """The Kafka release clusters run when none is named: ``KCORE_KAFKA_VERSION`` as it is now
    (set in a conftest.py or with monkeypatch, it still counts), else the default. KRaft-only
    4.x and later: kcore.testing starts no ZooKeeper."""
    version = os.environ.get("KCORE_KAFKA_VERSION", "").strip() or DEFAULT_KAFKA_VERSION
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) < 4:
        from .errors import ClusterError

        raise ClusterError(
            f"KCORE_KAFKA_VERSION={version!r}: kcore.testing runs Apache Kafka 4.0 or later"
        )
    return version


# Kafka's POMs leave the log4j2 backend out (the release tarball adds it); 4.2+ ship 2.25.x.
LOG4J2_VERSION = "2.25.3"
SLF4J_VERSION = "1.7.36"
# The version the committed generated protocol modules come from; regenerate when bumping.
PROTOCOL_SOURCE_VERSION = "4.3.1"
# Pinned so `mvn dependency:copy-dependencies` behaves the same whatever Maven's default is.
MAVEN_DEPENDENCY_PLUGIN_VERSION = "3.8.1"
