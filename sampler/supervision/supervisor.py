"""The ``WL-ResourceMonitor`` thread: keep a sampling child alive, or sample in-thread.

A child that crashes or hangs is replaced with exponential backoff. Each death
is attributed to the collector the child was in (from its status block); a
category that brings the child down ``QUARANTINE_AFTER`` times is left out of
later children so the others keep flowing. Where no child can run at all (no
usable ``/dev/shm``, subprocesses forbidden, a child that never gets going),
the same collectors run in this thread instead.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from sampler.child.cadence import Cadence
from sampler.collectors import Sources, build_collectors
from sampler.collectors.gpu import GpuCollector
from sampler.collectors.gpu_errors import carry
from sampler.collectors.nvml import device_of
from sampler.ipc.channel import ChildParams, PostmortemTarget, PrometheusTarget, StackTarget
from sampler.ipc.status import (
    EXIT_NO_SHARED_MEMORY,
    EXIT_UNDECLARED,
    PHASE_STARTING,
    ChildStatus,
    category_of,
)
from sampler.pipeline.emit import Emitter
from sampler.pipeline.stats import Death, MonitorStats
from sampler.settings.parsers import STALL_OFF
from sampler.settings.table import MonitorSettings
from sampler.supervision import stacks
from sampler.supervision.exposition import Exposition
from sampler.supervision.reader import ChildReader, Outcome
from sampler.supervision.spawn import SamplingChild
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

QUARANTINE_AFTER = 3
"""Deaths attributed to one category before it is quarantined."""
HEALTHY_SECONDS = 10.0
"""A child that lived this long was not crash-looping: its death resets the restart backoff."""
MAX_START_FAILURES = 3
"""Consecutive children dying before their first sample before falling back in-thread."""


@dataclass(frozen=True)
class Plan:
    """What a monitor thread runs: the monitor's settings, unchanged, and what this
    rank derives from them."""

    settings: MonitorSettings
    categories: tuple[str, ...]
    """The categories this rank samples: the enabled ones, less the host-wide ones
    on a rank that leaves them to local rank 0."""
    sources: Sources
    ring_capacity: int
    backoff_base: float
    """Seconds before the first restart of a dead child; doubling up to ``backoff_cap``."""
    backoff_cap: float
    postmortem: PostmortemTarget | None = None
    prometheus: PrometheusTarget | None = None


@dataclass(frozen=True)
class _Fallback:
    reason: str


class Supervisor:
    """Body of the monitor thread; ``child`` is the running child, if any."""

    def __init__(
        self,
        plan: Plan,
        emitter: Emitter,
        stats: MonitorStats,
        stop_fd: int,
        on_exit: Callable[[], None],
        exposition: Exposition | None = None,
    ) -> None:
        self.plan = plan
        self.exposition = exposition
        self.emitter = emitter
        self.stats = stats
        self.stop_fd = stop_fd
        self.on_exit = on_exit
        """Called last on the way out, whatever happened (releases the stop pipe)."""
        self.child: SamplingChild | None = None
        self._strikes: dict[str, int] = {}
        self._sources = plan.sources
        """The plan's sources, and the GPU devices earlier children read and left stopped."""
        self._stacks_fd: int | None = None
        """The stack dump's memory file while children run (``sampler.supervision.stacks``)."""

    def run(self) -> None:
        """The thread's body. Nothing escapes it: an unexpected error is reported
        once, the child and everything it holds are released, and ``stats()``
        says why the monitor stopped."""
        try:
            if self.plan.settings.isolation == "process" and self._supervise():
                return
            self.stats.isolation = "thread"
            if self.plan.prometheus is not None:
                self.stats.prometheus_error = "sampling in the backend thread: the endpoint needs the child"
                log.warning(
                    "resource monitor: no Prometheus endpoint: it is served by the sampling child, and "
                    "this monitor samples in the backend thread"
                )
            self._sample_in_thread()
        except BaseException as exc:
            self.stats.error = bounded_repr(exc)
            log.error(
                "resource monitor: the monitor thread failed and has stopped (%s); "
                "resource signals are no longer logged. Restart it with start().",
                self.stats.error,
                exc_info=True,
            )
        finally:
            self.on_exit()

    def _wait_for_stop(self, seconds: float, sample: bool = False) -> bool:
        """Sleep up to ``seconds`` without the GIL, writing the run store's queue when it
        is due (``sample``: a sample, which writes it too, follows the sleep); True if
        stop() was called."""
        emitter = self.emitter
        watched = [self.stop_fd] + ([emitter.store_wake_fd] if emitter.store_wake_fd is not None else [])
        until = time.monotonic() + seconds
        while True:
            due = emitter.store_due(until if sample else None)
            wake_at = until if due is None else min(until, due)
            ready, _, _ = select.select(watched, [], [], max(0.0, wake_at - time.monotonic()))
            if self.stop_fd in ready:
                return True
            emitter.serve_store(ready, due)
            if time.monotonic() >= until:
                return False

    def _categories(self) -> list[str]:
        return [c for c in self.plan.categories if c not in self.stats.quarantined]

    def _supervise(self) -> bool:
        """Run children until stopped (True) or until none can run (False), with the stack dump
        handler installed for them to ask when the run stalls."""
        watched = self.plan.settings.stall_seconds != STALL_OFF
        self._stacks_fd = stacks.install() if watched else None
        try:
            return self._run_children()
        finally:
            if self._stacks_fd is not None:
                stacks.release()

    def _run_children(self) -> bool:
        failures = start_failures = 0
        while True:
            result = self._run_child()
            if result is None:
                return True
            if isinstance(result, _Fallback):
                log.warning(
                    "resource monitor: %s; sampling in the backend thread instead "
                    "(no crash isolation for NVML from here on)",
                    result.reason,
                )
                return False
            self._attribute(result)
            start_failures = start_failures + 1 if result.cause == "start" else 0
            if start_failures >= MAX_START_FAILURES:
                log.warning(
                    "resource monitor: %d sampling children in a row died before their first sample; "
                    "sampling in the backend thread instead (no crash isolation for NVML from here on)",
                    start_failures,
                )
                return False
            if result.lifetime_seconds >= HEALTHY_SECONDS:
                failures = 0
            failures += 1
            delay = min(self.plan.backoff_cap, self.plan.backoff_base * 2 ** (failures - 1))
            where = f"in the {result.category} collector" if result.category else "outside any collector"
            if result.call is not None:
                where += f", in {result.call}"
            log.warning(
                "resource monitor: sampling child %s %s (%s); restarting it in %g s",
                {"crash": "crashed", "hang": "hung and was killed", "start": "died starting"}[result.cause],
                where,
                result.describe_exit(),
                delay,
            )
            if self._wait_for_stop(delay):
                return True
            self.stats.restarts += 1
            self.stats.restarts_by_cause[result.cause] += 1

    def _run_child(self) -> Death | _Fallback | None:
        """Run one child to its end: how it died, why none can run, or None if stopped."""
        s = self.plan
        try:
            status, status_fd = ChildStatus.create()
        except OSError as exc:
            return _Fallback(f"shared memory is unusable ({exc})")
        stats = self.stats
        status.publish_health(
            stats.restarts_by_cause, stats.records_lost, stats.quarantined, stats.gpu_errors
        )
        params = ChildParams(
            categories=tuple(self._categories()),
            settings=s.settings,
            sources=self._sources,
            backend_pid=os.getpid(),
            capacity=s.ring_capacity,
            postmortem=s.postmortem,
            prometheus=s.prometheus,
            stacks=self._stack_target(),
        )
        child = SamplingChild(params, status_fd, self._stacks_fd)
        reader = ChildReader(
            child,
            status,
            self.stop_fd,
            self.emitter,
            self.stats,
            interval=s.settings.interval_seconds,
            hang_deadline=s.settings.hang_deadline_seconds,
            exposition=self.exposition,
        )
        started = time.monotonic()
        try:
            child.start()
        except OSError as exc:
            status.close()
            return _Fallback(f"cannot start the sampling child ({exc})")
        finally:
            os.close(status_fd)
        self.child = child
        outcome = None
        try:
            outcome = reader.serve()
            if outcome is Outcome.HUNG:
                child.kill()
        finally:
            child.stop()
            self.child = None
            if outcome is Outcome.STOPPED:
                reader.take_last()
            snap = status.read()
            call = status.call()
            self._carry_gpus(reader, status)
            reader.close()
            status.close()
        # The exit status alone cannot be trusted: with SIGCHLD ignored it is
        # unknown. What the child declared in its status block before leaving
        # can; a child that declared nothing was killed.
        declared = None if snap.exit_declared == EXIT_UNDECLARED else snap.exit_declared
        code = child.returncode if child.returncode is not None else declared
        self.stats.child_exit_code = code
        if outcome is Outcome.STOPPED:
            return None
        if declared == EXIT_NO_SHARED_MEMORY:
            return _Fallback("the sampling child cannot create its ring in shared memory")
        phase = reader.hung_phase if reader.hung_phase is not None else snap.phase
        cause = "start" if phase == PHASE_STARTING else "hang" if outcome is Outcome.HUNG else "crash"
        lifetime = time.monotonic() - started
        return Death(cause, category_of(phase), code, lifetime, killed=declared is None, call=call)

    def _stack_target(self) -> StackTarget | None:
        """Who the child asks for stacks (this thread), None when stalls are not watched."""
        if self.plan.settings.stall_seconds == STALL_OFF:
            return None
        signum = stacks.STACK_SIGNAL if self._stacks_fd is not None else None
        return StackTarget(signum, threading.get_native_id(), threading.main_thread().ident or 0)

    def _carry_gpus(self, reader: ChildReader, status: ChildStatus) -> None:
        """Tell the next child which GPU devices this one read and which it left stopped."""
        _, mask, _ = status.gpus()
        carried = carry(self._sources.gpus_read, reader.ring.fields if reader.ring else (), mask)
        if carried is not None:
            self._sources = replace(self._sources, gpus_read=carried[0], gpus_stopped=carried[1])

    def _attribute(self, death: Death) -> None:
        """Count the death against the GPU device it was in, else against its category; at
        ``QUARANTINE_AFTER`` that device or category is left out of later children."""
        self.stats.record_death(death)
        category = death.category
        if category is None:
            return
        device = device_of(death.call) if category == "gpu" and death.call is not None else None
        key = category if device is None else f"GPU {device}"
        self._strikes[key] = strikes = self._strikes.get(key, 0) + 1
        if strikes != QUARANTINE_AFTER:
            return
        latest = death.cause + ("" if death.call is None else f" in {death.call}")
        if device is None:
            self.stats.quarantined = [*self.stats.quarantined, category]
            left_out = f"{category} is quarantined and the other categories keep flowing"
        else:
            self.stats.gpus_quarantined = [*self.stats.gpus_quarantined, device]
            quarantined = (*self._sources.gpus_quarantined, device)
            self._sources = replace(self._sources, gpus_quarantined=quarantined)
            left_out = f"{key} is quarantined and the other GPUs and categories keep flowing"
        log.warning(
            "resource monitor: the %s collector brought the sampling child down %d times%s (latest: %s); "
            "%s. Re-enable it by restarting the monitor (stop() then start(), or restart the backend) "
            "once the cause is fixed.",
            category,
            strikes,
            "" if device is None else f" on {key}",
            latest,
            left_out,
        )

    def _sample_in_thread(self) -> None:
        s, stats = self.plan, self.stats
        collectors = build_collectors(self._categories(), self._sources)
        fields = [name for c in collectors for name in c.names]
        cadence = Cadence(s.settings.interval_seconds)
        gpus = next((c.health for c in collectors if isinstance(c, GpuCollector)), None)
        earlier_gpu_errors = stats.gpu_errors
        try:
            stopped = False
            while not stopped:  # the sample after stop() is the run's last
                stopped = self._wait_for_stop(cadence.seconds_left(), sample=True)
                timestamp_ns = time.monotonic_ns()
                values: list[float] = []
                for collector in collectors:
                    values += collector.sample()
                if gpus is not None:
                    stats.gpus_not_reading, _, stops = gpus.words()
                    stats.gpu_errors = earlier_gpu_errors + stops
                self.stats.records_read += 1
                self.emitter.emit(fields, values, timestamp_ns)
                cadence.advance()
        finally:
            for collector in collectors:
                collector.close()
