"""The read options of the ``kcore`` source: the JVM Kafka source's names, defaults and checks,
parsed once into a :class:`ReadOptions` (picklable: it travels to the executors), and the
output schema.

Spark hands options over case-insensitively (keys lowercased); a bad option raises
:class:`~kcore.errors.ConfigError` naming it, as every kcore configuration error does.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kcore.config import ALIASES, CONFIG_DEFS, STRICT_KEY, ClientConfig, default_of
from kcore.errors import ConfigError
from kcore.types import TopicPartition

from .offsets import EARLIEST, LATEST, PartitionOffsets, parse_assign, parse_partition_offsets

__all__ = [
    "OffsetLimit",
    "ReadOptions",
    "Strategy",
    "check_schema",
    "parse_read_options",
    "read_schema",
]

log = logging.getLogger("kcore.spark")

STRATEGY_KEYS = ("assign", "subscribe", "subscribePattern")

# kafka.* keys the JVM source refuses, with why.
_REFUSED_KAFKA_KEYS = {
    "auto.offset.reset": (
        "not supported: set the source option 'startingOffsets' to 'earliest' or 'latest' to "
        "say where a new query starts; a restarted query resumes where it left off"
    ),
    "key.deserializer": (
        "not supported: keys are read as bytes; deserialize them with DataFrame operations"
    ),
    "value.deserializer": (
        "not supported: values are read as bytes; deserialize them with DataFrame operations"
    ),
    "enable.auto.commit": "not supported: the query tracks its offsets itself",
    "interceptor.classes": "not supported: interceptors could change what is read",
}

_ADMIN_KEYS = frozenset(d.name for d in CONFIG_DEFS if "admin" in d.roles)


def read_schema(options: Mapping[str, str]) -> StructType:
    """The JVM Kafka source's columns; ``headers`` only with ``includeHeaders`` true."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if _bool(_lower(options), "includeHeaders", False):
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


@dataclass(frozen=True)
class Strategy:
    """Which partitions are read: ``assign`` (``partitions``), ``subscribe`` (``topics``) or
    ``subscribePattern`` (``pattern``, a topic is read when it is found anywhere in the name)."""

    kind: Literal["assign", "subscribe", "subscribePattern"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    partitions: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True)
class OffsetLimit:
    """Where a read starts or ends: ``earliest``, ``latest``, ``offsets`` (per partition, -2/-1
    allowed), ``timestamps`` (per partition) or ``timestamp`` (one for all partitions).
    ``option`` is the option it came from, for error messages."""

    kind: Literal["earliest", "latest", "offsets", "timestamps", "timestamp"]
    option: str = ""
    offsets: PartitionOffsets = field(default_factory=dict)
    timestamp: int = -1


@dataclass(frozen=True)
class ReadOptions:
    strategy: Strategy
    starting: OffsetLimit
    ending: OffsetLimit  # batch only; streaming reads have no end
    kafka_params: dict[str, str]  # the kafka.* options, prefix removed (group.id dropped)
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    poll_timeout_ms: int = 120_000
    fetch_offset_num_retries: int = 3
    fetch_offset_retry_interval_ms: int = 1000
    no_match_strategy: Literal["error", "latest"] = "error"
    # Streaming only: the consumer group each completed micro-batch's end offsets are committed
    # to, for lag tools (the group is committed to from outside, never joined).
    commit_offsets_to_group: str | None = None

    def admin_config(self) -> dict[str, str]:
        """The kafka.* settings an admin client takes (the consumer-only ones left out, where
        Java's admin client would ignore them with a warning)."""
        return {k: v for k, v in self.kafka_params.items() if ALIASES.get(k, k) in _ADMIN_KEYS}

    def consumer_config(self) -> dict[str, str]:
        """The executors' consumer: assigned partitions only, and no position of its own, so
        that an offset that is gone shows up as an error rather than a silent reset."""
        return {
            # A pooled consumer's last fetch may still be waiting at the broker when the next
            # task borrows it, and holds that task's first fetch up as long: keep it short.
            "fetch.max.wait.ms": "100",
            **self.kafka_params,
            "auto.offset.reset": "none",
            "enable.auto.commit": "false",
            "allow.auto.create.topics": "false",  # a topic deleted mid-query is not re-created
        }

    @property
    def isolation_level(self) -> str:
        return self.kafka_params.get("isolation.level", default_of("isolation.level"))


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    # Spark's CaseInsensitiveDict already lowercases; a plain dict (tests, direct use) may not.
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(name, f"must be true or false, got {raw!r}")
    return value == "true"


