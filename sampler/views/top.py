"""The text of ``python -m sampler top``, without a terminal: a pure function of a ``View``.

``render`` turns what a ``StoreWatch`` holds into lines: a header, the
monitor's health, an alert when no sample arrived for a while, a row per
signal grouped by category (training signals first) with its current value,
min/max over the window and a sparkline, and a row per GPU. Labels and units
are ``sampler.catalogue``'s.
"""

from __future__ import annotations

import math
import textwrap
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
OWN_CATEGORIES = (*catalogue.DERIVED_CATEGORIES, "process", "process_tree")
"""The training's own categories, shown right after its signals: its throughput and step phases,
then its process: what people open ``top`` for, before the host's."""
LABEL_WIDTH = 30
"""The label column at its widest (characters); narrower when the labels are shorter."""
VALUE_WIDTH = 12
"""A value column at its narrowest (characters); wider when a value needs it."""
MIN_SPARK_WIDTH = 8
MAX_SPARK_WIDTH = 60
LABEL_MIN_WIDTH = 4
"""The label column at its narrowest, when a terminal has room for the value alone."""
VALUE_HEADINGS = ("now", "min", "max")
GPU_SPARK_HEADING = "util recent"
HEADER_SEPARATOR = " | "
"""Between the parts of the title and of the health line, where a narrow terminal breaks them."""


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
    return Line("health: " + HEADER_SEPARATOR.join(problems), "alert")


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


def header_lines(view: View, now: float, width: int | None = None) -> list[Line]:
    """The title, the store and command line, the health and the alerts; the title and the
    health on as many lines as ``width`` needs (``_wrap``), escaped (``printable``)."""
    run = view.run
    if run is None:
        return [Line("wl-resource-monitor top", "title"), Line(view.waiting or "waiting", "alert")]
    status = run.status_at(now, view.pid_alive, view.pid_suspended)
    duration = run.clock_at(now) - run.started_at if status == "running" else run.duration
    step = "-" if view.last_step is None else str(view.last_step)
    title = HEADER_SEPARATOR.join(
        (
            f"run {run.id}",
            *filter(None, (run.host, run.rank_label)),  # a part each: a long host is cut, not the rank
            f"pid {_pid(run)}",
            status,
            format_duration(duration),
            f"step {step}",
            f"every {run.interval:g} s",
            "q quits",
        )
    )
    command = " ".join(run.command) or "?"
    lines = [*_wrap(Line(title, "title"), width), Line(f"{view.store}: {command}")]
    lines += _wrap(health_line(run.stats), width)
    if view.error is not None:
        lines.append(Line(f"!! {view.error}", "alert"))
    stale = stale_line(view, now)
    if stale is not None:
        lines.append(stale)
    return lines


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _wrap(line: Line, width: int | None) -> list[Line]:
    """``line`` escaped and, when too long for ``width``, on several, broken between its `` | ``
    parts (the title's step or a health problem is not cut off the end), a part longer than a
    line between its words; a word longer than a line is cut."""
    text = printable(line.text)  # measured as the terminal will show it
    if width is None or len(text) <= width:
        return [Line(text, line.style)]
    lines: list[str] = []
    for part in text.split(HEADER_SEPARATOR):
        if lines and len(lines[-1]) + len(HEADER_SEPARATOR) + len(part) <= width:
            lines[-1] += HEADER_SEPARATOR + part
        else:
            lines += textwrap.wrap(part, width, break_long_words=False, break_on_hyphens=False) or [part]
    return [Line(_fit(text, width), line.style) for text in lines]


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


class Columns(NamedTuple):
    """How the signal rows fill a width: the label column's and each value column's width, how
    many value columns are shown (now, min, max; or now alone), and the sparkline's (0: none)."""

    label: int
    value: int
    shown: int
    spark: int


def columns(longest_label: int, longest_cell: int, width: int) -> Columns:
    """The layout of rows whose longest label and value cell are that many characters, in
    ``width``: every cell whole (a column is as wide as its longest cell, and at least
    ``VALUE_WIDTH``), the label column as wide as its longest label (at most ``LABEL_WIDTH``).
    What does not fit goes, least needed first: the sparkline, then min and max, then the
    labels' ends (cut with "…"); a number is never cut."""
    label = min(LABEL_WIDTH, 2 + longest_label + 1)
    value = max(VALUE_WIDTH, longest_cell + 1)
    for shown in (len(VALUE_HEADINGS), 1):
        used = label + shown * value
        spark = min(MAX_SPARK_WIDTH, width - used - 2)
        if spark >= MIN_SPARK_WIDTH:
            return Columns(label, value, shown, spark)
        if used <= width:
            return Columns(label, value, shown, 0)
    return Columns(max(width - value, LABEL_MIN_WIDTH), value, 1, 0)


