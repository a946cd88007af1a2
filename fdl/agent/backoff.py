"""Capped exponential backoff with jitter, for `fdl join --persist` re-dials.

After the n-th consecutive failure the wait is drawn uniformly from
[cap_n / 2, cap_n] where cap_n = min(max_s, base_s * 2**(n-1)) ("equal
jitter": never a hot loop, and a fleet that lost its controller at the same
moment spreads its re-dials out instead of arriving as one wave). A clean
finish resets the count and waits one base interval, so a box chains runs
quickly without hammering a controller that has not reopened yet.

Both bounds come from the environment when set (seconds):
FDL_JOIN_BACKOFF_BASE_S (default 2) and FDL_JOIN_BACKOFF_MAX_S (default 60).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from fdl.hostside.envvars import FDL_JOIN_BACKOFF_BASE_S, FDL_JOIN_BACKOFF_MAX_S, read

DEFAULT_BASE_S = 2.0
DEFAULT_MAX_S = 60.0


class Backoff:
    """The waits between re-dials."""

    def __init__(self, base_s: float = DEFAULT_BASE_S, max_s: float = DEFAULT_MAX_S,
                 rng: random.Random | None = None):
        if not base_s > 0 or not max_s >= base_s:
            raise ValueError("backoff needs 0 < base_s <= max_s")
        self.base_s = base_s
        self.max_s = max_s
        self.failures = 0
        self.rng = rng or random.Random()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Backoff:
        def number(name: str, default: float) -> float:
            text = read(name, environ).strip()
            if not text:
                return default
            try:
                value = float(text)
            except ValueError:
                return default
            return value if value > 0 else default

        base = number(FDL_JOIN_BACKOFF_BASE_S, DEFAULT_BASE_S)
        return cls(base, max(base, number(FDL_JOIN_BACKOFF_MAX_S, DEFAULT_MAX_S)))

    def ceiling(self) -> float:
        """The upper bound of the next wait after a failure (without drawing it)."""
        return float(min(self.max_s, self.base_s * 2 ** max(0, self.failures - 1)))

    def after_failure(self) -> float:
        """Count one more failure and return how long to wait before the next dial."""
        self.failures += 1
        top = self.ceiling()
        return self.rng.uniform(top / 2, top)

    def after_success(self) -> float:
        """A clean finish: reset, and wait one (jittered) base interval."""
        self.failures = 0
        return self.rng.uniform(self.base_s / 2, self.base_s)
