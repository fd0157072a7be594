"""The postmortem: what the sampling child leaves behind when the backend dies under it.

A backend that is SIGKILLed, taken by the OOM killer or crashes never stops its
monitor, and the records it had not logged yet would die with it. The child
outlives it by a moment (its watchdog sees the death within a second); before
leaving, it writes down everything its ring still holds, so the readings that led
up to the death (memory climbing to a limit, say) can still be read.

Format: JSON lines (no NaN: a reading that failed is left out).

- a header object: ``format`` (``FORMAT``), ``version``, ``backend_pid``,
  ``monitored_pid`` (the process the ``process`` readings describe), ``host``,
  ``vanished_at`` (when the child saw the backend gone) and ``written_at`` and
  ``monitor_started_at`` (s since the epoch), ``interval_seconds``,
  ``ring_capacity``, ``fields`` (the ring's field names; peaks and means end in
  ``_peak``/``_mean``), ``records`` (how many follow), ``last_logged_record`` and
  ``last_logged_step`` (the last record the backend logged and its step; null
  before any); since version 2 how it died: ``exit`` (``Exit``: its exit status or the
  signal that ended it, learned through its pidfd, or why that could not be learned; null
  when not looked up) and ``memory_cgroup`` (``CgroupAtDeath``: its memory cgroup's OOM kill
  count when the child started and when the backend vanished, its high-water mark and limit;
  null without one), and ``peaks`` (the last record's ``_peak`` fields, name -> value);
- then one object per record, oldest first: ``record`` (its number), ``wall_time``
  (s since the epoch), ``logged`` (the backend had logged it or a later record)
  and ``values`` (field -> reading).

Where: with a run store, a row of its ``postmortems`` table (``sampler.store.schema``);
otherwise a file ``postmortem-<UTC time>-pid<N>.jsonl`` in the postmortem
directory (mode 0600), written under a temporary name and then renamed, never
through a link planted at either name (``sampler.util.atomicfile``), so a reader
never sees half of one. What cannot be written falls back, said on stderr: a
store to the directory (or the temporary one), a directory to
``fallback_directory()``, this user's own under the shared temporary directory
(one planted there by another user, or a link, is refused).
Writing is capped at ``WRITE_CAP_SECONDS``: a stuck filesystem never keeps the
child alive.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import select
import socket
import sqlite3
import stat
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ringbuf import Ring
from sampler import catalogue
from sampler.catalogue import MIB, PEAK_SUFFIX
from sampler.child import exitinfo
from sampler.collectors.base import attempt
from sampler.collectors.container import ERRORS, MemoryCgroup
from sampler.ipc.channel import ChildParams, PostmortemTarget
from sampler.ipc.status import ChildStatus
from sampler.postmortems.files import (
    FORMAT,
    MEMORY_FROM_MARK,
    MEMORY_FROM_RECORD,
    VERSION,
    CgroupAtDeath,
    Exit,
    file_name,
)
from sampler.store import schema
from sampler.util import atomicfile

FALLBACK_DIR_NAME = "resource_monitor_postmortems"
MODE = 0o600
"""A postmortem file's mode: its readings are its owner's."""
WRITE_CAP_SECONDS = 2.0
"""The longest the child spends writing a postmortem before it leaves without one."""
STORE_TIMEOUT_SECONDS = 0.5
"""How long the store write waits for a lock: with the WAL switch's own wait
(up to 1 s), the directory still gets its turn within ``WRITE_CAP_SECONDS``."""
_STDERR = 2
EOF_DEATH_WAIT_SECONDS = 0.25
"""After EOF on the channel, how long to wait for the backend's death to show: its
socket closes while it exits, a moment before its pidfd signals."""
EXIT_WAIT_SECONDS = 0.5
"""The longest the child waits for the backend's exit status: the kernel has it only once the
backend's parent has reaped it."""
_LIMIT, _USED = catalogue.CONTAINER_MEMORY_LIMIT.name, catalogue.CONTAINER_MEMORY_USED.name
XIDS_KEPT = 8
"""The latest critical XIDs a postmortem's header names."""


def backend_died(backend_pid: int, pidfd: int | None) -> bool:
    """After EOF on the channel: whether the backend is gone (or goes within
    ``EOF_DEATH_WAIT_SECONDS``), rather than alive and done with us."""
    deadline = time.monotonic() + EOF_DEATH_WAIT_SECONDS
    while os.getppid() == backend_pid:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if pidfd is not None:
            return bool(select.select([pidfd], [], [], left)[0])
        time.sleep(min(left, 0.01))
    return True


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


