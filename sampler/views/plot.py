"""Small multiples of one or more runs of a run store, drawn with matplotlib.

The panels are ``sampler.views.panels``' (training signals first, then the resource
categories in ``sampler.catalogue``'s order, counters as rates), their points
``sampler.views.lines``'; a resource panel that would draw one flat line is named in a
line under the figure instead (``unchanged``). In the gpu panels each device is its own line. Several runs
are overlaid, one colour per run (and then one line style per GPU device). A
reading's peak and mean between logged steps are drawn in its panel, as thin
translucent and dotted lines beside it (the key names both).

matplotlib is imported only when a figure is drawn, never by ``import
sampler``; without it, drawing raises ``ImportError`` naming the extra
(:data:`INSTALL_HINT`). Nothing here touches pyplot or the global backend: the
figure is a bare ``matplotlib.figure.Figure`` written with the Agg renderer.
"""

from __future__ import annotations

import itertools
import math
import textwrap
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import numpy.typing as npt

from sampler import catalogue
from sampler.analysis.stretches import PAUSE, STARTUP, Stretch
from sampler.store.reader import Run, StoreReader
from sampler.util import atomicfile
from sampler.views.lines import Line, RunPoints, lines_of
from sampler.views.panels import LOOP, TRAINING, Panel, fitted, matches, panels, stack_phases

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'wl-resource-monitor[plot]'"
"""What to run when matplotlib is missing."""

X_AXES = ("step", "seconds")
"""``step``: the step each value was logged at (the model age all curves share);
``seconds``: wall-clock seconds since the run started."""

COLUMNS = 5
"""Panels per row: the process category's five fill one."""
PANEL_SIZE = (3.8, 2.6)
"""Inches per panel (width, height); at the default 100 dpi a full row is 1,900 px wide."""
DPI = 100
MIN_WIDTH = 8.0
"""Inches: room for the title and the legend however few panels there are."""

VARIANT_WIDTH = 0.9
VARIANT_LINES: dict[str, tuple[float, Any, str]] = {
    catalogue.PEAK: (0.45, None, "peak since the previous step"),
    catalogue.MEAN: (0.8, ":", "mean since the previous step"),
}
"""How a reading's peak and mean are drawn beside it: alpha, line style (None: the
reading's own), and the key's entry."""

_DASHES: list[Any] = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3)), (0, (3, 1, 1, 1, 1, 1)), (0, (8, 3))]
"""Line styles of GPU devices 0, 1, ... when several runs share the colours."""


class NothingToPlot(ValueError):
    """No signal of the runs has a point to draw (none at all, or none that matches)."""


def describe(run: Run) -> str:
    """``run 3 · 2025-11-30 12:03:21 · 1 min 04 s · host`` (``host rank 1/4`` for a rank of a job)."""
    known = run.started_at == run.started_at  # NaN: a malformed row
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started_at)) if known else "?"
    return f"run {run.id} · {started} · {_duration(run.duration)} · {run.where}"


def _duration(seconds: float) -> str:
    if seconds != seconds:  # a time unknown (a malformed row)
        return "?"
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def x_label(runs: Sequence[Run], x: str) -> str:
    if x == "seconds":
        return "seconds since the run started"
    sources = {run.config.get("step_source") for run in runs}
    if sources == {"model_age"}:
        return "step (model age)"
    if sources == {"seconds"}:
        return "step (s since the monitor started)"
    return "step"


def layout(categories: list[str]) -> list[tuple[int, int]]:
    """(row, column) of each panel, given the category of each in drawing order:
    a category starts a new row unless it fits whole in what is left of the
    current one, and the training loop's panels (``panels.LOOP``: its own signals,
    its throughput) never share a row with the machine's."""
    cells: list[tuple[int, int]] = []
    row, column = 0, 0
    previous = None
    for category, group in itertools.groupby(categories):
        size = len(list(group))
        shares = column + size <= COLUMNS and (category in LOOP) == (previous in LOOP)
        if column and not shares:
            row, column = row + 1, 0
        for _ in range(size):
            if column == COLUMNS:
                row, column = row + 1, 0
            cells.append((row, column))
            column += 1
        previous = category
    return cells


