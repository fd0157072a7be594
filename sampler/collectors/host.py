"""Machine-wide collectors: cpu, memory, disk and network, all through psutil."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence

import psutil

from sampler import catalogue
from sampler.collectors.base import GB, MB, MISSING, Collector, Rates, attempt


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
        name: (io.read_bytes / MB, io.write_bytes / MB)
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
    names = ("resource/cpu/utilization_percent",)
    tracked = catalogue.peaked(names)
    averaged = catalogue.averaged(names)

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # prime: the first call has no window
        self._stat = ProcFile("/proc/stat")
        self._times = attempt(self._cpu_times)

    def sample(self) -> list[float]:
        value = attempt(lambda: psutil.cpu_percent(interval=None))
        return [MISSING if value is None else float(value)]

    def sample_tracked(self) -> list[float]:
        times, before = attempt(self._cpu_times), self._times
        self._times = times
        if times is None or before is None:
            return [MISSING]
        busy = times[0] - before[0]
        total = times[1] - before[1]
        return [100.0 * busy / total if total > 0 and busy >= 0 else MISSING]

    def _cpu_times(self) -> tuple[int, int]:
        """(busy, total) clock ticks of the whole machine since boot, from the first line of
        /proc/stat (what ``psutil.cpu_times`` reads): idle and iowait count as idle, as psutil
        counts them, and guest time is summed as psutil sums its fields."""
        ticks = [int(n) for n in self._stat.read().split(b"\n", 1)[0].split()[1:11]]
        total = sum(ticks)
        return total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0), total

    def close(self) -> None:
        self._stat.close()


SWAP_NAMES = (
    "resource/memory/swap_used_mb",
    "resource/memory/swapped_in_mb",
    "resource/memory/swapped_out_mb",
    "resource/memory/swapped_in_mb" + catalogue.RATE_SUFFIX,
    "resource/memory/swapped_out_mb" + catalogue.RATE_SUFFIX,
)


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
        self.names = ("resource/memory/system_utilization_percent", *(SWAP_NAMES if self._swap else ()))
        self.tracked = catalogue.peaked(self.names)
        self.averaged = catalogue.averaged(self.names)
        self._rates = Rates(2)
        self._meminfo = ProcFile("/proc/meminfo")

    def sample(self) -> list[float]:
        values = self.sample_tracked()
        if self._swap:
            swap = attempt(psutil.swap_memory)
            counters = [MISSING, MISSING] if swap is None else [swap.sin / MB, swap.sout / MB]
            used = MISSING if swap is None else swap.used / MB
            values += [used, *counters, *self._rates.update(counters, time.monotonic())]
        return values

    def sample_tracked(self) -> list[float]:
        percent = attempt(self._percent)
        return [MISSING if percent is None else percent]

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
    names = (
        "resource/disk/utilization_percent",
        "resource/disk/utilization_gb",
        "resource/disk/read_mb",
        "resource/disk/written_mb",
        "resource/disk/read_mb" + catalogue.RATE_SUFFIX,
        "resource/disk/written_mb" + catalogue.RATE_SUFFIX,
    )

    def __init__(self, path: str) -> None:
        self.path = path
        self._rates = Rates(2)
        self._totals = MonotonicTotals(2)

    def sample(self) -> list[float]:
        usage = attempt(lambda: psutil.disk_usage(self.path))
        disks = attempt(_whole_disks)
        # No disks to count (some containers): no reading, rather than a total of 0.
        counters = [MISSING, MISSING] if not disks else self._totals.update(disks)
        return [
            MISSING if usage is None else float(usage.percent),
            MISSING if usage is None else usage.used / GB,
            *counters,
            *self._rates.update(counters, time.monotonic()),
        ]


class NetworkCollector(Collector):
    """Cumulative bytes sent and received over all interfaces since boot
    (summed so that a removed interface never makes them fall: see
    ``MonotonicTotals``), and their rates (bytes/s) between consecutive samples."""

    category = "network"
    names = (
        "resource/network/bytes_sent",
        "resource/network/bytes_received",
        "resource/network/bytes_sent" + catalogue.RATE_SUFFIX,
        "resource/network/bytes_received" + catalogue.RATE_SUFFIX,
    )

    def __init__(self) -> None:
        self._rates = Rates(2)
        self._totals = MonotonicTotals(2)

    def sample(self) -> list[float]:
        interfaces = attempt(_interfaces)
        counters = [MISSING, MISSING] if interfaces is None else self._totals.update(interfaces)
        return [*counters, *self._rates.update(counters, time.monotonic())]
