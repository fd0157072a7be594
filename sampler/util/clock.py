"""A run's clock: where every time a monitor stores about its run comes from, but the time of
its latest write (a run store's ``updated_at``, which readers compare with their own wall clock).

The wall clock can step while a run goes on (NTP correcting it, an administrator), and a
duration measured across a step is off by the step: a 12 s run read as an hour. So every time
of a run is the wall time it started plus the monotonic time since (``time.monotonic``, which
no step moves): differences between them are true durations, and after a step they differ
from the wall clock by that step. ``time.monotonic`` counts no time the machine spent
suspended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class RunClock:
    """The clock of a run that started at wall time ``started_at`` (s since the epoch), when
    ``time.monotonic_ns()`` read ``started_ns``."""

    started_at: float
    started_ns: int

    @classmethod
    def start(cls) -> RunClock:
        """A clock starting now."""
        return cls(time.time(), time.monotonic_ns())

    def at(self, monotonic_ns: int) -> float:
        """The run's time (s since the epoch) when ``time.monotonic_ns()`` read ``monotonic_ns``
        (in any process of this boot: the clock is system-wide)."""
        return self.started_at + (monotonic_ns - self.started_ns) / 1e9

    def now(self) -> float:
        """The run's time now, s since the epoch."""
        return self.at(time.monotonic_ns())

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return (time.monotonic_ns() - self.started_ns) / 1e9
