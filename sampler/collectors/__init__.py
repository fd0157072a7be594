"""Collectors: plain objects that each read one category of signals.

``build_collector`` makes the collector of one category; ``build_collectors``
those of several, in the fixed order of ``DEFAULT_CATEGORIES``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sampler.catalogue import DEFAULT_CATEGORIES
from sampler.collectors.base import Collector
from sampler.collectors.container import ContainerCollector
from sampler.collectors.gpu import GpuCollector
from sampler.collectors.host import CpuCollector, DiskCollector, MemoryCollector, NetworkCollector
from sampler.collectors.pressure import PressureCollector
from sampler.collectors.process import ProcessCollector
from sampler.collectors.tree import ProcessTreeCollector

__all__ = ["Collector", "Sources", "build_collector", "build_collectors"]


@dataclass(frozen=True)
class Sources:
    """What the collectors read: the settings that say which disk, process and GPUs."""

    disk_path: str
    """Filesystem the disk usage signals report."""
    pid: int
    """The process the process, process_tree, container and pressure categories describe (the backend)."""
    nvml_module: str
    """Dotted name of the NVML binding."""
    gpu_devices: str | tuple[str, ...] = "all"
    """``all``, ``visible`` (``CUDA_VISIBLE_DEVICES``) or the devices listed (indices or UUIDs)."""
    gpu_share: tuple[int, int] | None = None
    """(local rank, local world size) when local rank 0 samples the GPUs no
    rank owns and each rank its own; None: every chosen GPU."""
    gpus_read: tuple[str, ...] = ()
    """Labels of the GPU devices earlier sampling children of this monitor read, in their order:
    one this child cannot open is said to have stopped reading (``gpu_errors``)."""
    gpus_stopped: tuple[str, ...] = ()
    """Those of them the latest child had last said an NVML error stopped (not to be said again)."""
    gpus_quarantined: tuple[str, ...] = ()
    """Labels of the GPU devices left out because a call on them brought sampling children down
    (a GPU's MIG devices with it)."""


def build_collector(category: str, sources: Sources) -> Collector | None:
    """The collector for ``category``; None for gpu when NVML is unavailable,
    for container when the process runs under no cgroup limit, and for pressure
    when the kernel has no PSI.
    May raise ``psutil.NoSuchProcess`` when the described process is gone."""
    disk_path, pid, nvml_module = sources.disk_path, sources.pid, sources.nvml_module
    if category == "cpu":
        return CpuCollector()
    if category == "memory":
        return MemoryCollector()
    if category == "disk":
        return DiskCollector(disk_path)
    if category == "network":
        return NetworkCollector()
    if category == "process":
        return ProcessCollector(pid)
    if category == "gpu":
        return GpuCollector.open(
            nvml_module,
            sources.gpu_devices,
            pid,
            sources.gpu_share,
            sources.gpus_read,
            sources.gpus_stopped,
            sources.gpus_quarantined,
        )
    if category == "process_tree":
        return ProcessTreeCollector(pid)
    if category == "container":
        return ContainerCollector.open(pid)
    if category == "pressure":
        return PressureCollector.open(pid)
    raise ValueError(f"unknown category {category!r}")


def build_collectors(categories: Iterable[str], sources: Sources) -> list[Collector]:
    """Collectors for ``categories``, leaving out those ``build_collector`` has none for."""
    wanted = set(categories)
    built = (build_collector(c, sources) for c in DEFAULT_CATEGORIES if c in wanted)
    return [collector for collector in built if collector is not None]
