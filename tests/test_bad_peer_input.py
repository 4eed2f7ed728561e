"""Bad input from a peer or a config ends in a kcore error naming it (or a retry like any
unreachable broker's), never a raw Python exception or a silent loop: host names the IDNA rules
reject, ports outside 0-65535, node ids anywhere in int32, coordinators Metadata does not
list, corrupt record batches in a Fetch answer and answers that make no progress, over-long
client ids.

The peer is a tiny fake broker: a TCP server on 127.0.0.1 built from kcore's own generated
protocol classes, answering ApiVersions correctly and then what each test scripts."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import pytest

from kcore import AdminClient, Consumer, TopicPartition
from kcore.cluster import ClusterClient
from kcore.config import ClientConfig
from kcore.errors import (
    BootstrapError,
    BrokerConnectionError,
    ConfigError,
    ErrorCode,
    RebootstrapRequiredError,
)
from kcore.network.address import address_problem
from kcore.network.connection import BrokerConnection, ConnectionSettings
from kcore.protocol import ApiKey, request_class, request_header_version, response_header_version
from kcore.protocol.messages import ApiVersionsResponse, MetadataResponse, RequestHeader
from kcore.protocol.messages.api_versions_response import ApiVersion
from kcore.protocol.messages.metadata_response import (
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from kcore.protocol.messages.response_header import ResponseHeader

BAD_HOSTS = ["kafka..example.com", "a" * 64 + ".example.com", "x" * 300]

# What the fake broker says it supports: few versions, each within kcore's range.
VERSIONS = {
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.METADATA: (1, 13),  # (13: the top-level error code, KIP-1102)
    ApiKey.FETCH: (4, 12),  # (before topic ids: the fake answers by name)
    ApiKey.LIST_OFFSETS: (1, 5),
}

Handler = Callable[[Any, int], Any]


class FakeBroker:
    """Answers ApiVersions, then each request with ``handlers[api_key](request, version)``
    (a response object); a request without a handler closes the connection. ``requests``
    counts what came in, by API key."""

    def __init__(self, handlers: dict[int, Handler]) -> None:
        self.handlers = handlers
        self.requests: dict[int, int] = {}
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = False
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def count(self, api_key: int) -> int:
        with self._lock:
            return self.requests.get(api_key, 0)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    frame = _read_exactly(conn, struct.unpack(">i", _read_exactly(conn, 4))[0])
                    api_key, version = struct.unpack_from(">hh", frame)
                    header, pos = RequestHeader.decode(
                        frame, request_header_version(api_key, version)
                    )
                    with self._lock:
                        self.requests[api_key] = self.requests.get(api_key, 0) + 1
                    if api_key == ApiKey.API_VERSIONS:
                        body = ApiVersionsResponse(
                            api_keys=[
                                ApiVersion(api_key=k, min_version=lo, max_version=hi)
                                for k, (lo, hi) in VERSIONS.items()
                            ]
                        )
                        version = min(version, VERSIONS[ApiKey.API_VERSIONS][1])
                        header_version = 0  # (ApiVersions answers always have header v0)
                    elif api_key in self.handlers:
                        request, _ = request_class(api_key).decode(frame, version, pos)
                        body = self.handlers[api_key](request, version)
                        header_version = response_header_version(api_key, version)
                    else:
                        return
                    out = ResponseHeader(correlation_id=header.correlation_id).encode(
                        header_version
                    ) + body.encode(version)
                    conn.sendall(struct.pack(">i", len(out)) + out)
            except (OSError, EOFError):
                return

    def close(self) -> None:
        self._closed = True
        self._server.close()
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> FakeBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


def metadata_answer(
    brokers: list[tuple[int, str, int]], topics: dict[str, int] | None = None
) -> Handler:
    """Metadata listing ``brokers`` (node id, host, port) and ``topics`` (name: leader id,
    one partition each)."""

    def answer(request: Any, version: int) -> Any:
        return MetadataResponse(
            brokers=[MetadataResponseBroker(node_id=n, host=h, port=p) for n, h, p in brokers],
            cluster_id="fake",
            controller_id=brokers[0][0],
            topics=[
                MetadataResponseTopic(
                    name=name,
                    partitions=[
                        MetadataResponsePartition(
                            partition_index=0,
                            leader_id=leader,
                            leader_epoch=0,
                            replica_nodes=[leader],
                            isr_nodes=[leader],
                            offline_replicas=[],
                        )
                    ],
                )
                for name, leader in (topics or {}).items()
            ],
        )

    return answer


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- 1. host names the IDNA codec rejects ---------------------------------------------------------


@pytest.mark.parametrize("host", BAD_HOSTS)
def test_address_problem_names_what_is_wrong(host):
    assert "not a valid host name" in (address_problem(host, 9092) or "")
    assert address_problem("kafka.example.com", 9092) is None
    assert address_problem("::1", 9092) is None
    assert address_problem("h", 99999) == "port 99999 is outside 0-65535"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("host", BAD_HOSTS)
def test_a_host_idna_rejects_is_a_dns_failure_of_the_connection(host):
    async def main():
        conn = BrokerConnection(host, 9092, ConnectionSettings())
        with pytest.raises(BrokerConnectionError) as info:
            await conn.open()
        assert info.value.stage == "dns"
        assert "not a valid host name" in info.value.reason

    run(main())


@pytest.mark.timeout(60)
def test_whatever_dialling_raises_is_a_connect_failure():
    """The address checks aside, an exception from creating the connection (a port the socket
    layer refuses, here) is a BrokerConnectionError, not the raw exception."""

    async def main():
        conn = BrokerConnection("127.0.0.1", 9092, ConnectionSettings())
        with pytest.raises(BrokerConnectionError) as info:
            await conn._connect("127.0.0.1", 70000)  # (past open()'s own port check)
        assert info.value.stage == "connect"
        assert "OverflowError" in info.value.reason

    run(main())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad_first", [True, False])
def test_one_bad_bootstrap_name_and_one_good_bootstrap(bad_first, monkeypatch):
    """The bootstrap list is shuffled: forced both ways, the bad name is skipped (as an
    unknown host) and the client works."""
    import random

    def ordered(items: list[Any]) -> None:  # (brokers' node ids are shuffled too)
        items.sort(key=lambda a: (".." not in str(a)) if bad_first else (".." in str(a)))

    monkeypatch.setattr(random, "shuffle", ordered)
    with FakeBroker({ApiKey.METADATA: metadata_answer([(1, "127.0.0.1", 0)])}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer(
            [(1, "127.0.0.1", broker.port)], {"t": 1}
        )
        servers = f"kafka..example.com:9092,{broker.address}"
        with AdminClient({"bootstrap.servers": servers}) as admin:
            assert "t" in admin.list_topics(timeout=20)


@pytest.mark.timeout(60)
def test_a_metadata_answer_with_a_top_level_error_is_an_error_not_an_empty_cluster():
    """KIP-1102: a Metadata answer whose top-level error is REBOOTSTRAP_REQUIRED lists no
    topics; list_topics raises the error (it returned [] before), and the client bootstraps again
    before its next refresh, after which list_topics works."""
    with FakeBroker({ApiKey.METADATA: metadata_answer([(1, "127.0.0.1", 0)])}) as broker:
        good = metadata_answer([(1, "127.0.0.1", broker.port)], {"t": 1})
        broker.handlers[ApiKey.METADATA] = good
        with AdminClient({"bootstrap.servers": broker.address}) as admin:
            assert admin.list_topics(timeout=20) == ["t"]

            def stale(request: Any, version: int) -> Any:
                answer = good(request, version)
                answer.topics = []
                answer.error_code = ErrorCode.REBOOTSTRAP_REQUIRED
                return answer

            broker.handlers[ApiKey.METADATA] = stale
            with pytest.raises(RebootstrapRequiredError, match="Metadata from node 1"):
                admin.list_topics(timeout=20)
            assert admin.cluster.bootstrapped is False
            broker.handlers[ApiKey.METADATA] = good
            assert admin.list_topics(timeout=20) == ["t"]


@pytest.mark.timeout(60)
def test_only_bad_bootstrap_names_end_in_a_bootstrap_error():
    async def main():
        client = ClusterClient({"bootstrap.servers": "kafka..example.com:9092"})
        await client.start()
        try:
            with pytest.raises(BootstrapError, match="empty label"):
                await client.ready(1.0)
        finally:
            await client.close()

    run(main())


def test_bootstrap_entries_that_can_never_work_are_config_errors():
    """As Java's ClientUtils.parseAndValidateAddresses: a port out of range or a host with
    characters no host name has is refused at construction, naming the entry. (A name that is
    well formed but not resolvable, or that IDNA rejects, is left for resolving to report, as
    Java leaves it: the first test above.)"""
    for entry in ("kafka:99999", "kafka:-1", "ka fka:9092", "kafka"):
        with pytest.raises(ConfigError, match="bootstrap.servers") as info:
            ClientConfig({"bootstrap.servers": f"good:9092,{entry}"}, role="common")
        assert entry in str(info.value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad_first", [True, False])
def test_one_bad_and_one_good_bootstrap_entry_against_a_real_broker(
    kafka_cluster, bad_first, monkeypatch
):
    """A name the IDNA rules reject next to a real broker's address, tried first and last:
    the admin client and a producer work."""
    import random

    from kcore import Producer

    def ordered(items: list[Any]) -> None:
        items.sort(key=lambda a: (".." not in str(a)) if bad_first else (".." in str(a)))

    monkeypatch.setattr(random, "shuffle", ordered)
    import uuid

    from kcore.admin import NewTopic

    topic = f"bad-peer-input-{uuid.uuid4().hex[:8]}"
    servers = f"{'a' * 64}..example.com:9092,{kafka_cluster.bootstrap_servers}"
    with AdminClient({"bootstrap.servers": servers}) as admin:
        admin.wait_until_ready(timeout=30)
        assert admin.describe_cluster(timeout=30).brokers
        admin.create_topics([NewTopic(topic, 1, 1)])
    with Producer({"bootstrap.servers": servers}) as producer:
        producer.send(topic, b"v").result(30)


# -- 2. metadata with an impossible broker address ----------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "host, port, why",
    [
        ("127.0.0.1", 99999, "port 99999 is outside 0-65535"),
        ("127.0.0.1", -5, "port -5 is outside 0-65535"),
        ("kafka..example.com", 9092, "empty label"),
        ("", 9092, "the host is empty"),
    ],
)
def test_a_broker_advertised_at_an_impossible_address_is_unreachable(host, port, why, caplog):
    """Broker 2 leads topic ``bad`` at an address no connection can be made to: it is left out
    of the brokers (logged once), asking for its connection says why, and the rest of the
    cluster (broker 1, leading ``good``) works."""
    with FakeBroker({}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer(
            [(1, "127.0.0.1", broker.port), (2, host, port)], {"good": 1, "bad": 2}
        )

        async def main():
            client = ClusterClient({"bootstrap.servers": broker.address})
            await client.start()
            try:
                md = await client.ready(20)
                assert sorted(md.brokers) == [1]
                assert why in md.unusable_brokers[2]
                assert md.leader_for("good", 0) is not None
                assert md.leader_for("bad", 0) is None
                with pytest.raises(BrokerConnectionError, match="cannot be dialled") as info:
                    await client.connection(2)
                assert why in str(info.value)
                await client.refresh_metadata()
                await client.refresh_metadata()
            finally:
                await client.close()

        with caplog.at_level(logging.WARNING, logger="kcore.cluster"):
            run(main())
        logged = [r for r in caplog.records if "no connection can be made to" in r.getMessage()]
        assert len(logged) == 1  # once, however many answers list it


@pytest.mark.timeout(60)
def test_a_leader_at_an_impossible_address_is_a_kcore_error_after_retries():
    """Reading a partition whose leader cannot be dialled waits as for an offline leader and
    ends in a kcore error, not an OverflowError."""
    from kcore.errors import KcoreError

    with FakeBroker({}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer(
            [(1, "127.0.0.1", broker.port), (2, "127.0.0.1", 70000)], {"bad": 2}
        )
        with AdminClient({"bootstrap.servers": broker.address}) as admin:
            with pytest.raises(
                KcoreError,
                match=r"bad-0 has no leader that can be reached: broker 2 is listed at an "
                r"address that cannot be dialled \(port 70000 is outside 0-65535\)",
            ):
                admin.list_offsets({TopicPartition("bad", 0): "latest"}, timeout=2)


@pytest.mark.timeout(60)
def test_a_bootstrap_answer_listing_only_impossible_addresses_is_skipped():
    """A bootstrap server whose answer lists no broker that can be dialled is passed over,
    like one listing none; the other one's answer is used."""
    with FakeBroker({}) as liar, FakeBroker({}) as good:
        liar.handlers[ApiKey.METADATA] = metadata_answer([(1, "127.0.0.1", 99999)], {"t": 1})
        good.handlers[ApiKey.METADATA] = metadata_answer([(1, "127.0.0.1", good.port)], {"t": 1})

        async def main():
            client = ClusterClient({"bootstrap.servers": f"{liar.address},{good.address}"})
            await client.start()
            try:
                md = await client.ready(20)
                assert md.brokers[1].port == good.port
            finally:
                await client.close()

        for _ in range(4):  # (either may be asked first)
            run(main())

    async def alone():
        client = ClusterClient({"bootstrap.servers": liar.address})
        await client.start()
        try:
            with pytest.raises(BootstrapError, match="no broker that can be dialled"):
                await client.ready(1.0)
        finally:
            await client.close()

    with FakeBroker({}) as liar:
        liar.handlers[ApiKey.METADATA] = metadata_answer([(1, "127.0.0.1", 99999)], {"t": 1})
        run(alone())


