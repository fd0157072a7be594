"""Crash-isolated resource monitoring for ML training backends.

A child process samples CPU, memory, disk, network, the backend process and
every NVIDIA GPU into a shared-memory ring; a daemon thread here stamps each
sample with the watched model's age and logs it as ``resource/...`` signals.
"""

from sampler import signals
from sampler.api.integrations import replace_weightslab_monitor
from sampler.api.monitor import (
    ResourceMonitor,
    get_resource_monitor,
    start_resource_monitor_from_config,
    stop_resource_monitor,
)
from sampler.pipeline.emit import Sample
from sampler.pipeline.steps import watch_model
from sampler.settings import (
    DEFAULT_CATEGORIES,
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_STEP_SOURCE,
    STEP_SOURCES,
    load_resource_monitoring_config,
)
from sampler.settings.placement import Placement

__all__ = [
    "DEFAULT_CATEGORIES",
    "DEFAULT_INTERVAL_SECONDS",
    "DEFAULT_STEP_SOURCE",
    "STEP_SOURCES",
    "Placement",
    "ResourceMonitor",
    "Sample",
    "get_resource_monitor",
    "load_resource_monitoring_config",
    "replace_weightslab_monitor",
    "signals",
    "start_resource_monitor_from_config",
    "stop_resource_monitor",
    "watch_model",
]
