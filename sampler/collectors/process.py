"""The backend process as seen from outside: CPU, threads, memory."""

from __future__ import annotations

import time

import psutil

from sampler import catalogue
from sampler.catalogue import MIB
from sampler.collectors.base import MISSING, Collector, Readings, attempt
from sampler.collectors.host import ProcFile
from sampler.collectors.tree import Stat, parse_stat

RSS = catalogue.PROCESS_RSS.name


class ProcessCollector(Collector):
    """Readings of process ``pid`` (the backend, never the sampling child).

    ``cpu_utilization_percent`` follows psutil: 100 per fully busy core, so a
    process using four cores reads 400; ``cpu_seconds`` is the CPU time (user +
    system) it used since it started, the counter that percentage is the rate of.
    CPU % and memory (RSS) are tracked between records: the tracked CPU % is
    over the inner window, through a second handle whose CPU window is its own,
    so ``sample()``'s stays the whole interval.
    """

    category = "process"

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._process = psutil.Process(pid)
        self._process.cpu_percent(interval=None)  # prime: the first call has no window
        self._stat = ProcFile(f"/proc/{pid}/stat")
        stat = self._read_stat()
        self._inner = None if stat is None else (stat.cpu_seconds, time.monotonic())
        """(CPU seconds, monotonic s) at the previous tracked reading: its CPU window is its own."""
        self._schedstat = f"/proc/{pid}/schedstat"
        self._status = f"/proc/{pid}/status"
        status = self._read_status()
        self._high_water_kb = None if status is None else status[2]
        """The backend's RSS high-water mark (``VmHWM``, kB) as the latest ``sample()`` read it."""
        self._marked_kb = self._high_water_kb
        """The same mark at the previous ``marks()``."""
        self._last_wait: tuple[int, int] | None = self._waited()
        """(monotonic ns, ns the main thread waited on a run queue) at the previous sample."""

    def read(self) -> Readings:
        proc = self._process
        with proc.oneshot():
            cpu = attempt(lambda: proc.cpu_percent(interval=None))
            times = attempt(proc.cpu_times)  # the stat file cpu_percent() read, cached by oneshot()
            rss = attempt(lambda: proc.memory_info().rss)
            percent = attempt(proc.memory_percent)
        status = self._read_status()  # psutil's num_threads() would read the same file again
        threads, cores, self._high_water_kb = (None, None, None) if status is None else status
        memory = attempt(psutil.virtual_memory)
        readings: Readings = {catalogue.PROCESS_CPU_WAIT: self._wait_percent()}
        if cpu is not None:
            readings[catalogue.PROCESS_CPU] = float(cpu)
        if threads is not None:
            readings[catalogue.PROCESS_THREADS] = float(threads)
        readings[catalogue.PROCESS_RSS] = _memory_mb(rss)
        if percent is not None:
            readings[catalogue.PROCESS_RSS_PERCENT] = float(percent)
        if memory is not None:
            readings[catalogue.PROCESS_MEMORY_AVAILABLE] = memory.available / MIB
        if cores:
            readings[catalogue.PROCESS_CORES] = float(cores)
        if times is not None:
            readings[catalogue.PROCESS_CPU_SECONDS] = times.user + times.system
        return readings

    def read_tracked(self) -> list[Readings]:
        """CPU % (as psutil's ``cpu_percent``) and RSS from one read of /proc/<pid>/stat, the
        file psutil would open for the first, beside ``statm`` for the second."""
        stat, at, last = self._read_stat(), time.monotonic(), self._inner
        if stat is None:
            return [{}]
        self._inner = (stat.cpu_seconds, at)
        readings = {catalogue.PROCESS_RSS: _memory_mb(stat.rss_bytes)}
        if last is not None and at > last[1]:
            readings[catalogue.PROCESS_CPU] = round((stat.cpu_seconds - last[0]) / (at - last[1]) * 100, 1)
        return [readings]

    def _read_stat(self) -> Stat | None:
        data = attempt(self._stat.read)
        return None if data is None else parse_stat(data)

    def close(self) -> None:
        self._stat.close()

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
            with open(self._status, "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
            cores = _cpu_count(fields[b"Cpus_allowed_list"].strip())
            return int(fields[b"Threads"]), cores, int(fields[b"VmHWM"].split()[0])

        return attempt(read, (OSError, ValueError, KeyError, IndexError))

    def _waited(self) -> tuple[int, int] | None:
        """(now, run-queue wait so far) in ns; None where the kernel keeps no schedstat."""

        def read() -> tuple[int, int]:
            with open(self._schedstat) as f:
                return time.monotonic_ns(), int(f.read().split()[1])

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
