"""The read side of kcore's Spark data source: ``spark.read`` / ``spark.readStream`` with
``format("kcore")``, checked against the JVM Kafka connector's options, schema, offset ranges,
partition splitting, admission control and data-loss rules.

The option checks and planning functions run without a broker or Spark; the rest reads real
records from a real broker, through a real ``local[2]`` Spark (one session for the module).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyspark  # noqa: F401  (a dev dependency: missing means a broken setup, not a skip)
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from kcore.admin.client import AdminClient
from kcore.admin.types import NewTopic, TopicDescription
from kcore.errors import (
    ConfigError,
    KcoreError,
    LogTruncationError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from kcore.producer.client import Producer
from kcore.spark import range_reader
from kcore.spark.admission import delay_batch, rate_limit
from kcore.spark.batch_reader import KafkaBatchReader
from kcore.spark.clients import ClientPool
from kcore.spark.offsets import (
    OffsetRange,
    offsets_from_dict,
    offsets_to_dict,
    parse_assign,
    parse_partition_offsets,
    split_ranges,
)
from kcore.spark.options import parse_read_options, read_schema
from kcore.spark.range_reader import (
    KafkaInputPartition,
    _Judge,
    _read,
    _to_spark,
    arrow_schema,
    null_if_empty,
)
from kcore.spark.resolver import OffsetResolver
from kcore.spark.source import KcoreDataSource
from kcore.spark.stream_reader import KafkaStreamReader, plan_stream_batch
from kcore.types import TopicPartition

BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
# The produced records' timestamps start here (ms). Recent: the broker deletes records older
# than its retention (7 days) by their timestamps.
T0 = int(time.time() * 1000) - 3_600_000

# -- offsets JSON and range splitting (no broker, no Spark) --------------------------------------


def r(topic: str, start: int, end: int, partition: int = 1) -> OffsetRange:
    return OffsetRange(topic, partition, start, end)


def test_offsets_json_round_trip():
    text = '{"b":{"1":-1,"0":23},"a":{"0":-2}}'
    offsets = parse_partition_offsets(text, "startingOffsets")
    assert offsets == {
        TopicPartition("b", 1): -1,
        TopicPartition("b", 0): 23,
        TopicPartition("a", 0): -2,
    }
    # Sorted, as the JVM source writes them, so equal offsets are equal JSON text.
    assert json.dumps(offsets_to_dict(offsets)) == '{"a": {"0": -2}, "b": {"0": 23, "1": -1}}'
    assert offsets_from_dict(json.loads(json.dumps(offsets_to_dict(offsets)))) == offsets
    assert parse_assign('{"t":[0,2],"u":[1]}') == [
        TopicPartition("t", 0),
        TopicPartition("t", 2),
        TopicPartition("u", 1),
    ]


@pytest.mark.parametrize(
    "text", ["latest-ish", "[1]", '{"t":[0]}', '{"t":{"x":1}}', '{"t":{"0":1.5}}']
)
def test_bad_offsets_json_names_the_option(text):
    with pytest.raises(ConfigError, match="endingOffsets"):
        parse_partition_offsets(text, "endingOffsets")


def test_split_ranges_as_the_jvm_calculator():
    # Without options: one range per partition, empty ones dropped.
    assert split_ranges([r("t1", 1, 2), r("t2", 1, 1)]) == [r("t1", 1, 2)]
    # minPartitions: the KafkaOffsetRangeCalculatorSuite cases.
    assert split_ranges([r("t1", 1, 5)], 4) == [r("t1", i, i + 1) for i in range(1, 5)]
    assert split_ranges([r("t1", 1, 5), r("t2", 1, 21)], 4) == [
        r("t1", 1, 5),
        r("t2", 1, 7),
        r("t2", 7, 14),
        r("t2", 14, 21),
    ]
    assert split_ranges([r("t1", 1, 11)], 3) == [r("t1", 1, 4), r("t1", 4, 7), r("t1", 7, 11)]
    assert split_ranges([r("t1", 0, 10), r("t2", 0, 10), r("t3", 0, 1)], 6) == [
        r("t1", 0, 3),
        r("t1", 3, 6),
        r("t1", 6, 10),
        r("t2", 0, 3),
        r("t2", 3, 6),
        r("t2", 6, 10),
        r("t3", 0, 1),
    ]
    assert split_ranges([r("t1", 0, 500), r("t2", 0, 12000), r("t3", 0, 15001)], 6) == [
        r("t1", 0, 500),
        r("t2", 0, 6000),
        r("t2", 6000, 12000),
        r("t3", 0, 5000),
        r("t3", 5000, 10000),
        r("t3", 10000, 15001),
    ]
    assert split_ranges([r("t1", 1, 5), r("t2", 1, 21)], 1) == [r("t1", 1, 5), r("t2", 1, 21)]
    # maxRecordsPerPartition (SPARK-49259), alone and with minPartitions.
    assert split_ranges([r("t1", 1, 5)], None, 4) == [r("t1", 1, 5)]
    assert split_ranges([r("t1", 1, 6)], None, 4) == [r("t1", 1, 3), r("t1", 3, 6)]
    assert split_ranges([r("t1", 1, 40), r("t2", 1, 50), r("t3", 1, 60)], None, 20) == [
        r("t1", 1, 20),
        r("t1", 20, 40),
        r("t2", 1, 17),
        r("t2", 17, 33),
        r("t2", 33, 50),
        r("t3", 1, 20),
        r("t3", 20, 40),
        r("t3", 40, 60),
    ]
    assert split_ranges([r("t1", 1, 40)], 1, 20) == [r("t1", 1, 20), r("t1", 20, 40)]
    assert split_ranges([r("t1", 1, 40)], 4, 20) == [
        r("t1", 1, 10),
        r("t1", 10, 20),
        r("t1", 20, 30),
        r("t1", 30, 40),
    ]


def test_rate_limit_and_delay_as_the_jvm_source():
    a, b, c = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
    # 100 offsets over backlogs of 300 and 100 (and a new partition with 1): 3:1, and the tiny
    # one still gets its offset.
    ends = rate_limit(100, {a: 0, b: 50}, {a: 300, b: 150, c: 1}, {c: 0})
    assert ends == {a: 74, b: 74, c: 1}
    assert rate_limit(10, {a: 5}, {a: 5}, {}) == {a: 5}  # nothing waiting: unchanged
    # minOffsetsPerTrigger: wait while fewer are waiting, until maxTriggerDelay passed.
    assert delay_batch(10, {a: 5}, {a: 0}, 1000, last_trigger_ms=0, now_ms=10_000) == (
        False,
        10_000,
    )
    assert delay_batch(10, {a: 5}, {a: 0}, 1000, last_trigger_ms=9_500, now_ms=10_000) == (
        True,
        9_500,
    )
    assert delay_batch(10, {a: 15}, {a: 0}, 1000, last_trigger_ms=9_500, now_ms=10_000) == (
        False,
        10_000,
    )


# -- options (no broker, no Spark) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "streaming", "option"),
    [
        ({"kafka.bootstrap.servers": None}, False, "kafka.bootstrap.servers"),
        ({"subscribe": None}, False, "subscribe"),
        ({"assign": '{"t":[0]}'}, False, "subscribePattern"),
        ({"subscribe": " , "}, False, "subscribe"),
        ({"subscribe": None, "assign": "t"}, False, "assign"),
        ({"startingOffsets": "latest"}, False, "startingOffsets"),
        ({"startingOffsets": '{"t":{"0":-1}}'}, False, "startingOffsets"),
        ({"endingOffsets": "earliest"}, False, "endingOffsets"),
        ({"endingOffsets": '{"t":{"0":-2}}'}, False, "endingOffsets"),
        ({"endingOffsets": "latest"}, True, "endingOffsets"),
        ({"startingTimestamp": "soon"}, False, "startingTimestamp"),
        ({"kafka.auto.offset.reset": "earliest"}, True, "kafka.auto.offset.reset"),
        ({"kafka.key.deserializer": "x"}, False, "kafka.key.deserializer"),
        ({"kafka.value.deserializer": "x"}, False, "kafka.value.deserializer"),
        ({"kafka.enable.auto.commit": "true"}, False, "kafka.enable.auto.commit"),
        ({"kafka.interceptor.classes": "x"}, False, "kafka.interceptor.classes"),
        ({"kafka.linger.ms": "5"}, False, "kafka.linger.ms"),  # a producer setting
        ({"minPartitions": "0"}, False, "minPartitions"),
        ({"maxRecordsPerPartition": "ten"}, False, "maxRecordsPerPartition"),
        ({"failOnDataLoss": "yes"}, False, "failOnDataLoss"),
        ({"includeHeaders": "1"}, False, "includeHeaders"),
        ({"minOffsetsPerTrigger": "20", "maxOffsetsPerTrigger": "10"}, True, "minOffsetsPer"),
        ({"maxTriggerDelay": "5 fortnights"}, True, "maxTriggerDelay"),
        ({"startingOffsetsByTimestampStrategy": "maybe"}, True, "ByTimestampStrategy"),
        # A batch read has no progress to commit: refused rather than doing nothing.
        ({"commitOffsetsToGroup": "lag-report"}, False, "commitOffsetsToGroup"),
        ({"commitOffsetsToGroup": "  "}, True, "commitOffsetsToGroup"),
    ],
)
def test_bad_options_raise_config_error_naming_the_option(changes, streaming, option):
    options = {**BASE, **changes}
    options = {k: v for k, v in options.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        parse_read_options(options, streaming=streaming)
    assert option in str(info.value)


def test_options_are_case_insensitive_with_jvm_defaults():
    batch = parse_read_options(
        {"KAFKA.BOOTSTRAP.SERVERS": "h:1", "SubscribePattern": "a.*", "MINPARTITIONS": "3"},
        streaming=False,
    )
    assert batch.strategy.kind == "subscribePattern" and batch.min_partitions == 3
    assert (batch.starting.kind, batch.ending.kind) == ("earliest", "latest")
    assert batch.fail_on_data_loss and not batch.include_headers
    stream = parse_read_options({**BASE, "kafka.group.id": "g"}, streaming=True)
    assert stream.starting.kind == "latest"
    assert "group.id" not in stream.kafka_params  # ignored: partitions are assigned
    assert stream.max_trigger_delay_ms == 15 * 60 * 1000
    delay = parse_read_options({**BASE, "maxTriggerDelay": "30s"}, streaming=True)
    assert delay.max_trigger_delay_ms == 30_000
    # Consumer-only settings stay out of the driver's admin client.
    opts = parse_read_options({**BASE, "kafka.isolation.level": "read_committed"}, streaming=False)
    assert opts.admin_config() == {"bootstrap.servers": "127.0.0.1:1"}
    assert opts.consumer_config()["isolation.level"] == "read_committed"
    assert opts.consumer_config()["auto.offset.reset"] == "none"
    # As Java, the isolation level in any case.
    upper = parse_read_options({**BASE, "kafka.isolation.level": "READ_COMMITTED"}, streaming=False)
    assert upper.isolation_level == "read_committed"
    assert upper.consumer_config()["isolation.level"] == "read_committed"
    # Off unless asked for; the group id as given, around spaces left out.
    assert stream.commit_offsets_to_group is None
    lag = parse_read_options({**BASE, "COMMITOFFSETSTOGROUP": " lag-report "}, streaming=True)
    assert lag.commit_offsets_to_group == "lag-report"


def test_group_id_and_group_id_prefix_are_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="kcore.spark"):
        opts = parse_read_options({**BASE, "groupIdPrefix": "mine"}, streaming=True)
    assert "groupIdPrefix is ignored" in caplog.text
    assert "group.id" not in opts.consumer_config()


def test_schema_follows_include_headers():
    assert read_schema(BASE).simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    with_headers = read_schema({**BASE, "INCLUDEHEADERS": "true"})
    assert with_headers.fields[-1].simpleString() == (
        "headers:array<struct<key:string,value:binary>>"
    )


def test_stream_planning_reports_data_loss():
    """A partition gone, or whose offsets went backwards: an error, or a warning and a skip."""
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    strict = parse_read_options(BASE, streaming=True)
    with pytest.raises(KcoreError, match="are gone.*failOnDataLoss"):
        plan_stream_batch(OffsetResolver(strict), strict, {a: 1, b: 1}, {a: 5})
    with pytest.raises(KcoreError, match="offset was changed from 9 to 5"):
        plan_stream_batch(OffsetResolver(strict), strict, {a: 9}, {a: 5})
    lenient = parse_read_options({**BASE, "failOnDataLoss": "false"}, streaming=True)
    assert plan_stream_batch(OffsetResolver(lenient), lenient, {a: 9, b: 1}, {a: 5}) == []


# -- the executor's range reader, with stand-ins for the consumer and the broker (no Spark) -----


def codec_batch(offsets: list[int], headers: list[Any] | None = None) -> pa.RecordBatch:
    """A batch shaped as the consumer's ``poll_arrow`` hands it out, for partition t-0."""
    n = len(offsets)
    columns: dict[str, Any] = {
        "key": pa.array([None] * n, pa.binary()),
        "value": pa.array([b"v%d" % o for o in offsets], pa.binary()),
        "offset": pa.array(offsets, pa.int64()),
        "timestamp": pa.array([T0] * n, pa.timestamp("ms", "UTC")),
        "timestampType": pa.array([0] * n, pa.int32()),
        "topic": pa.array(["t"] * n, pa.string()),
        "partition": pa.array([0] * n, pa.int32()),
    }
    if headers is not None:
        pair = pa.struct([("key", pa.string()), ("value", pa.binary())])
        columns["headers"] = pa.array(headers, pa.list_(pair))
    return pa.record_batch(columns)


