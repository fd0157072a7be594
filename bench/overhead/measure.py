"""One measured run (a workload in a mode at an interval), and the rounds that interleave them."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import fake_driver  # from tests/, on the path (bench.overhead's __init__): the fake NVIDIA driver
import numpy as np
import psutil

import sampler
from bench.overhead.floor import Floor
from bench.overhead.plan import (
    FLOOR,
    FLOOR_SIGNALS,
    LOG_MODES,
    NON_GPU,
    STRESS,
    WORKLOADS,
    CellKey,
    Profile,
    modes_for,
)
from bench.overhead.workloads import noop_sink, run_workload, time_log_signal

MONITOR_THREAD = "WL-ResourceMonitor"
START_TIMEOUT_SECONDS = 60.0


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class Run:
    workload: str
    mode: str
    interval: float
    categories: tuple[str, ...]
    devices: int = 0
    seconds: float = 0.0
    steps: int = 0
    steps_per_second: float | None = None
    step_ms_p50: float | None = None
    step_ms_p99: float | None = None
    step_ms_max: float | None = None
    samples: int = 0
    backend_cpu_ms_per_sample: float | None = None
    """Backend process CPU clock per sample (idle runs: monitoring alone)."""
    monitor_thread_cpu_ms_per_sample: float | None = None
    """CPU of the WL-ResourceMonitor thread alone, per sample (any workload)."""
    child_cpu_ms_per_sample: float | None = None
    child_rss_mb: float | None = None
    latency_ms: list[float] = field(default_factory=list)
    """Sample-to-sink latency of every sample (not in the JSON summary)."""
    start_ms: float | None = None
    first_sample_ms: float | None = None
    signals_per_sample: float | None = None
    log_call_us: float | None = None
    """CPU of one ``log_signal`` call in the training thread (log modes), timed after the run."""
    store_points: int | None = None
    """Points the run store holds at stop (store modes)."""

    @property
    def key(self) -> CellKey:
        return CellKey(self.workload, self.interval, self.mode)


def _thread_clock(name: str) -> int | None:
    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            return time.pthread_getcpuclockid(thread.ident)
    return None


def _wait(condition: Callable[[], object], what: str, stop: Callable[[], None]) -> None:
    """Poll ``condition`` (every 1 ms) for up to ``START_TIMEOUT_SECONDS``; else ``stop()`` and raise."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            stop()
            raise RuntimeError(f"{what} within {START_TIMEOUT_SECONDS:g} s")
        time.sleep(0.001)


def _start_floor(run: Run, began: float) -> Floor:
    floor = Floor(run.interval)
    if not floor.first.wait(START_TIMEOUT_SECONDS):
        floor.stop()
        raise RuntimeError(f"the floor thread was not woken within {START_TIMEOUT_SECONDS:g} s")
    run.first_sample_ms = (time.perf_counter() - began) * 1e3
    return floor


def _start_monitor(
    run: Run, began: float, store: str | None, latencies: list[float]
) -> sampler.ResourceMonitor:
    def on_sample(sample: sampler.Sample) -> None:
        latencies.append((time.monotonic_ns() - sample.timestamp_ns) / 1e6)

    monitor = sampler.ResourceMonitor(
        interval_seconds=run.interval,
        categories=run.categories,
        sink=noop_sink,
        step_source="seconds",
        isolation="thread" if run.mode == "thread" else "process",
        # The idle backend measures what the monitor costs as users run it: with no hook,
        # which would make a dict and a Sample of every record the floor has no part in.
        on_sample=None if run.workload == "idle" else on_sample,
        store=store,
        _min_interval_seconds=min(run.interval, FLOOR),
    )
    monitor.start()
    run.start_ms = (time.perf_counter() - began) * 1e3
    _wait(
        lambda: monitor.stats()["records_logged"],
        f"no sample ({run.mode}, {run.workload})",
        monitor.stop,
    )
    run.first_sample_ms = (time.perf_counter() - began) * 1e3
    if store is not None:  # the first write opens the store (schema, runs row): start-up, not per sample
        _wait(lambda: monitor.stats()["store_points_written"], "the store was not written", monitor.stop)
    return monitor


