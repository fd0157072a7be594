"""Machine-wide collectors: cpu, memory, disk and network, all through psutil."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping, Sequence

import psutil

from sampler import catalogue
from sampler.catalogue import GIB, MIB, Signal
from sampler.collectors.base import MISSING, READING_ERRORS, Collector, Readings, attempt


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
    """A ``/proc`` file held open and read whole from its start on each call: one ``pread``, where
    opening it each time (as psutil does) costs more than the read in a process that wakes
    cold several times a second. Opened at the first read, ``path`` relative to ``dir_fd``
    where given (a process's ``/proc/<pid>`` directory: once that process is gone, its files
    give no reading, whoever has its pid since); ``read`` raises ``OSError``."""

    def __init__(self, path: str, dir_fd: int | None = None) -> None:
        self.path = path
        self._dir_fd = dir_fd
        self._fd: int | None = None
        self._size = 4096
        """Bytes asked of each read: doubled while the file fills them."""
        self._unclaimed: bytes | None = None
        """The latest ``read()``'s bytes until ``take()`` has them."""
        self.read_at = math.nan
        """When the latest ``read()`` was made (``time.monotonic()``)."""

    def read(self) -> bytes:
        """The whole file now."""
        self._unclaimed = None  # a failed read leaves nothing for ``take()``
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._dir_fd)
        data = os.pread(self._fd, self._size, 0)
        while len(data) >= self._size:
            self._size *= 2
            data = os.pread(self._fd, self._size, 0)
        self._unclaimed, self.read_at = data, time.monotonic()
        return data

    def take(self) -> bytes:
        """The latest ``read()``'s bytes if no ``take()`` had them yet, else the file now: a
        record's reading shares the read its tracked readings made in the same wake-up."""
        data = self._unclaimed if self._unclaimed is not None else self.read()
        self._unclaimed = None
        return data

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def meminfo_kb(data: bytes, lines: int | None = None) -> dict[bytes, int]:
    """The fields of /proc/meminfo's ``data`` (kB; the first ``lines`` only where given)."""
    return {
        key: int(rest.split()[0])
        for key, _, rest in (line.partition(b":") for line in data.split(b"\n", lines or -1)[:lines])
        if rest
    }


def available_kb(fields: dict[bytes, int]) -> int | None:
    """Memory available (kB) as ``psutil.virtual_memory().available`` gives it from ``MemTotal``,
    ``MemFree`` and ``MemAvailable``; None where the kernel gives no ``MemAvailable`` (or 0),
    for which psutil makes an estimate of its own. Raises ``KeyError`` without the first two."""
    total, free, available = fields[b"MemTotal"], fields[b"MemFree"], fields.get(b"MemAvailable", 0)
    if not available:
        return None
    return free if available > total else available


PARSING_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    IndexError,
    KeyError,
    ZeroDivisionError,
    *READING_ERRORS,
)
"""What reading a /proc file and parsing it may raise: a failed read, or a file not laid out
as expected (another kernel's)."""
LINUX = sys.platform.startswith("linux")
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
"""The kernel's clock ticks per second, the unit of /proc's CPU times."""
SECTOR_BYTES = 512
"""The unit of /proc/diskstats' sectors, whatever the disk's own sector size (as psutil counts)."""


def _psutil_disks() -> dict[str, tuple[float, float]]:
    """Bytes read and written since boot per disk (MB), off Linux."""
    disks = psutil.disk_io_counters(perdisk=True) or {}
    return {name: (io.read_bytes / MIB, io.write_bytes / MIB) for name, io in disks.items()}


def _psutil_interfaces() -> dict[str, tuple[float, float]]:
    """Bytes sent and received since boot per network interface, off Linux."""
    return {
        name: (float(io.bytes_sent), float(io.bytes_recv))
        for name, io in psutil.net_io_counters(pernic=True).items()
    }


