"""The generated protocol layer against a real broker: ApiVersions negotiation, Metadata,
CreateTopics, Produce and Fetch, every supported version of the APIs a client reads the
cluster with, and pipelined requests."""

from __future__ import annotations

import time
import uuid

import pytest

import kcore
from kcore.codec import RecordBatchBuilder, decode_batches
from kcore.errors import ErrorCode, UnsupportedVersionError
from kcore.network.address import parse_address
from kcore.network.blocking import BlockingBrokerConnection as BrokerConnection
from kcore.protocol import APIS
from kcore.protocol.messages import (
    ApiVersionsRequest,
    CreateTopicsRequest,
    FetchRequest,
    MetadataRequest,
    ProduceRequest,
)
from kcore.protocol.messages.create_topics_request import CreatableTopic
from kcore.protocol.messages.fetch_request import FetchPartition, FetchTopic
from kcore.protocol.messages.metadata_request import MetadataRequestTopic
from kcore.protocol.messages.produce_request import PartitionProduceData, TopicProduceData

METADATA, API_VERSIONS = 3, 18


def connect(cluster, index: int = 0) -> BrokerConnection:
    host, port = parse_address(cluster.bootstrap_servers.split(",")[index])
    return BrokerConnection(host, port, client_id="kcore-test", timeout=30).open()


def create_topic(conn: BrokerConnection, name: str, partitions: int, replication: int) -> None:
    response = conn.request(
        CreateTopicsRequest(
            topics=[
                CreatableTopic(name=name, num_partitions=partitions, replication_factor=replication)
            ],
            timeout_ms=30_000,
        )
    )
    [topic] = response.topics
    assert (topic.name, topic.error_code) == (name, 0), topic


def topic_metadata(conn: BrokerConnection, name: str, partitions: int, version=None):
    """Metadata for ``name``, polled until every partition has a leader (creation is async)."""
    deadline = time.monotonic() + 30
    while True:
        md = conn.request(
            MetadataRequest(
                topics=[MetadataRequestTopic(name=name)],
                # v0-3 have no such field (the default, true, is what they mean)
                allow_auto_topic_creation=version is not None and version <= 3,
            ),
            version,
        )
        [topic] = md.topics
        if (
            topic.error_code == 0
            and len(topic.partitions) == partitions
            and all(p.leader_id >= 0 for p in topic.partitions)
        ):
            return md, topic
        assert time.monotonic() < deadline, f"no leaders for {name}: {topic}"
        time.sleep(0.1)


def test_api_versions_negotiation(kafka_cluster):
    with connect(kafka_cluster) as conn:
        versions = conn.api_versions
        # The broker lists the client APIs; every one we negotiate lies in both ranges.
        for key in (0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 18, 19, 20, 22):
            assert key in versions, APIS[key].name
            chosen = conn.version_for(key)
            lo, hi = APIS[key].valid_versions
            assert max(lo, versions[key][0]) <= chosen <= min(hi, versions[key][1])
        assert conn.version_for(METADATA) == min(
            APIS[METADATA].max_stable_version, versions[METADATA][1]
        )


def test_api_versions_every_version_decodes(kafka_cluster):
    host, port = parse_address(kafka_cluster.bootstrap_servers)
    with connect(kafka_cluster) as conn:
        lo, hi = conn.api_versions[API_VERSIONS]
        for version in range(lo, hi + 1):
            response = conn.request(
                ApiVersionsRequest(
                    client_software_name="kcore", client_software_version=kcore.__version__
                ),
                version,
            )
            assert response.error_code == 0
            assert {k.api_key for k in response.api_keys} == set(conn.api_versions)


def test_api_versions_newer_than_broker_falls_back():
    # A version the broker cannot know is rejected by the protocol layer itself: callers
    # never send it. (KIP-511 fallback is exercised by every connect: see BrokerConnection.)
    with pytest.raises(UnsupportedVersionError):
        ApiVersionsRequest().encode(APIS[API_VERSIONS].valid_versions[1] + 1)


def test_metadata_lists_brokers_and_created_topic(kafka_cluster):
    name = f"proto-md-{uuid.uuid4().hex[:8]}"
    with connect(kafka_cluster) as conn:
        create_topic(conn, name, partitions=3, replication=1)
        md, topic = topic_metadata(conn, name, 3)
        host, port = parse_address(kafka_cluster.bootstrap_servers.split(",")[0])
        assert (host, port) in [(b.host, b.port) for b in md.brokers]
        assert md.controller_id in [b.node_id for b in md.brokers] and md.cluster_id
        node_ids = {b.node_id for b in md.brokers}
        assert topic.topic_id != uuid.UUID(int=0)
        assert sorted(p.partition_index for p in topic.partitions) == [0, 1, 2]
        for p in topic.partitions:
            assert p.error_code == 0 and p.leader_id in node_ids
            assert p.replica_nodes == p.isr_nodes == [p.leader_id]
            assert p.leader_epoch >= 0


