"""A launch's ranks in one figure: per step, each signal's spread across the ranks, and each
rank's throughput.

The ranks are put on one step grid and one time grid by ``sampler.analysis.ranks`` (each rank's
values interpolated at the grid's steps or times, within its own records only). Each panel (as
``panels.panels`` makes them from ``sampler.catalogue``: titles, units, counters as rates) draws, at
every grid step, the lowest and the highest value among the ranks that have one as a band, and
their median as a line.
Only the ranks that recorded a signal count (host-wide signals come from one rank per host; the
title says ``2 of 4 ranks`` then), and in the gpu panels every GPU line of every rank counts (each
rank samples its own device). A reading's peak and mean between steps are left out. The first
panel (gid :data:`THROUGHPUT`) draws each rank's steps per second over the seconds since the
launch's first record (ranks that do not wait for each other pass a step at different times, so
throughput is compared at the same time), one line per rank (gid ``rank<R>``, labelled
``rank R``), with the ranks' median dotted, and each span where a rank held the others back in
synchronous training (``ranks.culprits``, from the step phases ``watch_model`` times) shaded in
that rank's colour (gid ``culprit/rank<R>``, labelled ``rank R held the others back: input`` or
``: compute``); the title names the ranks whose step phases were not timed where others' were.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sampler.analysis.ranks import INPUT, Ranks, culprits, on_grid, untimed
from sampler.store.reader import StoreReader
from sampler.util.quoting import printable
from sampler.views import plot
from sampler.views.lines import RunPoints, points
from sampler.views.panels import TRAINING, Panel, matches, panels

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure

THROUGHPUT = "launch/throughput"
"""The gid of the per-rank throughput panel."""
BAND = ("tab:blue", 0.25)
"""The spread's colour and alpha; the median is drawn in the same colour."""


def _spreads(reader: StoreReader, ranks: Ranks, pattern: str | None) -> list[tuple[Panel, int, np.ndarray]]:
    """(panel, how many ranks have it, rows of values on the grid: one per rank and GPU) of every
    panel with a finite value."""
    available = {rank.run.id: set(reader.names(rank.run.id)) for rank in ranks.ranks}
    selected = [name for name in set().union(*available.values()) if matches(name, pattern)]
    chosen = panels(selected)
    rows: list[list[np.ndarray]] = [[] for _ in chosen]
    having = [0] * len(chosen)
    for rank in ranks.ranks:  # one rank's records read at a time
        loaded = RunPoints(reader, rank.run)
        for i, panel in enumerate(chosen):
            names = [name for name in panel.names.values() if name in available[rank.run.id]]
            having[i] += bool(names)
            for name in names:
                xs, ys = points(loaded.series(name), rank.run, "step", panel)
                rows[i].append(on_grid(ranks.steps, xs, ys))
    return [
        (panel, count, np.vstack(found))
        for panel, count, found in zip(chosen, having, rows, strict=True)
        if found and np.isfinite(np.vstack(found)).any()
    ]


