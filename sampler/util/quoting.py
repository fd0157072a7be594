"""Quoting values in messages without ever expanding them without bound, and showing text
from elsewhere (a shared run store) without letting it drive the terminal."""

from __future__ import annotations

import reprlib

MAX_QUOTE = 80
"""Characters of a value a message shows at most."""


class _Repr(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        # Converting a huge int to decimal is quadratic, and refused past 4,300 digits.
        if x.bit_length() > 128:
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_repr = _Repr()
_repr.maxlevel = 3
_repr.maxdict = _repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = 4
_repr.maxstring = _repr.maxother = MAX_QUOTE - 4
_repr.maxlong = 40


def bounded_repr(value: object, limit: int = MAX_QUOTE) -> str:
    """``repr(value)`` cut to ``limit`` characters, in time bounded whatever the
    value (nested aliases that expand to billions of items, a 4,000-digit int,
    a ``__repr__`` that raises)."""
    try:
        if isinstance(value, BaseException):
            args = value.args
            detail = (
                args[0] if len(args) == 1 and isinstance(args[0], str) else _repr.repr(args) if args else ""
            )
            text = f"{type(value).__name__}: {detail}" if detail else type(value).__name__
        else:
            text = _repr.repr(value)
    except Exception as exc:
        text = f"<unprintable {type(value).__name__}: {type(exc).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` as a terminal may be given it: each character ``str.isprintable()`` refuses
    (C0 and C1 controls such as ESC, DEL, line breaks; bidi overrides and other format
    characters; unassigned code points) shown as its Python escape (``\\x1b``, ``\\n``,
    ``\\u202e``), the rest as is. For text read from a store others may write."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)
