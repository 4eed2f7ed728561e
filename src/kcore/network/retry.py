"""Deadlines and retries: the one way kcore waits and tries again.

Rules every retrying call site keeps, by going through this module:
- A call has one :class:`Deadline`; each attempt and each pause is cut to what is left of it.
- Pauses between attempts follow an :class:`~kcore.network.backoff.ExponentialBackoff`
  (``retry.backoff.ms`` .. ``retry.backoff.max.ms`` unless the caller says otherwise).
- A failure that waiting cannot fix (a non-retriable ``KafkaError``, or what ``retriable`` says
  is final) is raised at once.
- At the deadline a ``KcoreTimeoutError`` names the operation, the time allowed and the last
  failure that said something (its ``__cause__`` is the last failure), as Java's calls end in a
  ``TimeoutException``; a cluster never reached ends in its ``BootstrapError`` (every address
  tried, and why).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kcore.errors import BootstrapError, BrokerConnectionError, KafkaError, KcoreTimeoutError

from .backoff import ExponentialBackoff

__all__ = ["Deadline", "RetryPacing", "is_retriable", "retry"]

T = TypeVar("T")

# What a retry loop retries unless the call site narrows it: the broker said try again, the
# connection failed, or no answer came in time.
RETRIABLE_FAILURES = (
    KafkaError,
    BrokerConnectionError,
    BootstrapError,
    KcoreTimeoutError,
    TimeoutError,
    asyncio.TimeoutError,  # not TimeoutError before Python 3.11
)


def is_retriable(exc: BaseException) -> bool:
    if isinstance(exc, KafkaError):
        return exc.retriable
    if isinstance(exc, BootstrapError):
        # A wait for the cluster that ran out may end later; one ended by a failure waiting
        # cannot fix (TLS trust, credentials: no timeout) may not.
        return exc.timeout_s is not None
    return isinstance(exc, RETRIABLE_FAILURES)


class Deadline:
    """The monotonic time by which a call must finish, and the timeout it came from."""

    __slots__ = ("at", "timeout")

    def __init__(self, timeout: float, *, at: float | None = None) -> None:
        self.timeout = timeout
        self.at = time.monotonic() + timeout if at is None else at

    @classmethod
    def at_time(cls, at: float) -> Deadline:
        """A deadline given as a ``time.monotonic()`` value."""
        return cls(max(at - time.monotonic(), 0.0), at=at)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0


class RetryPacing:
    """The pauses of one loop that tries until its deadline (``None``: no deadline, a loop
    that a caller stops some other way): ``await pause()`` sleeps the next backoff (never past
    the deadline) and returns False, without sleeping, once the deadline has passed."""

    __slots__ = ("attempts", "backoff", "deadline")

    def __init__(self, deadline: Deadline | None, backoff: ExponentialBackoff) -> None:
        self.deadline = deadline
        self.backoff = backoff
        self.attempts = 0

    @classmethod
    def within(cls, timeout: float | None, backoff: ExponentialBackoff) -> RetryPacing:
        """Pacing with a deadline ``timeout`` seconds from now (None: none)."""
        return cls(None if timeout is None else Deadline(timeout), backoff)

    def left(self) -> float | None:
        """Seconds left to the deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline.remaining()

    def reset(self) -> None:
        """The next pause is the first again (a success between failures)."""
        self.attempts = 0

    async def pause(self, seconds: float | None = None) -> bool:
        """``seconds``: this pause instead of the backoff's next one (what a failure asked for)."""
        wait = self._next_wait(seconds)
        if wait is None:
            return False
        await asyncio.sleep(wait)
        return True

    def pause_blocking(self) -> bool:
        """:meth:`pause` for code on a thread of its own (no event loop)."""
        wait = self._next_wait()
        if wait is None:
            return False
        time.sleep(wait)
        return True

    def _next_wait(self, seconds: float | None = None) -> float | None:
        wait = self.backoff.backoff_s(self.attempts) if seconds is None else seconds
        left = self.left()
        if left is not None:
            if left <= 0:
                return None
            wait = min(wait, left)
        self.attempts += 1
        return wait


async def retry(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    deadline: Deadline,
    backoff: ExponentialBackoff,
    retriable: Callable[[BaseException], bool] = is_retriable,
    before_retry: Callable[[BaseException], object] | None = None,
    pause_for: Callable[[BaseException], float | None] | None = None,
    bound_attempts: bool = True,
) -> T:
    """Await ``attempt()`` until it returns, pausing by ``backoff`` after each retriable
    failure, until ``deadline``. ``before_retry(exc)`` runs before each pause (e.g. to ask for
    a metadata refresh); ``pause_for(exc)`` may name the pause after that failure (None: the
    backoff's); ``bound_attempts`` cuts each attempt to what is left of the deadline
    (off where the attempt bounds itself)."""
    pacing = RetryPacing(deadline, backoff)
    said = ""  # the last failure that said what was wrong (a bare timeout says nothing)
    while True:
        try:
            if bound_attempts:
                return await asyncio.wait_for(attempt(), max(deadline.remaining(), 0.0))
            return await attempt()
        except RETRIABLE_FAILURES as exc:
            if not retriable(exc):
                raise
            said = str(exc) or said
            if not deadline.expired():
                if before_retry is not None:
                    before_retry(exc)
                wait = None if pause_for is None else pause_for(exc)
                if await pacing.pause(wait) and not deadline.expired():
                    continue
            # No time left for another attempt. A passing failure at the deadline is a timeout
            # (as Java's TimeoutException), naming the last reason; the failure is its cause.
            # A cluster not reached is raised as itself: its BootstrapError names the bound and
            # every address tried.
            if isinstance(exc, BootstrapError):
                raise
            detail = f" (last: {said})" if said else ""
            raise KcoreTimeoutError(
                f"{what} did not finish within {deadline.timeout:g}s{detail}"
            ) from exc