SHADES = {
    PAUSE: ("0.5", 0.18, "step stood still"),
    STARTUP: ("0.5", 0.08, "start-up"),
    "slow": ("tab:red", 0.14, "slow stretch"),
}
"""How ``explain``'s stretches are shaded: kind -> (colour, alpha, legend label)."""


def figure(
    reader: StoreReader,
    runs: Sequence[Run],
    *,
    pattern: str | None = None,
    x: str = "step",
    shade: Sequence[Stretch] = (),
) -> Figure:
    """Draw ``runs`` (overlaid) as small multiples; returns the matplotlib Figure.

    ``pattern`` selects signals (:func:`matches`); ``x`` is ``"step"`` or
    ``"seconds"`` (:data:`X_AXES`); ``shade``: stretches of the first run
    (``sampler.analysis``) shaded on every panel. Each panel's Axes has the panel key as its
    ``gid`` (``resource/gpu/*/power_watts``) and each line ``run<ID>`` or
    ``run<ID>/gpu<i>`` as its own. Raises ``ValueError`` when there is no run,
    ``x`` is unknown, or (:class:`NothingToPlot`) no signal with a point matches; ``ImportError`` naming
    :data:`INSTALL_HINT` without matplotlib.
    """
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, not {x!r}")
    if not runs:
        raise ValueError("no run to plot")
    available = {run.id: set(reader.names(run.id)) for run in runs}
    everything = set().union(*available.values())
    selected = [name for name in everything if matches(name, pattern)]
    which = ("runs " if len(runs) > 1 else "run ") + ", ".join(str(run.id) for run in runs)
    drawn = []
    loaded = {run.id: RunPoints(reader, run) for run in runs}
    for panel in stack_phases(panels(selected)):
        found = lines_of(loaded, runs, panel, x, available)
        if found:
            drawn.append(in_fitting_unit(panel, found))
    if not drawn:
        if not everything:
            raise NothingToPlot(f"{which} has no signals")
        raise NothingToPlot(
            f"no signal of {which} matches {pattern!r} ({len(everything)} signals, e.g. "
            f"{sorted(everything)[0]!r}; a pattern with * ? [ is a glob over the whole name, "
            "anything else a substring)"
            if pattern is not None
            else f"{which} has no points to plot"
        )
    drawn, steady = (drawn, []) if pattern is not None else unchanged(drawn)
    figure_class = matplotlib_figure()
    cells = layout([panel.category for panel, _ in drawn])
    rows = cells[-1][0] + 1
    columns = max(column for _, column in cells) + 1
    multi = len(runs) > 1
    devices = sorted(
        {device for panel, lines in drawn if not panel.parts for _, device, _, _, _ in lines if device},
        key=lambda d: (len(d), d),
    )
    kinds = [
        kind for kind in catalogue.VARIANTS if any(line[2] == kind for _, lines in drawn for line in lines)
    ]
    shaded = list(dict.fromkeys(stretch.kind for stretch in shade))
    legend_row = 1 if multi or len(devices) > 1 or kinds or shaded else 0
    width = max(PANEL_SIZE[0] * columns, MIN_WIDTH)
    height = PANEL_SIZE[1] * rows + 0.55 * legend_row + 0.5
    fig = figure_class(figsize=(width, height), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(rows + legend_row, columns, height_ratios=[0.18] * legend_row + [1.0] * rows)
    store = Path(reader.path).name
    if multi:
        fig.suptitle(f"{store}: {which}", fontsize=14, fontweight="bold")
    else:
        fig.suptitle(f"{store}: {describe(runs[0])}", fontsize=14, fontweight="bold")

    colours = {run.id: f"C{i % 10}" for i, run in enumerate(runs)}
    order = {run.id: i for i, run in enumerate(runs)}
    x_title = x_label(runs, x)
    lowest: dict[int, Axes] = {}
    first: Axes | None = None
    for (panel, lines), (row, column) in zip(drawn, cells, strict=True):
        ax = fig.add_subplot(grid[row + legend_row, column], sharex=first)
        first = first or ax
        style_axes(ax, panel, x)
        for stretch in shade:
            colour, alpha, _ = SHADES[stretch.kind]
            marker: Artist
            if x == "step" and stretch.kind == PAUSE:  # a few steps wide: a line, or it vanishes
                marker = ax.axvline(stretch.end_step, color=colour, alpha=alpha * 3, linewidth=2.5)
            elif x == "step":
                marker = ax.axvspan(
                    stretch.start_step, stretch.end_step, color=colour, alpha=alpha, linewidth=0
                )
            else:
                start, end = stretch.start_wall - runs[0].started_at, stretch.end_wall - runs[0].started_at
                marker = ax.axvspan(start, end, color=colour, alpha=alpha, linewidth=0)
            marker.set_gid(f"explain/{stretch.kind}")
        if panel.parts:
            draw_parts(ax, panel, lines, multi)
            lowest[column] = ax
            continue
        for run, device, kind, xs, ys in lines:
            colour, style = colours[run.id], "-"
            if device:
                # Dashed as well as coloured: identical readings of two devices stay visible.
                style = _DASHES[devices.index(device) % len(_DASHES)]
                colour = colour if multi else f"C{devices.index(device) % 10}"
            gid = f"run{run.id}" + (f"/gpu{device}" if device else "") + (f"/{kind}" if kind else "")
            # Earlier runs a little wider, so that a later one drawn over the same values leaves them visible.
            width = 1.4 + 0.8 * (len(runs) - 1 - order[run.id]) / max(len(runs) - 1, 1)
            alpha = 1.0
            if kind:  # beside the reading, quieter: a peak thin and translucent, a mean dotted
                alpha, variant_style, _ = VARIANT_LINES[kind]
                width, style = VARIANT_WIDTH, variant_style or style
            (line,) = ax.plot(xs, ys, color=colour, linestyle=style, linewidth=width, alpha=alpha)
            line.set_gid(gid)
            if np.count_nonzero(np.isfinite(ys)) == 1:
                line.set_marker("o")
                line.set_markersize(3)
        y_limits(ax, panel, np.concatenate([ys for *_, ys in lines]))
        lowest[column] = ax
    for ax in lowest.values():
        ax.set_xlabel(x_title)
    if steady:
        said = "; ".join(f"{panel.title}: {value:,.4g}{' ' + panel.unit if panel.unit else ''}"
                         for panel, value in steady)  # fmt: skip
        throughout = "in every run, throughout" if multi else "throughout"
        footnote = fig.supxlabel(
            # About 12 characters an inch at this size: wider lines ran off both edges.
            textwrap.fill(f"the same {throughout}, not drawn: {said}", width=int(fig.get_figwidth() * 12)),
            fontsize=9.5,
            color="0.25",
        )
        footnote.set_gid(UNCHANGED)

    if legend_row:
        from matplotlib.lines import Line2D

        key = fig.add_subplot(grid[0, :])
        key.axis("off")
        handles: list[Line2D] = []
        if multi:
            handles += [
                Line2D([], [], color=colours[run.id], linewidth=2.5, label=describe(run)) for run in runs
            ]
        if len(devices) > 1:
            handles += [
                Line2D(
                    [],
                    [],
                    color="black" if multi else f"C{i % 10}",
                    linestyle=_DASHES[i % len(_DASHES)],
                    linewidth=1.6,
                    label=f"GPU {device}",
                )
                for i, device in enumerate(devices)
            ]
        from matplotlib.patches import Patch

        for kind in shaded:
            colour, alpha, label = SHADES[kind]
            handles.append(Patch(color=colour, alpha=alpha * 2, label=f"{label} (explain)"))  # type: ignore[arg-type]
        for kind in kinds:
            alpha, variant_style, label = VARIANT_LINES[kind]
            handles.append(
                Line2D(
                    [],
                    [],
                    color="black",
                    linestyle=variant_style or "-",
                    linewidth=VARIANT_WIDTH,
                    alpha=alpha,
                    label=label,
                )
            )
        key.legend(
            handles=handles,
            loc="center",
            ncol=math.ceil(len(handles) / math.ceil(len(handles) / 4)),  # rows filled evenly
            frameon=False,
            fontsize=10.5,
            handlelength=3,
        )
    return fig


UNCHANGED = "unchanged"
"""The gid of the line under the figure that names the panels not drawn (``unchanged``)."""


def unchanged(
    drawn: list[tuple[Panel, list[Line]]],
) -> tuple[list[tuple[Panel, list[Line]]], list[tuple[Panel, float]]]:
    """``drawn`` split into the panels to draw and (panel, value) of the resource panels that
    would draw one flat line: every reading of every run and device, peaks and means
    included, one value (the CPUs allowed, a thread count, a network that never moved), at two
    points at least. The figure names those in one line instead. The loop's panels (``LOOP``)
    are always drawn, and so is one panel at least; a ``--signals`` pattern asks for what it
    names, so ``figure`` does not call this then."""
    kept: list[tuple[Panel, list[Line]]] = []
    steady: list[tuple[Panel, float]] = []
    for panel, lines in drawn:
        finite = _finite(np.concatenate([ys for *_, ys in lines]))
        if panel.category not in LOOP and len(finite) > 1 and finite.min() == finite.max():
            steady.append((panel, float(finite[0])))
        else:
            kept.append((panel, lines))
    return (kept, steady) if kept else (drawn, [])


def in_fitting_unit(panel: Panel, lines: list[Line]) -> tuple[Panel, list[Line]]:
    """The panel and its lines in the unit its largest value reads best in (``panels.fitted``):
    a network that moved 360 B/s drawn in B/s, not at 0.00035 MiB/s."""
    finite = _finite(np.concatenate([ys for *_, ys in lines]))
    unit, factor = fitted(panel.unit, float(np.abs(finite).max()) if len(finite) else 0.0)
    if factor == 1.0:
        return panel, lines
    scaled = [(run, device, kind, xs, ys * factor) for run, device, kind, xs, ys in lines]
    return replace(panel, unit=unit, scale=panel.scale * factor), scaled


def draw_parts(ax: Axes, panel: Panel, lines: list[Line], multi: bool) -> None:
    """Shares of a whole (``panel.parts``), one colour each with a key in the panel: stacked for
    one run whose parts share their x (they are logged together), else one line per part and run."""
    colour = {part: f"C{i % 10}" for i, part in enumerate(panel.parts)}
    xs = lines[0][3]
    if not multi and len(lines) == len(panel.parts) and all(np.array_equal(xs, line[3]) for line in lines):
        ys = [np.nan_to_num(line[4]) for line in lines]
        areas = ax.stackplot(xs, *ys, labels=panel.parts, colors=[colour[p] for p in panel.parts], alpha=0.8)
        for area, part in zip(areas, panel.parts, strict=True):
            area.set_gid(f"run{lines[0][0].id}/{part}")
        ax.set_ylim(0, 125)  # the key sits in the band above 100 %, not over the areas
        ax.set_yticks(range(0, 101, 20))
    else:
        runs = list(dict.fromkeys(line[0].id for line in lines))
        for run, part, _, part_xs, part_ys in lines:
            style = _DASHES[runs.index(run.id) % len(_DASHES)]
            (drawn,) = ax.plot(
                part_xs, part_ys, color=colour[part], linestyle=style, linewidth=1.4, label=part
            )
            drawn.set_gid(f"run{run.id}/{part}")
        y_limits(ax, panel, np.concatenate([ys for *_, ys in lines]))
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))  # one key per part, however many runs
    ax.legend(seen.values(), seen.keys(), fontsize=7, loc="upper left", ncol=3, framealpha=0.85)


