"""Keeping a run store bounded: removing the runs that ended or were lost before a time,
with their points and postmortems, and giving the space back where nobody is in the way.

Never a live run: neither one that wrote lately nor one whose process lives on this host
(the pid the row names, started when the row says: a suspended backend, however long it has
been quiet). A run's status is read again inside the transaction that removes its row,
which no writer can enter meanwhile. Its points and records go after it (``delete_points``), in short
transactions with a pause between, so that a writer waiting for the store, a run's last
write at stop above all, gets in within its timeout.
"""

from __future__ import annotations

import math
import os
import random
import sqlite3
import time
from typing import NamedTuple

import psutil

from sampler.catalogue import MIB
from sampler.store import schema
from sampler.store.reader import RUN_COLUMNS, Run, decode_run
from sampler.store.writer import process_started_after_boot

BATCH_SECONDS = 0.025
"""How long one transaction deleting points holds the store, about (its size follows)."""
PAUSE_SECONDS = (0.01, 0.04)
"""The range the pause after each is drawn from, s: while SQLite's busy wait polls every 0.1 s
at most, a drawn pause cannot keep in step with a waiting writer's polls."""
FIRST_BATCH = 1000
"""Rowids the first transaction deletes the points of; each next one as many as it takes
``BATCH_SECONDS`` to."""
SAME_START_SECONDS = 0.01
"""Two readings of a process's start closer than this are one process (the kernel counts in
ticks of 0.01 s)."""


class Prunable(NamedTuple):
    """A run to remove, as it stood when it was chosen."""

    run: Run
    status: str
    """``ended`` or ``lost``."""
    points: int
    """Its points, and the readings of its records."""
    postmortems: int


def lives_here(run: Run, started_after_boot: object) -> bool:
    """Whether the run's process runs on this host now (the run may have ended all the same):
    its pid lives, and started when the row says (``runs.pid_started_after_boot``), not a later
    process given the same pid; a row that does not say (older than schema version 4, or what
    another tool wrote there is no time) goes by the pid alone."""
    if run.pid is None or run.process_alive() is None or not _exists(run.pid):  # None: not here
        return False
    if not isinstance(started_after_boot, float) or not math.isfinite(started_after_boot):
        return True
    now = process_started_after_boot(run.pid)
    # None: it lives, but its start cannot be read (another user's process under hidepid)
    return now is None or abs(now - started_after_boot) < SAME_START_SECONDS


def _exists(pid: int) -> bool:
    """Whether process ``pid`` exists here, seen or not: /proc mounted with hidepid hides
    another user's process from psutil, but not from kill(pid, 0) (EPERM)."""
    if psutil.pid_exists(pid):
        return True
    if os.name != "posix":  # elsewhere os.kill ends the process
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _starts(db: sqlite3.Connection) -> dict[int, object]:
    """Run id -> ``pid_started_after_boot``; empty in a store older than the column."""
    if "pid_started_after_boot" not in {column[1] for column in db.execute("PRAGMA table_info(runs)")}:
        return {}
    return dict(db.execute("SELECT id, pid_started_after_boot FROM runs"))


def _live(db: sqlite3.Connection, runs: list[Run]) -> list[Run]:
    """Those of ``runs`` that are live: not ended, and running (``Run.status``: it wrote lately)
    or ``lives_here``."""
    starts = _starts(db)
    return [
        run
        for run in runs
        if run.ended_at is None and (run.status == "running" or lives_here(run, starts.get(run.id)))
    ]


def _ended_or_lost(db: sqlite3.Connection, cutoff: float) -> list[Run]:
    """The runs last written before ``cutoff`` (s since the epoch) that are not live now."""
    rows = db.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE updated_at < ? ORDER BY id", (cutoff,))
    runs = [decode_run(row) for row in rows]
    live = {run.id for run in _live(db, runs)}
    return [run for run in runs if run.id not in live]


def prunable(db: sqlite3.Connection, cutoff: float) -> list[Prunable]:
    """The runs to prune: each run last written before ``cutoff`` (s since the epoch) that
    ended or was lost (``Run.status``) and whose process does not live here (``lives_here``) now."""
    found = []
    for run in _ended_or_lost(db, cutoff):
        ((points,),) = db.execute("SELECT COUNT(*) FROM points WHERE run_id = ?", (run.id,))
        points += _readings(db, run.id)
        ((postmortems,),) = db.execute("SELECT COUNT(*) FROM postmortems WHERE run_id = ?", (run.id,))
        found.append(Prunable(run, run.status, points, postmortems))
    return found


def _readings(db: sqlite3.Connection, run_id: int) -> int:
    """The readings the run's records hold (none before schema version 6)."""
    columns = schema.record_columns(db)
    if not columns:
        return 0
    counted = " + ".join(f"COUNT({schema.quoted(name)})" for name in columns)
    ((readings,),) = db.execute(f"SELECT {counted} FROM records WHERE run_id = ?", (run_id,))
    return int(readings)


