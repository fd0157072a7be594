"""What the overhead benchmark measures: workloads, modes, intervals, sizes, and the key of a cell."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

from sampler.child.peaks import PeakTracker
from sampler.collectors import Sources, build_collectors

MODES = ("off", "thread", "process")
FLOOR_MODES = ("floor", "store")
"""Idle backend only: the bare woken thread, and the isolated monitor with the run store on."""
LOG_MODES = ("log", "log+store")
"""GIL-bound loop at the 1 s floor only: it logs its loss every step through ``log_signal``,
with the isolated monitor running, without and with the run store."""
ALL_MODES = MODES + FLOOR_MODES + LOG_MODES
WORKLOADS = ("idle", "gil", "numpy", "latency")
TRAINING = ("gil", "numpy", "latency")
"""The workloads that train (all but the idle backend)."""
NON_GPU = ("cpu", "memory", "disk", "network", "process")


def signals_per_sample(categories: tuple[str, ...]) -> int:
    """What the isolated monitor logs per sample with ``categories`` on this machine: each
    collector's readings (a machine with swap has more memory signals, one without disk
    counters fewer disk signals), their peaks and means, and the throughput."""
    sources = Sources(disk_path=os.path.abspath(os.sep), pid=os.getpid(), nvml_module="pynvml")
    collectors = build_collectors(categories, sources)
    try:
        readings = sum(len(c.names) for c in collectors)
        return readings + len(PeakTracker(collectors, 1).names) + 1
    finally:
        for collector in collectors:
            collector.close()


FLOOR_SIGNALS = signals_per_sample(NON_GPU)
"""Sink calls per wake of the floor thread: the signals of one sample with the non-GPU categories
above, as this machine gives them (27 without swap)."""
FLOOR = 1.0
STRESS = 0.01
"""The stress interval: 100 samples/s, below the floor only benchmarks may use, so that
per-sample costs rise above the run-to-run noise of a shared machine."""
INTERVALS = (FLOOR, STRESS)


@dataclass(frozen=True)
class Profile:
    rounds: int
    seconds: float
    """Length of one measured run."""
    scaling_seconds: float
    devices: tuple[int, ...] = (1, 8, 64)
    intervals: tuple[float, ...] = INTERVALS
    floor_only: bool = False
    """Only the idle backend against the floor (floor, isolated, isolated with the store), no scaling."""


QUICK = Profile(rounds=2, seconds=1.2, scaling_seconds=1.0)
FULL = Profile(rounds=5, seconds=5.0, scaling_seconds=3.0)


class CellKey(NamedTuple):
    """One cell of the matrix: a workload at an interval in a mode."""

    workload: str
    interval: float
    """Seconds between samples."""
    mode: str

    @property
    def label(self) -> str:
        """The key as the JSON report spells it, e.g. ``gil@1s/off``."""
        return f"{self.workload}@{self.interval:g}s/{self.mode}"


def interval_label(interval: float) -> str:
    """An interval as the report spells it, e.g. ``0.01s``."""
    return f"{interval:g}s"


def modes_for(workload: str, interval: float, profile: Profile | None = None) -> tuple[str, ...]:
    """The modes measured for one workload at one interval, in their order within a round."""
    if profile is not None and profile.floor_only:
        return ("process", *FLOOR_MODES) if workload == "idle" else ()
    if workload == "idle":
        return ("thread", "process", *FLOOR_MODES)  # "off" would measure nothing
    if workload == "gil" and interval == FLOOR:
        return MODES + LOG_MODES
    return MODES
