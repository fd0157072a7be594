"""Command line: ``python -m sampler top [STORE]`` shows a run of the store
live in the terminal: its signals' current values, min/max and sparklines, a
row per GPU, the monitor's health, and "no sample for N s" when the backend
stopped or hung: the training process's own rows first, then the GPUs, then
the host's. The arrows (or j and k), PgUp and PgDn (or b and space), Home and
End scroll the rows in a terminal too short for them. ``q`` or Ctrl-C quits.

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
import sys
import time
from typing import Any, TextIO

from sampler import settings
from sampler.commands.common import DEFAULT_STORE, EXIT_BROKEN_PIPE, EXIT_USAGE, argument, silence
from sampler.views.top import Line, frame, frame_text, render
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
        if not _is_terminal(out):  # curses would draw into the file and die with a traceback
            print(
                "error: top draws in a terminal and its output is not one; --once prints one frame as text",
                file=sys.stderr,
            )
            return EXIT_USAGE
        # curses takes LINES and COLUMNS from the environment over the terminal's own size, and
        # keeps them through resizes; they are often a stale copy (readline exports them to the
        # programs a Python prompt or pytest starts), so follow the terminal instead.
        for name in ("LINES", "COLUMNS"):
            os.environ.pop(name, None)
        try:
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C quits, as q does
                curses.wrapper(_live, watch, args.interval)
        except curses.error as exc:  # a terminal curses cannot drive (TERM unknown or unset)
            print(
                f"error: top cannot draw in this terminal ({exc}); --once prints one frame as text",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return 0
    finally:
        watch.close()


def _is_terminal(out: TextIO) -> bool:
    """``out`` is the process's standard output and a terminal: where curses draws."""
    try:
        return out.fileno() == sys.stdout.fileno() and out.isatty()
    except (OSError, ValueError):  # no descriptor behind it (io.UnsupportedOperation is both)
        return False


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


SCROLL_KEYS: dict[int, int | None] = {
    curses.KEY_DOWN: 1,
    ord("j"): 1,
    curses.KEY_UP: -1,
    ord("k"): -1,
    curses.KEY_NPAGE: None,  # a page: the rows the screen shows
    ord(" "): None,
    curses.KEY_PPAGE: None,
    ord("b"): None,
}
"""Keys that scroll the rows, by how many (None: half a screen; up for PgUp and b)."""
PAGE_UP = (curses.KEY_PPAGE, ord("b"))


def _live(screen: Any, watch: StoreWatch, interval: float | None) -> None:
    """The curses loop: poll, draw, wait for a key (q quits, the arrows, PgUp, PgDn, Home and
    End scroll) until the next refresh."""
    with contextlib.suppress(curses.error):  # a terminal that cannot hide its cursor
        curses.curs_set(0)
    screen.keypad(True)
    styles = _styles()
    offset = 0
    while True:
        view = watch.poll()
        deadline = time.monotonic() + refresh_seconds(view, interval)
        while True:
            height, width = screen.getmaxyx()
            lines, offset = frame(view, time.time(), width, height, offset)
            _draw(screen, lines, styles)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            screen.timeout(max(1, int(left * 1000)))
            key = screen.getch()
            if key in (ord("q"), ord("Q")):
                return
            if key == curses.KEY_RESIZE:
                curses.update_lines_cols()
            elif key in SCROLL_KEYS:
                step = SCROLL_KEYS[key]
                page = max(1, height // 2)  # half a screen: what was at its bottom stays in sight
                offset += step if step is not None else -page if key in PAGE_UP else page
            elif key in (curses.KEY_HOME, ord("g")):
                offset = 0
            elif key in (curses.KEY_END, ord("G")):
                offset = sys.maxsize  # frame() keeps it within the rows
            elif key == -1:  # the refresh is due
                break
