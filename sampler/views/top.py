"""The live terminal view of one run (``python -m sampler top``): what it reads
from the store and the text it shows, without a terminal.

``StoreWatch`` follows a run in a store that a backend may be writing: a first
read takes the latest ``WINDOW_POINTS`` points of each signal through the
store's index, and every later ``poll`` reads only the points written since
(by rowid). ``render`` turns what it holds into lines of text: a header, the
monitor's health, an alert when no sample arrived for a while, a row per
signal grouped by category (training signals first) with its current value,
min/max over the window and a sparkline, and a row per GPU. Everything but
``StoreWatch`` is a pure function of its arguments.
"""

from __future__ import annotations

import itertools
import math
import sqlite3
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sampler.store.reader import Run, StoreReader
from sampler.util.quoting import printable

WINDOW_POINTS = 120
"""Recent points kept per signal: what min/max and the sparkline cover."""
STALE_INTERVALS = 3
"""No point for this many sampling intervals: the alert "no sample for N s"."""
STALE_FLOOR_SECONDS = 1.0
"""The alert waits at least this long (very short test intervals jitter)."""
RELOAD_AFTER_ROWS = 50_000
"""More new rows than this since the last poll: re-read the latest window per
signal through the index instead of walking every row."""
SPARK = "▁▂▃▄▅▆▇█"
RESOURCE_PREFIX = "resource/"
CATEGORY_ORDER = ("cpu", "memory", "disk", "network", "process", "gpu")
COUNTERS = frozenset(
    {
        "resource/disk/read_mb",
        "resource/disk/written_mb",
        "resource/network/bytes_sent",
        "resource/network/bytes_received",
    }
)
"""Cumulative counters since boot: shown as rates per second."""
GPU_COLUMNS = (
    ("util", "utilization_percent"),
    ("util peak", "utilization_percent_peak"),
    ("memory", "memory_allocated_bytes"),
    ("mem peak", "memory_allocated_bytes_peak"),
    ("mem %", "memory_allocated_percent"),
    ("own mem", "process_memory_bytes"),
    ("tree mem", "tree_memory_bytes"),
    ("temp", "temperature_celsius"),
    ("power", "power_watts"),
    ("power cap", "power_limit_watts"),
    ("pwr thr", "throttle_power"),
    ("heat thr", "throttle_thermal"),
    ("sm clock", "sm_clock_mhz"),
    ("mem clock", "memory_clock_mhz"),
)
"""A GPU row's columns, in order, those a device logs; its other signals (means, the raw
throttle bitmask, ...) are in the store, for ``plot`` and ``export``."""
LABEL_WIDTH = 30
VALUE_WIDTH = 12
MIN_SPARK_WIDTH = 8
MAX_SPARK_WIDTH = 60

Point = tuple[float, float]
"""(wall time in s since the epoch, value)."""

LATEST_SQL = (
    "SELECT step, wall_time, value FROM points WHERE run_id = ? AND name_id = ?"
    " ORDER BY step DESC, rowid DESC LIMIT ?"
)
"""The latest points of one signal of one run: read backwards along the index
``points_by_signal`` (run_id, name_id, step; rowid), no sort."""
FOLLOW_SQL = (
    "SELECT rowid, name_id, step, wall_time, value FROM points WHERE rowid > ? AND +run_id = ? ORDER BY rowid"
)
"""A run's points written after a rowid: a range of the table's rowids. The
unary ``+`` keeps SQLite off the index on run_id, which would walk every point
the run ever wrote and sort them, on every refresh."""


# --- reading -------------------------------------------------------------------------------------


@dataclass
class View:
    """What ``render`` shows: a run and the recent points of its signals, or
    why there is none to show (``waiting``)."""

    store: str
    run: Run | None = None
    points: dict[str, deque[Point]] = field(default_factory=dict)
    """Signal name -> its latest points, oldest first (in the order written)."""
    last_step: int | None = None
    newest: float | None = None
    """Wall time of the newest point, s since the epoch."""
    pid_alive: bool | None = None
    """Whether the run's process still runs (None: another host, or unknown)."""
    waiting: str | None = None
    """Why there is no run to show (no store, no runs yet, unreadable)."""
    window: int = WINDOW_POINTS
    """Points kept per signal."""
    error: str | None = None
    """Why the latest poll could not read the store (what is shown is older)."""


