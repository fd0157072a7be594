"""Every ``resource/...`` signal, once: what the collectors, the exporters and the views say of it.

``SIGNALS`` holds one ``Signal`` per name, keyed by the name less ``resource/`` (a GPU's
with ``<i>`` for the NVML index: ``gpu/<i>/power_watts``), in display order: categories
as ``CATEGORIES`` (the small ones first), then each category's signals. ``lookup`` reads
a recorded name (``resource/gpu/3/utilization_percent_peak``) against it. The README's
tables of signals and of Prometheus metrics are ``signals_table()`` and ``metrics_table()``.
Signal names never change; labels, titles and the units shown may.

The entries the collectors read are named (``GPU_POWER``): a collector keys its readings by
them, ``record_layout`` lays them out as a record, and ``rate`` (``rates`` over arrays, for the
views) is the one rule a counter's ``_per_second`` is derived by. No other module writes a
signal's name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Container, Iterable
from dataclasses import dataclass

import numpy as np

PREFIX = "resource/"
"""What every resource signal's name starts with."""
DEVICE = "<i>"
"""Stands for the device's label in a GPU signal's key: its NVML index, or for a MIG device
``<index>-mig<slot>`` (its parent GPU's index and its slot there)."""
DEVICE_LABEL = re.compile(r"(\d+)(?:-mig(\d+))?")
"""A device label: a GPU's NVML index, or ``<index>-mig<slot>`` for one of its MIG devices."""
GPU_KEY_PREFIX = f"gpu/{DEVICE}/"
"""A GPU signal's key is this and its suffix (``power_watts``)."""
GPU_NAME_PREFIX = PREFIX + GPU_KEY_PREFIX.removesuffix(f"{DEVICE}/")
"""What a GPU signal's recorded name starts with, its device label next (``resource/gpu/``)."""
PEAK = "peak"
MEAN = "mean"
VARIANTS = (PEAK, MEAN)
PEAK_SUFFIX = "_" + PEAK
"""``<name>_peak``: the highest reading since the previous logged record."""
MEAN_SUFFIX = "_" + MEAN
"""``<name>_mean``: the mean of the readings over the same window."""
RATE_SUFFIX = "_per_second"
"""``<counter>_per_second``: the counter's change per second between consecutive samples."""
PER_STEP_SUFFIX = "_per_step"
"""``<counter>_per_step``: the counter's change per training step between consecutive logged
records, derived by the backend (which alone knows the steps)."""

GAUGE = "gauge"
COUNTER = "counter"
"""Cumulative: only rises (since boot, since the cgroup was made, or since the backend started)."""
RATE = "rate"
"""A counter's ``_per_second``."""
KINDS = (GAUGE, COUNTER, RATE)

UNITS = (
    "%",
    "MiB",
    "GiB",
    "bytes",
    "MiB/s",
    "bytes/s",
    "MHz",
    "°C",
    "W",
    "J",
    "J/step",
    "s",
    "s/s",
    "cores",
    "threads",
    "processes",
    "0/1",
    "bitmask",
    "XID",
    "steps/s",
)
"""The units signals are in: MiB and GiB are 1024² and 1024³ bytes (every ``_mb`` and ``_gb``)."""

RESOLUTION: dict[str, int] = {
    "%": 1000,
    "MiB": 1024,
    "GiB": 1024**2,
    "bytes": 1,
    "MiB/s": 1024,
    "bytes/s": 1,
    "MHz": 1,
    "°C": 1,
    "W": 1000,
    "J": 1000,
    "J/step": 1000,
    "s": 1_000_000,
    "s/s": 1_000_000,
    "cores": 1000,
    "threads": 1,
    "processes": 1,
    "0/1": 1,
    "bitmask": 1,
    "XID": 1,
    "steps/s": 1_000_000,
}
"""Unit -> how many steps of the run store's resolution make one unit: a reading is stored as
the whole number ``round(value * RESOLUTION[unit])`` (% to 0.001, MiB and GiB to 1 KiB, MiB/s to
1 KiB/s, W and J to 1 mW and 1 mJ, s to 1 µs, steps/s to 10⁻⁶; whole bytes, MHz, °C as NVML
reads them, counts and codes), so a value with no finer part than that reads back exactly."""

MIB = 1024**2
GIB = 1024**3
PERCENT_TO_RATIO = 0.01
METRIC_PREFIX = "wl_resource_"
"""What every Prometheus metric of this package is named from."""

DEFAULT_CATEGORIES: tuple[str, ...] = (
    "cpu",
    "memory",
    "gpu",
    "disk",
    "network",
    "process",
    "process_tree",
    "container",
    "pressure",
)
"""Every category, in sampling order (the status block's quarantine bits follow it: append only)."""
DERIVED_CATEGORIES: tuple[str, ...] = ("progress",)
"""Categories of signals the backend derives from the step axis, not sampled by the child."""


