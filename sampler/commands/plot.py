"""``python -m sampler plot STORE``: small multiples of a run as a PNG.

The run's own training signals on top with its throughput beside them, the
resource panels grouped by category, one line per GPU, counters since boot as
rates (MiB/s); a resource that kept one value all run is named under the figure
instead of drawn, unless ``--signals`` asks for it; ``--run``
given more than once overlays runs for comparison; ``--launch ID`` (a launch id
or a unique start of one) draws the ranks of a multi-rank launch instead: each
signal's spread across its ranks per step and each rank's throughput
(``sampler.views.launch_plot``). Writes ``<store stem>-run<ID>.png`` (or
``-launch<ID>.png``) in the current directory unless ``-o`` says otherwise, and
prints the path written; ``-o -`` writes the PNG to standard output instead.
Written as ``export -o`` writes: atomically, or into a terminal or FIFO there;
never through a symbolic link, over the store, or any SQLite database. Needs
matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import re
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sampler.analysis import ranks
from sampler.analysis.explain import explain
from sampler.commands.common import output_argument, output_problem
from sampler.store.reader import StoreReader
from sampler.store.schema import StoreVersionError
from sampler.util.quoting import printable
from sampler.views import launch_plot, plot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--run",
        dest="runs",
        action="append",
        type=_run_id,
        metavar="ID",
        help="the run to draw (default: the newest); repeat to overlay runs",
    )
    which.add_argument(
        "--launch",
        metavar="ID",
        help="draw the ranks of this multi-rank launch (its id, or a unique start of it, as `runs` "
        "shows it): each signal's spread across the ranks per step, and each rank's throughput",
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
        type=output_argument,
        metavar="FILE.png",
        help="where to write the PNG (default: ./<store stem>-run<ID>.png; -: stdout)",
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


def launch_output(store: str, launch_id: str) -> Path:
    """``<store stem>-launch<ID>.png`` in the current directory, the id's characters other than
    letters, digits, ``.``, ``_`` and ``-`` written ``_`` (a ``host:port`` id names no path)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", launch_id)[:MAX_ID_IN_NAME]
    return Path(f"{Path(store).stem}-launch{safe}.png")


MAX_ID_IN_NAME = 40
"""Characters of a launch id a default output name keeps."""


def _error(message: str) -> int:
    print(f"python -m sampler plot: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _not_a_store(store: str, exc: sqlite3.DatabaseError) -> str:
    if isinstance(exc, StoreVersionError):
        return f"{store}: {exc}"
    return f"{store} is not a run store ({exc})"


class _Refused(Exception):
    """What cannot be drawn, in one line."""


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
            path = _launch(reader, args, out) if args.launch is not None else _runs(reader, args, out)
        except (_Refused, LookupError, plot.NothingToPlot) as exc:
            return _error(str(exc))
        except ImportError as exc:
            return _error(str(exc) if plot.INSTALL_HINT in str(exc) else f"{exc}: {plot.INSTALL_HINT}")
        except sqlite3.DatabaseError as exc:
            return _error(_not_a_store(args.store, exc))
    if path is not None:
        print(path, file=out)
    return 0


def _runs(reader: StoreReader, args: argparse.Namespace, out: TextIO) -> Path | None:
    """``plot [--run ID ...]``: the runs overlaid; returns the path written (None: ``out``)."""
    runs = [reader.run(run_id) for run_id in (args.runs or [None])]
    runs = list({run.id: run for run in runs}.values())  # --run 3 --run 3: once
    output = _output(args, default_output(args.store, [run.id for run in runs]))
    shade = explain(reader, runs[0]).stretches if args.explain else []
    fig = plot.figure(reader, runs, pattern=args.signals, x=args.x, shade=[e.stretch for e in shade])
    return _save(fig, output, out)


def _launch(reader: StoreReader, args: argparse.Namespace, out: TextIO) -> Path | None:
    """``plot --launch ID``: the launch's ranks side by side; returns the path written (None: ``out``)."""
    if args.explain or args.x != "step":
        raise _Refused("--launch draws its ranks on the step axis, without --explain or --x seconds")
    launch = ranks.several(reader, args.launch, "draw")
    gathered = ranks.gather(reader, launch)
    if len(gathered.ranks) < 2:
        silent = ", ".join(str(run.id) for run in gathered.silent)
        raise _Refused(
            f"launch {printable(launch.id)}: only {len(gathered.ranks)} of its runs recorded two"
            f" samples or more (none or one from run {silent}); a spread needs two"
        )
    output = _output(args, launch_output(args.store, launch.id))
    return _save(launch_plot.figure(reader, gathered, pattern=args.signals), output, out)


def _output(args: argparse.Namespace, default: Path) -> Path | None:
    """Where to write: ``-o`` or ``default``, None for standard output (``-o -``);
    ``_Refused`` when it must not be written."""
    if args.output == "-":
        return None
    output = Path(args.output) if args.output else default
    problem = output_problem(str(output), args.store)
    if problem is not None:
        raise _Refused(problem)
    return output


def _save(fig: Figure, output: Path | None, out: TextIO) -> Path | None:
    """Write ``fig`` to ``output``, or (None) as bytes to ``out``'s binary buffer."""
    if output is None:
        plot.write_png(fig, out.buffer)
        out.buffer.flush()
        return None
    try:
        return plot.save(fig, output)
    except OSError as exc:
        raise _Refused(f"cannot write {output}: {exc.strerror or exc}") from exc
