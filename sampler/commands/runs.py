"""``python -m sampler runs STORE``: one line per run in a run store."""

from __future__ import annotations

import argparse
import datetime
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
    samples, last_step = reader.counts(run.id)
    started = datetime.datetime.fromtimestamp(run.started_at).strftime("%Y-%m-%d %H:%M:%S")
    return (
        str(run.id),
        started,
        _duration(run.duration),
        run.where,
        str(run.pid),
        str(samples),
        "-" if last_step is None else str(last_step),
        run.status,
    )


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