@dataclass(frozen=True, eq=False)
class Signal:
    """One signal: its unit and kind, its ``_peak``/``_mean``, its metric, title and label.

    Each is one object, compared and hashed as such: collectors key their readings by it."""

    key: str
    """The name less ``resource/``; a GPU's with ``<i>`` for its index."""
    unit: str
    """One of ``UNITS``."""
    kind: str
    """``gauge``, ``counter`` or ``rate``."""
    title: str
    """Its plot panel's title, unique."""
    label: str
    """Its row's label in ``top``, unique within its category."""
    what: str
    """What it measures, one sentence (the README's and Prometheus' help)."""
    peak: bool = False
    """Records carry ``<name>_peak``: it is also read between records, at the inner rate."""
    mean: bool = False
    """Records carry ``<name>_mean`` too (only beside a peak)."""
    metric: str | None = None
    """Its Prometheus metric less ``wl_resource_``; None: not exported (a rate, ``rate()``'s job)."""
    scale: float | None = None
    """The value times this is the metric's, in its base unit; None: not exported."""
    seed: bool = False
    """One of the seed's signals: its name and meaning are kept as they were."""
    host_wide: bool = False
    """The same value on every rank of a host although its category is per rank: the
    endpoint exports it only from the rank that samples the host-wide categories."""
    shown_as: str | None = None
    """A counter with no ``_per_second``: the key of the gauge that is its rate already (CPU
    seconds' CPU %, 100 per core), which the views show in its place; that gauge goes
    unexported, as a rate does (``rate()`` of the counter is Prometheus' own)."""

    @property
    def derived(self) -> bool:
        """Computed by the backend from the step axis (``DERIVED_CATEGORIES``, ``_per_step``): the
        child's endpoint cannot export it (``rate(wl_resource_model_age[1m])`` is throughput's metric)."""
        return self.category in DERIVED_CATEGORIES or self.key.endswith(PER_STEP_SUFFIX)

    @property
    def name(self) -> str:
        """``resource/<key>``."""
        return PREFIX + self.key

    @property
    def category(self) -> str:
        """What its key starts with: ``cpu``, ``gpu`` ..."""
        return self.key.split("/", 1)[0]

    @property
    def suffix(self) -> str:
        """Its key after the category (and a GPU's ``<i>/``): ``power_watts``."""
        return self.key.rpartition("/")[2]

    @property
    def variants(self) -> tuple[str, ...]:
        """``peak`` and ``mean`` where records carry them."""
        return tuple(v for v, has in ((PEAK, self.peak), (MEAN, self.mean)) if has)


def _gpu(
    suffix: str,
    unit: str,
    title: str,
    label: str,
    what: str,
    metric: str | None,
    kind: str = GAUGE,
    peak: bool = False,
    mean: bool = False,
    seed: bool = False,
) -> Signal:
    """A GPU signal (a gauge unless ``kind`` says otherwise), exported with the scale its unit
    takes to base units (% to a ratio, MHz to Hz); ``metric`` None: not exported."""
    scale = None if metric is None else {"%": PERCENT_TO_RATIO, "MHz": 1e6, "MiB/s": MIB}.get(unit, 1.0)
    key = GPU_KEY_PREFIX + suffix
    return Signal(
        key, unit, kind, title, label, what, peak=peak, mean=mean, metric=metric, scale=scale, seed=seed
    )


THROTTLE_REASONS = (
    ("sw_power_cap", "power cap", "the software power cap"),
    ("hw_power_brake", "power brake", "the hardware power brake"),
    ("sw_thermal", "sw thermal", "software thermal slowdown"),
    ("hw_thermal", "hw thermal", "hardware thermal slowdown"),
)
"""The clocks event reasons whose time NVML counts (``NVML_FI_DEV_CLOCKS_EVENT_REASON_*``):
the part of ``throttled_<part>_seconds``, a short label, what slows the clocks."""


STEP_PHASES = (
    (
        "input",
        "waiting for input",
        "waiting for its next batch (in the DataLoader's iterator, else "
        "between the previous optimizer step and the forward pass)",
    ),
    ("forward", "forward", "in the watched model's forward pass"),
    (
        "backward",
        "backward",
        "from the forward pass's end to the optimizer step: the loss, the backward "
        "pass and, in data-parallel training, the wait for the gradients' collective",
    ),
    ("optimizer", "optimizer", "in the optimizer's step"),
    (
        "other",
        "other",
        "elsewhere: host work between the phases (logging, synchronizing with the GPU, evaluation)",
    ),
)
"""The phases a training step is timed in by ``watch_model``'s hooks: name, short label, where
the loop was. Their shares of a step add up to 100 %."""


def _phase_shares() -> tuple[Signal, ...]:
    """Per step phase: its share of the steps since the previous logged record."""
    return tuple(
        Signal(
            f"progress/{phase}_percent",
            "%",
            GAUGE,
            f"step time {label}",
            label,
            f"Share of the watched model's steps since the previous logged record spent {where}.",
        )
        for phase, label, where in STEP_PHASES
    )


def _throttled(part: str) -> str:
    """The suffix of reason ``part``'s cumulative time throttled."""
    return f"throttled_{part}_seconds"


