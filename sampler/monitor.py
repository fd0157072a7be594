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

from ringbuf.segment import new_name
from sampler import config, signals
from sampler.emit import Emitter, SampleHook, Sink
from sampler.reader import Reader
from sampler.spawn import STOP_TIMEOUT_SECONDS, SamplingChild
from sampler.stats import MonitorStats
from sampler.steps import AgeSource, StepStamper

log = logging.getLogger("sampler")

RING_CAPACITY = 1024
"""Records the ring holds: 17 minutes at the 1 s floor before a stalled reader loses any."""
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


class ResourceMonitor:
    """Samples resources in a child process and logs them as ``resource/...`` signals.

    ``interval_seconds`` is clamped to the 1 s floor. ``categories`` is None
    (all), names, or a mapping name -> bool. ``sink(name, value, step)``
    defaults to ``sampler.signals.log_signal``; ``age_source()`` to the model
    given to ``watch_model``. ``on_sample(step, {name: value})`` is called once
    per logged sample, after the sink. Use as a context manager or call
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
        on_sample: SampleHook | None = None,
        _min_interval_seconds: float = config.MIN_INTERVAL_SECONDS,
    ) -> None:
        if isinstance(interval_seconds, bool) or not math.isfinite(interval_seconds) or interval_seconds <= 0:
            raise ValueError(f"interval_seconds must be a finite number > 0, got {interval_seconds!r}")
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
        self.interval_seconds = float(interval_seconds)
        self.categories = _resolve_categories(categories)
        self.disk_path = os.path.abspath(disk_path)
        self.step_source = step_source
        self.sink: Sink = sink or signals.log_signal
        self.age_source = age_source
        self.nvml_module = nvml_module
        self.on_sample = on_sample
        self._lock = threading.Lock()
        self._stats = MonitorStats()
        self._child: SamplingChild | None = None
        self._thread: threading.Thread | None = None
        self._stop_w: int | None = None

    @property
    def child_pid(self) -> int | None:
        """Pid of the sampling child while it runs, else None."""
        child = self._child
        return child.pid if child is not None and child.exit_code() is None else None

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self) -> ResourceMonitor:
        """Launch the child and the reader thread; returns at once (no-op if running).

        The first sample follows within min(interval, 1 s) plus the child's
        start-up. A child that cannot be launched is reported, never raised.
        """
        with self._lock:
            if self._thread is not None:
                return self
            self._stats = MonitorStats()
            child = SamplingChild(
                {
                    "ring": new_name(),
                    "capacity": RING_CAPACITY,
                    "interval": self.interval_seconds,
                    "categories": list(self.categories),
                    "disk_path": self.disk_path,
                    "pid": os.getpid(),
                    "nvml_module": self.nvml_module,
                }
            )
            try:
                child.start()
            except OSError as exc:
                log.warning("resource monitor: cannot start the sampling child (%s); monitoring is off", exc)
                return self
            stop_r, self._stop_w = os.pipe()
            stamper = StepStamper(self.step_source, self.age_source, time.monotonic_ns())
            emitter = Emitter(stamper, self.sink, self._stats, self.on_sample)
            reader = Reader(child, stop_r, emitter, self._stats)
            self._child = child
            self._thread = threading.Thread(target=reader.run, name="WL-ResourceMonitor", daemon=True)
            self._thread.start()
            atexit.register(self.stop)
            return self

    def stop(self) -> None:
        """Stop the child and the thread; idempotent, returns within about 2 s even
        if the child is stuck or the sink is slow."""
        with self._lock:
            thread, child, stop_w = self._thread, self._child, self._stop_w
            if thread is None or child is None or stop_w is None:
                return
            self._thread = self._child = self._stop_w = None
            atexit.unregister(self.stop)
            os.write(stop_w, b"x")
            os.close(stop_w)
            child.request_stop()
            thread.join(STOP_TIMEOUT_SECONDS + _JOIN_SLACK_SECONDS)
            if thread.is_alive():
                # The sink is holding the thread; the thread reaps the child and
                # releases the ring when the sink returns.
                child.kill()
                log.warning(
                    "resource monitor: the sink is still busy; the reader thread ends after it returns"
                )

    def stats(self) -> dict[str, Any]:
        """Counters: records read/logged/dropped/lost, signals logged, sink
        errors, restarts, quarantined categories, child pid, time since the last record."""
        out = self._stats.snapshot()
        out["child_pid"] = self.child_pid
        out["running"] = self.running
        return out

    def __enter__(self) -> ResourceMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