class CpuCollector(Collector):
    """System-wide CPU utilization (%): the record's since the previous record, as
    ``psutil.cpu_percent``, and tracked between records over the inner window, both from the
    first line of /proc/stat, read once per wake-up through a held descriptor."""

    category = "cpu"

    def __init__(self) -> None:
        self._stat = ProcFile("/proc/stat")
        self._ticks = attempt(self._take_ticks, PARSING_ERRORS)  # left for no record
        """The tracked reading's window start: /proc/stat's first fields, clock ticks."""
        self._record_ticks = self._ticks
        """The record's window start."""

    def read(self) -> Readings:
        ticks, before = attempt(self._take_ticks, PARSING_ERRORS), self._record_ticks
        self._record_ticks = ticks
        readings: Readings = {}
        if ticks is not None and before is not None:
            readings[catalogue.CPU_UTILIZATION] = _cpu_percent(before, ticks)
        return readings

    def read_tracked(self) -> list[Readings]:
        ticks, before = attempt(lambda: _ticks(self._stat.read()), PARSING_ERRORS), self._ticks
        self._ticks = ticks
        if ticks is None or before is None:
            return [{}]
        busy = _busy_ticks(ticks) - _busy_ticks(before)
        total = sum(ticks) - sum(before)
        return [{catalogue.CPU_UTILIZATION: 100.0 * busy / total if total > 0 and busy >= 0 else MISSING}]

    def _take_ticks(self) -> list[int]:
        """The ticks of the tracked reading's read where one was made since, else of the file now."""
        return _ticks(self._stat.take())

    def close(self) -> None:
        self._stat.close()


def _ticks(stat: bytes) -> list[int]:
    """The machine's CPU clock ticks since boot, the fields of /proc/stat's first line:
    user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice."""
    return [int(n) for n in stat.split(b"\n", 1)[0].split()[1:11]]


def _busy_ticks(ticks: list[int]) -> int:
    """CPU ticks less idle and iowait, which count as idle (as psutil counts them)."""
    return sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)


def _cpu_percent(before: list[int], after: list[int]) -> float:
    """``psutil.cpu_percent``'s formula on the fields in seconds, as ``psutil.cpu_times`` gives
    them: each field's change (never below 0), guest and guest_nice left out of the total (they
    are in user and nice already), idle and iowait out of the busy time; rounded to 0.1."""
    tick = TICKS_PER_SECOND
    deltas = [max(0.0, b / tick - a / tick) for a, b in zip(before, after, strict=True)]
    total = sum(deltas)
    for guest in deltas[8:10]:
        total -= guest
    busy = total - deltas[3] - (deltas[4] if len(deltas) > 4 else 0)
    return 0.0 if total == 0 else round(busy / total * 100, 1)


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
        self._vmstat = ProcFile("/proc/vmstat")

    def signals(self) -> tuple[Signal, ...]:
        return (catalogue.MEMORY_USED, *(SWAP if self._swap else ()))

    def read(self) -> Readings:
        """The tracked reading's meminfo where it was read since the previous record (in the
        child, in the same wake-up), and swap from the same fields."""
        fields = attempt(lambda: meminfo_kb(self._meminfo.take(), None if self._swap else 5), PARSING_ERRORS)
        if fields is None:
            return {}
        percent = attempt(lambda: _percent(fields), PARSING_ERRORS)
        readings = {} if percent is None else {catalogue.MEMORY_USED: percent}
        if self._swap and b"SwapTotal" in fields and b"SwapFree" in fields:
            readings[catalogue.SWAP_USED] = (fields[b"SwapTotal"] - fields[b"SwapFree"]) * 1024 / MIB
            swapped = attempt(self._swapped, PARSING_ERRORS)
            if swapped is not None:
                readings[catalogue.SWAPPED_IN], readings[catalogue.SWAPPED_OUT] = swapped
        return readings

    def read_tracked(self) -> list[Readings]:
        percent = attempt(lambda: _percent(meminfo_kb(self._meminfo.read(), 5)), PARSING_ERRORS)
        return [{} if percent is None else {catalogue.MEMORY_USED: percent}]

    def _swapped(self) -> tuple[float, float]:
        """MB swapped in and out since boot, from /proc/vmstat's pages (4 KiB, as psutil counts)."""
        pages = {
            key: int(value)
            for key, _, value in (line.partition(b" ") for line in self._vmstat.read().split(b"\n"))
            if key in (b"pswpin", b"pswpout")
        }
        return pages[b"pswpin"] * 4096 / MIB, pages[b"pswpout"] * 4096 / MIB

    def close(self) -> None:
        self._meminfo.close()
        self._vmstat.close()


