"""Small multiples of one or more runs of a run store, drawn with matplotlib.

The run's own training signals (every name that is not ``resource/...``) come
first, then the resource panels grouped by category in ``sampler.catalogue``'s
order, one panel per quantity, titled and with its unit on the y axis as the
catalogue says. In the gpu panels each device is its own line. Several runs
are overlaid, one colour per run (and then one line style per GPU device).

A reading's peak and mean between logged steps (``..._peak``, ``..._mean``)
are drawn in its panel, as thin translucent and dotted lines beside it (the
key names both), and a counter's own ``..._per_second`` rate is left out where
the counter is drawn. Counters (disk reads/writes and network bytes since
boot, container CPU throttled) are drawn as rates (MiB/s, s/s), from
consecutive wall times; a counter that goes backwards (a reboot, a wrapped
counter) leaves a gap, never a negative rate. A counter whose rate is a gauge
of its own (CPU seconds, whose rate is the CPU %) is left out where that gauge
is drawn. Bytes are drawn in GiB, bytes/s in MiB/s.

matplotlib is imported only when a figure is drawn, never by ``import
sampler``; without it, drawing raises ``ImportError`` naming the extra
(:data:`INSTALL_HINT`). Nothing here touches pyplot or the global backend: the
figure is a bare ``matplotlib.figure.Figure`` written with the Agg renderer.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from sampler import catalogue
from sampler.analysis.stretches import PAUSE, Stretch
from sampler.store.reader import Records, Run, Series, StoreReader
from sampler.util import atomicfile

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

_DRAWN_AS = {
    "bytes": ("GiB", 1.0 / catalogue.GIB),  # GPU memory: bytes are unreadable at 10^10
    "bytes/s": ("MiB/s", 1.0 / catalogue.MIB),
}
"""Units drawn in another: the unit drawn and the factor from the stored one."""

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


def matches(name: str, pattern: str | None) -> bool:
    """Whether signal ``name`` is selected by ``pattern``: every name when None;
    an fnmatch glob over the whole name when the pattern has ``*``, ``?`` or ``[``
    (``resource/gpu/*``, ``*loss``; ``*`` also crosses ``/``), else a substring
    (``loss``, ``gpu/0/``). Case-sensitive."""
    if pattern is None:
        return True
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


@dataclass
class Panel:
    """One panel: the signals it draws (one per GPU device for gpu), how."""

    key: str
    """``train/loss``, ``resource/disk/read_mb``, or ``resource/gpu/*/power_watts``."""
    category: str
    """``training`` or the resource category."""
    title: str
    unit: str
    scale: float = 1.0
    rate: bool = False
    """A cumulative counter, drawn as its rate (unit per second)."""
    names: dict[str, str] = field(default_factory=dict)
    """Device (``""`` outside gpu) -> signal name."""
    variants: dict[tuple[str, str], str] = field(default_factory=dict)
    """(device, ``peak`` or ``mean``) -> the name of that reading's peak or mean between steps."""
    rank: int = len(catalogue.RANKS)
    """Its place within its category (the catalogue's order; unknown signals last)."""


def panels(names: Sequence[str]) -> list[Panel]:
    """The panels that draw ``names``, in drawing order: training signals, then
    the resource categories (``catalogue.CATEGORIES``, then any unknown ones)."""
    training: list[Panel] = []
    resources: dict[str, dict[str, Panel]] = {}
    present = set(names)
    variants: list[tuple[str, str, str]] = []
    for name in sorted(present):
        reading = catalogue.lookup(name)
        if reading is not None:
            if reading.variant and name.removesuffix("_" + reading.variant) in present:
                variants.append((name.removesuffix("_" + reading.variant), reading.variant, name))
                continue
            if catalogue.shown_by_another(name, present):
                continue  # a counter's rate, drawn as the counter's panel or as a gauge's
        parts = name.split("/")
        if parts[0] != "resource" or len(parts) < 3:
            training.append(Panel(name, "training", name, "", names={"": name}))
            continue
        category = parts[1]
        device = parts[2] if category == "gpu" and len(parts) >= 4 else ""
        signal = "/".join(parts[3:] if device else parts[2:])
        key = f"resource/gpu/*/{signal}" if device else name
        panel = resources.setdefault(category, {}).get(key)
        if panel is None:
            panel = _resource_panel(key, category, signal, reading)
            resources[category][key] = panel
        panel.names[device] = name
    by_name = {name: (panel, device) for group in resources.values() for panel in group.values()
               for device, name in panel.names.items()}  # fmt: skip
    for base, kind, name in variants:
        if base in by_name:
            panel, device = by_name[base]
            panel.variants[device, kind] = name
    known = catalogue.CATEGORIES
    order = [c for c in known if c in resources] + sorted(set(resources) - set(known))
    result = list(training)
    for category in order:
        result += sorted(resources[category].values(), key=lambda p: (p.rank, p.key))
    return result


def _resource_panel(key: str, category: str, signal: str, reading: catalogue.Reading | None) -> Panel:
    """The panel of ``key``: as the catalogue says, a counter as its rate; a signal it does
    not know (a newer version's) titled by its name, without a unit."""
    if reading is None:
        return Panel(key, category, f"{category} {signal.replace('_', ' ')}", "")
    known = reading.signal
    rate = known.kind == catalogue.COUNTER
    per_second = catalogue.SIGNALS.get(known.key + catalogue.RATE_SUFFIX)  # its unit: J/s is W
    unit = (per_second.unit if per_second else known.unit + "/s") if rate else known.unit
    unit, scale = _DRAWN_AS.get(unit, (unit, 1.0))
    title = f"{known.title} ({reading.variant})" if reading.variant else known.title
    return Panel(key, category, title, unit, scale, rate=rate, rank=catalogue.RANKS[known.key])


# --------------------------------------------------------------------------- points


def points(series: Series, run: Run, x: str, panel: Panel) -> tuple[list[float], list[float]]:
    """The (x, y) of one line, in wall-time order, scaled; NaN in y where the
    line must break: a counter that went backwards, or (x=step) a step that went
    back (the model restarted at age 0)."""
    order = sorted(range(len(series.steps)), key=lambda i: (series.wall_times[i], series.steps[i]))
    if panel.rate:
        # A reading at the same instant as the one before has no rate: the earlier is the base.
        wall_times = series.wall_times
        order = [i for k, i in enumerate(order) if not k or wall_times[i] != wall_times[order[k - 1]]]
        walls = np.fromiter((series.wall_times[i] for i in order), np.float64, len(order))
        counted = np.fromiter((series.values[i] for i in order), np.float64, len(order))
        per_second = dict(zip(order, catalogue.rates(counted, walls).tolist(), strict=True))
    xs: list[float] = []
    ys: list[float] = []
    for i in order:
        step, wall, value = series.steps[i], series.wall_times[i], series.values[i]
        position = float(step) if x == "step" else wall - run.started_at
        y = value * panel.scale if math.isfinite(value) else math.nan
        if panel.rate:
            if i == order[0]:
                continue  # the first reading: no rate
            y = per_second[i] * panel.scale
        if xs and x == "step" and position < xs[-1]:
            xs.append(position)
            ys.append(math.nan)
        xs.append(position)
        ys.append(y)
    return xs, ys


Line = tuple[Run, str, str, list[float], list[float]]
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


def _lines(
    loaded: dict[int, RunPoints], runs: Sequence[Run], panel: Panel, x: str, available: dict[int, set[str]]
) -> list[Line]:
    """Every line of ``panel`` with at least one finite point."""
    lines = []
    for run in runs:
        for device in sorted(panel.names, key=lambda d: (len(d), d)):
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
                if any(math.isfinite(y) for y in ys):
                    lines.append((run, device, kind, xs, ys))
    return lines


# --------------------------------------------------------------------------- drawing


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
    current one, and the training signals never share a row with resources."""
    cells: list[tuple[int, int]] = []
    row, column = 0, 0
    previous = None
    for category, group in itertools.groupby(categories):
        size = len(list(group))
        shares = column + size <= COLUMNS and "training" not in (category, previous)
        if column and not shares:
            row, column = row + 1, 0
        for _ in range(size):
            if column == COLUMNS:
                row, column = row + 1, 0
            cells.append((row, column))
            column += 1
        previous = category
    return cells


SHADES = {PAUSE: ("0.5", 0.18, "step stood still"), "slow": ("tab:red", 0.14, "slow stretch")}
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
    for panel in panels(selected):
        lines = _lines(loaded, runs, panel, x, available)
        if lines:
            drawn.append((panel, lines))
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
    figure_class = matplotlib_figure()
    cells = layout([panel.category for panel, _ in drawn])
    rows = cells[-1][0] + 1
    columns = max(column for _, column in cells) + 1
    multi = len(runs) > 1
    devices = sorted(
        {device for panel, lines in drawn for _, device, _, _, _ in lines if device},
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
            if len([y for y in ys if math.isfinite(y)]) == 1:
                line.set_marker("o")
                line.set_markersize(3)
        y_limits(ax, panel, [y for *_, ys in lines for y in ys])
        lowest[column] = ax
    for ax in lowest.values():
        ax.set_xlabel(x_title)

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


def y_limits(ax: Axes, panel: Panel, values: Sequence[float]) -> None:
    """A training curve's spike cut off; shares and rates from 0, so that 2 % does not look
    like a full scale; ``values``: every y drawn in the panel."""
    limits = robust_limits(values) if panel.category == "training" else None
    if limits is not None:
        ax.set_ylim(*limits)
        ax.text(0.99, 0.97, "a spike is cut off", transform=ax.transAxes, ha="right", va="top", fontsize=8)
    elif panel.unit == "%" or panel.rate:
        top = max((y for y in values if math.isfinite(y)), default=0.0)
        ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)


SPIKE_QUANTILE = 0.98
SPIKE_FACTOR = 3.0
"""A training curve's top is cut at its 98th percentile (plus a margin) when its
highest value stands more than 3 times that percentile's span above the rest: a
first-step loss of 100 then leaves the descent from 2 to 0.1 readable."""


def robust_limits(values: Sequence[float]) -> tuple[float, float] | None:
    """y limits that leave out a spike, or None when the values have none."""
    finite = sorted(v for v in values if math.isfinite(v))
    if len(finite) < 10:
        return None
    low, high = finite[0], finite[-1]
    cut = finite[min(len(finite) - 1, int(SPIKE_QUANTILE * len(finite)))]
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
