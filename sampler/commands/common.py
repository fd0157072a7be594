"""What the commands share: where the run store is by default, and opening it
with a one-line message instead of a traceback."""

from __future__ import annotations

import os
import sqlite3
import sys
from typing import TextIO

from sampler.store.reader import StoreReader

DEFAULT_STORE = "resource_monitor.sqlite"
"""The run store the commands use unless told otherwise, in the working directory."""
EXIT_USAGE = 2
"""Exit status for a store, run or argument that cannot be used."""
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a tool whose output pipe closed."""


def open_store(path: str) -> StoreReader | None:
    """The store at ``path`` for reading, or None after saying on stderr why not."""
    try:
        return StoreReader(path)
    except FileNotFoundError:
        print(f"error: no run store at {path}", file=sys.stderr)
    except sqlite3.Error as exc:
        print(f"error: {path} cannot be read as a run store: {exc}", file=sys.stderr)
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
