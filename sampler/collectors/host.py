"""Machine-wide collectors: cpu, memory, disk and network, all through psutil."""

from __future__ import annotations

import psutil

from sampler.collectors.base import GB, MB, MISSING, Collector, attempt


class CpuCollector(Collector):
    """System-wide CPU utilization (%) since the previous sample."""

    category = "cpu"
    names = ("resource/cpu/utilization_percent",)

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # prime: the first call has no window

    def sample(self) -> list[float]:
        value = attempt(lambda: psutil.cpu_percent(interval=None))
        return [MISSING if value is None else float(value)]


class MemoryCollector(Collector):
    """System-wide memory utilization (%)."""

    category = "memory"
    names = ("resource/memory/system_utilization_percent",)

    def sample(self) -> list[float]:
        memory = attempt(psutil.virtual_memory)
        return [MISSING if memory is None else float(memory.percent)]


class DiskCollector(Collector):
    """Usage of the filesystem holding ``path`` (% and GB used) and cumulative
    disk I/O of the whole machine (MB read and written since boot)."""

    category = "disk"
    names = (
        "resource/disk/utilization_percent",
        "resource/disk/utilization_gb",
        "resource/disk/read_mb",
        "resource/disk/written_mb",
    )

    def __init__(self, path: str) -> None:
        self.path = path

    def sample(self) -> list[float]:
        usage = attempt(lambda: psutil.disk_usage(self.path))
        io = attempt(psutil.disk_io_counters)  # None on machines without disks to count
        return [
            MISSING if usage is None else float(usage.percent),
            MISSING if usage is None else usage.used / GB,
            MISSING if io is None else io.read_bytes / MB,
            MISSING if io is None else io.write_bytes / MB,
        ]


class NetworkCollector(Collector):
    """Cumulative bytes sent and received over all interfaces since boot."""

    category = "network"
    names = ("resource/network/bytes_sent", "resource/network/bytes_received")

    def sample(self) -> list[float]:
        net = attempt(psutil.net_io_counters)
        if net is None:
            return [MISSING, MISSING]
        return [float(net.bytes_sent), float(net.bytes_recv)]
