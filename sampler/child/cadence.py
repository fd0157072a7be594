"""Wall-clock sampling schedule shared by the child and the in-thread mode."""

from __future__ import annotations

import time

FIRST_SAMPLE_MAX_DELAY = 1.0
"""The first sample comes after min(interval, this): rates such as CPU % get a
real window, and a long interval does not delay the first point."""


class Cadence:
    """Due times ``first, first + interval, ...`` on ``time.monotonic``; ticks
    missed because sampling overran are skipped, keeping the phase."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.due = time.monotonic() + min(interval, FIRST_SAMPLE_MAX_DELAY)

    def seconds_left(self) -> float:
        return max(0.0, self.due - time.monotonic())

    def advance(self) -> None:
        self.due += self.interval
        now = time.monotonic()
        if self.due < now:
            self.due += (now - self.due) // self.interval * self.interval + self.interval