def measure(
    workload: str,
    mode: str,
    interval: float,
    seconds: float,
    categories: tuple[str, ...] = NON_GPU,
    devices: int = 0,
) -> Run:
    run = Run(workload, mode, interval, categories, devices)
    latencies: list[float] = []
    monitor = floor = None
    store_dir = tempfile.TemporaryDirectory(prefix="bench-store-") if "store" in mode else None
    began = time.perf_counter()
    if mode == "floor":
        floor = _start_floor(run, began)
    elif mode != "off":
        store = None if store_dir is None else os.path.join(store_dir.name, "runs.sqlite")
        monitor = _start_monitor(run, began, store, latencies)
    try:
        latencies.clear()
        thread_clock = _thread_clock(Floor.THREAD if floor is not None else MONITOR_THREAD)
        thread_cpu0 = time.clock_gettime(thread_clock) if thread_clock is not None else None
        child_pid = monitor.child_pid if monitor is not None else None
        stats0 = monitor.stats() if monitor is not None else {}
        floor0 = floor.samples if floor is not None else 0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        durations = run_workload(workload, seconds, log_loss=mode in LOG_MODES)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        stats1 = monitor.stats() if monitor is not None else {}
        if floor is not None:
            samples = floor.samples - floor0
        else:
            samples = stats1.get("records_logged", 0) - stats0.get("records_logged", 0)
        run.latency_ms = list(latencies)
        if thread_clock is not None and thread_cpu0 is not None and samples:
            thread_ms = (time.clock_gettime(thread_clock) - thread_cpu0) * 1e3
            run.monitor_thread_cpu_ms_per_sample = thread_ms / samples
        if monitor is not None and samples:
            run.signals_per_sample = (stats1["signals_logged"] - stats0["signals_logged"]) / samples
        if mode in LOG_MODES:
            run.log_call_us = time_log_signal()
        if monitor is not None and child_pid is not None:
            # The child's own precise clock (psutil's per-process times tick at 10 ms).
            per_sample = monitor.stats()["child_cpu_seconds_per_sample"]
            run.child_cpu_ms_per_sample = None if per_sample is None else per_sample * 1e3
            with contextlib.suppress(psutil.Error):
                run.child_rss_mb = psutil.Process(child_pid).memory_info().rss / 1024**2
    finally:
        if monitor is not None:
            monitor.stop()
        if floor is not None:
            floor.stop()
        if store_dir is not None:
            if monitor is not None:
                run.store_points = monitor.stats()["store_points_written"]
            store_dir.cleanup()
    if floor is not None:
        run.signals_per_sample = FLOOR_SIGNALS
    run.seconds = wall1 - wall0
    run.samples = samples
    if workload == "idle" and samples:
        run.backend_cpu_ms_per_sample = (cpu1 - cpu0) * 1e3 / samples
    if durations:
        ms = [d * 1e3 for d in durations]
        run.steps = len(durations)
        run.steps_per_second = len(durations) / run.seconds
        run.step_ms_p50, run.step_ms_p99, run.step_ms_max = percentile(ms, 50), percentile(ms, 99), max(ms)
    return run


def run_matrix(profile: Profile, log: Callable[[str], None]) -> list[Run]:
    """Every cell once per round, in the same order each round."""
    runs = []
    for round_no in range(profile.rounds):
        for workload in WORKLOADS:
            for interval in profile.intervals:
                for mode in modes_for(workload, interval, profile):
                    runs.append(measure(workload, mode, interval, profile.seconds))
        log(f"round {round_no + 1}/{profile.rounds} done")
    return runs


class _Environ:
    """``os.environ`` as the fake driver sets it (``monkeypatch.setenv``'s signature)."""

    def setenv(self, name: str, value: str) -> None:
        os.environ[name] = value


def run_scaling(profile: Profile, log: Callable[[str], None]) -> list[Run]:
    """Idle backend at the stress interval: 1, 8 and 64 fake GPUs, then all categories against one."""
    if profile.floor_only:
        return []
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        saved = {name: os.environ.get(name) for name in (fake_driver.CONTROL_ENV, "LD_LIBRARY_PATH")}
        fake_driver.load()  # the thread mode reads NVML in this process, which started without the path
        driver = fake_driver.Driver(Path(scratch), _Environ())
        try:
            for devices in profile.devices:
                driver.configure(devices=[{}] * devices)
                for mode in ("thread", "process"):
                    runs.append(measure("idle", mode, STRESS, profile.scaling_seconds, ("gpu",), devices))
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    for categories in (NON_GPU, ("cpu",)):
        for mode in ("thread", "process"):
            runs.append(measure("idle", mode, STRESS, profile.scaling_seconds, categories))
    log("scaling done")
    return runs