def _percent(fields: dict[bytes, int]) -> float:
    """``psutil.virtual_memory().percent`` from /proc/meminfo's fields; through psutil where
    the kernel gives no ``MemAvailable`` (psutil estimates it)."""
    available = available_kb(fields)
    if available is None:
        return float(psutil.virtual_memory().percent)
    total = fields[b"MemTotal"]
    return round((total - available) / total * 100, 1)


class DiskCollector(Collector):
    """Usage of the filesystem holding ``path`` (% and GB used), cumulative
    disk I/O of the whole machine (MB read and written since boot, summed over
    disks so that it never falls: see ``MonotonicTotals``), and its rates (MB/s)
    between consecutive samples."""

    category = "disk"

    def __init__(self, path: str) -> None:
        self.path = path
        self._totals = MonotonicTotals(2)
        self._diskstats = ProcFile("/proc/diskstats")
        self._whole: dict[bytes, bool] = {}
        """Per device name, whether it is a whole disk (``/sys/block/<name>`` exists), not a
        partition, whose bytes are in its disk's already (as in psutil's own total)."""

    def read(self) -> Readings:
        readings: Readings = {}
        usage = attempt(lambda: psutil.disk_usage(self.path))
        if usage is not None:
            readings[catalogue.DISK_FULL] = float(usage.percent)
            readings[catalogue.DISK_USED] = usage.used / GIB
        disks = attempt(self._whole_disks if LINUX else _psutil_disks, PARSING_ERRORS)
        if disks:  # none to count (some containers): no reading, rather than a total of 0
            readings[catalogue.DISK_READ], readings[catalogue.DISK_WRITTEN] = self._totals.update(disks)
        return readings

    def _whole_disks(self) -> dict[str, tuple[float, float]]:
        """Bytes read and written since boot per whole disk (MB), from /proc/diskstats as psutil
        parses it (a line of 14 or more fields, or a partition's of 7)."""
        disks = {}
        for line in self._diskstats.read().splitlines():
            fields = line.split()
            if len(fields) == 15:  # Linux 2.4
                name, read, written = fields[3], fields[5], fields[9]
            elif len(fields) == 14 or len(fields) >= 18:
                name, read, written = fields[2], fields[5], fields[9]
            elif len(fields) == 7:  # a partition, Linux 2.6
                name, read, written = fields[2], fields[4], fields[6]
            else:
                raise ValueError(f"unknown /proc/diskstats line {line!r}")
            whole = self._whole.get(name)
            if whole is None:
                path = b"/sys/block/" + name.replace(b"/", b"!")
                whole = self._whole[name] = os.path.exists(path)
            if whole:
                disks[name.decode()] = (int(read) * SECTOR_BYTES / MIB, int(written) * SECTOR_BYTES / MIB)
        return disks

    def close(self) -> None:
        self._diskstats.close()


class NetworkCollector(Collector):
    """Cumulative bytes sent and received over all interfaces since boot
    (summed so that a removed interface never makes them fall: see
    ``MonotonicTotals``), and their rates (bytes/s) between consecutive samples."""

    category = "network"

    def __init__(self) -> None:
        self._totals = MonotonicTotals(2)
        self._dev = ProcFile("/proc/net/dev")

    def read(self) -> Readings:
        interfaces = attempt(self._interfaces if LINUX else _psutil_interfaces, PARSING_ERRORS)
        if interfaces is None:
            return {}
        sent, received = self._totals.update(interfaces)
        return {catalogue.NETWORK_SENT: sent, catalogue.NETWORK_RECEIVED: received}

    def _interfaces(self) -> dict[str, tuple[float, float]]:
        """Bytes sent and received since boot per interface, from /proc/net/dev as psutil
        parses it: received is the first field after the name, sent the ninth."""
        interfaces = {}
        for line in self._dev.read().splitlines()[2:]:
            name, _, counts = line.rpartition(b":")
            fields = counts.split()
            interfaces[name.strip().decode()] = (float(fields[8]), float(fields[0]))
        return interfaces

    def close(self) -> None:
        self._dev.close()
