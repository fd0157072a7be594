"""``python -m sampler plot STORE``: small multiples of a run as a PNG.

The run's own training signals on top, the resource panels grouped by
category, one line per GPU, counters since boot as rates (MiB/s); ``--run``
given more than once overlays runs for comparison. Writes
``<store stem>-run<ID>.png`` in the current directory unless ``-o`` says
otherwise, and prints the path written; never over the store, or any SQLite
database. Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path
from typing import Any, TextIO

from sampler.analysis.explain import explain
from sampler.commands.common import output_problem
from sampler.store.reader import StoreReader
from sampler.store.schema import StoreVersionError
from sampler.views import plot

EXIT_ERROR = 2
"""Status for a store, run or pattern that cannot be plotted (as for a bad flag)."""


def add_parser(commands: Any) -> None:
    """Register ``plot`` with the ``add_subparsers()`` object ``commands``."""
    parser = commands.add_parser(
        "plot",
        help="draw a run (or several, overlaid) of a run store as a PNG of small multiples",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    parser.add_argument("store", metavar="STORE", help="the run store (a .sqlite file)")
    parser.add_argument(
        "--run",
        dest="runs",
        action="append",
        type=_run_id,
        metavar="ID",
        help="the run to draw (default: the newest); repeat to overlay runs",
    )
    parser.add_argument(
        "--signals",
        metavar="PATTERN",
        help="only signals matching PATTERN: a glob over the whole name when it has * ? or [ "
        "('resource/gpu/*', '*loss'), else a substring ('loss', 'gpu/0/')",
    )
    parser.add_argument(
        "--x",
        choices=("step", "seconds"),
        default="step",
        help="x axis: the logged step, the model age all curves share (default), "
        "or seconds since the run started",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE.png",
        help="where to write the PNG (default: ./<store stem>-run<ID>.png)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="shade the stretches `explain` finds (slow, or the step standing still) on every panel",
    )
    parser.set_defaults(handler=main)


def _run_id(text: str) -> int:
    try:
        run_id = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: not a run id") from None
    if run_id <= 0:
        raise argparse.ArgumentTypeError(f"{run_id}: run ids start at 1")
    return run_id


def default_output(store: str, run_ids: list[int]) -> Path:
    """``<store stem>-run<ID>[-run<ID>...].png`` in the current directory."""
    return Path(Path(store).stem + "".join(f"-run{run_id}" for run_id in run_ids) + ".png")


def _error(message: str) -> int:
    print(f"python -m sampler plot: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _not_a_store(store: str, exc: sqlite3.DatabaseError) -> str:
    if isinstance(exc, StoreVersionError):
        return f"{store}: {exc}"
    return f"{store} is not a run store ({exc})"


def main(args: argparse.Namespace) -> int:
    """``python -m sampler plot``; returns 0, or 2 with a one-line error on stderr."""
    out: TextIO = getattr(args, "out", None) or sys.stdout
    try:
        reader = StoreReader(args.store)
    except FileNotFoundError:
        return _error(f"no run store at {args.store}")
    except sqlite3.DatabaseError as exc:
        return _error(_not_a_store(args.store, exc))
    with reader:
        try:
            runs = [reader.run(run_id) for run_id in (args.runs or [None])]
        except LookupError as exc:
            return _error(str(exc))
        except sqlite3.DatabaseError as exc:
            return _error(_not_a_store(args.store, exc))
        runs = list({run.id: run for run in runs}.values())  # --run 3 --run 3: once
        output = Path(args.output) if args.output else default_output(args.store, [run.id for run in runs])
        problem = output_problem(str(output), args.store)
        if problem is not None:
            return _error(problem)
        try:
            shade = explain(reader, runs[0]).stretches if args.explain else []
            path = plot.render(
                reader, runs, pattern=args.signals, x=args.x, output=output, shade=[e.stretch for e in shade]
            )
        except ImportError as exc:
            return _error(str(exc) if plot.INSTALL_HINT in str(exc) else f"{exc}: {plot.INSTALL_HINT}")
        except plot.NothingToPlot as exc:
            return _error(str(exc))
        except sqlite3.DatabaseError as exc:
            return _error(_not_a_store(args.store, exc))
        except OSError as exc:
            return _error(f"cannot write {output}: {exc.strerror or exc}")
    print(path, file=out)
    return 0
