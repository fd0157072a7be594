"""Where a run went slow: stretches of records whose throughput fell well below the run's typical.

Each record ends a window (the time since the record before it). The run's typical throughput is
the median of its windows within reach (``SLOW_FRACTION``) of its upper quartile, so a run slowed
for up to three quarters of its time still has its unhindered speed as typical, and a quarter of
its windows may be outliers. A window slower than ``SLOW_FRACTION`` of typical is slow; slow
windows in a row (one regular window between two slow ones does not break them, a pause does)
make a stretch once they cover ``MIN_WINDOWS`` windows (or hold a window that stood still, below),
``MIN_INTERVALS`` intervals and ``MIN_SECONDS``.

A step that stands still (an evaluation, a checkpoint save) logs no record, since the monitor
drops a record at the step of the one before: the whole pause is one long window with almost no
steps in it, between windows whose steps moved (a late record's may be long too). Such a window,
whose standing-still time is at least ``PAUSE_INTERVALS`` intervals, ``PAUSE_STEPS`` typical steps
and ``PAUSE_MIN_SECONDS``, is a pause, not a slowdown; two of them side by side are a run gone slow.

A slow stretch or pause from the run's first window on, ended within ``STARTUP_MAX_SECONDS``, is
its start-up (imports, building the model, the first batches, compilation, before its steady pace),
not a slowdown: it is named so, without the rules' causes (its idle CPU and its wait for the first
batch are the start-up's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sampler.analysis.timeline import Timeline

SLOW_FRACTION = 0.6
"""A window below this share of the typical throughput is slow."""
MIN_WINDOWS = 3
MIN_INTERVALS = 3.0
MIN_SECONDS = 1.0
"""A stretch covers at least this many windows, this many sampling intervals and this long (on a
busy host a few short windows in a row can be slow by chance)."""
PAUSE_INTERVALS = 3.0
PAUSE_STEPS = 20.0
PAUSE_MIN_SECONDS = 1.0
"""A pause stood still for at least this many intervals, this many typical step times and this
long (a thread descheduled for a moment on a busy host is no evaluation)."""
SLOW = "slow"
PAUSE = "pause"
STARTUP = "startup"
STARTUP_MAX_SECONDS = 600.0
"""Seconds from the run's first record within which a slow beginning is its start-up: a run slow
for longer from its start was slowed by something, which the rules name."""


@dataclass(frozen=True)
class Stretch:
    """Records ``first`` to ``last`` (indices into the timeline): their windows were slow, or
    one window was a pause."""

    kind: str
    """``slow``, ``pause`` or ``startup``."""
    first: int
    last: int
    start_step: int
    """The step before the stretch (the record before ``first``)."""
    end_step: int
    """The step at its end (record ``last``)."""
    start_wall: float
    end_wall: float
    """When it began and ended, s since the epoch."""
    throughput: float
    """Steps per second over the stretch."""
    still_seconds: float
    """A pause's time with the step standing still (its length less its steps at the typical rate)."""

    @property
    def seconds(self) -> float:
        return self.end_wall - self.start_wall

    @property
    def records(self) -> range:
        """The records whose windows make the stretch."""
        return range(self.first, self.last + 1)


@dataclass(frozen=True)
class Findings:
    """What ``find`` saw in one run."""

    typical: float
    """The typical throughput, steps/s (NaN with fewer than two records)."""
    stretches: list[Stretch]
    """Slow stretches, pauses and the start-up, in time order."""
    regular: npt.NDArray[np.bool_]
    """Per record: its window is neither slow nor a pause (the baseline evidence is judged by)."""


def find(timeline: Timeline, slow_fraction: float = SLOW_FRACTION) -> Findings:
    """The slow stretches and pauses of ``timeline``."""
    count = len(timeline)
    regular = np.zeros(count, dtype=bool)
    if count < 2:
        return Findings(float("nan"), [], regular)
    steps, seconds, rate = timeline.window_steps(), timeline.window_seconds(), timeline.throughput()
    long_window = seconds >= PAUSE_INTERVALS * timeline.interval
    usable = np.isfinite(rate) & (seconds > 0)
    base = usable & ~long_window
    typical = _typical(rate[base] if base.any() else rate[usable], slow_fraction)
    if not typical > 0:
        return Findings(typical, [], regular)
    still = seconds - steps / typical
    least = max(PAUSE_INTERVALS * timeline.interval, PAUSE_STEPS / typical, PAUSE_MIN_SECONDS)
    stood_still = long_window & (still >= least)
    # A pause stands alone: beside another window that stood still it is a run gone slow. A long
    # window beside it that kept its steps (a record late on a loaded machine) does not count.
    isolated = stood_still & ~np.roll(stood_still, 1) & ~np.roll(stood_still, -1)
    pause = usable & isolated
    slow = usable & ~pause & (rate < slow_fraction * typical)
    regular = usable & ~pause & ~slow
    stretches = [_stretch(timeline, PAUSE, int(i), int(i), still[i]) for i in np.flatnonzero(pause)]
    for first, last in spans(slow, pause):
        windows = last - first + 1
        length = seconds[first : last + 1].sum()
        # A window that stood still is no chance slowness: two of them side by side are a stretch.
        enough = windows >= MIN_WINDOWS or stood_still[first : last + 1].any()
        if enough and length >= max(MIN_INTERVALS * timeline.interval, MIN_SECONDS):
            stretches.append(_stretch(timeline, SLOW, first, last, 0.0))
            regular[first : last + 1] = False  # a regular window bridged into it is the stretch's
    stretches.sort(key=lambda s: s.first)
    # A warm-up that stood still, then went on slowly, is one start-up, not a start-up and a
    # slowdown; slowness past its first STARTUP_MAX_SECONDS is a slowdown, with its causes.
    began, last = float(timeline.walls[0]), -1
    while (
        last + 1 < len(stretches)
        and stretches[last + 1].first == (1 if last < 0 else stretches[last].last + 1)
        and stretches[last + 1].end_wall - began <= STARTUP_MAX_SECONDS
    ):
        last += 1
    if last >= 0:
        stretches[: last + 1] = [_stretch(timeline, STARTUP, 1, stretches[last].last, 0.0)]
    return Findings(typical, stretches, regular)


def _typical(rates: npt.NDArray[np.float64], slow_fraction: float) -> float:
    """The median of the windows within reach of the upper quartile: the run's speed when nothing
    slowed it, even if it was slowed for most of its time (NaN without windows)."""
    if not len(rates):
        return float("nan")
    return float(np.median(rates[rates >= slow_fraction * np.percentile(rates, 75)]))


def spans(flags: npt.NDArray[np.bool_], breaks: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """(first, last) of each run of True in ``flags``, bridging single False gaps unless the gap
    is one of ``breaks`` (a pause between slow windows is the pause, not part of a slowdown)."""
    runs: list[tuple[int, int]] = []
    for i in np.flatnonzero(flags):
        if runs and i - runs[-1][1] <= 2 and not breaks[runs[-1][1] + 1 : i].any():
            runs[-1] = (runs[-1][0], int(i))
        else:
            runs.append((int(i), int(i)))
    return runs


def _stretch(timeline: Timeline, kind: str, first: int, last: int, still: float) -> Stretch:
    start_step, end_step = int(timeline.steps[first - 1]), int(timeline.steps[last])
    start, end = float(timeline.walls[first - 1]), float(timeline.walls[last])
    throughput = (end_step - start_step) / (end - start) if end > start else float("nan")
    return Stretch(kind, first, last, start_step, end_step, start, end, throughput, float(still))