def test_records_without_headers_have_null_headers():
    """As the JVM source: null, not an empty list; sliced batches too (the reader cuts them)."""
    target = arrow_schema(read_schema({"includeHeaders": "true"}))
    headers = [[("a", b"1")], [], [("b", None), ("c", b"3")], [], []]
    rb = codec_batch(list(range(5)), headers)
    out = _to_spark(rb, target)
    assert out.schema.equals(target)
    want = [
        [{"key": "a", "value": b"1"}],
        None,
        [{"key": "b", "value": None}, {"key": "c", "value": b"3"}],
        None,
        None,
    ]
    assert out.column("headers").to_pylist() == want
    sliced = _to_spark(rb.slice(1, 3), target)
    sliced.validate(full=True)
    assert sliced.column("headers").to_pylist() == want[1:4]
    # Nothing to null: the column as it is; an empty array stays empty.
    full = pa.array(
        [[("a", b"1")]], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    )
    assert null_if_empty(full) is full
    assert null_if_empty(full.slice(0, 0)).to_pylist() == []


class StandInConsumer:
    """``poll_arrow`` follows a script: n hands out the next n offsets, an exception is raised,
    None returns nothing (after a short wait, as a poll that times out)."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.pos = 0
        self.seeks: list[int] = []

    def assign(self, tps: list[TopicPartition]) -> None:
        pass

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos = offset
        self.seeks.append(offset)

    def position(self, tp: TopicPartition, timeout: float = 0) -> int:
        return self.pos

    def poll_arrow(self, timeout: float, max_records: int | None = None) -> pa.RecordBatch | None:
        step = self.script.pop(0) if self.script else None
        if isinstance(step, BaseException):
            raise step
        if not step:
            time.sleep(0.005)
            return None
        offsets = list(range(self.pos, self.pos + step))
        self.pos += step
        return codec_batch(offsets)


class StandInRead:
    """``_read`` of offsets [0, end) of t-0 with a stand-in consumer; the judge's view of the
    partition's offsets is ``available`` (counted in ``asked``), no broker is asked."""

    def __init__(self, script: list[Any], available: tuple[int, int], end: int = 5, **options):
        self.opts = parse_read_options({**BASE, **options}, streaming=False)
        self.tp = TopicPartition("t", 0)
        self.judge = _Judge(self.opts, self.tp, end)
        self.asked = 0

        def lookup() -> tuple[int, int]:
            self.asked += 1
            return available

        self.judge._available = lookup
        self.consumer = StandInConsumer(script)
        self.part = KafkaInputPartition("t", 0, 0, end)
        self.offsets: list[int] = []

    def run(self) -> list[int]:
        target = arrow_schema(read_schema(BASE))
        for rb in _read(self.consumer, self.tp, self.part, self.judge, target):
            self.offsets += rb.column("offset").to_pylist()
        return self.offsets


