"""The sender's idempotent numbering without a broker: what an epoch bump renumbers."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from kcore.errors import (
    BrokerConnectionError,
    KcoreError,
    KcoreTimeoutError,
    NotLeaderOrFollowerError,
)
from kcore.producer.accumulator import RecordAccumulator
from kcore.producer.sender import Sender
from kcore.types import TopicPartition

P1, P2 = TopicPartition("t", 1), TopicPartition("t", 2)


def _drain(acc: RecordAccumulator):
    return acc.drain(time.monotonic() + 1, lambda tp, b, n: True)


def _accumulator() -> RecordAccumulator:
    return RecordAccumulator(
        batch_size=1000, linger_s=0.0, buffer_memory=100_000, compression="none"
    )


def _sender(cluster: Any, acc: RecordAccumulator, *, idempotent: bool, **options: Any) -> Sender:
    """A Sender over ``cluster``: None, or a stand-in with just what the test reaches."""
    return Sender(
        cluster,
        acc,
        acks=-1 if idempotent else 1,
        request_timeout_s=1.0,
        delivery_timeout_s=30.0,
        idempotent=idempotent,
        **options,
    )


def test_an_epoch_bump_renumbers_only_the_partitions_whose_sequence_broke() -> None:
    """A batch of P2 sent under the old producer id whose answer was lost keeps its id, epoch
    and sequence through a bump that P1's failure caused: the broker then answers
    DUPLICATE_SEQUENCE if it wrote it. Renumbered, it would be written a second time. P1's
    waiting batches are renumbered under the new id."""
    acc = _accumulator()
    sender = _sender(None, acc, idempotent=True)  # (no network here)
    identity = sender.identity
    identity.reset(1000, 0)
    acc.append(P2, None, b"x", 0, None, 1.0)
    (x,) = _drain(acc)
    sender._assign_sequence(x)
    assert (x.producer, x.sequence) == ((1000, 0), 0)
    sender._land(x)
    acc.requeue(x, time.monotonic())  # its answer was lost: it goes again
    acc.append(P1, None, b"y", 0, None, 1.0)

    # P1's sequence broke; the bump gives a new producer id.
    identity.sequence_broke(P1)
    identity.reset(1001, 0)
    acc.reset_sequences(identity.take_broken())

    again = {b.tp: b for b in _drain(acc)}
    for b in again.values():
        sender._assign_sequence(b)
    assert (again[P2].producer, again[P2].sequence) == ((1000, 0), 0)
    assert (again[P1].producer, again[P1].sequence) == ((1001, 0), 0)
    assert identity.in_flight_producer(P2, again[P2].order) == (1000, 0)  # later P2 batches wait
    assert identity.older_epoch_in_flight(P2) and not identity.older_epoch_in_flight(P1)


def test_retries_bound_how_often_a_batch_goes_again() -> None:
    """retries=0: the first retriable error fails the batch (as Java's canRetry)."""
    acc = _accumulator()

    class Cluster:  # what _retry_or_fail touches
        class cache:
            @staticmethod
            def request_update() -> None:
                pass

        class retry_backoff:
            @staticmethod
            def backoff_s(attempt: int) -> float:
                return 0.0

        metadata = SimpleNamespace(partition=lambda topic, partition: None)

    for retries, requeued in ((0, False), (1, True)):
        sender = _sender(Cluster(), acc, idempotent=False, retries=retries)
        batch, _, _ = acc.append(P1, None, b"v", 0, None, 1.0)
        (taken,) = _drain(acc)
        taken.attempts += 1  # sent once
        sender._retry_or_fail(taken, ConnectionError("lost"))
        assert (taken.result.done, bool(acc._queues[P1])) == (not requeued, requeued)
        if requeued:
            (again,) = _drain(acc)
            acc.done(again)


def test_a_retry_to_a_leader_already_known_to_be_new_does_not_back_off() -> None:
    """KIP-951, as Java's RecordAccumulator: when the answer's leader hint (or a refresh) has
    already given the partition a newer leader epoch than the batch was sent under, the retry
    goes at once; otherwise it waits retry.backoff.ms."""
    acc = _accumulator()
    leader = SimpleNamespace(leader_epoch=5)
    cluster = SimpleNamespace(
        cache=SimpleNamespace(request_update=lambda: None),
        handle_error_code=lambda code: None,
        retry_backoff=SimpleNamespace(backoff_s=lambda attempt: 10.0),
        metadata=SimpleNamespace(partition=lambda topic, partition: leader),
    )
    sender = _sender(cluster, acc, idempotent=False)
    for sent_under, waits in ((4, False), (5, True)):
        acc.append(P1, None, b"v", 0, None, 1.0)
        (taken,) = _drain(acc)
        taken.attempts, taken.leader_epoch = 1, sent_under
        now = time.monotonic()
        sender._retry_or_fail(taken, NotLeaderOrFollowerError("moved"))
        assert (taken.retry_at > now + 5) == waits
        acc._queues[P1].clear()
        acc.done(taken)


def test_a_failed_epoch_bump_fails_every_record_with_its_cause() -> None:
    """InitProducerId refused for good (here: not authorized) while bumping the epoch: the
    producer cannot go on, so every waiting record fails with that cause at once, not after
    delivery.timeout.ms (Java makes it a fatal error too)."""
    import asyncio

    from kcore.errors import error_for_code

    acc = _accumulator()

    class Cluster:
        retry_backoff = SimpleNamespace(backoff_s=lambda attempt: 0.0)

        def least_loaded_node(self) -> int:
            return 1

        async def version_for(self, node: int, api: int, **limits: int) -> int:
            raise error_for_code(31)  # CLUSTER_AUTHORIZATION_FAILED

    async def main() -> None:
        sender = _sender(Cluster(), acc, idempotent=True)
        sender.identity.reset(1000, 0)
        batch, _, _ = acc.append(P1, None, b"v", 0, None, 1.0)
        sender._start_epoch_bump()
        await asyncio.wait_for(sender.run(), 10)
        assert batch.result.done and "epoch bump failed" in str(batch.result.error)
        assert "ClusterAuthorization" in str(batch.result.error)
        try:
            acc.append(P1, None, b"later", 0, None, 1.0)
        except KcoreError as exc:
            assert "epoch bump failed" in str(exc)
        else:
            raise AssertionError("a send after the fatal error was taken")

    asyncio.run(main())


def test_close_fails_a_request_cancelled_before_it_started() -> None:
    """cancel_in_flight (close's deadline) may cancel a produce task before it ran at all: its
    records fail at once instead of staying counted in flight."""
    import asyncio

    acc = _accumulator()

    async def main() -> None:
        # No ready connection: the request goes to a task (which never runs).
        cluster = SimpleNamespace(ready_connection=lambda node: None)
        sender = _sender(cluster, acc, idempotent=False)
        acc.append(P1, None, b"v", 0, None, 1.0)
        (batch,) = _drain(acc)
        sender._start_produce(1, [batch])
        sender._stopping = True
        sender.cancel_in_flight()
        await sender.wait_in_flight()
        await asyncio.sleep(0)
        assert batch.result.done and "before the record was acknowledged" in str(batch.result.error)
        assert not acc.has_pending() and not batch.in_flight

    asyncio.run(main())


def test_a_request_sent_at_once_is_settled_by_its_answer_or_failed_by_close() -> None:
    """With a connection that takes the request at once, no task is made: the answer's callback
    frees the node and settles the batches, the node first (so the sender's wake-up from the
    settling finds it free, in the same turn of the loop). close's deadline
    (cancel_in_flight) fails what is unanswered at once, and an answer after that changes
    nothing."""
    import asyncio

    from kcore.protocol.messages.produce_response import (
        PartitionProduceResponse,
        ProduceResponse,
        TopicProduceResponse,
    )

    acc = _accumulator()
    answers: list[Any] = []
    requests: list[Any] = []

    class Cluster(_Cluster):
        metadata = SimpleNamespace(
            topics={}, brokers={1: None}, partition=lambda topic, partition: None
        )

        def ready_connection(self, node: int) -> Any:
            return SimpleNamespace(
                version_for=_Connection.version_for, api_versions={}, can_send_now=lambda: True
            )

        def send_now(
            self, conn: Any, node: int, request: Any, version: int, on_answer: Any
        ) -> bool:
            requests.append(request)
            answers.append(on_answer)
            return True

    def ok(tp: TopicPartition, offset: int) -> Any:
        part = PartitionProduceResponse(index=tp.partition, base_offset=offset)
        return ProduceResponse(
            responses=[TopicProduceResponse(name=tp.topic, partition_responses=[part])]
        )

    async def main() -> None:
        sender = _sender(Cluster(), acc, idempotent=False, max_in_flight=1)
        acc.append(P1, None, b"v", 0, None, 1.0)
        (first,) = _drain(acc)
        sender._start_produce(1, [first])
        assert len(requests) == 1
        assert sender._node_requests[1] == 1 and sender._every_node_busy()
        node_free_when_settled: list[bool] = []
        first.result.add_callback(
            lambda _result: node_free_when_settled.append(not sender._every_node_busy()), 0
        )
        answers[0](ok(P1, 41), None)
        # Within the answer's own callback, not a turn of the loop later.
        assert node_free_when_settled == [True]
        assert first.result.done and first.result.error is None
        assert first.result.base_offset == 41 and sender._node_requests[1] == 0
        assert not sender._tasks
        await asyncio.sleep(0)
        assert sender._node_requests[1] == 0 and not sender._tasks  # (counted once)

        acc.append(P1, None, b"w", 0, None, 1.0)
        (second,) = _drain(acc)
        sender._start_produce(1, [second])
        sender._stopping = True
        sender.cancel_in_flight()
        await sender.wait_in_flight()
        await asyncio.sleep(0)
        assert "before the record was acknowledged" in str(second.result.error)
        assert not second.in_flight and sender._node_requests[1] == 0
        answers[1](ok(P1, 42), None)  # too late: nothing changes
        assert "before the record was acknowledged" in str(second.result.error)
        assert not acc.has_pending()

    asyncio.run(main())


class _Connection:
    """A broker connection that speaks Produce v9."""

    api_versions: dict[int, tuple[int, int]] = {}

    @staticmethod
    def version_for(api: int, **limits: int) -> int:
        return 9


class _Cluster:
    """What the sender's answer handling touches, with no topics known (names in answers)."""

    class cache:
        class current:
            topics: dict = {}

        @staticmethod
        def request_update() -> None:
            pass

        @staticmethod
        def update_leader(*args: Any) -> bool:
            return False

    class metadata:
        topics: dict = {}
        topic_names_by_id: dict = {}

        @staticmethod
        def partition(topic: str, partition: int) -> None:
            return None

    class retry_backoff:
        @staticmethod
        def backoff_s(attempt: int) -> float:
            return 0.0

    @staticmethod
    def handle_error_code(code: int) -> bool:
        return False


def _response(tp: TopicPartition, code: int) -> Any:
    """A Produce response with ``code`` for ``tp`` alone."""
    from kcore.protocol.messages.produce_response import (
        PartitionProduceResponse,
        ProduceResponse,
        TopicProduceResponse,
    )

    part = PartitionProduceResponse(index=tp.partition, error_code=code, base_offset=-1)
    return ProduceResponse(
        responses=[TopicProduceResponse(name=tp.topic, partition_responses=[part])]
    )


def _answer(sender: Sender, batch: Any, code: int) -> None:
    sender._handle_response(_response(batch.tp, code), [batch], 9)


class _Broker(_Cluster):
    """A stand-in that takes Produce requests (v9): ``answer()`` gives the response or
    raises."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def connection(self, node: int) -> Any:
        return _Connection()

    async def send_on(self, conn: Any, node: int, request: Any, version: int) -> Any:
        return self.answer()


def _numbered_and_sent(sender: Sender, acc: RecordAccumulator, value: bytes) -> Any:
    """A batch of one record to P1, numbered by ``sender`` and put through one Produce."""
    import asyncio

    acc.append(P1, None, value, 0, None, 1.0)
    (batch,) = _drain(acc)
    sender._assign_sequence(batch)
    asyncio.run(sender._produce_once(1, [batch]))
    return batch


def _send(sender: Sender, acc: RecordAccumulator) -> list:
    batches = _drain(acc)
    for b in batches:
        sender._assign_sequence(b)
        b.attempts += 1
        sender._payload(b)
    return batches


def test_batches_in_flight_behind_a_split_one_go_again_after_its_halves() -> None:
    """Two batches of a partition in flight; the first comes back MESSAGE_TOO_LARGE, the
    second OUT_OF_ORDER_SEQUENCE (the broker saw the gap). The halves take the first's
    sequences (0 and 2), the second keeps its own (4) and waits behind them; none goes while
    another batch of the partition is in flight (they are retries)."""
    acc = _accumulator()
    sender = _sender(_Cluster(), acc, idempotent=True)
    sender.identity.reset(1000, 0)
    sender.identity.written(P1, (1000, 0))  # a batch was written before: several may fly
    for i in range(6):
        acc.append(P1, None, b"v%d" % i, 0, None, 1.0)
        if i in (3, 5):
            acc._queues[P1][-1].closed = True  # batches of 4 and 2 records
    first, second = _send(sender, acc)[0], _send(sender, acc)[0]
    assert (first.records, second.records) == (4, 2)
    assert (first.sequence, second.sequence) == (0, 4)

    _answer(sender, first, 10)  # MESSAGE_TOO_LARGE
    halves = list(acc._queues[P1])[:2]
    assert [(h.records, h.sequence, h.producer) for h in halves] == [
        (2, 0, (1000, 0)),
        (2, 2, (1000, 0)),
    ]
    assert not sender._sendable(P1, halves[0], acc._in_flight.get(P1, 0))  # second flies
    _answer(sender, second, 45)  # OUT_OF_ORDER_SEQUENCE: goes again after the halves
    assert list(acc._queues[P1])[:3] == [*halves, second]
    assert second.sequence == 4 and not sender._epoch_bump
    (h0,) = _send(sender, acc)
    assert h0 is halves[0] and not sender._sendable(P1, halves[1], 1)
    _answer(sender, h0, 0)
    (h1,) = _send(sender, acc)
    _answer(sender, h1, 0)
    (again,) = _send(sender, acc)
    assert again is second and again.sequence == 4
    _answer(sender, again, 0)
    assert first.result.done and first.result.error is None
    assert not acc._queues[P1] and acc._used == 0 and not acc._in_flight


def test_a_split_batch_s_halves_get_a_fresh_retries_budget() -> None:
    """retries=1 and a batch sent once, refused as too large: a half meeting a retriable error
    is retried once more (as Java's split batches start counting afresh), not failed."""
    acc = _accumulator()
    sender = _sender(_Cluster(), acc, idempotent=False, retries=1)
    for i in range(4):
        acc.append(P1, None, b"v%d" % i, 0, None, 1.0)
    (batch,) = _send(sender, acc)
    _answer(sender, batch, 10)
    (half, _) = list(acc._queues[P1])
    (sent,) = _send(sender, acc)
    assert sent is half and sent.attempts == 2
    _answer(sender, sent, 6)  # NOT_LEADER_OR_FOLLOWER: retriable
    assert not half.result.done and acc._queues[P1][0] is half
    (sent,) = _send(sender, acc)
    _answer(sender, sent, 6)  # the one retry is used up
    assert isinstance(half.result.error, KcoreError)


def test_a_batch_that_cannot_be_split_fails_with_the_broker_s_answer() -> None:
    """A header key the decoder refuses (bytes that are not UTF-8) makes the batch impossible
    to split: its records fail with MESSAGE_TOO_LARGE, naming why, nothing queued again."""
    from kcore.errors import MessageTooLargeError

    acc = _accumulator()
    sender = _sender(_Cluster(), acc, idempotent=False)
    acc.append(P1, None, b"a", 0, [(b"\xff", b"x")], 1.0)
    acc.append(P1, None, b"b", 0, None, 1.0)
    (batch,) = _send(sender, acc)
    _answer(sender, batch, 10)
    assert isinstance(batch.result.error, MessageTooLargeError)
    assert "could not be split" in str(batch.result.error)
    assert not acc._queues[P1] and acc._used == 0


def test_an_epoch_bump_keeps_the_numbering_of_a_batch_that_may_have_been_written() -> None:
    """A batch of P1 whose request timed out (the broker may have written it) keeps its producer
    id, epoch and sequence through a bump that renumbers P1: sent again under them, the broker
    answers DUPLICATE_SEQUENCE if it wrote it; renumbered, it would be written twice. Only when
    the broker rejects it under the old epoch is it renumbered, still ahead of later batches."""

    def no_answer() -> Any:
        raise KcoreTimeoutError("no answer")

    acc = _accumulator()
    sender = _sender(_Broker(no_answer), acc, idempotent=True)
    identity = sender.identity
    identity.reset(1000, 0)
    c = _numbered_and_sent(sender, acc, b"c")  # times out: requeued, maybe written
    assert c.maybe_written and acc._queues[P1][0] is c
    acc.append(P1, None, b"d", 0, None, 1.0)  # a batch never sent

    identity.sequence_broke(P1)  # P1's sequence broke elsewhere: a bump renumbers P1
    identity.reset(1001, 0)
    acc.reset_sequences(identity.take_broken())
    c_again, d = list(acc._queues[P1])
    assert c_again is c and (c.producer, c.sequence) == ((1000, 0), 0)
    assert d.sequence is None

    (sent,) = _drain(acc)
    sender._assign_sequence(sent)
    sent.attempts += 1
    assert sent is c and c.producer == (1000, 0)
    assert not sender._sendable(P1, d, 1)  # new-epoch batches wait for the old one
    _answer(sender, c, 45)  # OUT_OF_ORDER_SEQUENCE under the old id: it was not written
    assert c.sequence is None and not c.maybe_written
    assert list(acc._queues[P1]) == [c, d]
    for b in _drain(acc) + _drain(acc):
        sender._assign_sequence(b)
    assert [(c.producer, c.sequence), (d.producer, d.sequence)] == [((1001, 0), 0), ((1001, 0), 1)]


def test_a_batch_answered_with_an_error_after_the_append_keeps_its_numbering_too() -> None:
    """REQUEST_TIMED_OUT (the leader appended, replicas did not follow in time) does not say
    the batch was not written: it keeps its numbering through a bump, as an unanswered one."""
    acc = _accumulator()
    sender = _sender(_Broker(lambda: _response(P1, 7)), acc, idempotent=True)
    sender.identity.reset(1000, 0)
    a = _numbered_and_sent(sender, acc, b"a")
    assert a.maybe_written and acc._queues[P1][0] is a
    sender.identity.reset(1001, 0)
    acc.reset_sequences({P1})
    assert (a.producer, a.sequence) == ((1000, 0), 0)


def test_a_batch_in_flight_past_delivery_timeout_fails_its_records_and_is_not_sent_again() -> None:
    """At delivery.timeout.ms a batch still in flight fails its records (KcoreTimeoutError) but
    keeps its memory and place until its answer; an answer that would send it again (a sequence
    error) fails it instead, and a late success only gives its memory back."""

    acc = _accumulator()
    sender = _sender(_Cluster(), acc, idempotent=True)
    sender.identity.reset(1000, 0)
    sender.identity.written(P1, (1000, 0))
    for value in (b"a", b"b"):
        acc.append(P1, None, value, 0, None, 1.0)
        acc._queues[P1][-1].closed = True
    (first,) = _drain(acc)
    sender._assign_sequence(first)
    sender._sent.add(first)
    (second,) = _drain(acc)
    sender._assign_sequence(second)
    sender._sent.add(second)
    for b in (first, second):
        b.attempts += 1
        b.created -= 60  # past delivery.timeout.ms (30 s here)
    used = acc._used
    bumps: list[int] = []
    sender._start_epoch_bump = lambda: bumps.append(1)  # type: ignore[method-assign]
    sender._expire(time.monotonic())
    assert isinstance(first.result.error, KcoreTimeoutError)
    assert isinstance(second.result.error, KcoreTimeoutError)
    assert acc._used == used and acc._in_flight[P1] == 2  # still out: memory and order kept
    _answer(sender, first, 6)  # NOT_LEADER_OR_FOLLOWER: not retried; the timeout stands
    assert isinstance(first.result.error, KcoreTimeoutError)
    assert not acc._queues[P1]
    _answer(sender, second, 45)  # would go again: fails instead (its sequence broke: a bump)
    assert not acc._queues[P1] and acc._used == 0 and not sender._sent
    assert isinstance(second.result.error, KcoreTimeoutError)
    assert bumps and sender.identity.is_broken(P1)


def test_batches_wait_while_the_node_has_max_in_flight_requests_then_go_together() -> None:
    """max.in.flight.requests.per.connection counts requests to a node, as Java's: while it
    is reached, ready batches stay in the accumulator, and the next request carries all of
    them (one each would queue for the connection's slots, and the broker would pay for
    every request)."""
    import asyncio

    P3 = TopicPartition("t", 3)
    acc = _accumulator()
    sent: list[list[int]] = []
    gates: list[asyncio.Future[None]] = []

    class Cluster:
        metadata = SimpleNamespace(
            topics={},
            brokers={1: None},
            partition=lambda topic, partition: None,
            leader_for=lambda topic, partition: SimpleNamespace(node_id=1),
        )

        def is_blacked_out(self, node: int) -> bool:
            return False

        def ready_connection(self, node: int) -> Any:
            return _Connection()

        def touch_topic(self, topic: str, now: float) -> None:
            pass

        async def connection(self, node: int) -> Any:
            return _Connection()

        async def send_on(self, conn: Any, node: int, request: Any, version: int) -> None:
            assert sender._every_node_busy()  # its one broker has its one request out
            sent.append(sorted(p.index for t in request.topic_data for p in t.partition_data))
            gate = asyncio.get_running_loop().create_future()
            gates.append(gate)
            await gate  # answered when the test says so (acks=0: no body)

    sender: Sender

    async def main() -> None:
        nonlocal sender
        sender = Sender(
            Cluster(),  # type: ignore[arg-type]
            acc,
            acks=0,
            request_timeout_s=1.0,
            delivery_timeout_s=30.0,
            idempotent=False,
            max_in_flight=1,
        )
        assert not sender._every_node_busy()

        async def step() -> None:
            batches = sender._drain(time.monotonic() + 1)
            if batches:
                sender._dispatch(batches)
            for _ in range(3):
                await asyncio.sleep(0)

        acc.append(P1, None, b"a", 0, None, 1.0)
        await step()
        assert sent == [[1]]
        acc.append(P2, None, b"b", 0, None, 1.0)
        acc.append(P3, None, b"c", 0, None, 1.0)
        await step()
        assert sent == [[1]]  # the node has its one request out: P2 and P3 wait
        assert len(acc._queues[P2]) == len(acc._queues[P3]) == 1
        gates[0].set_result(None)
        await step()  # the answer frees the node
        await step()
        assert sent == [[1], [2, 3]]  # both in the next request
        gates[1].set_result(None)
        await step()
        assert sender._node_requests[1] == 0 and not acc.has_pending()
        assert not sender._every_node_busy()

    asyncio.run(main())


def test_the_produce_version_is_chosen_again_for_a_new_connection_or_new_versions() -> None:
    """A producer outside a transaction keeps the Produce version it chose while the
    connection and its negotiated versions are the same objects; a new connection, or
    versions negotiated again, are asked again; a transaction's limits are applied each time."""
    from kcore.protocol import ApiKey

    PRODUCE = ApiKey.PRODUCE
    asked: list[dict[str, Any]] = []

    class Conn:
        def __init__(self, versions: dict[int, tuple[int, int]]) -> None:
            self.api_versions = versions

        def version_for(self, api: int, **limits: Any) -> int:
            asked.append(limits)
            return self.api_versions[api][1]

    sender = _sender(_Cluster(), _accumulator(), idempotent=False)
    first = Conn({PRODUCE: (0, 11)})
    assert [sender._produce_version(first) for _ in range(3)] == [11, 11, 11]
    assert len(asked) == 1
    first.api_versions = {PRODUCE: (0, 12)}  # negotiated again (a new ApiVersions answer)
    assert sender._produce_version(first) == 12 and len(asked) == 2
    second = Conn({PRODUCE: (0, 13)})
    assert sender._produce_version(second) == 13 and len(asked) == 3
    assert sender._produce_version(first) == 12 and len(asked) == 4

    sender.txn = SimpleNamespace(produce_versions={"max_version": 12})  # type: ignore[assignment]
    assert sender._produce_version(second) == 13 and sender._produce_version(second) == 13
    assert asked[-2:] == [{"max_version": 12}] * 2


def test_no_request_is_sent_at_once_while_a_task_of_its_node_is_out() -> None:
    """A request that went to a task (its connection was being opened) may still be on its
    way to the connection: the next one for that node goes by task too, behind it, not at
    once past it. Once the tasks are done, requests go at once again."""
    import asyncio

    acc = _accumulator()
    sent_at_once: list[Any] = []
    by_task: list[Any] = []

    class Cluster(_Cluster):
        metadata = SimpleNamespace(topics={}, partition=lambda topic, partition: None)

        def __init__(self) -> None:
            self.ready = False
            self.gate = asyncio.Event()

        def ready_connection(self, node: int) -> Any:
            if not self.ready:
                return None
            return SimpleNamespace(
                version_for=_Connection.version_for, api_versions={}, can_send_now=lambda: True
            )

        async def connection(self, node: int) -> Any:
            await self.gate.wait()
            return _Connection()

        async def send_on(self, conn: Any, node: int, request: Any, version: int) -> Any:
            by_task.append(request)
            raise KcoreError("no broker here")  # (its batches fail: nothing answers here)

        def send_now(
            self, conn: Any, node: int, request: Any, version: int, on_answer: Any
        ) -> bool:
            sent_at_once.append(request)
            return True

    async def main() -> None:
        cluster = Cluster()
        sender = _sender(cluster, acc, idempotent=False)
        acc.append(P1, None, b"a", 0, None, 1.0)
        (first,) = _drain(acc)
        sender._start_produce(1, [first])  # no ready connection: a task, waiting for one
        cluster.ready = True
        acc.append(P2, None, b"b", 0, None, 1.0)
        (second,) = _drain(acc)
        sender._start_produce(1, [second])  # ready now, but the first is still out
        assert sent_at_once == [] and sender._node_tasks[1] == 2
        cluster.gate.set()
        await sender.wait_in_flight()
        await asyncio.sleep(0)
        assert len(by_task) == 2 and sender._node_tasks[1] == 0
        acc.append(P1, None, b"c", 0, None, 1.0)
        sender._start_produce(1, _drain(acc))
        assert len(sent_at_once) == 1

    asyncio.run(main())


def test_batches_wait_for_their_leader_s_connection_and_go_once_it_opens() -> None:
    """As Java's sender, a batch is taken only for a leader connected now: until then it waits
    in the accumulator (where a new leader named by fresh metadata gets it), the connection is
    opened once however often the sender looks, its opening wakes the sender, and a failed
    attempt asks for fresh metadata when the next one starts."""
    import asyncio

    acc = _accumulator()
    opening: list[tuple[int, Any]] = []
    sent: list[Any] = []
    leader = {"node": 1}
    updates: list[int] = []

    class Cluster(_Cluster):
        metadata = SimpleNamespace(
            topics={},
            partition=lambda topic, partition: None,
            leader_for=lambda topic, partition: SimpleNamespace(node_id=leader["node"]),
        )
        cache = SimpleNamespace(request_update=lambda: updates.append(1))

        def __init__(self) -> None:
            self.ready: set[int] = set()
            self.failures: dict[int, BaseException] = {}

        def is_blacked_out(self, node: int) -> bool:
            return False

        def last_failure(self, node: int) -> BaseException | None:
            return self.failures.get(node)

        def touch_topic(self, topic: str, now: float) -> None:
            pass

        def ready_connection(self, node: int) -> Any:
            if node not in self.ready:
                return None
            return SimpleNamespace(
                version_for=_Connection.version_for, api_versions={}, can_send_now=lambda: True
            )

        def open_soon(self, node: int, on_done: Any) -> None:
            opening.append((node, on_done))

        def send_now(
            self, conn: Any, node: int, request: Any, version: int, on_answer: Any
        ) -> bool:
            sent.append(node)
            return True

    async def main() -> None:
        cluster = Cluster()
        sender = _sender(cluster, acc, idempotent=False)

        def _drain(acc: RecordAccumulator) -> list[Any]:
            return sender._drain(time.monotonic() + 1)

        acc.append(P1, None, b"a", 0, None, 1.0)
        for _ in range(3):
            assert _drain(acc) == []  # node 1 is not connected: the batch stays
        assert [node for node, _ in opening] == [1] and updates == []  # one attempt
        cluster.failures[1] = BrokerConnectionError("node 1", "connect", "timed out")
        opening[0][1](False)  # it failed: nothing wakes the sender, the next look tries again
        assert not sender._wakeup.is_set()
        assert _drain(acc) == [] and [node for node, _ in opening] == [1, 1]
        assert updates == [1]  # the leader may have moved: fresh metadata is asked for
        leader["node"] = 2  # fresh metadata names another leader, connected already
        cluster.ready.add(2)
        (batch,) = _drain(acc)
        sender._dispatch([batch])
        assert sent == [2]
        opening[1][1](True)  # node 1's connection opening late wakes the sender, harmlessly
        assert sender._wakeup.is_set()

    asyncio.run(main())


def test_a_leader_whose_connection_fails_for_good_gets_its_batches_to_fail_with_it() -> None:
    """A failure trying again will not mend (credentials refused, say) does not keep batches
    waiting out delivery.timeout.ms: they are taken, and the request's own attempt to connect
    fails them with it. Refused or timed-out connections keep them waiting."""
    from kcore.errors import SaslAuthenticationFailedError
    from kcore.network.retry import is_retriable

    # (the classification the sender asks of a connection's last failure)
    assert not is_retriable(SaslAuthenticationFailedError("refused"))
    assert not is_retriable(ValueError("a SASL callback's own bug"))
    assert is_retriable(BrokerConnectionError("node 1", "connect", "refused"))
    assert is_retriable(KcoreTimeoutError("setup timed out"))
    assert is_retriable(NotLeaderOrFollowerError())

    acc = _accumulator()

    class Cluster(_Cluster):
        metadata = SimpleNamespace(
            topics={},
            partition=lambda topic, partition: None,
            leader_for=lambda topic, partition: SimpleNamespace(node_id=1),
        )

        def is_blacked_out(self, node: int) -> bool:
            return True

        def last_failure(self, node: int) -> BaseException | None:
            return SaslAuthenticationFailedError("refused")

        def ready_connection(self, node: int) -> Any:
            return None

    sender = _sender(Cluster(), acc, idempotent=False)
    acc.append(P1, None, b"a", 0, None, 1.0)
    assert len(sender._drain(time.monotonic() + 1)) == 1


def test_a_batch_expiring_while_its_leader_cannot_be_reached_says_so() -> None:
    """A batch that waited out delivery.timeout.ms for its leader's connection fails with a
    KcoreTimeoutError naming the leader and why its connection failed."""
    acc = _accumulator()

    class Cluster(_Cluster):
        metadata = SimpleNamespace(
            topics={}, leader_for=lambda topic, partition: SimpleNamespace(node_id=3)
        )

        def last_failure(self, node: int) -> BaseException | None:
            return BrokerConnectionError("node 3", "connect", "timed out after 10s")

    sender = _sender(Cluster(), acc, idempotent=False)
    acc.append(P1, None, b"a", 0, None, 1.0)
    (batch,) = _drain(acc)
    acc.requeue(batch, time.monotonic())
    batch.created -= 60  # past delivery.timeout.ms (30 s here)
    sender._expire(time.monotonic())
    error = batch.result.error
    assert isinstance(error, KcoreTimeoutError)
    assert "its leader, node 3, cannot be reached" in str(error)
    assert "timed out after 10s" in str(error)


def test_a_drain_asks_about_each_leader_once_and_dispatch_reuses_its_leaders() -> None:
    """A drain over many ready partitions looks up each leader's connection once (not once a
    partition), the batches go to the leaders the drain found, and a node that could take no
    batch at the start of the drain takes none of its partitions' in that drain."""
    acc = _accumulator()
    asked: list[int] = []
    looked_up: list[tuple[str, int]] = []
    leaders = {p: 1 if p < 4 else 2 for p in range(6)}

    def leader_for(topic: str, partition: int) -> Any:
        looked_up.append((topic, partition))
        return SimpleNamespace(node_id=leaders[partition])

    class Cluster(_Cluster):
        metadata = SimpleNamespace(
            topics={},
            brokers={1: None, 2: None},
            partition=lambda t, p: None,
            leader_for=leader_for,
        )

        def is_blacked_out(self, node: int) -> bool:
            return False

        def touch_topic(self, topic: str, now: float) -> None:
            pass

        def ready_connection(self, node: int) -> Any:
            asked.append(node)
            return object() if node == 1 else None

        def last_failure(self, node: int) -> BaseException | None:
            return None

        def open_soon(self, node: int, on_done: Any) -> None:
            pass

    sender = _sender(Cluster(), acc, idempotent=False)
    started: list[tuple[int, list[Any]]] = []
    sender._start_produce = lambda node, batches: started.append((node, batches))  # type: ignore[method-assign]
    for p in range(6):
        acc.append(TopicPartition("t", p), None, b"a", 0, None, 1.0)
    batches = sender._drain(time.monotonic() + 1)
    assert sorted(asked) == [1, 2]  # once a node, not once a partition
    assert sorted(b.tp.partition for b in batches) == [0, 1, 2, 3]  # node 2 is not connected
    assert len(looked_up) == 6
    sender._dispatch(batches)
    assert len(looked_up) == 6  # the drain's leaders: none looked up again
    assert [(node, len(group)) for node, group in started] == [(1, 4)]
    # Outside a drain, the node is asked every time (nothing is kept from the last drain).
    assert (
        sender._sendable(TopicPartition("t", 4), acc._queues[TopicPartition("t", 4)][0], 0) is False
    )
    assert sorted(asked) == [1, 2, 2]
    # A dispatch not after a drain has its leaders looked up (none kept from the last one).
    acc.append(TopicPartition("t", 0), None, b"b", 0, None, 1.0)
    later = acc._queues[TopicPartition("t", 0)][-1]
    sender._dispatch([later])
    assert looked_up[-1] == ("t", 0) and len(looked_up) == 8  # (the 8th: this batch)
    assert started[-1] == (1, [later])
