"""The Spark write's floor: a Python data source that takes the same Arrow batches a
``format("kcore")`` write task gets and drops them, so a round of it is what Spark costs to
make the rows and hand them to a Python worker, with no Kafka client at all
(bench/test_spark_bench.py registers it as ``format("kcore-bench-floor")``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage


@dataclass
class RowsSeen(WriterCommitMessage):
    rows: int


class DroppingWriter(DataSourceArrowWriter):
    def __init__(self, rows: int) -> None:
        self.rows = rows  # what the job must hand over in all (option ``rows``)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RowsSeen:
        # Dropped unread: what a round costs is Spark making the rows and handing them over.
        return RowsSeen(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[Any]) -> None:
        seen = sum(m.rows for m in messages if m is not None)
        if seen != self.rows:
            raise RuntimeError(f"the floor's tasks were handed {seen} rows, not {self.rows}")

    def abort(self, messages: list[Any]) -> None:
        pass


class FloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kcore-bench-floor"

    def writer(self, schema: Any, overwrite: bool) -> DroppingWriter:
        return DroppingWriter(int(self.options["rows"]))
