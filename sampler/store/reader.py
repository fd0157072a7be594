"""Reading a run store, for the commands people run (``runs``, ``plot``,
``top``, ``export``, ``postmortem``); safe while a backend writes it (WAL readers never block
the writer and see whole transactions only). Every column is checked as it is read
(``sampler.store.decoding``): a malformed value is said once and read as a fallback, and a
malformed point is left out (``POINT_IS_VALID``, ``RECORD_IS_VALID``), so one bad row never
hides the rest. ``records`` reads a run's resource records as columns, straight into numpy."""

from __future__ import annotations

import fnmatch
import os
import socket
import sqlite3
import stat
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil

from sampler import catalogue
from sampler.settings.parsers import DEFAULT_INTERVAL_SECONDS
from sampler.store import schema
from sampler.store.decoding import MAX_TIME, PIDS, WHOLE, Row, checked, decode_text, finite, malformed
from sampler.util.quoting import printable

ENERGY_GLOB = catalogue.name_of(catalogue.GPU_ENERGY, "*")
"""Every GPU's energy counter, as a GLOB pattern over signal names."""
RESOURCE_LIKE = catalogue.PREFIX + "%"
"""Every resource signal's name, as a LIKE pattern (the prefix has no ``_`` or ``%``)."""
CHUNK_ROWS = 8192
"""Rows read at a time into numpy."""
COLUMNS_PER_QUERY = 1000
"""Signal columns read by one query: SQLite returns 2,000 at most."""
LOST_AFTER_INTERVALS = 3
"""A run that has not written for this many intervals (and at least 30 s) without
an end time was lost: its backend died or hangs."""


