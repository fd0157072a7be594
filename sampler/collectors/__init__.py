"""Collectors: plain objects that each read one category of signals.

``build_collector`` makes the collector of one category; ``build_collectors``
those of several, in the fixed order of ``DEFAULT_CATEGORIES``.
"""

from __future__ import annotations

from collections.abc import Iterable

from sampler.collectors.base import Collector
from sampler.collectors.gpu import GpuCollector
from sampler.collectors.host import CpuCollector, DiskCollector, MemoryCollector, NetworkCollector
from sampler.collectors.process import ProcessCollector
from sampler.config import DEFAULT_CATEGORIES

__all__ = ["Collector", "build_collector", "build_collectors"]


def build_collector(category: str, *, disk_path: str, pid: int, nvml_module: str) -> Collector | None:
    """The collector for ``category``; None for gpu when NVML is unavailable.

    ``pid`` is the process the process category describes (the backend).
    """
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
        return GpuCollector.open(nvml_module)
    raise ValueError(f"unknown category {category!r}")


def build_collectors(
    categories: Iterable[str], *, disk_path: str, pid: int, nvml_module: str
) -> list[Collector]:
    """Collectors for ``categories``, leaving out gpu when NVML is unavailable."""
    wanted = set(categories)
    built = (
        build_collector(c, disk_path=disk_path, pid=pid, nvml_module=nvml_module)
        for c in DEFAULT_CATEGORIES
        if c in wanted
    )
    return [collector for collector in built if collector is not None]
