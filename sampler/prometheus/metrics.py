"""The one table from ``resource/...`` signals to Prometheus metrics.

Prometheus' conventions: base units (bytes, hertz, seconds, ratios where the
signal is a percentage), ``_total`` on counters, the unit last. A signal is
looked up without its ``resource/`` prefix and, for a GPU, without its device
index, which becomes the ``gpu`` label. ``_peak`` and ``_mean`` readings are
gauges named after their base metric with ``_peak``/``_mean`` before the unit.
The ``_per_second`` signals are not exported: Prometheus' own ``rate()`` over
the counter beside them says the same, over whatever window the query asks.

The README's metric table is checked against this one.
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 1024**2
GB = 1024**3
PREFIX = "wl_resource_"

GAUGE = "gauge"
COUNTER = "counter"


@dataclass(frozen=True)
class Metric:
    """How one signal is exposed."""

    name: str
    """The metric's name as exposed (a counter's ends in ``_total``)."""
    kind: str
    """``gauge`` or ``counter``."""
    scale: float
    """The signal's value times this is the metric's, in its base unit."""
    help: str


def _m(name: str, scale: float, help: str, kind: str = GAUGE) -> Metric:
    return Metric(PREFIX + name, kind, scale, help)


SIGNALS: dict[str, Metric] = {
    "cpu/utilization_percent": _m("cpu_utilization_ratio", 0.01, "System-wide CPU busy (1 = every core)."),
    "memory/system_utilization_percent": _m("memory_utilization_ratio", 0.01, "System memory in use."),
    "disk/utilization_percent": _m("disk_utilization_ratio", 0.01, "Usage of the disk_path filesystem."),
    "disk/utilization_gb": _m("disk_used_bytes", GB, "Bytes used on the disk_path filesystem."),
    "disk/read_mb": _m("disk_read_bytes_total", MB, "Bytes read from disks since boot.", COUNTER),
    "disk/written_mb": _m("disk_written_bytes_total", MB, "Bytes written to disks since boot.", COUNTER),
    "network/bytes_sent": _m("network_sent_bytes_total", 1, "Bytes sent since boot.", COUNTER),
    "network/bytes_received": _m("network_received_bytes_total", 1, "Bytes received since boot.", COUNTER),
    "process/cpu_utilization_percent": _m(
        "process_cpu_utilization_ratio", 0.01, "The backend's CPU use (1 per busy core)."
    ),
    "process/cpu_threads_in_use": _m("process_threads", 1, "The backend's threads."),
    "process/memory_in_use_mb": _m("process_memory_in_use_bytes", MB, "The backend's resident memory (RSS)."),
    "process/memory_in_use_percent": _m(
        "process_memory_in_use_ratio", 0.01, "The backend's RSS over system memory."
    ),
    "process/memory_available_mb": _m(
        "process_memory_available_bytes", MB, "System memory available, as the backend's rank sees it."
    ),
    "process_tree/process_count": _m(
        "process_tree_processes", 1, "The backend and its descendants (DataLoader workers, ...)."
    ),
    "process_tree/cpu_utilization_percent": _m(
        "process_tree_cpu_utilization_ratio", 0.01, "CPU use of the backend and its descendants (1 per core)."
    ),
    "process_tree/memory_in_use_mb": _m(
        "process_tree_memory_in_use_bytes", MB, "PSS of the backend and its descendants."
    ),
    "container/memory_limit_mb": _m("container_memory_limit_bytes", MB, "The cgroup's memory limit."),
    "container/memory_used_mb": _m("container_memory_used_bytes", MB, "Memory the cgroup uses."),
    "container/memory_used_percent": _m(
        "container_memory_used_ratio", 0.01, "Memory the cgroup uses over its limit."
    ),
    "container/cpu_quota_cores": _m("container_cpu_quota_cores", 1, "The cgroup's CPU quota in cores."),
    "container/cpu_throttled_seconds": _m(
        "container_cpu_throttled_seconds_total", 1, "Time the cgroup's CPU was throttled.", COUNTER
    ),
    "gpu/memory_clock_mhz": _m("gpu_memory_clock_hertz", 1e6, "The GPU's memory clock."),
    "gpu/sm_clock_mhz": _m("gpu_sm_clock_hertz", 1e6, "The GPU's SM clock."),
    "gpu/memory_allocated_bytes": _m("gpu_memory_allocated_bytes", 1, "GPU memory in use (all processes)."),
    "gpu/memory_allocated_percent": _m(
        "gpu_memory_allocated_ratio", 0.01, "GPU memory in use over its total."
    ),
    "gpu/temperature_celsius": _m("gpu_temperature_celsius", 1, "GPU temperature."),
    "gpu/utilization_percent": _m("gpu_utilization_ratio", 0.01, "Time a kernel ran on the GPU."),
    "gpu/power_watts": _m("gpu_power_watts", 1, "GPU power draw."),
    "gpu/process_memory_bytes": _m("gpu_process_memory_bytes", 1, "GPU memory the backend holds."),
    "gpu/tree_memory_bytes": _m(
        "gpu_process_tree_memory_bytes", 1, "GPU memory the backend and its descendants hold."
    ),
    "gpu/clock_throttle_reasons": _m(
        "gpu_clock_event_reasons", 1, "NVML's clocks event reasons bitmask (nvmlClocksEventReason*)."
    ),
    "gpu/throttle_power": _m("gpu_throttle_power", 1, "1 while a power cap or power brake slows the clocks."),
    "gpu/throttle_thermal": _m("gpu_throttle_thermal", 1, "1 while a thermal slowdown slows the clocks."),
    "gpu/throttle_hw_slowdown": _m("gpu_throttle_hw_slowdown", 1, "1 while hardware slowdown is engaged."),
    "gpu/power_limit_watts": _m("gpu_power_limit_watts", 1, "The enforced GPU power limit."),
}

UNIT_SUFFIXES = ("_ratio", "_bytes", "_hertz", "_celsius", "_watts", "_seconds", "_cores")
DERIVED = {"_peak": "Peak since the previous logged record of: ", "_mean": "Mean over it of: "}
NOT_EXPORTED_SUFFIX = "_per_second"
"""Rates of counters: ``rate()`` over the counter is Prometheus' way."""

