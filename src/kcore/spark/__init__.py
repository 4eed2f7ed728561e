"""kcore as a PySpark data source: ``spark.read.format("kcore")`` and friends.

``register(spark)`` makes kcore available on the executors (if they lack it) and registers the
source under the name ``kcore`` (Spark refuses a Python source named ``kafka``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the ``kcore`` data source with ``spark`` and ship kcore to executors that lack
    it, so a pipeline needs no ``--py-files`` flag."""
    from .shipping import ensure_on_executors
    from .source import KcoreDataSource

    ensure_on_executors(spark)
    spark.dataSource.register(KcoreDataSource)
