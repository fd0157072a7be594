"""The backend process as seen from outside: CPU, threads, memory."""

from __future__ import annotations

import psutil

from sampler import catalogue
from sampler.collectors.base import MB, MISSING, Collector, attempt


class ProcessCollector(Collector):
    """Readings of process ``pid`` (the backend, never the sampling child).

    ``cpu_utilization_percent`` follows psutil: 100 per fully busy core, so a
    process using four cores reads 400. CPU % and memory (RSS) are tracked
    between records: the tracked CPU % is over the inner window, through a
    second handle whose CPU window is its own, so ``sample()``'s stays the
    whole interval.
    """

    category = "process"
    names = (
        "resource/process/cpu_utilization_percent",
        "resource/process/cpu_threads_in_use",
        "resource/process/memory_in_use_mb",
        "resource/process/memory_in_use_percent",
        "resource/process/memory_available_mb",
        "resource/process/cpu_cores_allowed",
    )
    tracked = catalogue.peaked(names)
    averaged = catalogue.averaged(names)

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._process = psutil.Process(pid)
        self._process.cpu_percent(interval=None)  # prime: the first call has no window
        self._inner = psutil.Process(pid)
        self._inner.cpu_percent(interval=None)

    def sample(self) -> list[float]:
        proc = self._process
        with proc.oneshot():
            cpu = attempt(lambda: proc.cpu_percent(interval=None))
            threads = attempt(proc.num_threads)
            rss = attempt(lambda: proc.memory_info().rss)
            percent = attempt(proc.memory_percent)
        cores = attempt(proc.cpu_affinity)
        memory = attempt(psutil.virtual_memory)
        return [
            MISSING if cpu is None else float(cpu),
            MISSING if threads is None else float(threads),
            _memory_mb(rss),
            MISSING if percent is None else float(percent),
            MISSING if memory is None else memory.available / MB,
            MISSING if not cores else float(len(cores)),
        ]

    def sample_tracked(self) -> list[float]:
        proc = self._inner
        cpu = attempt(lambda: proc.cpu_percent(interval=None))
        rss = attempt(lambda: proc.memory_info().rss)
        return [MISSING if cpu is None else float(cpu), _memory_mb(rss)]


def _memory_mb(rss: int | None) -> float:
    """RSS in MB; a process being torn down (killed, exiting) reads 0, which is no reading."""
    return MISSING if not rss else rss / MB
