"""Position validation after a leader change (KIP-320): the decision without sockets, the
batches' leader epochs the fetcher keeps, and against a real broker a committed position above
what its leader epoch holds (the mark of a truncated log) found and handled as Java does."""

from __future__ import annotations

import time
import uuid

import pytest
from conftest import read_records

import kcore
from kcore.admin import NewTopic, TopicPartition
from kcore.cluster.group_offsets import MemberIdentity
from kcore.codec import RecordBatchBuilder
from kcore.consumer.fetch_buffer import FetchedData
from kcore.consumer.fetcher import _complete_end
from kcore.consumer.validation import Diverged, Truncated, ValidationAsk, judge
from kcore.errors import LogTruncationError, OffsetOutOfRangeError

# --- the decision ----------------------------------------------------------------------------


def test_judge_keeps_a_position_the_epoch_reaches() -> None:
    ask = ValidationAsk(position=100, offset_epoch=3, current_leader_epoch=5)
    assert judge(ask, 100, 3, "earliest") is None  # the epoch ends exactly there
    assert judge(ask, 250, 3, "none") is None


def test_judge_finds_truncation_below_the_position() -> None:
    ask = ValidationAsk(position=100, offset_epoch=3, current_leader_epoch=5)
    assert judge(ask, 80, 2, "earliest") == Diverged(80, 2)
    assert judge(ask, 80, 2, "latest") == Diverged(80, 2)
    assert judge(ask, 80, 2, "by_duration") == Diverged(80, 2)
    assert judge(ask, 80, 2, "none") == Truncated(Diverged(80, 2))
    # The leader knows no epoch at or below 3: the divergence point is unknown.
    assert judge(ask, -1, -1, "earliest") == Diverged(-1, -1)
    assert judge(ask, -1, -1, "none") == Truncated(Diverged(-1, -1))


# --- the epochs of fetched batches -------------------------------------------------------------


def _batch(base: int, n: int, epoch: int) -> bytes:
    b = RecordBatchBuilder("none", base_offset=base)
    for i in range(n):
        b.append(None, b"v%d" % i, 1000 + i)
    buf = bytearray(b.build())
    # The partition leader epoch (bytes 12-15) is the broker's to set; the CRC does not cover it.
    buf[12:16] = epoch.to_bytes(4, "big", signed=True)
    return bytes(buf)


def test_fetched_batches_record_their_leader_epochs() -> None:
    data = _batch(0, 5, 1) + _batch(5, 5, 1) + _batch(10, 3, 4) + _batch(13, 2, 6)
    epochs: list[tuple[int, int]] = []
    assert _complete_end(data + _batch(15, 4, 6)[:30], epochs) == (15, len(data))
    assert epochs == [(9, 1), (12, 4), (14, 6)]  # one run per epoch, the partial batch left out
    fetched = FetchedData(TopicPartition("t", 0), 0, data, 15, 15, epochs=epochs)
    assert [fetched.epoch_at(o) for o in (0, 9, 10, 12, 13, 14)] == [1, 1, 4, 4, 6, 6]
    assert FetchedData(TopicPartition("t", 0), 0, b"", 0).epoch_at(3) == -1


# --- against a real broker ---------------------------------------------------------------------


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _commit_with_epoch(bootstrap: str, group: str, tp: TopicPartition, offset: int, epoch: int):
    """What a consumer that read up to ``offset`` under leader epoch ``epoch`` commits."""
    with kcore.Consumer({"bootstrap.servers": bootstrap, "group.id": group}) as c:
        offsets = c._core.require_group().offsets
        c._loop.run(offsets.commit({tp: offset}, MemberIdentity(), 30, epochs={tp: epoch}), 60)
        found = c._loop.run(offsets.fetch_with_epochs([tp], 30), 60)
    assert found == {tp: (offset, epoch)}


def _topic_of_ten(bootstrap: str, prefix: str) -> tuple[TopicPartition, str]:
    """A new one-partition topic holding ten records (all under leader epoch 0), and a group
    name."""
    topic, group = _name(prefix), _name("g")
    with kcore.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(10):
            p.send(topic, b"old-%d" % i)
        p.flush(30)
    return TopicPartition(topic, 0), group


