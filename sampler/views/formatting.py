"""Values as ``top`` writes them: a signal's value in its catalogue unit, a duration, a sparkline."""

from __future__ import annotations

import math
from collections.abc import Sequence

from sampler import catalogue

SPARK = "▁▂▃▄▅▆▇█"
BINARY_PREFIXES = ("B", "KiB", "MiB", "GiB", "TiB")
"""Bytes are written with the largest prefix that keeps them under 1024."""
WHOLE_UNITS = {"MHz": " MHz", "°C": "°C", "W": " W"}
"""Units whose values are written without decimals, and how each follows its number."""


def sparkline(values: Sequence[float], width: int) -> str:
    """The last ``width`` values as bars from their min (▁) to their max (█);
    a flat series is all ▁, a value that is not finite a space."""
    if width <= 0:
        return ""
    recent = list(values)[-width:]
    finite = [v for v in recent if math.isfinite(v)]
    if not finite:
        return " " * len(recent)
    lo, hi = min(finite), max(finite)
    top = len(SPARK) - 1
    out = []
    for v in recent:
        if not math.isfinite(v):
            out.append(" ")
        elif hi == lo:
            out.append(SPARK[0])
        else:
            out.append(SPARK[round((v - lo) / (hi - lo) * top)])
    return "".join(out)


def format_duration(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h02m``, ``2d04h``; ``?`` for an unknown one (NaN: a time a
    malformed row of a store holds)."""
    if seconds != seconds:
        return "?"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _number(value: float, decimals: int = 1) -> str:
    """Integers as such; else ``decimals`` places below 100, none above."""
    if value.is_integer() and abs(value) < 1e15:
        return f"{value:.0f}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.{decimals}f}"


def _bytes(value: float, per: str) -> str:
    """``value`` bytes with a binary prefix (``1.5 MiB``), ``per`` after the unit (``/s``)."""
    size = value
    for unit in BINARY_PREFIXES:
        if abs(size) < 1024 or unit == BINARY_PREFIXES[-1]:
            text = f"{size:.0f}" if unit == "B" else f"{size:.1f}"
            return f"{text} {unit}{per}"
        size /= 1024
    raise AssertionError("unreachable")


def _joules(value: float, per: str) -> str:
    """``value`` joules with a decimal prefix (``3.2 MJ``), ``per`` after the unit (``/step``)."""
    for prefix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {prefix}J{per}"
    return f"{_number(value, 2)} J{per}"


def format_in(unit: str, value: float) -> str:
    """``value`` (finite) in ``unit``, one of ``catalogue.UNITS``: bytes and their rates
    with a binary prefix, MiB and GiB as they are, counts (threads, cores, 0/1 ...) bare."""
    if unit in ("bytes", "bytes/s"):
        return _bytes(value, unit.removeprefix("bytes"))
    if unit == "MiB/s":
        return _bytes(value * catalogue.MIB, "/s")
    if unit == "MiB":
        return f"{_number(value)} MiB"
    if unit == "GiB":
        return f"{value:.1f} GiB"
    if unit == "%":
        return f"{value:.1f}%"
    if unit in WHOLE_UNITS:
        return f"{value:.0f}{WHOLE_UNITS[unit]}"
    if unit.startswith("J"):
        return _joules(value, unit.removeprefix("J"))
    if unit in ("s", "s/s", "steps/s"):
        return f"{_number(value, 2)} {unit}"
    return _number(value, 2)


def format_value(name: str, value: float, *, rate: bool = False) -> str:
    """``value`` of signal ``name`` in its unit (``sampler.catalogue``; a peak or mean
    in its reading's); ``rate``: the value is a counter's per second. Training
    signals keep four significant digits; resource signals the catalogue does not
    know are bare numbers."""
    value = float(value)  # an int from a hand-made store, too
    if not math.isfinite(value):
        return str(value)
    if not name.startswith(catalogue.PREFIX):
        return f"{value:.4g}"
    reading = catalogue.lookup(name)
    if reading is None:
        return _number(value, 2)
    return format_in(reading.signal.unit + ("/s" if rate else ""), value)
