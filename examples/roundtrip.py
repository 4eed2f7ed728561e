"""Produce records with kcore's Producer and read them back with its Consumer, against a Kafka
cluster that kcore starts on this machine (or the one KCORE_BOOTSTRAP names).

    python examples/roundtrip.py [--records 200000] [--partitions 4] [--compression lz4]

Half the records go one at a time (``send``, keyed: they land where the Java client would put
them), half in one call (``send_batch``); the consumer reads every partition from the beginning
with ``poll`` and checks each record came back once, with its key, value and partition.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from collections.abc import Iterator

import kcore
from kcore.admin import NewTopic
from kcore.codec import partition_for_key


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--compression", default="none")
    args = parser.parse_args()
    n, half = args.records, args.records // 2
    keys = [b"user-%d" % (i % 1000) for i in range(half)]
    values = [(b"%d:" % i).ljust(args.value_size, b"x") for i in range(n)]

    with cluster_bootstrap() as bootstrap:
        topic = f"roundtrip-{uuid.uuid4().hex[:8]}"
        with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topics([NewTopic(topic, num_partitions=args.partitions)])

        started = time.perf_counter()
        config = {"bootstrap.servers": bootstrap, "compression.type": args.compression}
        with kcore.Producer(config) as producer:
            for key, value in zip(keys, values[:half], strict=True):
                producer.send(topic, value, key)
            sent = producer.send_batch(topic, values[half:])
            producer.flush(60)
            sent.result(0)  # raises if any record of the batch failed
        produced = time.perf_counter() - started
        print(f"produced {n:,} records in {produced:.2f}s ({n / produced:,.0f}/s)")

        started = time.perf_counter()
        seen: dict[bytes, tuple[int, bytes | None]] = {}
        with kcore.Consumer({"bootstrap.servers": bootstrap}) as consumer:
            consumer.assign([(topic, p) for p in range(args.partitions)])
            consumer.seek_to_beginning()
            deadline = time.monotonic() + 120
            while len(seen) < n and time.monotonic() < deadline:
                for record in consumer.poll(timeout=1.0, max_records=50_000):
                    if record.value in seen:
                        raise SystemExit(f"record {record.value[:12]!r} came back twice")
                    seen[record.value] = (record.partition, record.key)
        consumed = time.perf_counter() - started
        print(f"consumed {len(seen):,} records in {consumed:.2f}s ({len(seen) / consumed:,.0f}/s)")

        if len(seen) != n:
            raise SystemExit(f"{n - len(seen):,} of {n:,} records did not come back")
        for key, value in zip(keys, values[:half], strict=True):
            partition, got_key = seen[value]
            if got_key != key or partition != partition_for_key(key, args.partitions):
                raise SystemExit(f"{value[:12]!r} came back as key {got_key!r} in {partition}")
    print("OK: every record came back once, keyed ones on the Java client's partitions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
