"""``python -m sampler export STORE``: a run store's signals as CSV or JSON lines.

Long form (default): one row per logged value, ``run_id, name, step,
wall_time, value``. ``--wide``: one row per run and step with one column per
signal, what ``pandas.read_csv`` wants; where a signal was logged more than
once at a step, the last value wins, and ``wall_time`` is the step's latest.
A value logged as NaN is empty in CSV and null in JSON lines.
Rows stream out in order, so a store of any size exports in constant memory.
``-o FILE`` streams into a temporary file beside FILE that becomes FILE once
the export is whole (an interrupted export leaves neither); where FILE is a
terminal, a FIFO or a device, into that, never renamed over; a symbolic link is
refused; FILE must not be the store, or any SQLite database. ``-o -`` is
standard output, as without ``-o``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import heapq
import io
import itertools
import json
import sqlite3
import sys
from collections.abc import Generator
from typing import Any, TextIO

from sampler.commands.common import EXIT_USAGE, open_store, output_argument, output_problem, store_argument
from sampler.store import schema
from sampler.store.reader import NAME, POINT_IS_VALID, RECORD_IS_VALID, StoreReader
from sampler.util import atomicfile

LONG_COLUMNS = ("run_id", "name", "step", "wall_time", "value")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "export",
        help="write a run store's signals as CSV or JSON lines",
        description=__doc__.split("\n\n")[0],
    )
    store_argument(parser)
    parser.add_argument("--run", type=int, action="append", metavar="ID", help="only this run (repeatable)")
    parser.add_argument(
        "--format", choices=("csv", "jsonl"), default="csv", help="output format (default csv)"
    )
    parser.add_argument("--wide", action="store_true", help="one row per step, one column per signal")
    parser.add_argument(
        "-o",
        "--output",
        type=output_argument,
        metavar="FILE",
        help="write here instead of stdout (-: stdout)",
    )
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    reader = open_store(args.store)
    if reader is None:
        return EXIT_USAGE
    output = None if args.output == "-" else args.output
    with reader:
        problem = None if output is None else output_problem(output, args.store)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_USAGE
        try:
            known = {run.id for run in reader.runs()}
        except sqlite3.Error as exc:
            print(f"error: {args.store} cannot be read as a run store: {exc}", file=sys.stderr)
            return EXIT_USAGE
        runs = args.run or sorted(known)
        missing = sorted(set(runs) - known)
        if missing:
            print(f"error: {args.store} has no run {', '.join(map(str, missing))}", file=sys.stderr)
            return EXIT_USAGE
        if output is None:
            _export(reader, runs, args.format, args.wide, args.out)
            return 0
        try:
            with (
                atomicfile.output(output) as file,
                io.TextIOWrapper(file, encoding="utf-8", newline="") as out,
            ):
                _export(reader, runs, args.format, args.wide, out)
        except OSError as exc:
            print(f"error: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
        return 0


def _export(reader: StoreReader, runs: list[int], fmt: str, wide: bool, out: TextIO) -> None:
    if wide:
        names = sorted({name for run in runs for name in reader.names(run)})
        columns: tuple[str, ...] = ("run_id", "step", "wall_time", *names)
        rows = _wide_rows(reader, runs, names)
    else:
        columns, rows = LONG_COLUMNS, _long_rows(reader, runs)
    # Closed here, while the store is open: a reader that went away (`| head`)
    # leaves the generator mid-query.
    with contextlib.closing(rows):
        if fmt == "csv":
            writer = csv.writer(out)
            writer.writerow(columns)
            writer.writerows(rows)
        else:
            for row in rows:
                record = {c: v for c, v in zip(columns, row, strict=True) if v is not None}
                out.write(json.dumps(record) + "\n")


_POINTS = (
    f"SELECT p.run_id, {NAME}, p.step, p.wall_time, p.value FROM points AS p"
    f" JOIN signal_names AS n ON n.id = p.name_id WHERE p.run_id = ? AND {POINT_IS_VALID}"
)
"""A run's points, malformed ones left out (``check_points`` says so)."""


def _long_rows(reader: StoreReader, runs: list[int]) -> Generator[tuple[Any, ...], None, None]:
    for run in runs:
        points = reader.db.execute(_POINTS + " ORDER BY n.name, p.step, p.wall_time", (run,))
        readings = _readings(reader, run)
        yield from heapq.merge(points, readings, key=lambda row: (row[1], row[2], row[3]))
        reader.check_points(run)  # after: it reads every point, and the export's start need not wait


def _readings(reader: StoreReader, run: int) -> Generator[tuple[Any, ...], None, None]:
    """The readings of the run's records as points, by name, step and time: one query a signal."""
    columns = reader.columns()
    for name in sorted(columns):
        yield from reader.db.execute(
            f"SELECT run_id, ?, step, wall_ms / 1000.0, {schema.decoded(name, columns[name])} FROM records"
            f" WHERE run_id = ? AND {RECORD_IS_VALID}"
            f" AND typeof({schema.quoted(name)}) IN ('integer', 'real') ORDER BY step, wall_ms",
            (name, run),
        )


def _wide_rows(
    reader: StoreReader, runs: list[int], names: list[str]
) -> Generator[tuple[Any, ...], None, None]:
    column = {name: i for i, name in enumerate(names)}
    for run in runs:
        points = reader.db.execute(_POINTS + " ORDER BY p.step, p.wall_time", (run,))
        recorded = [name for name in reader.columns() if name in column]
        records = _records(reader, run, recorded)
        merged = heapq.merge(
            ((step, wall, ((name, value),)) for _, name, step, wall, value in points),
            ((step, wall, tuple(zip(recorded, values, strict=True))) for step, wall, *values in records),
            key=lambda row: (row[0], row[1]),
        )
        for step, group in itertools.groupby(merged, key=lambda row: row[0]):
            row: list[float | None] = [None] * len(names)
            latest = None
            for _, wall, readings in group:
                for name, value in readings:
                    if value is not None or len(readings) == 1:
                        row[column[name]] = value
                latest = wall
            yield (run, step, latest, *row)
        reader.check_points(run)


def _records(reader: StoreReader, run: int, names: list[str]) -> sqlite3.Cursor:
    """The run's records by step and time: step, wall time (s), then ``names``' readings."""
    columns = reader.columns()
    values = "".join(f", {schema.decoded(name, columns[name])}" for name in names)
    return reader.db.execute(
        f"SELECT step, wall_ms / 1000.0{values} FROM records WHERE run_id = ? AND {RECORD_IS_VALID}"
        " ORDER BY step, wall_ms",
        (run,),
    )
