"""kcore.network.retry: the one deadline and retry helper (no broker needed)."""

from __future__ import annotations

import asyncio
import time

import pytest

from kcore.errors import (
    BrokerConnectionError,
    KcoreTimeoutError,
    NotCoordinatorError,
    TopicAuthorizationFailedError,
)
from kcore.network.backoff import ExponentialBackoff
from kcore.network.retry import Deadline, RetryPacing, is_retriable, retry

FAST = ExponentialBackoff(1, 5)


def run(coro):
    return asyncio.run(coro)


def test_retry_returns_after_retriable_failures_and_runs_before_retry_each_time():
    calls = []
    seen = []

    async def attempt():
        calls.append(1)
        if len(calls) < 3:
            raise NotCoordinatorError()
        return "ok"

    result = run(retry("x", attempt, deadline=Deadline(5), backoff=FAST, before_retry=seen.append))
    assert result == "ok" and len(calls) == 3
    assert [type(e) for e in seen] == [NotCoordinatorError, NotCoordinatorError]


def test_a_failure_waiting_cannot_fix_is_raised_at_once():
    calls = []

    async def attempt():
        calls.append(1)
        raise TopicAuthorizationFailedError("no")

    with pytest.raises(TopicAuthorizationFailedError):
        run(retry("x", attempt, deadline=Deadline(5), backoff=FAST))
    assert len(calls) == 1


def test_a_narrower_retriable_predicate_is_honoured():
    async def attempt():
        raise BrokerConnectionError("b:1", "connect", "refused")

    start = time.monotonic()
    with pytest.raises(BrokerConnectionError):
        run(retry("x", attempt, deadline=Deadline(5), backoff=FAST, retriable=lambda e: False))
    assert time.monotonic() - start < 1


def test_at_the_deadline_a_timeout_names_the_operation_and_the_last_reason():
    calls = []

    async def attempt():
        calls.append(1)
        if len(calls) == 1:
            raise NotCoordinatorError("coordinator moved")
        await asyncio.sleep(10)  # no answer: cut by the deadline

    with pytest.raises(KcoreTimeoutError) as info:
        run(retry("finding the coordinator", attempt, deadline=Deadline(0.3), backoff=FAST))
    text = str(info.value)
    assert "finding the coordinator did not finish within 0.3s" in text
    assert "coordinator moved" in text


def test_at_the_deadline_a_passing_failure_is_a_timeout_caused_by_it():
    async def attempt():
        raise BrokerConnectionError("b:1", "connect", "refused")

    with pytest.raises(KcoreTimeoutError, match="x did not finish within 0.2s") as info:
        run(retry("x", attempt, deadline=Deadline(0.2), backoff=FAST))
    assert "refused" in str(info.value)
    assert isinstance(info.value.__cause__, BrokerConnectionError)


def test_pacing_stops_at_the_deadline_and_never_sleeps_past_it():
    async def main():
        pacing = RetryPacing(Deadline(0.2), ExponentialBackoff(1000, 1000))
        start = time.monotonic()
        assert await pacing.pause()  # cut to what is left
        assert time.monotonic() - start < 0.5
        assert not await pacing.pause()

    run(main())


def test_blocking_pacing_grows_without_jitter():
    pacing = RetryPacing(Deadline(10), ExponentialBackoff(10, 40, jitter=0.0))
    waits = [pacing._next_wait() for _ in range(4)]
    assert waits == pytest.approx([0.01, 0.02, 0.04, 0.04], abs=1e-3)
    assert pacing.pause_blocking()


def test_deadline_at_time_and_is_retriable():
    at = time.monotonic() + 1
    d = Deadline.at_time(at)
    assert d.at == at and 0.9 < d.timeout <= 1
    assert is_retriable(NotCoordinatorError()) and not is_retriable(ValueError())
    assert is_retriable(asyncio.TimeoutError()) and is_retriable(KcoreTimeoutError("t"))


def test_pacing_without_a_deadline_always_pauses_and_reset_starts_over():
    pacing = RetryPacing.within(None, ExponentialBackoff(10, 40, jitter=0.0))
    assert pacing.left() is None
    assert [pacing._next_wait() for _ in range(3)] == pytest.approx([0.01, 0.02, 0.04])
    pacing.reset()
    assert pacing._next_wait() == pytest.approx(0.01)
    assert run(pacing.pause(0.001))  # a pause a failure asked for, instead of the backoff's
