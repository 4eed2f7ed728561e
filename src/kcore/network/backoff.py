"""Exponential backoff with jitter, as the Java client computes it for reconnects and retries."""

from __future__ import annotations

import math
import random

__all__ = ["ExponentialBackoff"]


class ExponentialBackoff:
    """Java's ``ExponentialBackoff``: ``initial * multiplier**attempts`` times a random factor
    in ``[1 - jitter, 1 + jitter]`` (so that many clients do not retry in step), never above
    ``maximum``. An ``initial`` above ``maximum`` means a constant ``maximum`` (as Java
    documents for ``retry.backoff.ms`` > ``retry.backoff.max.ms``)."""

    def __init__(
        self, initial_ms: float, maximum_ms: float, *, multiplier: float = 2.0, jitter: float = 0.2
    ) -> None:
        self.maximum_ms = max(0.0, float(maximum_ms))
        self.initial_ms = min(max(0.0, float(initial_ms)), self.maximum_ms)
        self.multiplier = multiplier
        self.jitter = jitter
        # Past this many attempts the term is at the cap anyway (and multiplier**n overflows).
        ratio = self.maximum_ms / max(self.initial_ms, 1.0)
        self._cap_exp = math.log(ratio, multiplier) if ratio > 1 and multiplier > 1 else 0.0

    def backoff_ms(self, attempts: int) -> float:
        if self._cap_exp == 0:
            return self.initial_ms  # constant: no growth, no jitter
        exp = min(float(max(0, attempts)), self._cap_exp)
        term = self.initial_ms * self.multiplier**exp
        if self.jitter > 0:
            term *= random.uniform(1 - self.jitter, 1 + self.jitter)
        return min(term, self.maximum_ms)

    def backoff_s(self, attempts: int) -> float:
        return self.backoff_ms(attempts) / 1000.0
