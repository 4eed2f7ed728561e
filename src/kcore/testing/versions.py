"""The Apache Kafka release kcore's generated protocol is built from and tests run against."""

import os

# 4.3.1 is the newest release whose broker artifacts are all on Maven Central.
KAFKA_VERSION = os.environ.get("KCORE_KAFKA_VERSION", "4.3.1")
# Kafka's POMs leave the log4j2 backend out (the release tarball adds it); 4.2+ ship 2.25.x.
LOG4J2_VERSION = "2.25.3"
SLF4J_VERSION = "1.7.36"
# The version the committed generated protocol modules come from; regenerate when bumping.
PROTOCOL_SOURCE_VERSION = "4.3.1"
# Pinned so `mvn dependency:copy-dependencies` behaves the same whatever Maven's default is.
MAVEN_DEPENDENCY_PLUGIN_VERSION = "3.8.1"
