"""The run store's SQLite schema: a public interface, versioned.

Schema version 8 (``PRAGMA user_version``)::

    runs          one row per monitor run
      id            INTEGER PRIMARY KEY AUTOINCREMENT: never given twice, not even after
                    its run was pruned (version 4)
      started_at    REAL     wall time the run started, s since the epoch
      ended_at      REAL     when it stopped, on the run's clock (below); NULL while
                             running, or if the backend died
      updated_at    REAL     the latest write, s since the epoch on the wall clock (a run
                             that stops updating without an ended_at was lost)
      elapsed       REAL     seconds from the start to the latest write (to the end, once
                             ended), on a monotonic clock: the run's duration, which no
                             step of the wall clock changes (version 5; NULL in older rows)
      host          TEXT     host name
      pid           INTEGER  the monitored process (the backend, or run --pid's target)
      command       TEXT     its command line, a JSON list
      config        TEXT     the resolved settings, a JSON object
      version       TEXT     the wl-resource-monitor version that wrote it
      stats         TEXT     the monitor's stats(), a JSON object: kept current while the
                             run goes on, final once it ended
      rank          INTEGER  the backend's rank in its job (version 3; 0 alone)
      local_rank    INTEGER  its rank among the backends of its host (version 3)
      world_size    INTEGER  ranks in the job (version 3; 1 alone)
      local_world_size INTEGER ranks on its host (version 3)
      launch_id     TEXT     the id every rank of one launch shares: the run_id label
                             of its metrics (version 3; NULL in rows older than it)
      pid_started_after_boot REAL when the monitored process started, s after its host
                             booted: with host and pid, what tells it from a later process
                             given the same pid (version 4; NULL in older rows, or where
                             it could not be read)
    signal_names  one row per signal name
      id, name (UNIQUE)
    points        one row per value logged through the pipeline (the user's own signals), and
                  the resource readings of runs written before version 6 (or of a name past
                  SQLite's column limit: ``records`` below)
      run_id      INTEGER  -> runs.id
      name_id     INTEGER  -> signal_names.id
      step        INTEGER  the x axis it was logged at
      wall_time   REAL     s since the epoch, on the run's clock (below)
      value       REAL     NULL where the value logged was NaN (a diverged loss, say)
      index points_by_signal (run_id, name_id, step): one signal of one run by step
    records       one row per resource record (version 6), WITHOUT ROWID
      run_id      INTEGER  -> runs.id
      seq         INTEGER  the record's number in its run: 0, 1, 2...
      step        INTEGER  the step it was sampled at
      wall_ms     INTEGER  when, in ms since the epoch on the run's clock
      "<name>"    one column per resource signal any run logged, named by the signal's full
                  name (``resource/cpu/utilization_percent``) and added the first time it is
                  logged: the reading as the INTEGER ``round(value * scale)`` (``scale``:
                  ``record_columns``); NULL where the record has none or it was NaN; the
                  REAL ``value * scale`` where that is no integer a double holds exactly
                  (``abs >= SAFE_INTEGER``, infinite). The value is the stored one over scale
      PRIMARY KEY (run_id, seq)
    record_columns  one row per signal column of ``records``, in their order (rowid)
      name        TEXT PRIMARY KEY  the column's (the signal's) name
      scale       INTEGER  steps of resolution per unit: the stored integer over it is the
                  value (``sampler.catalogue.RESOLUTION`` of the signal's unit when written)
    resource_records VIEW of records decoded: run_id, seq, step, wall_time (s), and each
                  signal's column as a REAL value
    signals       VIEW: run_id, name, step, wall_time, value over ``points`` (the name spelled
                  out) and the readings of ``records``, one row per non-NULL one
    postmortems   one row per backend that died under its monitor (version 2), written by
                  the sampling child (``sampler.child.postmortem``)
      id            INTEGER PRIMARY KEY
      run_id        INTEGER  -> runs.id: the run of that backend; NULL if it had no row yet
      backend_pid   INTEGER  the backend that died
      host          TEXT     host name
      vanished_at   REAL     when the child saw it die, s since the epoch
      written_at    REAL     when the postmortem was written, s since the epoch
      records       INTEGER  records the body holds
      body          TEXT     the postmortem, JSON lines: a header object, then one object
                             per record (the format of a postmortem file)
      read_at       REAL     when someone read it (``python -m sampler postmortem``);
                             NULL while it waits to be announced and read
    stalls        one row per stall of a run (version 7): the step stood still past its
                  timeout, or the monitor thread took no record; written by the sampling child
                  (``sampler.child.stalls``), which runs on when the backend cannot
      id            INTEGER PRIMARY KEY
      run_id        INTEGER  -> runs.id: the run that stalled; NULL if it had no row
      backend_pid   INTEGER  the backend
      host          TEXT     host name
      kind          TEXT     ``steps`` (no new step past the timeout) or ``monitor`` (the
                             backend's monitor thread took no record: its GIL held, or frozen)
      step          INTEGER  the step the run stood at
      started_at    REAL     when that step was first seen, s since the epoch
      detected_after REAL    seconds from started_at to the stall's detection
      timeout       REAL     the timeout in force, s
      ended_at      REAL     when the step was seen moving again; NULL while it lasts (or
                             if the run ended stalled)
      duration      REAL     seconds from started_at to ended_at; NULL likewise
      stacks        TEXT     every thread's Python stack, per process and capture
                             (faulthandler's dump; NULL where none could be taken)
      threads       TEXT     every thread's kernel state, a JSON list of objects: pid, tid,
                             name, state, wchan, syscall, after (s into the stall of the
                             capture that read it)
      notes         TEXT     what could not be captured, and why; a JSON list of strings
      gpus          TEXT     each sampled GPU as the child's record at the stall's detection
                             had it, a JSON list of objects: gpu (its label), and those of
                             utilization_percent, power_watts, power_limit_watts,
                             sm_activity_percent it read (version 8; NULL where no GPU is
                             sampled, and in older rows)

The run's clock: started_at, ended_at and the wall_time of its points are its start's
wall time plus the monotonic time since (``sampler.util.clock``), so differences between
them are durations even where the wall clock stepped meanwhile (NTP, an administrator),
and after such a step they differ from the wall clock by it; updated_at alone is the wall
clock's, for readers to judge how long ago a run last wrote.

Both views are made anew with each column added. A store created by this release has pages
of ``PAGE_SIZE`` (a wide record stays in its page); an older one keeps its own.

Version 7 is version 8 without ``stalls.gpus``; version 6 is version 7 without ``stalls``;
version 5 is version 6 without ``records`` and ``record_columns`` (every reading a row of
``points``); version 4 is version 5 without
``elapsed``; version 3 is version 4 with ids that a run removed by pruning gave back (the next
new run took the highest again) and without ``pid_started_after_boot``; version 2 is version 3
without the five placement columns of ``runs`` (a migrated row reads rank 0 of a world of one);
version 1 is version 2 without ``postmortems``.

Migrations: a store opened for writing with a lower ``user_version`` is
migrated in place, one version at a time (``_MIGRATIONS``), inside one
transaction; a store with a higher version was written by a newer release and
is refused for writing (read it with that release). Readers take a store of
``READABLE_FROM`` on (what they read is the same there).
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable

SCHEMA_VERSION = 8
READABLE_FROM = 3
"""The oldest version readers take as it is (older ones are migrated by opening them for writing)."""
STEPS = range(-(2**63), 2**63)
"""The steps a point can have: SQLite's INTEGER, a signed 64-bit word."""
SAFE_INTEGER = 2**53
"""A scaled reading at or beyond this (either sign) is stored as REAL: a double holds every
whole number below it exactly."""
UNPIVOT_TERMS = 400
"""Columns per compound SELECT of the ``signals`` view: SQLite allows 500 terms in one."""
PAGE_SIZE = 16384
"""A new store's page size (B). SQLite keeps a row of a WITHOUT ROWID table in its page up to about
a quarter of the page, the rest in overflow pages of its own: at 16 KiB, a record of 8 GPUs'
readings (about 2 KB) stays in place, where at the default 4 KiB it took a page more."""
MODE = 0o600
"""A new store's mode, and so its ``-wal`` and ``-shm`` files' (SQLite gives them
the database's): it keeps every run's command line and configuration."""


