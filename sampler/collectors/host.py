"""Machine-wide collectors: cpu, memory, disk and network, all through psutil."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import psutil

from sampler import catalogue
from sampler.catalogue import GIB, MIB, Signal
from sampler.collectors.base import MISSING, Collector, Readings, attempt


class MonotonicTotals:
    """Sums over devices of cumulative counters that never fall.

    A plain sum falls when a device goes (an interface removed, a disk
    detached), which Prometheus' ``rate()`` reads as a counter reset: a spike
    of the whole sum. Here the first reading is the plain sum; after it, each
    device adds what it moved since its previous reading (a device that
    appears adds from then on, one that goes keeps what it added, and a
    counter that went backwards, a driver reset, adds its new value).
    """

    def __init__(self, width: int) -> None:
        self._width = width
        self._totals: list[float] | None = None
        self._last: Mapping[str, Sequence[float]] = {}

    def update(self, devices: Mapping[str, Sequence[float]]) -> list[float]:
        """The totals after this reading of every device's counters."""
        if self._totals is None:
            self._totals = [sum(values[i] for values in devices.values()) for i in range(self._width)]
        else:
            for name, values in devices.items():
                before = self._last.get(name)
                if before is None:
                    continue
                for i in range(self._width):
                    moved = values[i] - before[i]
                    self._totals[i] += moved if moved >= 0 else values[i]
        self._last = devices
        return list(self._totals)


class ProcFile:
    """A ``/proc`` file held open and read from its start on each call: one ``pread``, where
    opening it each time (as psutil does) costs more than the read in a process that wakes
    cold several times a second. Opened at the first read; ``read`` raises ``OSError``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def read(self) -> bytes:
        """The file's first 4 KiB now."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(self._fd, 4096, 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _whole_disks() -> dict[str, tuple[float, float]]:
    """Bytes read and written since boot per disk (MB), partitions left out: a
    partition's bytes are in its disk's already (as in psutil's own total)."""
    disks = psutil.disk_io_counters(perdisk=True) or {}
    linux = sys.platform.startswith("linux")
    return {
        name: (io.read_bytes / MIB, io.write_bytes / MIB)
        for name, io in disks.items()
        if not linux or os.path.exists(f"/sys/block/{name.replace('/', '!')}")
    }


def _interfaces() -> dict[str, tuple[float, float]]:
    """Bytes sent and received since boot per network interface."""
    return {
        name: (float(io.bytes_sent), float(io.bytes_recv))
        for name, io in psutil.net_io_counters(pernic=True).items()
    }


class CpuCollector(Collector):
    """System-wide CPU utilization (%) since the previous sample; tracked
    between records over the inner window (from ``cpu_times`` deltas, so
    ``psutil.cpu_percent``'s own window stays the whole interval)."""

    category = "cpu"

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # prime: the first call has no window
        self._stat = ProcFile("/proc/stat")
        self._times = attempt(self._cpu_times)

    def read(self) -> Readings:
        readings: Readings = {}
        value = attempt(lambda: psutil.cpu_percent(interval=None))
        if value is not None:
            readings[catalogue.CPU_UTILIZATION] = float(value)
        return readings

    def read_tracked(self) -> list[Readings]:
        times, before = attempt(self._cpu_times), self._times
        self._times = times
        if times is None or before is None:
            return [{}]
        busy = times[0] - before[0]
        total = times[1] - before[1]
        return [{catalogue.CPU_UTILIZATION: 100.0 * busy / total if total > 0 and busy >= 0 else MISSING}]

    def _cpu_times(self) -> tuple[int, int]:
        """(busy, total) clock ticks of the whole machine since boot, from the first line of
        /proc/stat (what ``psutil.cpu_times`` reads): idle and iowait count as idle, as psutil
        counts them, and guest time is summed as psutil sums its fields."""
        ticks = [int(n) for n in self._stat.read().split(b"\n", 1)[0].split()[1:11]]
        total = sum(ticks)
        return total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0), total

    def close(self) -> None:
        self._stat.close()


