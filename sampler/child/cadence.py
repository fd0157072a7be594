"""Wall-clock sampling schedule shared by the child and the in-thread mode, and the child's
stop flag its sleeps wait on."""

from __future__ import annotations

import threading
import time

FIRST_SAMPLE_MAX_DELAY = 1.0
"""The first sample comes after min(interval, this): rates such as CPU % get a
real window, and a long interval does not delay the first point."""


class Cadence:
    """Due times ``first, first + interval, ...`` on ``time.monotonic``; ticks
    missed because sampling overran are skipped, keeping the phase."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.due = time.monotonic() + min(interval, FIRST_SAMPLE_MAX_DELAY)

    def seconds_left(self) -> float:
        return max(0.0, self.due - time.monotonic())

    def advance(self) -> None:
        self.due += self.interval
        now = time.monotonic()
        if self.due < now:
            self.due += (now - self.due) // self.interval * self.interval + self.interval


def inner_first(records: Cadence, inner: Cadence) -> bool:
    """Whether the next wake-up is for a reading between records (``inner``) rather than the
    record. One due within half an inner interval of the record is left to the record, whose own
    tracked reading takes its place (``record_took``): else the two come a few ms apart, and the
    second reads a window that short (a CPU % of 0 or 100 in the record's mean)."""
    return inner.seconds_left() + inner.interval / 2 < records.seconds_left()


def record_took(inner: Cadence) -> None:
    """The record just made the tracked reading: an inner tick due within half an interval
    from now was its, and the next one comes an interval on."""
    if inner.seconds_left() < inner.interval / 2:
        inner.advance()


class Stop:
    """A flag set once, by another thread, that a sleeping thread wakes for: ``threading.Event``'s
    ``set``, ``is_set`` and ``wait``, the wait one lock acquisition (an Event's runs a
    Condition's Python code, about 20 us more CPU per wake-up in a thread that wakes cold five
    times a second)."""

    def __init__(self) -> None:
        self._set = False
        self._lock = threading.Lock()
        self._lock.acquire()  # held until set

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Whether the flag is set, waiting up to ``timeout`` seconds (>= 0) for it."""
        if self._set:
            return True
        if self._lock.acquire(timeout=timeout):
            self._lock.release()  # every later wait returns at once
            return True
        return False
