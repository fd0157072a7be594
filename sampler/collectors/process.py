"""The backend process as seen from outside: CPU, threads, memory."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

from sampler import catalogue
from sampler.catalogue import MIB
from sampler.collectors.base import MISSING, Collector, Readings, attempt
from sampler.collectors.host import PARSING_ERRORS, ProcFile, available_kb, meminfo_kb
from sampler.collectors.tree import Stat, parse_stat

RSS = catalogue.PROCESS_RSS.name


class ProcessCollector(Collector):
    """Readings of process ``pid`` (the backend, never the sampling child).

    ``cpu_utilization_percent`` follows psutil: 100 per fully busy core, so a
    process using four cores reads 400; ``cpu_seconds`` is the CPU time (user +
    system) it used since it started, the counter that percentage is the rate of.
    CPU % and memory (RSS) are tracked between records: the tracked CPU % is
    over the inner window and the record's over its own since the previous record.

    Every reading is a file of the backend's ``/proc/<pid>`` held open (``stat``,
    ``status``, ``schedstat``; ``/proc/meminfo`` for the machine's memory), each read
    with one ``pread``; once the backend is gone they give no reading, even where its
    pid was given to another process since.
    """

    category = "process"

    def __init__(self, pid: int) -> None:
        """Raises ``psutil.NoSuchProcess`` when ``pid`` is gone."""
        self.pid = pid
        try:
            self._dir = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise psutil.NoSuchProcess(pid) from None
        self._stat = ProcFile("stat", self._dir)
        self._status = ProcFile("status", self._dir)
        self._schedstat = ProcFile("schedstat", self._dir)
        self._meminfo = ProcFile("/proc/meminfo")
        stat = self._read_stat(self._stat.take)  # left for no record
        self._inner = self._record = None if stat is None else (stat.cpu_seconds, self._stat.read_at)
        """(CPU seconds, monotonic s) at the previous tracked reading, and at the previous
        record: each CPU % has its window."""
        status = self._read_status()
        self._high_water_kb = None if status is None else status[2]
        """The backend's RSS high-water mark (``VmHWM``, kB) as the latest ``sample()`` read it."""
        self._marked_kb = self._high_water_kb
        """The same mark at the previous ``marks()``."""
        self._last_wait: tuple[int, int] | None = self._waited()
        """(monotonic ns, ns the main thread waited on a run queue) at the previous sample."""

    def read(self) -> Readings:
        """CPU, RSS and its share of the machine's memory from ``stat`` (the tracked reading's
        where one was made since the previous record: in the child, in the same wake-up)."""
        stat, at = self._read_stat(self._stat.take), self._stat.read_at
        status = self._read_status()
        threads, cores, self._high_water_kb = (None, None, None) if status is None else status
        memory = attempt(lambda: meminfo_kb(self._meminfo.read(), 3), PARSING_ERRORS)
        readings: Readings = {catalogue.PROCESS_CPU_WAIT: self._wait_percent()}
        last, self._record = self._record, None if stat is None else (stat.cpu_seconds, at)
        if stat is not None and last is not None and at > last[1]:
            readings[catalogue.PROCESS_CPU] = round((stat.cpu_seconds - last[0]) / (at - last[1]) * 100, 1)
        if threads is not None:
            readings[catalogue.PROCESS_THREADS] = float(threads)
        readings[catalogue.PROCESS_RSS] = _memory_mb(None if stat is None else stat.rss_bytes)
        if memory is not None and b"MemTotal" in memory:
            if stat is not None:
                readings[catalogue.PROCESS_RSS_PERCENT] = stat.rss_bytes / (memory[b"MemTotal"] * 1024) * 100
            available = attempt(lambda: available_kb(memory), PARSING_ERRORS)
            if available is not None:
                readings[catalogue.PROCESS_MEMORY_AVAILABLE] = available * 1024 / MIB
            elif b"MemFree" in memory:  # no MemAvailable: psutil's estimate
                estimate = attempt(psutil.virtual_memory)
                if estimate is not None:
                    readings[catalogue.PROCESS_MEMORY_AVAILABLE] = estimate.available / MIB
        if cores:
            readings[catalogue.PROCESS_CORES] = float(cores)
        if stat is not None:
            readings[catalogue.PROCESS_CPU_SECONDS] = stat.cpu_seconds
        return readings

    def read_tracked(self) -> list[Readings]:
        """CPU % (as psutil's ``cpu_percent``) and RSS from one read of /proc/<pid>/stat, the
        file psutil would open for the first, beside ``statm`` for the second."""
        stat, last = self._read_stat(), self._inner
        if stat is None:
            return [{}]
        at = self._stat.read_at
        self._inner = (stat.cpu_seconds, at)
        readings = {catalogue.PROCESS_RSS: _memory_mb(stat.rss_bytes)}
        if last is not None and at > last[1]:
            readings[catalogue.PROCESS_CPU] = round((stat.cpu_seconds - last[0]) / (at - last[1]) * 100, 1)
        return [readings]

    def _read_stat(self, read: Callable[[], bytes] | None = None) -> Stat | None:
        """``stat`` now, or through ``read`` where given (``take``); its ``read_at`` says when."""
        data = attempt(read or self._stat.read)
        return None if data is None else parse_stat(data)

    def close(self) -> None:
        for held in (self._stat, self._status, self._schedstat, self._meminfo):
            held.close()
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1

    def read_marks(self) -> list[Readings]:
        """The RSS peak (MB) when ``VmHWM``, as the latest ``sample()`` read it, rose since the
        previous call; the mark is never reset (``getrusage`` reports it as the backend's max
        RSS), only compared."""
        last, now = self._marked_kb, self._high_water_kb
        self._marked_kb = now
        if last is None or now is None or now <= last:
            return [{}]
        return [{catalogue.PROCESS_RSS: now * 1024 / MIB}]

    def _read_status(self) -> tuple[int, int, int] | None:
        """(threads, CPUs the main thread may run on, ``VmHWM`` in kB) from /proc/<pid>/status."""

        def read() -> tuple[int, int, int]:
            fields = dict(line.split(b":", 1) for line in self._status.read().split(b"\n") if b":" in line)
            cores = _cpu_count(fields[b"Cpus_allowed_list"].strip())
            return int(fields[b"Threads"]), cores, int(fields[b"VmHWM"].split()[0])

        return attempt(read, (OSError, ValueError, KeyError, IndexError))

    def _waited(self) -> tuple[int, int] | None:
        """(now, run-queue wait so far) in ns; None where the kernel keeps no schedstat."""

        def read() -> tuple[int, int]:
            return time.monotonic_ns(), int(self._schedstat.read().split()[1])

        return attempt(read, (OSError, ValueError, IndexError))

    def _wait_percent(self) -> float:
        """Share of the time since the previous sample the main thread waited for a CPU, %."""
        last, self._last_wait = self._last_wait, self._waited()
        now = self._last_wait
        if last is None or now is None:
            return MISSING
        return catalogue.rate(now[1], last[1], now[0] - last[0]) * 100


def _cpu_count(cpu_list: bytes) -> int:
    """CPUs in a kernel CPU list such as ``0-3,8,10-11`` (7)."""
    count = 0
    for part in cpu_list.split(b","):
        first, _, last = part.partition(b"-")
        count += int(last or first) - int(first) + 1
    return count


def _memory_mb(rss: int | None) -> float:
    """RSS in MB; a process being torn down (killed, exiting) reads 0, which is no reading."""
    return MISSING if not rss else rss / MIB