_V1 = (
    """CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        started_at REAL NOT NULL,
        ended_at REAL,
        updated_at REAL NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        command TEXT NOT NULL,
        config TEXT NOT NULL,
        version TEXT NOT NULL,
        stats TEXT
    )""",
    "CREATE TABLE signal_names (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)",
    """CREATE TABLE points (
        run_id INTEGER NOT NULL REFERENCES runs(id),
        name_id INTEGER NOT NULL REFERENCES signal_names(id),
        step INTEGER NOT NULL,
        wall_time REAL NOT NULL,
        value REAL
    )""",
    "CREATE INDEX points_by_signal ON points (run_id, name_id, step)",
    """CREATE VIEW signals AS
        SELECT p.run_id AS run_id, n.name AS name, p.step AS step, p.wall_time AS wall_time,
               p.value AS value
        FROM points p JOIN signal_names n ON n.id = p.name_id""",
)


_V2 = (
    """CREATE TABLE postmortems (
        id INTEGER PRIMARY KEY,
        run_id INTEGER REFERENCES runs(id),
        backend_pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        vanished_at REAL NOT NULL,
        written_at REAL NOT NULL,
        records INTEGER NOT NULL,
        body TEXT NOT NULL,
        read_at REAL
    )""",
)


_V3 = (
    "ALTER TABLE runs ADD COLUMN rank INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE runs ADD COLUMN local_rank INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE runs ADD COLUMN world_size INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE runs ADD COLUMN local_world_size INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE runs ADD COLUMN launch_id TEXT",
)


