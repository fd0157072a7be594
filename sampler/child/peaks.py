"""Peaks and means of the tracked readings since the last record the backend logged.

The child reads each collector's ``tracked`` readings at its inner rate
(``Collector.sample_tracked``) and folds them into the window of the record
being built. A record carries, beside its instantaneous readings, the peak
(and for ``averaged`` names the mean) over every window since the last record
the backend *logged*, which the backend publishes in the status block. A record
the backend drops (the step stood still: an evaluation, a checkpoint save) thus
hands its peak on to the next one logged, so a spike in a pause shows at the
next step. The child cannot know whether the record it writes now will be
logged; if the backend has not yet handled the previous one, its window is
carried too: a peak may show twice, never not at all.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

# Re-exported: sampler.commands.postmortem and bench.gpu_check import them from here.
from sampler.catalogue import MEAN_SUFFIX as MEAN_SUFFIX
from sampler.catalogue import PEAK_SUFFIX as PEAK_SUFFIX
from sampler.collectors import Collector


class _Window:
    """One record's window: the peak, sum and count of each tracked name's readings."""

    __slots__ = ("count", "peak", "record", "total")

    def __init__(self, width: int) -> None:
        self.record = -1
        self.peak = [math.nan] * width
        self.total = [0.0] * width
        self.count = [0] * width

    def fold_peaks(self, readings: Sequence[float]) -> None:
        """Raise each peak to its reading; a NaN (a failed reading) never wins over a number."""
        peak = self.peak
        for k, value in enumerate(readings):
            if value > peak[k] or peak[k] != peak[k]:
                peak[k] = value


class PeakTracker:
    """Folds inner readings into per-record windows; ``names`` are the fields
    ``close`` returns values for: every tracked name with ``_peak``, then every
    averaged one with ``_mean``.

    Keeps at most ``capacity`` windows (the ring's capacity: a backend that has
    logged nothing for longer than that has lost those records anyway). Plain
    lists, not arrays: a window is a few numbers per collector, folded ten times
    a second by a process that sleeps in between, where numpy's per-call cost
    (cold, after each sleep) is most of the work.
    """

    def __init__(self, collectors: Sequence[Collector], capacity: int) -> None:
        tracked = [name for c in collectors for name in c.tracked]
        averaged = [name for c in collectors for name in c.averaged]
        unknown = set(averaged) - set(tracked)
        if unknown:
            raise ValueError(f"averaged names that are not tracked: {sorted(unknown)}")
        self.names = tuple(n + PEAK_SUFFIX for n in tracked) + tuple(n + MEAN_SUFFIX for n in averaged)
        self._means = [tracked.index(n) for n in averaged]
        self._width = len(tracked)
        self._windows: deque[_Window] = deque(maxlen=max(1, capacity))
        self._window = _Window(self._width)

    def add(self, readings: Sequence[float]) -> None:
        """One inner reading of every tracked name (NaN where it failed)."""
        window = self._window
        window.fold_peaks(readings)
        total, count = window.total, window.count
        for k, value in enumerate(readings):
            if value == value:
                total[k] += value
                count[k] += 1

    def include(self, readings: Sequence[float]) -> None:
        """The record's own readings of the tracked names: they count for the peak
        (a peak is never below the reading beside it), not for the mean."""
        self._window.fold_peaks(readings)

    def close(self, record: int, logged_through: int) -> list[float]:
        """End the window of record number ``record`` and return its fields:
        peaks and means over the windows of every record numbered
        ``logged_through`` or later (those the backend has not logged past)."""
        if not self._width:
            return []
        self._window.record = record
        self._windows.append(self._window)
        self._window = _Window(self._width)
        while self._windows and self._windows[0].record < logged_through:
            self._windows.popleft()
        merged = _Window(self._width)
        for window in self._windows:
            merged.fold_peaks(window.peak)
            merged.total = [a + b for a, b in zip(merged.total, window.total, strict=True)]
            merged.count = [a + b for a, b in zip(merged.count, window.count, strict=True)]
        means = [merged.total[k] / merged.count[k] if merged.count[k] else math.nan for k in self._means]
        return [*merged.peak, *means]
