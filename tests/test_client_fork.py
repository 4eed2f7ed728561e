"""kcore's blocking clients across processes: a pickled client is its config (unpickling builds
a fresh, working client), and a client copied into a forked child rebuilds itself there on first
use instead of waiting on its parent's network thread, which the child does not have (what
Spark's forked Python workers and multiprocessing's fork start method need)."""

from __future__ import annotations

import os
import pickle
import signal
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import kcore
from kcore.admin import NewTopic

pytestmark = pytest.mark.broker

CHILD_TIMEOUT_S = 60  # a child that hangs is killed by SIGALRM: the test fails, never hangs


def in_child(fn: Callable[[], Any]) -> str:
    """``repr(fn())`` computed in a forked child (or the error it raised, as ``error: ...``)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe and leave without running pytest's exit
        try:
            signal.alarm(CHILD_TIMEOUT_S)
            out = repr(fn())
        except BaseException as exc:
            out = f"error: {exc!r}"
        os.write(write_end, out.encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"the child died (status {status}): it hung or crashed"
    return b"".join(chunks).decode()


@pytest.fixture
def topic(kafka_cluster) -> str:
    name = f"fork-{uuid.uuid4().hex[:8]}"
    with kcore.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(name, 1, 1)])
    return name


def read_values(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    with kcore.Consumer({"bootstrap.servers": bootstrap}) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek((topic, 0), 0)
        records: list[Any] = []
        for _ in range(30):
            records += consumer.poll(1.0)
            if len(records) >= expected:
                break
        return [r.value for r in records]


def test_pickled_clients_are_fresh_working_clients(kafka_cluster, topic):
    bootstrap = kafka_cluster.bootstrap_servers
    with kcore.Producer({"bootstrap.servers": bootstrap, "linger.ms": 1}) as producer:
        data = pickle.dumps(producer)
        assert len(data) < 1000  # the config, not the client's state
        with pickle.loads(data) as copy:
            assert copy is not producer
            assert copy._config == producer._config
            copy.send(topic, b"from the copy").result(10)
        producer.send(topic, b"from the original").result(10)  # the original is untouched

    with kcore.Consumer({"bootstrap.servers": bootstrap}) as consumer:
        with pickle.loads(pickle.dumps(consumer)) as copy:
            copy.assign([(topic, 0)])
            copy.seek((topic, 0), 0)
            assert {r.value for r in copy.poll(10.0, max_records=10)} >= {b"from the copy"}

    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        with pickle.loads(pickle.dumps(admin)) as copy:
            assert topic in copy.list_topics()


def test_forked_child_uses_the_parents_producer(kafka_cluster, topic):
    bootstrap = kafka_cluster.bootstrap_servers
    with kcore.Producer({"bootstrap.servers": bootstrap, "linger.ms": 1}) as producer:
        producer.send(topic, b"parent before").result(10)

        def child() -> Any:
            # The copy has no network thread until used: a child that never sends costs nothing.
            idle = [t.name for t in threading.enumerate() if t.name == "kcore-producer"]
            meta = producer.send(topic, b"child").result(10)
            batch = producer.send_batch(topic, [b"child batch 1", b"child batch 2"])
            producer.flush(10)
            producer.close()
            return idle, meta.topic, sum(count for _, _, count in batch.result(0))

        assert in_child(child) == repr(([], topic, 2))
        producer.send(topic, b"parent after").result(10)  # the parent's is not disturbed

    values = read_values(bootstrap, topic, 5)
    assert values == [b"parent before", b"child", b"child batch 1", b"child batch 2"] + [
        b"parent after"
    ]


def test_forked_child_uses_the_parents_consumer(kafka_cluster, topic):
    bootstrap = kafka_cluster.bootstrap_servers
    with kcore.Producer({"bootstrap.servers": bootstrap}) as producer:
        producer.send_batch(topic, [b"a", b"b", b"c"]).result(10)
    with kcore.Consumer({"bootstrap.servers": bootstrap}) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek((topic, 0), 0)
        assert [r.value for r in consumer.poll(10.0, max_records=1)] == [b"a"]

        def child() -> Any:
            # A fresh consumer from the config: it has no assignment of the parent's.
            consumer.assign([(topic, 0)])
            consumer.seek((topic, 0), 1)
            return [r.value for r in consumer.poll(10.0)]

        assert in_child(child) == repr([b"b", b"c"])
        assert [r.value for r in consumer.poll(10.0)] == [b"b", b"c"]  # the parent goes on


def test_a_client_that_fails_to_rebuild_tries_again_on_next_use(kafka_cluster):
    # A producer whose config no longer builds by the time the child uses it: the child's
    # first use raises, and the client stays rebuildable (it is not left half-made).
    config = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "max.block.ms": 2000}
    with kcore.Producer(config) as producer:

        def child() -> Any:
            producer._forked_config["linger.ms"] = "soon"
            errors = []
            for _ in range(2):
                try:
                    producer.flush(1)
                except kcore.errors.KcoreError as exc:
                    errors.append(type(exc).__name__)
            return errors, "_forked_config" in producer.__dict__

        assert in_child(child) == repr((["ConfigError", "ConfigError"], True))


def test_a_rebuilt_client_whose_servers_are_gone_fails_at_its_first_wait(kafka_cluster):
    # Rebuilding does not wait on the network (as construction does not): the servers gone
    # show at the first call that needs them, with the addresses named.
    config = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "max.block.ms": 2000}
    with kcore.Producer(config) as producer:

        def child() -> Any:
            producer._forked_config["bootstrap.servers"] = "127.0.0.1:1"
            errors = []
            for _ in range(2):
                try:
                    producer.wait_until_ready(1)
                except kcore.errors.BootstrapError as exc:
                    errors.append("127.0.0.1:1" in str(exc))
            return errors, "_forked_config" in producer.__dict__

        assert in_child(child) == repr(([True, True], False))


def test_a_client_closed_before_the_fork_stays_closed(kafka_cluster):
    producer = kcore.Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    producer.close()

    def child() -> Any:
        try:
            producer.flush(1)
        except kcore.errors.KcoreError as exc:
            return str(exc)
        return "flushed"

    assert in_child(child) == repr("the client is closed")