def truncation() -> LogTruncationError:
    tp = TopicPartition("t", 0)
    return LogTruncationError("t-0: the log was truncated", {tp: 2}, {tp: (1, 3)})


def test_log_truncation_is_always_data_loss(caplog):
    """Even where the partition's offsets now cover the position (it grew back after an
    unclean leader election): failOnDataLoss fails; false warns and reads on from there."""
    strict = StandInRead([2, truncation(), 3], available=(0, 100))
    with pytest.raises(KcoreError, match=r"truncated below offset 2.*offset 1.*failOnDataLoss"):
        strict.run()
    assert strict.offsets == [0, 1]
    lenient = StandInRead([2, truncation(), 3], available=(0, 100), failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, logger="kcore.spark"):
        assert lenient.run() == [0, 1, 2, 3, 4]
    assert "truncated below offset 2" in caplog.text
    assert lenient.consumer.seeks == [0, 2]  # the seek that ends the consumer's error state


def test_out_of_range_retries_count_only_without_progress():
    """A broker catching up: retried; four such errors fail only when nothing is read between
    them."""
    oor = OffsetOutOfRangeError
    spread = StandInRead([1, oor(), 1, oor(), 1, oor(), 1, oor(), 1], available=(0, 100))
    assert spread.run() == [0, 1, 2, 3, 4]
    in_a_row = StandInRead([1, oor(), oor(), oor(), oor(), 4], available=(0, 100))
    with pytest.raises(KcoreError, match="keeps being out of range"):
        in_a_row.run()


