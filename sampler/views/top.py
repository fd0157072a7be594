"""The text of ``python -m sampler top``, without a terminal: a pure function of a ``View``.

``render`` turns what a ``StoreWatch`` holds into lines: a header, the
monitor's health, an alert when no sample arrived for a while, a row per
signal grouped by category (training signals first) with its current value,
min/max over the window and a sparkline, and a row per GPU. Labels and units
are ``sampler.catalogue``'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from sampler import catalogue
from sampler.store.reader import Run
from sampler.util.quoting import printable
from sampler.views.formatting import format_duration, format_value, sparkline
from sampler.views.watch import WINDOW_POINTS, Point, View

STALE_INTERVALS = 3
"""No point for this many sampling intervals: the alert "no sample for N s"."""
STALE_FLOOR_SECONDS = 1.0
"""The alert waits at least this long (very short test intervals jitter)."""
GPU_COLUMNS = tuple(
    signal.suffix + variant
    for signal, variant in (
        (catalogue.GPU_UTILIZATION, ""),
        (catalogue.GPU_UTILIZATION, catalogue.PEAK_SUFFIX),
        (catalogue.GPU_MEMORY_USED, ""),
        (catalogue.GPU_MEMORY_USED, catalogue.PEAK_SUFFIX),
        (catalogue.GPU_MEMORY_PERCENT, ""),
        (catalogue.GPU_PROCESS_MEMORY, ""),
        (catalogue.GPU_TREE_MEMORY, ""),
        (catalogue.GPU_TEMPERATURE, ""),
        (catalogue.GPU_POWER, ""),
        (catalogue.GPU_POWER_LIMIT, ""),
        (catalogue.GPU_THROTTLE_POWER, ""),
        (catalogue.GPU_THROTTLE_THERMAL, ""),
        (catalogue.GPU_SM_CLOCK, ""),
        (catalogue.GPU_MEMORY_CLOCK, ""),
    )
)
"""A GPU row's columns (what follows ``gpu/<i>/`` in their names), in order, those a device
logs; its other signals (means, the raw throttle bitmask, ...) are in the store, for ``plot``
and ``export``."""
OWN_CATEGORIES = ("process", "process_tree")
"""The training process's own categories, shown right after the training signals: what people
open ``top`` for, before the host's."""
LABEL_WIDTH = 30
VALUE_WIDTH = 12
MIN_SPARK_WIDTH = 8
MAX_SPARK_WIDTH = 60


class Line(NamedTuple):
    """One line of the view; ``style`` is "title", "alert", "heading" or "" (plain)."""

    text: str
    style: str = ""


def rates(points: Sequence[Point]) -> list[Point]:
    """A cumulative counter's points as rates per second between consecutive
    points (``catalogue.rates``: a counter that went back, a reboot or a wrap, gives no rate)."""
    walls = np.fromiter((w for w, _ in points), np.float64, len(points))
    values = np.fromiter((v for _, v in points), np.float64, len(points))
    per_second = catalogue.rates(values, walls)
    return [(w, float(r)) for w, r in zip(walls.tolist(), per_second, strict=True) if math.isfinite(r)]


def label_of(name: str) -> str:
    """A resource signal's label: the catalogue's (a peak's or mean's with ``peak`` or ``mean``
    after it); a name it does not know is labelled by what follows its category."""
    reading = catalogue.lookup(name)
    if reading is None:
        rest = name.removeprefix(catalogue.PREFIX)
        return rest.partition("/")[2] or rest
    return " ".join(filter(None, (reading.signal.label, reading.variant)))


def _rank(name: str) -> tuple[int, int]:
    """A row's place in its group: the catalogue's order, a reading before its peak and mean."""
    reading = catalogue.lookup(name)
    if reading is None:
        return len(catalogue.RANKS), 0
    return catalogue.RANKS[reading.signal.key], ("", *catalogue.VARIANTS).index(reading.variant)


