"""Fetch jars (kafka-clients: the message JSON definitions and the Errors enum; slf4j-api) with
Maven into a cache that later runs reuse."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("KCORE_CACHE_DIR", Path.home() / ".cache" / "kcore"))


def maven_jar(group: str, artifact: str, version: str) -> Path:
    """Fetch ``group:artifact:version`` with Maven into kcore's jar cache (reused across runs)."""
    out = cache_root() / "jars" / f"{artifact}-{version}"
    jar = out / f"{artifact}-{version}.jar"
    if not jar.exists():
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "dependency:copy",
                f"-Dartifact={group}:{artifact}:{version}",
                f"-DoutputDirectory={out}",
            ],
            check=True,
        )
    return jar


def kafka_clients_jar(version: str) -> Path:
    return maven_jar("org.apache.kafka", "kafka-clients", version)
