"""Produce and consume a topic through kcore's protocol layer and compiled codec, against a
Kafka cluster that kcore starts on this machine (or the one KCORE_BOOTSTRAP names).

    python examples/roundtrip.py [--records 200000] [--partitions 4]

Until kcore's Producer and Consumer exist, this drives the wire protocol directly: Metadata,
CreateTopics, Produce (acks=all) to each partition's leader, then Fetch until every record has
come back; it checks counts and a checksum of what was written against what was read.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import zlib
from collections.abc import Iterator

from kcore.codec import RecordBatchBuilder, decode_batches
from kcore.errors import error_for_code
from kcore.network import BrokerConnection
from kcore.network.connection import parse_address
from kcore.protocol.messages import (
    CreateTopicsRequest,
    FetchRequest,
    MetadataRequest,
    ProduceRequest,
)
from kcore.protocol.messages.create_topics_request import CreatableTopic
from kcore.protocol.messages.fetch_request import FetchPartition, FetchTopic
from kcore.protocol.messages.metadata_request import MetadataRequestTopic
from kcore.protocol.messages.produce_request import PartitionProduceData, TopicProduceData

BATCH_RECORDS = 5_000


@contextlib.contextmanager
def cluster_bootstrap() -> Iterator[str]:
    if os.environ.get("KCORE_BOOTSTRAP"):
        yield os.environ["KCORE_BOOTSTRAP"]
        return
    from kcore.testing import KafkaCluster

    print("starting a local Kafka cluster (first run fetches the jars with Maven)...", flush=True)
    with KafkaCluster(brokers=1) as cluster:
        print(f"  ready in {cluster.startup_seconds:.1f}s at {cluster.bootstrap_servers}")
        yield cluster.bootstrap_servers


def check(error_code: int, what: str) -> None:
    error = error_for_code(error_code)
    if error is not None:
        raise SystemExit(f"{what}: {error}")


def wait_for_leaders(conn: BrokerConnection, topic: str, partitions: int):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30
    while True:
        md = conn.request(
            MetadataRequest(
                topics=[MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False
            )
        )
        [t] = md.topics
        if t.error_code == 0 and len(t.partitions) == partitions:
            if all(p.leader_id >= 0 for p in t.partitions):
                return md, t
        if time.monotonic() > deadline:
            raise SystemExit(f"topic {topic} has no leaders after 30s")
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-size", type=int, default=100)
    args = parser.parse_args()
    topic = f"kcore-roundtrip-{os.getpid()}-{int(time.time())}"

    with cluster_bootstrap() as bootstrap:
        host, port = parse_address(bootstrap.split(",")[0])
        with BrokerConnection(host, port, client_id="kcore-roundtrip") as conn:
            print(f"connected to {host}:{port}; {len(conn.api_versions)} APIs negotiated")
            created = conn.request(
                CreateTopicsRequest(
                    topics=[
                        CreatableTopic(
                            name=topic, num_partitions=args.partitions, replication_factor=-1
                        )
                    ],
                    timeout_ms=30_000,
                )
            )
            check(created.topics[0].error_code, f"creating {topic}")
            md, t = wait_for_leaders(conn, topic, args.partitions)
            brokers = {b.node_id: (b.host, b.port) for b in md.brokers}
            leaders = {p.partition_index: p.leader_id for p in t.partitions}
            print(f"topic {topic}: {args.partitions} partitions, leaders {leaders}")

            # One connection per leader, as the client will route directly to leaders.
            conns = {node: BrokerConnection(*addr).open() for node, addr in brokers.items()}
            try:
                sent_sum, produce_s = produce(conns, leaders, t.topic_id, topic, args)
                got_sum, count, fetch_s = consume(conns, leaders, t.topic_id, topic, args)
            finally:
                for c in conns.values():
                    c.close()

    mb = args.records * args.value_size / 1e6
    print(
        f"produced {args.records:,} records in {produce_s:.2f}s "
        f"({args.records / produce_s:,.0f} rec/s, {mb / produce_s:.1f} MB/s)"
    )
    print(
        f"consumed {count:,} records in {fetch_s:.2f}s "
        f"({count / fetch_s:,.0f} rec/s, {mb / fetch_s:.1f} MB/s)"
    )
    if count != args.records or got_sum != sent_sum:
        print(f"MISMATCH: sent {args.records} (crc {sent_sum}), got {count} (crc {got_sum})")
        return 1
    print(f"OK: every record came back (checksum {sent_sum:#x})")
    return 0


def produce(conns, leaders, topic_id, topic, args):  # type: ignore[no-untyped-def]
    started = time.monotonic()
    checksum = 0
    value_pad = b"x" * max(0, args.value_size - 12)
    n = 0
    while n < args.records:
        pending = []
        for partition, leader in leaders.items():
            if n >= args.records:
                break
            builder = RecordBatchBuilder()
            now = int(time.time() * 1000)
            for _ in range(min(BATCH_RECORDS, args.records - n)):
                value = b"%012d" % n + value_pad
                checksum += zlib.crc32(value)  # order-free: partitions interleave differently
                builder.append(b"key-%d" % n, value, now)
                n += 1
            conn = conns[leader]
            request = ProduceRequest(
                acks=-1,
                timeout_ms=30_000,
                topic_data=[
                    TopicProduceData(
                        name=topic,
                        topic_id=topic_id,
                        partition_data=[
                            PartitionProduceData(index=partition, records=builder.build())
                        ],
                    )
                ],
            )
            pending.append((conn, conn.send(request)))
        for conn, correlation_id in pending:  # pipelined: wait after sending to every leader
            response = conn.receive(correlation_id).body
            for tr in response.responses:
                for pr in tr.partition_responses:
                    check(pr.error_code, f"producing to partition {pr.index}")
    return checksum, time.monotonic() - started


def consume(conns, leaders, topic_id, topic, args):  # type: ignore[no-untyped-def]
    started = time.monotonic()
    offsets = dict.fromkeys(leaders, 0)
    checksum = 0
    count = 0
    deadline = time.monotonic() + 120
    while count < args.records:
        if time.monotonic() > deadline:
            break
        by_leader: dict[int, list[int]] = {}
        for partition, leader in leaders.items():
            by_leader.setdefault(leader, []).append(partition)
        pending = []
        for leader, partitions in by_leader.items():
            request = FetchRequest(
                replica_id=-1,
                max_wait_ms=500,
                min_bytes=1,
                max_bytes=50 * 1024 * 1024,
                topics=[
                    FetchTopic(
                        topic=topic,
                        topic_id=topic_id,
                        partitions=[
                            FetchPartition(
                                partition=p, fetch_offset=offsets[p], partition_max_bytes=8 << 20
                            )
                            for p in partitions
                        ],
                    )
                ],
            )
            conn = conns[leader]
            pending.append((conn, conn.send(request)))
        for conn, correlation_id in pending:
            response = conn.receive(correlation_id).body
            check(response.error_code, "fetching")
            for tr in response.responses:
                for pd in tr.partitions:
                    check(pd.error_code, f"fetching partition {pd.partition_index}")
                    if pd.records is None:
                        continue
                    for batch in decode_batches(pd.records, allow_partial=True):
                        for offset, _ts, _key, value, _headers in batch.records():
                            if offset < offsets[pd.partition_index]:
                                continue
                            checksum += zlib.crc32(
                                value
                            )  # order-free: partitions interleave differently
                            count += 1
                        offsets[pd.partition_index] = batch.last_offset + 1
    return checksum, count, time.monotonic() - started


if __name__ == "__main__":
    sys.exit(main())