def _throttle_durations() -> tuple[Signal, ...]:
    """Per reason: the driver's cumulative time throttled, and its share of each interval."""
    signals: list[Signal] = []
    for part, label, cause in THROTTLE_REASONS:
        suffix = _throttled(part)
        signals += [
            _gpu(
                suffix,
                "s",
                f"GPU time throttled by {label}",
                f"{label} s",
                f"Time {cause} held the GPU's clocks down, counted by the driver (since it loaded).",
                metric=f"gpu_throttled_{part}_seconds_total",
                kind=COUNTER,
            ),
            _gpu(
                suffix + RATE_SUFFIX,
                "s/s",
                f"GPU share throttled by {label}",
                f"{label} s/s",
                f"Share of the time since the previous sample that {cause} held the clocks down "
                "(measured by the driver, not sampled: a burst between samples counts).",
                metric=None,
                kind=RATE,
            ),
        ]
    return tuple(signals)


# fmt: off
_SIGNALS = (
    CPU_UTILIZATION := Signal(
        "cpu/utilization_percent", "%", GAUGE, "CPU utilization", "utilization",
        "System-wide CPU busy since the previous sample (every core busy: 100 %).",
        peak=True, mean=True, metric="cpu_utilization_ratio", scale=PERCENT_TO_RATIO, seed=True,
    ),
    MEMORY_USED := Signal(
        "memory/system_utilization_percent", "%", GAUGE, "system memory used", "system used",
        "System memory in use.",
        peak=True, metric="memory_utilization_ratio", scale=PERCENT_TO_RATIO, seed=True,
    ),
    SWAP_USED := Signal(
        "memory/swap_used_mb", "MiB", GAUGE, "swap used", "swap used",
        "Swap space in use (only where the machine has swap).",
        metric="memory_swap_used_bytes", scale=MIB,
    ),
    SWAPPED_IN := Signal(
        "memory/swapped_in_mb", "MiB", COUNTER, "swapped in", "swapped in",
        "Read back from swap since boot: memory the machine had pushed out and needed again.",
        metric="memory_swapped_in_bytes_total", scale=MIB,
    ),
    SWAPPED_OUT := Signal(
        "memory/swapped_out_mb", "MiB", COUNTER, "swapped out", "swapped out",
        "Written out to swap since boot.",
        metric="memory_swapped_out_bytes_total", scale=MIB,
    ),
    SWAPPED_IN_RATE := Signal(
        "memory/swapped_in_mb_per_second", "MiB/s", RATE, "swap-in rate", "swapped in /s",
        "Read back from swap per second since the previous sample.",
    ),
    SWAPPED_OUT_RATE := Signal(
        "memory/swapped_out_mb_per_second", "MiB/s", RATE, "swap-out rate", "swapped out /s",
        "Written out to swap per second since the previous sample.",
    ),
    NETWORK_SENT := Signal(
        "network/bytes_sent", "bytes", COUNTER, "network sent", "sent",
        "Bytes sent over every interface since boot.",
        metric="network_sent_bytes_total", scale=1.0, seed=True,
    ),
    NETWORK_RECEIVED := Signal(
        "network/bytes_received", "bytes", COUNTER, "network received", "received",
        "Bytes received over every interface since boot.",
        metric="network_received_bytes_total", scale=1.0, seed=True,
    ),
    NETWORK_SENT_RATE := Signal(
        "network/bytes_sent_per_second", "bytes/s", RATE, "network send rate", "sent /s",
        "Bytes sent per second since the previous sample.",
    ),
    NETWORK_RECEIVED_RATE := Signal(
        "network/bytes_received_per_second", "bytes/s", RATE, "network receive rate", "received /s",
        "Bytes received per second since the previous sample.",
    ),
    DISK_FULL := Signal(
        "disk/utilization_percent", "%", GAUGE, "disk full", "full",
        "Share of the disk_path filesystem in use.",
        metric="disk_utilization_ratio", scale=PERCENT_TO_RATIO, seed=True,
    ),
    DISK_USED := Signal(
        "disk/utilization_gb", "GiB", GAUGE, "disk used", "used",
        "Space used on the disk_path filesystem.",
        metric="disk_used_bytes", scale=GIB, seed=True,
    ),
    DISK_READ := Signal(
        "disk/read_mb", "MiB", COUNTER, "disk reads", "read",
        "Read from every disk since boot.",
        metric="disk_read_bytes_total", scale=MIB, seed=True,
    ),
    DISK_WRITTEN := Signal(
        "disk/written_mb", "MiB", COUNTER, "disk writes", "written",
        "Written to every disk since boot.",
        metric="disk_written_bytes_total", scale=MIB, seed=True,
    ),
    DISK_READ_RATE := Signal(
        "disk/read_mb_per_second", "MiB/s", RATE, "disk read rate", "read /s",
        "Read per second since the previous sample.",
    ),
    DISK_WRITTEN_RATE := Signal(
        "disk/written_mb_per_second", "MiB/s", RATE, "disk write rate", "written /s",
        "Written per second since the previous sample.",
    ),
    PROCESS_CPU := Signal(
        "process/cpu_utilization_percent", "%", GAUGE, "process CPU (100 % per core)", "CPU",
        "The backend's CPU use (each busy core: 100 %).",
        peak=True, mean=True, seed=True,
    ),
    PROCESS_CPU_SECONDS := Signal(
        "process/cpu_seconds", "s", COUNTER, "process CPU time", "CPU time",
        "CPU time (user + system) the backend has used since it started.",
        metric="process_cpu_seconds_total", scale=1.0, shown_as="process/cpu_utilization_percent",
    ),
    PROCESS_THREADS := Signal(
        "process/cpu_threads_in_use", "threads", GAUGE, "process threads", "threads",
        "The backend's threads.",
        metric="process_threads", scale=1.0, seed=True,
    ),
    PROCESS_RSS := Signal(
        "process/memory_in_use_mb", "MiB", GAUGE, "process memory (RSS)", "memory (RSS)",
        "The backend's resident memory (RSS).",
        peak=True, mean=True, metric="process_memory_in_use_bytes", scale=MIB, seed=True,
    ),
    PROCESS_RSS_PERCENT := Signal(
        "process/memory_in_use_percent", "%", GAUGE, "process memory (% of RAM)", "memory % of RAM",
        "The backend's RSS over system memory.",
        metric="process_memory_in_use_ratio", scale=PERCENT_TO_RATIO, seed=True,
    ),
    PROCESS_MEMORY_AVAILABLE := Signal(
        "process/memory_available_mb", "MiB", GAUGE, "system memory available", "memory available",
        "System memory available, as the backend sees it.",
        metric="process_memory_available_bytes", scale=MIB, seed=True, host_wide=True,
    ),
    PROCESS_CPU_WAIT := Signal(
        "process/cpu_wait_percent", "%", GAUGE, "process CPU wait", "CPU wait",
        "Share of the time since the previous sample that the backend's main thread was ready to run "
        "but waited for a CPU (the kernel's schedstat).",
        metric="process_cpu_wait_ratio", scale=PERCENT_TO_RATIO,
    ),
    PROCESS_CORES := Signal(
        "process/cpu_cores_allowed", "cores", GAUGE, "process CPUs allowed", "CPUs allowed",
        "CPUs the backend may run on (its affinity), which its workers inherit.",
        metric="process_cpu_cores_allowed", scale=1.0,
    ),
    TREE_PROCESSES := Signal(
        "process_tree/process_count", "processes", GAUGE, "processes in the tree", "processes",
        "The backend and its descendants (DataLoader and compile workers), never the sampling child.",
        metric="process_tree_processes", scale=1.0,
    ),
    TREE_CPU := Signal(
        "process_tree/cpu_utilization_percent", "%", GAUGE, "tree CPU (100 % per core)", "CPU",
        "CPU use of the backend and its descendants, summed (each busy core: 100 %).",
        peak=True, mean=True,
    ),
    TREE_CPU_SECONDS := Signal(
        "process_tree/cpu_seconds", "s", COUNTER, "tree CPU time", "CPU time",
        "CPU time (user + system) of the backend and its descendants, those that exited too where a "
        "process of the tree waited for them; never falls.",
        metric="process_tree_cpu_seconds_total", scale=1.0,
        shown_as="process_tree/cpu_utilization_percent",
    ),
    TREE_MEMORY := Signal(
        "process_tree/memory_in_use_mb", "MiB", GAUGE, "tree memory (PSS)", "memory (PSS)",
        "PSS of the backend and its descendants, summed: pages they share count once.",
        peak=True, mean=True, metric="process_tree_memory_in_use_bytes", scale=MIB,
    ),
    CONTAINER_MEMORY_LIMIT := Signal(
        "container/memory_limit_mb", "MiB", GAUGE, "container memory limit", "memory limit",
        "The cgroup's memory limit (only under one).",
        metric="container_memory_limit_bytes", scale=MIB,
    ),
    CONTAINER_MEMORY_USED := Signal(
        "container/memory_used_mb", "MiB", GAUGE, "container memory used", "memory used",
        "Memory the cgroup uses (only under a memory limit).",
        peak=True, metric="container_memory_used_bytes", scale=MIB,
    ),
    CONTAINER_MEMORY_PERCENT := Signal(
        "container/memory_used_percent", "%", GAUGE, "container memory (% of limit)", "memory % of limit",
        "Memory the cgroup uses over its limit.",
        metric="container_memory_used_ratio", scale=PERCENT_TO_RATIO,
    ),
    CONTAINER_CPU_QUOTA := Signal(
        "container/cpu_quota_cores", "cores", GAUGE, "container CPU quota", "CPU quota",
        "The cgroup's CPU quota (only under one).",
        metric="container_cpu_quota_cores", scale=1.0,
    ),
    CONTAINER_CPU_THROTTLED := Signal(
        "container/cpu_throttled_seconds", "s", COUNTER, "container CPU throttled", "CPU throttled",
        "Time the cgroup's CPU was throttled (only under a CPU quota).",
        metric="container_cpu_throttled_seconds_total", scale=1.0,
    ),
    CONTAINER_CPU_THROTTLED_RATE := Signal(
        "container/cpu_throttled_seconds_per_second", "s/s", RATE, "container CPU throttled rate",
        "CPU throttled /s", "Throttled seconds per second since the previous sample.",
    ),
    PRESSURE_CPU_SOME := Signal(
        "pressure/cpu_some_percent", "%", GAUGE, "CPU pressure (some)", "CPU some",
        "Share of the time since the previous sample the host had a task waiting for a CPU.",
        metric="pressure_cpu_some_ratio", scale=PERCENT_TO_RATIO, host_wide=True,
    ),
    PRESSURE_MEMORY_SOME := Signal(
        "pressure/memory_some_percent", "%", GAUGE, "memory pressure (some)", "memory some",
        "Share of the time since the previous sample the host had a task stalled on memory.",
        metric="pressure_memory_some_ratio", scale=PERCENT_TO_RATIO, host_wide=True,
    ),
    PRESSURE_MEMORY_FULL := Signal(
        "pressure/memory_full_percent", "%", GAUGE, "memory pressure (full)", "memory full",
        "Share of the time since the previous sample the host had every non-idle task stalled on memory.",
        metric="pressure_memory_full_ratio", scale=PERCENT_TO_RATIO, host_wide=True,
    ),
    PRESSURE_IO_SOME := Signal(
        "pressure/io_some_percent", "%", GAUGE, "I/O pressure (some)", "I/O some",
        "Share of the time since the previous sample the host had a task waiting for I/O.",
        metric="pressure_io_some_ratio", scale=PERCENT_TO_RATIO, host_wide=True,
    ),
    PRESSURE_IO_FULL := Signal(
        "pressure/io_full_percent", "%", GAUGE, "I/O pressure (full)", "I/O full",
        "Share of the time since the previous sample the host had every non-idle task waiting for I/O.",
        metric="pressure_io_full_ratio", scale=PERCENT_TO_RATIO, host_wide=True,
    ),
    PRESSURE_CGROUP_CPU_SOME := Signal(
        "pressure/cgroup_cpu_some_percent", "%", GAUGE, "cgroup CPU pressure (some)", "cgroup CPU some",
        "Share of the time since the previous sample the backend's cgroup had a task waiting for a CPU.",
        metric="pressure_cgroup_cpu_some_ratio", scale=PERCENT_TO_RATIO,
    ),
    PRESSURE_CGROUP_MEMORY_SOME := Signal(
        "pressure/cgroup_memory_some_percent", "%", GAUGE, "cgroup memory pressure (some)",
        "cgroup memory some",
        "Share of the time since the previous sample the backend's cgroup had a task stalled on memory.",
        metric="pressure_cgroup_memory_some_ratio", scale=PERCENT_TO_RATIO,
    ),
    PRESSURE_CGROUP_MEMORY_FULL := Signal(
        "pressure/cgroup_memory_full_percent", "%", GAUGE, "cgroup memory pressure (full)",
        "cgroup memory full",
        "Share of the time since the previous sample the backend's cgroup had every non-idle task "
        "stalled on memory.",
        metric="pressure_cgroup_memory_full_ratio", scale=PERCENT_TO_RATIO,
    ),
    PRESSURE_CGROUP_IO_SOME := Signal(
        "pressure/cgroup_io_some_percent", "%", GAUGE, "cgroup I/O pressure (some)", "cgroup I/O some",
        "Share of the time since the previous sample the backend's cgroup had a task waiting for I/O.",
        metric="pressure_cgroup_io_some_ratio", scale=PERCENT_TO_RATIO,
    ),
    PRESSURE_CGROUP_IO_FULL := Signal(
        "pressure/cgroup_io_full_percent", "%", GAUGE, "cgroup I/O pressure (full)", "cgroup I/O full",
        "Share of the time since the previous sample the backend's cgroup had every non-idle task "
        "waiting for I/O.",
        metric="pressure_cgroup_io_full_ratio", scale=PERCENT_TO_RATIO,
    ),
    THROUGHPUT := Signal(
        "progress/steps_per_second", "steps/s", GAUGE, "training throughput", "steps /s",
        "Steps per second between this logged record and the previous one (from the step axis).",
    ),
    STEP_SECONDS := Signal(
        "progress/step_seconds", "s", GAUGE, "step time", "step s",
        "Mean time of the training steps the watched model completed since the previous logged record "
        "(from one optimizer step's end to the next's).",
    ),
    *(PHASE_SHARES := _phase_shares()),
    DEVICE_SHARE := Signal(
        "progress/device_percent", "%", GAUGE, "step time on the GPU", "on GPU",
        "Share of those steps' time the GPU spent on their work, from CUDA events (where CUDA runs).",
    ),
    GPU_UTILIZATION := _gpu(
        "utilization_percent", "%", "GPU utilization", "util",
        "Time a kernel ran on the GPU (its peak also from the driver's own sample buffer).",
        metric="gpu_utilization_ratio", peak=True, mean=True, seed=True,
    ),
    GPU_MEMORY_PERCENT := _gpu(
        "memory_allocated_percent", "%", "GPU memory full", "mem %",
        "GPU memory in use over its total.",
        metric="gpu_memory_allocated_ratio", seed=True,
    ),
    GPU_MEMORY_USED := _gpu(
        "memory_allocated_bytes", "bytes", "GPU memory allocated", "memory",
        "GPU memory in use (every process).",
        metric="gpu_memory_allocated_bytes", peak=True, seed=True,
    ),
    GPU_POWER := _gpu(
        "power_watts", "W", "GPU power", "power",
        "GPU power draw (its peak from the driver's own sample buffer, where it keeps one).",
        metric="gpu_power_watts", peak=True, seed=True,
    ),
    GPU_TEMPERATURE := _gpu(
        "temperature_celsius", "°C", "GPU temperature", "temp",
        "GPU temperature.",
        metric="gpu_temperature_celsius", seed=True,
    ),
    GPU_SM_CLOCK := _gpu(
        "sm_clock_mhz", "MHz", "GPU SM clock", "sm clock",
        "The GPU's SM clock (its peak from the driver's own sample buffer, where it keeps one).",
        metric="gpu_sm_clock_hertz", peak=True, seed=True,
    ),
    GPU_MEMORY_CLOCK := _gpu(
        "memory_clock_mhz", "MHz", "GPU memory clock", "mem clock",
        "The GPU's memory clock.",
        metric="gpu_memory_clock_hertz", seed=True,
    ),
    GPU_PROCESS_MEMORY := _gpu(
        "process_memory_bytes", "bytes", "GPU memory of the backend", "own mem",
        "GPU memory the backend holds.",
        metric="gpu_process_memory_bytes", peak=True,
    ),
    GPU_TREE_MEMORY := _gpu(
        "tree_memory_bytes", "bytes", "GPU memory of the process tree", "tree mem",
        "GPU memory the backend and its descendants hold.",
        metric="gpu_process_tree_memory_bytes",
    ),
    GPU_POWER_LIMIT := _gpu(
        "power_limit_watts", "W", "GPU power limit", "power cap",
        "The enforced GPU power limit.",
        metric="gpu_power_limit_watts",
    ),
    GPU_THROTTLE_REASONS := _gpu(
        "clock_throttle_reasons", "bitmask", "GPU throttle reasons (NVML bitmask)", "thr reasons",
        "NVML's clocks event reasons (nvmlClocksEventReason bits), as a number.",
        metric="gpu_clock_event_reasons",
    ),
    GPU_THROTTLE_POWER := _gpu(
        "throttle_power", "0/1", "GPU power throttling", "pwr thr",
        "1 while a power cap or power brake slows the clocks.",
        metric="gpu_throttle_power",
    ),
    GPU_THROTTLE_THERMAL := _gpu(
        "throttle_thermal", "0/1", "GPU thermal throttling", "heat thr",
        "1 while a software or hardware thermal slowdown slows the clocks.",
        metric="gpu_throttle_thermal",
    ),
    GPU_THROTTLE_HW_SLOWDOWN := _gpu(
        "throttle_hw_slowdown", "0/1", "GPU hardware slowdown", "hw slow",
        "1 while hardware slowdown is engaged.",
        metric="gpu_throttle_hw_slowdown",
    ),
    *_throttle_durations(),
    GPU_ENERGY := _gpu(
        "energy_joules", "J", "GPU energy", "energy",
        "Energy the GPU used since its driver loaded (NVML's total energy counter, Volta and later; "
        "absent where the driver has none, never estimated).",
        metric="gpu_energy_joules_total", kind=COUNTER,
    ),
    GPU_ENERGY_RATE := _gpu(
        "energy_joules" + RATE_SUFFIX, "W", "GPU mean power", "mean power",
        "Mean power since the previous sample, from the energy counter: exact where power_watts is "
        "one reading.",
        metric=None, kind=RATE,
    ),
    GPU_XID := _gpu(
        "xid_critical", "XID", "GPU critical XID error", "xid",
        "The latest critical XID error the driver reported for the GPU since the previous sample (0: "
        "none; 79: fell off the bus, 48: double-bit ECC, 13 and 43: a kernel fault), from NVML's events.",
        metric="gpu_xid_critical",
    ),
    GPU_SM_ACTIVITY := _gpu(
        "sm_activity_percent", "%", "GPU SM activity (GPM)", "sm active",
        "Share of the time the SMs were busy since the previous sample (GPM, Hopper and later): unlike "
        "utilization, a GPU waiting in a collective reads low.",
        metric="gpu_sm_activity_ratio",
    ),
    GPU_SM_OCCUPANCY := _gpu(
        "sm_occupancy_percent", "%", "GPU SM occupancy (GPM)", "occupancy",
        "Warps resident on the SMs over the most they can hold, since the previous sample (GPM).",
        metric="gpu_sm_occupancy_ratio",
    ),
    GPU_TENSOR_ACTIVITY := _gpu(
        "tensor_activity_percent", "%", "GPU tensor core activity (GPM)", "tensor",
        "Share of the time the tensor cores were busy since the previous sample (GPM).",
        metric="gpu_tensor_activity_ratio",
    ),
    GPU_DRAM_BANDWIDTH := _gpu(
        "dram_bandwidth_percent", "%", "GPU memory bandwidth used (GPM)", "dram bw",
        "DRAM bandwidth used over its peak since the previous sample (GPM).",
        metric="gpu_dram_bandwidth_ratio",
    ),
    GPU_PCIE_SENT := _gpu(
        "pcie_tx_mb_per_second", "MiB/s", "GPU PCIe sent (GPM)", "pcie tx",
        "PCIe traffic from the GPU since the previous sample (GPM).",
        metric="gpu_pcie_sent_bytes_per_second",
    ),
    GPU_PCIE_RECEIVED := _gpu(
        "pcie_rx_mb_per_second", "MiB/s", "GPU PCIe received (GPM)", "pcie rx",
        "PCIe traffic to the GPU since the previous sample (GPM).",
        metric="gpu_pcie_received_bytes_per_second",
    ),
    GPU_NVLINK_SENT := _gpu(
        "nvlink_tx_mb_per_second", "MiB/s", "GPU NVLink sent (GPM)", "nvlink tx",
        "NVLink traffic from the GPU over all its links since the previous sample (GPM).",
        metric="gpu_nvlink_sent_bytes_per_second",
    ),
    GPU_NVLINK_RECEIVED := _gpu(
        "nvlink_rx_mb_per_second", "MiB/s", "GPU NVLink received (GPM)", "nvlink rx",
        "NVLink traffic to the GPU over all its links since the previous sample (GPM).",
        metric="gpu_nvlink_received_bytes_per_second",
    ),
    GPU_ENERGY_PER_STEP := _gpu(
        "energy_joules" + PER_STEP_SUFFIX, "J/step", "GPU energy per step", "J/step",
        "Energy the GPU used per training step between this logged record and the previous one.",
        metric=None,
    ),
)
# fmt: on

