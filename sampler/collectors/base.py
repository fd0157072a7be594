"""What every collector is: a category, fixed signal names, one reading per name."""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

import psutil

from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

MB = 1024**2
"""Bytes per MB (MiB), the unit of every ``*_mb`` signal."""
GB = 1024**3
"""Bytes per GB (GiB), the unit of every ``*_gb`` signal."""
MISSING = math.nan
"""A reading that failed: skipped for this sample, never logged."""

T = TypeVar("T")

READING_ERRORS: tuple[type[BaseException], ...] = (psutil.Error, OSError)
"""What a reading may legitimately raise: the process or file is gone, access
is denied, the kernel has no such counter. Anything else is a bug."""

STARVED_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
"""Failures that say the reader, not the thing read, is in trouble: the process
or the system is out of descriptors or memory."""

_reported: set[tuple[str, type[BaseException]]] = set()


class Starvation:
    """Readings that failed for one of ``STARVED_ERRNOS`` since the last ``take``.

    Such a failure is not the reading's (the file is there, the process lives):
    it says the sampler itself cannot work, so it is counted for the monitor
    to report instead of passing as one more skipped reading.
    """

    def __init__(self) -> None:
        self.count = 0
        self.last = ""

    def note(self, exc: OSError) -> None:
        self.count += 1
        self.last = f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc.strerror or exc}"

    def take(self) -> tuple[int, str]:
        """(readings starved since the last call, the latest reason)."""
        taken = self.count, self.last
        self.count = 0
        return taken


starvation = Starvation()
"""The process's count: collectors run in one thread (the child's main thread)."""


def attempt(read: Callable[[], T], errors: tuple[type[BaseException], ...] = READING_ERRORS) -> T | None:
    """One reading, or None if it failed (the reading is skipped, not faked).

    ``errors`` are the failures a reading can legitimately meet; any other
    exception is a programming error: the reading is skipped too, and the
    first time each call site raises each kind it is reported with its
    traceback, so a signal that never appears is never a mystery. A failure
    for want of descriptors or memory is counted in ``starvation``.
    """
    try:
        return read()
    except errors as exc:
        if isinstance(exc, OSError) and exc.errno in STARVED_ERRNOS:
            starvation.note(exc)
        return None
    except Exception as exc:
        key = (getattr(read, "__qualname__", repr(read)), type(exc))
        if key not in _reported:
            _reported.add(key)
            log.warning(
                "resource monitor: reading %s raised %s, which no reading should; it is skipped "
                "(reported once)",
                key[0],
                bounded_repr(exc),
                exc_info=True,
            )
        return None


class Collector:
    """Reads one category. ``sample()`` returns one float per name in ``names``,
    ``MISSING`` (NaN) where a reading failed.

    Fast-moving readings are also read between records, at the child's inner
    rate, for their peak (and mean) since the last logged record: ``tracked``
    names them (those of ``names`` with a ``_peak`` in ``sampler.catalogue``, in
    ``names`` order), ``averaged`` those with a ``_mean``, and
    ``sample_tracked()`` reads them, one float per ``tracked`` name. It must
    not disturb ``sample()``: a rate such as CPU % keeps its own window since
    the previous record.
    """

    category: ClassVar[str]
    names: tuple[str, ...]
    tracked: tuple[str, ...] = ()
    averaged: tuple[str, ...] = ()

    def sample(self) -> list[float]:
        raise NotImplementedError

    def sample_tracked(self) -> list[float]:
        """The ``tracked`` readings now (the child calls it at its inner rate)."""
        return []

    def marks(self) -> list[float]:
        """Exact peaks the kernel kept since the previous call, one per ``tracked`` name: a
        high-water mark that rose is the highest reading since then, however briefly it
        lasted, where polling at any rate can miss it; NaN where there is no mark or it did not
        rise. The child calls it once per record, after ``sample()``."""
        return [MISSING] * len(self.tracked)

    def close(self) -> None:
        """Release what the collector holds (NVML handles); idempotent."""


class Rates:
    """Per-second rates of cumulative counters between consecutive readings.

    The first reading has no rate, and neither has a counter that went
    backwards (a NIC reset, a device removed) or failed now or last time: NaN,
    never a negative or invented rate.
    """

    def __init__(self, width: int) -> None:
        self._last: list[float] = [MISSING] * width
        self._at = 0.0

    def update(self, counters: Sequence[float], now: float) -> list[float]:
        """Rates since the previous update; ``now`` is when ``counters`` were read (monotonic s)."""
        elapsed = now - self._at
        rates = [
            (value - last) / elapsed if self._at and value >= last else MISSING
            for value, last in zip(counters, self._last, strict=True)
        ]
        self._last, self._at = list(counters), now
        return rates
