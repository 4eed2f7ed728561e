"""Errors raised by ``kcore.testing`` (the local Kafka and Spark cluster harness)."""

from __future__ import annotations

from pathlib import Path

from kcore.errors import KcoreError


class ClusterError(KcoreError):
    """Base of every error the test-cluster harness raises."""


class KafkaJarsError(ClusterError):
    """The Kafka jars could not be provided: ``java`` or ``mvn`` is missing, or Maven failed."""


class ClusterStartError(ClusterError):
    """A node did not start: its JVM exited, or it was not ready in time (a Kafka node logs
    ``Kafka Server started``, a Spark cluster's master lists every worker). The message ends
    with the tail of that node's log; ``log_path`` and ``work_dir`` say where the full logs
    were kept."""

    def __init__(
        self,
        message: str,
        *,
        node_id: int | None = None,
        log_path: Path | None = None,
        work_dir: Path | None = None,
    ) -> None:
        self.node_id = node_id
        self.log_path = log_path
        self.work_dir = work_dir
        super().__init__(message)


class ClusterControlError(ClusterError):
    """An operation this kind of cluster cannot do, e.g. stopping a broker of an external
    cluster (``KCORE_BOOTSTRAP``), or asking for a node id the cluster does not have."""


class KafkaToolError(ClusterError):
    """A Kafka command-line tool run with ``check=True`` exited with a non-zero status, or a
    tool did not finish within its timeout (``returncode`` None)."""

    def __init__(self, message: str, *, returncode: int | None, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(message)