SIGNALS: dict[str, Signal] = {signal.key: signal for signal in _SIGNALS}
"""Key (``cpu/utilization_percent``, ``gpu/<i>/power_watts``) -> its signal, in display order."""
RANKS = {key: rank for rank, key in enumerate(SIGNALS)}
"""Key -> its place in display order."""
CATEGORIES = tuple(dict.fromkeys(signal.category for signal in _SIGNALS))
"""The categories in display order: the small ones first, gpu last."""
THROTTLED = {part: SIGNALS[GPU_KEY_PREFIX + _throttled(part)] for part, _, _ in THROTTLE_REASONS}
"""Each ``THROTTLE_REASONS`` part's cumulative time throttled (its counter)."""


def rate_of(signal: Signal) -> Signal | None:
    """A counter's ``_per_second``; None for any other signal, or a counter without one."""
    if signal.kind != COUNTER:
        return None
    return SIGNALS.get(signal.key + RATE_SUFFIX)


def counter_of(signal: Signal) -> Signal | None:
    """The counter whose ``_per_second`` ``signal`` is; None for any other signal."""
    if signal.kind != RATE:
        return None
    counter = SIGNALS.get(signal.key.removesuffix(RATE_SUFFIX))
    return counter if counter is not None and counter.kind == COUNTER else None


