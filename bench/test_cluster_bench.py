"""kcore's connectivity and admin layer against its peers (confluent-kafka, kafka-python,
aiokafka), measured in the same run against the same real broker.

One Kafka node (the ``kafka_cluster`` fixture of kcore's pytest plugin: a local KRaft node, or
``KCORE_BOOTSTRAP``) holds 50 topics x 4 partitions, each partition with a known number of
records. Groups (``@pytest.mark.benchmark(group=...)``), so bench/report.py's ratios compare
like with like:

* ``cluster:cold-start``: a new client, bootstrap, the metadata of every topic, close.
* ``cluster:metadata-warm``: one open client, the metadata of every topic per round.
* ``cluster:list-offsets-warm``: one open client, the latest offset of all 200 partitions.
* ``cluster:pipelining``: 1,000 ``Metadata(topics=[])`` requests over one kcore connection,
  awaited one by one and gathered with 5 and 1,000 in flight (kcore only: a reference).

The sync kcore ``AdminClient`` (its own network thread) is one row, ``AsyncAdminClient`` on the
caller's event loop another; confluent-kafka and kafka-python are blocking clients, aiokafka
runs on the same kind of event loop as kcore's async rows. Every benchmark checks its result
outside the timed part: topic names equal to what confluent-kafka listed at setup, every
partition's end offset equal to the number of records written to it.

Run: ``pytest bench/test_cluster_bench.py --benchmark-json=out.json && python bench/report.py
out.json`` (see docs/benchmarks-cluster.md).
"""

from __future__ import annotations

import asyncio
import importlib
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kcore import AdminClient
from kcore.admin import AsyncAdminClient, NewTopic
from kcore.cluster import ClusterClient
from kcore.config import ClientConfig
from kcore.protocol.messages import MetadataRequest

pytestmark = [pytest.mark.broker, pytest.mark.slow]

N_TOPICS = 50
N_PARTITIONS = 4
COLD_ROUNDS = 40  # each round opens and closes a client: ~5-60 ms
WARM_ROUNDS = 200  # ~1-25 ms each; a fixed count, so every row spans a similar stretch of time
PIPELINE_REQUESTS = 1000
PIPELINE_ROUNDS = 8
TIMEOUT_S = 10.0
WARM_UP_S = 5.0  # then SETTLE_S idle: the broker's JIT compiler threads finish their work
SETTLE_S = 2.0


def _optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


confluent_admin = _optional("confluent_kafka.admin")
confluent = _optional("confluent_kafka")
kafka_admin = _optional("kafka.admin")
kafka_structs = _optional("kafka.structs")
aiokafka = _optional("aiokafka")
aiokafka_admin = _optional("aiokafka.admin")
aiokafka_structs = _optional("aiokafka.structs")

COLD = pytest.mark.benchmark(group="cluster:cold-start")
METADATA = pytest.mark.benchmark(group="cluster:metadata-warm")
OFFSETS = pytest.mark.benchmark(group="cluster:list-offsets-warm")
PIPELINE = pytest.mark.benchmark(group="cluster:pipelining")


def _info(
    benchmark: Any,
    key: str,
    label: str,
    *,
    impl: str,
    items: int | None = None,
    unit: str = "requests",
    **extra: Any,
) -> None:
    """What report.py needs (as in test_codec_bench.py): a stable ``key``, a label, who
    implements it (``kcore`` rows get ratios against every other row of the group), and the work
    done per call (``items`` of ``unit``)."""
    benchmark.extra_info.update(key=key, label=label, impl=impl, items=items, unit=unit, **extra)


def _need(module: Any, what: str) -> None:
    if module is None:
        pytest.skip(f"{what} is not installed")


# ---------------------------------------------------------------------------------------------
# The cluster and its data, set up once, outside any timed region


@dataclass(frozen=True)
class Topics:
    bootstrap: str
    names: set[str]  # every non-internal topic of the cluster, as confluent-kafka lists it
    end_offsets: dict[tuple[str, int], int]  # (topic, partition) -> records written to it

    @property
    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self.end_offsets)


def _user_topics(names: Any) -> set[str]:
    return {n for n in names if not n.startswith("__")}


