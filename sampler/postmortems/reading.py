"""Postmortems waiting to be read (``sampler.child.postmortem`` writes them when a
backend dies under its monitor): finding them in a directory or a run store,
loading them, marking them read, and announcing them when a monitor starts, so a
death nobody saw is noticed by the next run."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import os
import shlex
import signal
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sampler.catalogue import GIB, MIB
from sampler.postmortems.files import FORMAT, READ_MARK, CgroupAtDeath, Exit, parse_file_name
from sampler.store import schema
from sampler.store.decoding import finite, malformed
from sampler.store.reader import StoreReader
from sampler.util.quoting import bounded_repr, printable

log = logging.getLogger("sampler")

MARK_TIMEOUT_SECONDS = 1.0
"""How long marking store rows read waits for another writer's lock."""
_PIDS_NAMED = 5
"""Pids an announcement of several postmortems names at most."""


@dataclass(frozen=True)
class Found:
    """One postmortem: a file (``store_id`` None, ``path`` is the file) or a row of
    the run store at ``path``."""

    path: str
    store_id: int | None
    backend_pid: int | None
    """None where a store row's is no pid."""
    vanished_at: float
    """When the backend died, s since the epoch."""
    read: bool
    records: int | None = None
    """None while a file's header has not been read, or cannot be."""
    host: str | None = None
    run_id: int | None = None

    @property
    def where(self) -> str:
        return self.path if self.store_id is None else f"{self.path} (postmortem {self.store_id})"

    @property
    def pid(self) -> str:
        """The backend's pid as shown: ``?`` for none."""
        return "?" if self.backend_pid is None else str(self.backend_pid)


def by_death(found: Found) -> tuple[float, str, int]:
    """Sort key: oldest death first (the order postmortems are numbered in); an unknown
    death time (a malformed store row) before all."""
    known = found.vanished_at == found.vanished_at
    return found.vanished_at if known else -math.inf, found.path, found.store_id or 0


def in_directory(directory: str) -> list[Found]:
    """The postmortem files in ``directory``, oldest death first, each with what its
    name says (``with_header`` reads the rest). ``OSError`` if it cannot be listed
    (``FileNotFoundError`` if there is none)."""
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            parsed = parse_file_name(entry.name)
            if parsed is not None and entry.is_file(follow_symlinks=False):
                vanished_at, pid, read = parsed
                found.append(Found(entry.path, None, pid, vanished_at, read))
    return sorted(found, key=by_death)


def in_store(store: str) -> list[Found]:
    """The postmortems of the run store at ``store``, oldest death first.
    ``FileNotFoundError`` if there is none, ``sqlite3.Error`` if it cannot be read."""
    with StoreReader(store) as reader:
        rows = reader.postmortems()
    return [
        Found(store, row.id, row.backend_pid, row.vanished_at, row.read_at is not None, row.records, row.host,
              row.run_id)
        for row in rows
    ]  # fmt: skip


def with_header(found: Found) -> Found:
    """A file's entry with its record count and host from its header (both None
    when the header cannot be read or is not a postmortem's); a store row as is."""
    if found.store_id is not None:
        return found
    try:
        with open(found.path, encoding="utf-8") as f:
            header, floatless = _header(f.readline(1 << 20))
    except (OSError, ValueError):
        return found
    _say_floatless(found.where, floatless)
    return replace(found, records=header["records"], host=header["host"])


_HEADER_TYPES: dict[str, type | tuple[type, ...]] = {
    "backend_pid": int,
    "host": str,
    "vanished_at": (int, float),
    "fields": list,
    "records": int,
}
"""What a header holds at least (``sampler.child.postmortem`` says what each means)."""


def _json(line: str) -> Any:
    """One JSON value; ``ValueError`` for anything that is not one (nesting too deep included)."""
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def _floatless(value: Any) -> list[tuple[str, int]]:
    """Replace each integer in ``value`` (parsed JSON) that no float holds (hundreds of digits:
    the arithmetic of showing it would fail) with NaN, unknown; returns each one's path
    (``values.name``, ``gpu_xids.0.xid``) and what it was."""
    found = []
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:  # not recursive: a value nested as deep as JSON allows must not overflow the stack
        item, path = stack.pop()
        if isinstance(item, dict):
            entries = list(item.items())
        else:
            entries = list(enumerate(item)) if isinstance(item, list) else []
        for key, child in entries:
            where = f"{path}.{key}" if path else str(key)
            if type(child) is int and not finite(child):
                item[key] = math.nan
                found.append((where, child))
            elif isinstance(child, (dict, list)):
                stack.append((child, where))
    return found