def style_axes(ax: Axes, panel: Panel, x: str) -> None:
    """A panel's Axes as every figure draws it: its key as gid, its title, its unit, a light grid."""
    from matplotlib.ticker import EngFormatter, MaxNLocator  # importable once a figure was

    ax.set_gid(panel.key)
    ax.set_title(panel.title, fontsize=11, loc="left")
    ax.set_ylabel(panel.unit or panel.key.rsplit("/", 1)[-1])
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=8.5)
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    # Steps run to the hundreds of thousands: a few ticks, written 35k, stay apart.
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=x == "step"))
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))


def y_limits(ax: Axes, panel: Panel, values: npt.ArrayLike) -> None:
    """A training curve's spike cut off; shares and rates from 0, so that 2 % does not look
    like a full scale; ``values``: every y drawn in the panel."""
    limits = robust_limits(values) if panel.category == TRAINING else None
    if limits is not None:
        ax.set_ylim(*limits)
        ax.text(0.99, 0.97, "a spike is cut off", transform=ax.transAxes, ha="right", va="top", fontsize=8)
    elif panel.unit == "%" or panel.rate:
        finite = _finite(values)
        top = float(finite.max()) if len(finite) else 0.0
        ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
    else:
        finite = _finite(values)
        if len(finite) and finite.min() == finite.max():
            # One value throughout: matplotlib would centre it in ±5 % of itself (2.85 to 3.15
            # threads); drawn from 0 it reads as the level it is.
            level = float(finite[0])
            ax.set_ylim(*sorted((0.0, level * 1.25)) if level else (0.0, 1.0))
    if _whole(values):  # threads, processes, CPUs: no tick between two whole numbers
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _whole(values: npt.ArrayLike) -> bool:
    """Every finite value is a whole number (and there is one)."""
    finite = _finite(values)
    return bool(len(finite)) and bool(np.all(finite == np.round(finite)))