# -- 3. node ids anywhere in int32 --------------------------------------------------------------


@pytest.mark.parametrize("node_id", [0, 1, 2**30 + 1, 2**31 - 1, -1, -(2**31)])
def test_coordinator_connection_keys_never_equal_a_node_id(node_id):
    from kcore.cluster.client import broker_id, coordinator_connection_id
    from kcore.cluster.metadata import BrokerInfo

    key = coordinator_connection_id(BrokerInfo(node_id, "127.0.0.1", 9092))
    assert broker_id(key) == node_id
    assert broker_id(node_id) == node_id  # a node id leads to itself, however large
    for other in (node_id, 2**31 - 1 - node_id, -node_id):
        assert key != other
        assert {key: "coordinator", other: "node"}[other] == "node"  # distinct dict keys


@pytest.mark.timeout(60)
@pytest.mark.parametrize("node_id", [2**30 + 7, 2**31 - 1, 0])
def test_a_broker_with_any_int32_node_id_is_connected_to(node_id):
    """Before, an id above (2**31-1)//2 was taken for a coordinator connection's and mapped to
    another node. Both the broker's connection and its coordinator connection reach it."""
    from kcore.cluster.client import coordinator_connection_id

    with FakeBroker({}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer(
            [(node_id, "127.0.0.1", broker.port)], {"t": node_id}
        )

        async def main():
            client = ClusterClient({"bootstrap.servers": broker.address})
            await client.start()
            try:
                md = await client.ready(20)
                assert md.leader_for("t", 0).node_id == node_id
                plain = await client.connection(node_id)
                coordinator = await client.connection(
                    coordinator_connection_id(md.brokers[node_id])
                )
                assert plain is not coordinator
                assert plain.node_id == coordinator.node_id == node_id
                assert plain.is_ready and coordinator.is_ready
            finally:
                await client.close()

        run(main())


@pytest.mark.timeout(60)
def test_a_coordinator_the_metadata_does_not_list_is_dialled_where_find_coordinator_says():
    """As Java's client: the coordinator connection goes to FindCoordinator's host and port,
    whether or not the metadata lists that node (yet)."""
    from kcore.cluster.client import coordinator_connection_id
    from kcore.cluster.metadata import BrokerInfo

    with FakeBroker({}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer([(1, "127.0.0.1", broker.port)])

        async def main():
            client = ClusterClient({"bootstrap.servers": broker.address})
            await client.start()
            try:
                md = await client.ready(20)
                assert 77 not in md.brokers
                key = coordinator_connection_id(BrokerInfo(77, "127.0.0.1", broker.port))
                conn = await client.connection(key)
                assert conn.is_ready and conn.node_id == 77
                assert await client.connection(key) is conn  # kept, as any other
            finally:
                await client.close()

        run(main())


@pytest.mark.parametrize(
    "host, port, why",
    [
        ("a" * 64 + ".example.com", 9092, "longer than 63"),
        ("127.0.0.1", 70000, "outside 0-65535"),
        ("127.0.0.1", -1, "outside 0-65535"),
        ("", 9092, "empty"),
    ],
)
def test_a_coordinator_at_an_impossible_address_is_a_connection_error(host, port, why):
    """FindCoordinator's address is checked as a Metadata one is: a BrokerConnectionError
    naming the problem (the coordinator is then looked up again), never a raw exception."""
    from kcore.cluster.client import coordinator_connection_id
    from kcore.cluster.metadata import BrokerInfo

    async def main():
        client = ClusterClient({"bootstrap.servers": "127.0.0.1:1"})
        try:
            key = coordinator_connection_id(BrokerInfo(2, host, port))
            with pytest.raises(BrokerConnectionError, match="FindCoordinator named") as info:
                await client.connection(key)
            assert why in str(info.value) and info.value.stage == "connect"
        finally:
            await client.close()

    run(main())


# -- 4. corrupt record batches in a Fetch answer ------------------------------------------------


def batch(base: int, n: int) -> bytes:
    from kcore.codec import RecordBatchBuilder

    builder = RecordBatchBuilder("none", base_offset=base)
    for i in range(n):
        builder.append(None, b"v%d" % (base + i), 1000 + i)
    return builder.build()


def with_length(data: bytes, length: int) -> bytes:
    """``data`` (one batch) with its length field set to ``length``."""
    return data[:8] + struct.pack(">i", length) + data[12:]


TP = TopicPartition("t", 0)


def fetcher(max_bytes: int = 1 << 20, partition_max_bytes: int = 1 << 20) -> Any:
    from kcore.consumer.fetcher import Fetcher
    from kcore.consumer.positions import PartitionState

    config = ClientConfig({"bootstrap.servers": "127.0.0.1:1"}, role="consumer")
    f = Fetcher(
        ClusterClient(config),
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=max_bytes,
        partition_max_bytes=partition_max_bytes,
        isolation_level=0,
        reset_policy="earliest",
    )
    f.positions.add(TP, PartitionState(position=5))
    return f


def answer(f: Any, records: bytes, room: int | None = None) -> None:
    """The broker answers ``records`` for TP at its position (``room``: what the response's
    size limits left for it)."""
    from types import SimpleNamespace

    async def go() -> None:
        response = SimpleNamespace(
            error_code=0, high_watermark=100, records=records, aborted_transactions=None
        )
        st = f.positions.require(TP)
        offset = st.fetch_position if st.fetch_position is not None else st.position
        extra = {} if room is None else {"room": room}
        f._handle_partition(TP, offset, -1, response, **extra)

    asyncio.run(go())


def queued(f: Any) -> tuple[list[Any], list[BaseException]]:
    items = f.buffer.peek()
    return [d for d in items if d.error is None], [d.error for d in items if d.error is not None]


@pytest.mark.parametrize("length", [-1, -(2**31), 0, 13])
def test_a_batch_length_no_batch_has_stops_the_partition(length):
    from kcore.errors import CorruptRecordError

    f = fetcher()
    answer(f, with_length(batch(5, 3), length))
    data, errors = queued(f)
    assert data == []
    (error,) = errors
    assert isinstance(error, CorruptRecordError)
    assert str(error) == (
        f"t-0: corrupt record batch at offset 5: its length field says {length} bytes "
        "(a batch has at least 14)"
    )
    st = f.positions.require(TP)
    assert st.retry_at > 0  # asked again only after a backoff, growing while it fails
    answer(f, with_length(batch(5, 3), length))
    assert st.errors == 2 and len(queued(f)[1]) == 1  # (one error queued at a time)


def test_a_partial_trailing_batch_still_works():
    """The broker cut the answer at its size limit: the whole batches are taken, and the next
    fetch starts at the cut one."""
    f = fetcher()
    one, two = batch(5, 3), batch(8, 4)
    answer(f, one + two[:20])
    data, errors = queued(f)
    assert errors == [] and len(data) == 1
    assert f.positions.require(TP).fetch_position == 8


def test_a_partial_first_batch_is_asked_for_whole_once():
    f = fetcher(partition_max_bytes=64)
    whole = batch(5, 20)
    answer(f, whole[:64])
    st = f.positions.require(TP)
    assert queued(f) == ([], [])
    assert st.batch_bytes == len(whole) and st.retry_at == 0.0  # at once, for all of it
    answer(f, whole)
    data, errors = queued(f)
    assert errors == [] and len(data) == 1 and st.batch_bytes == 0


def test_only_part_of_a_batch_again_when_all_of_it_could_come_is_an_error():
    from kcore.errors import CorruptRecordError

    f = fetcher()
    lying = with_length(batch(5, 3), 10_000_000)  # points far past the end of the answer
    answer(f, lying)
    assert queued(f) == ([], [])
    answer(f, lying)
    data, errors = queued(f)
    assert data == []
    (error,) = errors
    assert isinstance(error, CorruptRecordError)
    assert str(error).startswith(
        f"t-0: failed to make progress fetching offset 5: the broker answered again with only "
        f"{len(lying)} bytes of a record batch whose header says 10000012"
    )


def test_only_part_again_for_lack_of_room_backs_off_without_an_error():
    """Other partitions of the answer took fetch.max.bytes: not an error, but not asked again
    at once either."""
    f = fetcher()
    whole = batch(5, 20)
    answer(f, whole[:40], room=40)
    answer(f, whole[:40], room=40)
    assert queued(f) == ([], [])
    assert f.positions.require(TP).retry_at > 0


def test_whole_batches_before_a_corrupt_one_are_kept():
    """No record the broker sent whole is lost: the good batch is handed out, the corrupt one
    after it is reported when the partition's fetch reaches it."""
    from kcore.errors import CorruptRecordError

    f = fetcher()
    answer(f, batch(5, 3) + with_length(batch(8, 2), -7))
    data, errors = queued(f)
    assert errors == [] and len(data) == 1
    answer(f, with_length(batch(8, 2), -7))
    _, errors = queued(f)
    assert isinstance(errors[0], CorruptRecordError) and "offset 8" in str(errors[0])


def compacted(base: int, n: int, last: int) -> bytes:
    """A batch of ``n`` records from ``base`` whose header says it ends at ``last``, as
    compaction leaves one whose last records were removed (its CRC made right again)."""
    from kcore.codec import crc32c

    data = bytearray(batch(base, n))
    struct.pack_into(">i", data, 23, last - base)  # lastOffsetDelta
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


def test_answers_with_only_batches_before_the_offset_back_off_then_stop_the_partition():
    """Batches that all end before the fetch offset (5): nothing to hand out, nothing to move
    past. Fetched again after a growing backoff, never at once; the third such answer in a
    row is a CorruptRecordError, and so is each one after it."""
    from kcore.consumer.fetcher import NO_PROGRESS_ANSWERS
    from kcore.errors import CorruptRecordError

    f = fetcher()
    st = f.positions.require(TP)
    for n in range(1, NO_PROGRESS_ANSWERS):
        answer(f, batch(0, 3) + batch(3, 2))
        assert queued(f) == ([], [])
        assert st.errors == n and st.retry_at > 0 and st.fetch_position is None
    answer(f, batch(0, 3) + batch(3, 2))
    data, errors = queued(f)
    assert data == []
    (error,) = errors
    assert isinstance(error, CorruptRecordError)
    assert str(error) == (
        f"t-0: failed to make progress fetching offset 5: the broker answered "
        f"{NO_PROGRESS_ANSWERS} times in a row with only record batches that end before it "
        "(the last at offset 4)"
    )
    answer(f, batch(0, 3))
    assert len(queued(f)[1]) == 1 and st.errors == NO_PROGRESS_ANSWERS + 1  # (one at a time)


def test_an_answer_that_makes_progress_starts_the_count_again():
    from kcore.consumer.fetcher import NO_PROGRESS_ANSWERS

    f = fetcher()
    st = f.positions.require(TP)
    for _ in range(NO_PROGRESS_ANSWERS - 1):
        answer(f, batch(0, 3))
    answer(f, batch(0, 3) + batch(5, 2))  # a batch before the offset, then one at it
    data, errors = queued(f)
    assert errors == [] and len(data) == 1 and st.fetch_position == 7
    assert st.errors == 0 and st.behind_answers == 0
    f.drop_queued(TP)
    for _ in range(NO_PROGRESS_ANSWERS - 1):
        answer(f, batch(0, 3))
    assert queued(f) == ([], [])
    st.seek(5)  # a seek gives the offset a new try too
    for _ in range(NO_PROGRESS_ANSWERS - 1):
        answer(f, batch(0, 3))
    assert queued(f) == ([], [])


@pytest.mark.parametrize("last", [5, 9])
def test_a_compacted_batch_ending_at_or_past_the_offset_is_progress(last):
    """A batch whose records compaction removed from its end still ends at its last offset:
    the fetch moves past it (as Java's next fetch offset, the batch's last offset + 1), with
    no backoff and no error."""
    f = fetcher()
    answer(f, compacted(0, 3, last))
    data, errors = queued(f)
    assert errors == [] and len(data) == 1
    st = f.positions.require(TP)
    assert st.fetch_position == last + 1 and st.errors == 0 and st.retry_at == 0.0


def fetch_answer(batches: list[tuple[int, bytes]]) -> Handler:
    """Fetch answers from ``batches`` ((first offset, bytes), in order): as a broker, from the
    batch holding the fetch offset on."""
    from kcore.protocol.messages import FetchResponse
    from kcore.protocol.messages.fetch_response import FetchableTopicResponse, PartitionData

    def answer(request: Any, version: int) -> Any:
        parts = [
            PartitionData(
                partition_index=p.partition,
                high_watermark=100,
                last_stable_offset=100,
                log_start_offset=0,
                aborted_transactions=[],
                records=b"".join(
                    data
                    for i, (first, data) in enumerate(batches)
                    if i + 1 == len(batches) or batches[i + 1][0] > p.fetch_offset
                ),
            )
            for t in request.topics
            for p in t.partitions
        ]
        return FetchResponse(responses=[FetchableTopicResponse(topic="t", partitions=parts)])

    return answer


@pytest.mark.timeout(60)
@pytest.mark.parametrize("corrupt_length", [-1, 10_000_000])
def test_poll_raises_a_corrupt_batch_naming_topic_partition_and_offset(corrupt_length):
    """Against a fake broker: the records before the corrupt batch come out of poll, then poll
    raises CorruptRecordError, and the consumer does not fetch in a loop meanwhile."""
    from kcore.errors import CorruptRecordError

    records = [(0, batch(0, 5)), (5, with_length(batch(5, 3), corrupt_length))]
    with FakeBroker({ApiKey.FETCH: fetch_answer(records)}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer(
            [(1, "127.0.0.1", broker.port)], {"t": 1}
        )
        with Consumer({"bootstrap.servers": broker.address, "fetch.max.wait.ms": 100}) as c:
            c.assign([TP])
            c.seek(TP, 0)
            got: list[Any] = []
            error: BaseException | None = None
            for _ in range(40):
                try:
                    got += c.poll(0.25)
                except CorruptRecordError as exc:
                    error = exc
                    break
            assert [r.offset for r in got] == [0, 1, 2, 3, 4]
            assert error is not None, "poll never raised"
            assert str(error).startswith("t-0: ") and "offset 5" in str(error)
            # Before: ~2,500 Fetch requests a second. Now a handful, then backoffs.
            assert broker.count(ApiKey.FETCH) < 40


@pytest.mark.timeout(60)
def test_fetches_of_caught_up_partitions_wait_briefly_while_others_are_held_back():
    """t-0 has more records than the read-ahead holds, t-1 none. Once t-0's read-ahead is
    full (nothing polls), the fetches that ask for t-1 alone must not hold the node for
    fetch.max.wait.ms: once poll drained t-0, its next fetch would wait behind them (one
    fetch in flight a node), a stall of up to 500 ms. They are put off (about 50 ms apart,
    not one after another) and ask the broker not to wait at all."""
    import time

    from kcore.protocol.messages import FetchResponse
    from kcore.protocol.messages.fetch_response import FetchableTopicResponse, PartitionData

    asked: list[tuple[list[int], int]] = []  # (partitions asked, max_wait_ms) per request

    def fetch(request: Any, version: int) -> Any:
        asked.append(
            (sorted(p.partition for t in request.topics for p in t.partitions), request.max_wait_ms)
        )
        parts = [
            PartitionData(
                partition_index=p.partition,
                high_watermark=10**6 if p.partition == 0 else 0,
                last_stable_offset=10**6 if p.partition == 0 else 0,
                log_start_offset=0,
                aborted_transactions=[],
                records=batch(p.fetch_offset, 10) if p.partition == 0 else b"",
            )
            for t in request.topics
            for p in t.partitions
        ]
        return FetchResponse(responses=[FetchableTopicResponse(topic="t", partitions=parts)])

    def two_partitions(request: Any, version: int) -> Any:
        answer = metadata_answer([(1, "127.0.0.1", broker.port)], {"t": 1})(request, version)
        (topic,) = answer.topics
        (p0,) = topic.partitions
        topic.partitions = [
            p0,
            MetadataResponsePartition(
                partition_index=1,
                leader_id=1,
                leader_epoch=0,
                replica_nodes=[1],
                isr_nodes=[1],
                offline_replicas=[],
            ),
        ]
        return answer

    with FakeBroker({ApiKey.FETCH: fetch}) as broker:
        broker.handlers[ApiKey.METADATA] = two_partitions
        with Consumer({"bootstrap.servers": broker.address, "fetch.max.wait.ms": 500}) as c:
            tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
            c.assign(tps)
            for tp in tps:
                c.seek(tp, 0)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not any(a == [1] for a, _ in list(asked)):
                time.sleep(0.05)
            time.sleep(0.2)
            got = list(asked)
    assert any(a == [0, 1] for a, _ in got)
    alone = [wait for a, wait in got if a == [1]]
    assert alone, got
    assert set(alone) == {0}, got  # not fetch.max.wait.ms
    assert {wait for a, wait in got if 0 in a} == {500}
    # Put off, not sent back to back: 0.2 s of them is a handful, not hundreds (the bound is
    # loose: a loaded machine may run the loop late, never early)
    assert len(alone) <= 8, got


@pytest.mark.timeout(60)
def test_poll_moves_past_a_compacted_batch_whose_records_end_before_the_position():
    """Compaction removed offsets 7-9 from the batch holding the position (8): poll moves on
    to the next batch without a backoff, as a real broker's log requires."""
    records = [(0, batch(0, 5)), (5, compacted(5, 2, 9)), (10, batch(10, 2))]
    with FakeBroker({ApiKey.FETCH: fetch_answer(records)}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer(
            [(1, "127.0.0.1", broker.port)], {"t": 1}
        )
        with Consumer({"bootstrap.servers": broker.address, "fetch.max.wait.ms": 100}) as c:
            c.assign([TP])
            c.seek(TP, 8)
            got: list[Any] = []
            for _ in range(40):
                got += c.poll(0.25)
                if got:
                    break
            assert [r.offset for r in got] == [10, 11]
            assert c.position(TP) == 12


@pytest.mark.timeout(60)
def test_poll_raises_when_every_answer_ends_before_the_position():
    """A peer that answers a fetch at 50 with the batch 0-9, again and again: poll raises
    CorruptRecordError naming the partition and the offset, after a few fetches spaced by
    the backoff (before: a silent loop of Fetch requests)."""
    from kcore.errors import CorruptRecordError

    def only_the_first_batch(request: Any, version: int) -> Any:
        return fetch_answer([(0, batch(0, 10))])(request, version)

    with FakeBroker({ApiKey.FETCH: only_the_first_batch}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer(
            [(1, "127.0.0.1", broker.port)], {"t": 1}
        )
        with Consumer({"bootstrap.servers": broker.address, "fetch.max.wait.ms": 100}) as c:
            c.assign([TP])
            c.seek(TP, 50)
            with pytest.raises(CorruptRecordError) as info:
                for _ in range(40):
                    assert c.poll(0.25) == []
            assert str(info.value).startswith("t-0: failed to make progress fetching offset 50")
            assert c.position(TP) == 50
            assert broker.count(ApiKey.FETCH) < 10


@pytest.mark.timeout(60)
def test_a_spark_read_fails_with_the_corrupt_batch():
    """The Spark source's read of a partition (run here as its executor runs it, without a
    JVM) ends in the CorruptRecordError, not a stall judged as data loss."""
    from kcore.errors import CorruptRecordError
    from kcore.spark.options import parse_read_options
    from kcore.spark.range_reader import KafkaInputPartition, arrow_schema, read_range

    records = [(0, batch(0, 5)), (5, with_length(batch(5, 3), -1))]
    with FakeBroker({ApiKey.FETCH: fetch_answer(records)}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer(
            [(1, "127.0.0.1", broker.port)], {"t": 1}
        )
        options = {"kafka.bootstrap.servers": broker.address, "subscribe": "t"}
        opts = parse_read_options(options, streaming=False)
        from kcore.spark.options import read_schema

        target = arrow_schema(read_schema(options))
        rows = 0
        with pytest.raises(CorruptRecordError, match="t-0: corrupt record batch at offset 5"):
            for rb in read_range(KafkaInputPartition("t", 0, 0, 8), opts, target):
                rows += rb.num_rows
        assert rows == 5


@pytest.mark.timeout(60)
def test_a_batch_the_codec_rejects_is_raised_naming_the_partition_and_offset():
    """A whole batch with a flipped byte (its CRC no longer matches): the codec's error, with
    the partition and the offset fetched in front of its byte position."""
    from kcore.errors import CrcMismatchError

    good = batch(0, 5)
    flipped = good[:-1] + bytes([good[-1] ^ 0xFF])
    with FakeBroker({ApiKey.FETCH: fetch_answer([(0, flipped)])}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer(
            [(1, "127.0.0.1", broker.port)], {"t": 1}
        )
        with Consumer({"bootstrap.servers": broker.address, "fetch.max.wait.ms": 100}) as c:
            c.assign([TP])
            c.seek(TP, 0)
            with pytest.raises(CrcMismatchError, match=r"^t-0: fetched at offset 0: .*CRC"):
                for _ in range(40):
                    assert c.poll(0.25) == []


# -- 5. smaller: long client ids, long bootstrap errors, frame-size hints -----------------------


@pytest.mark.parametrize(
    "key, role",
    [("client.id", "common"), ("group.id", "consumer"), ("transactional.id", "producer")],
)
def test_a_setting_longer_than_a_protocol_string_is_a_config_error(key, role):
    with pytest.raises(ConfigError) as info:
        ClientConfig({"bootstrap.servers": "a:9092", key: "é" * 16384}, role=role)
    assert str(info.value) == (
        f"{key}: is 32768 bytes in UTF-8; a Kafka protocol string holds at most 32767"
    )
    ClientConfig({"bootstrap.servers": "a:9092", key: "é" * 16383}, role=role)  # 32766: fine


def test_a_bootstrap_error_names_the_first_addresses_and_counts_the_rest():
    attempts = [(f"10.0.{i // 256}.{i % 256}:9092", "connection refused") for i in range(10_000)]
    error = BootstrapError(attempts, 30)
    text = str(error)
    assert text.startswith(
        "no bootstrap server answered within 30s (10.0.0.0:9092: connection refused; "
    )
    assert text.endswith("; and 9995 more (see .attempts))")
    assert len(text) < 500
    assert error.attempts == attempts  # the full detail stays
    assert "no address to try" in str(BootstrapError([]))


class RawPeer:
    """A TCP server on 127.0.0.1 that answers every connection with ``reply`` and closes."""

    def __init__(self, reply: bytes) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(4096)
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "reply, hint",
    [
        (b"\x15\x03\x03\x00\x02\x02\x46", "the peer answered with a TLS record"),
        (b"\x16\x03\x01\x00\x30" + b"\x00" * 48, "the peer answered with a TLS record"),
        (b"\x7f\xff\xff\xff", "the peer sent an impossible frame size, 2147483647"),
        (b"\xff\xff\xff\xff", "the peer sent an impossible frame size, -1"),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "the peer answered in HTTP"),
    ],
)
def test_a_bad_frame_size_during_api_versions_names_what_the_peer_sent(reply, hint):
    peer = RawPeer(reply)

    async def main():
        conn = BrokerConnection("127.0.0.1", peer.port, ConnectionSettings(setup_timeout_s=10))
        with pytest.raises(BrokerConnectionError) as info:
            await conn.open()
        assert info.value.stage == "api_versions"
        assert hint in info.value.reason
        if "TLS record" not in hint:
            assert "TLS" not in info.value.reason

    try:
        run(main())
    finally:
        peer.close()


@pytest.mark.timeout(60)
def test_a_seek_to_the_beginning_during_the_latest_lookup_is_looked_up_at_once():
    """assign() starts a lookup of the latest offset; seek_to_beginning() while it is out
    makes its answer stale. The earliest offset is asked as soon as that answer is in, not at
    the fetch loop's next idle turn (up to 0.5 s: a first poll that took 0.1-0.5 s)."""
    import time

    from kcore.protocol.messages.list_offsets_response import (
        ListOffsetsPartitionResponse,
        ListOffsetsResponse,
        ListOffsetsTopicResponse,
    )
    from kcore.types import OffsetSpec

    latest_asked, release = threading.Event(), threading.Event()
    asked: list[tuple[int, float]] = []  # (timestamp asked, when)
    answered_latest: list[float] = []

    def list_offsets(request: Any, version: int) -> Any:
        wanted = {p.timestamp for t in request.topics for p in t.partitions}
        asked.extend((ts, time.monotonic()) for ts in wanted)
        if OffsetSpec.LATEST in wanted:
            latest_asked.set()
            release.wait(10)
            answered_latest.append(time.monotonic())
        return ListOffsetsResponse(
            topics=[
                ListOffsetsTopicResponse(
                    name=t.name,
                    partitions=[
                        ListOffsetsPartitionResponse(
                            partition_index=p.partition_index,
                            timestamp=-1,
                            offset=0 if p.timestamp == OffsetSpec.EARLIEST else 100,
                            leader_epoch=0,
                        )
                        for p in t.partitions
                    ],
                )
                for t in request.topics
            ]
        )

    with FakeBroker({ApiKey.LIST_OFFSETS: list_offsets}) as broker:
        broker.handlers[ApiKey.METADATA] = metadata_answer(
            [(1, "127.0.0.1", broker.port)], {"t": 1}
        )
        with Consumer({"bootstrap.servers": broker.address}) as c:
            c.assign([TP])
            assert latest_asked.wait(20)
            c.seek_to_beginning([TP])
            time.sleep(0.05)  # (the seek's wake-up of the fetch loop is spent meanwhile)
            release.set()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and OffsetSpec.EARLIEST not in dict(asked):
                time.sleep(0.005)
    earliest = dict(asked)[OffsetSpec.EARLIEST]
    # Asked right after the stale answer (the fetch loop's idle turn is 0.5 s; the bound is
    # loose for a loaded machine)
    assert earliest - answered_latest[0] < 0.3, (asked, answered_latest)
