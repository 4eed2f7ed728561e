"""Class-data sharing (AppCDS) archive for the Kafka JVMs.

A Kafka node spends most of its ~3 s start loading and verifying classes. Java 13+ can dump
the classes a JVM loaded into an archive at exit (``-XX:ArchiveClassesAtExit``) and map that
archive into later JVMs (``-XX:SharedArchiveFile``), which roughly halves the start time and
CPU of brokers; ``StorageTool format`` and the CLI tools share most of those classes and gain
as much from the same archive. kcore.testing trains it once per Kafka version and JVM (a
throwaway one-node cluster, stopped gracefully so the JVM writes the archive), next to the
cached jars:

    <kafka_home>/cds/kafka-<key>.jsa

``key`` covers the java binary and every jar's name, size and mtime, so a new JDK or new jars
get a new archive. An archive the JVM cannot use is ignored by it (``-Xshare:auto``), so the
worst case is the old start time. ``KCORE_CDS=0`` turns all of this off.

This module knows archives, not clusters: whoever starts clusters (``cluster.py``) hands
:meth:`Archives.ensure` the function that runs the training cluster.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import jars

log = logging.getLogger("kcore.testing")

_QUIET = "-Xlog:cds*=off"  # no "[warning][cds]" lines in logs or tool output

# ``train(version, dump, work_dir)``: run a throwaway one-node cluster of Kafka ``version`` in
# ``work_dir`` whose broker has ``training_flags(dump)`` and stops gracefully (so its JVM writes
# the archive to ``dump``); raise, saying why, if it does not start.
Trainer = Callable[[str, Path, Path], None]


def enabled() -> bool:
    return os.environ.get("KCORE_CDS", "1").strip().lower() not in ("0", "false", "no", "off")


def classpath(libs: Path) -> str:
    """An explicit, sorted classpath: CDS checks it matches the one the archive was made with
    (a ``libs/*`` wildcard expands in directory order)."""
    return os.pathsep.join(str(p) for p in sorted(libs.glob("*.jar")))


def classpath_args(libs: Path) -> list[str]:
    """``["@<argfile>"]``: the JVM reads ``-cp <classpath()>`` from a file next to ``libs``, so
    ``ps`` shows a short command line instead of 50 jar paths."""
    text = '-cp "' + classpath(libs).replace("\\", "\\\\").replace('"', '\\"') + '"\n'
    argfile = libs.parent / "classpath.argfile"
    try:
        current = argfile.read_text()
    except OSError:
        current = None
    if current != text:
        tmp = argfile.with_name(f".{argfile.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, argfile)
    return [f"@{argfile}"]


class Archives:
    """The CDS archive for one java binary and one libs directory."""

    def __init__(self, java: str, libs: Path, version: str | None = None) -> None:
        self.java = java
        self.libs = libs
        self.version = version or jars.versions.kafka_version()
        self.dir = jars.kafka_home(version) / "cds"
        digest = hashlib.sha256()
        real_java = os.path.realpath(java)
        st = os.stat(real_java)
        digest.update(f"{real_java}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        for jar in sorted(libs.glob("*.jar")):
            st = jar.stat()
            digest.update(f"{jar.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        self.key = digest.hexdigest()[:16]

    @property
    def path(self) -> Path:
        return self.dir / f"kafka-{self.key}.jsa"

    @property
    def _trained_marker(self) -> Path:
        return self.dir / f"trained-{self.key}"

    def complete(self) -> bool:
        """Trained already (whether or not this JVM could write the archive)."""
        return self._trained_marker.exists()

    def flags(self) -> list[str]:
        """JVM flags that use the archive when there is one."""
        if not enabled():
            return []
        return [f"-XX:SharedArchiveFile={self.path}", _QUIET] if self.path.is_file() else []

    def ensure(self, train: Trainer) -> None:
        """Train the archive with ``train`` if it is missing. Never raises: CDS only makes
        starts faster. If another process is training, go on without waiting for it."""
        if not enabled() or self.complete():
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / "train.lock", "a+") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return
                try:
                    if not self.complete():
                        self._train(train)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        except Exception as exc:  # noqa: BLE001 - fall back to starting without an archive
            log.warning("could not build the JVM class-data archive (%s); continuing", exc)

    def _train(self, train: Trainer) -> None:
        started = time.monotonic()
        log.info(
            "building a JVM class-data archive for Kafka %s (once) in %s", self.version, self.dir
        )
        tmp = Path(tempfile.mkdtemp(prefix="kcore-cds-"))
        dump = tmp / "kafka.jsa"
        try:
            try:
                train(self.version, dump, tmp / "cluster")
            except Exception:
                # Marked as tried all the same: a start that fails here would fail (and cost
                # its timeout) before every later start.
                self._trained_marker.write_text("archive written: False (training failed)\n")
                raise
            for old in [*self.dir.glob("*.jsa"), *self.dir.glob("trained-*")]:
                old.unlink(missing_ok=True)
            made = dump.is_file() and dump.stat().st_size > 0
            if made:
                os.replace(dump, self.path)
            self._trained_marker.write_text(f"archive written: {made}\n")
            log.info(
                "built %s in %.1fs",
                self.path.name if made else "no archive",
                time.monotonic() - started,
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def training_flags(dump: Path) -> list[str]:
        return [f"-XX:ArchiveClassesAtExit={dump}", _QUIET]