def _int(opts: Mapping[str, str], name: str, *, positive: bool = False) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {raw!r}") from None
    if positive and value <= 0:
        raise ConfigError(name, f"must be positive, got {value}")
    return value


_TIME_UNITS_MS = {
    "us": 0.001,
    "micros": 0.001,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}


def _duration_ms(opts: Mapping[str, str], name: str, default: str) -> int:
    """A Spark time string (``15m``, ``30s``, ``500ms``; no unit means ms)."""
    raw = opts.get(name.lower(), default)
    m = re.fullmatch(r"(-?\d+)\s*([a-z]+)?", raw.strip().lower())
    if m is None or (m.group(2) or "ms") not in _TIME_UNITS_MS:
        raise ConfigError(name, f"must be a duration such as 15m, 30s or 500ms, got {raw!r}")
    return int(int(m.group(1)) * _TIME_UNITS_MS[m.group(2) or "ms"])


def _strategy(opts: Mapping[str, str]) -> Strategy:
    given = [k for k in STRATEGY_KEYS if k.lower() in opts]
    if len(given) != 1:
        which = "One" if not given else "Only one"
        raise ConfigError(
            "/".join(STRATEGY_KEYS),
            f"{which} of the options {', '.join(STRATEGY_KEYS)} must be specified",
        )
    kind = given[0]
    value = opts[kind.lower()]
    if kind == "assign":
        return Strategy("assign", partitions=tuple(parse_assign(value)))
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise ConfigError("subscribe", f"no topics to subscribe to in {value!r}")
        return Strategy("subscribe", topics=topics)
    pattern = value.strip()
    if not pattern:
        raise ConfigError("subscribePattern", f"the pattern is empty: {value!r}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError("subscribePattern", f"not a valid regular expression: {exc}") from None
    return Strategy("subscribePattern", pattern=pattern)


def _offset_limit(
    opts: Mapping[str, str], prefix: Literal["starting", "ending"], default: str
) -> OffsetLimit:
    """In the JVM source's order of preference: a global timestamp, timestamps per partition,
    then offsets (``earliest``, ``latest`` or JSON)."""
    ts_key, by_ts_key, off_key = (
        f"{prefix}Timestamp",
        f"{prefix}OffsetsByTimestamp",
        f"{prefix}Offsets",
    )
    if ts_key.lower() in opts:
        raw = opts[ts_key.lower()].strip()
        try:
            ts = int(raw)
        except ValueError:
            raise ConfigError(ts_key, f"expected a single long value, got {raw!r}") from None
        if ts < 0:
            raise ConfigError(ts_key, f"must be a timestamp >= 0, got {ts}")
        return OffsetLimit("timestamp", ts_key, timestamp=ts)
    if by_ts_key.lower() in opts:
        stamps = parse_partition_offsets(opts[by_ts_key.lower()], by_ts_key)
        bad = [f"{tp.topic}-{tp.partition}" for tp, ts in stamps.items() if ts < 0]
        if bad:
            raise ConfigError(by_ts_key, f"timestamps must be >= 0 (not for {', '.join(bad)})")
        return OffsetLimit("timestamps", by_ts_key, offsets=stamps)
    raw = opts.get(off_key.lower(), default).strip()
    if raw.lower() in ("earliest", "latest"):
        return OffsetLimit("earliest" if raw.lower() == "earliest" else "latest", off_key)
    offsets = parse_partition_offsets(raw, off_key)
    bad = [f"{tp.topic}-{tp.partition}" for tp, off in offsets.items() if off < EARLIEST]
    if bad:
        raise ConfigError(
            off_key, f"offsets must be >= 0, or -2 (earliest) or -1 (latest): {', '.join(bad)}"
        )
    return OffsetLimit("offsets", off_key, offsets=offsets)


def _check_batch_limits(starting: OffsetLimit, ending: OffsetLimit) -> None:
    if starting.kind == "latest":
        raise ConfigError(starting.option, "can't be latest for batch queries")
    for tp, off in starting.offsets.items() if starting.kind == "offsets" else ():
        if off == LATEST:
            raise ConfigError(
                starting.option, f"{tp.topic}-{tp.partition} can't be latest (-1) in batch queries"
            )
    if ending.kind == "earliest":
        raise ConfigError(ending.option, "can't be earliest for batch queries")
    for tp, off in ending.offsets.items() if ending.kind == "offsets" else ():
        if off == EARLIEST:
            raise ConfigError(
                ending.option, f"{tp.topic}-{tp.partition} can't be earliest (-2) in batch queries"
            )


def _kafka_params(opts: Mapping[str, str]) -> dict[str, str]:
    params = {k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")}
    for key, why in _REFUSED_KAFKA_KEYS.items():
        if key in params:
            raise ConfigError(f"kafka.{key}", why)
    if "bootstrap.servers" not in params:
        raise ConfigError("kafka.bootstrap.servers", "must be specified to reach Kafka")
    if params.pop("group.id", None) is not None:
        # The JVM source warns too; kcore reads with assigned partitions, so no group is joined.
        log.warning(
            "kafka.group.id is ignored: the kcore source assigns partitions itself and "
            "joins no consumer group"
        )
    if "isolation.level" in params:  # Java takes the value in any case (READ_COMMITTED)
        params["isolation.level"] = params["isolation.level"].strip().lower()
    try:
        # Strict: a kafka.* option the source's consumer does not take is a mistake here.
        ClientConfig({**params, STRICT_KEY: True}, role="consumer")
    except ConfigError as exc:
        raise ConfigError(f"kafka.{exc.key}", exc.message) from None
    return params


def _commit_group(opts: Mapping[str, str], streaming: bool) -> str | None:
    """``commitOffsetsToGroup``: a group id, for streaming reads only (a batch read has no
    progress to commit, so the option there would silently do nothing)."""
    raw = opts.get("commitoffsetstogroup")
    if raw is None:
        return None
    if not streaming:
        raise ConfigError(
            "commitOffsetsToGroup",
            "only for streaming queries: a batch read keeps no progress to commit to a group",
        )
    group = raw.strip()
    if not group:
        raise ConfigError("commitOffsetsToGroup", f"must be a consumer group id, got {raw!r}")
    return group


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check ``options`` as the JVM source does for a batch or a streaming read."""
    opts = _lower(options)
    if streaming:
        for key in ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"):
            if key.lower() in opts:
                raise ConfigError(key, "not valid in streaming queries (a stream has no end)")
        starting = _offset_limit(opts, "starting", "latest")
        ending = OffsetLimit("latest", "endingOffsets")
    else:
        starting = _offset_limit(opts, "starting", "earliest")
        ending = _offset_limit(opts, "ending", "latest")
        _check_batch_limits(starting, ending)
        for key in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
            if key.lower() in opts:
                log.warning("%s option ignored in batch queries", key)
    strategy = _strategy(opts)
    if "groupidprefix" in opts:
        # The JVM source names its consumer group with it; kcore's readers join no group.
        log.warning("groupIdPrefix is ignored: the kcore source joins no consumer group")
    min_partitions = _int(opts, "minPartitions", positive=True)
    max_records = _int(opts, "maxRecordsPerPartition", positive=True)
    kafka_params = _kafka_params(opts)
    max_per_trigger = _int(opts, "maxOffsetsPerTrigger", positive=True)
    min_per_trigger = _int(opts, "minOffsetsPerTrigger", positive=True)
    if max_per_trigger is not None and min_per_trigger is not None:
        if min_per_trigger > max_per_trigger:
            raise ConfigError(
                "minOffsetsPerTrigger",
                f"{min_per_trigger} is higher than maxOffsetsPerTrigger ({max_per_trigger})",
            )
    strategy_name = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy_name not in ("error", "latest"):
        raise ConfigError(
            "startingOffsetsByTimestampStrategy", f"must be error or latest, got {strategy_name!r}"
        )
    commit_group = _commit_group(opts, streaming)
    poll_timeout = _int(opts, "kafkaConsumer.pollTimeoutMs", positive=True)
    retries = _int(opts, "fetchOffset.numRetries", positive=True)
    interval = _int(opts, "fetchOffset.retryIntervalMs")
    if interval is not None and interval < 0:
        raise ConfigError("fetchOffset.retryIntervalMs", f"must be >= 0, got {interval}")
    return ReadOptions(
        strategy=strategy,
        starting=starting,
        ending=ending,
        kafka_params=kafka_params,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        min_partitions=min_partitions,
        max_records_per_partition=max_records,
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_duration_ms(opts, "maxTriggerDelay", "15m"),
        poll_timeout_ms=poll_timeout if poll_timeout is not None else 120_000,
        fetch_offset_num_retries=retries if retries is not None else 3,
        fetch_offset_retry_interval_ms=interval if interval is not None else 1000,
        no_match_strategy="latest" if strategy_name == "latest" else "error",
        commit_offsets_to_group=commit_group,
    )


def check_schema(schema: Any, options: Mapping[str, str]) -> None:
    """The source's schema is fixed (as the JVM source's): a user-given one must be it."""
    expected = read_schema(options)
    if isinstance(schema, StructType) and schema != expected:
        raise ConfigError(
            "schema",
            f"the kcore source has a fixed schema ({expected.simpleString()}) and cannot be "
            f"read with another ({schema.simpleString()})",
        )