_V3_COLUMNS = (
    "id, started_at, ended_at, updated_at, host, pid, command, config, version, stats,"
    " rank, local_rank, world_size, local_world_size, launch_id"
)

_V4 = (
    # AUTOINCREMENT cannot be added to a table: it is made anew, as SQLite's manual says.
    """CREATE TABLE runs_v4 (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started_at REAL NOT NULL,
        ended_at REAL,
        updated_at REAL NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        command TEXT NOT NULL,
        config TEXT NOT NULL,
        version TEXT NOT NULL,
        stats TEXT,
        rank INTEGER NOT NULL DEFAULT 0,
        local_rank INTEGER NOT NULL DEFAULT 0,
        world_size INTEGER NOT NULL DEFAULT 1,
        local_world_size INTEGER NOT NULL DEFAULT 1,
        launch_id TEXT,
        pid_started_after_boot REAL
    )""",
    f"INSERT INTO runs_v4 ({_V3_COLUMNS}) SELECT {_V3_COLUMNS} FROM runs",
    "DROP TABLE runs",
    "ALTER TABLE runs_v4 RENAME TO runs",
    # Nor is an id given again whose row is gone but whose points or postmortems are not.
    "DELETE FROM sqlite_sequence WHERE name = 'runs'",
    """INSERT INTO sqlite_sequence (name, seq) SELECT 'runs', MAX(
        COALESCE((SELECT MAX(id) FROM runs), 0),
        COALESCE((SELECT MAX(run_id) FROM points), 0),
        COALESCE((SELECT MAX(run_id) FROM postmortems), 0))""",
)


_V6 = (
    """CREATE TABLE records (
        run_id INTEGER NOT NULL REFERENCES runs(id),
        seq INTEGER NOT NULL,
        step INTEGER NOT NULL,
        wall_ms INTEGER NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID""",
    "CREATE TABLE record_columns (name TEXT PRIMARY KEY, scale INTEGER NOT NULL)",
)
_V7 = (
    """CREATE TABLE stalls (
        id INTEGER PRIMARY KEY,
        run_id INTEGER REFERENCES runs(id),
        backend_pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        kind TEXT NOT NULL,
        step INTEGER NOT NULL,
        started_at REAL NOT NULL,
        detected_after REAL NOT NULL,
        timeout REAL NOT NULL,
        ended_at REAL,
        duration REAL,
        stacks TEXT,
        threads TEXT NOT NULL,
        notes TEXT NOT NULL
    )""",
)
_POINTS_VIEW = """SELECT p.run_id AS run_id, n.name AS name, p.step AS step, p.wall_time AS wall_time,
               p.value AS value
        FROM points p JOIN signal_names n ON n.id = p.name_id"""


def quoted(name: str) -> str:
    """``name`` as an SQL identifier (a column of ``records``)."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def decoded(name: str, scale: int) -> str:
    """SQL: the reading of column ``name`` as a REAL (NULL where it is none, or no number)."""
    column = quoted(name)
    # CASE, not IIF: IIF is SQLite 3.32 on, and Ubuntu 20.04's Python links 3.31.
    return f"CASE WHEN typeof({column}) IN ('integer', 'real') THEN {column} / {float(scale)!r} END"


def record_columns(db: sqlite3.Connection) -> dict[str, int]:
    """The signal columns of ``records``, in their order: name -> scale (empty before version 6)."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'record_columns'").fetchone() is None:
        return {}
    return {
        name: scale for name, scale in db.execute("SELECT name, scale FROM record_columns ORDER BY rowid")
    }


def add_column(db: sqlite3.Connection, name: str, scale: int) -> None:
    """Add ``name``'s column to ``records``, inside the caller's transaction, which then makes
    the views anew (``make_views``). Raises ``sqlite3.OperationalError`` where SQLite takes no
    such column (past its column limit; a name that differs from another's in case alone)."""
    db.execute(f"ALTER TABLE records ADD COLUMN {quoted(name)}")
    db.execute("INSERT INTO record_columns (name, scale) VALUES (?, ?)", (name, scale))


