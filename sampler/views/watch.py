"""What ``top`` reads: a run of a store that a backend may be writing, followed as it grows.

``StoreWatch`` follows a run: a first read takes the latest ``WINDOW_POINTS``
points of each signal (the resource records' latest rows, and the user's own points
through the store's index), and every later ``poll`` reads only what was written
since (records by their ``seq``, points by rowid), into the ``View`` it returns.
"""

from __future__ import annotations

import math
import sqlite3
from collections import deque
from dataclasses import dataclass, field

from sampler.store.reader import NAME, POINT_IS_VALID, Run, StoreReader

WINDOW_POINTS = 120
"""Recent points kept per signal: what min/max and the sparkline cover."""
RELOAD_AFTER_ROWS = 50_000
"""More new rows than this since the last poll: re-read the latest window per
signal through the index instead of walking every row."""

Point = tuple[float, float]
"""(wall time in s since the epoch, value)."""

LATEST_SQL = (
    f"SELECT step, wall_time, value FROM points WHERE run_id = ? AND name_id = ? AND {POINT_IS_VALID}"
    " ORDER BY step DESC, rowid DESC LIMIT ?"
)
"""The latest points of one signal of one run: read backwards along the index
``points_by_signal`` (run_id, name_id, step; rowid), no sort. Malformed ones are left out
(``StoreReader.check_points`` says so), here and below."""
FOLLOW_SQL = (
    "SELECT rowid, name_id, step, wall_time, value FROM points WHERE rowid > ? AND +run_id = ?"
    f" AND {POINT_IS_VALID} ORDER BY rowid"
)
"""A run's points written after a rowid: a range of the table's rowids. The
unary ``+`` keeps SQLite off the index on run_id, which would walk every point
the run ever wrote and sort them, on every refresh."""
NAMES_SQL = f"SELECT id, {NAME} FROM signal_names AS n"
"""Each signal's id and its name, as text whatever a malformed row holds."""


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
    pid_suspended: bool = False
    """Whether the run's process is here and stopped (SIGSTOP, Ctrl-Z)."""
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
        self._last_seq = -1
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
        self._last_seq = -1

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
        view.pid_suspended = run.process_suspended()

    def _load(self, db: sqlite3.Connection, run_id: int) -> None:
        """The latest ``window`` points of each signal of the run (by step, through the index)."""
        (top,) = db.execute("SELECT MAX(rowid) FROM points").fetchone()
        self._last_rowid = top or 0
        assert self._reader is not None
        self._reader.check_points(run_id)
        self._names = dict(db.execute(NAMES_SQL))
        view = self._view
        for name_id, name in sorted(self._names.items(), key=lambda item: item[1]):
            rows = db.execute(LATEST_SQL, (run_id, name_id, self.window)).fetchall()
            if rows:
                rows.reverse()
                view.points[name] = deque(((w, v) for _, w, v in rows), maxlen=self.window)
                self._note(rows[-1][0], max(w for _, w, _ in rows))
        self._take_records(run_id, last=self.window)

    def _follow(self, db: sqlite3.Connection, run_id: int) -> None:
        """The run's points written since the last poll."""
        rows = db.execute(FOLLOW_SQL, (self._last_rowid, run_id)).fetchall()
        points = self._view.points
        for rowid, name_id, step, wall, value in rows:
            name = self._names.get(name_id)
            if name is None:
                self._names = dict(db.execute(NAMES_SQL))
                name = self._names.get(name_id, f"#{name_id}")
            kept = points.get(name)
            if kept is None:
                kept = points[name] = deque(maxlen=self.window)
            kept.append((wall, value))
            self._note(step, wall)
            self._last_rowid = rowid
        (top,) = db.execute("SELECT MAX(rowid) FROM points").fetchone()
        self._last_rowid = max(self._last_rowid, top or 0)
        self._take_records(run_id)

    def _take_records(self, run_id: int, last: int | None = None) -> None:
        """The run's resource records written since the last poll (the ``last`` of them at
        most), each reading added to its signal's points (a NaN, no reading, is not)."""
        assert self._reader is not None
        records, self._last_seq = self._reader.records_since(run_id, self._last_seq, last)
        if not len(records.steps):
            return
        points = self._view.points
        walls = records.walls.tolist()
        for name, values in records.values.items():
            kept = points.get(name)
            if kept is None:
                kept = points[name] = deque(maxlen=self.window)
            readings = zip(walls, values.tolist(), strict=True)
            kept.extend((wall, value) for wall, value in readings if not math.isnan(value))
        self._note(int(records.steps.max()), max(walls))

    def _note(self, step: int, wall: float) -> None:
        view = self._view
        view.last_step = step if view.last_step is None else max(view.last_step, step)
        view.newest = wall if view.newest is None else max(view.newest, wall)