@pytest.fixture(scope="module")
def topics(kafka_cluster: Any) -> Iterator[Topics]:
    """50 topics x 4 partitions, created by kcore; partition ``i`` (counting across topics) gets
    ``1 + i % 7`` records, written by confluent-kafka's producer (so end offsets differ)."""
    _need(confluent, "confluent-kafka")
    bootstrap = kafka_cluster.bootstrap_servers
    run = uuid.uuid4().hex[:6]  # fresh names even on a shared KCORE_BOOTSTRAP cluster
    created = [f"bench-{run}-{i:02d}" for i in range(N_TOPICS)]
    counts = {
        (t, p): 1 + (i * N_PARTITIONS + p) % 7
        for i, t in enumerate(created)
        for p in range(N_PARTITIONS)
    }
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(t, N_PARTITIONS, 1) for t in created])
        described = admin.describe_topics(created)  # retries until every leader is known
        assert all(len(d.partitions) == N_PARTITIONS for d in described.values())
    _produce(bootstrap, counts)
    listed = confluent_admin.AdminClient({"bootstrap.servers": bootstrap}).list_topics(
        timeout=TIMEOUT_S
    )
    names = _user_topics(listed.topics)
    assert set(created) <= names
    _warm_up_broker(bootstrap, counts)
    time.sleep(SETTLE_S)
    # No client of the setup stays open (no threads or timers of theirs during the benchmarks).
    try:
        yield Topics(bootstrap, names, counts)
    finally:
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.delete_topics(created)


def _produce(bootstrap: str, counts: dict[tuple[str, int], int]) -> None:
    errors: list[Any] = []
    producer = confluent.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for (t, p), n in counts.items():
        for j in range(n):
            producer.produce(
                t, value=b"v%d" % j, partition=p, on_delivery=lambda e, _m: errors.append(e)
            )
    assert producer.flush(30) == 0, "records still unsent after 30 s"
    assert errors == [None] * sum(counts.values()), [e for e in errors if e is not None][:3]


