"""From a ring record to signals: stamp the step, feed the sink, record the run."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from sampler import catalogue, signals
from sampler.pipeline import weightslab as wl_adapter
from sampler.pipeline.stats import MonitorStats
from sampler.pipeline.steps import StepStamper
from sampler.pipeline.timing import CallbackTimes
from sampler.settings.placement import Placement
from sampler.store.writer import FLUSH_SECONDS, RunWriter
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


Sink = Callable[[str, float, int], object]
SampleHook = Callable[[Sample], object]

WEIGHTSLAB_CHECK_EVERY = 16
"""Whether WeightsLab's own monitor runs beside this one is asked at the first record
and every this many after it, not at every record."""
SAMPLE_SLACK_SECONDS = 0.25
"""A sample expected no later than this after the run store's queue is due writes the
queue instead (one wake-up, not two); should it be late, the wait for it ends this
long after it was expected."""


class Emitter:
    """Logs each record's readings at its step; O(signals) per record.

    A NaN reading failed in the child and is skipped (one ``sum`` tells a record
    without any). The readings are made a dict only for an ``on_sample`` hook or
    the run store. A sink or hook that raises anything at all
    (``asyncio.CancelledError`` and ``SystemExit`` included: they are user
    code's, not ours to obey) is counted and reported (rate-limited); it never
    stops the reader. With a ``recorder`` (the run store), each record is
    written, before the sink and hook get it, with what the pipeline queued
    since the last, and the reader's waits end for the queue in between
    (``store_due``, ``serve_store``), so a long interval does not hold it back.
    The time the sink, the pipeline's subscribers and the hook take is kept per
    callback and judged against ``interval_seconds`` (``timing``); once
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
        self.recorder = recorder
        self._writer = recorder
        """The store's writer, kept for its ``wake_fd`` should the store be turned off."""
        self.store_wake_fd = recorder.wake_fd if recorder is not None else None
        """Readable once the pipeline logs into an empty queue: waits select on it too."""
        self.placement = placement
        self.stopping = threading.Event()
        """Set by ``stop()``: no sink or hook call after the one under way (the store still
        gets each sample)."""
        self._fan_out = sink is signals.log_signal
        """The sink is the pipeline, whose receivers are timed one by one (``signals.log_batch``)."""
        self._times = CallbackTimes(stats, interval_seconds, sink, on_sample)
        self._failures = RateLimitedWarning()
        self._health: tuple[object, ...] = ()
        self._first = True
        self._emitted = 0
        """Records handed to ``emit`` so far."""
        self._last_logged: tuple[int, int] | None = None
        """(step, timestamp ns) of the previous logged record: the throughput's start."""
        self._fields: Sequence[str] = ()
        self._per_step: tuple[tuple[int, str], ...] = ()
        """``per_step_counters`` of ``_fields``, the record layout last seen."""
        self._last_counters: list[float] = []
        """Those counters' values in the previous logged record."""

    def emit(self, fields: Sequence[str], values: Sequence[float], timestamp_ns: int) -> int | None:
        """Log one record; returns the step it was logged at, None if it was dropped."""
        stats = self.stats
        stats.last_record_monotonic = stats.in_sink_since = time.monotonic()
        if not self._emitted % WEIGHTSLAB_CHECK_EVERY:
            wl_adapter.warn_if_weightslab_monitor_running()
        self._emitted += 1
        try:
            step = self.stamper.stamp(timestamp_ns)
            if step is None:
                stats.records_dropped += 1
                self._record(None, 0, timestamp_ns)
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
            last, self._last_logged = self._last_logged, (step, timestamp_ns)
            if fields is not self._fields:  # a new ring (a child restarted): its layout may differ
                self._fields, self._per_step, self._last_counters = fields, per_step_counters(fields), []
            counters = [values[index] for index, _ in self._per_step] if self._per_step else []
            if last is not None and step > last[0] and timestamp_ns > last[1]:
                throughput = (step - last[0]) * 1e9 / (timestamp_ns - last[1])
                derived = [(THROUGHPUT, throughput)]
                steps = step - last[0]
                pairs = zip(self._per_step, counters, self._last_counters, strict=False)
                for (_, name), now, before in pairs:
                    if now >= before:  # neither NaN, and no driver reload in between
                        derived.append((name, (now - before) / steps))
                readings = itertools.chain(readings, derived)
                logged += len(derived)
            self._last_counters = counters
            hook = self.on_sample
            sample = None
            if hook is not None or self.recorder is not None:  # they take the readings as a dict
                sample = dict(readings)
                readings, logged = sample.items(), len(sample)
            if self.recorder is not None:  # first: a slow sink never holds the store back
                self._record(sample, step, timestamp_ns)
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
        """When (monotonic s) a wait must end to write the run store's queue; None: no
        store, or nothing queued (a point logged then makes ``store_wake_fd`` readable).
        A sample expected at ``next_sample`` (monotonic s) writes the queue itself if it
        comes about when the queue is due, or before: the wait then ends for it (or,
        should it be late, ``SAMPLE_SLACK_SECONDS`` after it), and a sample that soon
        also makes a wake-up for the first point logged needless."""
        recorder = self.recorder
        if recorder is None:
            return None
        now = time.monotonic()
        by_sample = None if next_sample is None else next_sample + SAMPLE_SLACK_SECONDS
        if by_sample is not None and not now < by_sample <= now + FLUSH_SECONDS + SAMPLE_SLACK_SECONDS:
            by_sample = None  # late (it is overdue: wait no more for it), or too far off
        due = recorder.next_flush(wake=by_sample is None)
        if by_sample is not None and (due is None or by_sample <= due + 2 * SAMPLE_SLACK_SECONDS):
            return by_sample
        return due

    def serve_store(self, ready: Collection[int], due: float | None) -> None:
        """After a wait: take a wake-up from ``store_wake_fd`` (in ``ready``), and write
        the run store's queue if ``due`` (from ``store_due`` before the wait) has come."""
        if self._writer is not None and self.store_wake_fd in ready:
            self._writer.woken()
        recorder = self.recorder
        if recorder is not None and due is not None and time.monotonic() >= due:
            self._store(recorder, recorder.flush)

    def _record(self, values: dict[str, float] | None, step: int, timestamp_ns: int) -> None:
        """Hand the sample to the run store, with the monitor's stats when they changed."""
        recorder, stats = self.recorder, self.stats
        if recorder is None:
            return
        health = (stats.restarts, stats.records_lost, stats.quarantined, stats.error, stats.waiting_for)
        changed = health != self._health
        if self._store(
            recorder,
            lambda: recorder.record(values, step, timestamp_ns, stats.snapshot() if changed else None),
        ):
            self._health = health

    def _store(self, recorder: RunWriter, write: Callable[[], None]) -> bool:
        """Run ``write`` on the run store; False, and the store off from here on, if it raised."""
        try:
            write()
        except Exception as exc:  # a bug in the store must not stop the monitoring
            self.recorder = None
            why = bounded_repr(exc)
            self.stats.store_error = f"off after a failure: {why}"
            log.error(
                "resource monitor: the run store failed (%s); it is off from here on", why, exc_info=True
            )
            return False
        self.stats.note_store(recorder)
        return True

    def _warn_if_unheard(self) -> None:
        """Once, at the first sample: say so if its signals reach no one (the
        default sink with no subscriber, no store, no hook, no WeightsLab logger)."""
        if (
            self.sink is signals.log_signal
            and self.recorder is None
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