def test_a_stall_at_the_latest_offset_is_judged_after_the_poll_timeout(monkeypatch):
    """The broker says the partition ends at the reader's position (a new leader behind,
    KAFKA-7703): the reader polls on, for kafkaConsumer.pollTimeoutMs, before data loss."""
    monkeypatch.setattr(range_reader, "STALL_CHECK_S", 0.05)
    catching_up = StandInRead([2] + [None] * 40 + [3], available=(0, 2))
    assert catching_up.run() == [0, 1, 2, 3, 4]  # stalled ~0.2 s, judged more than once
    assert catching_up.asked >= 2
    started = time.monotonic()
    lost = StandInRead([2], available=(0, 2), **{"kafkaConsumer.pollTimeoutMs": "400"})
    with pytest.raises(KcoreError, match=r"Cannot fetch offset 2 .*failOnDataLoss"):
        lost.run()
    assert time.monotonic() - started >= 0.4
    skipped = StandInRead(
        [2], available=(0, 2), failOnDataLoss="false", **{"kafkaConsumer.pollTimeoutMs": "400"}
    )
    assert skipped.run() == [0, 1]


def test_a_stall_asks_the_broker_once_per_check():
    read = StandInRead([], available=(0, 2), **{"kafkaConsumer.pollTimeoutMs": "1000"})
    assert read.judge.stalled(2, waited_s=0.5) == 2  # not yet: poll on
    assert read.asked == 1
    with pytest.raises(KcoreError, match="failOnDataLoss"):
        read.judge.stalled(2, waited_s=1.0)
    assert read.asked == 2
    inside = StandInRead([], available=(0, 9), **{"kafkaConsumer.pollTimeoutMs": "1000"})
    with pytest.raises(KcoreError, match="Cannot fetch record for offset 2"):
        inside.judge.stalled(2, waited_s=1.0)  # there, but not coming: a timeout
    assert inside.asked == 1


def test_an_early_closed_read_gives_its_consumer_back_for_reuse():
    """Spark's limit/take closes the reader's generator: its client is lent again, not
    closed; an exception still closes it."""
    made: list[SimpleNamespace] = []

    def make(config: dict[str, Any]) -> SimpleNamespace:
        client = SimpleNamespace(closed=False)
        client.close = lambda: setattr(client, "closed", True)
        made.append(client)
        return client

    pool: ClientPool[Any] = ClientPool(make, shared=False, idle_timeout_s=60)
    config = {"bootstrap.servers": "h:1"}

    def rows() -> Iterator[int]:
        with pool.lease(config):
            yield 1
            yield 2

    gen = rows()
    assert next(gen) == 1
    gen.close()
    with pool.lease(config) as client:
        assert client is made[0]
    assert len(made) == 1 and not made[0].closed
    with pytest.raises(RuntimeError), pool.lease(config):
        raise RuntimeError("the read failed")
    assert made[0].closed and len(pool) == 0


# -- which partitions a strategy covers, with a stand-in admin client (no broker) -------------


class StandInAdmin:
    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics

    def list_topics(self, *, include_internal: bool = False, timeout: float | None = None):
        return sorted(t for t in self.topics if include_internal or not t.startswith("__"))

    def describe_topics(self, names, *, timeout: float | None = None):
        return {
            n: TopicDescription(
                n,
                None,
                n.startswith("__"),
                [SimpleNamespace(partition=p) for p in range(self.topics[n])],
            )
            for n in names
        }

    def close(self) -> None:
        pass


TOPICS = {"events": 2, "old-events-2": 1, "other": 1, "__consumer_offsets": 3}


def covered(**options: str) -> set[tuple[str, int]]:
    opts = parse_read_options(
        {"kafka.bootstrap.servers": "h:1", "fetchOffset.numRetries": "1", **options},
        streaming=False,
    )
    resolver = OffsetResolver(opts)
    resolver._admin = StandInAdmin(TOPICS)
    return {(tp.topic, tp.partition) for tp in resolver.topic_partitions()}


def test_subscribe_pattern_is_found_anywhere_in_the_name():
    """Spark's rule (findFirstIn, since 3.4): not a whole-name match; ^...$ anchors it."""
    assert covered(subscribePattern="events") == {("events", 0), ("events", 1), ("old-events-2", 0)}
    assert covered(subscribePattern="^events$") == {("events", 0), ("events", 1)}
    assert covered(subscribePattern="consumer") == set()  # internal topics are not read


def test_internal_topics_are_never_read():
    assert covered(subscribe="events,__consumer_offsets") == {("events", 0), ("events", 1)}
    assign = json.dumps({"events": [1, 7], "__consumer_offsets": [0]})
    assert covered(assign=assign) == {("events", 1)}


