"""Waiting on an asyncio.Event with a timeout, in the clients' long-running loops."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

__all__ = ["EarliestTimer", "WakeTimer", "wait_event"]


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Until ``event`` is set or ``timeout`` seconds pass (then the event is set: the loops
    that use this clear it before waiting). Not asyncio.wait_for: on Python 3.11 a
    cancellation that arrives as its timeout fires can be swallowed, and a loop around it
    then never ends (asyncio.run hung at exit on an AsyncProducer that was not closed)."""
    handle = asyncio.get_running_loop().call_later(max(timeout, 0.0), event.set)
    try:
        await event.wait()
    finally:
        handle.cancel()


class EarliestTimer:
    """One timer kept across many deadlines (loop time): armed for the earliest asked for,
    left alone for a later one, and re-armed only for an earlier one, rather than a timer made
    and cancelled for each (thousands a second on a busy producer). ``callback`` runs once
    when it fires; the timer is then unarmed until the next ``arm``."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf

    def arm(self, at: float) -> None:
        if at < self._at:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = asyncio.get_running_loop().call_at(at, self._fire)
            self._at = at

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle, self._at = None, math.inf

    def _fire(self) -> None:
        self._handle, self._at = None, math.inf
        self._callback()


class WakeTimer:
    """``wait_event`` for a loop that waits on one event turn after turn (a turn per request
    answered, thousands a second), on one EarliestTimer: a wait may so end early, at a deadline
    an earlier turn asked for; the loop then takes one turn more."""

    def __init__(self, event: asyncio.Event) -> None:
        self._event = event
        self._timer = EarliestTimer(event.set)

    async def wait(self, timeout: float) -> None:
        """Until the event is set or ``timeout`` seconds pass (or an earlier wait's)."""
        self._timer.arm(asyncio.get_running_loop().time() + max(timeout, 0.0))
        await self._event.wait()

    def cancel(self) -> None:
        self._timer.cancel()
