"""Writing one run into the store, at no cost to the training loop.

A signal logged through ``sampler.signals.log_signal`` by any thread is only
appended to an in-memory queue (``log``). The monitor thread, which wakes once
per sample anyway, writes the queue and the sample's resource readings in one
transaction (``record``); between samples it writes the queue ``FLUSH_SECONDS``
after the oldest point in it (``next_flush``, ``flush``), so a backend killed
outright (SIGKILL, the OOM killer) loses about that much of what it logged,
whatever the interval. A thread asleep with the queue empty learns of the first
point from one byte on ``wake_fd``; later points cost nothing but the append.
What cannot be written now (the store is locked by another writer, the disk is
full, the directory is read-only) stays queued, up to ``MAX_QUEUED_POINTS``, and
is written once it can be; the oldest beyond that bound are dropped and counted.
Each kind of failure is reported once. A store another writer holds (its lock) is
tried again ``FLUSH_SECONDS`` later, whether it was being opened or written, and the
last write, at stop, always makes one attempt that waits for the lock up to
``FINAL_TIMEOUT_SECONDS``.

Each sample's readings are one row of ``records`` (``schema``), each reading a whole number
of its unit's resolution (``encoded``); a signal no run logged before gets its column then,
in the same transaction. A name SQLite takes no column for (past its column limit) is said
once, and its readings go to ``points``, as the pipeline's own signals do.

The run's row is inserted with its first write. Should it be gone at a later one (a
prune that found the run lost), the writer says so once and goes on in a new run,
never into another's: run ids are never given twice (``schema``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import operator
import os
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import psutil

from sampler import catalogue
from sampler.settings.placement import Placement, host_name
from sampler.store import schema
from sampler.util.clock import RunClock
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

MAX_QUEUED_POINTS = 200_000
"""Points (a record's readings each count one) held while the store cannot be written
(about 10 MB)."""
UNKNOWN_RESOLUTION = 1_000_000
"""Steps per unit of a resource signal the catalogue does not know (10⁻⁶ of its unit)."""
REOPEN_SECONDS = 10.0
"""How often a store that could not be opened or written for another reason than another
writer's lock (a full disk, a read-only directory, a corrupt file) is tried again."""
WRITE_TIMEOUT_SECONDS = 0.05
"""How long a write waits for another writer's lock before trying again later."""
FINAL_TIMEOUT_SECONDS = 2.0
"""How long the last write, at stop, waits for a lock."""
WRITE_EVERY_SECONDS = 0.5
"""At most one transaction per this long: at the 1 s floor that is one per sample;
faster sampling (tests, benchmarks) batches several samples per transaction."""
FLUSH_SECONDS = 1.0
"""What the pipeline logs is written at most about this long after it was logged:
all that a SIGKILL of the backend can lose of it."""
TOUCH_EVERY_SECONDS = 5.0
"""How often ``runs.updated_at`` is refreshed while nothing else about the run changes
(readers call a run lost after 30 s or more without it)."""

Point = tuple[str, int, float, float]
"""(name, step, wall time in s since the epoch, value)."""
Record = tuple[int, float, dict[str, float]]
"""(step, wall time in s since the epoch, signal name -> reading): one sample."""


def resolution(name: str) -> int:
    """Steps per unit that the store keeps of resource signal ``name``: its unit's
    ``catalogue.RESOLUTION``, ``UNKNOWN_RESOLUTION`` for a name the catalogue does not know."""
    reading = catalogue.lookup(name)
    if reading is None:
        return UNKNOWN_RESOLUTION
    return catalogue.RESOLUTION.get(reading.signal.unit, UNKNOWN_RESOLUTION)


def encoded(value: float, scale: int) -> int | float | None:
    """How a reading is stored in a ``records`` column of ``scale``: the whole number
    ``round(value * scale)``; None for NaN; ``value * scale`` as a float where that is at or
    beyond ``schema.SAFE_INTEGER`` (or infinite). Either way the value is the stored one over ``scale``."""
    if math.isnan(value):
        return None
    scaled = value * scale
    if abs(scaled) < schema.SAFE_INTEGER:
        return round(scaled)
    return scaled


@dataclass(frozen=True)
class RunInfo:
    """What the ``runs`` row says about the run."""

    pid: int
    """The monitored process."""
    command: list[str]
    config: dict[str, Any]
    started_at: float
    """When the monitor started, s since the epoch."""
    placement: Placement = field(default_factory=lambda: Placement(host_name()))
    """The backend's host and rank (default: alone on this host)."""
    started_ns: int = field(default_factory=time.monotonic_ns)
    """``time.monotonic_ns()`` at ``started_at``: with it, the run's ``clock``."""

    @property
    def clock(self) -> RunClock:
        """The clock of every time stored about the run but ``updated_at``."""
        return RunClock(self.started_at, self.started_ns)


def process_started_after_boot(pid: int) -> float | None:
    """When process ``pid`` started, s after its host booted (what a clock step moves not),
    or None if that cannot be read: the ``runs.pid_started_after_boot`` of its run."""
    try:
        boot = psutil.boot_time()  # first: an older psutil adds the boot time it read last
        return psutil.Process(pid).create_time() - boot
    except (psutil.Error, OSError):
        return None


def utf8(text: str) -> str:
    """``text`` as SQLite takes it: UTF-8 only, so a lone surrogate (what ``os.listdir``
    gives for a file name in another encoding, ``os.environ`` for such a value) is escaped
    as Python writes it (``\\udce9``)."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def package_version() -> str:
    """This package's version, or ``unknown`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("wl-resource-monitor")
    except PackageNotFoundError:
        return "unknown"


class RunWriter:
    """One run's writer. ``log`` may be called from any thread; ``end`` from the thread
    that stops the monitor too; everything else from the monitor thread only."""

    def __init__(self, path: str, info: RunInfo) -> None:
        self.path = path
        self.info = info
        self._clock = info.clock
        self.run_id: int | None = None
        self.points_written = 0
        self.points_dropped = 0
        self.error: str | None = None
        """The latest failure to open or write, None once a write succeeds."""
        self._logged: deque[Point] = deque()
        self._queued: list[Point] = []
        self._records: list[Record] = []
        """Samples not written yet, oldest first."""
        self._readings = 0
        """Readings in ``_records``."""
        self._seq = 0
        """The ``records.seq`` of the run's next record."""
        self._columns: dict[str, int] = {}
        """The signal columns ``records`` is known to have: name -> scale."""
        self._overflow: set[str] = set()
        """Names SQLite took no column for: their readings go to ``points``."""
        self._added = False
        """The write under way added a column: it makes the views anew."""
        self._db: sqlite3.Connection | None = None
        self._names: dict[str, int] = {}
        self._write_lock = threading.Lock()
        """Held by each write: the monitor thread's, or the last one, made by stop() while
        that thread is busy in a call."""
        self._ended = False
        """The last write was made: nothing is written after it."""
        self.end_written = False
        """Whether the last write (``end``) recorded the run's end: false, the run reads lost."""
        self._next_open = 0.0
        """When (monotonic s) a store that could not be opened is tried again."""
        self._written_at = 0.0
        self._touched_at = 0.0
        self._retry_at = 0.0
        """After a failure, no timed write before this (monotonic s)."""
        self._reported: set[str] = set()
        self._row: tuple[object, ...] | None = None
        """The run's row but ``updated_at`` and ``elapsed`` (``_run_row``)."""
        self._pid = os.getpid()
        self._wake_lock = threading.Lock()
        self.wake_fd, self._wake_w = os.pipe()
        """The monitor thread selects on ``wake_fd``: readable once a point is logged into an empty queue."""
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_w, False)
        self._wake_wanted = False
        """Set by the monitor thread when it sleeps with the queue empty; the next ``log`` wakes it."""

    def log(self, name: str, value: float, step: int) -> None:
        """The pipeline subscriber: queue one signal (a deque append, thread-safe;
        into an empty queue, also one byte to ``wake_fd``)."""
        if not name.startswith(catalogue.PREFIX):  # the monitor's own: written from its samples
            self._logged.append((name, step, self._clock.now(), value))
            if self._wake_wanted:
                self._wake()

    def _wake(self) -> None:
        """Wake the monitor thread asleep with the queue empty: one byte on ``wake_fd``."""
        self._wake_wanted = False
        if os.getpid() != self._pid:  # a forked copy: its points stay in its copy of the queue
            return
        with self._wake_lock, contextlib.suppress(OSError):  # full: a wake-up is pending anyway
            if self._wake_w >= 0:  # not closed yet
                os.write(self._wake_w, b"w")

    def woken(self) -> None:
        """Take what woke the monitor thread on ``wake_fd``."""
        with contextlib.suppress(BlockingIOError):
            os.read(self.wake_fd, 4096)

    def next_flush(self, wake: bool = True) -> float | None:
        """When (monotonic s) what is queued is to be written: ``FLUSH_SECONDS`` after
        its oldest point, later after a failure (see ``_fail``). None when nothing is
        queued; then, with ``wake`` (the thread has no reason to be up within
        ``FLUSH_SECONDS``), the next point logged makes ``wake_fd`` readable."""
        logged, queued = self._logged, self._queued
        if not logged and not queued:
            self._wake_wanted = wake
            if not logged:  # looked at again: a point logged before the flag went up sent nothing
                return None
        self._wake_wanted = False
        now = self._clock.now()
        oldest = min(queued[0][2] if queued else now, logged[0][2] if logged else now)
        return max(time.monotonic() + oldest + FLUSH_SECONDS - now, self._retry_at)

    def record(
        self, values: dict[str, float] | None, step: int, timestamp_ns: int, stats: dict[str, Any] | None
    ) -> None:
        """Write what was logged since the last call and one sample's readings
        (``values`` None: no sample to write, only the queue) at ``step`` in one
        transaction, with the monitor's ``stats`` when given (they changed)."""
        with self._write_lock:
            if self._ended:
                return
            points = self._take_logged()
            record = self._clean_record(values, step, self._clock.at(timestamp_ns)) if values else None
            self._queue(points, record)
            if stats is not None or time.monotonic() - self._written_at >= WRITE_EVERY_SECONDS:
                self._write(stats)

    def flush(self) -> None:
        """Write what is queued now, without waiting for the next transaction's turn."""
        with self._write_lock:
            if not self._ended:
                self._queue(self._take_logged())
                self._write(None)

    def end(self, stats: dict[str, Any]) -> None:
        """The last write: everything queued, the final stats and the end time. It is made
        whenever the last attempt to open or write was, and waits for another writer's lock
        up to ``FINAL_TIMEOUT_SECONDS``; what it cannot write is counted dropped and said.
        Made once: later calls, ``record`` and ``flush`` write nothing. Called by ``stop()``
        while the monitor thread is busy in a call, should that thread be in a write, it
        returns, and the thread makes it on its way out (``close``)."""
        if not self._write_lock.acquire(timeout=FINAL_TIMEOUT_SECONDS):
            return
        try:
            if self._ended:
                return
            self._ended = True
            self._queue(self._take_logged())
            self._next_open = 0.0  # the last chance: an open is tried whenever the last one was
            self._write(stats, ended=True)
            if not self.end_written:
                self._report(
                    "end",
                    "resource monitor: the end of this run could not be written to %s (%s); `runs` "
                    "will show it as lost although it ended",
                    self.path,
                    self.error or "the store could not be opened",
                )
            if self._queued or self._records:
                lost = len(self._queued) + self._readings
                self.points_dropped += lost
                self._report(
                    "lost",
                    "resource monitor: %d points could not be written to %s before stop (%s)",
                    lost,
                    self.path,
                    self.error,
                )
                self._queued, self._records, self._readings = [], [], 0
            if self._db is not None:
                self._db.close()
                self._db = None
        finally:
            self._write_lock.release()

    def close(self, stats: dict[str, Any]) -> None:
        """``end``, then release the wake-up pipe: the monitor thread's last act."""
        self.end(stats)
        with self._wake_lock:
            for fd in (self.wake_fd, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self.wake_fd = self._wake_w = -1

    def _take_logged(self) -> list[Point]:
        logged = self._logged
        return [logged.popleft() for _ in range(len(logged))]  # only this thread pops

    def _queue(self, points: list[Point], record: Record | None = None) -> None:
        self._queued += [clean for point in points if (clean := self._clean(point)) is not None]
        if record is not None:
            self._records.append(record)
            self._readings += len(record[2])
        excess = len(self._queued) + self._readings - MAX_QUEUED_POINTS
        if excess > 0:
            self._drop(excess)
            self._report(
                "dropped",
                "resource monitor: the store %s could not be written for a while (%s); dropping the "
                "oldest points beyond %d (counted in stats()['store_points_dropped'])",
                self.path,
                self.error,
                MAX_QUEUED_POINTS,
            )

    def _drop(self, excess: int) -> None:
        """Drop the oldest ``excess`` points or more (a record goes whole), counted."""
        dropped = 0
        points = 0
        queued, records = self._queued, self._records
        while dropped < excess:
            if records and (points >= len(queued) or records[0][1] <= queued[points][2]):
                readings = len(records.pop(0)[2])
                self._readings -= readings
                dropped += readings
            else:
                points += 1
                dropped += 1
        del queued[:points]
        self.points_dropped += dropped

    def _clean(self, point: Point) -> Point | None:
        """The point as SQLite takes it: a UTF-8 name (``_spelled``), an int step within
        ``schema.STEPS``, a float value (a numpy or torch scalar converts); None, reported
        once per name, if not."""
        name, step, wall, value = point
        try:
            index = operator.index(step)
            if index not in schema.STEPS:
                raise OverflowError("the step is beyond SQLite's 64-bit integers")
            return (self._spelled(name), index, wall, float(value))
        except Exception as exc:  # the caller's objects: converting one may raise anything
            self.points_dropped += 1
            self._report(
                f"value:{name}",
                "resource monitor: cannot store %s=%s at step %s in the run store (%s); skipping such values",
                name,
                bounded_repr(value),
                bounded_repr(step),
                bounded_repr(exc),
            )
            return None

    def _clean_record(self, values: dict[str, float], step: int, wall: float) -> Record | None:
        """A sample as SQLite takes it, reading by reading (``_clean``: one that is not is
        left out and said); None where no reading is left (its step is none SQLite takes)."""
        cleaned = {}
        for name, value in values.items():
            point = self._clean((name, step, wall, value))
            if point is not None:
                cleaned[point[0]] = point[3]
                step = point[1]
        return (step, wall, cleaned) if cleaned else None

    def _spelled(self, name: str) -> str:
        """``name`` as it is stored: ``utf8``; an escaped one is said once."""
        stored = utf8(name)
        if stored != name:
            self._report(
                f"name:{name}",
                "resource monitor: the signal name %s is not valid UTF-8, which SQLite needs; its "
                "values are stored under %s",
                bounded_repr(name),
                bounded_repr(stored),
            )
        return stored

    def _open(self, timeout: float) -> sqlite3.Connection | None:
        """The connection; one is opened (waiting up to ``timeout`` s for a lock) when the
        last attempt failed and ``_next_open`` has come."""
        if self._db is None and time.monotonic() >= self._next_open:
            try:
                self._db = schema.connect(self.path, timeout=timeout)
            except (sqlite3.Error, OSError) as exc:
                self._fail("open", exc)
        return self._db

    def _write(self, stats: dict[str, Any] | None, ended: bool = False) -> None:
        self._written_at = time.monotonic()
        db = self._open(FINAL_TIMEOUT_SECONDS if ended else WRITE_TIMEOUT_SECONDS)
        now = time.time()  # updated_at: what readers anywhere compare with their wall clock
        elapsed = self._clock.elapsed()
        touch = time.monotonic() - self._touched_at >= TOUCH_EVERY_SECONDS
        idle = not self._queued and not self._records and stats is None and not ended
        if db is None or (idle and not touch):
            return
        seq = self._seq
        try:
            if self._row is None:  # made before the lock is taken: the version takes a while to find
                self._row = self._run_values()
            if ended:
                db.execute(f"PRAGMA busy_timeout = {int(FINAL_TIMEOUT_SECONDS * 1000)}")
            db.execute("BEGIN IMMEDIATE")
            try:
                run_id = self._run_row(db, (now, elapsed), self._row)
                if run_id != self.run_id:
                    self._seq = 0
                overflow = self._insert_records(db, run_id)
                rows = [(run_id, self._name_id(db, n), s, w, v) for n, s, w, v in self._queued + overflow]
                db.executemany("INSERT INTO points VALUES (?, ?, ?, ?, ?)", rows)
                if stats is not None:
                    end = self._clock.started_at + elapsed if ended else None
                    db.execute(
                        "UPDATE runs SET updated_at = ?, elapsed = ?, stats = ?, ended_at = ? WHERE id = ?",
                        (now, elapsed, json.dumps(stats, default=str), end, run_id),
                    )
                elif touch:
                    db.execute(
                        "UPDATE runs SET updated_at = ?, elapsed = ? WHERE id = ?", (now, elapsed, run_id)
                    )
                db.execute("COMMIT")
                self.end_written = ended and stats is not None
            except BaseException:
                if db.in_transaction:  # SQLite rolls back by itself on some errors (a full disk)
                    db.execute("ROLLBACK")
                self._names = {}  # ids inserted by the rolled-back transaction are gone
                self._columns = {}  # and so are the columns it added
                self._seq = seq
                raise
        except Exception as exc:  # sqlite3.Error, or anything unforeseen: said, never the store off
            self._fail("write", exc)
            return
        if run_id != self.run_id and self.run_id is not None:
            self._report(
                "gone",
                "resource monitor: run %d is no longer in the store %s (pruned, while its backend "
                "was suspended?); what it logs from here on is stored as run %d",
                self.run_id,
                self.path,
                run_id,
            )
        self.run_id = run_id
        self.points_written += len(self._queued) + self._readings
        self._queued, self._records, self._readings = [], [], 0
        self.error = None
        self._retry_at = 0.0
        if stats is not None or touch:
            self._touched_at = time.monotonic()

    def _run_values(self) -> tuple[object, ...]:
        """The run's row but ``updated_at`` and ``elapsed``."""
        info, where = self.info, self.info.placement
        return (
            info.started_at, utf8(where.host), info.pid, json.dumps(info.command),
            json.dumps(info.config, default=str), package_version(), where.rank, where.local_rank,
            where.world_size, where.local_world_size, utf8(where.run_id) or None,
            process_started_after_boot(info.pid),
        )  # fmt: skip

    def _run_row(self, db: sqlite3.Connection, now: tuple[float, float], row: tuple[object, ...]) -> int:
        """The id of the run's row, inserted first (``row``, from ``_run_values``, and ``now``:
        its ``updated_at`` and ``elapsed``) if there is none: at the first write, or when the
        row is gone."""
        run_id = self.run_id
        if run_id is not None and db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone():
            return run_id
        cursor = db.execute(
            "INSERT INTO runs (updated_at, elapsed, started_at, host, pid, command, config, version,"
            " rank, local_rank, world_size, local_world_size, launch_id, pid_started_after_boot)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*now, *row),
        )
        return int(cursor.lastrowid or 0)

    def _insert_records(self, db: sqlite3.Connection, run_id: int) -> list[Point]:
        """Insert the queued samples as rows of ``records`` (numbered from ``_seq`` on), adding
        the columns they need; returns the readings of names SQLite took no column for, as points."""
        overflow: list[Point] = []
        statements: dict[tuple[str, ...], list[tuple[object, ...]]] = {}
        self._added = False
        for step, wall, values in self._records:
            wall_ms = round(wall * 1000)
            names = tuple(name for name in values if self._column(db, name))
            encoded_values = [encoded(values[name], self._columns[name]) for name in names]
            statements.setdefault(names, []).append((run_id, self._seq, step, wall_ms, *encoded_values))
            self._seq += 1
            overflow += [
                (name, step, wall_ms / 1000, values[name]) for name in self._overflow & values.keys()
            ]
        if self._added:
            schema.make_views(db)
        for names, rows in statements.items():
            columns = "".join(f", {schema.quoted(name)}" for name in names)
            marks = ", ?" * len(names)
            db.executemany(
                f"INSERT INTO records (run_id, seq, step, wall_ms{columns}) VALUES (?, ?, ?, ?{marks})", rows
            )
        return overflow

    def _column(self, db: sqlite3.Connection, name: str) -> bool:
        """Whether ``records`` has a column for ``name``, added now if it has none (another
        writer's may have come meanwhile); False for a name SQLite takes none for (said once)."""
        if name in self._columns:
            return True
        if name in self._overflow:
            return False
        self._columns = schema.record_columns(db)
        if name in self._columns:
            return True
        scale = resolution(name)
        try:
            db.execute("SAVEPOINT add_column")
            schema.add_column(db, name, scale)
            db.execute("RELEASE add_column")
        except sqlite3.OperationalError as exc:
            db.execute("ROLLBACK TO add_column")
            db.execute("RELEASE add_column")
            if "column" not in str(exc):  # too many columns, a duplicate name: else the store failed
                raise
            self._overflow.add(name)
            self._report(
                "column",
                "resource monitor: the store %s takes no column for %s (%s); its readings, and those"
                " of any other signal past it, are stored as points, one row each",
                self.path,
                bounded_repr(name),
                bounded_repr(exc),
            )
            return False
        self._columns[name] = scale
        self._added = True
        return True

    def _name_id(self, db: sqlite3.Connection, name: str) -> int:
        known = self._names.get(name)
        if known is not None:
            return known
        db.execute("INSERT OR IGNORE INTO signal_names (name) VALUES (?)", (name,))
        (known,) = db.execute("SELECT id FROM signal_names WHERE name = ?", (name,)).fetchone()
        self._names[name] = known
        return int(known)

    def _fail(self, what: str, exc: BaseException) -> None:
        self.error = f"cannot {what} it: {bounded_repr(exc, 200)}"
        busy = isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
        # Another writer's lock is soon gone, a full disk is not.
        self._retry_at = time.monotonic() + (FLUSH_SECONDS if busy else REOPEN_SECONDS)
        if self._db is None:
            self._next_open = self._retry_at
        if not busy:  # another writer's lock is transient: what is queued goes next time
            self._report(
                what,
                "resource monitor: the store %s failed (%s); monitoring goes on, and what is logged "
                "is kept (up to %d points) and written once the store works again",
                self.path,
                self.error,
                MAX_QUEUED_POINTS,
            )

    def _report(self, kind: str, msg: str, *args: object) -> None:
        if kind not in self._reported:
            self._reported.add(kind)
            log.warning(msg, *args)
