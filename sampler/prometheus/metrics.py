"""The ``resource/...`` signals as Prometheus metrics, from ``sampler.catalogue``.

Prometheus' conventions: base units (bytes, hertz, seconds, ratios where the
signal is a percentage), ``_total`` on counters, the unit last. A signal is
looked up by its catalogue key; a GPU's device index becomes the ``gpu``
label. ``_peak`` and ``_mean`` readings are gauges named after their base
metric with ``_peak``/``_mean`` before the unit. The ``_per_second`` signals
are not exported: Prometheus' own ``rate()`` over the counter beside them says
the same, over whatever window the query asks.
"""

from __future__ import annotations

from dataclasses import dataclass

from sampler import catalogue
from sampler.catalogue import COUNTER, GAUGE

PREFIX = catalogue.METRIC_PREFIX


@dataclass(frozen=True)
class Metric:
    """How one signal is exposed."""

    name: str
    """The metric's name as exposed (a counter's ends in ``_total``)."""
    kind: str
    """``gauge`` or ``counter`` (the catalogue's kinds are Prometheus' types)."""
    scale: float
    """The signal's value times this is the metric's, in its base unit."""
    help: str


def _m(name: str, scale: float, help: str, kind: str = GAUGE) -> Metric:
    return Metric(PREFIX + name, kind, scale, help)


SIGNALS: dict[str, Metric] = {
    key: _m(signal.metric, signal.scale, signal.what, COUNTER if signal.kind == catalogue.COUNTER else GAUGE)
    for key, signal in catalogue.SIGNALS.items()
    if signal.metric is not None and signal.scale is not None
}
"""Catalogue key (``gpu/<i>/power_watts``) -> its metric, for every exported signal."""

UNIT_SUFFIXES = ("_ratio", "_bytes", "_hertz", "_celsius", "_watts", "_seconds", "_cores")
DERIVED = {catalogue.PEAK: "Peak since the previous logged record of: ", catalogue.MEAN: "Mean over it of: "}

# The monitor's own metrics, besides the signals.
MODEL_AGE = _m("model_age", 1, "The step the backend stamped its last logged record with (the model's age).")
LAST_RECORD = _m("last_record_timestamp_seconds", 1, "When the latest record was sampled (Unix time).")
RESTARTS = _m("monitor_restarts_total", 1, "Sampling children restarted, by cause.", COUNTER)
RECORDS_LOST = _m(
    "monitor_records_lost_total", 1, "Records overwritten before the backend read them.", COUNTER
)
QUARANTINED = _m("monitor_quarantined", 1, "1 for a category quarantined after killing the child, else 0.")
CHILD_CPU = _m("monitor_child_cpu_seconds_per_sample", 1, "CPU the sampling child spends per record.")
GPUS_NOT_READING = _m("monitor_gpus_not_reading", 1, "GPU devices whose readings an NVML error has stopped.")
GPU_QUARANTINED = _m(
    "monitor_gpu_quarantined",
    1,
    "1 for a GPU device quarantined after it brought the sampling child down three times.",
)
GPU_ERRORS = _m(
    "monitor_gpu_errors_total", 1, "Times an NVML error stopped a GPU device's readings.", COUNTER
)
CONNECTIONS_DROPPED = _m(
    "monitor_endpoint_connections_dropped_total",
    1,
    "Connections to this endpoint it dropped: idle, slow, broken or over the limit, by reason.",
    COUNTER,
)
STEPS_TIMED = _m(
    "steps_timed_total", 1, "Training steps watch_model has timed (exported once it has timed one).", COUNTER
)
PHASE_SECONDS = _m(
    "step_phase_seconds_total",
    1,
    "Seconds the timed training steps spent in each phase, by `phase` (catalogue.STEP_PHASES).",
    COUNTER,
)
STALLED = _m(
    "stalled",
    1,
    "1 while the run is stalled (no new step past the stall timeout the child learned or was given, or "
    "the backend's monitor thread taking no record), else 0; absent when stalls are not watched.",
)
STALL_AGE = _m(
    "stall_age_seconds",
    1,
    "Seconds since the open stall's step stopped moving; absent while no stall is open.",
)
INFO = _m("monitor_info", 1, "Always 1; the labels describe the monitor.")
OWN_METRICS = (
    MODEL_AGE,
    LAST_RECORD,
    RESTARTS,
    RECORDS_LOST,
    QUARANTINED,
    GPUS_NOT_READING,
    GPU_ERRORS,
    CHILD_CPU,
    CONNECTIONS_DROPPED,
    STEPS_TIMED,
    PHASE_SECONDS,
    STALLED,
    STALL_AGE,
    INFO,
)


@dataclass(frozen=True)
class Exposed:
    """One signal as a metric: which, and the ``gpu`` label where it has one."""

    metric: Metric
    gpu: str | None
    host_wide: bool = False
    """Exported only by the rank that samples the host (``catalogue.Signal.host_wide``)."""


def _derived(base: Metric, variant: str) -> Metric:
    stem, unit = base.name, ""
    if stem.endswith("_total"):
        stem = stem[: -len("_total")]
    for candidate in UNIT_SUFFIXES:
        if stem.endswith(candidate):
            stem, unit = stem[: -len(candidate)], candidate
            break
    return Metric(f"{stem}_{variant}{unit}", GAUGE, base.scale, DERIVED[variant] + base.help)


def lookup(signal: str) -> Exposed | None:
    """How ``signal`` (``resource/...``) is exposed, or None: a ``_per_second``
    rate, or a name the catalogue does not know."""
    reading = catalogue.lookup(signal)
    metric = None if reading is None else SIGNALS.get(reading.signal.key)
    if reading is None or metric is None:
        return None
    derived = _derived(metric, reading.variant) if reading.variant else metric
    return Exposed(derived, reading.device or None, reading.signal.host_wide)
