"""What both framework callbacks share: a monitor stamped at the trainer's step whose samples wait
for the training thread, which hands each to the framework's loggers in one call.

The monitor thread only appends each sample to a bounded queue (``on_sample``: the emitter already
times it and keeps it from raising into the thread); the loggers, which are not thread-safe and may
be slow (a tracking server's request), are called from the training thread, between steps.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sampler import catalogue
from sampler.api.monitor import ResourceMonitor, get_resource_monitor
from sampler.pipeline.emit import Sample
from sampler.settings.placement import Placement
from sampler.util.quoting import bounded_repr
from sampler.util.ratelimit import RateLimitedWarning

log = logging.getLogger("sampler")

WAITING_SAMPLES = 1024
"""Samples that wait for the training thread at most (17 minutes at the 1 s floor): past it the
oldest are dropped, and the next hand-over says how many."""


def _nowhere(name: str, value: float, step: int) -> None:
    """The sink: the loggers get each sample whole, from the queue, not signal by signal."""


def rank_names(values: dict[str, float], placement: Placement | None) -> dict[str, float]:
    """``values`` as the loggers get them: with several ranks, named with the rank."""
    if placement is None or placement.world_size <= 1:
        return values
    return {catalogue.ranked_name(name, placement.rank): value for name, value in values.items()}


class HandOver:
    """One training's monitor and the samples waiting for the training thread."""

    def __init__(self, framework: str, options: dict[str, Any]) -> None:
        self.framework = framework
        self.options = options
        self.monitor: ResourceMonitor | None = None
        self._waiting: collections.deque[Sample] = collections.deque(maxlen=WAITING_SAMPLES)
        self._received = 0
        self._handed = 0
        self._lock = threading.Lock()
        self._failures = RateLimitedWarning()

    def start(
        self, age_source: Callable[[], object], launcher_env: Mapping[str, str] | None = None
    ) -> ResourceMonitor | None:
        """Start this training's monitor, stamped by ``age_source``, placed by ``launcher_env``
        (``ResourceMonitor``'s); None (and nothing started) when monitoring is disabled or the
        process-wide monitor already samples this process."""
        if self.monitor is not None and self.monitor.running:
            return self.monitor
        if get_resource_monitor() is not None:
            log.warning(
                "resource monitor: the %s callback starts no monitor of its own: the process-wide one "
                "(start_resource_monitor_from_config) already samples this process, and a second "
                "would log every curve twice. Stop it (sampler.stop_resource_monitor()) before "
                "training to have the resources in the trainer's loggers.",
                self.framework,
            )
            return None
        monitor = ResourceMonitor(
            sink=_nowhere,
            age_source=age_source,
            on_sample=self._receive,
            launcher_env=launcher_env,
            **self.options,
        )
        if not monitor.settings.enabled:
            log.info("resource monitor: disabled by configuration")
            return None
        self.monitor = monitor.start()
        return self.monitor

    def stop(self) -> None:
        """Stop the monitor (it takes a last sample, which waits here like the others)."""
        if self.monitor is not None:
            self.monitor.stop()

    def _receive(self, sample: Sample) -> None:
        with self._lock:
            self._received += 1
            self._waiting.append(sample)

    def hand_over(self, receivers: Sequence[Callable[[dict[str, float], int], object]]) -> None:
        """In the training thread: each receiver gets ``(values, step)`` (``log_metrics``' order)
        once per waiting sample, in order. A call that raises is said (rate-limited), and the
        others still get theirs."""
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
            dropped = self._received - self._handed - len(waiting)
            self._handed = self._received
        if dropped:
            log.warning(
                "resource monitor: %d samples waited longer than the %s trainer ran a step and were "
                "dropped (the run store, when configured, has them)",
                dropped,
                self.framework,
            )
        for sample in waiting:
            values = rank_names(sample.values, sample.placement)
            for receive in receivers:
                try:
                    receive(values, sample.step)
                except Exception as exc:
                    self._failures.warn(
                        "resource monitor: a %s logger raised %s at step %d",
                        self.framework,
                        bounded_repr(exc),
                        sample.step,
                    )
