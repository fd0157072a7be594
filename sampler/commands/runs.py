"""``python -m sampler runs STORE``: one line per run in a run store."""

from __future__ import annotations

import argparse
import datetime
import sqlite3
from typing import Any, TextIO

from sampler.commands.common import DEFAULT_STORE, EXIT_USAGE, open_store
from sampler.store.reader import Run, StoreReader


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "runs", help="list the runs in a run store", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "store", nargs="?", default=DEFAULT_STORE, help=f"run store (default ./{DEFAULT_STORE})"
    )
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    out: TextIO = args.out
    reader = open_store(args.store)
    if reader is None:
        return EXIT_USAGE
    with reader:
        runs = reader.runs()
        if not runs:
            print(f"{args.store} has no runs yet", file=out)
            return 0
        rows = [_row(reader, run) for run in runs]
    widths = [max(len(row[i]) for row in [HEADER, *rows]) for i in range(len(HEADER))]
    for row in [HEADER, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), file=out
        )
    return 0


HEADER = ("id", "started", "duration", "host", "pid", "samples", "last step", "status")


def _row(reader: StoreReader, run: Run) -> tuple[str, ...]:
    samples, last_step = _samples(reader.db, run.id)
    started = datetime.datetime.fromtimestamp(run.started_at).strftime("%Y-%m-%d %H:%M:%S")
    return (
        str(run.id),
        started,
        _duration(run.duration),
        run.host,
        str(run.pid),
        str(samples),
        "-" if last_step is None else str(last_step),
        run.status,
    )


def _samples(db: sqlite3.Connection, run_id: int) -> tuple[int, int | None]:
    """(resource samples recorded, last step logged) of a run."""
    (samples,) = db.execute(
        "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM points WHERE run_id = ?"
        " AND name_id IN (SELECT id FROM signal_names WHERE name LIKE 'resource/%') GROUP BY name_id)",
        (run_id,),
    ).fetchone()
    (last,) = db.execute("SELECT MAX(step) FROM points WHERE run_id = ?", (run_id,)).fetchone()
    return int(samples), last


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
