"""Reading what others may have written: a run store's columns and a postmortem's numbers, each
checked to be what it must be. A malformed value (another tool's write, a hand-run UPDATE, a
lost block) is said once per process, naming where it is, the column and the value (quoted,
bounded), and is read as a stated fallback, so that one bad row never hides the others."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable
from typing import Any, TypeGuard, TypeVar

from sampler.util.quoting import bounded_repr, printable

log = logging.getLogger("sampler")

T = TypeVar("T")

MAX_TIME = 1e11
"""Times (s since the epoch) are below this, the year 5138: no clock wrote a later one, and
calendars fail on some."""
PIDS = range(1, 2**31)
"""What a process id can be: a positive C int."""
WHOLE = range(2**63)
"""A count, or an id: a whole number that SQLite's INTEGER holds."""

_said: set[tuple[str, str]] = set()
_said_lock = threading.Lock()


def malformed(source: str, where: str, value: object, problem: str, instead: str) -> None:
    """Say once per process that ``where`` in ``source`` (a store, a postmortem file), e.g.
    ``run 3: pid``, holds the malformed ``value`` (quoted, bounded): ``problem`` says what is
    wrong, ``instead`` what is read in its place. Said ``printable``: ``where`` and ``instead``
    may hold a key or a name from the file."""
    with _said_lock:
        if (source, where) in _said:
            return
        _said.add((source, where))
    log.warning(
        "%s", printable(f"resource monitor: {source}: {where} {bounded_repr(value)} is {problem}; {instead}")
    )


class Undecodable(str):
    """Text of a store that is not UTF-8, read with U+FFFD for each byte that is not; ``raw``
    holds its bytes."""

    raw: bytes


def decode_text(data: bytes) -> str:
    """A store's TEXT, as a ``sqlite3`` connection's ``text_factory``: never raising, where
    Python's own decoding fails the whole query on a text that is not UTF-8 (such a text
    reads as ``Undecodable``)."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        text = Undecodable(data.decode(errors="replace"))
        text.raw = data
        return text


def finite(value: object) -> TypeGuard[int | float]:
    """``value`` is a number a float holds (not a bool, not NaN or infinite, not an integer of
    hundreds of digits)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class Row:
    """The columns of one row (``where``: ``run 3``) of ``source``, each read through a check
    here: a malformed one is said once (``malformed``) and read as its fallback."""

    def __init__(self, source: str, where: str) -> None:
        self.source = source
        self.where = where

    def bad(self, column: str, value: object, problem: str, instead: str) -> None:
        malformed(self.source, f"{self.where}: {column}", value, problem, instead)

    def time(self, column: str, value: object) -> float:
        """A time, s since the epoch; NaN (unknown) if it is not one."""
        return self.seconds(column, value, "a time", math.nan)

    def seconds(self, column: str, value: object, what: str, fallback: T) -> float | T:
        """A number of seconds from 0 to ``MAX_TIME`` (``what`` names it: a time since the
        epoch, a duration), else ``fallback``."""
        if finite(value) and 0 <= value < MAX_TIME:
            return float(value)
        self.bad(column, value, f"not {what}", "read as unknown")
        return fallback

    def text(self, column: str, value: object, fallback: T) -> str | T:
        """Text; that of a text that is not UTF-8 with U+FFFD for its bad bytes; else ``fallback``."""
        if isinstance(value, Undecodable):
            self.bad(column, value.raw, "not UTF-8", f"shown as {bounded_repr(str(value))}")
            return str(value)
        if isinstance(value, str):
            return value
        self.bad(column, value, "not text", f"read as {fallback if fallback is not None else 'none'}")
        return fallback

    def whole(self, column: str, value: object, allowed: range, what: str, fallback: T) -> int | T:
        """A whole number in ``allowed`` (``what`` names it), else ``fallback``."""
        if type(value) is int and value in allowed:
            return value
        self.bad(column, value, f"not {what}", f"read as {fallback if fallback is not None else 'unknown'}")
        return fallback

    def parsed(self, column: str, value: object, kind: type[T]) -> T | None:
        """The JSON ``kind`` (dict, list) that the text ``value`` holds; None if it holds none."""
        text = self.text(column, value, None)
        if text is None:
            return None
        try:
            found = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            self.bad(column, value, f"not JSON ({bounded_repr(exc)})", "read as unknown")
            return None
        if not isinstance(found, kind):
            self.bad(column, value, f"not a JSON {'object' if kind is dict else 'list'}", "read as unknown")
            return None
        return found


def checked(
    check: Row, column: str, found: dict[str, Any], rules: dict[str, tuple[Callable[[Any], bool], str]]
) -> dict[str, Any]:
    """``found``, the JSON object of ``column``, without each key whose value breaks its rule
    (``rules``: key -> its test, and what it must be), each said once."""
    kept = dict(found)
    for key, (test, what) in rules.items():
        if key in kept and not test(kept[key]):
            check.bad(f"{column} {key}", kept.pop(key), f"not {what}", "left out")
    return kept