@dataclass(frozen=True)
class Run:
    """One row of ``runs``, decoded."""

    id: int
    started_at: float
    ended_at: float | None
    updated_at: float
    host: str
    pid: int | None
    """The monitored process; None where the row's is no pid."""
    command: list[str]
    config: dict[str, Any]
    version: str
    stats: dict[str, Any] | None
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    launch_id: str | None = None
    """The id every rank of the launch shares (the metrics' run_id label)."""
    elapsed: float | None = None
    """Seconds from the start to the latest write (to the end, once ended), on a monotonic
    clock; None in rows older than schema version 5."""
    last_data: float | None = None
    """When (on the run's clock) its newest record or point was taken, for a run without an
    end; None for an ended run, or one with neither."""

    @property
    def interval(self) -> float:
        """Seconds between samples, as configured."""
        return float(self.config.get("interval_seconds", DEFAULT_INTERVAL_SECONDS))

    @property
    def status(self) -> str:
        """ "ended", "running", "suspended" or "lost" now (see ``status_at``)."""
        status = self.status_at(time.time(), self.process_alive())
        # Asked of a quiet run alone: a listing of ended runs reads no process state.
        return "suspended" if status == "lost" and self.process_suspended() else status

    def status_at(self, now: float, alive: bool | None, suspended: bool = False) -> str:
        """ "ended", "running", "suspended" or "lost" at wall time ``now``: lost when it has
        neither ended nor written for a while, or at once when its process is known to be gone
        (``alive`` False, from ``process_alive``); suspended when it has not written for a while
        because its process is stopped (``suspended``, from ``process_suspended``)."""
        if self.ended_at is not None:
            return "ended"
        if alive is False:
            return "lost"
        if now - self.updated_at <= max(LOST_AFTER_INTERVALS * self.interval, 30.0):
            return "running"
        return "suspended" if suspended else "lost"

    def process_suspended(self) -> bool:
        """Whether the monitored process runs here but is stopped (SIGSTOP, Ctrl-Z, a scheduler
        that suspends jobs), so that neither it nor its monitor writes; False when that cannot be
        told from here."""
        if self.host != socket.gethostname() or self.pid is None:
            return False
        try:
            return psutil.Process(self.pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
        except (psutil.Error, OSError):
            return False

    def process_alive(self) -> bool | None:
        """Whether the monitored process still runs; None when this cannot be
        told from here (the run is another host's)."""
        if self.host != socket.gethostname() or self.pid is None:
            return None
        try:
            return psutil.pid_exists(self.pid)
        except (psutil.Error, OSError):
            return None

    @property
    def where(self) -> str:
        """``host`` alone, or ``host rank R/W`` for a rank of a multi-rank job."""
        return " ".join(filter(None, (self.host, self.rank_label)))

    @property
    def rank_label(self) -> str:
        """``rank R/W`` for a rank of a multi-rank job, else empty."""
        return "" if self.world_size == 1 else f"rank {self.rank}/{self.world_size}"

    @property
    def duration(self) -> float:
        """Seconds from start to end (or to the latest write, or its newest record or point,
        ``last_data``, when later: the latest write's time is refreshed only every few seconds,
        so a killed run would seem to have died earlier than it did)."""
        written = self._written
        if self.last_data is not None and self.last_data - self.started_at > written:
            return self.last_data - self.started_at
        return written

    @property
    def _written(self) -> float:
        """Seconds from start to end, or to the latest write: ``elapsed``, which no step of the
        wall clock changes; in a row without it, the difference of its times."""
        if self.elapsed is not None:
            return self.elapsed
        return (self.ended_at if self.ended_at is not None else self.updated_at) - self.started_at

    def clock_at(self, now: float) -> float:
        """The run's clock, which its points' times are on (``sampler.util.clock``), at wall
        time ``now``: its start plus the time to its latest write, plus, while it has not
        ended, the time since that write (``updated_at``, on the wall clock as ``now`` is)."""
        since = 0.0 if self.ended_at is not None else max(0.0, now - self.updated_at)
        return self.started_at + self._written + since


@dataclass(frozen=True)
class Launch:
    """The runs of one multi-rank launch in a store: rows sharing a ``launch_id``, one per rank
    (or more where a rank's process started its monitor again)."""

    id: str
    """The ``launch_id``; ``<launch_id>@run<N>`` where the id names several launches (see
    ``launches``), N the first run's id."""
    runs: list[Run]
    """By rank, then run id."""

    @property
    def world_size(self) -> int:
        """The ranks the launch had, as its rows say (the largest, should it have changed)."""
        return max(run.world_size for run in self.runs)

    @property
    def ranks(self) -> int:
        """How many of its ranks the store holds."""
        return len({run.rank for run in self.runs})

    @property
    def held(self) -> str:
        """``3 of 4 ranks`` (``, 5 runs`` where a rank has several)."""
        text = f"{self.ranks} of {self.world_size} rank{'s' * (self.world_size != 1)}"
        return text + (f", {len(self.runs)} runs" if len(self.runs) != self.ranks else "")


def launches(runs: list[Run]) -> list[Launch | Run]:
    """``runs`` (in id order) with the ranks of each multi-rank launch (``world_size`` over 1)
    gathered into one ``Launch`` where its first run was; single-rank runs stay as they are.

    Runs sharing a ``launch_id`` are one launch until a rank comes back in another process:
    a launcher may give every launch one id (torchrun's static rendezvous names each by its
    ``MASTER_ADDR:MASTER_PORT``), so that run begins the id's next launch (as does each
    attempt of a launch whose ranks torchrun restarted)."""
    items: list[Run | list[Run]] = []
    current: dict[str, list[Run]] = {}
    count: dict[str, int] = {}
    for run in runs:
        if run.world_size == 1 or run.launch_id is None:
            items.append(run)
            continue
        group = current.get(run.launch_id)
        if group is None or any(r.rank == run.rank and (r.host, r.pid) != (run.host, run.pid) for r in group):
            group = current[run.launch_id] = []
            items.append(group)
            count[run.launch_id] = count.get(run.launch_id, 0) + 1
        group.append(run)
    return [item if isinstance(item, Run) else _launch(item, count) for item in items]


def _launch(runs: list[Run], count: dict[str, int]) -> Launch:
    """The launch of ``runs`` (by id), named ``<launch_id>@run<N>`` where its id names several."""
    first = runs[0]
    assert first.launch_id is not None
    name = first.launch_id if count[first.launch_id] == 1 else f"{first.launch_id}@run{first.id}"
    return Launch(name, sorted(runs, key=lambda run: (run.rank, run.id)))


@dataclass(frozen=True)
class Series:
    """One signal of one run, in step order (lists from ``StoreReader.series``; numpy arrays
    where they are cut from ``Records``)."""

    name: str
    steps: list[int] | npt.NDArray[np.int64]
    wall_times: list[float] | npt.NDArray[np.float64]
    values: list[float] | npt.NDArray[np.float64]

    def points(self) -> list[tuple[str, int, float, float | None]]:
        """(name, step, wall time, value) per point."""
        return [
            (self.name, int(step), float(wall), None if value != value else float(value))
            for step, wall, value in zip(self.steps, self.wall_times, self.values, strict=True)
        ]


@dataclass(frozen=True)
class Records:
    """A run's resource records as columns, in time order."""

    steps: npt.NDArray[np.int64]
    """The step each record was sampled at."""
    walls: npt.NDArray[np.float64]
    """When, s since the epoch on the run's clock."""
    values: dict[str, npt.NDArray[np.float64]]
    """Signal name -> its reading in each record, NaN where the record has none; only the
    names the run has a reading of."""

    def __len__(self) -> int:
        return len(self.steps)

    def series(self, name: str) -> Series:
        """``name``'s readings (the records that hold one) as a ``Series`` of arrays, in time order."""
        column = self.values.get(name)
        if column is None:
            return Series(name, [], [], [])
        kept = ~np.isnan(column)
        return Series(name, self.steps[kept], self.walls[kept], column[kept])


@dataclass(frozen=True)
class PostmortemRow:
    """One row of ``postmortems`` without its body (``StoreReader.postmortem_body``)."""

    id: int
    run_id: int | None
    backend_pid: int | None
    host: str
    vanished_at: float
    """When the backend died, s since the epoch."""
    written_at: float
    records: int | None
    read_at: float | None
    """When it was read; None while it waits."""


class StoreReader:
    """A read-only view of a store; ``FileNotFoundError`` if there is nothing at ``path``,
    ``sqlite3.DatabaseError`` if it is not a run store (``schema.NotARunStore`` for something
    that is not even a file: a directory, a FIFO, never opened, so never waited on)."""

    def __init__(self, path: str) -> None:
        if not os.path.isfile(path):
            try:
                mode = os.stat(path).st_mode
            except OSError:
                raise FileNotFoundError(f"no run store at {path}") from None
            kind = (
                "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a special file"
            )
            raise schema.NotARunStore(f"{kind}, not a run store")
        self.path = path
        self.db = schema.connect(path, readonly=True, timeout=1.0)
        self.db.text_factory = decode_text
        # A store older than the column (schema version 4 and before): its rows read NULL.
        columns = {column[1] for column in self.db.execute("PRAGMA table_info(runs)")}
        self._run_columns = (
            RUN_COLUMNS if "elapsed" in columns else RUN_COLUMNS.removesuffix("elapsed") + "NULL"
        )
        self._has_records = (
            self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'").fetchone() is not None
        )
        """Schema version 6 or later: resource records are rows of ``records``."""
        newest_record = (
            "(SELECT wall_ms / 1000.0 FROM records WHERE run_id = runs.id ORDER BY seq DESC LIMIT 1)"
            if self._has_records
            else "NULL"
        )
        # Only for a run without an end (CASE reads no point of an ended one): see Run.last_data.
        self._last_data = (
            "CASE WHEN ended_at IS NULL THEN max(COALESCE((SELECT MAX(wall_time) FROM points"
            f" WHERE run_id = runs.id), -1), COALESCE({newest_record}, -1)) END"
        )
        self._checked: set[int | None] = set()
        """The runs whose points were checked (``check_points``); None: the signal names."""

    def runs(self) -> list[Run]:
        rows = self.db.execute(f"SELECT {self._run_columns}, {self._last_data} FROM runs ORDER BY id")
        return [decode_run(row, self.path) for row in rows]

    def run(self, run_id: int | None = None) -> Run:
        """Run ``run_id``, or the newest; ``LookupError`` if there is none."""
        query = f"SELECT {self._run_columns}, {self._last_data} FROM runs " + (
            "WHERE id = ?" if run_id is not None else "ORDER BY id DESC LIMIT 1"
        )
        row = self.db.execute(query, () if run_id is None else (run_id,)).fetchone()
        if row is None:
            raise LookupError(
                f"{self.path} has no run {run_id}" if run_id is not None else f"{self.path} has no runs"
            )
        return decode_run(row, self.path)

    def launch(self, prefix: str) -> Launch:
        """The launch whose id is ``prefix`` or starts with it (a single-rank run's own launch
        too, as a ``Launch`` of one run); ``LookupError`` naming the store's multi-rank
        launches when none or several match."""
        grouped = launches(self.runs())
        found = [item for item in grouped if isinstance(item, Launch)]
        alone = [Launch(run.launch_id, [run]) for run in grouped if isinstance(run, Run) and run.launch_id]
        candidates = found + alone
        exact = [launch for launch in candidates if launch.id == prefix]
        matching = exact or [launch for launch in candidates if launch.id.startswith(prefix)]
        if len(matching) == 1:
            return matching[0]
        listed = "; ".join(f"{printable(launch.id)} ({launch.held})" for launch in found) or "none"
        what = "several launches start with" if matching else "no launch starts with"
        raise LookupError(f"{self.path}: {what} {printable(prefix)!r}; its multi-rank launches: {listed}")

    def check_names(self) -> None:
        """Say once (``malformed``) each signal name that is not UTF-8 text (read as text: ``NAME``)."""
        if None not in self._checked:
            self._checked.add(None)
            for name_id, name in self.db.execute("SELECT id, name FROM signal_names"):
                Row(self.path, f"signal {name_id}").text("name", name, None)

    def check_points(self, run_id: int) -> None:
        """Say once (``malformed``) what the run holds that the queries here leave out: for each
        column of ``points``, the points whose value is malformed (``POINT_PROBLEMS``); the records
        that are (``RECORD_IS_VALID``) and the readings that are no number; and ``check_names``.
        It reads every point and record of the run."""
        self.check_names()
        if run_id in self._checked:
            return
        self._checked.add(run_id)
        self._check_records(run_id)
        self._check_point_rows(run_id)

    def _check_point_rows(self, run_id: int) -> None:
        """The points part of ``check_points``."""
        malformed_points = f"FROM points WHERE run_id = ? AND NOT ({POINT_IS_VALID})"
        if not self.db.execute(f"SELECT COUNT(*) {malformed_points}", (run_id,)).fetchone()[0]:
            return  # the common case, in one pass that tests less
        sums = ", ".join(f"COALESCE(SUM({test}), 0)" for _, test, _ in POINT_PROBLEMS)
        counts = self.db.execute(f"SELECT {sums} {malformed_points}", (run_id,)).fetchone()
        for (column, test, problem), count in zip(POINT_PROBLEMS, counts, strict=True):
            if count:
                name, value = self.db.execute(
                    f"SELECT {NAME}, p.{column} FROM points AS p LEFT JOIN signal_names AS n"
                    f" ON n.id = p.name_id WHERE p.run_id = ? AND ({test}) LIMIT 1",
                    (run_id,),
                ).fetchone()
                points = f"{count} point{'s' * (count != 1)} whose {column}"
                first = "it is" if count == 1 else "the first"
                instead = f"{first} of {name}; left out"
                malformed(self.path, f"run {run_id}: {points}", value, problem, instead)

    def _check_records(self, run_id: int) -> None:
        """The records part of ``check_points``, in one pass over the run's records."""
        columns = list(self.columns())
        tests = [f"typeof({schema.quoted(name)}) NOT IN ('integer', 'real', 'null')" for name in columns]
        if not self._has_records:
            return
        sums = ", ".join(f"COALESCE(SUM({test}), 0)" for test in [f"NOT ({RECORD_IS_VALID})", *tests])
        counts = self.db.execute(f"SELECT {sums} FROM records WHERE run_id = ?", (run_id,)).fetchone()
        if counts[0]:
            step, wall = self.db.execute(
                f"SELECT step, wall_ms FROM records WHERE run_id = ? AND NOT ({RECORD_IS_VALID}) LIMIT 1",
                (run_id,),
            ).fetchone()
            first = "it is" if counts[0] == 1 else "the first"
            malformed(
                self.path,
                f"run {run_id}: {counts[0]} record{'s' * (counts[0] != 1)} whose step or wall_ms",
                (step, wall),
                "not a whole number (wall_ms: of ms since the epoch)",
                f"{first}; left out",
            )
        for name, count in zip(columns, counts[1:], strict=True):
            if count:
                (value,) = self.db.execute(
                    f"SELECT {schema.quoted(name)} FROM records WHERE run_id = ?"
                    f" AND typeof({schema.quoted(name)}) NOT IN ('integer', 'real', 'null') LIMIT 1",
                    (run_id,),
                ).fetchone()
                first = "it is" if count == 1 else "the first"
                malformed(
                    self.path,
                    f"run {run_id}: {count} reading{'s' * (count != 1)} of {name}",
                    value,
                    "not a number",
                    f"{first}; read as none",
                )

    def columns(self) -> dict[str, int]:
        """The signal columns of ``records`` now (writers add more): name -> scale."""
        return schema.record_columns(self.db) if self._has_records else {}

    def _recorded(self, run_id: int) -> tuple[int, dict[str, int]]:
        """(valid records of the run, column name -> its readings there, those with none left out),
        in one pass over the run's records."""
        columns = list(self.columns())
        if not self._has_records:
            return 0, {}
        counts = ", ".join(f"COUNT({schema.quoted(name)})" for name in ["step", *columns])
        row = self.db.execute(
            f"SELECT {counts} FROM records WHERE run_id = ? AND {RECORD_IS_VALID}", (run_id,)
        ).fetchone()
        return int(row[0]), {name: n for name, n in zip(columns, row[1:], strict=True) if n}

    def names(self, run_id: int) -> list[str]:
        """Signal names the run logged, sorted."""
        self.check_names()
        rows = self.db.execute(
            f"SELECT {NAME} FROM signal_names AS n"
            " WHERE id IN (SELECT DISTINCT name_id FROM points WHERE run_id = ?) ORDER BY 1",
            (run_id,),
        )
        return sorted({name for (name,) in rows} | set(self._recorded(run_id)[1]))

    def series(self, run_id: int, name: str) -> Series:
        """One signal of a run by step (then time): its points, and its readings in ``records``."""
        self.check_points(run_id)
        rows = self.db.execute(
            f"SELECT step, wall_time, value FROM points WHERE run_id = ? AND {POINT_IS_VALID}"
            f" AND name_id = (SELECT id FROM signal_names AS n WHERE {NAME} = ?) ORDER BY step, wall_time",
            (run_id, name),
        ).fetchall()
        scale = self.columns().get(name)
        if scale is not None:
            column = schema.quoted(name)
            rows += self.db.execute(
                f"SELECT step, wall_ms / 1000.0, {schema.decoded(name, scale)} FROM records"
                f" WHERE run_id = ? AND {RECORD_IS_VALID} AND typeof({column}) IN ('integer', 'real')"
                " ORDER BY step, wall_ms",
                (run_id,),
            ).fetchall()
            rows.sort(key=lambda row: (row[0], row[1]))
        return Series(name, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])

    def resource_points(self, run_id: int) -> list[tuple[str, int, float, float | None]]:
        """Every resource point of a run: (name, step, wall time, value), in no set order; one
        Python tuple per reading (``records`` reads them as columns)."""
        self.check_points(run_id)
        found: list[tuple[str, int, float, float | None]] = self.db.execute(
            f"SELECT {NAME}, p.step, p.wall_time, p.value FROM points AS p JOIN signal_names AS n"
            f" ON n.id = p.name_id WHERE p.run_id = ? AND n.name LIKE ? AND {POINT_IS_VALID}",
            (run_id, RESOURCE_LIKE),
        ).fetchall()
        for name in self._recorded(run_id)[1]:
            found += self.series(run_id, name).points()
        return found

    def records(self, run_id: int, names: Iterable[str] | None = None) -> Records:
        """The run's resource records as columns, in time order (``names``: only these
        signals). Read ``CHUNK_ROWS`` rows at a time straight into numpy: one Python object
        per record, none per reading. Readings stored as points (runs older than schema
        version 6) are read name by name and matched to records by their (time, step)."""
        self.check_names()
        if run_id not in self._checked:
            self._check_point_rows(run_id)  # the records are checked as they are read
        wanted = None if names is None else set(names)
        columns = {name: scale for name, scale in self.columns().items() if wanted is None or name in wanted}
        recorded = self._record_rows(run_id, columns) if self._has_records else None
        pointed = self.db.execute(
            f"SELECT id, {NAME} FROM signal_names AS n WHERE n.name LIKE ?"
            " AND id IN (SELECT DISTINCT name_id FROM points WHERE run_id = ?)",
            (RESOURCE_LIKE, run_id),
        ).fetchall()
        # Every resource signal's points, for the records they make; the values of ``names`` alone.
        parts = [
            self._point_rows(run_id, n_id, name, wanted is None or name in wanted) for n_id, name in pointed
        ]
        if not any(len(part) for part in parts):  # a run of schema version 6 (its rows by seq: in time order)
            return recorded or Records(np.empty(0, np.int64), np.empty(0), {})
        return _merged(([recorded] if recorded else []) + parts)

    def records_since(self, run_id: int, seq: int = -1, last: int | None = None) -> tuple[Records, int]:
        """The run's rows of ``records`` written after record ``seq`` (-1: from its first), only
        the ``last`` of them when given, in order; and the ``seq`` of the newest (``seq`` when
        there is none): what a view that follows a live run (``top``) reads at each poll. Empty
        for a store older than schema version 6, whose readings are points."""
        if not self._has_records:
            return Records(np.empty(0, np.int64), np.empty(0), {}), seq
        ((newest,),) = self.db.execute("SELECT MAX(seq) FROM records WHERE run_id = ?", (run_id,))
        if newest is None or newest <= seq:
            return Records(np.empty(0, np.int64), np.empty(0), {}), seq
        first = seq + 1 if last is None else max(seq + 1, newest - last + 1)
        return self._record_rows(run_id, self.columns(), first), int(newest)

    def _record_rows(self, run_id: int, columns: dict[str, int], first: int = 0) -> Records:
        """The run's rows of ``records`` from ``seq`` ``first`` on, by ``seq``, with the
        ``columns`` that hold a reading, as one read transaction sees them (a writer may add
        more meanwhile)."""
        began = not self.db.in_transaction
        if began:
            self.db.execute("BEGIN")
        try:
            return self._record_chunks(run_id, columns, first)
        finally:
            if began:
                self.db.execute("COMMIT")

    def _record_chunks(self, run_id: int, columns: dict[str, int], first: int) -> Records:
        """``_record_rows``: each range of ``CHUNK_ROWS`` seqs comes from SQLite as one text per
        column (``group_concat``), parsed by numpy: no Python object per reading. A malformed row
        or reading is left out (``check_points`` says so)."""
        names = list(columns)
        ((low, high),) = self.db.execute(
            "SELECT MIN(seq), MAX(seq) FROM records WHERE run_id = ? AND seq >= ?", (run_id, first)
        )
        valid = RECORD_IS_VALID
        groups = [names[i : i + COLUMNS_PER_QUERY] for i in range(0, len(names), COLUMNS_PER_QUERY)] or [[]]
        queries = [
            f"SELECT COUNT(*), SUM(NOT ({valid})), group_concat(CASE WHEN {valid} THEN seq ELSE -1 END),"
            f" group_concat(CASE WHEN {valid} THEN step ELSE 0 END),"
            f" group_concat(CASE WHEN {valid} THEN wall_ms ELSE 0 END)"
            + "".join(f", group_concat(IFNULL({schema.quoted(name)}, 'nan'))" for name in group)
            + " FROM records WHERE run_id = ? AND seq >= ? AND seq < ?"
            for group in groups
        ]
        steps: list[npt.NDArray[np.int64]] = []
        walls: list[npt.NDArray[np.float64]] = []
        parts: list[list[npt.NDArray[np.float64]]] = [[] for _ in names]
        whole = True
        while low is not None and low <= high:
            bounds = (run_id, low, low + CHUNK_ROWS)
            low += CHUNK_ROWS
            count, bad, seqs, step_text, wall_text, *found = self.db.execute(queries[0], bounds).fetchone()
            if not count:
                continue
            for query in queries[1:]:  # the same rows: one read transaction
                found += self.db.execute(query, bounds).fetchone()[5:]
            # By seq (SQLite does not promise group_concat's order); a malformed row's -1 first, left out.
            order = np.argsort(np.fromstring(seqs, dtype=np.int64, sep=","), kind="stable")[bad:]
            steps.append(np.fromstring(step_text, dtype=np.int64, sep=",")[order])
            walls.append(np.fromstring(wall_text, dtype=np.float64, sep=",")[order] / 1000.0)
            whole = whole and not bad
            for name, text, part in zip(names, found, parts, strict=True):
                column = _parsed(text, count)
                if column is None:  # a reading that is no number: this range read as SQL decodes it
                    whole = False
                    part.append(self._decoded_column(bounds, name, columns[name]))
                else:
                    part.append(column[order] / columns[name])
        if not whole:
            self.check_points(run_id)
        values = {}
        for name, part in zip(names, parts, strict=True):
            column = _joined(part, np.float64)
            part.clear()
            if not np.isnan(column).all():
                values[name] = column
        return Records(_joined(steps, np.int64), _joined(walls, np.float64), values)

    def _decoded_column(self, bounds: tuple[int, int, int], name: str, scale: int) -> npt.NDArray[np.float64]:
        """Column ``name`` of the valid records of a run in a range of seqs (``bounds``: run id,
        first seq, past the last), by seq, as ``schema.decoded`` reads it: NaN for no number."""
        rows = self.db.execute(
            f"SELECT {schema.decoded(name, scale)} FROM records WHERE run_id = ? AND seq >= ? AND seq < ?"
            f" AND {RECORD_IS_VALID} ORDER BY seq",
            bounds,
        ).fetchall()
        return np.array([np.nan if value is None else value for (value,) in rows], dtype=np.float64)

    def _point_rows(self, run_id: int, name_id: int, name: str, kept: bool = True) -> Records:
        """One resource signal's points, as rows of one signal (``kept`` False: without its values)."""
        cursor = self.db.execute(
            "SELECT step, wall_time, value FROM points WHERE run_id = ? AND name_id = ?"
            f" AND {POINT_IS_VALID}",
            (run_id, name_id),
        )
        steps, table = _chunks(cursor, 3)
        values = table[:, 2]
        held = kept and not np.isnan(values).all()
        return Records(steps, table[:, 1].copy(), {name: values.copy()} if held else {})

    def counts(self, run_id: int) -> tuple[int, int | None]:
        """(resource samples recorded, last step logged) of a run."""
        (samples,) = self.db.execute(
            "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM points WHERE run_id = ?"
            " AND name_id IN (SELECT id FROM signal_names WHERE name LIKE ?) GROUP BY name_id)",
            (run_id, RESOURCE_LIKE),
        ).fetchone()
        (last,) = self.db.execute(
            "SELECT MAX(step) FROM points WHERE run_id = ? AND typeof(step) = 'integer'", (run_id,)
        ).fetchone()
        if self._has_records:
            (records, last_recorded) = self.db.execute(
                f"SELECT COUNT(*), MAX(step) FROM records WHERE run_id = ? AND {RECORD_IS_VALID}", (run_id,)
            ).fetchone()
            samples = max(samples, records)
            if last_recorded is not None:
                last = last_recorded if last is None else max(last, last_recorded)
        return int(samples), last

    def energy_joules(self, run_id: int) -> float | None:
        """The energy the run's GPUs used while it was recorded (J): each GPU's energy
        counter from its first record to its last, summed; None where no GPU counted it."""
        ranges = self.db.execute(
            "SELECT CAST(n.name AS TEXT), MIN(p.value), MAX(p.value) FROM points AS p"
            " JOIN signal_names AS n ON n.id = p.name_id"
            f" WHERE p.run_id = ? AND n.name GLOB ? AND {POINT_IS_VALID} AND p.value IS NOT NULL"
            " GROUP BY p.name_id",
            (run_id, ENERGY_GLOB),
        ).fetchall()
        for name, scale in self.columns().items():
            if fnmatch.fnmatchcase(name, ENERGY_GLOB):
                ranges.append(
                    (name, *self.db.execute(
                        f"SELECT MIN({schema.decoded(name, scale)}), MAX({schema.decoded(name, scale)})"
                        f" FROM records WHERE run_id = ? AND {RECORD_IS_VALID}",
                        (run_id,),
                    ).fetchone())
                )  # fmt: skip
        spans: dict[str, tuple[float, float]] = {}
        for name, low, high in ranges:
            if low is not None:
                was = spans.get(name, (low, high))
                spans[name] = (min(was[0], low), max(was[1], high))
        return sum(high - low for low, high in spans.values()) if spans else None

    def postmortems(self, unread_only: bool = False) -> list[PostmortemRow]:
        """The store's postmortems (all, or those not read yet), oldest death first."""
        rows = self.db.execute(
            f"SELECT {_POSTMORTEM_COLUMNS} FROM postmortems"
            + (" WHERE read_at IS NULL" if unread_only else "")
            + " ORDER BY vanished_at, id"
        )
        return [decode_postmortem(row, self.path) for row in rows]

    def postmortem_body(self, postmortem_id: int) -> str:
        """A postmortem's JSON lines (``sampler.child.postmortem``); ``LookupError`` if none."""
        row = self.db.execute("SELECT body FROM postmortems WHERE id = ?", (postmortem_id,)).fetchone()
        if row is None:
            raise LookupError(f"{self.path} has no postmortem {postmortem_id}")
        return str(row[0])

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