def _finite(values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    found = np.asarray(values, dtype=np.float64)
    return found[np.isfinite(found)]


SPIKE_QUANTILE = 0.98
SPIKE_FACTOR = 3.0
"""A training curve's top is cut at its 98th percentile (plus a margin) when its
highest value stands more than 3 times that percentile's span above the rest: a
first-step loss of 100 then leaves the descent from 2 to 0.1 readable."""


def robust_limits(values: npt.ArrayLike) -> tuple[float, float] | None:
    """y limits that leave out a spike, or None when the values have none."""
    finite = np.sort(_finite(values))
    if len(finite) < 10:
        return None
    low, high = float(finite[0]), float(finite[-1])
    cut = float(finite[min(len(finite) - 1, int(SPIKE_QUANTILE * len(finite)))])
    span = cut - low
    if span <= 0 or high - cut <= SPIKE_FACTOR * span:
        return None
    margin = 0.08 * span
    return low - margin, cut + margin


def matplotlib_figure() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(f"plotting needs matplotlib: {INSTALL_HINT}") from exc
    return Figure


def render(
    reader: StoreReader,
    runs: Sequence[Run],
    *,
    pattern: str | None = None,
    x: str = "step",
    output: str | Path,
    shade: Sequence[Stretch] = (),
) -> Path:
    """Draw ``runs`` (see :func:`figure`) into the PNG ``output`` (as :func:`save`
    writes it); returns its path. Raises what
    :func:`figure` raises, and ``OSError`` if the file cannot be written."""
    return save(figure(reader, runs, pattern=pattern, x=x, shade=shade), output)


def save(fig: Figure, output: str | Path) -> Path:
    """Write ``fig`` to the PNG ``output`` as ``atomicfile.output`` writes an output
    (atomically, or into the terminal or FIFO there; never through a link);
    returns its path; ``OSError`` if it cannot be written."""
    path = Path(output)
    with atomicfile.output(path) as file:
        write_png(fig, file)
    return path


def write_png(fig: Figure, file: BinaryIO) -> None:
    """``fig`` as a PNG, into the open binary ``file``."""
    fig.savefig(file, format="png", dpi=DPI)
