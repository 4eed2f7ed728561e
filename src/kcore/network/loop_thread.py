"""An asyncio event loop on its own daemon thread: what a synchronous client API runs its
asynchronous core on (one network thread per client, as in the Java client)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from kcore.errors import KcoreError, KcoreTimeoutError, WakeupError

__all__ = ["LoopThread", "start_on_loop_thread"]

T = TypeVar("T")


class LoopThread:
    """Runs coroutines on a private event loop thread and waits for them from any thread."""

    def __init__(self, name: str = "kcore-network") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closing: asyncio.Task[None] | None = None  # close_from_own_thread's
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        if self._closing is not None:  # stopped by close_from_own_thread: nobody joins
            self.loop.close()

    @property
    def on_own_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def close_from_own_thread(self, final: Coroutine[Any, Any, Any]) -> None:
        """``close()`` called by code running on the loop (a callback): the thread cannot
        wait for itself, so ``final`` runs as a task, then what is left is cancelled and the
        loop stops; the thread ends by itself."""

        async def finish() -> None:
            try:
                await final
            finally:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self.loop.stop()

        if self._closing is None:
            self._closing = self.loop.create_task(finish())
        else:
            final.close()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if not self.is_running:
            coro.close()
            raise KcoreError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(
        self,
        coro: Coroutine[Any, Any, T],
        timeout: float | None = None,
        *,
        interrupt: threading.Event | None = None,
    ) -> T:
        """Run ``coro`` on the loop and return its result. After ``timeout`` seconds the
        coroutine is cancelled and ``KcoreTimeoutError`` raised. ``interrupt`` set meanwhile
        (from another thread; looked at every 50 ms) cancels it too: the event is cleared and
        ``WakeupError`` raised, unless the coroutine finished first (its outcome stands)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise KcoreError("a synchronous kcore call was made from its own network thread")
        future = self.submit(coro)
        try:
            if interrupt is None:
                return future.result(timeout)
            return self._wait_interruptibly(future, timeout, interrupt)
        except concurrent.futures.CancelledError:
            # The client was closed from its own thread (a callback) while this ran.
            raise KcoreError("the client was closed while this call ran") from None
        except concurrent.futures.TimeoutError:
            if future.done():
                raise  # the coroutine's own timeout (KcoreTimeoutError is a TimeoutError)
            future.cancel()
            raise KcoreTimeoutError(f"the operation did not finish within {timeout:g}s") from None

    @staticmethod
    def _wait_interruptibly(
        future: concurrent.futures.Future[T], timeout: float | None, interrupt: threading.Event
    ) -> T:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = 0.05 if deadline is None else max(min(0.05, deadline - time.monotonic()), 0)
            try:
                return future.result(step)
            except concurrent.futures.TimeoutError:
                if future.done():
                    raise
                if interrupt.is_set() and future.cancel():
                    interrupt.clear()
                    raise WakeupError("wakeup() was called") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop (after cancelling what still runs on it) and join the thread."""
        if not self.is_running:
            return
        if self._closing is not None:  # closing from its own thread already: let it finish
            self._thread.join(timeout)
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


def start_on_loop_thread(name: str, start: Callable[[], Coroutine[Any, Any, Any]]) -> LoopThread:
    """A new :class:`LoopThread` with ``start()`` run on it; if that fails (``start`` cleans up
    after itself), the thread stops and the error is raised."""
    loop = LoopThread(name)
    try:
        loop.run(start())
    except BaseException:
        loop.close()
        raise
    return loop
