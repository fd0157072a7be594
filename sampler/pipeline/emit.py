"""From a ring record to signals: stamp the step, feed the sink and the hook (the run store's
side is ``store_feed``'s, what the step axis derives ``derived``'s)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from sampler import signals
from sampler.pipeline import weightslab as wl_adapter
from sampler.pipeline.derived import PerStep
from sampler.pipeline.phases import PhaseShares, PhaseTotals
from sampler.pipeline.stats import MonitorStats
from sampler.pipeline.steps import StepStamper, watched_phases
from sampler.pipeline.store_feed import StoreFeed
from sampler.pipeline.timing import CallbackTimes
from sampler.settings.placement import Placement
from sampler.store.writer import RunWriter
from sampler.util.quoting import bounded_repr
from sampler.util.ratelimit import RateLimitedWarning

log = logging.getLogger("sampler")


@dataclass(frozen=True)
class Sample:
    """One logged sample, as ``on_sample`` hooks receive it."""

    step: int
    timestamp_ns: int
    """``time.monotonic_ns()`` when sampling began (comparable across processes)."""
    values: dict[str, float]
    """Signal name -> value; failed readings are absent."""
    placement: Placement | None = None
    """The host and rank of the backend that logged it."""


Sink = Callable[[str, float, int], object]
SampleHook = Callable[[Sample], object]

WEIGHTSLAB_CHECK_EVERY = 16
"""Whether WeightsLab's own monitor runs beside this one is asked at the first record
and every this many after it, not at every record."""


class Emitter:
    """Logs each record's readings at its step; O(signals) per record.

    A NaN reading failed in the child and is skipped (one ``sum`` tells a record
    without any). The readings are made a dict only for an ``on_sample`` hook or
    the run store. A sink or hook that raises anything at all
    (``asyncio.CancelledError`` and ``SystemExit`` included: they are user
    code's, not ours to obey) is counted and reported (rate-limited); it never
    stops the reader. With a ``recorder`` (the run store), each record is
    written, before the sink and hook get it (``StoreFeed``), with what the pipeline
    queued since the last, and the reader's waits end for the queue in between
    (``store_due``, ``serve_store``), so a long interval does not hold it back.
    Each logged record brings what the step axis derives (``PerStep``) and the watched
    module's step phases since the previous one (``PhaseShares``).
    The time the model's age source, the sink, the pipeline's subscribers and the hook
    take is kept per callback and judged against ``interval_seconds`` (``timing``); once
    ``stopping`` is set, they are called no more.
    """

    def __init__(
        self,
        stamper: StepStamper,
        sink: Sink,
        stats: MonitorStats,
        on_sample: SampleHook | None = None,
        recorder: RunWriter | None = None,
        placement: Placement | None = None,
        interval_seconds: float | None = None,
    ) -> None:
        self.stamper = stamper
        self.sink = sink
        self.stats = stats
        self.on_sample = on_sample
        self.store = StoreFeed(recorder, stats)
        self.store_wake_fd = self.store.wake_fd
        """Readable once the pipeline logs into an empty queue: waits select on it too."""
        self.placement = placement
        self.stopping = threading.Event()
        """Set by ``stop()``: no sink or hook call after the one under way (the store still
        gets each sample)."""
        self._fan_out = sink is signals.log_signal
        """The sink is the pipeline, whose receivers are timed one by one (``signals.log_batch``)."""
        self._times = CallbackTimes(stats, interval_seconds, sink, on_sample, stamper.age_source)
        self._asks_age = stamper.step_source != "seconds"
        """Each sample's step comes from the model's age: user code, timed like the sink."""
        self._failures = RateLimitedWarning()
        self._first = True
        self._emitted = 0
        """Records handed to ``emit`` so far."""
        self._per_step = PerStep()
        self._phase_shares = PhaseShares()
        self.phase_totals: PhaseTotals | None = None
        """The watched module's phase totals as of the last logged record (None: none is watched),
        for the reader to publish to the child's endpoint."""

    def emit(self, fields: Sequence[str], values: Sequence[float], timestamp_ns: int) -> int | None:
        """Log one record; returns the step it was logged at, None if it was dropped."""
        stats = self.stats
        stats.last_record_monotonic = stats.in_sink_since = time.monotonic()
        if not self._emitted % WEIGHTSLAB_CHECK_EVERY:
            wl_adapter.warn_if_weightslab_monitor_running()
        self._emitted += 1
        try:
            if self._asks_age:
                start = time.perf_counter()
                step = self.stamper.stamp(timestamp_ns)
                self._times.spent.append((self.stamper.age_source, time.perf_counter() - start))
            else:
                step = self.stamper.stamp(timestamp_ns)
            if step is None:
                stats.records_dropped += 1
                self.store.record(None, 0, timestamp_ns)
                self._times.end_sample(0)
                return None
            total = sum(values)
            readings: Iterable[tuple[str, float]]
            if total == total:  # no NaN: every reading succeeded
                readings = zip(fields, values, strict=True)
                logged = len(values)
            else:  # a NaN reading failed in the collector
                readings = [
                    (name, value) for name, value in zip(fields, values, strict=True) if value == value
                ]
                logged = len(readings)
            derived = self._per_step.derive(fields, values, step, timestamp_ns)
            phases = watched_phases()
            derived += self._phase_shares.derive(phases)
            self.phase_totals = None if phases is None else phases.totals
            if derived:
                readings = itertools.chain(readings, derived)
                logged += len(derived)
            hook, store = self.on_sample, self.store
            sample = None
            if hook is not None or store.recorder is not None:  # they take the readings as a dict
                sample = dict(readings)
                readings, logged = sample.items(), len(sample)
            if store.recorder is not None:  # first: a slow sink never holds the store back
                store.record(sample, step, timestamp_ns)
            stopping, spent, sink = self.stopping.is_set, self._times.spent, self.sink
            if self._fan_out:  # the pipeline: its receivers are timed one by one
                whole = signals.log_batch(readings, step, spent, stopping)
            else:
                whole, start = True, time.perf_counter()
                for name, value in readings:
                    if stopping():
                        whole = False
                        break
                    try:
                        sink(name, value, step)
                    except BaseException as exc:
                        stats.sink_errors += 1
                        self._failures.warn(
                            "resource monitor: sink raised %s while logging %s", bounded_repr(exc), name
                        )
                spent.append((sink, time.perf_counter() - start))
            if hook is not None and sample is not None and whole:
                if stopping():
                    whole = False
                else:
                    start = time.perf_counter()
                    try:
                        hook(Sample(step, timestamp_ns, sample, self.placement))
                    except BaseException as exc:
                        stats.sink_errors += 1
                        self._failures.warn("resource monitor: on_sample hook raised %s", bounded_repr(exc))
                    spent.append((hook, time.perf_counter() - start))
            self._times.end_sample(logged)
            if not whole:  # stop() came meanwhile
                stats.records_unsent_at_stop += 1
                return step
            stats.signals_logged += logged
            stats.records_logged += 1
            if self._first:
                self._first = False
                self._warn_if_unheard()
            return step
        finally:
            stats.in_sink_since = None

    def store_due(self, next_sample: float | None) -> float | None:
        """``StoreFeed.due``: when a wait must end to write the run store's queue."""
        return self.store.due(next_sample)

    def serve_store(self, ready: Collection[int], due: float | None) -> None:
        """``StoreFeed.serve``: after a wait, write the run store's queue if it is due."""
        self.store.serve(ready, due)

    def _warn_if_unheard(self) -> None:
        """Once, at the first sample: say so if its signals reach no one (the
        default sink with no subscriber, no store, no hook, no WeightsLab logger)."""
        if (
            self.sink is signals.log_signal
            and self.store.recorder is None
            and self.on_sample is None
            and not signals.has_subscribers()
            and not wl_adapter.forwarding()
        ):
            log.warning(
                "resource monitor: the resource signals reach no one: no sink, no subscriber, no run "
                "store and no WeightsLab logger. Keep them with ResourceMonitor(store='runs.sqlite') "
                "(or WL_RESOURCE_MONITOR_STORE, or store: in the YAML), sampler.signals.subscribe(fn), "
                "or a sink such as sink=writer.add_scalar."
            )