class StoreWatch:
    """Follows run ``run_id`` of the store at ``path`` (the newest when None,
    switching to a newer run when one appears). ``poll()`` never raises for a
    missing, unfinished or unreadable store: the ``View`` it returns says why
    it waits."""

    def __init__(self, path: str, run_id: int | None = None, window: int = WINDOW_POINTS) -> None:
        self.path = path
        self.run_id = run_id
        self.window = window
        self._reader: StoreReader | None = None
        self._view = View(store=path, window=window)
        self._last_rowid = 0
        self._names: dict[int, str] = {}

    def poll(self) -> View:
        try:
            reader = self._open()
            reader.db.execute("BEGIN")  # one consistent snapshot of what was committed
            try:
                self._read(reader.db)
            finally:
                reader.db.execute("COMMIT")
        except FileNotFoundError:
            self._reset(f"waiting for a run in {self.path} (no store there yet)")
        except LookupError:
            which = f"run {self.run_id}" if self.run_id is not None else "a run"
            self._reset(f"waiting for {which} in {self.path} (none there yet)")
        except (sqlite3.Error, OSError) as exc:
            self.close()  # reopened at the next poll
            if self._view.run is None:
                self._reset(f"waiting for a run in {self.path} (cannot read it: {exc})")
            else:  # keep what was read; the next poll goes on from there
                self._view.error = f"cannot read {self.path} now: {exc}"
        else:
            self._view.error = None
        return self._view

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _open(self) -> StoreReader:
        if self._reader is None:
            self._reader = StoreReader(self.path)
        return self._reader

    def _reset(self, waiting: str | None = None) -> None:
        self._view = View(store=self.path, waiting=waiting, window=self.window)
        self._last_rowid = 0

    def _read(self, db: sqlite3.Connection) -> None:
        assert self._reader is not None
        run = self._reader.run(self.run_id)
        view = self._view
        if view.run is None or view.run.id != run.id:  # the first run, or a newer one to follow
            self._reset()
            view = self._view
            self._load(db, run.id)
        else:
            (top,) = db.execute("SELECT MAX(rowid) FROM points").fetchone()
            if top is not None and top - self._last_rowid > RELOAD_AFTER_ROWS:
                self._reset()
                view = self._view
                self._load(db, run.id)
            else:
                self._follow(db, run.id)
        view.run = run
        view.pid_alive = run.process_alive()

    def _load(self, db: sqlite3.Connection, run_id: int) -> None:
        """The latest ``window`` points of each signal of the run (by step, through the index)."""
        (top,) = db.execute("SELECT MAX(rowid) FROM points").fetchone()
        self._last_rowid = top or 0
        self._names = dict(db.execute("SELECT id, name FROM signal_names"))
        view = self._view
        for name_id, name in sorted(self._names.items(), key=lambda item: item[1]):
            rows = db.execute(LATEST_SQL, (run_id, name_id, self.window)).fetchall()
            if rows:
                rows.reverse()
                view.points[name] = deque(((w, v) for _, w, v in rows), maxlen=self.window)
                self._note(rows[-1][0], max(w for _, w, _ in rows))

    def _follow(self, db: sqlite3.Connection, run_id: int) -> None:
        """The run's points written since the last poll."""
        rows = db.execute(FOLLOW_SQL, (self._last_rowid, run_id)).fetchall()
        points = self._view.points
        for rowid, name_id, step, wall, value in rows:
            name = self._names.get(name_id)
            if name is None:
                self._names = dict(db.execute("SELECT id, name FROM signal_names"))
                name = self._names.get(name_id, f"#{name_id}")
            kept = points.get(name)
            if kept is None:
                kept = points[name] = deque(maxlen=self.window)
            kept.append((wall, value))
            self._note(step, wall)
            self._last_rowid = rowid
        (top,) = db.execute("SELECT MAX(rowid) FROM points").fetchone()
        self._last_rowid = max(self._last_rowid, top or 0)

    def _note(self, step: int, wall: float) -> None:
        view = self._view
        view.last_step = step if view.last_step is None else max(view.last_step, step)
        view.newest = wall if view.newest is None else max(view.newest, wall)


# --- rendering -----------------------------------------------------------------------------------


class Line(NamedTuple):
    """One line of the view; ``style`` is "title", "alert", "heading" or "" (plain)."""

    text: str
    style: str = ""


def sparkline(values: Sequence[float], width: int) -> str:
    """The last ``width`` values as bars from their min (▁) to their max (█);
    a flat series is all ▁, a value that is not finite a space."""
    if width <= 0:
        return ""
    recent = list(values)[-width:]
    finite = [v for v in recent if math.isfinite(v)]
    if not finite:
        return " " * len(recent)
    lo, hi = min(finite), max(finite)
    top = len(SPARK) - 1
    out = []
    for v in recent:
        if not math.isfinite(v):
            out.append(" ")
        elif hi == lo:
            out.append(SPARK[0])
        else:
            out.append(SPARK[round((v - lo) / (hi - lo) * top)])
    return "".join(out)


