"""``python -m sampler postmortem``: what the monitor's child wrote down when a
backend died under it (SIGKILL, the OOM killer, a crash): list the postmortems,
show one, mark them read.

Postmortems come from a directory (``--dir``) and a run store (``--store``);
with neither flag, from the monitor's default directory and every run store in the
working directory (``*.sqlite``, ``*.sqlite3``, ``*.db``: ``resource_monitor.sqlite``,
or the ``runs.sqlite`` a script named), each where it exists. They are numbered
oldest first, read ones included, so a number stays put. A monitor announces
unread ones when it starts; showing one marks it read, and so does
``--mark-read`` for all those listed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sqlite3
import sys
from typing import Any, TextIO

from sampler import settings
from sampler.child.peaks import MEAN_SUFFIX, PEAK_SUFFIX
from sampler.commands.common import DEFAULT_STORE, EXIT_USAGE, SQLITE_HEADER, argument
from sampler.commands.stalls import postmortem_line
from sampler.postmortems.files import CgroupAtDeath, Exit
from sampler.postmortems.reading import (
    Found,
    by_death,
    cause_of_death,
    in_directory,
    in_store,
    load,
    local_time,
    mark_read,
    with_header,
)
from sampler.store.schema import NotARunStore
from sampler.util.quoting import printable

LATEST = "latest"
DEFAULT_LAST = 5


def _choice(text: str) -> int | str:
    """``--show``'s value: a postmortem's number (from 1), or ``latest``."""
    if text == LATEST:
        return text
    try:
        number = int(text)
    except ValueError:
        raise settings.Invalid(f"expected a postmortem's number or {LATEST}") from None
    if number < 1:
        raise settings.Invalid("postmortems are numbered from 1")
    return number


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise settings.Invalid("expected a whole number") from None
    if count < 1:
        raise settings.Invalid("expected at least 1")
    return count


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "postmortem",
        help="list and show what was recorded when a backend died under its monitor",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--dir", help=f"postmortem directory (default ./{settings.DEFAULT_POSTMORTEM_DIR})")
    parser.add_argument(
        "--store", help=f"run store (default: every run store here, ./{DEFAULT_STORE} and the others)"
    )
    parser.add_argument(
        "--show",
        type=argument(_choice),
        metavar=f"N|{LATEST}",
        help="print postmortem N (or the newest): the last readings and peaks of each signal; marks it read",
    )
    parser.add_argument(
        "--last",
        type=argument(_count),
        default=DEFAULT_LAST,
        metavar="K",
        help=f"records --show prints for each signal (default {DEFAULT_LAST})",
    )
    parser.add_argument("--all", action="store_true", help="list the postmortems already read too")
    parser.add_argument(
        "--mark-read",
        action="store_true",
        help="mark every postmortem listed read: no monitor announces it again",
    )
    parser.set_defaults(handler=main)


STORE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
"""The names of the files in the working directory looked at as run stores, without ``--store``."""


def stores_here() -> list[str]:
    """The SQLite files in the working directory whose names end in ``STORE_SUFFIXES``, by name
    (``DEFAULT_STORE`` first): where a script's run store is when it named one (``store="runs.sqlite"``)."""
    names: list[str] = []
    with contextlib.suppress(OSError), os.scandir(".") as entries:
        for entry in entries:
            if entry.name.lower().endswith(STORE_SUFFIXES) and entry.is_file():
                with contextlib.suppress(OSError), open(entry.name, "rb") as file:
                    if file.read(len(SQLITE_HEADER)) == SQLITE_HEADER:
                        names.append(entry.name)
    return sorted(names, key=lambda name: (name != DEFAULT_STORE, name))


