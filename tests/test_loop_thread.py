"""The network thread's blocking bridge (LoopThread.run), without sockets: timeouts and an
interrupt event (the consumer's wakeup) cancel the coroutine; a finished one's outcome stands."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kcore.errors import KcoreTimeoutError, WakeupError
from kcore.network.loop_thread import LoopThread


@pytest.fixture
def loop_thread():
    lt = LoopThread("test-loop")
    yield lt
    lt.close()


def test_an_interrupt_cancels_the_call_and_raises_wakeup(loop_thread):
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    event = threading.Event()
    threading.Timer(0.2, event.set).start()
    t0 = time.monotonic()
    with pytest.raises(WakeupError):
        loop_thread.run(forever(), interrupt=event)
    assert time.monotonic() - t0 < 5
    assert cancelled.wait(5) and not event.is_set()  # cancelled on the loop; event consumed


def test_with_an_interrupt_the_result_and_the_timeout_hold(loop_thread):
    async def answer() -> int:
        await asyncio.sleep(0.1)
        return 42

    event = threading.Event()
    assert loop_thread.run(answer(), interrupt=event) == 42
    with pytest.raises(KcoreTimeoutError, match="0.2s"):
        loop_thread.run(asyncio.sleep(60), 0.2, interrupt=event)