def make_views(db: sqlite3.Connection) -> None:
    """(Re)make ``resource_records`` and ``signals`` over the columns ``records`` has now."""
    columns = record_columns(db)
    db.execute("DROP VIEW IF EXISTS resource_records")
    db.execute("DROP VIEW IF EXISTS signals")
    values = "".join(f", {decoded(name, scale)} AS {quoted(name)}" for name, scale in columns.items())
    db.execute(
        "CREATE VIEW resource_records AS SELECT run_id, seq, step, wall_ms / 1000.0 AS wall_time"
        f"{values} FROM records"
    )
    terms = [
        f"SELECT run_id, {literal(name)}, step, wall_ms / 1000.0, {decoded(name, scale)} FROM records"
        f" WHERE {quoted(name)} IS NOT NULL"
        for name, scale in columns.items()
    ]
    parts = [_POINTS_VIEW] + [
        "SELECT * FROM (" + " UNION ALL ".join(terms[i : i + UNPIVOT_TERMS]) + ")"
        for i in range(0, len(terms), UNPIVOT_TERMS)
    ]
    db.execute("CREATE VIEW signals AS " + " UNION ALL ".join(parts))


def _create_v1(db: sqlite3.Connection) -> None:
    # One statement at a time: executescript() would commit the migration's transaction.
    for statement in _V1:
        db.execute(statement)


def _add_postmortems(db: sqlite3.Connection) -> None:
    for statement in _V2:
        db.execute(statement)


def _add_placement(db: sqlite3.Connection) -> None:
    for statement in _V3:
        db.execute(statement)


def _keep_ids(db: sqlite3.Connection) -> None:
    for statement in _V4:
        db.execute(statement)


def _add_elapsed(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE runs ADD COLUMN elapsed REAL")


def _add_records(db: sqlite3.Connection) -> None:
    for statement in _V6:
        db.execute(statement)
    make_views(db)


def _add_stalls(db: sqlite3.Connection) -> None:
    for statement in _V7:
        db.execute(statement)


def _add_stall_gpus(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE stalls ADD COLUMN gpus TEXT")


_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    0: _create_v1,
    1: _add_postmortems,
    2: _add_placement,
    3: _keep_ids,
    4: _add_elapsed,
    5: _add_records,
    6: _add_stalls,
    7: _add_stall_gpus,
}
"""``_MIGRATIONS[v]`` takes a store from version v to v + 1 (0: an empty file)."""


def _use_wal(db: sqlite3.Connection, timeout: float) -> None:
    """Switch the file to WAL (it stays so). The switch needs the file to
    itself, and SQLite does not wait for that even with a busy timeout: two
    processes creating the store at once would fail, so retry a while."""
    deadline = time.monotonic() + max(timeout, 1.0)
    while db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:
            db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class StoreVersionError(sqlite3.DatabaseError):
    """The store was written by a newer release than this one."""


class NotARunStore(StoreVersionError):
    """What is at the path is no run store this release reads: another program's SQLite database
    (or a store older than it reads), or no file at all (a directory, a FIFO)."""


def connect(path: str, *, readonly: bool = False, timeout: float = 0.0) -> sqlite3.Connection:
    """Open the store at ``path``, creating or migrating it unless ``readonly``.

    Writers use WAL, so readers in other processes never block them and see
    every committed transaction; ``synchronous=NORMAL`` is durable across a
    crash of the process (not of the machine) without an fsync per commit.
    ``timeout`` is how long a statement waits for a lock (s). A new store is
    created ``MODE``; an existing one keeps its mode. Raises ``sqlite3.Error``
    (``StoreVersionError`` for a newer schema, ``NotARunStore`` for none) or ``OSError``.
    """
    if readonly:
        # Quoted: in the URI, a "#", "?" or "%" of the name would cut it short (and the mode off).
        uri = f"file:{urllib.parse.quote(path)}?mode=ro"
        db = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
    else:
        if not os.path.exists(path):
            # Created empty before SQLite opens it (it would use the umask's mode);
            # no O_TRUNC, so a store another writer created meanwhile is left as it is.
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, MODE))
        db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreVersionError(
                f"it has schema version {version}, written by a newer release; this one knows up to "
                f"{SCHEMA_VERSION}"
            )
        if version == 0 and not readonly:
            db.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # an empty file: it takes effect
        if readonly:
            if version < READABLE_FROM:
                raise NotARunStore("not a run store (or an older one: open it for writing once)")
            return db
        _use_wal(db, timeout)
        db.execute("PRAGMA synchronous=NORMAL")
        if version < SCHEMA_VERSION:
            db.execute("BEGIN IMMEDIATE")
            try:
                # Re-read under the write lock: another writer may have migrated meanwhile.
                version = db.execute("PRAGMA user_version").fetchone()[0]
                while version < SCHEMA_VERSION:
                    _MIGRATIONS[version](db)
                    version += 1
                    db.execute(f"PRAGMA user_version = {version}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
    except BaseException:
        db.close()
        raise
    return db