SWAP = (catalogue.SWAP_USED, catalogue.SWAPPED_IN, catalogue.SWAPPED_OUT)
"""The memory signals read only where the machine has swap."""
SWAP_NAMES = tuple(s.name for s in catalogue.record_layout("memory", SWAP))
"""Their fields, their rates included."""


class MemoryCollector(Collector):
    """System-wide memory utilization (%), tracked between records; and where the machine
    has swap when the collector is made (a child started after ``swapon`` has them), swap in
    use (MB), MB swapped in and out since boot (the kernel's ``pswpin``/``pswpout`` pages) and
    their rates (MB/s) between consecutive samples."""

    category = "memory"

    def __init__(self, swap: bool | None = None) -> None:
        """``swap``: whether to read swap; None: where the machine has swap now."""
        if swap is None:
            swap_now = attempt(psutil.swap_memory)
            swap = swap_now is not None and swap_now.total > 0
        self._swap = swap
        self._meminfo = ProcFile("/proc/meminfo")

    def signals(self) -> tuple[Signal, ...]:
        return (catalogue.MEMORY_USED, *(SWAP if self._swap else ()))

    def read(self) -> Readings:
        (readings,) = self.read_tracked()
        swap = attempt(psutil.swap_memory) if self._swap else None
        if swap is not None:
            readings[catalogue.SWAP_USED] = swap.used / MIB
            readings[catalogue.SWAPPED_IN] = swap.sin / MIB
            readings[catalogue.SWAPPED_OUT] = swap.sout / MIB
        return readings

    def read_tracked(self) -> list[Readings]:
        percent = attempt(self._percent)
        return [{} if percent is None else {catalogue.MEMORY_USED: percent}]

    def _percent(self) -> float:
        """``psutil.virtual_memory().percent``, from the first lines of /proc/meminfo alone;
        through psutil where the kernel gives no ``MemAvailable`` (psutil estimates it)."""
        fields = dict(line.split(b":", 1) for line in self._meminfo.read().split(b"\n")[:5] if b":" in line)
        total, free = int(fields[b"MemTotal"].split()[0]), int(fields[b"MemFree"].split()[0])
        available = int(fields.get(b"MemAvailable", b"0").split()[0])
        if not available:
            return float(psutil.virtual_memory().percent)
        return round((total - (free if available > total else available)) / total * 100, 1)

    def close(self) -> None:
        self._meminfo.close()


class DiskCollector(Collector):
    """Usage of the filesystem holding ``path`` (% and GB used), cumulative
    disk I/O of the whole machine (MB read and written since boot, summed over
    disks so that it never falls: see ``MonotonicTotals``), and its rates (MB/s)
    between consecutive samples."""

    category = "disk"

    def __init__(self, path: str) -> None:
        self.path = path
        self._totals = MonotonicTotals(2)

    def read(self) -> Readings:
        readings: Readings = {}
        usage = attempt(lambda: psutil.disk_usage(self.path))
        if usage is not None:
            readings[catalogue.DISK_FULL] = float(usage.percent)
            readings[catalogue.DISK_USED] = usage.used / GIB
        disks = attempt(_whole_disks)
        if disks:  # none to count (some containers): no reading, rather than a total of 0
            readings[catalogue.DISK_READ], readings[catalogue.DISK_WRITTEN] = self._totals.update(disks)
        return readings


class NetworkCollector(Collector):
    """Cumulative bytes sent and received over all interfaces since boot
    (summed so that a removed interface never makes them fall: see
    ``MonotonicTotals``), and their rates (bytes/s) between consecutive samples."""

    category = "network"

    def __init__(self) -> None:
        self._totals = MonotonicTotals(2)

    def read(self) -> Readings:
        interfaces = attempt(_interfaces)
        if interfaces is None:
            return {}
        sent, received = self._totals.update(interfaces)
        return {catalogue.NETWORK_SENT: sent, catalogue.NETWORK_RECEIVED: received}