def test_a_named_topic_that_does_not_exist_fails():
    """As the JVM source (describeTopics fails): a typo is an error, not an empty read."""
    with pytest.raises(UnknownTopicOrPartitionError, match="subscribe: topic 'evnts' does not"):
        covered(subscribe="events,evnts")
    with pytest.raises(UnknownTopicOrPartitionError, match="assign: topics 'a', 'b' do not"):
        covered(assign=json.dumps({"a": [0], "events": [0], "b": [1]}))


# -- against a broker ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("kcore-spark-read")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(KcoreDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def bootstrap(kafka_cluster) -> str:
    return kafka_cluster.bootstrap_servers


@pytest.fixture(scope="module")
def admin(bootstrap) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": bootstrap}) as client:
        yield client


def new_topic(admin: AdminClient, partitions: int, prefix: str = "read") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, 1)])
    return name


def produce(bootstrap: str, records: list[dict[str, Any]], **config: Any) -> None:
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config}) as producer:
        futures = [producer.send(**rec) for rec in records]
        producer.flush(30)
        for f in futures:
            f.result(30)


def sample(topic: str, partitions: int, count: int) -> list[dict[str, Any]]:
    """Records with keys (some null), values (some null), headers (some) and set timestamps:
    record i goes to partition i % partitions with timestamp T0 + i seconds."""
    out = []
    for i in range(count):
        out.append(
            {
                "topic": topic,
                "value": None if i % 7 == 3 else f"v{i}".encode(),
                "key": None if i % 3 == 0 else f"k{i}".encode(),
                "partition": i % partitions,
                "timestamp_ms": T0 + i * 1000,
                "headers": [("h", f"{i}".encode()), ("empty", None)] if i % 4 == 0 else None,
            }
        )
    return out


def expected_rows(records: list[dict[str, Any]], partitions: int, headers: bool) -> set:
    """What the source must return for ``sample``: offsets count up per partition."""
    out = set()
    for i, rec in enumerate(records):
        row = (
            rec["key"],
            rec["value"],
            rec["topic"],
            rec["partition"],
            i // partitions,
            rec["timestamp_ms"],
            0,  # CreateTime
        )
        if headers:  # no headers: null, as the JVM source gives (not an empty list)
            row += (tuple(rec["headers"]) if rec["headers"] else None,)
        out.add(row)
    return out


def as_tuples(rows) -> set:
    out = set()
    for row in rows:
        t = (
            row.key,
            row.value,
            row.topic,
            row.partition,
            row.offset,
            # Spark returns naive local datetimes; back to epoch milliseconds.
            round(row.timestamp.timestamp() * 1000),
            row.timestampType,
        )
        if "headers" in row.__fields__:
            t += (None if row.headers is None else tuple((h.key, h.value) for h in row.headers),)
        out.add(t)
    return out


def load(spark, bootstrap: str, **options: str):
    reader = spark.read.format("kcore").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


@pytest.fixture(scope="module")
def sampled(admin, bootstrap) -> tuple[str, list[dict[str, Any]]]:
    """A 3-partition topic holding ``sample(topic, 3, 60)``."""
    topic = new_topic(admin, 3)
    records = sample(topic, 3, 60)
    produce(bootstrap, records)
    return topic, records


@pytest.mark.slow
def test_batch_read_returns_what_was_sent(spark, bootstrap, sampled):
    topic, records = sampled
    df = load(spark, bootstrap, subscribe=topic, includeHeaders="true")
    assert df.schema == read_schema({"includeHeaders": "true"})
    assert as_tuples(df.collect()) == expected_rows(records, 3, headers=True)
    plain = load(spark, bootstrap, assign=json.dumps({topic: [0, 1, 2]}))
    assert "headers" not in plain.columns
    assert as_tuples(plain.collect()) == expected_rows(records, 3, headers=False)


@pytest.mark.slow
def test_offset_ranges_and_timestamps_are_honoured(spark, bootstrap, sampled):
    topic, records = sampled
    want = expected_rows(records, 3, headers=False)
    df = load(
        spark,
        bootstrap,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 2, "1": -2, "2": -2}}),
        endingOffsets=json.dumps({topic: {"0": 5, "1": -1, "2": 3}}),
    )
    got = {(row.partition, row.offset) for row in df.collect()}
    assert got == {(0, 2), (0, 3), (0, 4)} | {(1, o) for o in range(20)} | {(2, 0), (2, 1), (2, 2)}
    # Timestamps: record i has T0 + i s; [T0 + 10 s, T0 + 40 s) is records 10..39.
    df = load(
        spark,
        bootstrap,
        subscribePattern=topic.replace("-", "."),
        startingTimestamp=str(T0 + 10_000),
        endingOffsetsByTimestamp=json.dumps({topic: {str(p): T0 + 40_000 for p in range(3)}}),
    )
    assert as_tuples(df.collect()) == {w for w in want if T0 + 10_000 <= w[5] < T0 + 40_000}
    # No offset at or after the timestamp: an error, or latest with the "latest" strategy.
    late = {"subscribe": topic, "startingTimestamp": str(T0 + 10**9)}
    with pytest.raises(Exception, match="no offset matched"):
        load(spark, bootstrap, **late).collect()
    assert load(spark, bootstrap, **late, startingOffsetsByTimestampStrategy="latest").count() == 0


