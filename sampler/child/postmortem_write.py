"""Where a postmortem goes: the run store's ``postmortems`` table, else a file in the postmortem
directory, else this user's own private directory under the shared temporary one (one planted
there by another user, or a link, is refused); each step said on stderr."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import sqlite3
import stat
import tempfile
import time

from sampler.child.postmortem_text import lines
from sampler.child.snapshot import Snapshot
from sampler.ipc.channel import PostmortemTarget
from sampler.postmortems.files import file_name
from sampler.store import schema
from sampler.util import atomicfile

FALLBACK_DIR_NAME = "resource_monitor_postmortems"
MODE = 0o600
"""A postmortem file's mode: its readings are its owner's."""
STORE_TIMEOUT_SECONDS = 0.5
"""How long the store write waits for a lock: with the WAL switch's own wait
(up to 1 s), the directory still gets its turn within ``WRITE_CAP_SECONDS``."""
_STDERR = 2


def fallback_directory() -> str:
    """Where a postmortem goes when its own place cannot be written: this user's
    own directory under the shared temporary one."""
    return os.path.join(tempfile.gettempdir(), f"{FALLBACK_DIR_NAME}-{os.geteuid()}")


def _private(directory: str) -> None:
    """Make sure ``directory``, in a place other users can write (``/tmp``), is
    this user's own: made 0700 if missing; one another user made or planted (a
    link, someone else's, writable by others) is refused. Raises ``OSError``."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    found = os.lstat(directory)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o022:
        raise PermissionError(
            errno.EPERM, f"not a private directory of uid {os.geteuid()} (a link, or another user's)"
        )


def say(message: str) -> None:
    """One line on stderr, the backend's: with the backend gone, whoever reads its
    log reads this. Skipped, never waited for, when nobody drains a full pipe."""
    line = f"resource monitor child: {message}".encode(errors="replace")[: select.PIPE_BUF - 1] + b"\n"
    with contextlib.suppress(OSError):
        if select.select([], [_STDERR], [], 0)[1]:  # writable: room for PIPE_BUF bytes, written at once
            os.write(_STDERR, line)


def _to_store(path: str, started_at: float, snap: Snapshot, body: str, written_at: float) -> int:
    """Insert the postmortem into the store, linked to its run (the one that
    started at ``started_at``); returns its id."""
    p = snap.params
    db = schema.connect(path, timeout=STORE_TIMEOUT_SECONDS)
    try:
        row = db.execute(
            "SELECT id FROM runs WHERE started_at = ? AND host = ? AND pid IN (?, ?)"
            " ORDER BY id DESC LIMIT 1",
            (started_at, snap.host, p.backend_pid, p.sources.pid),
        ).fetchone()
        cursor = db.execute(
            "INSERT INTO postmortems (run_id, backend_pid, host, vanished_at, written_at, records, body)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (row[0] if row else None, p.backend_pid, snap.host, snap.vanished_at, written_at,
             len(snap.indices), body),
        )  # fmt: skip
        return int(cursor.lastrowid or 0)
    finally:
        db.close()


def _to_directory(directory: str, snap: Snapshot, body: str) -> str:
    """Write the postmortem file into ``directory`` (made if missing); returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, file_name(snap.vanished_at, snap.params.backend_pid))
    data = body.encode()
    try:
        atomicfile.write(path, data, MODE, exclusive=True)  # never replaces another monitor's postmortem
    except FileExistsError:  # two monitors of one backend, dying in the same millisecond
        path = path.removesuffix(".jsonl") + f"-{os.getpid()}.jsonl"
        atomicfile.write(path, data, MODE)
    return path


def write(snap: Snapshot, target: PostmortemTarget) -> str | None:
    """Write the postmortem where ``target`` says, falling back as the module
    says, and tell stderr where it went; returns that, None if nowhere."""
    written_at = time.time()
    body = "".join(line + "\n" for line in lines(snap, target, written_at))
    what = f"the backend (pid {snap.params.backend_pid}) died; a postmortem of its last"
    what += f" {len(snap.indices)} records"
    if target.store is not None:
        try:
            row = _to_store(target.store, target.started_at, snap, body, written_at)
        except (sqlite3.Error, OSError) as exc:
            say(f"cannot write a postmortem into the run store {target.store} ({exc}); writing a file")
        else:
            where = f"the run store {target.store} (postmortem {row})"
            say(f"{what} is in {where}")
            return where
    fallback = fallback_directory()
    for directory in dict.fromkeys(d for d in (target.directory, fallback) if d is not None):
        try:
            if directory == fallback:
                _private(directory)
            path = _to_directory(directory, snap, body)
        except OSError as exc:
            say(f"cannot write a postmortem into {directory} ({exc})")
            continue
        say(f"{what} is in {path}")
        return path
    return None
