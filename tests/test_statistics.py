"""librdkafka's statistics (statistics.interval.ms, stats_cb) against a real broker: the JSON
checked field by field against a known workload, the callback's thread, drops and failures,
and librdkafka itself (confluent-kafka) as the oracle of the document's shape."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer

import kcore
from kcore.admin import NewTopic
from kcore.consumer.core import ConsumerCore
from kcore.metrics import WindowStats
from kcore.producer.core import ProducerCore

INTERVAL_MS = 100
WAIT_S = 30.0


class StatsSink:
    """What stats_cb was given: each document, parsed, with the thread that got it."""

    def __init__(self) -> None:
        self.documents: list[dict[str, Any]] = []
        self.threads: set[str] = set()
        self.loop_running: list[bool] = []
        self._cond = threading.Condition()

    def __call__(self, text: str) -> None:
        assert isinstance(text, str)
        document = json.loads(text)
        try:
            asyncio.get_running_loop()
            running = True
        except RuntimeError:
            running = False
        with self._cond:
            self.documents.append(document)
            self.threads.add(threading.current_thread().name)
            self.loop_running.append(running)
            self._cond.notify_all()

    def wait_for(self, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first document from now on that ``wanted`` accepts."""
        deadline = time.monotonic() + WAIT_S
        with self._cond:
            seen = len(self.documents)
            while True:
                for document in self.documents[seen:]:
                    if wanted(document):
                        return document
                seen = len(self.documents)
                left = deadline - time.monotonic()
                assert left > 0, f"no such statistics document; the last: {self.last()}"
                self._cond.wait(left)

    def last(self) -> dict[str, Any] | None:
        return self.documents[-1] if self.documents else None


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"stats-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])
    return name


def _stats(bootstrap: str, sink: Any, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "statistics.interval.ms": INTERVAL_MS,
        "stats_cb": sink,
        **extra,
    }


def _partition(document: dict[str, Any], topic: str, partition: int) -> dict[str, Any]:
    return document.get("topics", {}).get(topic, {}).get("partitions", {}).get(str(partition), {})


def test_window_stats_cover_one_interval():
    window = WindowStats()
    assert window.take() == dict.fromkeys(
        ("min", "max", "avg", "sum", "cnt", "p50", "p75", "p90", "p95", "p99", "p99_99"), 0
    )
    for value in range(1, 101):  # 1..100, in any order
        window.record(101 - value)
    taken = window.take()
    assert (taken["min"], taken["max"], taken["sum"], taken["cnt"], taken["avg"]) == (
        1, 100, 5050, 100, 50,
    )  # fmt: skip
    assert (taken["p50"], taken["p90"], taken["p99"], taken["p99_99"]) == (50, 90, 99, 100)
    assert window.take()["cnt"] == 0  # the next interval starts empty


def test_nothing_is_counted_with_statistics_off():
    """The default (0): no reporter, and none of the statistics' counters is kept, so the
    request, delivery and commit paths do not pay for them."""
    producer = ProducerCore({"bootstrap.servers": "127.0.0.1:9092"})
    assert producer.cluster.statistics is None and producer.sender.delivered is None
    assert producer.cluster.connections.statistics() == []
    assert producer.cluster.connections.bootstrap_counters("127.0.0.1", 9092) is None
    consumer = ConsumerCore({"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"})
    assert consumer.cluster.statistics is None
    assert consumer.group is not None and consumer.group.offsets.known_committed is None
    on = ProducerCore(
        {"bootstrap.servers": "127.0.0.1:9092", "statistics.interval.ms": 1000, "stats_cb": print}
    )
    assert on.cluster.statistics is not None and on.sender.delivered == {}


# -- the producer ----------------------------------------------------------------------------------


