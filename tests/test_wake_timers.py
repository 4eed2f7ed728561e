"""The timers kept across waits: a connection's request deadlines (one timer for every request
in flight) and the sender's wake-up timer (one for every turn of its loop)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kcore.network.connection import _Deadlines, _Expired
from kcore.network.events import WakeTimer


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_each_request_expires_at_its_own_deadline() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = _Deadlines()
        slow, fast, answered = (loop.create_future() for _ in range(3))
        started = loop.time()
        deadlines.add(slow, 0.30)
        deadlines.add(fast, 0.05)  # added later, due earlier: the timer moves up
        deadlines.add(answered, 0.01)
        deadlines.remove(answered)  # its answer came: it never expires
        with pytest.raises(_Expired):
            await fast
        assert 0.04 <= loop.time() - started < 0.25
        assert not slow.done()
        with pytest.raises(_Expired):
            await slow  # the timer re-armed for what was left
        assert loop.time() - started >= 0.29
        await asyncio.sleep(0.02)
        assert not answered.done()

    _run(main())


def test_cleared_deadlines_expire_nothing() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = _Deadlines()
        waiter = loop.create_future()
        deadlines.add(waiter, 0.02)
        deadlines.clear()  # the connection closed: its own error fails the waiters
        await asyncio.sleep(0.06)
        assert not waiter.done()

    _run(main())


def test_wake_timer_waits_for_the_event_or_the_timeout() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        timer = WakeTimer(event)
        started = loop.time()
        await timer.wait(0.05)  # nothing sets the event: the timeout does
        assert event.is_set() and loop.time() - started >= 0.04
        event.clear()
        loop.call_later(0.01, event.set)
        started = loop.time()
        await timer.wait(5.0)  # set before the timeout
        assert loop.time() - started < 1.0
        timer.cancel()

    _run(main())


def test_wake_timer_keeps_an_earlier_deadline() -> None:
    """A turn that asks for a later wake-up than the armed one wakes at the armed one (one turn
    of the caller's loop more), not later; the timer is not made again."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        timer = WakeTimer(event)
        event.set()
        await timer.wait(0.05)  # returns at once (set), the timer stays armed for 0.05 s
        event.clear()
        started = loop.time()
        await timer.wait(5.0)
        assert loop.time() - started < 1.0  # woken at the first wait's deadline
        timer.cancel()
        event.clear()
        started = loop.time()
        await timer.wait(0.03)
        assert loop.time() - started >= 0.02

    _run(main())