def format_duration(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h02m``, ``2d04h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _number(value: float, decimals: int = 1) -> str:
    """Integers as such; else ``decimals`` places below 100, none above."""
    if value.is_integer() and abs(value) < 1e15:
        return f"{value:.0f}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.{decimals}f}"


def _bytes(value: float, per: str = "") -> str:
    """Bytes with a binary prefix, as the README counts (MB = 1024² bytes)."""
    size = value
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1024 or unit == "TB":
            text = f"{size:.0f}" if unit == "B" else f"{size:.1f}"
            return f"{text} {unit}{per}"
        size /= 1024
    raise AssertionError("unreachable")


def format_value(name: str, value: float, *, rate: bool = False) -> str:
    """``value`` of signal ``name`` with its unit (from the name's suffix);
    ``rate``: the value is per second (a counter's rate). Training signals
    have no unit and keep four significant digits."""
    value = float(value)  # an int from a hand-made store, too
    if not math.isfinite(value):
        return str(value)
    per = "/s" if rate else ""
    if not name.startswith(RESOURCE_PREFIX):
        return f"{value:.4g}"
    signal = name.rsplit("/", 1)[-1]
    for variant in ("_peak", "_mean"):  # a reading's peak or mean has the reading's unit
        signal = signal.removesuffix(variant)
    if signal.endswith("_per_second"):
        signal, per = signal.removesuffix("_per_second"), "/s"
        rate = True
    if "bytes" in signal:
        return _bytes(value, per)
    if signal.endswith("_mb"):
        return _bytes(value * 1024**2, per) if rate else f"{_number(value)} MB"
    if signal.endswith("_gb"):
        return f"{value:.1f} GB{per}"
    if signal.endswith("_percent"):
        return f"{value:.1f}%{per}"
    for suffix, unit in (("_mhz", " MHz"), ("_celsius", "°C"), ("_watts", " W")):
        if signal.endswith(suffix):
            return f"{value:.0f}{unit}{per}"
    return f"{_number(value, 2)}{per}"


def rates(points: Sequence[Point]) -> list[Point]:
    """A cumulative counter's points as rates per second between consecutive
    points (a counter that went back, a reboot or a wrap, gives no rate)."""
    out = []
    for (w0, v0), (w1, v1) in itertools.pairwise(points):
        if w1 > w0 and v1 >= v0:
            out.append((w1, (v1 - v0) / (w1 - w0)))
    return out


def group_of(name: str) -> tuple[tuple[int, int, str], str, str]:
    """(sort key, group, row label) of a signal: training signals first,
    grouped by their first path part (``train/loss``: group ``train``, label
    ``loss``); then resource categories in the README's order; a GPU's
    signals group under ``gpu/<i>``."""
    if not name.startswith(RESOURCE_PREFIX):
        head, _, rest = name.partition("/")
        group, label = (head, rest) if rest else ("training", head)
        return (0, 0, group), group, label
    parts = name[len(RESOURCE_PREFIX) :].split("/")
    category = parts[0]
    rank = CATEGORY_ORDER.index(category) if category in CATEGORY_ORDER else len(CATEGORY_ORDER)
    if category == "gpu" and len(parts) >= 3 and parts[1].isdigit():
        return (1, rank, f"gpu/{int(parts[1]):06d}"), f"gpu/{parts[1]}", "/".join(parts[2:])
    return (1, rank, category), category, "/".join(parts[1:]) or category


def health_line(stats: Mapping[str, Any] | None) -> Line:
    """The monitor's own health from its ``stats()``: restarts (with the
    latest death), records lost, quarantined categories, store errors, what it
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
    quiet = now - newest
    if quiet <= max(STALE_INTERVALS * run.interval, STALE_FLOOR_SECONDS):
        return None
    if view.pid_alive is False:
        why = f"the backend (pid {run.pid}) is gone"
    elif view.pid_alive:
        why = f"the backend (pid {run.pid}) still runs: hung, or its steps paused"
    else:
        why = "the backend stopped or hung"
    return Line(f"!! no sample for {quiet:.0f} s: {why}", "alert")


def header_lines(view: View, now: float) -> list[Line]:
    run = view.run
    if run is None:
        return [Line("wl-resource-monitor top", "title"), Line(view.waiting or "waiting", "alert")]
    status = run.status_at(now, view.pid_alive)
    duration = (now - run.started_at) if status == "running" else run.duration
    step = "-" if view.last_step is None else str(view.last_step)
    title = (
        f"run {run.id} | {run.where} pid {run.pid} | {status} | {format_duration(duration)} | step {step}"
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


def _shown_elsewhere(name: str, points: Mapping[str, Sequence[Point]]) -> bool:
    """A reading's peak or mean between steps, or a counter's own rate: a row of
    their own would double the screen (``plot`` draws them; the counter's row is its rate)."""
    base, _, kind = name.rpartition("_")
    if name.startswith(RESOURCE_PREFIX) and kind in ("peak", "mean") and base in points:
        return True
    return name.endswith("_per_second") and name.removesuffix("_per_second") in points


def signal_lines(
    points: Mapping[str, Sequence[Point]], width: int, window: int = WINDOW_POINTS
) -> list[Line]:
    """A row per signal, grouped (see ``group_of``): label, current value, min
    and max over the window, sparkline; GPUs as one row per device (see ``gpu_lines``).
    Peaks, means and counters' own rates have no row (``_shown_elsewhere``)."""
    spark = max(MIN_SPARK_WIDTH, min(MAX_SPARK_WIDTH, width - LABEL_WIDTH - 3 * VALUE_WIDTH - 4))
    lines: list[Line] = []
    if not points:
        return [Line("no signals yet")]
    gpus: dict[str, dict[str, Sequence[Point]]] = {}
    rows: dict[tuple[tuple[int, int, str], str], list[tuple[str, str]]] = {}
    for name in points:
        key, group, label = group_of(name)
        if group.startswith("gpu/"):
            gpus.setdefault(group, {})[label] = points[name]
        elif not _shown_elsewhere(name, points):
            rows.setdefault((key, group), []).append((label, name))
    columns = (
        f"{'':<{LABEL_WIDTH}}{'now':>{VALUE_WIDTH}}{'min':>{VALUE_WIDTH}}{'max':>{VALUE_WIDTH}}  recent"
        f" (min/max: the last {window} points)"
    )
    lines.append(Line(columns, "heading"))
    for (_, group), members in sorted(rows.items()):
        lines.append(Line(group, "heading"))
        for label, name in sorted(members):
            series = list(points[name])
            rate = name in COUNTERS
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
    """One row per GPU (``gpu/<i>`` -> signal -> points): the latest value of
    each signal side by side under a column header, then a sparkline of its
    utilization."""
    present = {s for signals in gpus.values() for s in signals}
    columns = [(label, s) for label, s in GPU_COLUMNS if s in present]
    devices = sorted(gpus, key=lambda g: int(g.split("/")[1]))  # gpu/2 before gpu/10
    table: list[list[str]] = []
    for device in devices:
        signals = gpus[device]
        row = []
        for _, signal in columns:
            kept = signals.get(signal)
            row.append(format_value(f"resource/gpu/0/{signal}", kept[-1][1]) if kept else "-")
        table.append(row)
    widths = [max(len(label), *(len(r[i]) for r in table)) for i, (label, _) in enumerate(columns)]
    label = 2 + max(len(d) for d in devices) + 2
    head = "  ".join(f"{name:>{w}}" for (name, _), w in zip(columns, widths, strict=True))
    lines = [Line(f"{'gpu':<{label}}{head}  util recent", "heading")]
    for device, row in zip(devices, table, strict=True):
        util = gpus[device].get("utilization_percent") or []
        cells = "  ".join(f"{c:>{w}}" for c, w in zip(row, widths, strict=True))
        lines.append(Line(f"  {device:<{label - 2}}{cells}  {sparkline([v for _, v in util], spark)}"))
    return lines


def render(view: View, now: float, width: int = 120, height: int | None = None) -> list[Line]:
    """The whole screen for ``view`` at wall time ``now``: every line with the
    store's text escaped (``printable``: a host, a command line, a signal name
    or an error others wrote cannot drive the terminal) and cut to ``width``
    characters; with a ``height``, at most that many lines, the last saying how
    many rows did not fit."""
    width = max(width, 1)
    lines = header_lines(view, now)
    if view.run is not None:
        lines.append(Line(""))
        lines += signal_lines(view.points, width, view.window)
    lines = [Line(_fit(printable(line.text), width), line.style) for line in lines]
    if height is not None and len(lines) > height:
        height = max(height, 1)
        hidden = len(lines) - height + 1
        more = Line(_fit(f"… {hidden} more rows: enlarge the terminal", width), "alert")
        lines = [*lines[: height - 1], more]
    return lines


def frame_text(lines: Sequence[Line]) -> str:
    """The lines as plain text (``--once``)."""
    return "\n".join(line.text.rstrip() for line in lines)