def test_producer_statistics_count_the_records_sent(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 2)
    sink = StatsSink()
    key, value = b"k" * 10, b"v" * 90
    with kcore.Producer(_stats(bs, sink, **{"client.id": "stats-test"})) as producer:
        futures = [producer.send(topic, value, key, partition=0) for _ in range(300)]
        futures += [producer.send(topic, value, key, partition=1) for _ in range(200)]
        producer.flush(30)
        assert all(f.result(0) is not None for f in futures)
        doc = sink.wait_for(lambda d: d.get("txmsgs") == 500 and d["msg_cnt"] == 0)

    assert doc["type"] == "producer" and doc["client_id"] == "stats-test"
    assert doc["name"].startswith("stats-test#producer-")
    assert doc["ts"] > 0 and doc["age"] > 0 and abs(doc["time"] - time.time()) < 3600
    p0, p1 = _partition(doc, topic, 0), _partition(doc, topic, 1)
    assert (p0["txmsgs"], p1["txmsgs"]) == (300, 200)
    assert (p0["msgq_cnt"], p0["msgq_bytes"], doc["msg_size"]) == (0, 0, 0)
    # Batch bytes: every record's key and value, with the record and batch framing.
    assert p0["txbytes"] > 300 * (len(key) + len(value))
    assert p1["txbytes"] > 200 * (len(key) + len(value))
    assert doc["txmsg_bytes"] == p0["txbytes"] + p1["txbytes"]
    assert doc["msg_size_max"] == 33554432  # buffer.memory

    brokers = doc["brokers"]
    learned = [b for b in brokers.values() if b["source"] == "learned"]
    assert learned and all(b["name"] == f"{b['nodename']}/{b['nodeid']}" for b in learned)
    leader = next(b for b in learned if b["nodeid"] == p0["leader"])
    assert leader["state"] == "UP" and leader["connects"] >= 1 and leader["disconnects"] == 0
    assert leader["req"]["Produce"] >= 1 and leader["tx"] >= leader["req"]["Produce"]
    assert f"{topic}-0" in leader["toppars"] and p0["broker"] == p0["leader"]
    bootstrap = [b for b in brokers.values() if b["source"] == "configured"]
    assert bootstrap and bootstrap[0]["name"].endswith("/bootstrap")
    assert bootstrap[0]["req"]["Metadata"] >= 1 and bootstrap[0]["rx"] >= 1
    # The totals are the brokers' sums; each answered request has its round trip counted.
    assert doc["tx"] == sum(b["tx"] for b in brokers.values())
    assert doc["rx_bytes"] == sum(b["rxbytes"] for b in brokers.values())
    for b in brokers.values():
        rtt = b["rtt"]
        assert set(rtt) == {"min", "max", "avg", "sum", "cnt", "p50", "p75", "p90", "p95",
                            "p99", "p99_99"}  # fmt: skip
        assert rtt["min"] <= rtt["p50"] <= rtt["p99"] <= rtt["max"]
    # Idempotent by default: the producer id is assigned once.
    eos = doc["eos"]
    assert eos["idemp_state"] == "Assigned" and eos["producer_id"] >= 0
    assert eos["producer_epoch"] >= 0 and eos["epoch_cnt"] == 1 and "txn_state" not in eos

    # The callback ran on the reporter's thread, never on an event loop.
    assert all(name.startswith("kcore-stats-") for name in sink.threads)
    assert not any(sink.loop_running)


def test_closing_stops_the_statistics_and_a_raising_callback_changes_nothing(kafka_cluster, caplog):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    calls = []

    def failing(text: str) -> None:
        calls.append(json.loads(text))
        raise RuntimeError("the exporter is down")

    caplog.set_level(logging.ERROR, logger="kcore.statistics")
    producer = kcore.Producer(_stats(bs, failing))
    try:
        assert producer.send(topic, b"before").result(30).offset == 0
        deadline = time.monotonic() + WAIT_S
        while len(calls) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Logged each time, and the producer goes on.
        assert producer.send(topic, b"after").result(30).offset == 1
        assert any(
            r.exc_info and "the exporter is down" in str(r.exc_info[1]) for r in caplog.records
        )
        assert any("stats_cb" in r.getMessage() for r in caplog.records)
    finally:
        producer.close(10)
    after_close = len(calls)
    time.sleep(5 * INTERVAL_MS / 1000)
    assert len(calls) == after_close  # no document after close (as librdkafka's)


