"""A topic of 15,000 partitions on a real broker (its own one-node cluster, so that no other
test's metadata carries it): a producer keeps sending to another topic while the topic's
Metadata answers arrive and are merged, and ends with the whole map.

Why not 100,000 (the issue's size, which bench/test_metadata_scale_bench.py measures with a
made-up answer): the broker keeps a file open per partition, and this machine's open-file limit
(20,000, hard) stops it creating logs at about 19,900 partitions; the heap (-Xmx512m) is not
what runs out. 15,000 leaves room for the broker's other files.

What this checks is behaviour: the answers (390 kB each) are decoded off the event loop and
merged a step at a time (kcore.network.connection.DECODE_OFF_LOOP_BYTES,
MetadataCache.update_in_steps), and records are delivered in between. How long the loop is
held up is measured by the benchmark, not asserted here.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import kcore
from kcore import AdminClient
from kcore.admin import NewTopic
from kcore.testing.cluster import KafkaCluster

pytestmark = pytest.mark.broker

PARTITIONS = 15_000
# KRaft takes at most 10,000 records per request (a topic or partitions request makes one per
# partition): the topic is made, then grown, this many partitions at a time.
GROWTH_STEP = 5_000
SEND_S = 8.0


@pytest.fixture(scope="module")
def big_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(bootstrap servers, the 15,000-partition topic, a 1-partition topic)."""
    work_dir = tmp_path_factory.mktemp("kafka-15k-", numbered=True)
    with KafkaCluster(1, work_dir=work_dir) as cluster:
        big, live = f"big-{uuid.uuid4().hex[:6]}", f"live-{uuid.uuid4().hex[:6]}"
        config = {"bootstrap.servers": cluster.bootstrap_servers, "request.timeout.ms": 300_000}
        with AdminClient(config) as admin:
            admin.create_topics([NewTopic(big, GROWTH_STEP, 1), NewTopic(live, 1, 1)], timeout=300)
            for total in range(2 * GROWTH_STEP, PARTITIONS + 1, GROWTH_STEP):
                admin.create_partitions({big: total}, timeout=300)
            described = admin.describe_topics([big], timeout=300)
            assert len(described[big].partitions) == PARTITIONS
        yield cluster.bootstrap_servers, big, live


def test_a_producer_keeps_sending_while_15k_partition_answers_are_merged(
    big_cluster: tuple[str, str, str],
) -> None:
    bootstrap, big, live = big_cluster
    config = {
        "bootstrap.servers": bootstrap,
        "metadata.max.age.ms": 1000,  # a full refresh (15,000 partitions) every second
        "linger.ms": 0,
    }
    events: list[tuple[str, int]] = []  # ("update", n) / ("delivered", n), in order
    lock = threading.Lock()
    with kcore.Producer(config) as producer:
        cache = producer._core.cluster.cache  # its owner's map, read here, never written

        def updated() -> None:
            with lock:
                events.append(("update", len(events)))

        cache.on_update.append(updated)
        # The big topic is tracked from here on: every refresh carries its 15,000 partitions.
        first = producer.send(big, b"first", partition=PARTITIONS - 1).result(120)
        assert first.partition == PARTITIONS - 1

        def delivered(error: BaseException | None, _: Any) -> None:
            assert error is None
            with lock:
                events.append(("delivered", len(events)))

        sent = []
        deadline = time.monotonic() + SEND_S
        while time.monotonic() < deadline:
            sent.append(producer.send(live, b"x" * 100, on_delivery=delivered))
            if len(sent) % 50 == 0:
                sent[-1].result(60)
        producer.flush(60)
        assert all(f.result(0).offset >= 0 for f in sent)
        last = producer.send(big, b"last", partition=PARTITIONS - 1).result(60)
        assert last.offset == first.offset + 1
        topic = cache.current.topics[big]
        assert len(topic.partitions) == PARTITIONS
        assert cache.current.partitions_for(big) == list(range(PARTITIONS))
    with lock:
        kinds = [kind for kind, _ in events]
    # Several full refreshes while records were being delivered, and records delivered
    # between each two of them.
    sending = kinds[kinds.index("delivered") : len(kinds) - kinds[::-1].index("delivered")]
    updates = [i for i, kind in enumerate(sending) if kind == "update"]
    assert len(updates) >= 3, len(updates)
    between = [
        sending[a + 1 : b].count("delivered") for a, b in zip(updates, updates[1:], strict=False)
    ]
    assert all(n > 0 for n in between), between
