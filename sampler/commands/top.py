"""Command line: ``python -m sampler top [STORE]`` shows a run of the store
live in the terminal: its signals' current values, min/max and sparklines, a
row per GPU, the monitor's health, and "no sample for N s" when the backend
stopped or hung. ``q`` or Ctrl-C quits.

It follows the newest run (a newer one that appears is picked up) unless
``--run`` names one, and refreshes once per the run's sampling interval (at
most ``MAX_REFRESH_SECONDS`` apart) unless ``--interval`` says otherwise. With
no store or no run yet, it waits and says so. ``--once`` prints one frame as
plain text, without curses, and exits (status 2 when there was no run to show).
"""

from __future__ import annotations

import argparse
import contextlib
import curses
import os
import time
from typing import Any, TextIO

from sampler import settings
from sampler.commands.common import DEFAULT_STORE, EXIT_BROKEN_PIPE, EXIT_USAGE, argument, silence
from sampler.views.top import Line, frame_text, render
from sampler.views.watch import StoreWatch, View

MAX_REFRESH_SECONDS = 5.0
"""The longest wait between two refreshes when following a run's interval."""
MIN_REFRESH_SECONDS = 0.05
WAITING_REFRESH_SECONDS = 1.0
"""How often a store with no run (yet) is looked at again."""
ONCE_WIDTH = 120
"""``--once``'s width when the output is not a terminal."""


def add_parser(commands: Any) -> None:
    top = commands.add_parser(
        "top", help="a live terminal view of a run in the store", description=__doc__.split("\n\n")[0]
    )
    top.add_argument(
        "store",
        nargs="?",
        default=DEFAULT_STORE,
        metavar="STORE",
        help=f"the run store (default ./{DEFAULT_STORE})",
    )
    top.add_argument(
        "--run", dest="run_id", type=int, metavar="ID", help="show this run (default: the newest)"
    )
    top.add_argument(
        "--interval",
        type=argument(lambda text: max(settings.parse_seconds(text), MIN_REFRESH_SECONDS)),
        metavar="SECONDS",
        help="seconds between refreshes (default: the run's sampling interval, at most "
        f"{MAX_REFRESH_SECONDS:g})",
    )
    top.add_argument("--once", action="store_true", help="print one frame as plain text and exit")
    top.set_defaults(handler=main)


def refresh_seconds(view: View, interval: float | None) -> float:
    """How long to wait before the next refresh."""
    if interval is not None:
        return interval
    if view.run is None:
        return WAITING_REFRESH_SECONDS
    return max(MIN_REFRESH_SECONDS, min(view.run.interval, MAX_REFRESH_SECONDS))


def main(args: argparse.Namespace) -> int:
    """``python -m sampler top``: 0 when quit (``q``, Ctrl-C); with ``--once``, 0
    when a run was shown, ``EXIT_USAGE`` (2) when there was none, 141 when
    ``out`` closed early. ``args``: ``store``, ``run_id``, ``interval`` (or
    None), ``once``, ``out`` (the text stream)."""
    out: TextIO = args.out
    watch = StoreWatch(args.store, args.run_id)
    try:
        if args.once:
            view = watch.poll()
            width = _width(out)
            try:
                print(frame_text(render(view, time.time(), width)), file=out, flush=True)
            except BrokenPipeError:  # python -m sampler top --once | head
                silence(out)
                return EXIT_BROKEN_PIPE
            return 0 if view.run is not None else EXIT_USAGE
        # curses takes LINES and COLUMNS from the environment over the terminal's own size, and
        # keeps them through resizes; they are often a stale copy (readline exports them to the
        # programs a Python prompt or pytest starts), so follow the terminal instead.
        for name in ("LINES", "COLUMNS"):
            os.environ.pop(name, None)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C quits, as q does
            curses.wrapper(_live, watch, args.interval)
        return 0
    finally:
        watch.close()


def _width(out: TextIO) -> int:
    """The terminal's width when ``out`` is one, else ``ONCE_WIDTH`` (a pipe, a file)."""
    try:
        if out.isatty():
            return os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError):
        pass
    return ONCE_WIDTH


def _styles() -> dict[str, int]:
    styles = {
        "title": curses.A_BOLD | curses.A_REVERSE,
        "alert": curses.A_BOLD,
        "heading": curses.A_BOLD,
        "": 0,
    }
    try:
        if curses.has_colors():
            curses.use_default_colors()
            curses.init_pair(1, curses.COLOR_RED, -1)
            styles["alert"] |= curses.color_pair(1)
    except curses.error:
        pass
    return styles


def _draw(screen: Any, lines: list[Line], styles: dict[str, int]) -> None:
    screen.erase()
    height, width = screen.getmaxyx()
    for y, line in enumerate(lines[:height]):
        # The bottom-right cell cannot be written without scrolling: curses says so, harmlessly.
        with contextlib.suppress(curses.error):
            screen.addnstr(y, 0, line.text, width, styles.get(line.style, 0))
    screen.refresh()


def _live(screen: Any, watch: StoreWatch, interval: float | None) -> None:
    """The curses loop: poll, draw, wait for a key until the next refresh."""
    with contextlib.suppress(curses.error):  # a terminal that cannot hide its cursor
        curses.curs_set(0)
    styles = _styles()
    while True:
        view = watch.poll()
        deadline = time.monotonic() + refresh_seconds(view, interval)
        while True:
            height, width = screen.getmaxyx()
            _draw(screen, render(view, time.time(), width, height), styles)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            screen.timeout(max(1, int(left * 1000)))
            key = screen.getch()
            if key in (ord("q"), ord("Q")):
                return
            if key == curses.KEY_RESIZE:
                curses.update_lines_cols()
            elif key == -1:  # the refresh is due
                break