def _warm_up_broker(bootstrap: str, counts: dict[tuple[str, int], int]) -> None:
    """A freshly started broker JVM answers slower for its first seconds (JIT): exercise the
    requests measured here (ApiVersions, Metadata, ListOffsets) so that whichever benchmark runs
    first is not the one that pays for it."""
    deadline = time.monotonic() + WARM_UP_S
    specs = dict.fromkeys(counts, "latest")
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        while time.monotonic() < deadline:
            admin.list_topics()
            admin.list_offsets(specs)
            with AdminClient({"bootstrap.servers": bootstrap}) as fresh:
                fresh.describe_cluster()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The event loop the async rows (kcore's AsyncAdminClient, aiokafka) run on, in this
    thread: each round is one ``run_until_complete``."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.run_until_complete(_cancel_leftovers())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _cancel_leftovers() -> None:
    """Tasks a client left behind after closing (so the loop closes without warnings)."""
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


def _check_names(got: Any, topics: Topics) -> None:
    got = _user_topics(got)
    assert got == topics.names, (
        f"missing {sorted(topics.names - got)[:5]}, unexpected {sorted(got - topics.names)[:5]}"
    )


def _check_offsets(got: dict[tuple[str, int], int], topics: Topics) -> None:
    assert got == topics.end_offsets, {
        tp: (got.get(tp), want) for tp, want in topics.end_offsets.items() if got.get(tp) != want
    }


def _on(loop: asyncio.AbstractEventLoop, factory: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    def run() -> Any:
        return loop.run_until_complete(factory())

    return run


def _kcore_config(topics: Topics) -> dict[str, str]:
    return {"bootstrap.servers": topics.bootstrap}


# ---------------------------------------------------------------------------------------------
# Cold start: new client, bootstrap, every topic's metadata, close


def _cold(benchmark: Any, run: Callable[[], Any], topics: Topics) -> None:
    names = benchmark.pedantic(run, rounds=COLD_ROUNDS, iterations=1, warmup_rounds=1)
    _check_names(names, topics)


@COLD
def test_cold_kcore(benchmark: Any, topics: Topics) -> None:
    def run() -> list[str]:
        with AdminClient(_kcore_config(topics)) as admin:
            return admin.list_topics()

    _info(benchmark, "kcore.cold", "kcore AdminClient + list_topics", impl="kcore")
    _cold(benchmark, run, topics)


@COLD
def test_cold_kcore_async(benchmark: Any, topics: Topics, loop: asyncio.AbstractEventLoop) -> None:
    async def run() -> list[str]:
        async with AsyncAdminClient(_kcore_config(topics)) as admin:
            return await admin.list_topics()

    _info(benchmark, "kcore.cold.async", "kcore AsyncAdminClient + list_topics", impl="kcore")
    _cold(benchmark, _on(loop, run), topics)


@COLD
def test_cold_confluent(benchmark: Any, topics: Topics) -> None:
    _need(confluent_admin, "confluent-kafka")

    def run() -> list[str]:
        admin = confluent_admin.AdminClient({"bootstrap.servers": topics.bootstrap})
        names = list(admin.list_topics(timeout=TIMEOUT_S).topics)
        del admin  # no close(): the handle is destroyed (threads joined) when it is freed
        return names

    _info(
        benchmark,
        "confluent.cold",
        "confluent-kafka AdminClient + list_topics",
        impl="confluent-kafka",
    )
    _cold(benchmark, run, topics)


@COLD
def test_cold_confluent_no_sparse(benchmark: Any, topics: Topics) -> None:
    """librdkafka's default ``enable.sparse.connections=true`` connects to brokers only once
    needed, which adds ~50 ms to a first metadata call here; this row turns it off."""
    _need(confluent_admin, "confluent-kafka")
    config = {"bootstrap.servers": topics.bootstrap, "enable.sparse.connections": False}

    def run() -> list[str]:
        admin = confluent_admin.AdminClient(config)
        names = list(admin.list_topics(timeout=TIMEOUT_S).topics)
        del admin
        return names

    _info(
        benchmark,
        "confluent.cold.no_sparse",
        "confluent-kafka AdminClient + list_topics (sparse connections off)",
        impl="confluent-kafka (no sparse conns)",
    )
    _cold(benchmark, run, topics)


@COLD
def test_cold_kafka_python(benchmark: Any, topics: Topics) -> None:
    _need(kafka_admin, "kafka-python")

    def run() -> list[str]:
        admin = kafka_admin.KafkaAdminClient(bootstrap_servers=topics.bootstrap)
        try:
            return admin.list_topics()
        finally:
            admin.close()

    _info(
        benchmark,
        "kafka-python.cold",
        "kafka-python KafkaAdminClient + list_topics",
        impl="kafka-python",
    )
    _cold(benchmark, run, topics)


@COLD
def test_cold_aiokafka(benchmark: Any, topics: Topics, loop: asyncio.AbstractEventLoop) -> None:
    _need(aiokafka_admin, "aiokafka")

    async def run() -> list[str]:
        admin = aiokafka_admin.AIOKafkaAdminClient(bootstrap_servers=topics.bootstrap)
        await admin.start()
        try:
            return await admin.list_topics()
        finally:
            await admin.close()

    _info(benchmark, "aiokafka.cold", "aiokafka AIOKafkaAdminClient + list_topics", impl="aiokafka")
    _cold(benchmark, _on(loop, run), topics)


# ---------------------------------------------------------------------------------------------
# Warm metadata: one open client, every topic's metadata per round


def _warm(benchmark: Any, run: Callable[[], Any]) -> Any:
    run()  # connections up, metadata cached: what a long-lived client has
    return benchmark.pedantic(run, rounds=WARM_ROUNDS, iterations=1, warmup_rounds=5)


@METADATA
def test_metadata_kcore(benchmark: Any, topics: Topics) -> None:
    _info(benchmark, "kcore.metadata", "kcore AdminClient.list_topics", impl="kcore")
    with AdminClient(_kcore_config(topics)) as admin:
        names = _warm(benchmark, admin.list_topics)
    _check_names(names, topics)


@METADATA
def test_metadata_kcore_async(
    benchmark: Any, topics: Topics, loop: asyncio.AbstractEventLoop
) -> None:
    _info(benchmark, "kcore.metadata.async", "kcore AsyncAdminClient.list_topics", impl="kcore")
    admin = loop.run_until_complete(AsyncAdminClient(_kcore_config(topics)).start())
    try:
        names = _warm(benchmark, _on(loop, admin.list_topics))
    finally:
        loop.run_until_complete(admin.close())
    _check_names(names, topics)


@METADATA
def test_metadata_confluent(benchmark: Any, topics: Topics) -> None:
    _need(confluent_admin, "confluent-kafka")
    _info(
        benchmark,
        "confluent.metadata",
        "confluent-kafka AdminClient.list_topics",
        impl="confluent-kafka",
    )
    admin = confluent_admin.AdminClient({"bootstrap.servers": topics.bootstrap})
    md = _warm(benchmark, lambda: admin.list_topics(timeout=TIMEOUT_S))
    _check_names(md.topics, topics)
    assert {len(t.partitions) for n, t in md.topics.items() if n in topics.names} == {N_PARTITIONS}


@METADATA
def test_metadata_kafka_python(benchmark: Any, topics: Topics) -> None:
    _need(kafka_admin, "kafka-python")
    _info(
        benchmark,
        "kafka-python.metadata",
        "kafka-python KafkaAdminClient.list_topics",
        impl="kafka-python",
    )
    admin = kafka_admin.KafkaAdminClient(bootstrap_servers=topics.bootstrap)
    try:
        names = _warm(benchmark, admin.list_topics)
    finally:
        admin.close()
    _check_names(names, topics)


@METADATA
def test_metadata_aiokafka(benchmark: Any, topics: Topics, loop: asyncio.AbstractEventLoop) -> None:
    _need(aiokafka_admin, "aiokafka")
    _info(
        benchmark, "aiokafka.metadata", "aiokafka AIOKafkaAdminClient.list_topics", impl="aiokafka"
    )

    async def start() -> Any:  # aiokafka objects must be made inside the loop
        admin = aiokafka_admin.AIOKafkaAdminClient(bootstrap_servers=topics.bootstrap)
        await admin.start()
        return admin

    admin = loop.run_until_complete(start())
    try:
        names = _warm(benchmark, _on(loop, admin.list_topics))
    finally:
        loop.run_until_complete(admin.close())
    _check_names(names, topics)


# ---------------------------------------------------------------------------------------------
# Warm list offsets: one open client, the latest offset of all 200 partitions per round


def _offsets_info(benchmark: Any, key: str, label: str, impl: str) -> None:
    _info(benchmark, key, label, impl=impl, items=N_TOPICS * N_PARTITIONS, unit="partitions")


@OFFSETS
def test_offsets_kcore(benchmark: Any, topics: Topics) -> None:
    _offsets_info(benchmark, "kcore.offsets", "kcore AdminClient.list_offsets", "kcore")
    specs = {tp: "latest" for tp in topics.partitions}
    with AdminClient(_kcore_config(topics)) as admin:
        got = _warm(benchmark, lambda: admin.list_offsets(specs))
    _check_offsets({(tp.topic, tp.partition): r.offset for tp, r in got.items()}, topics)


@OFFSETS
def test_offsets_kcore_async(
    benchmark: Any, topics: Topics, loop: asyncio.AbstractEventLoop
) -> None:
    _offsets_info(benchmark, "kcore.offsets.async", "kcore AsyncAdminClient.list_offsets", "kcore")
    specs = {tp: "latest" for tp in topics.partitions}
    admin = loop.run_until_complete(AsyncAdminClient(_kcore_config(topics)).start())
    try:
        got = _warm(benchmark, _on(loop, lambda: admin.list_offsets(specs)))
    finally:
        loop.run_until_complete(admin.close())
    _check_offsets({(tp.topic, tp.partition): r.offset for tp, r in got.items()}, topics)


@OFFSETS
def test_offsets_confluent(benchmark: Any, topics: Topics) -> None:
    _need(confluent_admin, "confluent-kafka")
    _offsets_info(
        benchmark,
        "confluent.offsets",
        "confluent-kafka AdminClient.list_offsets",
        "confluent-kafka",
    )
    admin = confluent_admin.AdminClient({"bootstrap.servers": topics.bootstrap})
    latest = confluent_admin.OffsetSpec.latest()
    specs = {confluent.TopicPartition(t, p): latest for t, p in topics.partitions}

    def run() -> dict[Any, Any]:
        futures = admin.list_offsets(specs, request_timeout=TIMEOUT_S)
        return {tp: f.result() for tp, f in futures.items()}

    got = _warm(benchmark, run)
    _check_offsets({(tp.topic, tp.partition): r.offset for tp, r in got.items()}, topics)


@OFFSETS
def test_offsets_kafka_python(benchmark: Any, topics: Topics) -> None:
    _need(kafka_admin, "kafka-python")
    _offsets_info(
        benchmark,
        "kafka-python.offsets",
        "kafka-python KafkaAdminClient.list_partition_offsets",
        "kafka-python",
    )
    latest = kafka_admin.OffsetSpec.LATEST
    specs = {kafka_structs.TopicPartition(t, p): latest for t, p in topics.partitions}
    admin = kafka_admin.KafkaAdminClient(bootstrap_servers=topics.bootstrap)
    try:
        got = _warm(benchmark, lambda: admin.list_partition_offsets(specs))
    finally:
        admin.close()
    _check_offsets({(tp.topic, tp.partition): r.offset for tp, r in got.items()}, topics)


@OFFSETS
def test_offsets_aiokafka(benchmark: Any, topics: Topics, loop: asyncio.AbstractEventLoop) -> None:
    _need(aiokafka, "aiokafka")
    _offsets_info(
        benchmark, "aiokafka.offsets", "aiokafka AIOKafkaConsumer.end_offsets", "aiokafka"
    )
    partitions = [aiokafka_structs.TopicPartition(t, p) for t, p in topics.partitions]

    async def start() -> Any:
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=topics.bootstrap)
        await consumer.start()
        return consumer

    consumer = loop.run_until_complete(start())
    try:
        got = _warm(benchmark, _on(loop, lambda: consumer.end_offsets(partitions)))
    finally:
        loop.run_until_complete(consumer.stop())
    _check_offsets({(tp.topic, tp.partition): n for tp, n in got.items()}, topics)


# ---------------------------------------------------------------------------------------------
# Pipelining: 1,000 Metadata(topics=[]) requests over one kcore connection (no peer)


async def _pipeline_client(topics: Topics, max_in_flight: int) -> tuple[ClusterClient, int]:
    # max.in.flight is a producer key (admin connections keep the default 5): the cluster layer
    # takes any role's config.
    config = ClientConfig(
        {
            "bootstrap.servers": topics.bootstrap,
            "max.in.flight.requests.per.connection": max_in_flight,
            "enable.idempotence": False,
        },
        role="producer",
    )
    cluster = ClusterClient(config)
    await cluster.start()
    await cluster.ready()  # (start returns at once; the first bootstrap runs in the background)
    node = cluster.least_loaded_node()
    assert node is not None
    await cluster.connection(node)
    return cluster, node


def _check_pipeline(responses: list[Any], cluster: ClusterClient) -> None:
    assert len(responses) == PIPELINE_REQUESTS
    assert len({id(r) for r in responses}) == PIPELINE_REQUESTS
    brokers = set(cluster.metadata.brokers)
    for r in responses:
        assert r.topics == [] and {b.node_id for b in r.brokers} == brokers


@PIPELINE
@pytest.mark.parametrize(
    "mode, max_in_flight",
    [
        pytest.param("sequential", 5, id="sequential"),
        pytest.param("gather", 5, id="gather-5-in-flight"),
        pytest.param("gather", PIPELINE_REQUESTS, id="gather-1000-in-flight"),
    ],
)
def test_pipeline_kcore(
    benchmark: Any,
    topics: Topics,
    loop: asyncio.AbstractEventLoop,
    mode: str,
    max_in_flight: int,
) -> None:
    if mode == "sequential":
        # a reference row, not a peer: report.py shows the gathered rows' speedup over it
        impl, label = "kcore (awaited one by one)", "kcore, 1,000 awaits one after another"
    else:
        impl, label = "kcore", f"kcore, gather of 1,000 ({max_in_flight} in flight)"
    _info(
        benchmark,
        f"kcore.pipeline.{mode}.{max_in_flight}",
        label,
        impl=impl,
        items=PIPELINE_REQUESTS,
        max_in_flight=max_in_flight,
    )
    cluster, node = loop.run_until_complete(_pipeline_client(topics, max_in_flight))

    async def sequential() -> list[Any]:
        return [
            await cluster.send(node, MetadataRequest(topics=[])) for _ in range(PIPELINE_REQUESTS)
        ]

    async def gather() -> list[Any]:
        return await asyncio.gather(
            *(cluster.send(node, MetadataRequest(topics=[])) for _ in range(PIPELINE_REQUESTS))
        )

    run = _on(loop, sequential if mode == "sequential" else gather)
    try:
        responses = benchmark.pedantic(run, rounds=PIPELINE_ROUNDS, iterations=1, warmup_rounds=1)
        _check_pipeline(responses, cluster)
    finally:
        loop.run_until_complete(cluster.close())
