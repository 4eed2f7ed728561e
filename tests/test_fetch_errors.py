"""A partition's fetch error, without sockets, handled as Java's FetchCollector handles it: the
partition backs off (it was fetched again at once, in a loop), stale metadata is refreshed, a
corrupt batch and non-retriable errors reach poll once per partition (they filled the queue),
an unknown server error is only logged, and an offset out of range under
``auto.offset.reset=none`` keeps the position and names the offset."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from kcore.cluster.client import ClusterClient
from kcore.config import ClientConfig
from kcore.consumer.fetcher import Fetcher
from kcore.consumer.positions import PartitionState
from kcore.errors import CorruptMessageError, OffsetOutOfRangeError, TopicAuthorizationFailedError
from kcore.types import TopicPartition

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


def fetcher(policy: str = "earliest") -> Fetcher:
    cfg = ClientConfig({"bootstrap.servers": "127.0.0.1:1"}, role="consumer")
    f = Fetcher(
        ClusterClient(cfg),
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=1 << 20,
        partition_max_bytes=1 << 20,
        isolation_level=0,
        reset_policy=policy,
    )
    f.positions.add(TP, PartitionState(position=5))
    f.positions.add(OTHER, PartitionState(position=0))
    return f


def answer(f: Fetcher, code: int, times: int = 1, tp: TopicPartition = TP) -> None:
    """The broker answers ``code`` for ``tp`` (its handling needs a running loop)."""

    async def go() -> None:
        for _ in range(times):
            response = SimpleNamespace(error_code=code, high_watermark=-1, records=None)
            f._handle_partition(tp, f.positions.require(tp).position, -1, response)

    asyncio.run(go())


def queued_errors(f: Fetcher) -> list[BaseException]:
    return [d.error for d in f.buffer.peek() if d.error is not None]


def test_a_denied_topic_is_reported_once_and_backs_off() -> None:
    f = fetcher()
    answer(f, 29, times=50)  # TOPIC_AUTHORIZATION_FAILED, while the caller does not poll
    (error,) = queued_errors(f)
    assert isinstance(error, TopicAuthorizationFailedError) and "t-0" in str(error)
    st = f.positions.require(TP)
    assert st.errors == 50
    # retry.backoff.ms growing to retry.backoff.max.ms (1 s, with jitter)
    assert 0.5 < st.retry_at - time.monotonic() <= 1.3
    assert f.positions.require(OTHER).retry_at == 0.0  # the other partitions carry on


def test_a_corrupt_batch_reaches_poll_naming_the_offset() -> None:
    f = fetcher()
    answer(f, 2)  # CORRUPT_MESSAGE: retriable in Kafka's table, but raised (as Java)
    (error,) = queued_errors(f)
    assert isinstance(error, CorruptMessageError)
    assert "t-0" in str(error) and "fetching offset 5" in str(error)


def test_unknown_server_error_and_stale_metadata_back_off_without_an_error() -> None:
    for code in (-1, 6, 56):  # UNKNOWN_SERVER_ERROR, NOT_LEADER_OR_FOLLOWER, KAFKA_STORAGE_ERROR
        f = fetcher()
        f.cluster.cache._update_requested = False  # as after a refresh
        answer(f, code)
        assert queued_errors(f) == []
        assert f.positions.require(TP).retry_at > time.monotonic()
        assert f.cluster.cache.update_requested == (code != -1)


def test_data_clears_the_backoff_count() -> None:
    f = fetcher()
    answer(f, 6, times=3)
    assert f.positions.require(TP).errors == 3
    answer(f, 0)  # no records, no error
    assert f.positions.require(TP).errors == 0


def test_out_of_range_without_a_reset_policy_keeps_the_position() -> None:
    f = fetcher("none")
    answer(f, 1, times=3)  # OFFSET_OUT_OF_RANGE
    (error,) = queued_errors(f)
    assert isinstance(error, OffsetOutOfRangeError)
    assert error.partitions == {TP: 5}  # type: ignore[attr-defined]
    assert f.positions.require(TP).position == 5
    f = fetcher("earliest")
    answer(f, 1)
    assert queued_errors(f) == [] and f.positions.require(TP).position is None  # reset it
