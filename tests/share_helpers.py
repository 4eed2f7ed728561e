"""What the share-group tests (consumer, asyncio, Arrow, admin, interop) set up alike: unique
names, numbered records on chosen partitions, share group configs, and waiting on the broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from kcore.producer import Producer  # imported here, not first inside a test with threads

WAIT_S = 120.0  # bound on members reading everything / the broker showing it


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(
    bootstrap: str,
    topic: str,
    n: int,
    partitions: int = 2,
    headers: Sequence[tuple[str, bytes]] | None = None,
    start: int = 0,
) -> None:
    """Values ``v<start>`` .. ``v<start+n-1>`` (keys ``k<i>``), record i on partition
    i % ``partitions``."""
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as p:
        for i in range(start, start + n):
            p.send(topic, b"v%d" % i, key=b"k%d" % i, partition=i % partitions, headers=headers)
        p.flush(60)


def group_config(cluster: Any, group: str, **settings: Any) -> None:
    """Share group settings (``share_auto_offset_reset="earliest"`` for
    ``share.auto.offset.reset`` and such) with Kafka's own tool."""
    pairs = ",".join(f"{k.replace('_', '.')}={v}" for k, v in settings.items())
    cluster.run_tool(
        "kafka-configs",
        "--bootstrap-server",
        cluster.bootstrap_servers,
        "--alter",
        "--entity-type",
        "groups",
        "--entity-name",
        group,
        "--add-config",
        pairs,
        check=True,
    )


def new_share_topic(cluster: Any) -> tuple[str, str]:
    """A two-partition topic and a share group reading it from the earliest offset."""
    topic, group = unique("share"), unique("sg")
    cluster.create_topic(topic, 2)
    group_config(cluster, group, share_auto_offset_reset="earliest")
    return topic, group


def one_partition_topic(cluster: Any, group: str, lock_ms: int) -> str:
    """A one-partition topic for ``group`` (its assignor gives the partition to every member),
    the group's acquisition locks set to ``lock_ms``."""
    topic = unique("share1")
    cluster.create_topic(topic, 1)
    group_config(cluster, group, share_record_lock_duration_ms=lock_ms)
    return topic


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """``check()``'s first true answer, asked again until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what} (last: {value!r})"
        time.sleep(0.3)


def total_lag(admin: Any, group: str) -> int | None:
    """The share group's lag summed over its partitions; None while any is unknown."""
    lags = [None if i is None else i.lag for i in admin.list_share_group_offsets(group).values()]
    return None if not lags or None in lags else sum(lags)  # type: ignore[arg-type]
