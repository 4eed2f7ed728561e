"""MetadataCache without sockets: merging responses, stale leader epochs, KIP-951 leader hints,
refresh bookkeeping; and the connection layer's handling of peers that are not Kafka."""

from __future__ import annotations

import asyncio
import copy
import random
import socket
import struct
import threading
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcore.cluster import MetadataCache, PartitionInfo, apply_leader_hints
from kcore.cluster._metadata_apply import rows_unchanged
from kcore.errors import BrokerConnectionError, ErrorCode, KcoreError, KcoreTimeoutError
from kcore.network import BrokerConnection, ConnectionSettings, ExponentialBackoff
from kcore.protocol._decoders import decode_metadata_response
from kcore.protocol.messages import FetchResponse, MetadataResponse, ProduceResponse
from kcore.protocol.messages.fetch_response import FetchableTopicResponse, PartitionData
from kcore.protocol.messages.fetch_response import LeaderIdAndEpoch as FetchLeader
from kcore.protocol.messages.fetch_response import NodeEndpoint as FetchEndpoint
from kcore.protocol.messages.metadata_request import MetadataRequestTopic  # noqa: F401
from kcore.protocol.messages.metadata_response import (
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from kcore.protocol.messages.produce_response import (
    LeaderIdAndEpoch,
    NodeEndpoint,
    PartitionProduceResponse,
    TopicProduceResponse,
)

TOPIC_ID = uuid.uuid4()


def metadata(leaders: dict[int, tuple[int, int]], topics=("t",), brokers=(1, 2, 3)):
    """A MetadataResponse: partition -> (leader, epoch) for each topic."""
    return MetadataResponse(
        cluster_id="c1",
        controller_id=1,
        brokers=[MetadataResponseBroker(node_id=n, host="h", port=9000 + n) for n in brokers],
        topics=[
            MetadataResponseTopic(
                name=name,
                topic_id=TOPIC_ID,
                partitions=[
                    MetadataResponsePartition(
                        partition_index=p,
                        leader_id=leader,
                        leader_epoch=epoch,
                        replica_nodes=[1, 2, 3],
                        isr_nodes=[1, 2, 3],
                    )
                    for p, (leader, epoch) in leaders.items()
                ],
            )
            for name in topics
        ],
    )


def test_update_and_lookup():
    cache = MetadataCache()
    assert cache.needs_update()
    md = cache.update(metadata({0: (1, 5), 1: (2, 3)}), all_topics=False)
    assert not cache.update_requested
    assert md.leader_for("t", 0).port == 9001
    assert md.partitions_for("t") == [0, 1]
    assert md.topics["t"].topic_id == TOPIC_ID
    assert md.leader_for("t", 7) is None and md.leader_for("nope", 0) is None


def test_stale_leader_epochs_are_ignored():
    cache = MetadataCache()
    cache.update(metadata({0: (1, 5)}), all_topics=False)
    cache.update(metadata({0: (2, 4)}), all_topics=False)  # a broker that is behind
    assert cache.current.partition("t", 0).leader == 1
    cache.update(metadata({0: (3, 6)}), all_topics=False)
    assert cache.current.partition("t", 0).leader == 3


def test_a_recreated_topic_starts_its_epochs_again():
    cache = MetadataCache()
    cache.update(metadata({0: (1, 7)}), all_topics=False)
    recreated = metadata({0: (2, 0)})
    recreated.topics[0].topic_id = uuid.uuid4()  # same name, new topic id
    cache.update(recreated, all_topics=False)
    assert cache.current.partition("t", 0).leader == 2


def test_partial_updates_keep_other_topics_and_full_ones_drop_them():
    cache = MetadataCache()
    cache.update(metadata({0: (1, 0)}, topics=("a", "b")), all_topics=False)
    cache.update(metadata({0: (2, 1)}, topics=("a",)), all_topics=False)
    assert set(cache.current.topics) == {"a", "b"}
    cache.update(metadata({0: (2, 1)}, topics=("a",)), all_topics=True)
    assert set(cache.current.topics) == {"a"}


def test_an_answer_about_new_topics_only_leaves_the_refresh_bookkeeping_alone():
    """A partial update (KIP-526: a new topic fetched alone) merges its topics, but a refresh
    that was asked for stays asked for, and metadata.max.age.ms keeps counting from the last
    full refresh: the other topics were not refreshed."""
    cache = MetadataCache(max_age_s=10)
    cache.update(metadata({0: (1, 0)}, topics=("a",)), all_topics=False, now=100.0)
    cache.request_update()  # say, NOT_LEADER_OR_FOLLOWER for a
    cache.update(metadata({0: (2, 0)}, topics=("new",)), all_topics=False, partial=True, now=105.0)
    assert set(cache.current.topics) == {"a", "new"}
    assert cache.update_requested and cache.needs_update(now=105.0)
    cache.update(metadata({0: (1, 0)}, topics=("a", "new")), all_topics=False, now=106.0)
    assert not cache.needs_update(now=106.0)
    cache.update(
        metadata({0: (2, 0)}, topics=("other",)), all_topics=False, partial=True, now=112.0
    )
    assert cache.seconds_until_update(now=112.0) == pytest.approx(4.0)  # from 106, not 112


def test_forgotten_topics_leave_the_map():
    cache = MetadataCache()
    cache.update(metadata({0: (1, 0)}, topics=("a", "b")), all_topics=False)
    before = cache.current
    cache.forget(["a"])
    assert set(cache.current.topics) == {"b"} and cache.current is not before


def test_stale_error_codes_request_a_refresh():
    cache = MetadataCache(max_age_s=3600)
    cache.update(metadata({0: (1, 0)}), all_topics=False)
    assert not cache.needs_update()
    for code in (
        6,
        3,
        5,
        74,
    ):  # NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC.., LEADER_NOT_AVAILABLE, FENCED
        cache.update(metadata({0: (1, 0)}), all_topics=False)
        assert cache.handle_error(code)
        assert cache.needs_update()
    cache.update(metadata({0: (1, 0)}), all_topics=False)
    assert not cache.handle_error(87)  # not a metadata error
    assert not cache.needs_update()


def test_max_age_triggers_a_refresh():
    cache = MetadataCache(max_age_s=10)
    cache.update(metadata({0: (1, 0)}), all_topics=False, now=100.0)
    assert not cache.needs_update(now=105.0)
    assert cache.seconds_until_update(now=105.0) == pytest.approx(5.0)
    assert cache.needs_update(now=110.0)


def test_produce_response_leader_hints():
    cache = MetadataCache()
    cache.update(metadata({0: (1, 5), 1: (1, 5)}, brokers=(1, 2)), all_topics=False)
    response = ProduceResponse(
        responses=[
            TopicProduceResponse(
                name="t",
                partition_responses=[
                    PartitionProduceResponse(
                        index=0,
                        error_code=6,
                        current_leader=LeaderIdAndEpoch(leader_id=4, leader_epoch=6),
                    ),
                    PartitionProduceResponse(
                        index=1,
                        error_code=6,
                        current_leader=LeaderIdAndEpoch(leader_id=2, leader_epoch=4),
                    ),
                ],
            )
        ],
        node_endpoints=[NodeEndpoint(node_id=4, host="new", port=9004)],
    )
    assert apply_leader_hints(cache, response) == 1  # partition 1's hint is older
    assert cache.current.leader_for("t", 0).address == "new:9004"
    assert cache.current.partition("t", 1).leader == 1


def test_fetch_response_leader_hints_by_topic_id():
    cache = MetadataCache()
    cache.update(metadata({0: (1, 5)}), all_topics=False)
    response = FetchResponse(
        responses=[
            FetchableTopicResponse(
                topic_id=TOPIC_ID,
                partitions=[
                    PartitionData(
                        partition_index=0, current_leader=FetchLeader(leader_id=3, leader_epoch=9)
                    )
                ],
            )
        ],
        node_endpoints=[FetchEndpoint(node_id=3, host="h", port=9003)],
    )
    assert apply_leader_hints(cache, response) == 1
    assert cache.current.partition("t", 0).leader == 3
    assert cache.current.partition("t", 0).leader_epoch == 9


def test_an_answer_without_hints_looks_up_no_topic_names():
    """Produce v13 and Fetch name topics by id: the id is looked up among the cache's topics
    only for a topic with a leader hint, and most answers carry none."""

    class Cache:
        def __init__(self) -> None:
            self.lookups = 0

        @property
        def current(self) -> Any:
            self.lookups += 1
            return SimpleNamespace(topic_names_by_id={TOPIC_ID: "t"})

        def update_leader(self, topic: str, *args: Any) -> bool:
            assert topic == "t"
            return True

    def answer(leader_id: int) -> FetchResponse:
        part = PartitionData(
            partition_index=0, current_leader=FetchLeader(leader_id=leader_id, leader_epoch=9)
        )
        return FetchResponse(
            responses=[
                FetchableTopicResponse(topic_id=TOPIC_ID, partitions=[part, part]),
                FetchableTopicResponse(topic_id=TOPIC_ID, partitions=[part]),
            ]
        )

    cache = Cache()
    assert apply_leader_hints(cache, answer(-1)) == 0  # type: ignore[arg-type]
    assert cache.lookups == 0
    assert apply_leader_hints(cache, answer(3)) == 3  # type: ignore[arg-type]
    assert cache.lookups == 2  # (once a topic with hints)


def test_topic_names_by_id_are_made_once_a_snapshot():
    """The id -> name map answers by id are matched through is made once a snapshot of the
    metadata; a new snapshot (a refresh, a leader hint) has its own."""
    cache = MetadataCache()
    cache.update(metadata({0: (1, 5)}, brokers=(1, 2)), all_topics=False)
    first = cache.current
    names = first.topic_names_by_id
    assert names == {TOPIC_ID: "t"} and first.topic_names_by_id is names
    assert cache.update_leader("t", 0, 2, 6)
    assert cache.current is not first and cache.current.topic_names_by_id == {TOPIC_ID: "t"}
    assert cache.current.topic_names_by_id is not names
    cache.forget(["t"])
    assert cache.current.topic_names_by_id == {}


def test_hint_for_an_unknown_broker_requests_a_refresh():
    cache = MetadataCache(max_age_s=3600)
    cache.update(metadata({0: (1, 5)}), all_topics=False)
    assert not cache.update_leader("t", 0, 9, 6)
    assert cache.update_requested


def test_backoff_grows_caps_and_jitters():
    backoff = ExponentialBackoff(50, 1000)
    assert 40 <= backoff.backoff_ms(0) <= 60
    assert 80 <= backoff.backoff_ms(1) <= 120
    # As Java's ExponentialBackoff: the jitter never takes it above the maximum
    assert all(800 <= backoff.backoff_ms(n) <= 1000 for n in (5, 10, 1000) for _ in range(50))
    assert ExponentialBackoff(100, 100).backoff_ms(7) == 100  # no growth, no jitter
    # retry.backoff.ms above retry.backoff.max.ms: the maximum, constant (Java's docs)
    assert {ExponentialBackoff(5000, 1000).backoff_ms(n) for n in range(5)} == {1000}


# -- peers that are not Kafka ---------------------------------------------------------------------


class SilentServer:
    """Accepts connections and, depending on ``mode``, never answers or hangs up at once."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.mode == "hangup":
                conn.close()
            else:
                self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("mode", ["silent", "hangup"])
def test_a_listener_that_is_not_kafka_fails_at_api_versions(mode):
    server = SilentServer(mode)
    settings = ConnectionSettings(setup_timeout_s=0.5)

    async def main():
        with pytest.raises(BrokerConnectionError) as info:
            await BrokerConnection("127.0.0.1", server.port, settings).open()
        assert info.value.stage == "api_versions"
        assert "security.protocol" in str(info.value)

    try:
        asyncio.run(main())
    finally:
        server.close()


def test_request_timeout_closes_the_connection(kafka_cluster):
    from kcore.protocol.messages import MetadataRequest

    host, _, port = kafka_cluster.bootstrap_servers.split(",")[0].rpartition(":")

    async def main():
        conn = await BrokerConnection(host, int(port), ConnectionSettings()).open()
        # A timeout shorter than any broker answer: the request fails, the connection closes.
        with pytest.raises(KcoreTimeoutError, match="request.timeout.ms"):
            await conn.request(MetadataRequest(topics=None), timeout=0.000001)
        assert not conn.is_ready
        with pytest.raises(BrokerConnectionError):
            await conn.request(MetadataRequest(topics=[]))

    asyncio.run(main())


async def _requests(reader: asyncio.StreamReader):
    """(api key, version, correlation id) of each request a fake broker reads, until the
    client hangs up."""
    while True:
        try:
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            data = await reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        yield struct.unpack(">hhi", data[:8])


async def _answer(writer: asyncio.StreamWriter, corr: int, body: bytes, flexible: bool) -> None:
    """A response frame: ``flexible`` for a response header v1 (tagged fields)."""
    header = struct.pack(">i", corr) + (b"\x00" if flexible else b"")
    writer.write(struct.pack(">i", len(header + body)) + header + body)
    await writer.drain()


class FakeBroker:
    """Answers ApiVersions like a broker, then Metadata never (``hung``: its request handlers
    are stuck) or with no broker listed (``empty``: a broker still starting)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.metadata_requests = 0
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from kcore.protocol.framing import response_header_version
        from kcore.protocol.messages import APIS
        from kcore.protocol.messages.api_versions_response import ApiVersion, ApiVersionsResponse

        async for key, version, corr in _requests(reader):
            if key == 18:
                keys = [
                    ApiVersion(api_key=k, min_version=0, max_version=APIS[k].max_stable_version)
                    for k in (18, 3)
                ]
                await _answer(writer, corr, ApiVersionsResponse(api_keys=keys).encode(0), False)
                continue
            self.metadata_requests += 1
            if self.mode == "hung":
                continue
            body = MetadataResponse(brokers=[], controller_id=-1, topics=[]).encode(version)
            await _answer(writer, corr, body, response_header_version(key, version) == 1)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.mark.parametrize("mode", ["hung", "empty"])
def test_bootstrap_moves_on_from_a_broker_that_hangs_or_lists_no_broker(
    kafka_cluster, monkeypatch, mode
):
    """As Java's NetworkClient: a bootstrap server that takes Metadata and never answers is
    given request.timeout.ms (it held the whole bootstrap time, and the next server never got
    asked), and an answer listing no broker is not applied (the client knew nobody after it)."""
    from kcore.cluster import bootstrap as cluster_bootstrap
    from kcore.cluster import client as cluster_client

    fake = FakeBroker(mode)

    async def main() -> None:
        address = await fake.start()
        # the fake one first
        monkeypatch.setattr(
            cluster_bootstrap.random, "shuffle", lambda xs: xs.sort(key=lambda a: a != address)
        )
        client = cluster_client.ClusterClient(
            {
                "bootstrap.servers": f"{address},{kafka_cluster.bootstrap_servers}",
                "request.timeout.ms": 1500,
            }
        )
        try:
            md = await client.bootstrap(timeout=20)
            assert md.brokers and fake.metadata_requests == 1
        finally:
            await client.close()
            fake.close()

    asyncio.run(main())


def test_a_hang_up_during_the_tls_handshake_is_retried_until_the_timeout():
    """As Java's: a peer that accepts and hangs up during the TLS handshake (a broker
    restarting, a load balancer with no healthy backend) is tried again until the bootstrap
    timeout; it failed the bootstrap at once, like an untrusted certificate."""
    from kcore.cluster.client import ClusterClient
    from kcore.errors import BootstrapError

    server = SilentServer("hangup")

    async def main() -> None:
        client = ClusterClient(
            {"bootstrap.servers": f"127.0.0.1:{server.port}", "security.protocol": "SSL"}
        )
        started = asyncio.get_running_loop().time()
        try:
            with pytest.raises(BootstrapError, match="during the handshake") as info:
                await client.bootstrap(timeout=2)
        finally:
            await client.close()
        assert asyncio.get_running_loop().time() - started >= 1.5, info.value
        assert info.value.timeout_s == 2

    try:
        asyncio.run(main())
    finally:
        server.close()


def test_broker_connections_dial_every_address_whatever_client_dns_lookup_says():
    """As Java 3.0+: resolve_canonical_bootstrap_servers_only changes how the bootstrap list
    expands, not how a broker's advertised name is dialled (every address, both ways)."""
    from kcore.cluster.client import connection_settings
    from kcore.config import ClientConfig

    for lookup in ("use_all_dns_ips", "resolve_canonical_bootstrap_servers_only"):
        cfg = ClientConfig({"bootstrap.servers": "b:9092", "client.dns.lookup": lookup})
        assert connection_settings(cfg).all_dns_ips


@pytest.mark.parametrize("lists_its_versions", [True, False], ids=["kip511", "pre-2.4"])
def test_api_versions_falls_back_to_what_the_broker_takes(lists_its_versions):
    """A broker that does not take kcore's ApiVersions version answers UNSUPPORTED_VERSION in
    v0: since Kafka 2.4 (KIP-511) listing the ApiVersions versions it takes, before that
    listing none. kcore asks again at the version named, or at v0 (as Java's NetworkClient)."""
    from kcore.protocol.messages.api_versions_response import ApiVersion, ApiVersionsResponse

    asked: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async for _, version, corr in _requests(reader):
            asked.append(version)
            newest = 2  # an old broker: ApiVersions v0-2
            if version > newest:
                keys = [ApiVersion(api_key=18, min_version=0, max_version=newest)]
                body = ApiVersionsResponse(
                    error_code=35, api_keys=keys if lists_its_versions else []
                ).encode(0)
            else:
                keys = [ApiVersion(api_key=k, min_version=0, max_version=9) for k in (3, 18)]
                keys[1].max_version = newest
                body = ApiVersionsResponse(api_keys=keys).encode(version)
            await _answer(writer, corr, body, False)

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            conn = await BrokerConnection("127.0.0.1", port, ConnectionSettings()).open()
            assert conn.api_versions[18] == (0, 2) and conn.api_versions[3] == (0, 9)
            conn.close()
        finally:
            server.close()

    asyncio.run(main())
    assert asked[0] > 2 and asked[1] == (2 if lists_its_versions else 0)


def test_a_topic_waited_for_past_metadata_max_idle_ms_stays_tracked():
    """metadata.max.idle.ms (the producer's): a full refresh while a send waits for a topic's
    metadata (deleted and being created again, say) must not forget that topic, or the wait's
    own answers would put it in the map but no later refresh would ask about it. Found in
    review with this stub; without the fix the topic ended up in the map, untracked."""
    from kcore.cluster.client import ClusterClient

    asked: list[list[str] | None] = []
    exists: set[str] = set()

    class Conn:
        def version_for(self, api: int, **limits: int) -> int:
            return 9

        async def request(self, request, version, timeout=None):
            names = None if request.topics is None else [t.name for t in request.topics]
            asked.append(names)
            await asyncio.sleep(0.01)
            return metadata({0: (1, 0)}, topics=tuple(n for n in names or () if n in exists))

    async def main() -> None:
        client = ClusterClient({"bootstrap.servers": "x:1"}, auto_create=True)
        client.bootstrapped = True
        client.least_loaded_node = lambda exclude=(): None if exclude else 1

        async def connection(node: int) -> Conn:
            return Conn()

        client.connection = connection
        client.topic_idle_s = 0.05
        client.add_topics(["T"], refresh=False)
        await asyncio.sleep(0.1)  # idle by now
        waiting = asyncio.create_task(client.wait_for_topics(["T"], 2.0))
        await asyncio.sleep(0.03)
        await client.refresh_metadata()  # the periodic refresh, while the send waits
        exists.add("T")
        md = await waiting
        assert "T" in md.topics and "T" in client.topics
        asked.clear()
        await client.refresh_metadata()
        assert asked == [["T"]]
        # Idle once more (nothing waits, nothing written): forgotten, map included.
        await asyncio.sleep(0.1)
        await client.refresh_metadata()
        assert "T" not in client.topics and "T" not in client.metadata.topics
        assert asked[-1] == []

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------
# The compiled merge (kcore.cluster._metadata_apply) and merging in steps


def test_a_refresh_that_changes_nothing_keeps_the_cached_entries():
    cache = MetadataCache()
    first = cache.update(metadata({p: (1, 5) for p in range(50)}), all_topics=True)
    again = cache.update(metadata({p: (1, 5) for p in range(50)}), all_topics=True)
    assert again is not first and again.topics["t"] is first.topics["t"]
    changed = metadata({p: (1, 5) for p in range(50)})
    changed.topics[0].partitions[7].isr_nodes = [1, 2]
    third = cache.update(changed, all_topics=True)
    assert third.topics["t"] is not first.topics["t"]
    assert third.partition("t", 7).isr == (1, 2)
    rows = third.topics["t"].partitions
    assert all(rows[p] is first.topics["t"].partitions[p] for p in range(50) if p != 7)
    # Fewer partitions is a change too, even if every one left is as it was.
    fewer = cache.update(metadata({p: (1, 5) for p in range(49)}), all_topics=True)
    assert fewer.partitions_for("t") == list(range(49))


def test_rows_hold_what_the_answer_says():
    cache = MetadataCache()
    answer = metadata({0: (2, 9)})
    answer.topics[0].partitions[0].offline_replicas = [3]
    answer.topics[0].partitions[0].error_code = ErrorCode.REPLICA_NOT_AVAILABLE
    md = cache.update(answer, all_topics=True)
    assert md.partition("t", 0) == PartitionInfo(
        "t", 0, 2, 9, (1, 2, 3), (1, 2, 3), (3,), ErrorCode.REPLICA_NOT_AVAILABLE
    )
    assert type(md.partition("t", 0)) is PartitionInfo


def steps_of(cache, answer, step_rows, **kwargs):
    steps = cache.update_in_steps(answer, step_rows=step_rows, **kwargs)
    count = 0
    for _ in steps:
        count += 1
    return count


def test_merging_in_steps_gives_what_one_step_gives():
    leaders = {p: (p % 3 + 1, p % 7) for p in range(1000)}
    whole, stepped = MetadataCache(), MetadataCache()
    whole.update(metadata(leaders, topics=("a", "b", "c")), all_topics=True, now=5.0)
    assert (
        steps_of(stepped, metadata(leaders, topics=("a", "b", "c")), 64, all_topics=True, now=5.0)
        > 40
    )
    assert stepped.current == whole.current and stepped.last_refresh == 5.0
    # A small answer is one step: the loop is not given extra turns for nothing.
    assert steps_of(MetadataCache(), metadata({0: (1, 1)}), 10_000, all_topics=True) == 0


@pytest.mark.parametrize("how", ["built", "compiled"])
def test_a_change_made_between_steps_is_kept(how):
    cache = MetadataCache()
    cache.update(wire(metadata({p: (1, 5) for p in range(100)}), how), all_topics=True)
    steps = cache.update_in_steps(
        wire(metadata({p: (1, 5) for p in range(100)}), how), all_topics=True, step_rows=10
    )
    next(steps)
    assert cache.update_leader("t", 42, 2, 6)  # a Produce answer's leader hint, meanwhile
    for _ in steps:
        pass
    assert cache.current.partition("t", 42).leader == 2  # the answer (epoch 5) is older
    assert cache.current.partition("t", 41).leader == 1


def test_merging_in_steps_frees_the_answer_in_steps_too():
    cache = MetadataCache()
    answer = metadata({p: (1, 5) for p in range(100)})
    assert steps_of(cache, answer, 10, all_topics=True) >= 19
    assert len(answer.topics[0].partitions) <= 10
    assert cache.current.partitions_for("t") == list(range(100))


def test_rows_share_equal_replica_tuples_and_never_mix_up_different_ones():
    rng = random.Random(11)
    answer = metadata({p: (1, 5) for p in range(3000)})
    for p in answer.topics[0].partitions:  # many sets: slots of the shared table collide
        p.replica_nodes = [rng.randrange(0, 40) for _ in range(rng.randrange(0, 5))]
        p.isr_nodes = [rng.choice([1, 2, 3, 2**40, -1])]
    md = MetadataCache().update(answer, all_topics=True)
    for p in answer.topics[0].partitions:
        row = md.partition("t", p.partition_index)
        assert (list(row.replicas), list(row.isr)) == (p.replica_nodes, p.isr_nodes)
    shared = metadata({p: (1, 5) for p in range(10)})
    rows = MetadataCache().update(shared, all_topics=True).topics["t"].partitions
    assert len({id(row.replicas) for row in rows.values()}) == 1


# The compiled decoder's partitions (a StructArray) are merged from their bytes: the same rows
# and the same kept entries as the partition objects give.


def wire(answer, how):
    """``answer`` as a client may get it: the objects as built, or encoded and decoded by the
    Python decoder or the compiled one."""
    if how == "built":
        return copy.deepcopy(answer)  # (merging in steps empties the answer's lists)
    data = answer.encode(12)
    if how == "python":
        return MetadataResponse.decode(data, 12)[0]
    return decode_metadata_response(data, 12)[0]


def random_partitions(rng, count):
    return {
        p: dict(
            leader=rng.choice([1, 2, 3, -1]),
            epoch=rng.randrange(0, 4),
            replicas=[rng.randrange(1, 6) for _ in range(rng.randrange(0, 4))],
            isr=[rng.randrange(1, 6) for _ in range(rng.randrange(0, 3))],
            offline=[rng.randrange(1, 6)] if rng.random() < 0.1 else [],
            error=rng.choice([0, 0, 0, ErrorCode.LEADER_NOT_AVAILABLE]),
        )
        for p in range(count)
    }


def answer_of(parts, order=None, error_code=0):
    return MetadataResponse(
        brokers=[MetadataResponseBroker(node_id=n, host="h", port=9000 + n) for n in (1, 2, 3)],
        topics=[
            MetadataResponseTopic(
                name="t",
                topic_id=TOPIC_ID,
                error_code=error_code,
                partitions=[
                    MetadataResponsePartition(
                        partition_index=p,
                        leader_id=parts[p]["leader"],
                        leader_epoch=parts[p]["epoch"],
                        replica_nodes=parts[p]["replicas"],
                        isr_nodes=parts[p]["isr"],
                        offline_replicas=parts[p]["offline"],
                        error_code=parts[p]["error"],
                    )
                    for p in (order if order is not None else parts)
                ],
            )
        ],
    )


def changed_answer(rng, parts):
    """A later answer: some partitions changed, some answered by a broker that is behind,
    sometimes in another order, one missing, or one listed twice."""
    after = {p: dict(v) for p, v in parts.items()}
    for p in rng.sample(sorted(after), k=min(len(after), rng.randrange(0, 4))):
        field = rng.choice(["leader", "epoch", "replicas", "isr", "offline", "error", "stale"])
        if field == "stale":
            after[p]["epoch"] -= 1  # an older epoch: the cached row stays
            after[p]["leader"] = 3
        elif field in ("replicas", "isr", "offline"):
            after[p][field] = after[p][field] + [7]
        elif field == "error":
            after[p]["error"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
        else:
            after[p][field] += 1
    order = list(after)
    shape = rng.choice(["same", "same", "shuffled", "missing", "twice", "added"])
    if not order:
        shape = "same"
    if shape == "shuffled":
        rng.shuffle(order)
    elif shape == "missing":
        order.remove(rng.choice(order))
    elif shape == "twice":
        order[rng.randrange(len(order))] = rng.choice(order)
    elif shape == "added":
        after[len(order)] = dict(after[0])
        order.append(len(order))
    return answer_of(after, order)


@pytest.mark.parametrize("seed", range(40))
def test_decoded_partitions_merge_as_the_objects_do(seed):
    rng = random.Random(seed)
    parts = random_partitions(rng, rng.choice([0, 1, 5, 60]))
    first, later = answer_of(parts), changed_answer(rng, parts)
    results = {}
    for how in ("built", "python", "compiled"):
        cache = MetadataCache()
        before = cache.update(wire(first, how), all_topics=True)
        steps_of(cache, wire(later, how), rng.choice([7, 1000]), all_topics=True)
        after = cache.current
        kept_topic = after.topics["t"] is before.topics["t"]
        kept_rows = {
            p
            for p, row in after.topics["t"].partitions.items()
            if before.topics["t"].partitions.get(p) is row
        }
        results[how] = (after.topics, kept_topic, kept_rows)
    assert results["compiled"] == results["python"] == results["built"]


def test_an_unchanged_topic_is_compared_without_building_its_rows():
    answer = metadata({p: (1, 5) for p in range(300)})
    cache = MetadataCache()
    first = cache.update(wire(answer, "compiled"), all_topics=True)
    rows = first.topics["t"].partitions
    partitions = wire(answer, "compiled").topics[0].partitions
    cursor = 0
    for start in range(0, 300, 64):  # in steps, as update_in_steps does
        cursor = rows_unchanged(partitions, rows, PartitionInfo, start, start + 64, cursor)
        assert cursor > 0
    assert rows_unchanged(partitions, dict(reversed(rows.items())), PartitionInfo, 0, 300, 0) < 0
    assert rows_unchanged(list(partitions), rows, PartitionInfo, 0, 300, 0) < 0  # objects: build
    assert cache.update(wire(answer, "compiled"), all_topics=True).topics["t"] is first.topics["t"]
    # Nothing was made of the answer's partitions: they are still bytes.
    second = wire(answer, "compiled")
    cache.update(second, all_topics=True)
    assert not second.topics[0].partitions.elements_made


def merge_outcome(answer, into=None):
    """What merging ``answer`` (in steps of 3 partitions) into a cache gives: the cache's
    topics, or the kcore error it raised. ``into``: an answer merged first (a warm cache)."""
    cache = MetadataCache()
    try:
        if into is not None:
            cache.update(into, all_topics=True)
        steps_of(cache, answer, 3, all_topics=True)
    except KcoreError as exc:
        return ("error", type(exc))
    return ("ok", cache.current.topics, cache.current.brokers)


def check_merges_agree(data, version):
    """For bytes both decoders read (tests/test_protocol_compiled_decoders.py checks they
    agree): the compiled decoder's answer, partitions read from their bytes, merges as the
    Python decoder's objects do, into a cold cache and into one that holds the same answer.
    ``fuzz/fuzz_codec.py --target=responses`` calls this too."""
    try:
        MetadataResponse.decode(data, version)
    except KcoreError:
        return

    def python():  # a new answer each time: merging in steps empties its lists
        return MetadataResponse.decode(data, version)[0]

    def compiled():
        return decode_metadata_response(data, version)[0]

    assert merge_outcome(compiled()) == merge_outcome(python())
    assert merge_outcome(compiled(), into=compiled()) == merge_outcome(python(), into=python())
    assert merge_outcome(compiled(), into=python()) == merge_outcome(python(), into=python())


@settings(max_examples=300, deadline=None)
@given(
    pick=st.integers(min_value=0),
    edits=st.lists(
        st.tuples(st.integers(min_value=0), st.binary(min_size=1, max_size=6)), max_size=4
    ),
)
def test_damaged_answers_merge_alike_from_either_decoder(pick, edits):
    version, data = MERGE_ENCODINGS[pick % len(MERGE_ENCODINGS)]
    damaged = bytearray(data)
    for at, chunk in edits:
        at %= len(damaged)
        damaged[at : at + len(chunk)] = chunk
    check_merges_agree(bytes(damaged), version)


def merge_encodings():
    rng = random.Random(21)
    out = []
    for version in (1, 7, 9, 12, 13):
        for count in (1, 8):
            parts = random_partitions(rng, count)
            answer = answer_of(parts)
            answer.topics.append(changed_answer(rng, parts).topics[0])  # "t" twice
            answer.topics[1].name = "u"
            out.append((version, answer.encode(version)))
    return out


MERGE_ENCODINGS = merge_encodings()
