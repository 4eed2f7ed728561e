"""The write side's options and input schema, checked as Spark's JVM Kafka sink checks them,
when Spark creates the writer (so a bad option or column fails the query at planning)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kcore.config import STRICT_KEY, ClientConfig
from kcore.errors import ConfigError

__all__ = ["WriteSettings", "write_settings"]

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
# Column -> the types the JVM sink accepts for it (KafkaWriter).
COLUMN_TYPES: dict[str, tuple[DataType, ...]] = {
    "topic": (StringType(),),
    "key": (StringType(), BinaryType()),
    "value": (StringType(), BinaryType()),
    "headers": (HEADERS_TYPE,),
    "partition": (IntegerType(),),
    "timestamp": (DoubleType(), TimestampType()),
}
# The producer's batch.size unless kafka.batch.size is given (Java's default is 16 KiB). The sink
# hands the producer thousands of rows at once, and kcore's producer costs ~0.1 ms of Python per
# batch: at 16 KiB that was a third of a write's CPU (bench/test_spark_bench.py).
SINK_BATCH_SIZE = 262144
# kafka.transaction.timeout.ms unless given, with kafka.transactional.id: a task is one
# transaction, and at the producer's 60 s a slow task would be aborted by the coordinator on
# every attempt. 15 min is the brokers' default ceiling (transaction.max.timeout.ms).
SINK_TRANSACTION_TIMEOUT_MS = 900000
# Kafka options the sink sets itself: keys and values are written as the bytes given.
REFUSED = {
    "key.serializer": "keys are written as given (string or binary)",
    "value.serializer": "values are written as given (string or binary)",
}


@dataclass(frozen=True)
class WriteSettings:
    """What a write task needs (picklable: Spark ships the writer to the executors)."""

    producer_config: dict[str, str]  # kcore/Java producer config: the ``kafka.*`` options
    topic: str | None  # the ``topic`` option (overrides the column)
    columns: frozenset[str]  # which of COLUMN_TYPES' columns the input has
    transactional_id_prefix: str | None  # ``kafka.transactional.id``: one transaction per task
    timeout_s: float  # bound on delivering a task's records (delivery.timeout.ms + slack)


def write_settings(options: Mapping[str, str], schema: StructType) -> WriteSettings:
    """Check ``options`` and ``schema``; raises ``ConfigError`` naming the option or column."""
    config = {k[len("kafka.") :]: str(v) for k, v in options.items() if k.startswith("kafka.")}
    if not config.get("bootstrap.servers"):
        raise ConfigError(
            "kafka.bootstrap.servers", "must be specified for configuring the Kafka producer"
        )
    for key, why in REFUSED.items():
        if key in config:
            raise ConfigError(f"kafka.{key}", f"is not supported: {why}")
    config.setdefault("batch.size", str(SINK_BATCH_SIZE))
    prefix = config.pop("transactional.id", None)
    if prefix:
        config.setdefault("transaction.timeout.ms", str(SINK_TRANSACTION_TIMEOUT_MS))
    try:  # every other producer key and value, as the producer will see them
        # Strict: a kafka.* option the sink's producer does not take is a mistake here.
        checked = ClientConfig(
            {**config, **({"transactional.id": prefix} if prefix else {}), STRICT_KEY: True},
            role="producer",
        )
    except ConfigError as exc:
        raise ConfigError(f"kafka.{exc.key}", exc.message) from None

    topic = options.get("topic")
    if topic is not None:
        topic = str(topic).strip()
        if not topic:
            raise ConfigError("topic", "is empty")
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise ConfigError("value", "required column 'value' not found")
    if topic is None and "topic" not in fields:
        raise ConfigError(
            "topic",
            "option required when no 'topic' column is present. "
            "Use the topic option for setting a topic.",
        )
    for name, allowed in COLUMN_TYPES.items():
        if name in fields and not any(_same_type(fields[name], t) for t in allowed):
            if name == "topic" and topic is not None:
                continue  # the option overrides the column, whatever its type
            raise ConfigError(
                name,
                f"column '{name}' has unsupported type {fields[name].simpleString()}; "
                f"it must be {' or '.join(t.simpleString() for t in allowed)}",
            )
    slack = 30.0  # beyond the producer's own bound: a stuck flush fails, never hangs
    return WriteSettings(
        producer_config=config,
        topic=topic,
        columns=frozenset(n for n in COLUMN_TYPES if n in fields),
        transactional_id_prefix=prefix,
        timeout_s=int(checked["delivery.timeout.ms"]) / 1000 + slack,
    )


def _same_type(a: DataType, b: DataType) -> bool:
    """Equal ignoring nullability and field name case (as the JVM's DataTypeUtils.sameType)."""
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return _same_type(a.elementType, b.elementType)
    if isinstance(a, StructType) and isinstance(b, StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name.lower() == y.name.lower() and _same_type(x.dataType, y.dataType)
            for x, y in zip(a.fields, b.fields, strict=True)
        )
    return a == b
