"""Keeping a run store bounded: removing the runs that ended or were lost before a time,
with their points and postmortems, and giving the space back where nobody is in the way.

Never a live run: a run's status is read inside the transaction that removes it, which no
writer can enter meanwhile.
"""

from __future__ import annotations

import os
import sqlite3
from typing import NamedTuple

from sampler.store.reader import RUN_COLUMNS, Run, decode_run

MIB = 1024**2


class Prunable(NamedTuple):
    """A run to remove, as it stood when it was chosen."""

    run: Run
    status: str
    """``ended`` or ``lost``."""
    points: int
    postmortems: int


def prunable(db: sqlite3.Connection, cutoff: float) -> list[Prunable]:
    """The runs to prune: each run last written before ``cutoff`` (s since the epoch) that
    ended or was lost (``Run.status``) now."""
    found = []
    for row in db.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE updated_at < ? ORDER BY id", (cutoff,)):
        run = decode_run(row)
        status = run.status
        if status != "running":
            ((points,),) = db.execute("SELECT COUNT(*) FROM points WHERE run_id = ?", (run.id,))
            ((postmortems,),) = db.execute("SELECT COUNT(*) FROM postmortems WHERE run_id = ?", (run.id,))
            found.append(Prunable(run, status, points, postmortems))
    return found


def remove(db: sqlite3.Connection, cutoff: float) -> list[Prunable]:
    """Remove the runs of ``prunable`` with their points and postmortems, in one transaction
    (``BEGIN IMMEDIATE``: no writer may touch a run between its status read and its removal);
    returns them. Raises ``sqlite3.Error``."""
    db.execute("BEGIN IMMEDIATE")
    try:
        gone = prunable(db, cutoff)
        ids = [(entry.run.id,) for entry in gone]
        db.executemany("DELETE FROM points WHERE run_id = ?", ids)
        db.executemany("DELETE FROM postmortems WHERE run_id = ?", ids)
        db.executemany("DELETE FROM runs WHERE id = ?", ids)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return gone


def size(path: str) -> int:
    """Bytes the store takes on disk: its file and its write-ahead log."""
    return sum(os.path.getsize(name) for name in (path, f"{path}-wal") if os.path.exists(name))


def reclaim(db: sqlite3.Connection, before: int, timeout: float) -> str:
    """Give the space pruning freed back to the filesystem (``VACUUM``) where that cannot get
    in anyone's way: no run is live and no other connection holds the store (checkpointing
    its write-ahead log in full waits up to ``timeout`` s for that). Else the space stays in the
    file, for new points. ``before``: the bytes the store took before pruning. Returns what was
    done, as a sentence."""
    live = [
        run
        for run in map(decode_run, db.execute(f"SELECT {RUN_COLUMNS} FROM runs"))
        if run.status == "running"
    ]
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