def sampled(category: str) -> tuple[Signal, ...]:
    """The signals of ``category`` a collector reads (gauges and counters, neither rates, which
    are derived from their counters, nor what the backend derives), in display order."""
    return tuple(s for s in _SIGNALS if s.category == category and s.kind != RATE and not s.derived)


RECORD_ORDER: dict[str, tuple[Signal, ...]] = {
    "process": (
        PROCESS_CPU, PROCESS_THREADS, PROCESS_RSS, PROCESS_RSS_PERCENT, PROCESS_MEMORY_AVAILABLE,
        PROCESS_CORES, PROCESS_CPU_WAIT, PROCESS_CPU_SECONDS,
    ),
    "process_tree": (TREE_PROCESSES, TREE_CPU, TREE_MEMORY, TREE_CPU_SECONDS),
    "gpu": (
        GPU_MEMORY_CLOCK, GPU_SM_CLOCK, GPU_MEMORY_USED, GPU_MEMORY_PERCENT, GPU_TEMPERATURE,
        GPU_UTILIZATION, GPU_POWER, GPU_PROCESS_MEMORY, GPU_TREE_MEMORY, GPU_THROTTLE_REASONS,
        GPU_THROTTLE_POWER, GPU_THROTTLE_THERMAL, GPU_THROTTLE_HW_SLOWDOWN, GPU_POWER_LIMIT,
        *THROTTLED.values(), *(SIGNALS[s.key + RATE_SUFFIX] for s in THROTTLED.values()),
        GPU_ENERGY, GPU_ENERGY_RATE, GPU_XID,
        GPU_SM_ACTIVITY, GPU_SM_OCCUPANCY, GPU_TENSOR_ACTIVITY, GPU_DRAM_BANDWIDTH,
        GPU_PCIE_SENT, GPU_PCIE_RECEIVED, GPU_NVLINK_SENT, GPU_NVLINK_RECEIVED,
    ),
}  # fmt: skip
"""The categories whose records keep an order of their own (their first releases'), not the
display order; a signal added to one of them goes after these."""


