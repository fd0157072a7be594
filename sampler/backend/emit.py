"""From a ring record to signals: stamp the step, then feed the sink."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sampler.backend import weightslab as wl_adapter
from sampler.backend.stats import MonitorStats
from sampler.backend.steps import StepStamper
from sampler.quoting import bounded_repr
from sampler.ratelimit import RateLimitedWarning


@dataclass(frozen=True)
class Sample:
    """One logged sample, as ``on_sample`` hooks receive it."""

    step: int
    timestamp_ns: int
    """``time.monotonic_ns()`` when sampling began (comparable across processes)."""
    values: dict[str, float]
    """Signal name -> value; failed readings are absent."""


Sink = Callable[[str, float, int], object]
SampleHook = Callable[[Sample], object]


class Emitter:
    """Logs each record's readings at its step; O(signals) per record.

    A NaN reading failed in the child and is skipped. A sink or hook that
    raises anything at all (``asyncio.CancelledError`` and ``SystemExit``
    included: they are user code's, not ours to obey) is counted and reported
    (rate-limited); it never stops the reader.
    """

    def __init__(
        self, stamper: StepStamper, sink: Sink, stats: MonitorStats, on_sample: SampleHook | None = None
    ) -> None:
        self.stamper = stamper
        self.sink = sink
        self.stats = stats
        self.on_sample = on_sample
        self._failures = RateLimitedWarning()

    def emit(self, fields: Sequence[str], values: Sequence[float], timestamp_ns: int) -> None:
        stats = self.stats
        stats.last_record_monotonic = stats.in_sink_since = time.monotonic()
        wl_adapter.warn_if_weightslab_monitor_running()
        try:
            self._emit(fields, values, timestamp_ns)
        finally:
            stats.in_sink_since = None

    def _emit(self, fields: Sequence[str], values: Sequence[float], timestamp_ns: int) -> None:
        stats = self.stats
        step = self.stamper.stamp(timestamp_ns)
        if step is None:
            stats.records_dropped += 1
            return
        sink = self.sink
        sample: dict[str, float] = {}
        for name, value in zip(fields, values, strict=True):
            if value != value:  # NaN: the reading failed in the collector
                continue
            sample[name] = value
            try:
                sink(name, value, step)
            except BaseException as exc:
                stats.sink_errors += 1
                self._failures.warn(
                    "resource monitor: sink raised %s while logging %s", bounded_repr(exc), name
                )
        stats.signals_logged += len(sample)
        stats.records_logged += 1
        if self.on_sample is not None:
            try:
                self.on_sample(Sample(step, timestamp_ns, sample))
            except BaseException as exc:
                stats.sink_errors += 1
                self._failures.warn("resource monitor: on_sample hook raised %s", bounded_repr(exc))