def _say_floatless(source: str, found: list[tuple[str, str, int]]) -> None:
    """Say once that the postmortem at ``source`` holds numbers no float holds (``found``: each
    one's line, path and value), naming the first."""
    if found:
        line, path, number = found[0]
        more = f" (and {len(found) - 1} more in it)" if len(found) > 1 else ""
        problem = f"a number no float holds{more}"
        malformed(source, f"{line}: {path}", number, problem, "read as unknown")


def _header(line: str) -> tuple[dict[str, Any], list[tuple[str, str, int]]]:
    """A postmortem's first line, checked, and its numbers no float holds (for
    ``_say_floatless``; read as NaN); ``ValueError`` if it is not one."""
    header = _json(line)
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError("not a postmortem (no header)")
    floatless = [("header", path, number) for path, number in _floatless(header)]
    for key, kind in _HEADER_TYPES.items():
        if not isinstance(header.get(key), kind):
            raise ValueError(f"a postmortem header without {key}")
    return header, floatless


def load(found: Found) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A postmortem's header and records. ``ValueError`` if it is not one, ``OSError``
    or ``sqlite3.Error`` if it cannot be read."""
    if found.store_id is None:
        with open(found.path, encoding="utf-8") as f:
            text = f.read()
    else:
        with StoreReader(found.path) as reader:
            text = reader.postmortem_body(found.store_id)
    first, *rest = text.splitlines() or [""]
    header, floatless = _header(first)
    records = []
    for line_number, line in enumerate(rest, 2):
        if not line:
            continue
        record = _json(line)
        if not (
            isinstance(record, dict)
            and isinstance(record.get("values"), dict)
            and isinstance(record.get("wall_time"), (int, float))
        ):
            raise ValueError("a postmortem record without its values or wall time")
        floatless += [(f"line {line_number}", path, number) for path, number in _floatless(record)]
        records.append(record)
    _say_floatless(found.where, floatless)
    return header, records


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _memory(cgroup: CgroupAtDeath) -> str:
    """The sentence's memory part, ", memory 61.8 of 64.0 GiB" (MiB below a GiB); "" unknown."""
    used, limit = cgroup.memory_used_bytes, cgroup.memory_limit_bytes
    limit = limit if limit == limit else None  # NaN: unknown (a number no float held)
    if used is None or used != used:
        return ""
    unit, size = ("GiB", GIB) if max(used, limit or 0) >= GIB else ("MiB", MIB)
    of = "" if limit is None else f" of {limit / size:.1f}"
    return f", memory {used / size:.1f}{of} {unit}"


def cause_of_death(header: dict[str, Any]) -> str:
    """One sentence: how the backend died, as far as its postmortem can tell. The OOM killer is
    named when its cgroup's count rose and the backend ended by SIGKILL, or by what the kernel
    would not say; a header without ``exit`` and ``memory_cgroup`` (version 1) recorded no cause.
    A critical XID error of a GPU in the records is named after it."""
    return _death(header) + _xid(header)


def _xid(header: dict[str, Any]) -> str:
    """``, after XID 79 on GPU 5 at step 1200``: the latest critical XID the records hold, "at"
    the last step logged when it came in the last logged record or after, else "at or before"
    it; "" without one."""
    xids = header.get("gpu_xids")
    last = xids[-1] if isinstance(xids, list) and xids and isinstance(xids[-1], dict) else {}
    gpu, xid, record = (last.get(key) for key in ("gpu", "xid", "record"))
    if not (type(gpu) is int and type(xid) is int and type(record) is int):  # not bool either
        return ""  # planted, or none
    step, logged = header.get("last_logged_step"), header.get("last_logged_record")
    if step is None or not isinstance(logged, int):
        when = "before any step was logged"
    else:
        when = f"{'at' if record >= logged else 'at or before'} step {printable(str(step))}"
    return f", after XID {xid} on GPU {gpu} {when}"


