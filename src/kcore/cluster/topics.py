"""The topics a client keeps metadata for, and when each was last used.

Rule: a tracked topic is part of every full metadata refresh until it is forgotten; with an
idle limit (a producer's ``metadata.max.idle.ms``) a topic not used for that long, not waited
for and not in use by the owner (``in_use``) is forgotten at the next full refresh, as Java's
``ProducerMetadata`` forgets it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator

__all__ = ["TrackedTopics"]


class TrackedTopics:
    def __init__(self) -> None:
        self.names: set[str] = set()
        # None: topics are tracked until the client closes.
        self.idle_s: float | None = None
        self.in_use: Callable[[str], bool] = lambda topic: False
        self._used: dict[str, float] = {}
        self._waited_on: dict[str, int] = {}  # topics a wait is for, with how many waits

    def add(self, topics: Iterable[str]) -> bool:
        """Track ``topics``; returns whether any was new."""
        new = set(topics) - self.names
        if not new:
            return False
        self.names |= new
        now = time.monotonic()
        for topic in new:
            self._used[topic] = now
        return True

    def touch(self, topic: str, now: float) -> None:
        """``topic`` was used at ``now``: tracked, and not idle."""
        self._used[topic] = now
        self.names.add(topic)

    @contextlib.contextmanager
    def waiting_for(self, topics: Iterable[str]) -> Iterator[None]:
        """Topics a wait is for are not idle while it lasts (a send waiting for a topic's
        metadata is a use, as Java's waitOnMetadata marks it), nor just after."""
        names = list(topics)
        for topic in names:
            self._waited_on[topic] = self._waited_on.get(topic, 0) + 1
        try:
            yield
        finally:
            now = time.monotonic()
            for topic in names:
                left = self._waited_on.pop(topic) - 1
                if left:
                    self._waited_on[topic] = left
                if topic in self._used:
                    self._used[topic] = now

    def take_idle(self) -> list[str]:
        """Stop tracking the topics idle past the limit, and return them."""
        if self.idle_s is None:
            return []
        now = time.monotonic()
        idle = [
            t
            for t in self.names
            if now - self._used.get(t, now) >= self.idle_s
            and t not in self._waited_on
            and not self.in_use(t)
        ]
        for topic in idle:
            self.names.discard(topic)
            self._used.pop(topic, None)
        return idle
