"""Warnings that cannot flood a training log."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("sampler")


class RateLimitedWarning:
    """Logs the first occurrence, then at most one line per ``period`` seconds
    carrying the count of occurrences it held back."""

    def __init__(self, period: float = 60.0) -> None:
        self.period = period
        self.count = 0
        self._suppressed = 0
        self._last = -float("inf")

    def warn(self, msg: str, *args: object) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last < self.period:
            self._suppressed += 1
            return
        if self._suppressed:
            msg += f" ({self._suppressed} similar messages suppressed)"
        self._suppressed = 0
        self._last = now
        log.warning(msg, *args)