def _wait_for(check, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_committed_position_past_its_epoch_resumes_where_the_logs_diverge(kafka_cluster):
    """A group committed offset 50 as read under leader epoch 0, but the partition's log
    holds only 10 records of epoch 0: records the group read are gone (as after an unclean
    election). As Java, the consumer asks the leader where epoch 0 ends and resumes there,
    at offset 10, instead of fetching at 50, failing out of range and going back to the
    start (which would deliver offsets 0-9 again)."""
    bootstrap = kafka_cluster.bootstrap_servers
    tp, group = _topic_of_ten(bootstrap, "validate")
    topic = tp.topic
    _commit_with_epoch(bootstrap, group, tp, 50, 0)
    cfg = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    with kcore.Consumer(cfg) as c:
        c.assign([tp])
        fetcher = c._core.fetcher
        _wait_for(lambda: fetcher.validator.truncations == 1 and c.position(tp) == 10)
        with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
            for i in range(3):
                p.send(topic, b"new-%d" % i)
            p.flush(30)
        got = read_records(c, 3, 30)
        assert [(r.offset, r.value) for r in got] == [
            (10, b"new-0"),
            (11, b"new-1"),
            (12, b"new-2"),
        ]
        # What it commits carries the epoch of the record before the position.
        c.commit()
        offsets = c._core.require_group().offsets
        assert c._loop.run(offsets.fetch_with_epochs([tp], 30), 60) == {tp: (13, 0)}

    # auto.offset.reset=none: reported (as Java's LogTruncationException, an
    # OffsetOutOfRangeError), again at each poll, until the caller seeks.
    _commit_with_epoch(bootstrap, group, tp, 50, 0)
    with kcore.Consumer({**cfg, "auto.offset.reset": "none"}) as c:
        c.assign([tp])
        for _ in range(2):
            with pytest.raises(LogTruncationError, match="truncated below position 50") as e:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    c.poll(0.5)
            assert isinstance(e.value, OffsetOutOfRangeError)
            assert e.value.partitions == {tp: 50}
            assert e.value.divergent_offsets == {tp: (13, 0)}
            assert c.position(tp) == 50
        c.seek(tp, 11)  # a seek names no epoch: nothing to check
        got = read_records(c, 2, 30)
        assert [r.offset for r in got] == [11, 12]


def test_a_position_within_its_epoch_is_kept(kafka_cluster):
    """The common case: the committed position is within what its epoch holds; checked once
    (the leader epoch it was committed under is not known to be current) and kept."""
    bootstrap = kafka_cluster.bootstrap_servers
    tp, group = _topic_of_ten(bootstrap, "validate-ok")
    _commit_with_epoch(bootstrap, group, tp, 6, 0)
    cfg = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    with kcore.Consumer(cfg) as c:
        c.assign([tp])
        got = read_records(c, 4, 30)
        assert [r.offset for r in got] == [6, 7, 8, 9]
        assert (c._core.fetcher.validator.validations, c._core.fetcher.validator.truncations) == (
            1,
            0,
        )


# --- the partition state's epochs (review findings) --------------------------------------------


def test_taking_data_binds_the_position_to_the_epoch_it_was_fetched_under() -> None:
    from kcore.consumer.positions import PartitionState

    st = PartitionState()
    st.seek(0)
    assert not st.unvalidated(3)  # a seek names no epoch: nothing to check
    st.leader_epoch = 3  # fetched on under leader epoch 3 (no epoch to check by)
    data = _batch(0, 5, 2)
    epochs: list[tuple[int, int]] = []
    _complete_end(data, epochs)
    # Read ahead under epoch 2 (an older leader), handed out after the leader changed to 3:
    fetched = FetchedData(TopicPartition("t", 0), 0, data, 5, 5, epochs=epochs, leader_epoch=2)
    st.took(fetched, 5)
    assert (st.position, st.offset_epoch, st.leader_epoch) == (5, 2, 2)
    assert st.unvalidated(3)  # so the position is checked with the new leader
    assert not st.unvalidated(2) and not st.unvalidated(-1)
    st.seek(9)
    assert (st.offset_epoch, st.leader_epoch, st.validating) == (-1, -1, None)


def test_a_response_from_a_request_under_another_leader_epoch_is_dropped() -> None:
    """A late answer of the old leader arriving after the position was checked with the new
    one must not be handed out (its records may be the ones the new leader lost)."""
    from types import SimpleNamespace

    from kcore.consumer.fetcher import Fetcher
    from kcore.consumer.positions import PartitionState

    fetcher = Fetcher(None, 500, 1, 1 << 20, 1 << 20, 0, "earliest")  # type: ignore[arg-type]
    tp = TopicPartition("t", 0)
    st = PartitionState()
    st.seek(0)
    st.offset_epoch, st.leader_epoch = 1, 5  # checked under leader epoch 5
    fetcher.positions.add(tp, st)
    response = SimpleNamespace(
        error_code=0, records=_batch(0, 5, 4), high_watermark=5, aborted_transactions=None
    )
    fetcher._handle_partition(tp, 0, 4, response)  # asked under epoch 4: stale
    assert not fetcher.buffer.peek() and st.fetch_position is None
    fetcher._handle_partition(tp, 0, 5, response)
    (queued,) = fetcher.buffer.peek()
    assert queued.leader_epoch == 5


def test_poll_drops_an_old_leaders_read_ahead_and_keeps_its_queued_error() -> None:
    """Read-ahead queued under leader epoch 2, then an error; the metadata moves to epoch 3.
    poll hands none of the data out (the position is checked first), keeps the error, and
    the pass that dropped the data does not trip over its own snapshot of the queue."""
    from types import SimpleNamespace

    from kcore.consumer.collector import FetchCollector
    from kcore.consumer.fetcher import Fetcher
    from kcore.consumer.positions import PartitionState
    from kcore.errors import KcoreError
    from kcore.metrics import ClientMetrics

    tp = TopicPartition("t", 0)
    metadata = SimpleNamespace(partition=lambda topic, p: SimpleNamespace(leader_epoch=3))
    fetcher = Fetcher(
        SimpleNamespace(metadata=metadata),  # type: ignore[arg-type]
        500,
        1,
        1 << 20,
        1 << 20,
        0,
        "earliest",
    )
    st = PartitionState()
    st.seek(0)
    st.offset_epoch, st.leader_epoch = 2, 2
    fetcher.positions.add(tp, st)
    for offset in (0, 5):
        data = _batch(offset, 5, 2)
        fetcher.buffer.add(FetchedData(tp, offset, data, 10, offset + 5, leader_epoch=2))
    fetcher.buffer.add_error(KcoreError("corrupt"), tp)
    collector = FetchCollector(fetcher, fetcher.buffer, ClientMetrics(), True, lambda: None)
    with pytest.raises(KcoreError, match="corrupt"):
        collector.take_records(10)
    assert not fetcher.buffer.peek() and st.position == 0
