"""Telling a stalled run from a slow one, from what the sampling child sees once per record.

Fed, per record, the step the backend last logged a record at and how many records its
monitor thread has not taken yet (the wake-up bytes still in the pipe). Two things read as a
stall:

- ``steps``: the step has not moved for longer than the timeout: ``stall_seconds`` when it is a
  number, else (``auto``) ``TIMEOUT_FACTOR`` times the ``TIMEOUT_PERCENTILE`` of the run's recent
  step durations, never below ``max(FLOOR_SECONDS, FLOOR_INTERVALS * interval)``;
- ``monitor``: the oldest record the backend's monitor thread has not taken was written
  ``NOT_TAKEN_RECORDS`` intervals ago, or ``MONITOR_MAX_SECONDS`` at most (its GIL held by another
  thread, or the process frozen), which also keeps the step from moving. It is asked between
  records too (``observe(..., record=False)``): at a 15 s interval, three intervals would miss a
  40 s hold of the GIL, which the first record into it can tell at most 15 s late.

A stall that lasts is captured again, ``RECAPTURES`` times at most: when it has lasted
``RECAPTURE_FACTOR`` times as long as when it was seen, then that again. Nothing is a stall
before the step has moved once (loading, warm-up, a script that logs no
step), and a stall ends when the step moves again. The step is seen once per record, and it is
the step of the record before, so a stall is seen at most two intervals after its timeout. Pure:
time comes in as an argument.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from sampler.ipc.status import NOT_LOGGED
from sampler.settings.parsers import STALL_AUTO, STALL_OFF

STEP_WINDOW = 256
"""Recent step durations the learned timeout is drawn from."""
TIMEOUT_FACTOR = 5.0
TIMEOUT_PERCENTILE = 0.95
FLOOR_SECONDS = 30.0
FLOOR_INTERVALS = 3
"""A learned timeout is never shorter than this many seconds, nor this many intervals (the step
is seen once per record)."""
NOT_TAKEN_RECORDS = 3
"""Intervals a record may wait for the monitor thread before it counts as not taking them..."""
MONITOR_MAX_SECONDS = 10.0
"""...but never more than this: the thread takes a record within milliseconds when it can run."""
RECAPTURES = 2
RECAPTURE_FACTOR = 4.0
"""A stall that lasts is captured again, at most ``RECAPTURES`` times, each when it has lasted
``RECAPTURE_FACTOR`` times as long as at the capture before."""


@dataclass(frozen=True)
class Stall:
    """A stall as first seen."""

    kind: str
    """``steps`` (the step stood still past the timeout) or ``monitor`` (the monitor thread took
    no record)."""
    step: int
    """The step the run stands at."""
    since: float
    """When the step was first seen at it (monotonic s): the stall's start."""
    detected_at: float
    """Monotonic s."""
    timeout: float
    """The timeout that was passed, s: the step's, or (``monitor``) how long a record may wait for
    the monitor thread."""
    not_taken: int
    """Records the monitor thread had not taken when it was seen."""
    untaken_for: float = 0.0
    """Seconds the oldest of them had waited for it."""

    @property
    def waited(self) -> float:
        """Seconds from its start to its detection."""
        return self.detected_at - self.since


@dataclass(frozen=True)
class Resumed:
    """The step moved again after ``stall``."""

    stall: Stall
    at: float
    """When the step was seen moving (monotonic s)."""

    @property
    def duration(self) -> float:
        """Seconds the step stood still, as seen."""
        return self.at - self.stall.since


@dataclass(frozen=True)
class Lasting:
    """``stall`` still lasts: time for another capture."""

    stall: Stall
    at: float
    """Monotonic s."""

    @property
    def waited(self) -> float:
        """Seconds from the stall's start to now."""
        return self.at - self.stall.since