@pytest.mark.slow
def test_min_partitions_and_max_records_split_the_read(spark, bootstrap, sampled):
    topic, records = sampled
    want = expected_rows(records, 3, headers=False)
    df = load(spark, bootstrap, subscribe=topic, minPartitions="7")
    assert df.rdd.getNumPartitions() == 6  # round(20 / 60 * 7) = 2 pieces per partition
    assert as_tuples(df.collect()) == want
    df = load(spark, bootstrap, subscribe=topic, maxRecordsPerPartition="6")
    assert df.rdd.getNumPartitions() == 12  # ceil(20 / 6) = 4 pieces per partition
    assert as_tuples(df.collect()) == want


@pytest.mark.slow
def test_bad_options_fail_the_load(spark, bootstrap, sampled):
    topic, _ = sampled
    with pytest.raises(Exception, match="startingOffsets"):
        load(spark, bootstrap, subscribe=topic, startingOffsets="latest").collect()
    with pytest.raises(Exception, match="must name every partition"):
        partial = json.dumps({topic: {"0": 0}})
        load(spark, bootstrap, subscribe=topic, startingOffsets=partial).collect()
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format("kcore").schema("value binary").option(
            "kafka.bootstrap.servers", bootstrap
        ).option("subscribe", topic).load().collect()


@pytest.mark.slow
def test_a_topic_that_does_not_exist_fails_batch_and_stream_reads(spark, bootstrap, sampled):
    """A typo in subscribe is an error naming the topic, as in the JVM source: not an empty
    DataFrame."""
    topic, _ = sampled
    missing = f"{topic}-typo"
    options = {"subscribe": f"{topic},{missing}", "fetchOffset.numRetries": "1"}
    with pytest.raises(Exception, match=f"subscribe: topic '{missing}' does not exist"):
        load(spark, bootstrap, **options).collect()
    stream_options = {"kafka.bootstrap.servers": bootstrap, **options}
    reader = KafkaStreamReader(stream_options, read_schema(stream_options))
    try:
        with pytest.raises(UnknownTopicOrPartitionError, match=missing):
            reader.initialOffset()
    finally:
        reader.stop()


def read_direct(options: dict[str, str]) -> list[Any]:
    """The batch reader's partitions and reads, called as Spark's workers call them."""
    reader = KafkaBatchReader(options, read_schema(options))
    return [batch for part in reader.partitions() for batch in reader.read(part)]


@pytest.mark.slow
def test_reader_yields_arrow_record_batches_typed_for_spark(bootstrap, sampled):
    topic, records = sampled
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "includeHeaders": "true"}
    batches = read_direct(options)
    assert batches and all(isinstance(b, pa.RecordBatch) for b in batches)
    # Exactly the schema Spark's worker checks batches against.
    target = to_arrow_schema(read_schema(options), timezone="UTC")
    assert all(b.schema.equals(target) for b in batches)
    assert sum(b.num_rows for b in batches) == len(records)
    table = pa.Table.from_batches(batches)
    first = table.filter(pc.equal(table["offset"], 0)).sort_by("partition")
    assert first["timestamp"].to_pylist()[0].timestamp() * 1000 == T0
    assert first["headers"].to_pylist() == [
        [{"key": "h", "value": b"0"}, {"key": "empty", "value": None}],
        None,  # records 1 and 2 have no headers
        None,
    ]


@pytest.mark.slow
def test_transaction_markers_and_aborted_records_end_the_read(admin, bootstrap):
    """The last offsets of a range may be invisible (a commit marker, an aborted transaction
    under read_committed): the read stops at the consumer's position, it does not wait."""
    topic = new_topic(admin, 1, "txn")
    config = {"bootstrap.servers": bootstrap, "transactional.id": f"t-{topic}"}
    with Producer(config) as producer:
        producer.init_transactions()
        for commit in (True, False):
            producer.begin_transaction()
            for i in range(5):
                producer.send(topic, f"{commit}-{i}".encode(), partition=0)
            producer.flush(30)  # written, even those aborted next
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic}
    started = time.monotonic()
    committed = read_direct({**options, "kafka.isolation.level": "read_committed"})
    uncommitted = read_direct(options)
    assert time.monotonic() - started < 10
    values = [v for b in committed for v in b.column("value").to_pylist()]
    assert values == [f"True-{i}".encode() for i in range(5)]
    assert sum(b.num_rows for b in uncommitted) == 10  # markers are skipped, aborted are read


@pytest.mark.slow
def test_deleted_offsets_are_data_loss(kafka_cluster, admin, bootstrap, tmp_path):
    """Offsets deleted (as retention does) before they were read: failOnDataLoss=true fails the
    read naming the option; false skips them with a warning and reads the rest."""
    topic = new_topic(admin, 1, "loss")
    produce(bootstrap, [{"topic": topic, "value": b"%d" % i, "partition": 0} for i in range(10)])
    spec = tmp_path / "delete.json"
    spec.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "offset": 4}]}))
    kafka_cluster.run_tool(
        "kafka-delete-records",
        "--bootstrap-server",
        bootstrap,
        "--offset-json-file",
        spec,
        check=True,
    )
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": json.dumps({topic: {"0": 1}}),
    }
    with pytest.raises(KcoreError, match=r"\[1, 4\).*failOnDataLoss"):
        read_direct(options)
    rest = read_direct({**options, "failOnDataLoss": "false"})
    assert [o for b in rest for o in b.column("offset").to_pylist()] == list(range(4, 10))
    # Offsets past the end of the partition (a topic recreated smaller, say): the same rules.
    beyond = {**options, "startingOffsets": json.dumps({topic: {"0": 20}})}
    beyond["endingOffsets"] = json.dumps({topic: {"0": 30}})
    with pytest.raises(KcoreError, match="failOnDataLoss"):
        read_direct(beyond)
    assert read_direct({**beyond, "failOnDataLoss": "false"}) == []


# -- streaming -----------------------------------------------------------------------------------


