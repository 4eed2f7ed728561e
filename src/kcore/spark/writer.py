"""The write side of the ``kcore`` data source: ``df.write.format("kcore")`` (batch) and
``df.writeStream.format("kcore")`` (streaming), with Spark's Arrow writer interfaces.

Spark creates the writer on the driver (the options and the input schema are checked there, see
``write_options``), pickles it to the executors, and calls ``write`` once per task with the
task's rows as Arrow record batches. A task returns only once every one of its records is
acknowledged (``acks=all``, idempotent producer by default); a delivery error fails the task,
and so the job. Nothing is dropped quietly.

Without ``kafka.transactional.id`` a task uses its process's cached producer for the config
(``clients.get_producer``): at least once, as the JVM sink (a retried task writes its records
again). With it, each task writes in one Kafka transaction of its own, with the transactional
id ``<prefix>-<Spark partition id>``; see :func:`write_task` for what that guarantees.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

import kcore
from kcore.errors import ConfigError, KcoreError

from . import worker_heap
from .clients import get_producer
from .record_sender import RecordSender
from .write_options import WriteSettings, write_settings

__all__ = ["KafkaBatchWriter", "KafkaCommitMessage", "KafkaStreamWriter", "write_task"]

log = logging.getLogger("kcore.spark.writer")


@dataclass
class KafkaCommitMessage(WriterCommitMessage):
    """What a task reports: how many records it delivered (and in which transaction)."""

    records: int
    transactional_id: str | None = None


class KafkaBatchWriter(DataSourceArrowWriter):
    """``df.write.format("kcore")``: append only, as the JVM sink (a topic cannot be
    truncated, so save mode ``overwrite`` is refused)."""

    def __init__(
        self, options: Mapping[str, str], schema: StructType, overwrite: bool = False
    ) -> None:
        if overwrite:
            raise ConfigError(
                "mode", "save mode overwrite is not allowed for Kafka; use append (the default)"
            )
        self.settings = write_settings(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:
        return write_task(self.settings, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("wrote %d records to Kafka", _records(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "the write failed; %d records of the tasks that succeeded stay in Kafka",
            _records(messages),
        )


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("kcore")``: each micro-batch's tasks write as batch tasks do; the
    records are in Kafka when the tasks finish, so there is nothing left to commit."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.settings = write_settings(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:
        return write_task(self.settings, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("batch %d: wrote %d records to Kafka", batchId, _records(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "batch %d failed; %d records of the tasks that succeeded stay in Kafka",
            batchId,
            _records(messages),
        )


def write_task(settings: WriteSettings, batches: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:
    """One Spark task's write: every record sent and acknowledged, or an exception.

    Transactional (``kafka.transactional.id`` = prefix): the task's producer takes the id
    ``<prefix>-<partition id>``; ``init_transactions`` fences any earlier attempt of the same
    partition (a zombie's open transaction is aborted, its later sends fail), the records go in
    one transaction, committed before the task returns. So a read_committed consumer sees each
    task's records all or none, and never those of a failed or fenced attempt. What it does NOT
    give is exactly once end to end: the commit happens in the task, before Spark's driver
    commits the job or micro-batch, so if a task commits and then the job fails or the stage
    (or micro-batch, after a restart) is run again, those records are written a second time.
    (Closing that gap needs the driver to commit prepared transactions: Kafka's KIP-939.)
    The prefix must be unique to the query: two queries with one prefix fence each other.
    The transaction stays open for the whole task, so ``transaction.timeout.ms`` defaults to
    15 min here (``write_options.SINK_TRANSACTION_TIMEOUT_MS``), not the producer's 60 s.
    """
    message = _write(settings, batches)
    worker_heap.after_task()
    return message


def _write(settings: WriteSettings, batches: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:
    batches = (batch for batch in batches if batch.num_rows)
    first = next(batches, None)
    if first is None:  # nothing to write: no producer, no transaction
        return KafkaCommitMessage(0)
    batches = itertools.chain([first], batches)
    prefix = settings.transactional_id_prefix
    if prefix is None:
        with get_producer(settings.producer_config) as producer:
            sender = RecordSender(producer, settings)
            for batch in batches:
                sender.send(batch)
            sender.finish()
        return KafkaCommitMessage(sender.records)

    transactional_id = f"{prefix}-{_partition_id()}"
    # Not cached: init_transactions must run for every attempt (it is what fences the
    # previous one), and a producer runs it once.
    producer = kcore.Producer({**settings.producer_config, "transactional.id": transactional_id})
    try:
        producer.wait_until_ready()  # an unreachable cluster fails the task at max.block.ms
        producer.init_transactions(settings.timeout_s)
        producer.begin_transaction()
        sender = RecordSender(producer, settings)
        for batch in batches:
            sender.send(batch)
        sender.finish()
        producer.commit_transaction(settings.timeout_s)
    except BaseException:
        try:
            producer.abort_transaction(settings.timeout_s)
        except KcoreError as exc:  # e.g. fenced: the coordinator aborts it anyway
            log.info("aborting %s's transaction failed: %s", transactional_id, exc)
        raise
    finally:
        producer.close(settings.timeout_s)
    return KafkaCommitMessage(sender.records, transactional_id)


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def _records(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.records for m in messages if isinstance(m, KafkaCommitMessage))
