"""The executor's Python heap after a task.

pyspark's daemon runs ``gc.collect()`` after every task of a reused Python worker
(``SPARK_REUSE_WORKER``, Spark's default). A full collection walks every object the collector
tracks: in a worker that has read or written Kafka that is ~90,000 of them (pyspark's, pyarrow's
compute functions, kcore's protocol classes, the pooled clients), ~25 ms a task and half of the
worker's CPU in a stream read of 125,000-record tasks (docs/benchmarks-spark.md). What exists after
the worker's first task is what every later task needs (modules, the clients' pools), so it is
moved out of the collector's reach once (``gc.freeze``): later collections walk only what later
tasks made. Objects frozen are still freed when no longer referenced; only a reference cycle
among them outlives its last use (a pooled client closed later: once a process, not a task).
"""

from __future__ import annotations

import gc
import os

__all__ = ["after_task"]

_settled = False


def after_task() -> None:
    """Called as a read or write task ends: the first time in a reused worker, freeze the heap."""
    global _settled
    if _settled or not os.environ.get("SPARK_REUSE_WORKER"):
        return
    _settled = True
    gc.freeze()