def main(args: argparse.Namespace) -> int:
    out: TextIO = args.out
    explicit = args.dir is not None or args.store is not None
    places: list[tuple[str, str | None]] = (
        [("--dir", args.dir), ("--store", args.store)]
        if explicit
        else [("--dir", settings.DEFAULT_POSTMORTEM_DIR), *(("--store", store) for store in stores_here())]
    )
    found: list[Found] = []
    skipped: list[str] = []  # the SQLite files here that could not be read as run stores
    for flag, place in list(places):
        if place is None:
            continue
        try:
            found += in_directory(place) if flag == "--dir" else in_store(place)
        except FileNotFoundError:
            if explicit:
                print(
                    f"error: no {'directory' if flag == '--dir' else 'run store'} at {place}", file=sys.stderr
                )
                return EXIT_USAGE
        except (OSError, sqlite3.Error) as exc:
            if not explicit and flag == "--store":
                places.remove((flag, place))
                skipped.append(place)
                if not _not_a_store(exc):  # a run store, locked by another program or unreadable
                    print(
                        f"warning: cannot read {printable(place)} ({exc}): its postmortems are not"
                        f" listed; try again, or --store {printable(place)}",
                        file=sys.stderr,
                    )
                continue
            print(f"error: cannot read the postmortems in {place}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    found.sort(key=by_death)
    if args.show is not None:
        return _show(found, args.show, args.last, out)
    listed = [(n, with_header(f)) for n, f in enumerate(found, 1) if args.all or not f.read]
    if not listed:
        _say_none(places, explicit, args.all, out, skipped)
        return 0
    _table([HEADER, *(_row(n, f) for n, f in listed)], out)
    if args.mark_read:
        if not _mark([f for _, f in listed]):
            return EXIT_USAGE
        print(f"marked {sum(not f.read for _, f in listed)} read", file=out)
    return 0


def _not_a_store(exc: Exception) -> bool:
    """Whether ``exc`` says the file is no run store (another program's database), rather than a
    run store that cannot be read now (locked by another program, unreadable)."""
    return isinstance(exc, NotARunStore) or getattr(exc, "sqlite_errorname", None) == "SQLITE_NOTADB"


def _say_none(
    places: list[tuple[str, str | None]], explicit: bool, read_too: bool, out: TextIO, skipped: list[str]
) -> None:
    """There are no postmortems (``read_too``: not even read ones) where we looked: say where that
    was and, when it was only the default places, where else they may be (``skipped``: the SQLite
    files here that could not be read as run stores)."""
    stores = [place for flag, place in places if flag == "--store" and place is not None]
    where = " or ".join(place for flag, place in places if flag == "--dir" and place is not None)
    if stores:
        where += f"{' or ' * bool(where)}the run store{'s' * (len(stores) > 1)} {', '.join(stores)}"
    elif skipped:
        where += f", and no run store here could be read ({', '.join(map(printable, skipped))})"
    elif not explicit:
        suffixes = ", ".join(f"*{suffix}" for suffix in STORE_SUFFIXES)
        where += f", and there is no run store here (no {suffixes} file)"
    print(f"no postmortems {'' if read_too else 'waiting '}in {where}", file=out)
    if not explicit:
        print(
            "a script that recorded into a run store elsewhere left its postmortems there:"
            " --store PATH (its store=, relative to where it ran)",
            file=out,
        )


HEADER = ("#", "died", "pid", "host", "records", "run", "read", "where")


def _row(number: int, found: Found) -> tuple[str, ...]:
    return (
        str(number),
        local_time(found.vanished_at),
        found.pid,
        printable(found.host or "?"),
        str(found.records) if found.records is not None else "?" if found.store_id else "unreadable",
        "-" if found.run_id is None else str(found.run_id),
        "yes" if found.read else "no",
        printable(found.where),
    )


def _table(rows: list[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), file=out
        )


def _mark(found: list[Found]) -> bool:
    try:
        mark_read(found)
    except (OSError, sqlite3.Error) as exc:
        print(f"error: cannot mark postmortems read: {exc}", file=sys.stderr)
        return False
    return True


def _show(found: list[Found], choice: int | str, last: int, out: TextIO) -> int:
    if not found:
        print("error: there are no postmortems to show", file=sys.stderr)
        return EXIT_USAGE
    if choice == LATEST:
        number = len(found)
    elif isinstance(choice, int) and choice <= len(found):
        number = choice
    else:
        print(f"error: there is no postmortem {choice}; there are {len(found)}", file=sys.stderr)
        return EXIT_USAGE
    entry = found[number - 1]
    try:
        header, records = load(entry)
    except (OSError, ValueError, sqlite3.Error) as exc:
        print(f"error: postmortem {number} ({printable(entry.where)}) cannot be read: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _describe(number, entry, header, records, out)
    _signals(header, records, last, out)
    return 0 if _mark([entry]) else EXIT_USAGE


def _describe(
    number: int, entry: Found, header: dict[str, Any], records: list[dict[str, Any]], out: TextIO
) -> None:
    print(cause_of_death(header), file=out)
    print(f"postmortem {number}: {printable(entry.where)}", file=out)
    started = header.get("monitor_started_at")
    print(
        f"backend pid {_shown(header['backend_pid'])} on {_shown(header['host'])} died at "
        f"{local_time(header['vanished_at'])}"
        + (f"; its monitor started at {local_time(started)}" if isinstance(started, (int, float)) else "")
        + f", sampling every {_shown(header.get('interval_seconds'))} s",
        file=out,
    )
    if entry.run_id is not None:
        print(f"run {entry.run_id} of the store", file=out)
    last_logged = header.get("last_logged_record")
    unlogged = sum(not r.get("logged") for r in records)
    print(
        f"the ring held {len(records)} records (of {_shown(header.get('ring_capacity'))}); "
        + (
            "the backend had logged none"
            if last_logged is None
            else f"the backend logged through record {_shown(last_logged)} "
            f"(step {_shown(header.get('last_logged_step'))})"
        )
        + f"; {unlogged} never logged",
        file=out,
    )
    stall = header.get("stall")
    if isinstance(stall, dict):
        print(postmortem_line(stall, header.get("vanished_at")), file=out)
    ended = Exit.from_json(header.get("exit"))
    if ended is not None and ended.unknown is not None:
        print(f"its exit status could not be learned: {printable(ended.unknown)}", file=out)
    cgroup = CgroupAtDeath.from_json(header.get("memory_cgroup"))
    if cgroup is not None:
        kills = "? OOM kills" if cgroup.oom_kills is None else f"{cgroup.oom_kills} OOM kill"
        kills += "" if cgroup.oom_kills == 1 else "s"
        print(
            f"memory cgroup {printable(cgroup.name)} (v{cgroup.version}, {printable(cgroup.directory)}): "
            f"{kills} while the child watched"
            + ("" if cgroup.memory_from is None else f"; memory from its {printable(cgroup.memory_from)}"),
            file=out,
        )


def _shown(value: object) -> str:
    """A value read from a postmortem (a file others may write) as a terminal may be given it."""
    return printable(str(value))


def _signals(header: dict[str, Any], records: list[dict[str, Any]], last: int, out: TextIO) -> None:
    """Per reading: its value in each of the last records (seconds before the
    death), then its peak over the whole postmortem (the readings and, where the
    child tracked it between records, ``_peak``)."""
    if not records:
        return
    fields = [f for f in header["fields"] if isinstance(f, str)]
    derived = {
        f for f in fields for s in (PEAK_SUFFIX, MEAN_SUFFIX) if f.endswith(s) and f[: -len(s)] in fields
    }
    tail = records[-last:]
    columns = [_before(r["wall_time"], header["vanished_at"]) for r in tail]
    rows: list[tuple[str, ...]] = [("signal", *columns, "peak")]
    for name in (f for f in fields if f not in derived):
        readings = [r["values"].get(n) for r in records for n in (name, name + PEAK_SUFFIX)]
        numbers = [v for v in readings if isinstance(v, (int, float)) and v == v]
        rows.append(
            (
                printable(name),
                *(_number(r["values"].get(name)) for r in tail),
                _number(max(numbers) if numbers else None),
            )
        )
    print(f"readings of the last {len(tail)} records (s before the death) and the peak over all:", file=out)
    _table(rows, out)


def _before(wall: float, vanished: float) -> str:
    """A record's column heading: s before the death (``?`` where either time is unknown)."""
    before = wall - vanished
    return f"{before:.2f}s" if math.isfinite(before) else "?"


def _number(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    if value != value:  # NaN: unknown (a number no float held)
        return "?"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}"
