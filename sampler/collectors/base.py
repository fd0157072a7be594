"""What every collector is: a category whose readings, keyed by catalogue entry, the catalogue lays out."""

from __future__ import annotations

import errno
import functools
import logging
import math
from collections.abc import Callable
from time import monotonic
from typing import ClassVar, TypeVar

import psutil

from sampler import catalogue
from sampler.catalogue import Signal
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

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


Readings = dict[Signal, float]
"""Readings by catalogue entry; a signal left out was not read (``MISSING`` in the record)."""


class Collector:
    """Reads one category: ``read()`` gives its readings by catalogue entry, ``signals()`` says
    which it reads (gauges and counters), and the catalogue lays them out: ``names`` are the
    record's fields (``catalogue.record_layout``, each counter's ``_per_second`` derived here
    by ``catalogue.rate``), and ``sample()`` one float per name, ``MISSING`` (NaN) where a
    reading failed. A collector of several devices (gpu) names them in ``devices`` and gives
    one set of readings per device (``read_devices()``).

    Fast-moving readings are also read between records, at the child's inner rate, for their
    peak (and mean) since the last logged record: ``tracked`` names them (those of ``names``
    with a ``_peak`` in the catalogue, in ``names`` order), ``averaged`` those with a
    ``_mean``, and ``sample_tracked()`` reads them (``read_tracked()``). It must not disturb
    ``sample()``: a rate such as CPU % keeps its own window since the previous record.
    """

    category: ClassVar[str]
    devices: tuple[str, ...] = ("",)
    """Device labels (a GPU's ``<i>`` in its signals' names); one unnamed elsewhere."""
    _counted: tuple[Readings, ...] = ()
    """Each device's readings at the previous ``sample()``, its counters' rates' start."""
    _counted_at = math.nan
    """When they were read (monotonic s)."""

    def signals(self) -> tuple[Signal, ...]:
        """The signals ``read()`` reads: by default every one the catalogue samples in its category."""
        return catalogue.sampled(self.category)

    def read(self) -> Readings:
        """The readings now."""
        raise NotImplementedError

    def read_devices(self) -> list[Readings]:
        """The readings now, one set per device in ``devices`` order."""
        return [self.read()]

    def read_tracked(self) -> list[Readings]:
        """The tracked readings now, one set per device (the child calls it at its inner rate)."""
        return [{} for _ in self.devices]

    def read_marks(self) -> list[Readings]:
        """Exact peaks the kernel kept since the previous call, one set per device: a
        high-water mark that rose is the highest reading since then, however briefly it
        lasted, where polling at any rate can miss it; left out where there is no mark or it
        did not rise. The child calls it once per record, after ``sample()``."""
        return [{} for _ in self.devices]

    @functools.cached_property
    def layout(self) -> tuple[Signal, ...]:
        """One device's fields in record order."""
        return catalogue.record_layout(self.category, self.signals())

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(catalogue.name_of(s, device) for device in self.devices for s in self.layout)

    @functools.cached_property
    def tracked(self) -> tuple[str, ...]:
        return tuple(catalogue.name_of(s, device) for device in self.devices for s in self._peaked)

    @functools.cached_property
    def averaged(self) -> tuple[str, ...]:
        return tuple(catalogue.name_of(s, device) for device in self.devices for s in self._peaked if s.mean)

    @functools.cached_property
    def _peaked(self) -> tuple[Signal, ...]:
        return tuple(signal for signal in self.layout if signal.peak)

    @functools.cached_property
    def _fields(self) -> tuple[tuple[Signal, Signal | None], ...]:
        """Each of ``layout`` with the counter it is the rate of (None: read, not derived)."""
        return tuple((signal, catalogue.counter_of(signal)) for signal in self.layout)

    def sample(self) -> list[float]:
        """``read_devices()`` laid out as ``names``, with each counter's rate since the previous call."""
        devices = self.read_devices()
        now = monotonic()
        seconds = now - self._counted_at
        rate = catalogue.rate
        values: list[float] = []
        for index, readings in enumerate(devices):
            last = self._counted[index] if index < len(self._counted) else {}
            for signal, counter in self._fields:
                if counter is None:
                    values.append(readings.get(signal, MISSING))
                else:
                    values.append(rate(readings.get(counter, MISSING), last.get(counter, MISSING), seconds))
        self._counted, self._counted_at = tuple(devices), now
        return values

    def sample_tracked(self) -> list[float]:
        """``read_tracked()``, one float per ``tracked`` name."""
        return [readings.get(s, MISSING) for readings in self.read_tracked() for s in self._peaked]

    def marks(self) -> list[float]:
        """``read_marks()``, one float per ``tracked`` name (NaN where there is no mark)."""
        return [readings.get(s, MISSING) for readings in self.read_marks() for s in self._peaked]

    def close(self) -> None:
        """Release what the collector holds (NVML handles); idempotent."""
