"""``python -m sampler runs STORE``: one line per run in a run store; the ranks of
a multi-rank launch together where its first run was, after a line naming the
launch and how many of its ranks the store holds (``launch job-7: 3 of 4 ranks``),
by rank, their ids indented.

``--prune`` keeps a store bounded (it grows about 0.5 MiB per hour per rank
sampled every second at the default categories, no GPU): ``--older-than AGE``
(``7d``, ``12h``) or ``--before DATE`` (ISO, local time) removes the runs that
ended, or were lost, and last wrote before then, with their postmortems, in one
transaction, then their points and records (a record's readings count as
points); a live run is never removed. The file then shrinks (``VACUUM``) when no run is
live and nothing else holds the store, else the space freed is reused by new
points. ``--dry-run`` lists what would go.
"""

from __future__ import annotations

import argparse
import datetime
import sqlite3
import sys
import time
from typing import Any, TextIO

from sampler import settings
from sampler.commands.common import EXIT_USAGE, argument, open_store, store_argument
from sampler.commands.stalls import read_stalls, stall_lines
from sampler.settings.placement import whole_number
from sampler.store import prune, schema
from sampler.store.decoding import decode_text
from sampler.store.reader import Launch, Run, StoreReader, launches
from sampler.util.quoting import printable
from sampler.views.formatting import format_in

PRUNE_TIMEOUT_SECONDS = 5.0
"""How long pruning waits for a writer's lock (a writer holds it for milliseconds at a time)."""
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
"""``--older-than``'s units, in seconds."""
MAX_AGE_DAYS = 36500
"""``--older-than``'s ceiling, 100 years: no run is older."""


def _age(text: str) -> float:
    """Seconds in an age such as ``7d``: a whole number (digits 0-9), then s, m, h, d or w."""
    word = text.strip().lower()
    number = whole_number(word[:-1]) if word[-1:] in AGE_UNITS else None
    if number is None:
        raise settings.Invalid("expected an age such as 7d, 12h or 30m (a number, then s, m, h, d or w)")
    seconds = number * AGE_UNITS[word[-1]]
    if seconds > MAX_AGE_DAYS * 86400:
        raise settings.Invalid(f"at most {MAX_AGE_DAYS} days")
    return float(seconds)