def _death(header: dict[str, Any]) -> str:
    step = header.get("last_logged_step")
    at = "before any step was logged" if step is None else f"at step {printable(str(step))}"
    if "exit" not in header and "memory_cgroup" not in header:
        return f"vanished {at}; the cause was not recorded (an older postmortem)"
    ended = Exit.from_json(header.get("exit")) or Exit()
    cgroup = CgroupAtDeath.from_json(header.get("memory_cgroup"))
    kills = None if cgroup is None else cgroup.oom_kills
    if cgroup is not None and kills and ended.status is None and ended.signal in (None, signal.SIGKILL):
        return f"killed by the OOM killer of cgroup {printable(cgroup.name)} {at}{_memory(cgroup)}"
    if cgroup is not None and kills:
        took = "1 process" if kills == 1 else f"{kills} processes"
        aside = f" (the OOM killer of cgroup {printable(cgroup.name)} took {took} of it meanwhile)"
    else:
        aside = " (no OOM kill in its cgroup)" if kills == 0 else ""
    if ended.signal is not None:
        core = " (core dumped)" if ended.core_dumped else ""
        return f"ended by {_signal_name(ended.signal)}{core} {at}{aside}"
    if ended.status is not None:
        return f"exited with status {ended.status} {at}{aside if kills else ''}"
    return f"vanished {at}; the cause could not be learned{aside}"


def mark_read(found: Sequence[Found]) -> None:
    """Mark postmortems read, so no monitor announces them again: a file gets
    ``.read`` in its name, a store row its ``read_at``. ``OSError`` or ``sqlite3.Error``."""
    stores: dict[str, list[int]] = {}
    for entry in found:
        if entry.read:
            continue
        if entry.store_id is not None:
            stores.setdefault(entry.path, []).append(entry.store_id)
            continue
        base = entry.path.removesuffix(".jsonl")
        with contextlib.suppress(FileNotFoundError):  # marked meanwhile by someone else
            os.rename(entry.path, base + READ_MARK + ".jsonl")
    for store, ids in stores.items():
        db = schema.connect(store, timeout=MARK_TIMEOUT_SECONDS)
        try:
            marks = ",".join("?" * len(ids))
            db.execute(
                f"UPDATE postmortems SET read_at = ? WHERE read_at IS NULL AND id IN ({marks})",
                (time.time(), *ids),
            )
        finally:
            db.close()


def local_time(seconds: float) -> str:
    """A wall time as people read it here, to the millisecond ("?" for none)."""
    try:
        return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except (OverflowError, OSError, ValueError):
        return "?"


_announced: set[tuple[str, str]] = set()
_announced_lock = threading.Lock()


def announce(directory: str | None, store: str | None) -> None:
    """Log one warning for each place (the postmortem directory, the run store)
    holding postmortems nobody has read, once per process per place; cheap (a
    listing, one query) and never raises (a place that cannot be read: a debug line)."""
    for flag, place in (("--dir", directory), ("--store", store)):
        if place is None:
            continue
        with _announced_lock:
            if (flag, place) in _announced:
                continue
            _announced.add((flag, place))
        try:
            message = _announcement(flag, place)
        except (OSError, ValueError, sqlite3.Error) as exc:
            log.debug("resource monitor: no postmortems read from %s (%s)", place, bounded_repr(exc))
            continue
        if message is not None:
            log.warning("%s", message)


def _announcement(flag: str, place: str) -> str | None:
    found = in_directory(place) if flag == "--dir" else in_store(place)
    numbered = [(n, with_header(f)) for n, f in enumerate(found, 1) if not f.read]
    waiting = [(n, f) for n, f in numbered if f.records is not None]
    for _, f in numbered:
        if f.records is None:
            log.debug("resource monitor: %s is named like a postmortem but is not one", f.path)
    if not waiting:
        return None
    command = f"python -m sampler postmortem {flag} {shlex.quote(place)}"
    number, latest = waiting[-1]
    plural = "" if latest.records == 1 else "s"
    died = f"died at {local_time(latest.vanished_at)}, {latest.records} record{plural}"
    if len(waiting) == 1:
        return (
            f"resource monitor: a postmortem of pid {latest.pid} ({died}) is waiting in "
            f"{latest.where}; read it with `{command} --show {number}`"
        )
    pids = ", ".join(f.pid for _, f in waiting[-_PIDS_NAMED:])
    more = "..., " if len(waiting) > _PIDS_NAMED else ""
    return (
        f"resource monitor: {len(waiting)} postmortems (pids {more}{pids}) are waiting in {place}; the "
        f"latest, of pid {latest.pid}, {died}; list them with `{command}`"
    )