class Collector:
    """A foreachBatch sink keeping (batch id, rows) in memory (the driver runs it)."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[tuple[str, int, int, bytes]]]] = []
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        rows = [(r.topic, r.partition, r.offset, r.value) for r in df.collect()]
        with self.lock:
            self.batches.append((batch_id, rows))

    def rows(self) -> list[tuple[str, int, int, bytes]]:
        return [row for _, rows in self.batches for row in rows]


def run_available_now(spark, bootstrap: str, checkpoint: str, sink: Collector, **options: str):
    reader = spark.readStream.format("kcore").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the Trigger.AvailableNow query did not finish"
    assert query.exception() is None


@pytest.mark.slow
def test_stream_resumes_from_its_checkpoint_with_new_partitions_and_topics(
    spark, admin, bootstrap, tmp_path
):
    """Trigger.AvailableNow with maxOffsetsPerTrigger; then more records, a partition added and
    a new topic matching the pattern; the restarted query reads exactly the rest."""
    prefix = f"st{uuid.uuid4().hex[:6]}"
    first = new_topic(admin, 2, prefix)
    produce(
        bootstrap, [{"topic": first, "value": b"a%d" % i, "partition": i % 2} for i in range(40)]
    )
    checkpoint = os.fspath(tmp_path / "checkpoint")
    options = {
        "subscribePattern": f"{prefix}-.*",
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "15",
    }
    sink = Collector()
    run_available_now(spark, bootstrap, checkpoint, sink, **options)
    sizes = [len(rows) for _, rows in sink.batches if rows]
    assert sum(sizes) == 40 and max(sizes) <= 15 and len(sizes) >= 3, sizes

    admin.create_partitions({first: 3})
    second = new_topic(admin, 1, prefix)
    produce(
        bootstrap,
        [{"topic": first, "value": b"b%d" % i, "partition": i % 3} for i in range(12)]
        + [{"topic": second, "value": b"c%d" % i, "partition": 0} for i in range(5)],
    )
    sink2 = Collector()
    run_available_now(spark, bootstrap, checkpoint, sink2, **options)
    rows = sink.rows() + sink2.rows()
    keys = [(t, p, o) for t, p, o, _ in rows]
    assert len(keys) == len(set(keys)) == 40 + 12 + 5  # no duplicates, nothing lost
    assert {v for *_, v in sink2.rows()} == {b"b%d" % i for i in range(12)} | {
        b"c%d" % i for i in range(5)
    }
    assert {(t, p) for t, p, _ in keys} == {(first, 0), (first, 1), (first, 2), (second, 0)}
    with open(os.path.join(checkpoint, "offsets", str(max(b for b, _ in sink2.batches)))) as f:
        last = json.loads(f.read().splitlines()[-1])  # the JVM source's offset JSON
    assert last == {first: {"0": 24, "1": 24, "2": 4}, second: {"0": 5}}


@pytest.mark.slow
def test_stream_offsets_and_admission_control_on_the_driver(admin, bootstrap, sampled):
    """The stream reader's driver calls as Spark makes them: initial offsets, admission control
    with maxOffsetsPerTrigger and minOffsetsPerTrigger, partitions of a batch."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    topic, _ = sampled
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "30",
        "minOffsetsPerTrigger": "6",
        "maxTriggerDelay": "1h",
    }
    reader = KafkaStreamReader(options, read_schema(options))
    try:
        start = reader.initialOffset()
        assert start == {topic: {"0": 0, "1": 0, "2": 0}}
        assert reader.getDefaultReadLimit() == ReadMaxRows(30)
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert end == {topic: {"0": 10, "1": 10, "2": 10}}  # 30 split evenly
        assert reader.latestOffset(start, ReadAllAvailable()) == {
            topic: {"0": 20, "1": 20, "2": 20}
        }
        # 60 waiting, fewer than 100: the trigger waits (the delay of 1h has not passed since
        # the last batch) and returns the start, meaning no batch.
        options["minOffsetsPerTrigger"] = "100"
        del options["maxOffsetsPerTrigger"]
        reader.opts = parse_read_options(options, streaming=True)
        assert reader.latestOffset(start, ReadMinRows(100)) == start
        parts = reader.partitions(start, end)
        assert [(p.partition, p.start, p.end) for p in parts] == [
            (0, 0, 10),
            (1, 0, 10),
            (2, 0, 10),
        ]
        assert reader.partitions(end, end) == []
    finally:
        reader.stop()


# -- commitOffsetsToGroup ------------------------------------------------------------------------


def start_available_now(spark, bootstrap: str, checkpoint: str, sink, **options: str):
    reader = spark.readStream.format("kcore").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def kafka_tool_lag(kafka_cluster, group: str) -> dict[tuple[str, int], tuple[str, str, str]]:
    """(topic, partition) -> (CURRENT-OFFSET, LOG-END-OFFSET, LAG) as Kafka's own
    kafka-consumer-groups --describe prints them."""
    out = kafka_cluster.run_tool(
        "kafka-consumer-groups",
        "--bootstrap-server",
        kafka_cluster.bootstrap_servers,
        "--describe",
        "--group",
        group,
        check=True,
    ).stdout
    rows = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[0] == group and cells[2].isdigit():
            rows[(cells[1], int(cells[2]))] = (cells[3], cells[4], cells[5])
    return rows


