"""``python -m sampler stalls STORE``: the stalls the sampling child recorded in a run store (a
run whose step stood still past its timeout, or whose monitor thread took no record), each with
where every thread was: its kernel state and its Python stack.

Oldest first. ``--run`` keeps one run's; ``--list`` shows one line per stall, without stacks.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, TextIO

from sampler.commands.common import DEFAULT_STORE, open_store
from sampler.util.quoting import printable

KINDS = {
    "steps": "no new step",
    "monitor": "the monitor thread took no record (GIL held, or the process frozen)",
}


@dataclass(frozen=True)
class StallRow:
    id: int
    run_id: int | None
    backend_pid: int
    host: str
    kind: str
    step: int
    started_at: float
    detected_after: float
    timeout: float
    ended_at: float | None
    duration: float | None
    stacks: str | None
    threads: list[dict[str, Any]]
    notes: list[str]
    run_ended: bool
    """The run has ended (a stall with no end then lasted until it did)."""


def read_stalls(db: sqlite3.Connection, run: int | None) -> list[StallRow] | None:
    """The store's stalls, oldest first (one run's if ``run``); None for a store older than them."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'stalls'").fetchone() is None:
        return None
    rows = db.execute(
        "SELECT s.id, s.run_id, s.backend_pid, s.host, s.kind, s.step, s.started_at, s.detected_after,"
        " s.timeout, s.ended_at, s.duration, s.stacks, s.threads, s.notes, r.ended_at IS NOT NULL"
        " FROM stalls s LEFT JOIN runs r ON r.id = s.run_id"
        " WHERE ? IS NULL OR s.run_id = ? ORDER BY s.id",
        (run, run),
    ).fetchall()
    return [
        StallRow(
            id=row[0], run_id=row[1], backend_pid=row[2], host=str(row[3]), kind=str(row[4]), step=row[5],
            started_at=row[6], detected_after=row[7], timeout=row[8], ended_at=row[9], duration=row[10],
            stacks=row[11], threads=_json_list(row[12]), notes=_json_list(row[13]), run_ended=bool(row[14]),
        )
        for row in rows
    ]  # fmt: skip


def _json_list(text: str | None) -> list[Any]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def headline(stall: StallRow) -> str:
    """One line: which run, when, at which step, how it was seen, how long it lasted."""
    run = f"run {stall.run_id}" if stall.run_id is not None else "run ?"
    if stall.duration is not None:
        lasted = f"lasted {stall.duration:.1f} s"
    elif stall.run_ended:
        lasted = "lasted until the run ended"
    else:
        lasted = "still stalled when last seen"
    return (
        f"stall {stall.id}: {run} (pid {stall.backend_pid} on {printable(stall.host)}), step {stall.step}, "
        f"from {_when(stall.started_at)}: {KINDS.get(stall.kind, printable(stall.kind))}; "
        f"seen after {stall.detected_after:.1f} s (timeout {stall.timeout:.1f} s); {lasted}"
    )


def show(stall: StallRow, out: TextIO) -> None:
    print(headline(stall), file=out)
    for note in stall.notes:
        print(f"  note: {printable(str(note))}", file=out)
    heading: object = ()  # no capture's yet: each capture's threads come under a line of their own
    for t in stall.threads:
        if not isinstance(t, dict):
            continue
        if t.get("after") != heading:
            heading = t.get("after")
            when = f" {heading:.0f} s into the stall" if isinstance(heading, (int, float)) else ""
            print(f"  threads{when} (R running, S sleeping, D waiting on I/O, T stopped):", file=out)
        calls = (f"in {t.get('syscall')}" if t.get("syscall") else "", str(t.get("wchan") or ""))
        where = " ".join(part for part in calls if part)
        print(
            f"    pid {t.get('pid')} tid {t.get('tid')} {printable(str(t.get('name')))}: "
            f"{t.get('state')} {printable(where)}".rstrip(),
            file=out,
        )
    if stall.stacks:
        print("  stacks (most recent call first):", file=out)
        for line in stall.stacks.splitlines():
            print(f"    {printable(line)}".rstrip(), file=out)
    print(file=out)


def stall_lines(found: list[StallRow], store: str) -> list[str]:
    """A line per run that stalled (for ``runs``): how often, where the longest stood, and the
    command that shows them."""
    by_run: dict[int | None, list[StallRow]] = {}
    for stall in found:
        by_run.setdefault(stall.run_id, []).append(stall)
    lines = []
    for run, stalls in by_run.items():
        longest = max(stalls, key=lambda s: s.duration if s.duration is not None else float("inf"))
        lasted = f"{longest.duration:.1f} s" if longest.duration is not None else "still, when last seen"
        times = "once" if len(stalls) == 1 else f"{len(stalls)} times"
        show = f"python -m sampler stalls {store}" + (f" --run {run}" if run is not None else "")
        which = "?" if run is None else run
        lines.append(f"run {which} stalled {times}, the longest {lasted} at step {longest.step}: {show}")
    return lines


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "stalls",
        help="list a run store's stalls, with every thread's stack and kernel state",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "store", nargs="?", default=DEFAULT_STORE, help=f"run store (default ./{DEFAULT_STORE})"
    )
    parser.add_argument("--run", type=int, help="only this run's stalls (its id, as `runs` lists it)")
    parser.add_argument("--list", action="store_true", help="one line per stall, without the stacks")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    out: TextIO = args.out
    reader = open_store(args.store)
    if reader is None:
        return 1
    with reader:
        stalls = read_stalls(reader.db, args.run)
    if stalls is None:
        print(f"no stalls: {args.store} was written by a release that did not record them", file=out)
        return 0
    if not stalls:
        print("no stalls" + (f" in run {args.run}" if args.run is not None else ""), file=out)
        return 0
    for stall in stalls:
        if args.list:
            print(headline(stall), file=out)
        else:
            show(stall, out)
    return 0