# The monitor's own metrics, besides the signals.
MODEL_AGE = _m("model_age", 1, "The step the backend stamped its last logged record with (the model's age).")
LAST_RECORD = _m("last_record_timestamp_seconds", 1, "When the latest record was sampled (Unix time).")
RESTARTS = _m("monitor_restarts_total", 1, "Sampling children restarted, by cause.", COUNTER)
RECORDS_LOST = _m(
    "monitor_records_lost_total", 1, "Records overwritten before the backend read them.", COUNTER
)
QUARANTINED = _m("monitor_quarantined", 1, "1 for a category quarantined after killing the child, else 0.")
CHILD_CPU = _m("monitor_child_cpu_seconds_per_sample", 1, "CPU the sampling child spends per record.")
CONNECTIONS_DROPPED = _m(
    "monitor_endpoint_connections_dropped_total",
    1,
    "Connections to this endpoint it dropped: idle, slow, broken or over the limit, by reason.",
    COUNTER,
)
INFO = _m("monitor_info", 1, "Always 1; the labels describe the monitor.")
OWN_METRICS = (
    MODEL_AGE,
    LAST_RECORD,
    RESTARTS,
    RECORDS_LOST,
    QUARANTINED,
    CHILD_CPU,
    CONNECTIONS_DROPPED,
    INFO,
)


@dataclass(frozen=True)
class Exposed:
    """One signal as a metric: which, and the ``gpu`` label where it has one."""

    metric: Metric
    gpu: str | None


def _derived(base: Metric, suffix: str) -> Metric:
    stem, unit = base.name, ""
    if stem.endswith("_total"):
        stem = stem[: -len("_total")]
    for candidate in UNIT_SUFFIXES:
        if stem.endswith(candidate):
            stem, unit = stem[: -len(candidate)], candidate
            break
    return Metric(stem + suffix + unit, GAUGE, base.scale, DERIVED[suffix] + base.help)


def lookup(signal: str) -> Exposed | None:
    """How ``signal`` (``resource/...``) is exposed, or None: a ``_per_second``
    rate, or a name the table does not know."""
    if not signal.startswith("resource/") or signal.endswith(NOT_EXPORTED_SUFFIX):
        return None
    parts = signal.split("/")
    gpu = None
    if len(parts) == 4 and parts[1] == "gpu" and parts[2].isdigit():
        gpu = parts.pop(2)
    key = "/".join(parts[1:])
    for suffix in DERIVED:
        if key.endswith(suffix) and key[: -len(suffix)] in SIGNALS:
            return Exposed(_derived(SIGNALS[key[: -len(suffix)]], suffix), gpu)
    metric = SIGNALS.get(key)
    return None if metric is None else Exposed(metric, gpu)
