"""The sender's idempotent numbering without a broker: what an epoch bump renumbers."""

from __future__ import annotations

import time
from typing import Any

from kcore.admin.types import TopicPartition
from kcore.errors import KcoreError
from kcore.producer.accumulator import RecordAccumulator
from kcore.producer.sender import Sender

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
    sender.producer_id, sender.producer_epoch = 1000, 0
    acc.append(P2, None, b"x", 0, None, 1.0)
    (x,) = _drain(acc)
    sender._assign_sequence(x)
    assert (x.producer, x.sequence) == ((1000, 0), 0)
    sender._land(x)
    acc.requeue(x, time.monotonic())  # its answer was lost: it goes again
    acc.append(P1, None, b"y", 0, None, 1.0)

    # P1's sequence broke; the bump gives a new producer id.
    sender._rewrite.add(P1)
    sender.producer_id = 1001
    sender._sequences.clear()
    acc.reset_sequences(sender._rewrite)

    again = {b.tp: b for b in _drain(acc)}
    for b in again.values():
        sender._assign_sequence(b)
    assert (again[P2].producer, again[P2].sequence) == ((1000, 0), 0)
    assert (again[P1].producer, again[P1].sequence) == ((1001, 0), 0)
    assert sender._flying[P2][again[P2].order] == (1000, 0)  # later P2 batches wait for it


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


def test_a_failed_epoch_bump_fails_every_record_with_its_cause() -> None:
    """InitProducerId refused for good (here: not authorized) while bumping the epoch: the
    producer cannot go on, so every waiting record fails with that cause at once, not after
    delivery.timeout.ms (Java makes it a fatal error too)."""
    import asyncio

    from kcore.errors import error_for_code

    acc = _accumulator()

    class Cluster:
        def least_loaded_node(self) -> int:
            return 1

        async def version_for(self, node: int, api: int, **limits: int) -> int:
            raise error_for_code(31)  # CLUSTER_AUTHORIZATION_FAILED

    async def main() -> None:
        sender = _sender(Cluster(), acc, idempotent=True)
        sender.producer_id, sender.producer_epoch = 1000, 0
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
        sender = _sender(None, acc, idempotent=False)  # (the task never runs)
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
