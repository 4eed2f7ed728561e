"""One round of one client in one cell of bench/test_matrix_bench.py, in a process of its own:
every round starts from a fresh interpreter (no other client's threads, allocator state or
imports), and its peak RSS is this client's alone.

``python bench/_matrix_child.py '<json spec>'`` prints one JSON line: ``wall_s`` (the timed
part), ``cpu_s`` (``time.process_time`` over it: every thread of the process, e.g.
librdkafka's or kcore's network thread), ``peak_rss`` (bytes: ``VmHWM``, reset just before the
timed part, so the highest RSS the process reached while it ran, imports and data included),
``records``, for a consumer its ``positions`` after the round, and ``broker_cpu_s`` (the
broker's CPU over the timed part) when the spec names the broker's process (``broker_pid``).

The spec's keys: ``role`` (``produce`` or ``consume``), ``client`` (see PRODUCERS and
CONSUMERS), ``bootstrap``, ``topic``, ``partitions``, ``records`` (N), ``prime`` (records sent
or read untimed first, by the same producer or by a consumer of its own: connections,
metadata, producer id, warm code paths), ``settings`` (the settings every client gets, in
Java's names, translated below for each client; ``null``: the client's own defaults),
``value_size`` and ``keyed`` (producers).

Producers: the timed part runs from the first send of N records to the broker's
acknowledgement of the last (``flush``, a ``send_batch`` result, the gathered futures).
``floor`` is not a client: the cell's requests built untimed, then only written
(bench/_produce_floor.py).
Consumers: a consumer created, connected and assigned all partitions from the beginning (no
group) before the timed part, which runs from its first poll to the N-th record.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

TIMEOUT_S = 240.0
POLL_RECORDS = 10_000  # records a poll call may return (every client)
ARROW_RECORDS = 100_000  # kcore poll_arrow
POLL_TIMEOUT_S = 1.0
# JSON-like values (as bench/test_producer_bench.py's make_values): a fixed 100-byte template,
# its ``#`` drawn per record from 32 symbols, so batches compress (lz4 ~2.6x) as records of
# one schema do; repeated (fresh symbols in each copy) or cut to other sizes.
TEMPLATE = (
    b'{"id":"################","user":"user-#####","event":"page_view","region":"eu-west-1",'
    b'"v":"#######"}'
)
ALPHABET = b"abcdefghijklmnopqrstuvwxyz012345"
SEED = 0x6B636F7265 + 25


def make_values(n: int, size: int, seed: int = SEED) -> list[bytes]:
    """``n`` values of ``size`` bytes from TEMPLATE (the parent writes Java's payload file
    with it too)."""
    rng = np.random.default_rng(seed)
    template = np.frombuffer((TEMPLATE * (-(-size // len(TEMPLATE))))[:size], dtype=np.uint8)
    holes = np.flatnonzero(template == ord("#"))
    alphabet = np.frombuffer(ALPHABET, dtype=np.uint8)
    rows = np.tile(template, (n, 1))
    rows[:, holes] = alphabet[rng.integers(0, len(alphabet), size=(n, len(holes)))]
    return [bytes(row) for row in rows]


def make_keys(n: int, seed: int = SEED + 1) -> list[bytes]:
    """16-byte keys, nearly all distinct (murmur2 spreads them over every partition)."""
    rng = np.random.default_rng(seed)
    return [b"key-%012d" % i for i in rng.integers(0, 10**12, size=n).tolist()]


def _peak_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM back to the current RSS (Linux >= 4.0)


def process_cpu(pid: int) -> float:
    """Another process's CPU seconds so far (user + system, every thread)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Timed:
    """The timed part of a round: its wall time, this process's CPU (every thread) and, when
    the spec names the broker's process (``broker_pid``), the broker's CPU over the same span
    (in clock ticks: 10 ms steps)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.broker_pid: int | None = spec.get("broker_pid")

    def __enter__(self) -> Timed:
        self.broker = process_cpu(self.broker_pid) if self.broker_pid else 0.0
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        if self.broker_pid:
            self.broker = process_cpu(self.broker_pid) - self.broker

    def result(self) -> dict[str, Any]:
        got: dict[str, Any] = {"wall_s": self.wall, "cpu_s": self.cpu}
        if self.broker_pid:
            got["broker_cpu_s"] = self.broker
        return got


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------------------------------------
# Settings: Java's names, as each client spells them


def _kcore_producer_config(spec: dict[str, Any]) -> dict[str, Any]:
    return {"bootstrap.servers": spec["bootstrap"], **(spec["settings"] or {})}


def _confluent_producer_config(spec: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {"bootstrap.servers": spec["bootstrap"]}
    for k, v in (spec["settings"] or {}).items():
        if k == "buffer.memory":
            # librdkafka's counterpart; its message count limit stays at its default
            # (100,000): produce() raises BufferError and the loop polls.
            config["queue.buffering.max.kbytes"] = v // 1024
        else:
            config[k] = v
    return config


def _python_producer_kwargs(
    spec: dict[str, Any], batch_name: str, in_flight_name: str | None = None
) -> dict[str, Any]:
    """aiokafka's (``max_batch_size``) and kafka-python's (``batch_size``) keyword arguments;
    neither has a send buffer limit to set (kafka-python 3 dropped buffer_memory), and aiokafka
    has no in-flight limit to set."""
    names = {
        "acks": "acks",
        "enable.idempotence": "enable_idempotence",
        "linger.ms": "linger_ms",
        "batch.size": batch_name,
        "compression.type": "compression_type",
    }
    unset = {"buffer.memory"}  # (an unmapped setting otherwise fails: KeyError below)
    if in_flight_name is None:
        unset.add("max.in.flight.requests.per.connection")
    else:
        names["max.in.flight.requests.per.connection"] = in_flight_name
    kwargs: dict[str, Any] = {"bootstrap_servers": spec["bootstrap"]}
    for k, v in (spec["settings"] or {}).items():
        if k in unset:
            continue
        if k == "acks" and v != "all":
            v = int(v)
        if k == "compression.type" and v == "none":
            v = None
        kwargs[names[k]] = v
    return kwargs


# ---------------------------------------------------------------------------------------------
# Producers: each returns (prime, timed) callables of (values, keys); keys may be None


Produce = Callable[[list[bytes], list[bytes] | None], None]


def _kcore_send(spec: dict[str, Any]) -> tuple[Produce, Callable[[], None]]:
    import kcore

    producer = kcore.Producer(_kcore_producer_config(spec))
    topic = spec["topic"]

    def produce(values: list[bytes], keys: list[bytes] | None) -> None:
        send = producer.send
        if keys is None:
            for v in values:
                send(topic, v)
        else:
            for v, k in zip(values, keys, strict=True):
                send(topic, v, k)
        producer.flush(TIMEOUT_S)

    return produce, producer.close


def _kcore_send_batch(spec: dict[str, Any]) -> tuple[Produce, Callable[[], None]]:
    import kcore

    producer = kcore.Producer(_kcore_producer_config(spec))
    topic = spec["topic"]

    def produce(values: list[bytes], keys: list[bytes] | None) -> None:
        parts = producer.send_batch(topic, values, keys).result(TIMEOUT_S)
        assert sum(count for _, _, count in parts) == len(values), parts

    return produce, producer.close


def _confluent_produce(spec: dict[str, Any]) -> tuple[Produce, Callable[[], None]]:
    import confluent_kafka

    # No on_delivery callback (a Python call per record, which kcore's loop does not make
    # either); a record that failed is missing from the end offsets the parent checks.
    producer = confluent_kafka.Producer(_confluent_producer_config(spec))
    topic = spec["topic"]

    def produce(values: list[bytes], keys: list[bytes] | None) -> None:
        p = producer.produce
        for i, v in enumerate(values):
            k = None if keys is None else keys[i]
            while True:
                try:
                    p(topic, v, k)
                    break
                except BufferError:  # queue.buffering.max.messages: serve delivery reports
                    producer.poll(0.1)
        left = producer.flush(TIMEOUT_S)
        assert left == 0, f"{left} records undelivered"

    return produce, lambda: None


def _kafka_python_send(spec: dict[str, Any]) -> tuple[Produce, Callable[[], None]]:
    import kafka

    producer = kafka.KafkaProducer(
        **_python_producer_kwargs(spec, "batch_size", "max_in_flight_requests_per_connection")
    )
    topic = spec["topic"]

    def produce(values: list[bytes], keys: list[bytes] | None) -> None:
        send = producer.send
        if keys is None:
            futures = [send(topic, v) for v in values]
        else:
            futures = [send(topic, v, k) for v, k in zip(values, keys, strict=True)]
        producer.flush(TIMEOUT_S)
        failed = [f.exception for f in futures if not f.succeeded()]
        assert not failed, failed[:3]

    return produce, lambda: producer.close(TIMEOUT_S)


def _async_producer(spec: dict[str, Any]) -> tuple[Produce, Callable[[], None]]:
    """The asyncio clients, on a loop of this thread: ``await send`` each record, then
    ``gather`` the futures (kcore's ``send_batch``: one call, then its result)."""
    client = spec["client"]
    loop = asyncio.new_event_loop()
    topic = spec["topic"]

    async def start() -> Any:  # the clients take the running loop
        if client.startswith("kcore"):
            import kcore

            return await kcore.AsyncProducer(_kcore_producer_config(spec)).start()
        if client == "confluent-aio":
            import confluent_kafka.aio

            # Its own buffer hands records to librdkafka 1,000 at a time (its default).
            return confluent_kafka.aio.AIOProducer(_confluent_producer_config(spec))
        import aiokafka

        producer = aiokafka.AIOKafkaProducer(**_python_producer_kwargs(spec, "max_batch_size"))
        await producer.start()
        return producer

    producer = loop.run_until_complete(start())

    async def send_each(values: list[bytes], keys: list[bytes] | None) -> None:
        send = producer.produce if client == "confluent-aio" else producer.send
        if keys is None:
            futures = [await send(topic, v) for v in values]
        elif client == "confluent-aio":
            futures = [await send(topic, v, k) for v, k in zip(values, keys, strict=True)]
        else:
            futures = [await send(topic, v, key=k) for v, k in zip(values, keys, strict=True)]
        done = await asyncio.gather(*futures)
        assert len(done) == len(values)

    async def send_batch(values: list[bytes], keys: list[bytes] | None) -> None:
        parts = await (await producer.send_batch(topic, values, keys))
        assert sum(count for _, _, count in parts) == len(values), parts

    run = send_batch if client == "kcore-async-batch" else send_each

    def produce(values: list[bytes], keys: list[bytes] | None) -> None:
        loop.run_until_complete(run(values, keys))

    def close() -> None:
        stop = producer.stop() if client.startswith("aiokafka") else producer.close()
        loop.run_until_complete(stop)
        loop.close()

    return produce, close


PRODUCERS: dict[str, Callable[[dict[str, Any]], tuple[Produce, Callable[[], None]]]] = {
    "kcore-send": _kcore_send,
    "kcore-batch": _kcore_send_batch,
    "confluent": _confluent_produce,
    "kafka-python": _kafka_python_send,
    "aiokafka": _async_producer,
    "kcore-async-send": _async_producer,
    "kcore-async-batch": _async_producer,
    "confluent-aio": _async_producer,
}


def _floor_round(
    spec: dict[str, Any], values: list[bytes], keys: list[bytes] | None
) -> dict[str, Any]:
    """The cell's floor (bench/_produce_floor.py): requests built untimed, then written."""
    from _produce_floor import ProduceFloor

    n, prime = spec["records"], spec["prime"]
    floor = ProduceFloor(spec["bootstrap"], spec["settings"] or {}, TIMEOUT_S)
    try:
        floor.prepare(spec["topic"], spec["partitions"], values[:prime], keys and keys[:prime])
        floor.produce()
        floor.prepare(spec["topic"], spec["partitions"], values, keys)
        _peak_reset()
        with Timed(spec) as timed:
            requests = floor.produce()
        peak = _peak_rss()
    finally:
        floor.close()
    return {
        **timed.result(),
        "peak_rss": peak,
        "records": n,
        "sent": prime + n,
        "requests": requests,
    }


def produce_round(spec: dict[str, Any]) -> dict[str, Any]:
    n, prime = spec["records"], spec["prime"]
    values = make_values(n, spec["value_size"])
    keys = make_keys(n) if spec["keyed"] else None
    if spec["client"] == "floor":
        return _floor_round(spec, values, keys)
    produce, close = PRODUCERS[spec["client"]](spec)
    try:
        produce(values[:prime], None if keys is None else keys[:prime])
        _peak_reset()
        with Timed(spec) as timed:
            produce(values, keys)
        peak = _peak_rss()
    finally:
        close()
    return {**timed.result(), "peak_rss": peak, "records": n, "sent": prime + n}


# ---------------------------------------------------------------------------------------------
# Consumers: each opens a consumer (assigned, at the beginning) and returns
# (read until n -> count, positions, close)


class Reader:
    def __init__(
        self,
        read: Callable[[int], int],
        positions: Callable[[], dict[int, int]],
        close: Callable[[], None],
    ) -> None:
        self.read, self.positions, self.close = read, positions, close


def _deadline() -> float:
    return time.monotonic() + TIMEOUT_S


def _check_deadline(deadline: float, total: int, n: int) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"{total} of {n} records after {TIMEOUT_S:g}s")