def group_of(name: str) -> tuple[tuple[int, int, str], str, str]:
    """(sort key, group, row label) of a signal: training signals first,
    grouped by their first path part (``train/loss``: group ``train``, label
    ``loss``); then the training process's own (``OWN_CATEGORIES``), then the other
    resource categories in ``catalogue.CATEGORIES`` order, labelled as ``label_of``
    says; a GPU's signals group under ``gpu/<i>``, labelled by what follows it
    (``gpu_lines`` makes them columns)."""
    if not name.startswith(catalogue.PREFIX):
        head, _, rest = name.partition("/")
        group, label = (head, rest) if rest else ("training", head)
        return (0, 0, group), group, label
    parts = name.removeprefix(catalogue.PREFIX).split("/")
    category = parts[0]
    order = catalogue.CATEGORIES
    rank = order.index(category) if category in order else len(order)
    if category in OWN_CATEGORIES:
        return (1, OWN_CATEGORIES.index(category), category), category, label_of(name)
    if (
        category == "gpu"
        and len(parts) >= 3
        and parts[1].isascii()
        and catalogue.DEVICE_LABEL.fullmatch(parts[1])
    ):
        gpu, slot = catalogue.device_order(parts[1])
        return (2, rank, f"gpu/{gpu:06d}/{slot + 1:03d}"), f"gpu/{parts[1]}", "/".join(parts[2:])
    return (2, rank, category), category, label_of(name)


def health_line(stats: Mapping[str, Any] | None) -> Line:
    """The monitor's own health from its ``stats()``: restarts (with the
    latest death), records lost, quarantined categories and GPUs, store errors, what it
    waits for, the error that stopped it. An alert when any is wrong."""
    if stats is None:
        return Line("health: not reported yet")
    problems = []
    restarts = int(stats.get("restarts") or 0)
    deaths = stats.get("deaths") or []
    if restarts:
        text = f"{restarts} restart{'s' if restarts != 1 else ''}"
        if deaths and isinstance(deaths[-1], Mapping):
            last = deaths[-1]
            where = f" in {last['category']}" if last.get("category") else ""
            text += f" (last: {last.get('cause', '?')}{where})"
        problems.append(text)
    lost = int(stats.get("records_lost") or 0)
    if lost:
        problems.append(f"{lost} records lost")
    quarantined = stats.get("quarantined") or []
    if quarantined:
        problems.append("quarantined: " + ", ".join(map(str, quarantined)))
    gpus = stats.get("gpus_quarantined") or []
    if gpus:  # each brought the child down three times; the other GPUs go on reading
        problems.append("GPUs quarantined: " + ", ".join(map(str, gpus)))
    if stats.get("isolation") == "thread" and quarantined:
        problems.append("sampling in-thread")
    if stats.get("store_error"):
        problems.append(f"store error: {stats['store_error']}")
    dropped = int(stats.get("store_points_dropped") or 0)
    if dropped:
        problems.append(f"{dropped} points the store dropped")
    if stats.get("waiting_for"):
        problems.append(f"waiting for {stats['waiting_for']}")
    if stats.get("error"):
        problems.append(f"monitor stopped: {stats['error']}")
    if not problems:
        return Line("health: ok (0 restarts, 0 records lost, nothing quarantined, store ok)")
    return Line("health: " + " | ".join(problems), "alert")


def stale_line(view: View, now: float) -> Line | None:
    """ "no sample for N s" when a run that did not end has written nothing for
    ``STALE_INTERVALS`` intervals, saying whether its process is gone."""
    run = view.run
    if run is None or run.ended_at is not None:
        return None
    newest = view.newest if view.newest is not None else run.started_at
    quiet = run.clock_at(now) - newest  # both on the run's clock: a step of the wall clock moves neither
    if quiet <= max(STALE_INTERVALS * run.interval, STALE_FLOOR_SECONDS):
        return None
    if view.pid_alive is False:
        why = f"the backend (pid {_pid(run)}) is gone"
    elif view.pid_suspended:
        why = f"the backend (pid {_pid(run)}) is stopped (SIGSTOP, Ctrl-Z, a suspended job)"
    elif view.pid_alive:
        why = f"the backend (pid {_pid(run)}) still runs: hung, or its steps paused"
    else:
        why = "the backend stopped or hung"
    return Line(f"!! no sample for {quiet:.0f} s: {why}", "alert")


