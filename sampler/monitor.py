"""``ResourceMonitor`` and the process-wide monitor a backend starts from config."""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from sampler import config, signals
from sampler.emit import Emitter, SampleHook, Sink
from sampler.spawn import STOP_TIMEOUT_SECONDS
from sampler.stats import MonitorStats
from sampler.steps import AgeSource, StepStamper
from sampler.supervisor import Settings, Supervisor

log = logging.getLogger("sampler")

RING_CAPACITY = 1024
"""Records the ring holds: 17 minutes at the 1 s floor before a stalled reader loses any."""
DEFAULT_HANG_DEADLINE_SECONDS = 5.0
"""A collector call running longer than this gets the child killed (independent of the interval)."""
RESTART_BACKOFF_SECONDS = (1.0, 60.0)
"""Delay before restarting a dead child: the first, doubling up to the second."""
_JOIN_SLACK_SECONDS = 1.0


def _resolve_categories(categories: Iterable[str] | Mapping[str, bool] | None) -> tuple[str, ...]:
    if categories is None:
        return config.DEFAULT_CATEGORIES
    if isinstance(categories, Mapping):
        wanted = set(categories)
        enabled = {name for name, on in categories.items() if on}
    else:
        wanted = enabled = set(categories)
    unknown = wanted - set(config.DEFAULT_CATEGORIES)
    if unknown:
        raise ValueError(f"unknown categories {sorted(unknown)}; known: {config.DEFAULT_CATEGORIES}")
    return tuple(c for c in config.DEFAULT_CATEGORIES if c in enabled)


ISOLATION_MODES = ("process", "thread")


