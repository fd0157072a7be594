"""The points a plot draws, prepared as numpy columns: no Python object per point.

A line's points are in wall-time order and scaled to its panel's unit. A counter is drawn as
its rate (``catalogue.rates``) from consecutive wall times; a counter that goes backwards (a
reboot, a wrapped counter) leaves a gap, never a negative rate. On the step axis a step that
goes back (the model restarted at age 0) breaks the line.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sampler import catalogue
from sampler.store.reader import Records, Run, Series, StoreReader
from sampler.views.panels import Panel

Floats = npt.NDArray[np.float64]


def points(series: Series, run: Run, x: str, panel: Panel) -> tuple[Floats, Floats]:
    """The (x, y) of one line, in wall-time order, scaled; NaN in y where the
    line must break: a counter that went backwards, or (x=step) a step that went
    back (the model restarted at age 0). ``x``: ``step``, or ``seconds`` since the run started."""
    steps = np.asarray(series.steps, dtype=np.float64)
    walls = np.asarray(series.wall_times, dtype=np.float64)
    values = np.asarray(series.values, dtype=np.float64)
    order = np.lexsort((steps, walls))
    steps, walls, values = steps[order], walls[order], values[order]
    if panel.rate:
        # A reading at the same instant as the one before has no rate: the earlier is the base.
        kept = np.ones(len(walls), dtype=bool)
        kept[1:] = walls[1:] != walls[:-1]
        steps, walls, values = steps[kept], walls[kept], values[kept]
        ys = catalogue.rates(values, walls)[1:] * panel.scale  # the first reading has no rate
        steps, walls = steps[1:], walls[1:]
    else:
        finite = np.isfinite(values)
        ys = np.full(len(values), np.nan)
        ys[finite] = values[finite] * panel.scale
    if x != "step":
        return walls - run.started_at, ys
    back = np.flatnonzero(steps[1:] < steps[:-1]) + 1
    if not len(back):
        return steps, ys
    # A break before each step that went back: at its x, with no y.
    return np.insert(steps, back, steps[back]), np.insert(ys, back, np.nan)


Line = tuple[Run, str, str, Floats, Floats]
"""(run, device, variant (``""``, ``peak`` or ``mean``), xs, ys)."""


class RunPoints:
    """One run's points as the plots read them: its resource records once, as columns
    (``StoreReader.records``), the pipeline's own signals name by name."""

    def __init__(self, reader: StoreReader, run: Run) -> None:
        self.reader = reader
        self.run = run
        self._records: Records | None = None

    def series(self, name: str) -> Series:
        if not name.startswith(catalogue.PREFIX):
            return self.reader.series(self.run.id, name)
        if self._records is None:
            self._records = self.reader.records(self.run.id)
        return self._records.series(name)


def lines_of(
    loaded: dict[int, RunPoints], runs: Sequence[Run], panel: Panel, x: str, available: dict[int, set[str]]
) -> list[Line]:
    """Every line of ``panel`` with at least one finite point, run by run, device by device,
    each reading before its peak and mean."""
    found = []
    for run in runs:
        for device in panel.parts or sorted(panel.names, key=lambda d: (len(d), d)):
            names = [("", panel.names[device])]
            names += [
                (kind, panel.variants[device, kind])
                for kind in catalogue.VARIANTS
                if (device, kind) in panel.variants
            ]
            for kind, name in names:
                if name not in available[run.id]:
                    continue
                xs, ys = points(loaded[run.id].series(name), run, x, panel)
                if np.isfinite(ys).any():
                    found.append((run, device, kind, xs, ys))
    return found