def _pid(run: Run) -> str:
    return "?" if run.pid is None else str(run.pid)


def header_lines(view: View, now: float) -> list[Line]:
    run = view.run
    if run is None:
        return [Line("wl-resource-monitor top", "title"), Line(view.waiting or "waiting", "alert")]
    status = run.status_at(now, view.pid_alive, view.pid_suspended)
    duration = run.clock_at(now) - run.started_at if status == "running" else run.duration
    step = "-" if view.last_step is None else str(view.last_step)
    title = (
        f"run {run.id} | {run.where} pid {_pid(run)} | {status} | {format_duration(duration)} | step {step}"
        f" | every {run.interval:g} s | q quits"
    )
    command = " ".join(run.command) or "?"
    lines = [Line(title, "title"), Line(f"{view.store}: {command}"), health_line(run.stats)]
    if view.error is not None:
        lines.append(Line(f"!! {view.error}", "alert"))
    stale = stale_line(view, now)
    if stale is not None:
        lines.append(stale)
    return lines


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _is_counter(name: str) -> bool:
    reading = catalogue.lookup(name)
    return reading is not None and reading.signal.kind == catalogue.COUNTER


def _shown_elsewhere(name: str, points: Mapping[str, Sequence[Point]]) -> bool:
    """A reading's peak or mean between steps, a counter's own rate, or a counter whose rate
    is a gauge of its own (CPU seconds' CPU %): a row of their own would double the screen
    (``plot`` draws them; the counter's row is its rate, or that gauge's)."""
    reading = catalogue.lookup(name)
    if reading is None:
        return False
    if reading.variant:
        return name.removesuffix("_" + reading.variant) in points
    return catalogue.shown_by_another(name, points)


def signal_lines(
    points: Mapping[str, Sequence[Point]], width: int, window: int = WINDOW_POINTS
) -> list[Line]:
    """A row per signal, grouped (see ``group_of``): label, current value, min
    and max over the window, sparkline; GPUs as one row per device (see
    ``gpu_lines``), between the training signals and the other resources.
    Peaks, means, counters' own rates and counters shown by a gauge have no row
    (``_shown_elsewhere``)."""
    spark = max(MIN_SPARK_WIDTH, min(MAX_SPARK_WIDTH, width - LABEL_WIDTH - 3 * VALUE_WIDTH - 4))
    lines: list[Line] = []
    if not points:
        return [Line("no signals yet")]
    gpus: dict[str, dict[str, Sequence[Point]]] = {}
    rows: dict[tuple[tuple[int, int, str], str], list[tuple[tuple[int, int], str, str]]] = {}
    for name in points:
        key, group, label = group_of(name)
        if group.startswith("gpu/"):
            gpus.setdefault(group, {})[label] = points[name]
        elif not _shown_elsewhere(name, points):
            rows.setdefault((key, group), []).append((_rank(name), label, name))
    columns = f"{'':<{LABEL_WIDTH}}{'now':>{VALUE_WIDTH}}{'min':>{VALUE_WIDTH}}{'max':>{VALUE_WIDTH}}  recent"
    lines.append(Line(columns, "heading"))
    for (key, group), members in sorted(rows.items()):
        if gpus and key[0] == 2:  # the GPUs right below the process's own rows, before the host's
            lines += gpu_lines(gpus, spark)
            gpus = {}
        lines.append(Line(group, "heading"))
        for _, label, name in sorted(members):
            series = list(points[name])
            rate = _is_counter(name)
            if rate:
                series = rates(series)
                label += " /s"
            values = [v for _, v in series]
            finite = [v for v in values if math.isfinite(v)]
            if not values:
                cells = ["-", "-", "-"]
            else:
                cells = [
                    format_value(name, values[-1], rate=rate),
                    format_value(name, min(finite), rate=rate) if finite else "-",
                    format_value(name, max(finite), rate=rate) if finite else "-",
                ]
            text = f"  {_fit(label, LABEL_WIDTH - 3):<{LABEL_WIDTH - 2}}" + "".join(
                f"{_fit(c, VALUE_WIDTH - 1):>{VALUE_WIDTH}}" for c in cells
            )
            lines.append(Line(f"{text}  {sparkline(values, spark)}"))
    if gpus:
        lines += gpu_lines(gpus, spark)
    return lines