class ResourceMonitor:
    """Samples resources in a child process and logs them as ``resource/...`` signals.

    ``interval_seconds`` is clamped to the 1 s floor. ``categories`` is None
    (all), names, or a mapping name -> bool. ``sink(name, value, step)``
    defaults to ``sampler.signals.log_signal``; ``age_source()`` to the model
    given to ``watch_model``. ``on_sample(sample)`` gets each logged
    ``sampler.emit.Sample`` (step, timestamp, values) once, after the sink.
    ``isolation="process"`` (default) samples in a supervised child and falls
    back to ``"thread"`` (sampling in the monitor thread itself) when no child
    can run. A collector call that takes longer than ``hang_deadline_seconds``
    gets the child killed and restarted. Use as a context manager or call
    ``start()``/``stop()``.
    """

    def __init__(
        self,
        interval_seconds: float = config.DEFAULT_INTERVAL_SECONDS,
        categories: Iterable[str] | Mapping[str, bool] | None = None,
        disk_path: str = config.DEFAULT_DISK_PATH,
        step_source: str = config.DEFAULT_STEP_SOURCE,
        sink: Sink | None = None,
        age_source: AgeSource | None = None,
        nvml_module: str = "pynvml",
        *,
        isolation: str = "process",
        hang_deadline_seconds: float = DEFAULT_HANG_DEADLINE_SECONDS,
        on_sample: SampleHook | None = None,
        _min_interval_seconds: float = config.MIN_INTERVAL_SECONDS,
        _ring_capacity: int = RING_CAPACITY,
        _restart_backoff: tuple[float, float] = RESTART_BACKOFF_SECONDS,
    ) -> None:
        interval_seconds = _positive("interval_seconds", interval_seconds)
        if interval_seconds < _min_interval_seconds:
            log.warning(
                "resource monitor: interval_seconds=%r is below the %g s floor; using %g",
                interval_seconds,
                _min_interval_seconds,
                _min_interval_seconds,
            )
            interval_seconds = _min_interval_seconds
        if step_source not in config.STEP_SOURCES:
            raise ValueError(f"step_source must be one of {config.STEP_SOURCES}, got {step_source!r}")
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
        self.interval_seconds = float(interval_seconds)
        self.categories = _resolve_categories(categories)
        self.disk_path = os.path.abspath(disk_path)
        self.step_source = step_source
        self.sink: Sink = sink or signals.log_signal
        self.age_source = age_source
        self.nvml_module = nvml_module
        self.isolation = isolation
        self.hang_deadline_seconds = _positive("hang_deadline_seconds", hang_deadline_seconds)
        self.on_sample = on_sample
        self._ring_capacity = _ring_capacity
        self._restart_backoff = _restart_backoff
        self._lock = threading.Lock()
        self._stats = MonitorStats()
        self._supervisor: Supervisor | None = None
        self._thread: threading.Thread | None = None
        self._stop_w: int | None = None

    @property
    def child_pid(self) -> int | None:
        """Pid of the sampling child while it runs, else None."""
        supervisor = self._supervisor
        child = supervisor.child if supervisor is not None else None
        return child.pid if child is not None and child.exit_code() is None else None

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self) -> ResourceMonitor:
        """Start the monitor thread (which launches the child); returns at once,
        and is a no-op while running. The first sample follows within
        min(interval, 1 s) plus the child's start-up. Nothing here raises for
        an unusable platform: the monitor falls back to sampling in-thread."""
        with self._lock:
            if self._thread is not None:
                return self
            self._stats = MonitorStats(isolation=self.isolation)
            settings = Settings(
                interval=self.interval_seconds,
                categories=self.categories,
                disk_path=self.disk_path,
                nvml_module=self.nvml_module,
                isolation=self.isolation,
                hang_deadline=self.hang_deadline_seconds,
                ring_capacity=self._ring_capacity,
                backoff_base=self._restart_backoff[0],
                backoff_cap=self._restart_backoff[1],
            )
            stop_r, self._stop_w = os.pipe()
            stamper = StepStamper(self.step_source, self.age_source, time.monotonic_ns())
            emitter = Emitter(stamper, self.sink, self._stats, self.on_sample)
            self._supervisor = Supervisor(settings, emitter, self._stats, stop_r)
            self._thread = threading.Thread(
                target=self._supervisor.run, name="WL-ResourceMonitor", daemon=True
            )
            self._thread.start()
            atexit.register(self.stop)
            return self

    def stop(self) -> None:
        """Stop the child and the thread; idempotent. Returns within about 2 s
        even if the child is stuck in a driver call or the sink is slow."""
        with self._lock:
            thread, supervisor, stop_w = self._thread, self._supervisor, self._stop_w
            if thread is None or supervisor is None or stop_w is None:
                return
            self._thread = self._stop_w = None
            atexit.unregister(self.stop)
            os.write(stop_w, b"x")  # never read: every later wait of the thread sees it
            os.close(stop_w)
            child = supervisor.child
            if child is not None:
                child.request_stop()
            thread.join(STOP_TIMEOUT_SECONDS + _JOIN_SLACK_SECONDS)
            if thread.is_alive():
                # The sink (or an in-thread collector) holds the thread; it reaps
                # the child and releases shared memory when that call returns.
                child = supervisor.child
                if child is not None:
                    child.kill()
                log.warning(
                    "resource monitor: the monitor thread is busy in a call; it ends after it returns"
                )
            self._supervisor = None

    def stats(self) -> dict[str, Any]:
        """Counters and health: records read/logged/dropped/lost, signals logged,
        sink errors, restarts (total and by cause), recent child deaths with the
        collector each was attributed to, quarantined categories, isolation in
        use, the child's CPU seconds per sample, its pid, and the seconds since
        the last record."""
        out = self._stats.snapshot()
        out["child_pid"] = self.child_pid
        out["running"] = self.running
        return out

    def __enter__(self) -> ResourceMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _positive(name: str, value: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


_singleton_lock = threading.Lock()
_singleton: ResourceMonitor | None = None


def start_resource_monitor_from_config() -> ResourceMonitor | None:
    """Start the process-wide monitor from ``load_resource_monitoring_config()``.

    Idempotent: returns the running monitor if there is one. None when
    monitoring is disabled. Never raises for bad configuration.
    """
    global _singleton
    with _singleton_lock:
        if _singleton is not None:
            return _singleton
        cfg = config.load_resource_monitoring_config()
        if not cfg["enabled"]:
            log.info("resource monitor: disabled by configuration")
            return None
        monitor = ResourceMonitor(
            interval_seconds=cfg["interval_seconds"],
            categories=cfg["categories"],
            disk_path=cfg["disk_path"],
            step_source=cfg["step_source"],
        )
        _singleton = monitor.start()
        return _singleton


def get_resource_monitor() -> ResourceMonitor | None:
    """The process-wide monitor, or None."""
    return _singleton


def stop_resource_monitor() -> None:
    """Stop the process-wide monitor and forget it."""
    global _singleton
    with _singleton_lock:
        monitor, _singleton = _singleton, None
    if monitor is not None:
        monitor.stop()