def remove(db: sqlite3.Connection, cutoff: float) -> list[Prunable]:
    """Remove the runs of ``prunable`` with their postmortems and stalls in one short transaction
    (``BEGIN IMMEDIATE``: no writer may touch a run between the second reading of its status
    and its removal); returns them. Their points are counted before, outside the transaction
    (that takes a while, and a run that ended or was lost writes no more), and left to
    ``delete_points``. Raises ``sqlite3.Error``."""
    chosen = prunable(db, cutoff)
    db.execute("BEGIN IMMEDIATE")
    try:
        still = {run.id for run in _ended_or_lost(db, cutoff)}
        gone = [entry for entry in chosen if entry.run.id in still]
        ids = [(entry.run.id,) for entry in gone]
        db.executemany("DELETE FROM postmortems WHERE run_id = ?", ids)
        db.executemany("DELETE FROM stalls WHERE run_id = ?", ids)
        db.executemany("DELETE FROM runs WHERE id = ?", ids)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return gone


def delete_points(db: sqlite3.Connection) -> None:
    """Delete the points and records whose run has no row (the runs just removed, or by a prune
    cut short), in transactions of about ``BATCH_SECONDS``, with a pause between. No run takes
    such an id again (schema version 4), and a writer whose row is gone goes on in a new run.
    Raises ``sqlite3.Error``; what is left goes with the next call."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'").fetchone() is not None:
        run_id = -1
        while True:
            ((run_id,),) = db.execute("SELECT MIN(run_id) FROM records WHERE run_id > ?", (run_id,))
            if run_id is None:
                break
            if db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                _delete_run_records(db, run_id)
    run_id = -1
    while True:
        # Each run's points are found by the index, one seek a run, not by reading them all.
        ((run_id,),) = db.execute("SELECT MIN(run_id) FROM points WHERE run_id > ?", (run_id,))
        if run_id is None:
            return
        if db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
            _delete_run_points(db, run_id)


def _delete_run_records(db: sqlite3.Connection, run_id: int) -> None:
    """Delete the records of ``run_id`` (see ``delete_points``) by ranges of ``seq``: each a
    range of the table's primary key."""
    ((low, high),) = db.execute("SELECT MIN(seq), MAX(seq) FROM records WHERE run_id = ?", (run_id,))
    _in_batches(db, "DELETE FROM records WHERE run_id = ? AND seq >= ? AND seq < ?", run_id, low, high)


def _in_batches(db: sqlite3.Connection, delete: str, run_id: int, low: int | None, high: int | None) -> None:
    """Run ``delete`` (parameters: the run id, a range's low end and its high end, past it) over
    ``low`` to ``high``, in transactions of about ``BATCH_SECONDS`` with a pause after each."""
    width = FIRST_BATCH
    while low is not None and high is not None and low <= high:
        began = time.monotonic()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(delete, (run_id, low, low + width))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        took = time.monotonic() - began
        time.sleep(random.uniform(*PAUSE_SECONDS))
        low += width
        width = max(FIRST_BATCH // 10, min(2 * width, int(width * BATCH_SECONDS / max(took, 1e-4))))


def _delete_run_points(db: sqlite3.Connection, run_id: int) -> None:
    """Delete the points of ``run_id`` (see ``delete_points``) by ranges of rowids: the points
    of one sample lie side by side in the table and in the index, so this touches half the
    pages that deleting in the index's order (signal by signal) does."""
    ((low, high),) = db.execute("SELECT MIN(rowid), MAX(rowid) FROM points WHERE run_id = ?", (run_id,))
    # +run_id: by the rowids, not by the index
    _in_batches(db, "DELETE FROM points WHERE +run_id = ? AND rowid >= ? AND rowid < ?", run_id, low, high)


def size(path: str) -> int:
    """Bytes the store takes on disk: its file and its write-ahead log."""
    return sum(os.path.getsize(name) for name in (path, f"{path}-wal") if os.path.exists(name))


def reclaim(db: sqlite3.Connection, before: int, timeout: float) -> str:
    """Give the space pruning freed back to the filesystem (``VACUUM``) where that cannot get
    in anyone's way: no run is live and no other connection holds the store (checkpointing
    its write-ahead log in full waits up to ``timeout`` s for that). Else the space stays in the
    file, for new points. ``before``: the bytes the store took before pruning. Returns what was
    done, as a sentence."""
    live = _live(db, [decode_run(row) for row in db.execute(f"SELECT {RUN_COLUMNS} FROM runs")])
    ((pages,),) = db.execute("PRAGMA freelist_count")
    ((page_size,),) = db.execute("PRAGMA page_size")
    freed = f"{pages * page_size / MIB:.1f} MiB freed"
    path = db.execute("PRAGMA database_list").fetchone()[2]
    db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    try:
        # What was deleted went through the write-ahead log: copied back, and the log cut
        # short, or it keeps that size. VACUUM writes the whole store anew through the log:
        # only into an empty log no reader pins, or the log would grow to the store's size.
        ((busy, _, _),) = db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if live:
            return (
                f"run {live[0].id} is live: the {freed} is reused by new points"
                " (prune when no run is live to shrink the file)"
            )
        if busy:
            return f"the store is in use: the {freed} is reused by new points"
        db.execute("VACUUM")
        ((busy, _, _),) = db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.OperationalError as exc:  # "database is locked": a writer came meanwhile
        return f"the store is in use ({exc}): the {freed} is reused by new points"
    ((page_count,),) = db.execute("PRAGMA page_count")
    if busy:  # a reader came between: the log goes back into the file when it lets go
        shrunk = page_count * page_size / MIB
        return f"compacted the store: it shrinks to {shrunk:.1f} MiB once its readers let go"
    after = size(path)
    return f"reclaimed {(before - after) / MIB:.1f} MiB: the store takes {after / MIB:.1f} MiB"
