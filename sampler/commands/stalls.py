"""``python -m sampler stalls STORE``: the stalls the sampling child recorded in a run store (a
run whose step stood still past its timeout, or whose monitor thread took no record), each with
where every thread was: its kernel state and its Python stack; its GPUs as they were; and, for a
rank of a launch the store holds other ranks of, where each of those stood then.

Oldest first. ``--run`` keeps one run's; ``--list`` shows one line per stall, without stacks.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, TextIO

from sampler.catalogue import GPU_POWER, GPU_POWER_LIMIT, GPU_SM_ACTIVITY, GPU_UTILIZATION
from sampler.child.capture import main_frames
from sampler.commands.common import open_store, store_argument
from sampler.store.reader import RECORD_IS_VALID, Launch, Run, StoreReader, launches
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
    gpus: list[dict[str, Any]]
    """Each GPU as the record the stall was seen at had it (``sampler.child.stalls.GPU_STATE``)."""
    run_ended: bool
    """The run has ended (a stall with no end then lasted until it did)."""


def read_stalls(db: sqlite3.Connection, run: int | None) -> list[StallRow] | None:
    """The store's stalls, oldest first (one run's if ``run``); None for a store older than them."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'stalls'").fetchone() is None:
        return None
    columns = {row[1] for row in db.execute("PRAGMA table_info(stalls)")}
    gpus = "s.gpus" if "gpus" in columns else "NULL"  # version 8 on
    rows = db.execute(
        "SELECT s.id, s.run_id, s.backend_pid, s.host, s.kind, s.step, s.started_at, s.detected_after,"
        f" s.timeout, s.ended_at, s.duration, s.stacks, s.threads, s.notes, {gpus}, r.ended_at IS NOT NULL"
        " FROM stalls s LEFT JOIN runs r ON r.id = s.run_id"
        " WHERE ? IS NULL OR s.run_id = ? ORDER BY s.id",
        (run, run),
    ).fetchall()
    return [
        StallRow(
            id=row[0], run_id=row[1], backend_pid=row[2], host=str(row[3]), kind=str(row[4]), step=row[5],
            started_at=row[6], detected_after=row[7], timeout=row[8], ended_at=row[9], duration=row[10],
            stacks=row[11], threads=_json_list(row[12]), notes=_json_list(row[13]), gpus=_json_list(row[14]),
            run_ended=bool(row[15]),
        )
        for row in rows
    ]  # fmt: skip


@dataclass(frozen=True)
class Peer:
    """Another rank of the stalled run's launch, as its records stood when the stall was seen."""

    rank: int
    run_id: int
    step: int | None
    """The step of its last record by then; None where it had none."""
    since: float | None
    """When its first record at that step was sampled, s since the epoch."""


def peers(reader: StoreReader, stall: StallRow, grouped: list[Launch | Run]) -> tuple[str, list[Peer]] | None:
    """(the launch's id, the other ranks' runs where they stood when ``stall`` was seen), for a
    run of a multi-rank launch (of ``grouped``: the store's ``launches``) the store holds other
    runs of; else None."""
    launch = next(
        (
            item
            for item in grouped
            if isinstance(item, Launch) and any(run.id == stall.run_id for run in item.runs)
        ),
        None,
    )
    if launch is None or len(launch.runs) < 2:
        return None
    seen_ms = round((stall.started_at + stall.detected_after) * 1000)
    db, found = reader.db, []
    for run in launch.runs:
        if run.id == stall.run_id:
            continue
        last = db.execute(
            f"SELECT seq, step FROM records WHERE run_id = ? AND wall_ms <= ? AND {RECORD_IS_VALID}"
            " ORDER BY seq DESC LIMIT 1",
            (run.id, seen_ms),
        ).fetchone()
        if last is None:
            found.append(Peer(run.rank, run.id, None, None))
            continue
        seq, step = last
        (since_ms,) = db.execute(
            f"SELECT MIN(wall_ms) FROM records WHERE run_id = ? AND seq <= ? AND {RECORD_IS_VALID}"
            f" AND seq > COALESCE((SELECT MAX(seq) FROM records WHERE run_id = ? AND seq < ? AND step != ?"
            f" AND {RECORD_IS_VALID}), -1)",
            (run.id, seq, run.id, seq, step),
        ).fetchone()
        found.append(Peer(run.rank, run.id, int(step), since_ms / 1000))
    return launch.id, found


def _json_list(text: str | None) -> list[Any]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seconds))


def peer_lines(stall: StallRow, launch: str, found: list[Peer]) -> list[str]:
    """Where this rank and the launch's other ranks stood when the stall was seen."""
    seen = stall.started_at + stall.detected_after
    lines = [
        f"launch {printable(launch)} when it was seen ({_clock(seen)}): this run stood at step {stall.step} "
        f"since {_clock(stall.started_at)}; the other ranks:"
    ]
    for peer in found:
        where = f"rank {peer.rank} (run {peer.run_id})"
        if peer.step is None or peer.since is None:
            lines.append(f"  {where}: no record by then")
            continue
        ahead = peer.step - stall.step
        step = "s" * (abs(ahead) != 1)
        compared = (
            "the same step"
            if ahead == 0
            else f"{ahead} step{step} further"
            if ahead > 0
            else f"{-ahead} step{step} behind"
        )
        lines.append(f"  {where}: step {peer.step} since {_clock(peer.since)} ({compared})")
    return lines


