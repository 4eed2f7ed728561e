"""Exponential backoff with jitter, as the Java client computes it for reconnects and retries."""

from __future__ import annotations

import math
import random

__all__ = ["ExponentialBackoff"]


class ExponentialBackoff:
    """``initial * multiplier**attempts``, capped at ``maximum``, times a random factor in
    ``[1 - jitter, 1 + jitter]`` so that many clients do not retry in step."""

    def __init__(
        self, initial_ms: float, maximum_ms: float, *, multiplier: float = 2.0, jitter: float = 0.2
    ) -> None:
        self.initial_ms = max(0.0, float(initial_ms))
        self.maximum_ms = max(self.initial_ms, float(maximum_ms))
        self.multiplier = multiplier
        self.jitter = jitter
        # Past this many attempts the term is at the cap anyway (and multiplier**n overflows).
        ratio = self.maximum_ms / self.initial_ms if self.initial_ms > 0 else 1.0
        self._cap_exp = math.log(ratio, multiplier) if ratio > 1 and multiplier > 1 else 0.0

    def backoff_ms(self, attempts: int) -> float:
        if self.initial_ms == 0:
            return 0.0
        exp = min(float(max(0, attempts)), self._cap_exp)
        term = min(self.initial_ms * self.multiplier**exp, self.maximum_ms)
        if self.jitter > 0 and self.maximum_ms > self.initial_ms:
            term *= random.uniform(1 - self.jitter, 1 + self.jitter)
        return term

    def backoff_s(self, attempts: int) -> float:
        return self.backoff_ms(attempts) / 1000.0
