"""Spark's JVM Kafka connector (``spark-sql-kafka-0-10``) and the jars it needs that Spark does
not ship, fetched from Maven Central with ``mvn`` into a cache that later runs reuse:

    $KCORE_CACHE_DIR/spark-kafka-<spark version>/libs   (default ~/.cache/kcore/...)

Pass them to a session as ``spark.jars`` (``",".join(map(str, spark_kafka_jars()))``); Spark's
own ``--packages`` resolver (Ivy) is not needed. Once cached, nothing touches the network.

Two quirks are handled here:

* Spark's parent POM lists a Google mirror of Central (``gcs-maven-central-mirror``) first;
  where that host is unreachable Maven fails instead of moving on, so the generated POM maps
  the mirror's id to Central.
* ``spark-token-provider-kafka-0-10`` (delegation tokens; the connector only calls its
  config helpers) is missing from some Central mirrors for recent releases. If the release's
  own version cannot be fetched, :data:`TOKEN_PROVIDER_FALLBACK` is used, with a warning: its
  config helpers have the same signatures, but its Kerberos delegation-token paths log with
  LogKeys that Spark 4.1 changed, so they would fail there (unused without delegation tokens).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
from pathlib import Path

from .errors import KafkaJarsError
from .jars import _complete, cache_root, fetch_with_maven, maven_project

__all__ = ["TOKEN_PROVIDER_FALLBACK", "spark_kafka_jars", "spark_shipped_jars_dir"]

log = logging.getLogger("kcore.testing")

SCALA_BINARY = "2.13"
# The newest spark-token-provider-kafka-0-10_2.13 release every Central mirror we met has.
TOKEN_PROVIDER_FALLBACK = "4.0.0"
# Transitive dependencies Spark's own jars directory already has (other versions of them would
# only clash): not fetched. Anything else Spark ships is also left out by spark_kafka_jars.
_SHIPPED = (
    ("org.scala-lang", "*"),
    ("org.scala-lang.modules", "*"),
    ("org.slf4j", "*"),
    ("at.yawk.lz4", "*"),
    ("org.lz4", "*"),
    ("org.xerial.snappy", "*"),
    ("com.github.luben", "*"),
    ("com.google.code.findbugs", "*"),
    ("org.apache.spark", f"spark-tags_{SCALA_BINARY}"),
)


def _installed_pyspark_version() -> str:
    try:
        import pyspark
    except ImportError:
        raise KafkaJarsError(
            "pyspark is not installed; pass the Spark version to spark_kafka_jars()"
        ) from None
    return pyspark.__version__


def render_pom(spark_version: str, token_provider_version: str) -> str:
    """A pom whose runtime dependencies are the connector, its token provider and their
    dependencies minus the ones Spark ships."""
    exclusions = "".join(
        f"""
        <exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"""
        for g, a in _SHIPPED
    )
    return maven_project(
        "kcore.testing.spark_jars",
        "spark-kafka-libs",
        spark_version,
        f"""\
  <repositories>
    <!-- Spark's parent POM puts this mirror first; an unreachable host fails the build. -->
    <repository>
      <id>gcs-maven-central-mirror</id>
      <url>https://repo.maven.apache.org/maven2</url>
    </repository>
  </repositories>
  <dependencies>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_{SCALA_BINARY}</artifactId>
      <version>{spark_version}</version>
      <exclusions>{exclusions}
        <exclusion>
          <groupId>org.apache.spark</groupId>
          <artifactId>spark-token-provider-kafka-0-10_{SCALA_BINARY}</artifactId>
        </exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-token-provider-kafka-0-10_{SCALA_BINARY}</artifactId>
      <version>{token_provider_version}</version>
      <exclusions>
        <exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion>
      </exclusions>
    </dependency>
  </dependencies>
""",
    )


def spark_shipped_jars_dir() -> Path | None:
    """The jars directory of the Spark that ``pyspark`` runs (``$SPARK_HOME/jars``, else the
    pyspark package's own), or None if there is none."""
    home = os.environ.get("SPARK_HOME")
    candidates = [Path(home) / "jars"] if home else []
    try:
        import pyspark

        candidates.append(Path(pyspark.__file__).parent / "jars")
    except ImportError:
        pass
    return next((c for c in candidates if c.is_dir()), None)


_VERSION_SUFFIX = re.compile(r"-\d[^-]*(-[A-Za-z][\w.]*)?\.jar$")


def _artifact(jar_name: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return _VERSION_SUFFIX.sub("", jar_name)


def spark_kafka_jars(spark_version: str | None = None) -> list[Path]:
    """The jars to put on ``spark.jars`` for ``format("kafka")`` with Spark ``spark_version``
    (default: the installed pyspark's): ``spark-sql-kafka-0-10``, its token provider,
    ``kafka-clients`` and ``commons-pool2``, without any jar Spark's jars directory already has.
    Fetched with Maven on first use, then cached."""
    version = spark_version or _installed_pyspark_version()
    home = cache_root() / f"spark-kafka-{version}"
    poms = [render_pom(version, version)]
    if version != TOKEN_PROVIDER_FALLBACK:
        poms.append(render_pom(version, TOKEN_PROVIDER_FALLBACK))
    if not any(_complete(home, pom) for pom in poms):
        home.mkdir(parents=True, exist_ok=True)
        with open(home.parent / f"spark-kafka-{version}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent processes fetch once
            try:
                if not any(_complete(home, pom) for pom in poms):
                    _fetch_first(home, poms, version)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    shipped_dir = spark_shipped_jars_dir()
    shipped = {_artifact(p.name) for p in shipped_dir.glob("*.jar")} if shipped_dir else set()
    libs = home / "libs"
    return sorted(p for p in libs.glob("*.jar") if _artifact(p.name) not in shipped)


def _fetch_first(home: Path, poms: list[str], version: str) -> None:
    """Fetch with the first pom Maven can resolve (the release's own token provider, then the
    fallback)."""
    errors = []
    for i, pom in enumerate(poms):
        try:
            _fetch(home, pom, version)
        except KafkaJarsError as exc:
            errors.append(exc)
            continue
        if i:
            log.warning(
                "spark-token-provider-kafka-0-10 %s is not on the Maven repository; using %s "
                "(its Kerberos delegation-token paths do not work with Spark %s)",
                version,
                TOKEN_PROVIDER_FALLBACK,
                version,
            )
        return
    raise errors[0]


def _fetch(home: Path, pom: str, version: str) -> None:
    fetch_with_maven(
        home,
        pom,
        f"Spark {version}'s Kafka connector jars",
        f"spark-sql-kafka-0-10_{SCALA_BINARY}-{version}.jar",
        spark_version=version,
    )
