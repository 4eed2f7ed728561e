"""Bad input from a peer or a config ends in a kcore error naming it (or a retry like any
unreachable broker's), never a raw Python exception or a silent loop: host names the IDNA rules
reject, ports outside 0-65535, node ids anywhere in int32, corrupt record batches in a Fetch
answer, over-long client ids.

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

from kcore import AdminClient, TopicPartition
from kcore.cluster import ClusterClient
from kcore.config import ClientConfig
from kcore.errors import BootstrapError, BrokerConnectionError, ConfigError
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
    ApiKey.METADATA: (1, 12),
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
    for entry in ("kafka:99999", "kafka:0", "ka fka:9092", "kafka"):
        with pytest.raises(ConfigError, match="bootstrap.servers") as info:
            ClientConfig({"bootstrap.servers": f"good:9092,{entry}"}, role="common")
        assert entry in str(info.value)


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
            with pytest.raises(KcoreError):
                admin.list_offsets({TopicPartition("bad", 0): "latest"}, timeout=2)


# -- 3. node ids anywhere in int32 --------------------------------------------------------------


@pytest.mark.parametrize("node_id", [0, 1, 2**30 + 1, 2**31 - 1, -1, -(2**31)])
def test_coordinator_connection_keys_never_equal_a_node_id(node_id):
    from kcore.cluster.client import broker_id, coordinator_connection_id

    key = coordinator_connection_id(node_id)
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
                coordinator = await client.connection(coordinator_connection_id(node_id))
                assert plain is not coordinator
                assert plain.node_id == coordinator.node_id == node_id
                assert plain.is_ready and coordinator.is_ready
            finally:
                await client.close()

        run(main())
