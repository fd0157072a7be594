"""The training-like workloads: each runs for ``seconds`` and returns per-step durations (s)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import numpy as np

import sampler


def _run_steps(step: Callable[[], object], seconds: float) -> list[float]:
    durations: list[float] = []
    clock = time.perf_counter
    end = clock() + seconds
    while True:
        began = clock()
        if began >= end:
            return durations
        step()
        durations.append(clock() - began)


def gil_step() -> int:
    """~1 ms of pure Python (on this machine): the GIL is held throughout."""
    total = 0
    for i in range(30_000):
        total += i % 7
    return total


_A = np.random.default_rng(0).random((192, 192))


def numpy_step() -> float:
    """~0.15 ms of matrix work that releases the GIL inside BLAS."""
    return float((_A @ _A).sum())


def latency_step() -> int:
    """~50 us of pure Python: short steps whose tail shows monitoring stalls."""
    total = 0
    for i in range(2_500):
        total += i
    return total


STEPS: dict[str, Callable[[], float]] = {"gil": gil_step, "numpy": numpy_step, "latency": latency_step}


def logging_loss(step: Callable[[], float]) -> Callable[[], float]:
    """``step``, then its result logged as the loss through the pipeline, as a training loop would."""
    log_signal = sampler.signals.log_signal
    counter = itertools.count()

    def logged() -> float:
        loss = step()
        log_signal("train/loss", loss, next(counter))
        return loss

    return logged


def run_workload(workload: str, seconds: float, log_loss: bool = False) -> list[float]:
    if workload == "idle":
        time.sleep(seconds)
        return []
    step = STEPS[workload]
    return _run_steps(logging_loss(step) if log_loss else step, seconds)


def noop_sink(name: str, value: float, step: int) -> None:
    """The sink of every measured monitor and of the floor."""


def time_log_signal(calls: int = 20_000) -> float:
    """CPU per ``log_signal`` call in this thread (us), with whatever listens to the pipeline now:
    a direct measure of what logging adds to every training step, free of run-to-run noise."""
    log_signal = sampler.signals.log_signal
    began = time.thread_time()
    for step in range(calls):
        log_signal("train/loss", 0.5, step)
    return (time.thread_time() - began) * 1e6 / calls