def figure(reader: StoreReader, ranks: Ranks, *, pattern: str | None = None) -> Figure:
    """Draw the launch's ranks (see the module); returns the matplotlib Figure. Raises
    ``ValueError`` with fewer than two ranks with records, :class:`plot.NothingToPlot` when no
    signal with a point matches ``pattern`` (:func:`panels.matches`), ``ImportError`` naming
    :data:`plot.INSTALL_HINT` without matplotlib."""
    if len(ranks.ranks) < 2:
        raise ValueError("a launch's spread needs two ranks with records")
    spreads = _spreads(reader, ranks, pattern)
    if not spreads:
        which = f"launch {printable(ranks.launch.id)}"
        raise plot.NothingToPlot(
            f"no signal of {which} matches {pattern!r}"
            if pattern is not None
            else f"{which} has no points to plot"
        )
    figure_class = plot.matplotlib_figure()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    throughput = Panel(THROUGHPUT, TRAINING, "throughput per rank", "steps/s")
    drawn = [throughput, *(panel for panel, _, _ in spreads)]
    cells = plot.layout([panel.category for panel in drawn])
    rows, columns = cells[-1][0] + 1, max(column for _, column in cells) + 1
    width = max(plot.PANEL_SIZE[0] * columns, plot.MIN_WIDTH)
    fig = figure_class(figsize=(width, plot.PANEL_SIZE[1] * rows + 1.05), dpi=plot.DPI, layout="constrained")
    grid = fig.add_gridspec(rows + 1, columns, height_ratios=[0.18] + [1.0] * rows)
    runs = [rank.run for rank in ranks.ranks]
    title = f"{Path(reader.path).name}: launch {printable(ranks.launch.id)} · {ranks.launch.held}"
    if ranks.silent:
        title += " · no records from run " + ", ".join(str(run.id) for run in ranks.silent)
    if not_timed := untimed(ranks):  # whether these held the others back cannot be told
        title += " · step phases untimed on " + ", ".join(rank.label for rank in not_timed)
    fig.suptitle(title, fontsize=14, fontweight="bold")
    colour, alpha = BAND
    lowest = {}
    first = None
    seconds = ranks.times - ranks.times[0]
    for panel, (row, column) in zip(drawn, cells, strict=True):
        if panel is throughput:  # on its own x axis: time
            ax = fig.add_subplot(grid[row + 1, column])
            plot.style_axes(ax, panel, "seconds")
            ax.set_xlabel("seconds since the launch's first record")
            for i, rank in enumerate(ranks.ranks):
                (line,) = ax.plot(seconds, rank.throughput, color=f"C{i % 10}", linewidth=1.4)
                line.set_gid(f"rank{rank.run.rank}" + (f"/run{rank.run.id}" if rank.repeated else ""))
                line.set_label(rank.label)
            colours = {rank.run.id: f"C{i % 10}" for i, rank in enumerate(ranks.ranks)}
            for culprit in culprits(ranks):
                span = ax.axvspan(
                    culprit.start_wall - ranks.times[0],
                    culprit.end_wall - ranks.times[0],
                    color=colours[culprit.rank.run.id],
                    alpha=0.15,
                    linewidth=0,
                )
                span.set_gid(f"culprit/rank{culprit.rank.run.rank}")
                what = "input" if culprit.phase == INPUT else "compute"
                span.set_label(f"{culprit.rank.label} held the others back: {what}")
            (line,) = ax.plot(seconds, ranks.median, color="black", linestyle=":", linewidth=1.2)
            line.set_gid("median")
            line.set_label("median")
            ax.legend(fontsize=8, loc="lower left")
            plot.y_limits(ax, panel, np.concatenate([rank.throughput for rank in ranks.ranks]))
            continue
        ax = fig.add_subplot(grid[row + 1, column], sharex=first)
        first = first or ax
        plot.style_axes(ax, panel, "step")
        lowest[column] = ax
        _, having, values = next(spread for spread in spreads if spread[0] is panel)
        if having < len(ranks.ranks):
            ax.set_title(f"{panel.title} ({having} of {len(ranks.ranks)} ranks)", fontsize=11, loc="left")
        low, middle, high = _quantiles(values)
        band = ax.fill_between(ranks.steps, low, high, color=colour, alpha=alpha, linewidth=0)
        band.set_gid("spread")
        for gid, ys, line_width in (("min", low, 0.6), ("median", middle, 1.5), ("max", high, 0.6)):
            (line,) = ax.plot(
                ranks.steps, ys, color=colour, linewidth=line_width, alpha=1.0 if gid == "median" else 0.5
            )
            line.set_gid(gid)
        plot.y_limits(ax, panel, high)
    for ax in lowest.values():
        ax.set_xlabel(plot.x_label(runs, "step"))
    key = fig.add_subplot(grid[0, :])
    key.axis("off")
    handles: list[Artist] = [
        Patch(color=colour, alpha=alpha * 1.5, label="lowest to highest rank"),
        Line2D([], [], color=colour, linewidth=1.5, label="median across ranks"),
    ]
    key.legend(handles=handles, loc="center", ncol=len(handles), frameon=False, fontsize=10.5, handlelength=3)
    return fig


def _quantiles(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per grid step (column): the lowest, median and highest finite value; NaN where none is."""
    low, middle, high = (np.full(values.shape[1], math.nan) for _ in range(3))
    some = np.isfinite(values).any(axis=0)
    low[some] = np.nanmin(values[:, some], axis=0)
    middle[some] = np.nanmedian(values[:, some], axis=0)
    high[some] = np.nanmax(values[:, some], axis=0)
    return low, middle, high
