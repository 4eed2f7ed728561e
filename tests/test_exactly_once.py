"""Exactly once through failures: a consume-transform-produce process (a kcore consumer in a
group, a transactional kcore producer committing its output and input offsets together) on three
brokers, while a broker is killed and the process itself is SIGKILLed half-way and restarted.
The output, read with read_committed by kcore and by confluent-kafka, holds every input record
exactly once."""

from __future__ import annotations

import time
import uuid

from eos_app import (
    GroupProgress,
    Processor,
    read_committed_confluent,
    read_committed_kcore,
    wait_for,
)

import kcore
from kcore.admin import NewTopic

N = 100_000
PARTITIONS = 6


def test_consume_transform_produce_is_exactly_once_through_kills(kafka_cluster3, tmp_path):
    cluster = kafka_cluster3
    bootstrap = cluster.bootstrap_servers
    tag = uuid.uuid4().hex[:8]
    source, sink, group, txn_id = f"eos-in-{tag}", f"eos-out-{tag}", f"eos-{tag}", f"eos-{tag}"
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics(
            [
                NewTopic(t, PARTITIONS, 3, config={"min.insync.replicas": "2"})
                for t in (source, sink)
            ]
        )
    with kcore.Producer({"bootstrap.servers": bootstrap, "acks": "all"}) as p:
        p.send_batch(source, [b"%d" % i for i in range(N)], keys=[b"k%d" % i for i in range(N)])
        p.flush(120)

    args = [bootstrap, group, source, sink, txn_id]
    killed_broker = 2
    first = Processor(args, tmp_path / "first.log")
    second: Processor | None = None
    try:
        wait_for(lambda: first.done >= N // 5, 120, "the processor to get going", first)
        cluster.kill_broker(killed_broker)
        wait_for(lambda: first.done >= N // 2, 180, "half the input, with a broker down", first)
        first.kill()  # mid-transaction, most likely: the next instance fences it
        cluster.start_broker(killed_broker)
        second = Processor(args, tmp_path / "second.log")
        # The restarted process resumes from the committed offsets. Its count plus the first's
        # is no measure of progress: the first may have been killed after its last commit took
        # effect but before it printed it. The group's committed offsets are.
        with GroupProgress(bootstrap, group, source, PARTITIONS) as progress:
            wait_for(lambda: progress.committed() >= N, 240, "the rest of the input", first, second)
        time.sleep(2)
    finally:
        first.kill() if first.proc.poll() is None else None
        if second is not None and second.proc.poll() is None:
            second.kill()
        if not cluster.is_running(killed_broker):
            cluster.start_broker(killed_broker)

    expected = sorted(b"%d!" % i for i in range(N))
    got = read_committed_kcore(bootstrap, sink, PARTITIONS, N)
    assert len(got) == N, f"kcore read {len(got)} committed records, {len(set(got))} distinct"
    assert sorted(got) == expected
    theirs = read_committed_confluent(bootstrap, sink, N)
    assert len(theirs) == N
    assert sorted(theirs) == expected