def gpu_lines(gpus: Mapping[str, Mapping[str, Sequence[Point]]], spark: int = 20) -> list[Line]:
    """One row per GPU (``gpu/<i>`` -> signal after it -> points): the latest value of
    each of ``GPU_COLUMNS`` it logs side by side under a header of their labels, then a
    sparkline of its utilization."""
    present = {s for signals in gpus.values() for s in signals}
    devices = sorted(gpus, key=lambda g: int(g.split("/")[1]))  # gpu/2 before gpu/10
    columns = [(label_of(f"{catalogue.PREFIX}{devices[0]}/{s}"), s) for s in GPU_COLUMNS if s in present]
    table: list[list[str]] = []
    for device in devices:
        signals = gpus[device]
        row = []
        for _, signal in columns:
            kept = signals.get(signal)
            name = f"{catalogue.PREFIX}{device}/{signal}"
            row.append(format_value(name, kept[-1][1]) if kept else "-")
        table.append(row)
    widths = [max(len(label), *(len(r[i]) for r in table)) for i, (label, _) in enumerate(columns)]
    label = 2 + max(len(d) for d in devices) + 2
    head = "  ".join(f"{name:>{w}}" for (name, _), w in zip(columns, widths, strict=True))
    lines = [Line(f"{'gpu':<{label}}{head}  util recent", "heading")]
    for device, row in zip(devices, table, strict=True):
        util = gpus[device].get(catalogue.GPU_UTILIZATION.suffix) or []
        cells = "  ".join(f"{c:>{w}}" for c, w in zip(row, widths, strict=True))
        lines.append(Line(f"  {device:<{label - 2}}{cells}  {sparkline([v for _, v in util], spark)}"))
    return lines


def render(
    view: View, now: float, width: int = 120, height: int | None = None, offset: int = 0
) -> list[Line]:
    """``frame``'s lines alone."""
    return frame(view, now, width, height, offset)[0]


def frame(
    view: View, now: float, width: int = 120, height: int | None = None, offset: int = 0
) -> tuple[list[Line], int]:
    """The whole screen for ``view`` at wall time ``now``, and the scroll offset it shows: every
    line with the store's text escaped (``printable``: a host, a command line, a signal name or
    an error others wrote cannot drive the terminal) and cut to ``width`` characters. With a
    ``height``, at most that many lines: the header and the columns' heading stay, the rows
    below them start ``offset`` rows down (kept within what there is), and the last line says
    how many rows are above and below and which keys scroll."""
    width = max(width, 1)
    head = header_lines(view, now)
    body: list[Line] = []
    if view.run is not None:
        head.append(Line(f"min and max: over the last {view.window} points"))
        body = signal_lines(view.points, width, view.window)
        if body[0].style == "heading":  # the columns' heading stays with the header
            head.append(body.pop(0))
    lines = [Line(_fit(printable(line.text), width), line.style) for line in head + body]
    if height is None or len(lines) <= height:
        return lines, 0
    height = max(height, 1)
    room = height - len(head) - 1  # the rows' lines between the header and the last line
    if room < 1:  # not even one row fits below the header
        more = Line(_fit(f"… {len(lines) - height + 1} more rows: enlarge the terminal", width), "alert")
        return [*lines[: height - 1], more], 0
    offset = max(0, min(offset, len(body) - room))
    above, below = offset, len(body) - room - offset
    more = Line(
        _fit(f"… {above + below} more rows ({above} above, {below} below): {SCROLL_KEYS}", width), "alert"
    )
    return [*lines[: len(head)], *lines[len(head) + offset : len(head) + offset + room], more], offset


SCROLL_KEYS = "↑↓ PgUp PgDn Home End"
"""What the last line of a view taller than the terminal names (``frame``)."""


def frame_text(lines: Sequence[Line]) -> str:
    """The lines as plain text (``--once``)."""
    return "\n".join(line.text.rstrip() for line in lines)
