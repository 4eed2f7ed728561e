"""Waiting on an asyncio.Event with a timeout, in the clients' long-running loops."""

from __future__ import annotations

import asyncio

__all__ = ["wait_event"]


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