class StallDetector:
    """Fed once per record; ``observe`` returns a ``Stall`` as one begins, a ``Lasting`` when it
    is due another capture, a ``Resumed`` as it ends, else None."""

    def __init__(self, setting: float | str, interval: float) -> None:
        self.off = setting == STALL_OFF
        self.fixed = None if isinstance(setting, str) else float(setting)
        if isinstance(setting, str) and setting not in (STALL_AUTO, STALL_OFF):
            raise ValueError(f"stall_seconds is auto, off or a number, not {setting!r}")
        self.floor = max(FLOOR_SECONDS, FLOOR_INTERVALS * interval)
        self.monitor_after = min(MONITOR_MAX_SECONDS, NOT_TAKEN_RECORDS * interval)
        """Seconds a record may wait for the monitor thread."""
        self.written: deque[float] = deque(maxlen=STEP_WINDOW)
        """When the latest records were written (monotonic s), the newest last."""
        self.durations: deque[float] = deque(maxlen=STEP_WINDOW)
        """Seconds per step, one entry per time the step was seen moving forward."""
        self.step: int | None = None
        self.moved_at = 0.0
        self.moved = False
        """The step has been seen moving at least once."""
        self.current: Stall | None = None
        self.recaptures = 0
        """Captures of the current stall after its first."""

    def watch(self, stall: Stall) -> None:
        """Take over ``stall``, opened by a child before this one: it ends when the step leaves
        its step, and is captured no more (the child before took its captures)."""
        self.step, self.moved_at, self.moved = stall.step, stall.since, True
        self.current, self.recaptures = stall, RECAPTURES

    def timeout(self) -> float:
        """Seconds the step may stand still now."""
        if self.fixed is not None:
            return self.fixed
        if not self.durations:
            return self.floor
        ordered = sorted(self.durations)
        high = ordered[min(len(ordered) - 1, math.ceil(TIMEOUT_PERCENTILE * len(ordered)) - 1)]
        return max(self.floor, TIMEOUT_FACTOR * high)

    def observe(
        self, now: float, step: int, not_taken: int, record: bool = True
    ) -> Stall | Lasting | Resumed | None:
        """A view at ``now`` (monotonic s): the step last logged (``NOT_LOGGED`` before any), the
        records the monitor thread has not taken; ``record``: at a record, about to be written
        (else between records)."""
        if self.off:
            return None
        untaken_for = 0.0
        if not_taken > 0 and self.written:
            untaken_for = now - self.written[-min(not_taken, len(self.written))]
        if record:
            self.written.append(now)
        if step == NOT_LOGGED:
            return None
        if self.step is None:
            self.step, self.moved_at = step, now
            return None
        if step != self.step:
            # The first move's duration is known only from below (the step it left may have begun
            # long before it was first seen), but that bound is all a run of slow steps has before
            # its second move: without it the floor alone would time its second step.
            if step > self.step:
                self.durations.append((now - self.moved_at) / (step - self.step))
            self.step, self.moved_at, self.moved = step, now, True
            stall, self.current = self.current, None
            return None if stall is None else Resumed(stall, now)
        if self.current is not None:
            due = self.current.waited * RECAPTURE_FACTOR ** (self.recaptures + 1)
            if self.recaptures < RECAPTURES and now - self.current.since >= due:
                self.recaptures += 1
                return Lasting(self.current, now)
            return None
        if not self.moved:
            return None
        waited = now - self.moved_at
        kind = None
        if untaken_for >= self.monitor_after:
            kind = "monitor"  # the more telling of the two: the backend cannot run its own thread
        elif waited > self.floor if self.fixed is None else waited > self.fixed:
            timeout = self.timeout()  # sorted only past the floor: nothing per record otherwise
            if waited > timeout:
                kind = "steps"
        if kind is None:
            return None
        timeout = self.monitor_after if kind == "monitor" else self.timeout()
        self.current = Stall(kind, step, self.moved_at, now, timeout, not_taken, untaken_for)
        self.recaptures = 0
        return self.current
