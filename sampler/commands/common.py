"""What the commands share: where the run store is by default, opening it with
a one-line message instead of a traceback, refusing an output that would
destroy it, and reading arguments with the configuration's parsers."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shlex
import shutil
import sqlite3
import stat
import sys
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

from sampler import settings
from sampler.store.reader import StoreReader
from sampler.util.quoting import bounded_repr

T = TypeVar("T")

DEFAULT_STORE = "resource_monitor.sqlite"
"""The run store the commands use unless told otherwise, in the working directory."""
EXIT_USAGE = 2
"""Exit status for a store, run or argument that cannot be used."""
SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""
STANDARD_OUTPUT_NAMES = ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")
"""Names of standard output read as ``-`` by ``-o``: each is a symbolic link, which an output is
otherwise never written through (``atomicfile.output``)."""
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a tool whose output pipe closed."""


def store_argument(parser: Any) -> None:
    """The optional ``store`` positional the store-reading commands share (default ``./DEFAULT_STORE``)."""
    parser.add_argument(
        "store", nargs="?", default=DEFAULT_STORE, help=f"run store (default ./{DEFAULT_STORE})"
    )


def argument(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse ``type`` from a parser that raises ``settings.Invalid``: the
    reason it gives becomes the usage error, after the (bounded) value."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except settings.Invalid as exc:
            raise argparse.ArgumentTypeError(f"{bounded_repr(text)}: {exc}") from None

    return convert


def field_argument(field: settings.Field, flag: str) -> Callable[[str], Any]:
    """The argparse ``type`` of a field's ``flag``: the field's own text parser,
    whose remarks (a clamped value) are warnings naming the flag."""
    parse = field.from_text
    assert parse is not None, f"{field.key} has no flag"
    return argument(lambda text: parse(text, functools.partial(settings.warn, flag, text)))


def seconds_argument(maximum: float, why: str) -> Callable[[str], float]:
    """An argparse ``type`` for a number of seconds in (0, ``maximum``];
    ``why`` follows the limit in the message for a larger one."""

    def parse(text: str) -> float:
        seconds = settings.parse_seconds(text)
        if seconds > maximum:
            raise settings.Invalid(f"at most {maximum:.0f} seconds {why}")
        return seconds

    return argument(parse)


def open_store(path: str) -> StoreReader | None:
    """The store at ``path`` for reading, or None after saying on stderr why not."""
    try:
        return StoreReader(path)
    except FileNotFoundError:
        print(f"error: no run store at {path}", file=sys.stderr)
    except sqlite3.Error as exc:
        print(f"error: {path} cannot be read as a run store: {exc}", file=sys.stderr)
    return None


def output_argument(text: str) -> str:
    """``-o``'s value: ``-`` (standard output) for any of ``STANDARD_OUTPUT_NAMES``, else ``text``."""
    return "-" if text in STANDARD_OUTPUT_NAMES else text


def output_problem(output: str, store: str) -> str | None:
    """Why a command reading ``store`` must not write ``output`` (it is a
    directory, the store itself through any link, or another SQLite database),
    or None if it may."""
    try:
        found = os.stat(output)
    except OSError:  # nothing there yet (or unreachable: writing it says why)
        return None
    if stat.S_ISDIR(found.st_mode):
        return f"{output} is a directory"
    refusal = f"refusing to write over {output}: it is"
    with contextlib.suppress(OSError):
        if os.path.samestat(found, os.stat(store)):
            return f"{refusal} the run store {store}"
    if stat.S_ISREG(found.st_mode):
        with contextlib.suppress(OSError), open(output, "rb") as file:
            if file.read(len(SQLITE_HEADER)) == SQLITE_HEADER:
                return f"{refusal} an SQLite database"
    return None


def silence(out: TextIO) -> None:
    """Point ``out``'s descriptor at /dev/null once its reader went away, so the
    interpreter's final flush of what is still buffered for the broken pipe
    cannot fail ("Exception ignored ... BrokenPipeError")."""
    try:
        fd = out.fileno()
    except (OSError, ValueError):  # not backed by a descriptor (io.UnsupportedOperation is both)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def this_python() -> str:
    """How to run this interpreter again from the working directory, for a command
    line a user copies: ``python`` when that is the one ``PATH`` finds, else its
    path (relative when it lies below the working directory, e.g. ``.venv/bin/python``)."""
    executable = os.path.realpath(sys.executable)
    found = shutil.which("python")
    if found is not None and os.path.realpath(found) == executable:
        return "python"
    shown = sys.executable
    with contextlib.suppress(ValueError):  # another drive (Windows)
        relative = os.path.relpath(sys.executable)
        if not relative.startswith(os.pardir):
            shown = relative
    return shlex.quote(shown)
