"""Fetch the kafka-clients jar (message JSON definitions, the Errors enum) with Maven into a
cache that later runs reuse."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("KCORE_CACHE_DIR", Path.home() / ".cache" / "kcore"))


def kafka_clients_jar(version: str) -> Path:
    out = cache_root() / "jars" / f"kafka-clients-{version}"
    jar = out / f"kafka-clients-{version}.jar"
    if not jar.exists():
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "dependency:copy",
                f"-Dartifact=org.apache.kafka:kafka-clients:{version}",
                f"-DoutputDirectory={out}",
            ],
            check=True,
        )
    return jar