def test_a_slow_callback_holds_nothing_up_and_its_drops_are_counted(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    release = threading.Event()
    entered = threading.Event()

    def slow(text: str) -> None:
        entered.set()
        release.wait(60)

    with kcore.Producer(_stats(bs, slow, **{"statistics.interval.ms": 20})) as producer:
        try:
            assert entered.wait(WAIT_S)
            # The callback is stuck: records are still sent and acknowledged meanwhile.
            futures = [producer.send(topic, b"r%d" % i) for i in range(200)]
            producer.flush(30)
            assert [f.result(0).offset for f in futures] == list(range(200))
            deadline = time.monotonic() + WAIT_S
            while producer.metrics()["stats-callbacks-dropped-total"] < 3:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            release.set()


def test_transactional_producer_eos_state(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    sink = StatsSink()
    config = _stats(bs, sink, **{"transactional.id": f"stats-{uuid.uuid4().hex[:8]}"})
    with kcore.Producer(config) as producer:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.send(topic, b"in a transaction").result(30)
        inside = sink.wait_for(lambda d: d.get("eos", {}).get("txn_state") == "InTransaction")
        producer.commit_transaction(30)
        after = sink.wait_for(lambda d: d.get("eos", {}).get("txn_state") == "Ready")
    assert inside["eos"]["txn_may_enq"] is True and after["eos"]["txn_may_enq"] is False
    eos = after["eos"]
    assert eos["idemp_state"] == "Assigned" and eos["producer_id"] >= 0
    assert eos["producer_epoch"] >= 0 and eos["epoch_cnt"] >= 1
    assert eos["txn_stateage"] >= 0 and _partition(after, topic, 0)["txmsgs"] == 1
    # The transaction coordinator's connection is an entry of its own.
    assert any(
        b["source"] == "logical" and b["req"].get("EndTxn") == 1 for b in after["brokers"].values()
    )


# -- the consumer ----------------------------------------------------------------------------------


def test_consumer_statistics_lag_and_committed_offset(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    with kcore.Producer({"bootstrap.servers": bs}) as producer:
        for i in range(100):
            producer.send(topic, b"%03d" % i)
        producer.flush(30)
    sink = StatsSink()
    config = _stats(
        bs,
        sink,
        **{
            "group.id": f"stats-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        },  # fmt: skip
    )
    with kcore.Consumer(config) as consumer:
        consumer.assign([(topic, 0)])
        got: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 40:
            assert time.monotonic() < deadline
            got += consumer.poll(1.0, max_records=40 - len(got))
        assert consumer.position((topic, 0)) == 40
        before_commit = sink.wait_for(lambda d: _partition(d, topic, 0).get("hi_offset") == 100)
        consumer.commit()
        doc = sink.wait_for(lambda d: _partition(d, topic, 0).get("committed_offset") == 40)
        lag_metric = consumer.metrics()[f"records-lag{{topic={topic},partition=0}}"]
        assert lag_metric == 60 == consumer.current_lag((topic, 0))

    assert "consumer_lag" not in _partition(before_commit, topic, 0)  # nothing committed yet
    p = _partition(doc, topic, 0)
    assert p["app_offset"] == p["stored_offset"] == 40 and p["hi_offset"] == 100
    assert p["consumer_lag"] == 60 and p["consumer_lag_stored"] == 60
    assert p["next_offset"] >= 40 and p["fetch_state"] == "active" and "ls_offset" not in p
    assert doc["type"] == "consumer" and doc["rxmsgs"] == 40
    # (bytes are counted per fetched response poll has used up: maybe none of it yet)
    assert isinstance(doc["rxmsg_bytes"], int)
    assert doc["cgrp"]["assignment_size"] == 1


def test_group_statistics_count_rebalances(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 2)
    group = f"stats-{uuid.uuid4().hex[:8]}"
    sink = StatsSink()
    first = kcore.Consumer(_stats(bs, sink, **{"group.id": group}))
    try:
        first.subscribe([topic])
        _poll_until(lambda: len(first.assignment()) == 2, first)
        alone = sink.wait_for(lambda d: d["cgrp"]["assignment_size"] == 2)
        assert alone["cgrp"]["join_state"] == "steady" and alone["cgrp"]["state"] == "up"
        assert alone["cgrp"]["rebalance_cnt"] >= 1 and alone["cgrp"]["rebalance_age"] >= 0
        with kcore.Consumer({"bootstrap.servers": bs, "group.id": group}) as second:
            second.subscribe([topic])
            _poll_until(
                lambda: len(first.assignment()) == 1 and len(second.assignment()) == 1,
                first,
                second,
            )
            shared = sink.wait_for(lambda d: d["cgrp"]["assignment_size"] == 1)
        # The second member left: the first gets both partitions back.
        _poll_until(lambda: len(first.assignment()) == 2, first)
        again = sink.wait_for(lambda d: d["cgrp"]["assignment_size"] == 2)
    finally:
        first.close()
    counts = [d["cgrp"]["rebalance_cnt"] for d in (alone, shared, again)]
    assert counts[0] < counts[1] < counts[2]
    assert again["cgrp"]["rebalance_reason"]


def _poll_until(done: Callable[[], bool], *consumers: Any) -> None:
    deadline = time.monotonic() + 60
    while not done():
        assert time.monotonic() < deadline, "the group did not settle"
        for consumer in consumers:
            consumer.poll(0.2)


# -- the admin client and the asyncio clients ------------------------------------------------------


def test_admin_and_async_clients_report_too(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    sink = StatsSink()
    with kcore.AdminClient(_stats(bs, sink)) as admin:
        admin.list_topics()
        doc = sink.wait_for(lambda d: any(b["state"] == "UP" for b in d["brokers"].values()))
    assert doc["type"] == "admin" and "topics" not in doc

    topic = _topic(bs, 1)

    async def produce() -> dict[str, Any]:
        async_sink = StatsSink()
        async with kcore.AsyncProducer(_stats(bs, async_sink)) as producer:
            await (await producer.send(topic, b"x"))
            deadline = time.monotonic() + WAIT_S
            while not (async_sink.last() or {}).get("txmsgs"):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        assert not any(async_sink.loop_running)  # not on the caller's event loop
        return async_sink.documents[-1]

    assert asyncio.run(produce())["txmsgs"] == 1


# -- librdkafka's shape ----------------------------------------------------------------------------


def _shape_problems(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> list[str]:
    """Each key of ``ours`` must be one of ``theirs`` with a value of the same JSON type
    (nested objects compared by their own keys, where ``theirs`` has one to compare)."""
    problems = []
    for key, value in ours.items():
        if key not in theirs:
            problems.append(f"{where}.{key}: not a librdkafka field")
        elif type(value) is not type(theirs[key]):
            problems.append(
                f"{where}.{key}: {type(value).__name__}, librdkafka {type(theirs[key]).__name__}"
            )
    return problems


def _librdkafka_documents(make: Callable[[Callable[[str], None]], Any], wanted: Any) -> Any:
    found: list[dict[str, Any]] = []
    client = make(lambda text: found.append(json.loads(text)))
    deadline = time.monotonic() + WAIT_S
    try:
        while not any(wanted(d) for d in found):
            assert time.monotonic() < deadline, "librdkafka sent no such statistics"
            client.poll(0.1)
    finally:
        if hasattr(client, "close"):
            client.close()
        else:
            client.flush(10)
    return next(d for d in found if wanted(d))


def test_the_document_has_librdkafkas_shape(kafka_cluster):
    bs = kafka_cluster.bootstrap_servers
    topic = _topic(bs, 1)
    group = f"stats-{uuid.uuid4().hex[:8]}"

    def confluent_producer(cb: Callable[[str], None]) -> Any:
        producer = ConfluentProducer(
            {
                "bootstrap.servers": bs,
                "statistics.interval.ms": INTERVAL_MS,
                "stats_cb": cb,
                "enable.idempotence": True,
            }  # fmt: skip
        )
        producer.produce(topic, b"x")
        return producer

    def confluent_consumer(cb: Callable[[str], None]) -> Any:
        consumer = ConfluentConsumer(
            {
                "bootstrap.servers": bs,
                "statistics.interval.ms": INTERVAL_MS,
                "stats_cb": cb,
                "group.id": group,
                "auto.offset.reset": "earliest",
            }  # fmt: skip
        )
        consumer.subscribe([topic])
        return consumer

    def has_partition(d: dict[str, Any]) -> bool:
        if d["type"] == "producer":
            return bool(_partition(d, topic, 0)) and "eos" in d
        return _partition(d, topic, 0).get("hi_offset", -1) > 0 and "cgrp" in d

    their_producer = _librdkafka_documents(confluent_producer, has_partition)
    their_consumer = _librdkafka_documents(confluent_consumer, has_partition)

    sink = StatsSink()
    with kcore.Producer(_stats(bs, sink)) as producer:
        producer.send(topic, b"y").result(30)
        our_producer = sink.wait_for(lambda d: d.get("txmsgs") == 1 and "eos" in d)
    ours = {"group.id": group + "-kcore", "auto.offset.reset": "earliest"}
    with kcore.Consumer(_stats(bs, sink, **ours)) as consumer:
        consumer.subscribe([topic])
        _poll_until(lambda: len(consumer.assignment()) == 1, consumer)
        _poll_until(lambda: consumer.position((topic, 0), 30) >= 1, consumer)
        consumer.commit()
        our_consumer = sink.wait_for(
            lambda d: "consumer_lag" in _partition(d, topic, 0) and d["type"] == "consumer"
        )

    problems = []
    for ours, theirs in ((our_producer, their_producer), (our_consumer, their_consumer)):
        kind = ours["type"]
        problems += _shape_problems(ours, theirs, kind)
        their_broker = next(b for b in theirs["brokers"].values() if b["nodeid"] >= 0)
        for name, broker in ours["brokers"].items():
            problems += _shape_problems(broker, their_broker, f"{kind}.brokers[{name}]")
            for stats in ("rtt", "throttle"):
                problems += _shape_problems(broker[stats], their_broker[stats], f"{kind}.{stats}")
        problems += _shape_problems(ours["topics"][topic], theirs["topics"][topic], f"{kind}.topic")
        problems += _shape_problems(
            _partition(ours, topic, 0), _partition(theirs, topic, 0), f"{kind}.partition"
        )
        for part in ("eos", "cgrp"):
            if part in ours:
                problems += _shape_problems(ours[part], theirs[part], f"{kind}.{part}")
    assert not problems, "\n".join(problems)