@dataclass(frozen=True)
class Snapshot:
    """What the child knew the moment the backend vanished."""

    params: ChildParams
    host: str
    vanished_at: float
    fields: tuple[str, ...]
    capacity: int
    logged_through: int
    """Records the backend had handled through the last one it logged (0: none)."""
    logged_step: int
    indices: list[int]
    timestamps_ns: list[int]
    """``time.monotonic_ns`` of each record."""
    values: npt.NDArray[np.float64]
    clock: tuple[float, int]
    """(``time.time()``, ``time.monotonic_ns()``) read together, to date the records."""
    exit: Exit | None = None
    """How the backend ended (``Witness.learn``); None when not looked up."""
    memory_cgroup: CgroupAtDeath | None = None
    """The backend's memory cgroup then; None without one, or when not looked up."""


class Witness:
    """What the child reads when it starts, to tell later how the backend died: the backend's
    pidfd, and its memory cgroup with the OOM kills counted there so far."""

    def __init__(self, pidfd: int | None, cgroup: MemoryCgroup | None) -> None:
        self.pidfd = pidfd
        self.cgroup = cgroup
        self.oom_kills_at_start = None if cgroup is None else attempt(cgroup.oom_kills, ERRORS)

    def learn(self, snap: Snapshot) -> Snapshot:
        """``snap`` with how the backend ended and its cgroup now; waits up to
        ``EXIT_WAIT_SECONDS`` for the exit status."""
        return replace(
            snap, exit=exitinfo.wait(self.pidfd, EXIT_WAIT_SECONDS), memory_cgroup=self._cgroup(snap)
        )

    def _cgroup(self, snap: Snapshot) -> CgroupAtDeath | None:
        cgroup, at_start = self.cgroup, self.oom_kills_at_start
        if cgroup is None or at_start is None:
            return None
        mark = cgroup.memory_bytes()
        used, limit = mark if mark is not None else _last_memory(snap)
        source = None if used is None else MEMORY_FROM_MARK if mark is not None else MEMORY_FROM_RECORD
        return CgroupAtDeath(
            name=cgroup.name,
            directory=str(cgroup.directory),
            version=2 if cgroup.v2 else 1,
            oom_kills_at_start=at_start,
            oom_kills_at_death=attempt(cgroup.oom_kills, ERRORS),
            memory_used_bytes=used,
            memory_limit_bytes=limit if limit is not None and math.isfinite(limit) else None,
            memory_from=source,
        )


def _last_memory(snap: Snapshot) -> tuple[float | None, float | None]:
    """(used, limit) in bytes from the last record that read the container's memory: its peak
    since the previous record where it has one; (None, None) without any."""
    columns = {name: i for i, name in enumerate(snap.fields)}
    if _USED not in columns:
        return None, None
    for row in snap.values[::-1]:
        readings = [row[columns[n]] for n in (_USED, _USED + PEAK_SUFFIX) if n in columns]
        used = [r for r in readings if math.isfinite(r)]
        if used:
            limit = row[columns[_LIMIT]] if _LIMIT in columns else math.nan
            return float(max(used)) * MIB, float(limit) * MIB if math.isfinite(limit) else None
    return None, None


def take(params: ChildParams, ring: Ring | None, status: ChildStatus, vanished_at: float) -> Snapshot:
    """Copy what the ring holds, at once: the main thread closes it when it next
    finds the channel broken."""
    through, step = status.logged()
    fields: tuple[str, ...] = ()
    capacity = 0
    indices: list[int] = []
    stamps: list[int] = []
    values = np.empty((0, 0))
    if ring is not None:
        fields, capacity = ring.fields, ring.capacity
        try:
            result = ring.read(max(0, ring.head - ring.capacity))
        except (ValueError, AttributeError):  # closed meanwhile: its records are gone
            values = np.empty((0, len(fields)))
        else:
            indices, stamps, values = result.indices.tolist(), result.timestamps_ns.tolist(), result.values
    clock = (time.time(), time.monotonic_ns())
    return Snapshot(params, socket.gethostname(), vanished_at, fields, capacity, through, step, indices,
                    stamps, values, clock)  # fmt: skip