def record_layout(category: str, read: Iterable[Signal]) -> tuple[Signal, ...]:
    """The fields of a record of ``category`` from a collector that reads ``read`` (gauges and
    counters): those, and each counter's ``_per_second``, in record order (``RECORD_ORDER``, or
    the display order)."""
    wanted = set(read)
    wanted |= {rate for signal in wanted if (rate := rate_of(signal)) is not None}
    first = RECORD_ORDER.get(category, ())
    order = (*first, *(s for s in _SIGNALS if s.category == category and s not in first))
    return tuple(signal for signal in order if signal in wanted)


def name_of(signal: Signal, device: str = "") -> str:
    """The recorded name of ``signal``, a GPU's on ``device`` (its label)."""
    return PREFIX + (signal.key.replace(DEVICE, device) if device else signal.key)


def ranked_name(name: str, rank: int) -> str:
    """``resource/...`` as a logger shared by several ranks names it: ``resource/rank<rank>/...``
    (for the framework callbacks, whose loggers key by name alone)."""
    return f"{PREFIX}rank{rank}/{name.removeprefix(PREFIX)}"


def rate(value: float, last: float, seconds: float) -> float:
    """A counter's change per second from ``last`` to ``value``, ``seconds`` apart; NaN where
    either reading failed (NaN), the counter went back, or no time passed: never negative,
    never invented."""
    if seconds > 0 and value >= last:
        return (value - last) / seconds
    return math.nan


