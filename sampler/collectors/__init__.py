"""Collectors: plain objects that each read one category of signals.

``build_collectors`` turns the enabled categories into collectors, in the fixed
order cpu, memory, disk, network, process, gpu.
"""

from __future__ import annotations

from collections.abc import Iterable

from sampler.collectors.base import Collector
from sampler.collectors.gpu import GpuCollector
from sampler.collectors.host import CpuCollector, DiskCollector, MemoryCollector, NetworkCollector
from sampler.collectors.process import ProcessCollector

__all__ = ["Collector", "build_collectors"]


def build_collectors(
    categories: Iterable[str], *, disk_path: str, pid: int, nvml_module: str
) -> list[Collector]:
    """Collectors for ``categories``; gpu is left out when NVML is unavailable."""
    wanted = set(categories)
    collectors: list[Collector] = []
    if "cpu" in wanted:
        collectors.append(CpuCollector())
    if "memory" in wanted:
        collectors.append(MemoryCollector())
    if "disk" in wanted:
        collectors.append(DiskCollector(disk_path))
    if "network" in wanted:
        collectors.append(NetworkCollector())
    if "process" in wanted:
        collectors.append(ProcessCollector(pid))
    if "gpu" in wanted:
        gpu = GpuCollector.open(nvml_module)
        if gpu is not None:
            collectors.append(gpu)
    return collectors