def lines(snap: Snapshot, target: PostmortemTarget, written_at: float) -> list[str]:
    """The postmortem as JSON lines (without line ends): the header, then the records."""
    p = snap.params
    logged = snap.logged_through > 0
    header: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "backend_pid": p.backend_pid,
        "monitored_pid": p.sources.pid,
        "host": snap.host,
        "vanished_at": snap.vanished_at,
        "written_at": written_at,
        "monitor_started_at": target.started_at,
        "interval_seconds": p.settings.interval_seconds,
        "ring_capacity": snap.capacity,
        "fields": list(snap.fields),
        "records": len(snap.indices),
        "last_logged_record": snap.logged_through - 1 if logged else None,
        "last_logged_step": snap.logged_step if logged else None,
        "exit": None if snap.exit is None else asdict(snap.exit),
        "memory_cgroup": None if snap.memory_cgroup is None else asdict(snap.memory_cgroup),
        "peaks": _peaks(snap),
        "gpu_xids": _xids(snap),
    }
    out = [json.dumps(header, allow_nan=False)]
    now_wall, now_ns = snap.clock
    for index, stamp, row in zip(snap.indices, snap.timestamps_ns, snap.values.tolist(), strict=True):
        record = {
            "record": index,
            "wall_time": round(now_wall - (now_ns - stamp) / 1e9, 6),
            "logged": index < snap.logged_through,
            "values": {f: v for f, v in zip(snap.fields, row, strict=True) if math.isfinite(v)},
        }
        out.append(json.dumps(record, allow_nan=False))
    return out


def _xids(snap: Snapshot) -> list[dict[str, int]]:
    """The critical XID errors the ring's records hold, oldest first (the latest
    ``XIDS_KEPT``): each one's GPU, its XID and the record it came in."""
    columns = [
        (int(reading.device), i)
        for i, name in enumerate(snap.fields)
        if (reading := catalogue.lookup(name)) is not None
        and reading.signal is catalogue.GPU_XID
        and not reading.variant
        and reading.device.isdigit()
    ]
    found = [
        {"gpu": gpu, "xid": int(row[i]), "record": index}
        for index, row in zip(snap.indices, snap.values.tolist(), strict=True)
        for gpu, i in columns
        if math.isfinite(row[i]) and row[i] > 0
    ]
    return found[-XIDS_KEPT:]


def _peaks(snap: Snapshot) -> dict[str, float]:
    """The last record's peaks: each ``_peak`` field that read a number, name -> value."""
    if not snap.indices:
        return {}
    last = snap.values[-1].tolist()
    return {
        f: v for f, v in zip(snap.fields, last, strict=True) if f.endswith(PEAK_SUFFIX) and math.isfinite(v)
    }


def _say(message: str) -> None:
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
            _say(f"cannot write a postmortem into the run store {target.store} ({exc}); writing a file")
        else:
            where = f"the run store {target.store} (postmortem {row})"
            _say(f"{what} is in {where}")
            return where
    fallback = fallback_directory()
    for directory in dict.fromkeys(d for d in (target.directory, fallback) if d is not None):
        try:
            if directory == fallback:
                _private(directory)
            path = _to_directory(directory, snap, body)
        except OSError as exc:
            _say(f"cannot write a postmortem into {directory} ({exc})")
            continue
        _say(f"{what} is in {path}")
        return path
    return None


def leave(
    params: ChildParams, ring: Ring | None, status: ChildStatus, vanished_at: float, witness: Witness
) -> bool:
    """Write the postmortem of the backend that just vanished, with how it died, within
    ``EXIT_WAIT_SECONDS + WRITE_CAP_SECONDS``; False if it was still being written then (the
    child should leave anyway)."""
    target = params.postmortem
    if target is None:
        return True
    snap = witness.learn(take(params, ring, status, vanished_at))
    # Not a daemon (which it would be by default, made by the watchdog): if the main
    # thread ends meanwhile, the interpreter waits for it.
    writer = threading.Thread(target=write, args=(snap, target), name="postmortem", daemon=False)
    writer.start()
    writer.join(WRITE_CAP_SECONDS)
    if writer.is_alive():
        _say(f"the postmortem could not be written within {WRITE_CAP_SECONDS:g} s; leaving without it")
        return False
    return True