def rates(values: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """``rate`` between each consecutive pair of a counter's readings ``values`` taken at
    ``seconds``: element ``i`` is the rate from reading ``i - 1`` to ``i``, the first NaN."""
    values = np.asarray(values, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    out = np.full(values.shape, math.nan)
    if values.size > 1:
        delta, elapsed = np.diff(values), np.diff(seconds)
        valid = (delta >= 0) & (elapsed > 0)
        out[1:][valid] = delta[valid] / elapsed[valid]
    return out


@dataclass(frozen=True)
class Reading:
    """A recorded name read against the catalogue."""

    signal: Signal
    variant: str = ""
    """``peak`` or ``mean`` for ``<name>_peak``/``<name>_mean``, else ``""``."""
    device: str = ""
    """A GPU signal's device label (``3``, ``1-mig0``), else ``""``."""


def lookup(name: str) -> Reading | None:
    """What ``name`` (``resource/...``, a GPU's with its index) is; None for a training signal
    or a name the catalogue does not know (``_peak``/``_mean`` only where records carry them)."""
    if not name.startswith(PREFIX):
        return None
    category, _, rest = name.removeprefix(PREFIX).partition("/")
    device = ""
    if category == "gpu":
        device, _, rest = rest.partition("/")
        if not device.isascii() or DEVICE_LABEL.fullmatch(device) is None:
            return None
        rest = f"{DEVICE}/{rest}"
    key = f"{category}/{rest}"
    if key in SIGNALS:
        return Reading(SIGNALS[key], device=device)
    for variant in VARIANTS:
        base = SIGNALS.get(key.removesuffix("_" + variant)) if key.endswith("_" + variant) else None
        if base is not None and variant in base.variants:
            return Reading(base, variant, device)
    return None


def device_order(label: str) -> tuple[int, int]:
    """Where a device label sorts: by GPU index, each GPU before its MIG devices."""
    found = DEVICE_LABEL.fullmatch(label)
    if found is None:
        return (1 << 30, 0)
    return int(found.group(1)), -1 if found.group(2) is None else int(found.group(2))


def stand_in(name: str) -> str | None:
    """The recorded name of the gauge the views show in place of counter ``name`` (its
    ``shown_as``, on the same device); None for any other name."""
    reading = lookup(name)
    if reading is None or reading.variant or reading.signal.shown_as is None:
        return None
    return PREFIX + reading.signal.shown_as.replace(DEVICE, reading.device)


def shown_by_another(name: str, present: Container[str]) -> bool:
    """Whether a view shows ``name`` through another of the ``present`` names, and gives it
    no panel or row of its own: a counter's own ``_per_second`` beside the counter (which is
    shown as its rate), or a counter beside the gauge that is its rate (``stand_in``)."""
    reading = lookup(name)
    if reading is None or reading.variant:
        return False
    if reading.signal.kind == RATE and name.removesuffix(RATE_SUFFIX) in present:
        return True
    return stand_in(name) in present


def entry(name: str) -> Signal:
    """The signal named ``name`` (not a ``_peak`` or ``_mean``); KeyError for a name not in ``SIGNALS``."""
    reading = lookup(name)
    if reading is None or reading.variant:
        raise KeyError(name)
    return reading.signal


_TIMES = "\N{MULTIPLICATION SIGN}"
_SCALES = {
    PERCENT_TO_RATIO: "÷ 100",
    1.0: "as is",
    MIB: f"{_TIMES} 1024²",
    GIB: f"{_TIMES} 1024³",
    1e6: f"{_TIMES} 10⁶",
}
"""How the README says each scale."""


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def signals_table() -> str:
    """The README's table of signals (Markdown, one row per signal)."""
    rows = [_row("signal", "unit", "kind", "seed", "`_peak`", "`_mean`", "what"), "|---" * 7 + "|"]
    for s in SIGNALS.values():
        marks = ("✓" if flag else "" for flag in (s.seed, s.peak, s.mean))
        rows.append(_row(f"`{s.name}`", s.unit, s.kind, *marks, s.what))
    return "\n".join(rows) + "\n"


def metrics_table() -> str:
    """The README's table of the signals' Prometheus metrics (Markdown, one row per exported signal)."""
    rows = [_row("signal", "metric", "type", "value"), "|---" * 4 + "|"]
    for s in SIGNALS.values():
        if s.metric is not None and s.scale is not None:
            rows.append(_row(f"`{s.name}`", f"`{METRIC_PREFIX}{s.metric}`", s.kind, _SCALES[s.scale]))
    return "\n".join(rows) + "\n"
