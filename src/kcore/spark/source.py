"""The ``kcore`` DataSource: routes Spark's calls to the reader and writer modules."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType


class KcoreDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kcore"

    def schema(self) -> StructType:
        from .options import read_schema

        return read_schema(self.options)

    def reader(self, schema: StructType) -> Any:
        from .batch_reader import KafkaBatchReader

        return KafkaBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> Any:
        from .stream_reader import KafkaStreamReader

        return KafkaStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from .writer import KafkaBatchWriter

        return KafkaBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from .writer import KafkaStreamWriter

        return KafkaStreamWriter(self.options, schema)