def signal_lines(
    points: Mapping[str, Sequence[Point]], width: int, window: int = WINDOW_POINTS
) -> list[Line]:
    """A row per signal, grouped (see ``group_of``): label, current value, min
    and max over the window, sparkline, laid out in ``width`` by ``columns``; GPUs as one row
    per device (see ``gpu_lines``), between the training signals and the other resources.
    Peaks, means, counters' own rates and counters shown by a gauge have no row
    (``_shown_elsewhere``)."""
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
    groups: list[tuple[int, str, list[tuple[str, list[str], list[float]]]]] = []
    for (key, group), members in sorted(rows.items()):
        shown = []
        for _, label, name in sorted(members):
            series = list(points[name])
            rate = _is_counter(name)
            if rate:
                series = rates(series)
                label += " /s"
            values = [v for _, v in series]
            finite = [v for v in values if math.isfinite(v)]
            texts = [
                format_value(name, values[-1], rate=rate) if values else "-",
                format_value(name, min(finite), rate=rate) if finite else "-",
                format_value(name, max(finite), rate=rate) if finite else "-",
            ]
            shown.append((printable(label), texts, values))  # escaped before it is measured
        groups.append((key[0], group, shown))
    every = [member for _, _, group_rows in groups for member in group_rows]
    layout = columns(
        max((len(label) for label, _, _ in every), default=0),
        max((len(text) for _, texts, _ in every for text in texts), default=0),
        width,
    )
    headings = "".join(f"{h:>{layout.value}}" for h in VALUE_HEADINGS[: layout.shown])
    lines = [Line(f"{'':<{layout.label}}{headings}{'  recent' if layout.spark else ''}", "heading")]
    for order, group, group_rows in groups:
        if gpus and order == 2:  # the GPUs right below the process's own rows, before the host's
            lines += gpu_lines(gpus, layout.spark, width)
            gpus = {}
        lines.append(Line(group, "heading"))
        for label, texts, values in group_rows:
            text = f"  {_fit(label, layout.label - 3):<{layout.label - 2}}" + "".join(
                f"{c:>{layout.value}}" for c in texts[: layout.shown]
            )
            lines.append(Line(f"{text}  {sparkline(values, layout.spark)}" if layout.spark else text))
    if gpus:
        lines += gpu_lines(gpus, layout.spark, width)
    return lines


def gpu_lines(
    gpus: Mapping[str, Mapping[str, Sequence[Point]]], spark: int = 20, width: int | None = None
) -> list[Line]:
    """One row per GPU (``gpu/<i>`` -> signal after it -> points): the latest value of
    each of ``GPU_COLUMNS`` it logs side by side under a header of their labels, then a
    sparkline of its utilization, ``spark`` characters wide at most (0: none). Columns that do
    not fit in ``width`` follow in a table of their own below, so no value is cut."""
    present = [s for s in GPU_COLUMNS if s in {s for signals in gpus.values() for s in signals}]
    devices = sorted(gpus, key=lambda g: int(g.split("/")[1]))  # gpu/2 before gpu/10
    heads = [label_of(f"{catalogue.PREFIX}{devices[0]}/{s}") for s in present]
    table: list[list[str]] = []
    for device in devices:
        kept = [gpus[device].get(signal) for signal in present]
        table.append(
            [
                format_value(f"{catalogue.PREFIX}{device}/{signal}", points[-1][1]) if points else "-"
                for signal, points in zip(present, kept, strict=True)
            ]
        )
    widths = [max(len(head), *(len(r[i]) for r in table)) for i, head in enumerate(heads)]
    label = 2 + max(len(d) for d in devices) + 2
    parts = _parts(widths, label, width)
    if spark:  # in the last table's room when the heading fits there, else a table of its own
        room = spark if width is None else width - label - sum(widths[i] + 2 for i in parts[-1])
        if room < len(GPU_SPARK_HEADING):
            parts.append([])
        else:
            spark = min(spark, room)
        parts[-1].append(len(heads))
        heads.append(GPU_SPARK_HEADING)
        widths.append(max(spark, len(GPU_SPARK_HEADING)))
        for device, row in zip(devices, table, strict=True):
            util = gpus[device].get(catalogue.GPU_UTILIZATION.suffix) or []
            row.append(sparkline([v for _, v in util], spark))
    lines: list[Line] = []
    for part in parts:
        align = ["<" if spark and i == len(heads) - 1 else ">" for i in part]  # the sparkline to the left
        head = "  ".join(f"{heads[i]:{a}{widths[i]}}" for i, a in zip(part, align, strict=True))
        lines.append(Line(f"{'gpu':<{label}}{head}", "heading"))
        for device, row in zip(devices, table, strict=True):
            cells = "  ".join(f"{row[i]:{a}{widths[i]}}" for i, a in zip(part, align, strict=True))
            lines.append(Line(f"  {device:<{label - 2}}{cells}"))
    return lines


def _parts(widths: Sequence[int], label: int, width: int | None) -> list[list[int]]:
    """The GPU table's columns (their indices), in order, in tables that each fit in ``width``
    beside the ``label`` column (one column at least, however narrow)."""
    parts: list[list[int]] = [[]]
    used = label
    for i, w in enumerate(widths):
        if parts[-1] and width is not None and used + 2 + w > width:
            parts.append([])
            used = label
        used += w + (2 if parts[-1] else 0)
        parts[-1].append(i)
    return parts


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
    head = header_lines(view, now, width)
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