def _fetch(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["settings"] or {}


def _kcore_consumer(spec: dict[str, Any]) -> Reader:
    import kcore

    topic, parts = spec["topic"], range(spec["partitions"])
    config = {"bootstrap.servers": spec["bootstrap"], **_fetch(spec)}
    arrow = spec["client"] == "kcore-arrow"
    c = kcore.Consumer(config)
    c.partitions_for(topic)  # connected, the topic's metadata known
    c.assign([(topic, p) for p in parts])
    c.seek_to_beginning()

    def read(n: int) -> int:
        total, deadline = 0, _deadline()
        if arrow:
            poll_arrow = c.poll_arrow
            while total < n:
                _check_deadline(deadline, total, n)
                total += poll_arrow(POLL_TIMEOUT_S, max_records=ARROW_RECORDS).num_rows
        else:
            poll = c.poll
            while total < n:
                _check_deadline(deadline, total, n)
                total += len(poll(POLL_TIMEOUT_S, max_records=POLL_RECORDS))
        return total

    return Reader(read, lambda: {p: c.position((topic, p)) for p in parts}, c.close)


def _confluent_config(spec: dict[str, Any]) -> dict[str, Any]:
    names = {
        "max.partition.fetch.bytes": "fetch.message.max.bytes",
        "fetch.max.wait.ms": "fetch.wait.max.ms",
    }
    config = {
        "bootstrap.servers": spec["bootstrap"],
        "group.id": f"bench-matrix-{spec['topic']}",  # required; no group is joined
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
    }
    config.update({names.get(k, k): v for k, v in _fetch(spec).items()})
    return config


def _confluent_consumer(spec: dict[str, Any]) -> Reader:
    import confluent_kafka

    topic, parts = spec["topic"], range(spec["partitions"])
    c = confluent_kafka.Consumer(_confluent_config(spec))
    c.list_topics(topic, timeout=30)
    begin = confluent_kafka.OFFSET_BEGINNING
    c.assign([confluent_kafka.TopicPartition(topic, p, begin) for p in parts])

    def read(n: int) -> int:
        total, deadline = 0, _deadline()
        take = c.consume
        while total < n:
            _check_deadline(deadline, total, n)
            # At most what is left: consume waits (up to its timeout) for as many as asked.
            for m in take(min(POLL_RECORDS, n - total), POLL_TIMEOUT_S):
                if m.error() is not None:
                    raise RuntimeError(f"confluent-kafka: {m.error()}")
                total += 1
        return total

    def positions() -> dict[int, int]:
        tps = [confluent_kafka.TopicPartition(topic, p) for p in parts]
        return {tp.partition: tp.offset for tp in c.position(tps)}

    return Reader(read, positions, c.close)


def _python_fetch_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    return {k.replace(".", "_"): v for k, v in _fetch(spec).items()}


def _kafka_python_consumer(spec: dict[str, Any]) -> Reader:
    import kafka

    topic, parts = spec["topic"], range(spec["partitions"])
    c = kafka.KafkaConsumer(
        bootstrap_servers=spec["bootstrap"],
        group_id=None,
        enable_auto_commit=False,
        **_python_fetch_kwargs(spec),
    )
    assert c.partitions_for_topic(topic) == set(parts)  # the topic's metadata known
    tps = [kafka.TopicPartition(topic, p) for p in parts]
    c.assign(tps)
    c.seek_to_beginning()

    def read(n: int) -> int:
        total, deadline = 0, _deadline()
        poll = c.poll
        while total < n:
            _check_deadline(deadline, total, n)
            got = poll(timeout_ms=int(POLL_TIMEOUT_S * 1000), max_records=POLL_RECORDS)
            total += sum(map(len, got.values()))
        return total

    return Reader(
        read,
        lambda: {tp.partition: c.position(tp) for tp in tps},
        lambda: c.close(autocommit=False),
    )


def _async_consumer(spec: dict[str, Any]) -> Reader:
    """kcore's AsyncConsumer (``await poll``), confluent_kafka.aio's AIOConsumer (``await
    consume``), aiokafka (``await getmany``), on a loop of this thread."""
    client = spec["client"]
    topic, parts = spec["topic"], range(spec["partitions"])
    loop = asyncio.new_event_loop()

    async def start() -> Any:
        if client == "kcore-async":
            import kcore

            config = {"bootstrap.servers": spec["bootstrap"], **_fetch(spec)}
            c = await kcore.AsyncConsumer(config).start()
            await c.partitions_for(topic)
            c.assign([(topic, p) for p in parts])
            c.seek_to_beginning()
            return c
        if client == "confluent-aio":
            import confluent_kafka
            import confluent_kafka.aio

            c = confluent_kafka.aio.AIOConsumer(_confluent_config(spec))
            await c.list_topics(topic, timeout=30)
            begin = confluent_kafka.OFFSET_BEGINNING
            await c.assign([confluent_kafka.TopicPartition(topic, p, begin) for p in parts])
            return c
        import aiokafka

        c = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=spec["bootstrap"],
            group_id=None,
            enable_auto_commit=False,
            **_python_fetch_kwargs(spec),
        )
        await c.start()
        c.assign([aiokafka.TopicPartition(topic, p) for p in parts])
        await c.seek_to_beginning()
        return c

    c = loop.run_until_complete(start())

    async def read_async(n: int) -> int:
        total, deadline = 0, _deadline()
        while total < n:
            _check_deadline(deadline, total, n)
            if client == "kcore-async":
                total += len(await c.poll(POLL_TIMEOUT_S, max_records=POLL_RECORDS))
            elif client == "confluent-aio":
                for m in await c.consume(min(POLL_RECORDS, n - total), POLL_TIMEOUT_S):
                    if m.error() is not None:
                        raise RuntimeError(f"confluent-kafka: {m.error()}")
                    total += 1
            else:
                got = await c.getmany(
                    timeout_ms=int(POLL_TIMEOUT_S * 1000), max_records=POLL_RECORDS
                )
                total += sum(map(len, got.values()))
        return total

    async def positions_async() -> dict[int, int]:
        if client == "kcore-async":
            return {p: await c.position((topic, p)) for p in parts}
        if client == "confluent-aio":
            import confluent_kafka

            tps = [confluent_kafka.TopicPartition(topic, p) for p in parts]
            return {tp.partition: tp.offset for tp in await c.position(tps)}
        import aiokafka

        return {p: await c.position(aiokafka.TopicPartition(topic, p)) for p in parts}

    def close() -> None:
        loop.run_until_complete(c.stop() if client == "aiokafka" else c.close())
        loop.close()

    return Reader(
        lambda n: loop.run_until_complete(read_async(n)),
        lambda: loop.run_until_complete(positions_async()),
        close,
    )


CONSUMERS: dict[str, Callable[[dict[str, Any]], Reader]] = {
    "kcore-poll": _kcore_consumer,
    "kcore-arrow": _kcore_consumer,
    "confluent": _confluent_consumer,
    "kafka-python": _kafka_python_consumer,
    "kcore-async": _async_consumer,
    "confluent-aio": _async_consumer,
    "aiokafka": _async_consumer,
}


def consume_round(spec: dict[str, Any]) -> dict[str, Any]:
    n, prime = spec["records"], spec["prime"]
    make = CONSUMERS[spec["client"]]
    if prime:
        reader = make(spec)
        try:
            reader.read(prime)
        finally:
            reader.close()
    reader = make(spec)
    try:
        _peak_reset()
        with Timed(spec) as timed:
            got = reader.read(n)
        peak = _peak_rss()
        positions = reader.positions()
    finally:
        reader.close()
    return {**timed.result(), "peak_rss": peak, "records": got, "positions": positions}


def main() -> None:
    spec = json.loads(sys.argv[1])
    result = produce_round(spec) if spec["role"] == "produce" else consume_round(spec)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
