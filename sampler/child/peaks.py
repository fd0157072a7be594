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

import numpy as np
import numpy.typing as npt

# Re-exported: sampler.commands.postmortem and bench.gpu_check import them from here.
from sampler.catalogue import MEAN_SUFFIX as MEAN_SUFFIX
from sampler.catalogue import PEAK_SUFFIX as PEAK_SUFFIX
from sampler.collectors import Collector

Floats = npt.NDArray[np.float64]


class PeakTracker:
    """Folds inner readings into per-record windows; ``names`` are the fields
    ``close`` returns values for: every tracked name with ``_peak``, then every
    averaged one with ``_mean``.

    Keeps at most ``capacity`` windows (the ring's capacity: a backend that has
    logged nothing for longer than that has lost those records anyway).
    """

    def __init__(self, collectors: Sequence[Collector], capacity: int) -> None:
        tracked = [name for c in collectors for name in c.tracked]
        averaged = [name for c in collectors for name in c.averaged]
        unknown = set(averaged) - set(tracked)
        if unknown:
            raise ValueError(f"averaged names that are not tracked: {sorted(unknown)}")
        self.names = tuple(n + PEAK_SUFFIX for n in tracked) + tuple(n + MEAN_SUFFIX for n in averaged)
        self._means = np.array([tracked.index(n) for n in averaged], dtype=np.intp)
        self._width = len(tracked)
        self._windows: deque[tuple[int, Floats, Floats, Floats]] = deque(maxlen=max(1, capacity))
        self._reset()

    def _reset(self) -> None:
        self._peak = np.full(self._width, math.nan)
        self._sum = np.zeros(self._width)
        self._count = np.zeros(self._width)

    def add(self, readings: Sequence[float]) -> None:
        """One inner reading of every tracked name (NaN where it failed)."""
        if not self._width:
            return
        values = np.asarray(readings, dtype=np.float64)
        np.fmax(self._peak, values, out=self._peak)  # fmax: a NaN never wins over a number
        seen = ~np.isnan(values)
        self._sum[seen] += values[seen]
        self._count += seen

    def include(self, readings: Sequence[float]) -> None:
        """The record's own readings of the tracked names: they count for the peak
        (a peak is never below the reading beside it), not for the mean."""
        if self._width:
            np.fmax(self._peak, np.asarray(readings, dtype=np.float64), out=self._peak)

    def close(self, record: int, logged_through: int) -> list[float]:
        """End the window of record number ``record`` and return its fields:
        peaks and means over the windows of every record numbered
        ``logged_through`` or later (those the backend has not logged past)."""
        if not self._width:
            return []
        self._windows.append((record, self._peak, self._sum, self._count))
        self._reset()
        while self._windows and self._windows[0][0] < logged_through:
            self._windows.popleft()
        peak = np.full(self._width, math.nan)
        total = np.zeros(self._width)
        count = np.zeros(self._width)
        for _, window_peak, window_sum, window_count in self._windows:
            np.fmax(peak, window_peak, out=peak)
            total += window_sum
            count += window_count
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, total / count, math.nan)
        return [*peak.tolist(), *mean[self._means].tolist()]