def headline(stall: StallRow) -> str:
    """One line: which run, when, at which step, how it was seen, how long it lasted."""
    run = f"run {stall.run_id}" if stall.run_id is not None else "run ?"
    if stall.duration is not None:
        lasted = f"lasted {stall.duration:.1f} s"
    elif stall.run_ended:
        lasted = "lasted until the run ended"
    else:
        lasted = "still stalled when last seen"
    if stall.kind == "monitor":
        passed = f"a record waited {stall.timeout:.1f} s for the monitor thread"
    else:
        passed = f"timeout {stall.timeout:.1f} s"
    return (
        f"stall {stall.id}: {run} (pid {stall.backend_pid} on {printable(stall.host)}), step {stall.step}, "
        f"from {_when(stall.started_at)}: {KINDS.get(stall.kind, printable(stall.kind))}; "
        f"seen after {stall.detected_after:.1f} s ({passed}); {lasted}"
    )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def gpu_line(gpu: dict[str, Any]) -> str:
    """One GPU as the stall found it: ``gpu 0: 100% busy, 62 W of 400 W, SMs 1% active``."""
    utilization, power = _number(gpu.get(GPU_UTILIZATION.suffix)), _number(gpu.get(GPU_POWER.suffix))
    limit, active = _number(gpu.get(GPU_POWER_LIMIT.suffix)), _number(gpu.get(GPU_SM_ACTIVITY.suffix))
    parts = []
    if utilization is not None:
        parts.append(f"{utilization:.0f}% busy")
    if power is not None:
        parts.append(f"{power:.0f} W" + (f" of {limit:.0f} W" if limit is not None else ""))
    if active is not None:
        parts.append(f"SMs {active:.0f}% active")
    return f"gpu {printable(str(gpu.get('gpu')))}: " + (", ".join(parts) or "no reading")


def show(stall: StallRow, out: TextIO, launch: tuple[str, list[Peer]] | None = None) -> None:
    print(headline(stall), file=out)
    for note in stall.notes:
        print(f"  note: {printable(str(note))}", file=out)
    if launch is not None:
        for line in peer_lines(stall, *launch):
            print(f"  {line}", file=out)
    gpus = [gpu for gpu in stall.gpus if isinstance(gpu, dict)]
    if gpus:
        print("  GPUs when it was seen (a hung collective reads busy at idle power):", file=out)
        for gpu in gpus:
            print(f"    {gpu_line(gpu)}", file=out)
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


def _lasted(duration: float | None, run_ended: bool) -> str:
    if duration is not None:
        return f"for {duration:.1f} s"
    return "until the run ended" if run_ended else "still when last seen"


def explain_json(stall: StallRow) -> dict[str, Any]:
    """What ``explain --json`` gives of a stall: its row's id, kind, step, start (Unix s), duration
    (s; None for one that never closed) and the main thread's innermost frames."""
    return {
        "id": stall.id,
        "kind": stall.kind,
        "step": stall.step,
        "started_at": stall.started_at,
        "duration": stall.duration,
        "main_frames": main_frames(stall.stacks or ""),
    }


def explain_line(stall: StallRow) -> str:
    """One line for ``explain``: the step, when and how long, and the main thread's innermost
    frame."""
    frames = main_frames(stall.stacks or "", 1)
    where = f"; the main thread in {printable(frames[0])}" if frames else "; no Python stack"
    how = "no new step" if stall.kind == "steps" else "the monitor thread took no record"
    return (
        f"Stalled at step {stall.step:,} from {_clock(stall.started_at)} "
        f"{_lasted(stall.duration, stall.run_ended)} ({how}){where}."
    )


def postmortem_line(stall: dict[str, Any], vanished_at: object) -> str:
    """What ``postmortem`` says of the stall open as the backend died (its header's ``stall``,
    read from a file others may write)."""
    step, started = stall.get("step"), _number(stall.get("started_at"))
    dead = _number(vanished_at)
    since = "" if started is None else f" since {_when(started)}"
    if started is not None and dead is not None:
        since += f" ({dead - started:.1f} s before it died)"
    frames = [printable(str(frame)) for frame in stall.get("main_frames") or [] if isinstance(frame, str)]
    where = f"; the main thread in {' <- '.join(frames)}" if frames else ""
    row = stall.get("stall_id")
    stacks = f"; every thread's stack: stall {row} in the run store's stalls" if type(row) is int else ""
    return f"it was stalled at step {printable(str(step))}{since}{where}{stacks}"


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
    store_argument(parser)
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
        launch = {}
        if stalls and not args.list:
            grouped = launches(reader.runs())
            launch = {stall.id: peers(reader, stall, grouped) for stall in stalls}
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
            show(stall, out, launch[stall.id])
    return 0