RUN_COLUMNS = (
    "id, started_at, ended_at, updated_at, host, pid, command, config, version, stats,"
    " rank, local_rank, world_size, local_world_size, launch_id, elapsed"
)
"""The columns of ``runs`` that ``decode_run`` reads, in its order."""
_POSTMORTEM_COLUMNS = "id, run_id, backend_pid, host, vanished_at, written_at, records, read_at"


def decode_run(row: sqlite3.Row | tuple[Any, ...], store: str = "the run store") -> Run:
    """A ``Run`` from a row of ``SELECT RUN_COLUMNS FROM runs`` of ``store`` (and, after them,
    when given, its newest record's or point's time: ``Run.last_data``), each malformed value
    said once and read as unknown (the run's placement: alone)."""
    run_id, started, ended, updated, host, pid, command, config, version, stats = row[:10]
    rank, local_rank, world_size, local_world_size, launch_id, elapsed = row[10:16]
    newest = row[16] if len(row) > 16 else None
    check = Row(store, f"run {run_id}")
    argv = check.parsed("command", command, list)
    if argv is not None and not all(isinstance(arg, str) for arg in argv):
        check.bad("command", command, "not a list of texts", "read as unknown")
        argv = None
    settings = check.parsed("config", config, dict)
    counters = None if stats is None else check.parsed("stats", stats, dict)
    return Run(
        id=run_id,
        started_at=check.time("started_at", started),
        ended_at=None if ended is None else check.time("ended_at", ended),
        updated_at=check.time("updated_at", updated),
        host=check.text("host", host, "?"),
        pid=check.whole("pid", pid, PIDS, "a process id", None),
        command=[] if argv is None else argv,
        config={} if settings is None else checked(check, "config", settings, _CONFIG_RULES),
        version=check.text("version", version, "?"),
        stats=None if counters is None else checked(check, "stats", counters, _STATS_RULES),
        rank=check.whole("rank", rank, WHOLE, "a rank", 0),
        local_rank=check.whole("local_rank", local_rank, WHOLE, "a rank", 0),
        world_size=check.whole("world_size", world_size, _SIZES, "a number of ranks", 1),
        local_world_size=check.whole("local_world_size", local_world_size, _SIZES, "a number of ranks", 1),
        launch_id=None if launch_id is None else check.text("launch_id", launch_id, None),
        elapsed=None if elapsed is None else check.seconds("elapsed", elapsed, "a duration", None),
        last_data=float(newest) if finite(newest) and 0 <= newest < MAX_TIME else None,
    )