def _date(text: str) -> float:
    """The moment an ISO 8601 date, or date and time, names (local time unless it gives its
    offset), in s since the epoch."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip()).timestamp()
        _local(moment)  # one this host can show
    except (ValueError, OverflowError, OSError):
        raise settings.Invalid("expected an ISO date such as 2024-05-01 or 2024-05-01T12:00") from None
    return moment


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "runs",
        help="list the runs in a run store, or prune the old ones",
        description=__doc__.split("\n\n")[0],
        epilog=" ".join(__doc__.split("\n\n")[1].split()),
    )
    store_argument(parser)
    parser.add_argument(
        "--prune", action="store_true", help="remove the ended and lost runs last written before a time"
    )
    when = parser.add_mutually_exclusive_group()
    when.add_argument(
        "--older-than",
        type=argument(_age),
        metavar="AGE",
        help="prune runs last written longer ago (7d, 12h)",
    )
    when.add_argument(
        "--before", type=argument(_date), metavar="DATE", help="prune runs last written before this ISO date"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="with --prune: list what would go, remove nothing"
    )
    parser.set_defaults(handler=main, usage_error=parser.error)


def main(args: argparse.Namespace) -> int:
    out: TextIO = args.out
    cutoff = time.time() - args.older_than if args.older_than is not None else args.before
    if args.prune and cutoff is None:
        args.usage_error("--prune needs --older-than AGE or --before DATE")
    if not args.prune and (cutoff is not None or args.dry_run):
        args.usage_error("--dry-run, --older-than and --before go with --prune")
    reader = open_store(args.store)
    if reader is None:
        return EXIT_USAGE
    with reader:
        if args.prune:
            return _prune(reader, cutoff, args.dry_run, out)
        try:
            rows = _rows(reader)
        except sqlite3.Error as exc:
            print(f"error: {args.store} cannot be read as a run store: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if not rows:
            print(f"{args.store} has no runs yet", file=out)
            return 0
        stalled = read_stalls(reader.db, None) or []
    table = [HEADER, *(row for row in rows if isinstance(row, tuple))]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    for row in [HEADER, *rows]:
        if isinstance(row, str):  # a launch's line, across the columns
            print(row, file=out)
            continue
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), file=out
        )
    for line in stall_lines(stalled, args.store):
        print(line, file=out)
    return 0


HEADER = ("id", "started", "duration", "host", "pid", "samples", "last step", "GPU energy", "status")


def _rows(reader: StoreReader) -> list[tuple[str, ...] | str]:
    """A row per run, and a line before the ranks of each launch (none without runs)."""
    rows: list[tuple[str, ...] | str] = []
    for item in launches(reader.runs()):
        if isinstance(item, Launch):
            rows.append(f"launch {printable(item.id)}: {item.held}")
            rows += [_row(reader, run, MEMBER_INDENT) for run in item.runs]
        else:
            rows.append(_row(reader, item))
    return rows


MEMBER_INDENT = "  "
"""Before the id of a rank listed under its launch."""


def _row(reader: StoreReader, run: Run, indent: str = "") -> tuple[str, ...]:
    samples, last_step = reader.counts(run.id)
    energy = reader.energy_joules(run.id)
    return (
        indent + str(run.id),
        _local(run.started_at),
        _duration(run.duration),
        printable(run.where),  # written by whoever can write the store
        "?" if run.pid is None else str(run.pid),
        str(samples),
        "-" if last_step is None else str(last_step),
        "-" if energy is None else format_in("J", energy),
        run.status,
    )


def _local(wall: float) -> str:
    """A time as people read it here; ``?`` for an unknown one (NaN: a malformed row)."""
    if wall != wall:
        return "?"
    return datetime.datetime.fromtimestamp(wall).strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float) -> str:
    if seconds != seconds:  # a time unknown (a malformed row)
        return "?"
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _prune(reader: StoreReader, cutoff: float, dry_run: bool, out: TextIO) -> int:
    """Prune (or with ``dry_run`` list) the runs of ``prune.prunable``, saying what went and how
    the space they held is reclaimed."""
    if dry_run:
        _report(prune.prunable(reader.db, cutoff), cutoff, "would remove", out)
        return 0
    before = prune.size(reader.path)
    try:
        db = schema.connect(reader.path, timeout=PRUNE_TIMEOUT_SECONDS)
    except (sqlite3.Error, OSError) as exc:
        print(f"error: cannot open {reader.path} for writing: {exc}", file=sys.stderr)
        return EXIT_USAGE
    db.text_factory = decode_text  # a row's text that is not UTF-8 must not fail the whole prune
    try:
        gone = prune.remove(db, cutoff)
        _report(gone, cutoff, "removed", out)
        out.flush()  # said before their points go, which may take a while
        prune.delete_points(db)
        if gone:
            print(prune.reclaim(db, before, PRUNE_TIMEOUT_SECONDS), file=out)
    except sqlite3.Error as exc:
        print(f"error: cannot prune {reader.path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        db.close()
    return 0


def _report(gone: list[prune.Prunable], cutoff: float, verb: str, out: TextIO) -> None:
    """One line per run pruned, then the totals."""
    if not gone:
        print(f"nothing to prune: no run that ended or was lost last wrote before {_local(cutoff)}", file=out)
        return
    for run, status, points, _ in gone:
        pid = "?" if run.pid is None else run.pid
        print(
            f"{verb} run {run.id}: {printable(run.where)} pid {pid}, {status}, last written"
            f" {_local(run.updated_at)}, {points} points",
            file=out,
        )
    points = sum(points for _, _, points, _ in gone)
    postmortems = sum(postmortems for *_, postmortems in gone)
    print(
        f"{verb} {len(gone)} run{'s' * (len(gone) != 1)}, {points} points and {postmortems}"
        f" postmortem{'s' * (postmortems != 1)} (last written before {_local(cutoff)})",
        file=out,
    )
