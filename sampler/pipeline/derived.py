"""What the backend derives from the step axis, which the child cannot: throughput and each
counter's change per step between consecutive logged records."""

from __future__ import annotations

from collections.abc import Sequence

from sampler import catalogue

THROUGHPUT = catalogue.THROUGHPUT.name
"""Logged with every record but the first of a run: steps per second since the previous logged one."""


def per_step_counters(fields: Sequence[str]) -> tuple[tuple[int, str], ...]:
    """(position in ``fields``, name logged) of each counter whose change per step is
    a signal of its own (``<counter>_per_step`` in the catalogue)."""
    found = []
    for index, name in enumerate(fields):
        reading = catalogue.lookup(name)
        if (
            reading is not None
            and not reading.variant
            and reading.signal.key + catalogue.PER_STEP_SUFFIX in catalogue.SIGNALS
        ):
            found.append((index, name + catalogue.PER_STEP_SUFFIX))
    return tuple(found)


class PerStep:
    """The derived readings of each logged record, from the previous logged one."""

    def __init__(self) -> None:
        self._last_logged: tuple[int, int] | None = None
        """(step, timestamp ns) of the previous logged record: the throughput's start."""
        self._fields: Sequence[str] = ()
        self._per_step: tuple[tuple[int, str], ...] = ()
        """``per_step_counters`` of ``_fields``, the record layout last seen."""
        self._last_counters: list[float] = []
        """Those counters' values in the previous logged record."""

    def derive(
        self, fields: Sequence[str], values: Sequence[float], step: int, timestamp_ns: int
    ) -> list[tuple[str, float]]:
        """(name, value) of what record ``values`` (laid out as ``fields``), logged at ``step``,
        derives: nothing for a run's first logged record, or one whose step or time did not
        move on; a counter's change per step only where ``catalogue.rate`` gives one (neither
        reading failed, and no driver reload in between)."""
        last, self._last_logged = self._last_logged, (step, timestamp_ns)
        if fields is not self._fields:  # a new ring (a child restarted): its layout may differ
            self._fields, self._per_step, self._last_counters = fields, per_step_counters(fields), []
        counters = [values[index] for index, _ in self._per_step] if self._per_step else []
        before, self._last_counters = self._last_counters, counters
        if last is None or step <= last[0] or timestamp_ns <= last[1]:
            return []
        steps = step - last[0]
        derived = [(THROUGHPUT, steps * 1e9 / (timestamp_ns - last[1]))]
        for (_, name), now, then in zip(self._per_step, counters, before, strict=False):
            per_step = catalogue.rate(now, then, steps)
            if per_step == per_step:
                derived.append((name, per_step))
        return derived