_SIZES = range(1, 2**63)
_CONFIG_RULES = {
    "interval_seconds": (lambda v: finite(v) and v > 0, "a number of seconds > 0"),
    "step_source": (lambda v: isinstance(v, str), "text"),
}
"""The settings of ``runs.config`` that readers use."""
_COUNT = (lambda v: type(v) is int and v >= 0, "a count")
_LIST = (lambda v: isinstance(v, list), "a JSON list")
_STATS_RULES = {
    "restarts": _COUNT,
    "records_lost": _COUNT,
    "store_points_dropped": _COUNT,
    "deaths": _LIST,
    "quarantined": _LIST,
}
"""The counters of ``runs.stats`` that readers use (the monitor's ``stats()``)."""


def decode_postmortem(row: tuple[Any, ...], store: str) -> PostmortemRow:
    """A ``PostmortemRow`` from a row of ``SELECT _POSTMORTEM_COLUMNS FROM postmortems`` of
    ``store``, each malformed value said once and read as unknown (a read time: read)."""
    postmortem_id, run_id, backend_pid, host, vanished, written, records, read = row
    check = Row(store, f"postmortem {postmortem_id}")
    return PostmortemRow(
        id=postmortem_id,
        run_id=None if run_id is None else check.whole("run_id", run_id, WHOLE, "a run id", None),
        backend_pid=check.whole("backend_pid", backend_pid, PIDS, "a process id", None),
        host=check.text("host", host, "?"),
        vanished_at=check.time("vanished_at", vanished),
        written_at=check.time("written_at", written),
        records=check.whole("records", records, WHOLE, "a count", None),
        read_at=None if read is None else check.time("read_at", read),
    )