def test_metadata_every_supported_version(kafka_cluster):
    name = f"proto-mdv-{uuid.uuid4().hex[:8]}"
    with connect(kafka_cluster) as conn:
        create_topic(conn, name, partitions=2, replication=1)
        topic_metadata(conn, name, 2)
        lo, hi = conn.api_versions[METADATA]
        lo = max(lo, APIS[METADATA].valid_versions[0])
        hi = min(hi, APIS[METADATA].max_stable_version)
        for version in range(lo, hi + 1):
            md, topic = topic_metadata(conn, name, 2, version)
            assert topic.name == name, version
            assert md.brokers and all(b.port > 0 for b in md.brokers), version


def test_pipelined_requests_match_by_correlation_id(kafka_cluster):
    with connect(kafka_cluster) as conn:
        ids = [conn.send(MetadataRequest(topics=[])) for _ in range(20)]
        ids.append(conn.send(ApiVersionsRequest()))
        assert len(set(ids)) == len(ids)
        # Ask for the responses in reverse: earlier ones are buffered, not lost.
        bodies = [conn.receive(i).body for i in reversed(ids)]
        assert type(bodies[0]).__name__ == "ApiVersionsResponse"
        assert all(type(b).__name__ == "MetadataResponse" for b in bodies[1:])


def test_produce_then_fetch_returns_the_records(kafka_cluster):
    name = f"proto-pf-{uuid.uuid4().hex[:8]}"
    with connect(kafka_cluster) as conn:
        create_topic(conn, name, partitions=1, replication=1)
        _, topic = topic_metadata(conn, name, 1)
        builder = RecordBatchBuilder()
        sent = [(b"k%d" % i, b"v" * i, 1_700_000_000_000 + i) for i in range(100)]
        for key, value, ts in sent:
            builder.append(key, value, ts, [("h", key)])
        batch = builder.build()
        # Metadata can name the leader a moment before that broker acts as one: until then a
        # Produce gets NOT_LEADER_OR_FOLLOWER (a client retries it; so does this test).
        deadline = time.monotonic() + 30
        while True:
            produced = conn.request(
                ProduceRequest(
                    acks=-1,
                    timeout_ms=10_000,
                    topic_data=[
                        TopicProduceData(
                            name=name,
                            topic_id=topic.topic_id,
                            partition_data=[PartitionProduceData(index=0, records=batch)],
                        )
                    ],
                )
            )
            [pr] = produced.responses[0].partition_responses
            if pr.error_code != ErrorCode.NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert (pr.error_code, pr.base_offset) == (0, 0)

        fetched = conn.request(
            FetchRequest(
                max_wait_ms=100,
                min_bytes=1,
                max_bytes=1 << 20,
                topics=[
                    FetchTopic(
                        topic=name,
                        topic_id=topic.topic_id,
                        partitions=[
                            FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
                        ],
                    )
                ],
            )
        )
        assert fetched.error_code == 0
        [pd] = fetched.responses[0].partitions
        assert (pd.error_code, pd.high_watermark) == (0, 100)
        records = [r for b in decode_batches(pd.records) for r in b.records()]
        assert [(r[2], r[3], r[1]) for r in records] == sent
        assert [r[0] for r in records] == list(range(100))
        assert all(r[4] == (("h", r[2]),) for r in records)


def test_three_node_metadata_shows_every_broker_and_replica(kafka_cluster3):
    name = f"proto-md3-{uuid.uuid4().hex[:8]}"
    with connect(kafka_cluster3, 1) as conn:
        create_topic(conn, name, partitions=6, replication=3)
        md, topic = topic_metadata(conn, name, 6)
        assert len(md.brokers) == 3
        if kafka_cluster3.node_ids:  # a cluster kcore.testing started (not KCORE_BOOTSTRAP)
            assert sorted(b.node_id for b in md.brokers) == kafka_cluster3.node_ids == [1, 2, 3]
        advertised = {f"{b.host}:{b.port}" for b in md.brokers}
        assert advertised == set(kafka_cluster3.bootstrap_servers.split(","))
        leaders = set()
        for p in topic.partitions:
            assert sorted(p.replica_nodes) == sorted(b.node_id for b in md.brokers)
            assert p.leader_id in p.replica_nodes
            assert set(p.isr_nodes) <= set(p.replica_nodes)
            leaders.add(p.leader_id)
        assert len(leaders) > 1  # leadership is spread over the brokers
        # Every broker answers with the same map: any of them can serve as bootstrap.
        for index in (0, 2):
            with connect(kafka_cluster3, index) as other:
                _, same = topic_metadata(other, name, 6)
                assert {p.partition_index: p.leader_id for p in same.partitions} == {
                    p.partition_index: p.leader_id for p in topic.partitions
                }