@pytest.mark.slow
def test_stream_commits_its_progress_to_a_group(
    kafka_cluster, spark, admin, bootstrap, tmp_path, capsys
):
    """With commitOffsetsToGroup, lag tools see the query: after a Trigger.AvailableNow query
    of several batches the group's offsets are the ends of the partitions, with lag 0 in
    Kafka's kafka-consumer-groups and in kcore groups."""
    from kcore.cli import main

    topic, group = new_topic(admin, 3, "lag"), f"spark-lag-{uuid.uuid4().hex[:8]}"
    produce(
        bootstrap, [{"topic": topic, "value": b"%d" % i, "partition": i % 3} for i in range(30)]
    )
    sink = Collector()
    run_available_now(
        spark,
        bootstrap,
        os.fspath(tmp_path / "checkpoint"),
        sink,
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="12",
        commitOffsetsToGroup=group,
    )
    assert len(sink.rows()) == 30 and len([b for b in sink.batches if b[1]]) >= 3
    ends = {TopicPartition(topic, p): 10 for p in range(3)}
    assert admin.list_consumer_group_offsets(group) == ends
    assert kafka_tool_lag(kafka_cluster, group) == {(topic, p): ("10", "10", "0") for p in range(3)}
    capsys.readouterr()
    assert main(["groups", "-b", bootstrap, "-g", group, "--json"]) == 0
    (described,) = json.loads(capsys.readouterr().out)
    assert described["state"] == "Empty"  # committed to, never joined
    assert [(r["partition"], r["lag"]) for r in described["partitions"]] == [(0, 0), (1, 0), (2, 0)]


class FailingSink(Collector):
    """A foreachBatch sink that fails on one batch: Spark does not record it as done."""

    def __init__(self, failing_batch: int) -> None:
        super().__init__()
        self.failing_batch = failing_batch

    def __call__(self, df, batch_id: int) -> None:
        if batch_id == self.failing_batch:
            raise RuntimeError(f"the sink is down for batch {batch_id}")
        super().__call__(df, batch_id)


@pytest.mark.slow
def test_the_group_gets_only_batches_spark_has_recorded_as_done(spark, admin, bootstrap, tmp_path):
    """A query whose sink fails on its second batch: the group holds the end of the first
    batch, never the failed one's; restarted from its checkpoint, the query reruns the batch
    and the group reaches the end."""
    topic, group = new_topic(admin, 2, "lagfail"), f"spark-lag-{uuid.uuid4().hex[:8]}"
    produce(
        bootstrap, [{"topic": topic, "value": b"%d" % i, "partition": i % 2} for i in range(40)]
    )
    checkpoint = os.fspath(tmp_path / "checkpoint")
    options = {
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "10",
        "commitOffsetsToGroup": group,
    }
    sink = FailingSink(failing_batch=1)
    query = start_available_now(spark, bootstrap, checkpoint, sink, **options)
    with pytest.raises(Exception, match="the sink is down for batch 1"):
        query.awaitTermination(120)
    (first,) = [rows for batch_id, rows in sink.batches if batch_id == 0]
    first_end = {}
    for t, p, offset, _ in first:
        first_end[TopicPartition(t, p)] = max(first_end.get(TopicPartition(t, p), 0), offset + 1)
    assert sum(first_end.values()) == 10
    assert admin.list_consumer_group_offsets(group) == first_end

    rest = Collector()
    run_available_now(spark, bootstrap, checkpoint, rest, **options)
    assert len(first) + len(rest.rows()) == 40
    assert admin.list_consumer_group_offsets(group) == {
        TopicPartition(topic, 0): 20,
        TopicPartition(topic, 1): 20,
    }


@pytest.mark.slow
def test_a_group_with_active_members_gets_a_warning_and_the_query_goes_on(
    spark, admin, bootstrap, tmp_path, caplog
):
    """Someone really consumes with the group id: the broker refuses commits from outside the
    group. The reader warns naming the group; the query reads everything and the group keeps
    its member's offsets."""
    from conftest import read_records

    from kcore.consumer.client import Consumer

    topic, group = new_topic(admin, 1, "lagbusy"), f"spark-lag-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, [{"topic": topic, "value": b"%d" % i, "partition": 0} for i in range(6)])
    member_config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "commitOffsetsToGroup": group,
    }
    with Consumer(member_config) as member:
        member.subscribe([topic])
        assert len(read_records(member, 6, 60)) == 6  # joined, and read
        member.commit({(topic, 0): 2})
        # The driver's calls as Spark makes them: the commit is refused, with a warning.
        reader = KafkaStreamReader(options, read_schema(options))
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, reader.getDefaultReadLimit())
            with caplog.at_level(logging.WARNING, logger="kcore.spark"):
                reader.commit(end)
        finally:
            reader.stop()
        assert f"commitOffsetsToGroup: could not commit the query's offsets to group '{group}'" in (
            caplog.text
        )
        # And a real query: it ends normally with every record.
        sink = Collector()
        del options["kafka.bootstrap.servers"]
        run_available_now(spark, bootstrap, os.fspath(tmp_path / "checkpoint"), sink, **options)
        assert len(sink.rows()) == 6
        assert admin.list_consumer_group_offsets(group) == {TopicPartition(topic, 0): 2}


@pytest.mark.parametrize("reused", [True, False])
def test_a_reused_worker_freezes_its_heap_after_its_first_task_only(reused: bool) -> None:
    """pyspark's daemon collects garbage after every task of a reused worker: what the first
    task leaves (modules, pooled clients) is frozen once, what later tasks make is not. Run in a
    child process: freezing is process-wide."""
    code = (
        "import gc\n"
        "from kcore.spark import worker_heap\n"
        "worker_heap.after_task()\n"
        "first = gc.get_freeze_count()\n"
        "later = [[] for _ in range(1000)]\n"
        "worker_heap.after_task()\n"
        "print(first, gc.get_freeze_count())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REUSE_WORKER"}
    if reused:
        env["SPARK_REUSE_WORKER"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    first, then = map(int, out.stdout.split())
    assert first == then  # the second task's objects are not frozen
    assert (first > 1_000) if reused else (first == 0)