NAME = "CAST(n.name AS TEXT)"
"""A signal's name (``signal_names AS n``) as text, whatever a malformed row holds."""
POINT_PROBLEMS = (
    ("step", "typeof(step) != 'integer'", "not a whole number"),
    ("wall_time", f"typeof(wall_time) != 'real' OR wall_time < 0 OR wall_time >= {MAX_TIME}", "not a time"),
    ("value", "typeof(value) NOT IN ('real', 'null')", "not a number"),
)
"""(column of ``points``, the SQL test that its value is malformed, what it is not)."""
POINT_IS_VALID = " AND ".join(f"NOT ({test})" for _, test, _ in POINT_PROBLEMS)
"""SQL: the point is none of ``POINT_PROBLEMS``."""
RECORD_IS_VALID = (
    "typeof(step) = 'integer' AND typeof(wall_ms) = 'integer'"
    f" AND wall_ms >= 0 AND wall_ms < {int(MAX_TIME * 1000)}"
)
"""SQL: a row of ``records`` whose step and time are whole numbers, the time one a clock gives."""


def _chunks(cursor: sqlite3.Cursor, width: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """A query's rows (step, then ``width - 1`` numbers or NULLs) as (steps, a float table of
    ``width`` columns, NaN for NULL), fetched ``CHUNK_ROWS`` at a time."""
    steps: list[npt.NDArray[np.int64]] = []
    tables: list[npt.NDArray[np.float64]] = []
    while rows := cursor.fetchmany(CHUNK_ROWS):
        steps.append(np.fromiter((row[0] for row in rows), np.int64, len(rows)))
        tables.append(np.array(rows, dtype=np.float64).reshape(len(rows), width))
    if not tables:
        return np.empty(0, np.int64), np.empty((0, width))
    return np.concatenate(steps), np.concatenate(tables)


def _parsed(text: str, count: int) -> npt.NDArray[np.float64] | None:
    """``count`` numbers from SQLite's ``group_concat`` of them; None where the text holds
    something else (a reading that is no number)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy's word for text it stopped at
        try:
            found = np.fromstring(text, dtype=np.float64, sep=",")
        except ValueError:
            return None
    return found if len(found) == count else None


def _joined(parts: list[npt.NDArray[Any]], dtype: type) -> npt.NDArray[Any]:
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def _merged(parts: list[Records]) -> Records:
    """One ``Records`` of several, their rows matched by (time, step), in that order; where
    two hold one signal at one row, the later part's reading."""
    keys = np.empty(sum(len(part) for part in parts), dtype=[("wall", np.float64), ("step", np.int64)])
    keys["wall"] = np.concatenate([part.walls for part in parts])
    keys["step"] = np.concatenate([part.steps for part in parts])
    unique, where = np.unique(keys, return_inverse=True)
    values: dict[str, npt.NDArray[np.float64]] = {}
    offset = 0
    for part in parts:
        rows = where[offset : offset + len(part)]
        offset += len(part)
        for name, column in part.values.items():
            merged = values.setdefault(name, np.full(len(unique), np.nan))
            present = ~np.isnan(column)
            merged[rows[present]] = column[present]
    return Records(unique["step"].copy(), unique["wall"].copy(), values)
