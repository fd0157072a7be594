"""The backend's process tree: the backend and all its descendants, read as one."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil

from sampler import catalogue
from sampler.catalogue import MIB
from sampler.collectors.base import Collector, Readings, attempt
from sampler.collectors.host import TICKS_PER_SECOND

SAMPLING_CHILD_PROGRAM = "from sampler.child.main import main"
"""What the ``-c`` program of every sampling child runs: ``sampler.supervision.spawn`` builds its
bootstrap around it, and the tree knows any monitor's child by it, whichever backend, and
whichever version of this package, started it."""

PSS_CPU_SHARE = 0.005
"""Share of one core that PSS passes may take on average: a pass that cost C CPU seconds
is followed by the next no sooner than C / PSS_CPU_SHARE seconds later."""


def _smaps_rollup(path: Path) -> tuple[int, int] | None:
    """(PSS, USS) bytes from an smaps_rollup file (which gives kB), or None where the file is
    missing (not Linux, kernel < 4.14, process gone), unreadable or malformed."""
    data = attempt(path.read_bytes)
    if data is None:
        return None
    pss = None
    uss = 0
    for line in data.splitlines():
        key, _, rest = line.partition(b":")
        if key == b"Pss" or key.startswith(b"Private_"):
            fields = rest.split()
            if not fields or not fields[0].isdigit():
                return None
            if key == b"Pss":
                pss = int(fields[0]) * 1024
            else:
                uss += int(fields[0]) * 1024
    return None if pss is None else (pss, uss)


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Stat(NamedTuple):
    """One reading of a ``/proc/<pid>/stat`` file."""

    cpu_seconds: float
    """User + system CPU time of the process (every thread of it, those that ended too)."""
    reaped_cpu_seconds: float
    """User + system CPU time of the children it waited for, and of theirs (psutil's
    ``children_user`` + ``children_system``)."""
    rss_bytes: int
    zombie: bool
    """Exited, not yet waited for: no process to read but its CPU times, which are final."""


def read_stat(path: Path) -> Stat | None:
    """CPU times and RSS from a ``/proc/<pid>/stat`` file, read once; None when the process is
    gone or the file cannot be parsed. What psutil reads from two files (``stat`` and ``statm``)
    through a handle's cache, for a reading taken ten times a second in every process of the tree."""
    data = attempt(path.read_bytes)  # a failure for want of descriptors or memory is counted
    return None if data is None else parse_stat(data)


def parse_stat(data: bytes) -> Stat | None:
    """``read_stat``'s reading from the file's bytes; None when they cannot be parsed."""
    fields = data[data.rfind(b")") + 2 :].split()  # after the command name, which may hold anything
    # fields[0] is the state (field 3 of proc(5)): utime, stime, cutime, cstime and rss are
    # fields 14 to 17 and 24.
    if len(fields) < 22:
        return None
    try:
        # Each field in seconds, then summed, as psutil's ``cpu_times()`` gives them
        own = int(fields[11]) / TICKS_PER_SECOND + int(fields[12]) / TICKS_PER_SECOND
        reaped = int(fields[13]) / TICKS_PER_SECOND + int(fields[14]) / TICKS_PER_SECOND
        rss = int(fields[21]) * _PAGE_BYTES
    except ValueError:
        return None
    return Stat(own, reaped, rss, fields[0] == b"Z")


def runs_a_sampling_child(cmdline: list[str]) -> bool:
    """Whether ``cmdline`` is a sampling child's: ``python -c <program> ...`` whose program
    runs ``SAMPLING_CHILD_PROGRAM``."""
    return len(cmdline) > 2 and cmdline[1] == "-c" and SAMPLING_CHILD_PROGRAM in cmdline[2]


@dataclass
class _Member:
    """One process of the tree and its readings at the start of each window."""

    proc: psutil.Process
    stat: Path
    """Its ``/proc/<pid>/stat``, which every reading of its CPU time and RSS reads."""
    record_cpu_seconds: float
    """CPU time at the previous ``sample()``; 0 for a process born since, so all its CPU counts."""
    tracked_cpu_seconds: float
    tracked_at: float
    """``time.monotonic()`` when ``tracked_cpu_seconds`` was read."""
    rss_bytes: int
    memory_bytes: int = 0
    private_bytes: int = 0
    """RSS, memory in use (PSS, or its fallback RSS) and USS at the last PSS pass; for a
    process found since, its RSS when found, 0 and 0."""

    def memory_estimate(self, rss: int) -> int:
        """Memory in use now (bytes), from its RSS now: private growth raises PSS and RSS alike."""
        return max(0, self.memory_bytes + rss - self.rss_bytes)

    def shared_bytes(self) -> int:
        """Its share of the pages it shared at the last pass: on its exit, the other sharers'."""
        return max(0, self.memory_bytes - self.private_bytes)


class ProcessTreeCollector(Collector):
    """Process ``pid`` (the backend) and its live descendants (DataLoader and compile workers).

    - ``process_count``: the backend plus its live descendants (zombies left out).
    - ``cpu_utilization_percent``: summed CPU of the tree since the previous ``sample()``,
      100 per fully busy core as psutil's ``cpu_percent``. A process born during the window
      counts from its birth; one that exits during it loses its CPU since the window began.
    - ``cpu_seconds``: CPU time of the tree, the sum over its processes (zombies included) of
      their own and their reaped children's (``cutime`` and ``cstime``): a worker that exits
      keeps its time, first as a zombie, then in the member that waited for it. Time that
      leaves the tree (a process waited for outside it, such as an orphan reparented to init)
      is carried, so the counter never falls.
    - ``memory_in_use_mb``: the sum of each process's PSS (proportional set size: a page
      shared by n processes counts 1/n in each), so shared pages, such as a parent's memory
      inherited by forked workers, count once. PSS is read from ``/proc/<pid>/smaps_rollup``
      (Linux >= 4.14). Where that file is missing or unreadable (not Linux, permission
      denied) that one process contributes its RSS instead: an upper bound, as its shared
      pages then count in full.

    Cost. Reading PSS walks the page tables of the process in the kernel, about 10 ms of CPU
    per GiB resident in 4 KiB pages, and a forked worker inherits its parent's page tables:
    a 10 GiB backend with 8 workers costs near a second of CPU per full read. So a PSS pass
    (every process's smaps_rollup) runs at a ``sample()`` only when the CPU it took last
    time allows it within ``pss_cpu_share`` of one core: at every record for trees of up to
    a few GiB, less often for larger ones. Between passes, and in ``sample_tracked()``, each
    process's memory is estimated as its memory at the last pass plus the change of its RSS
    since (memory it allocates and touches raises both alike), never below 0;
    a process found since counts only its growth since it was found (a forked worker's
    inherited pages are in its parent's reading); a process that exits takes its private
    memory (USS) with it but leaves its share of the pages it shared, which now count in the
    other sharers' PSS. Until the next pass corrects it, this is short by the size at birth
    of a process that exec'd, and long by memory newly shared, or shared only by processes
    that all exited.

    Sampling children are left out (``runs_a_sampling_child``, read from each command line at
    each ``sample()``): the one running the collector, and any other monitor's, such as the
    watched backend's own when ``run --pid`` watches a backend that runs a monitor too.
    Descendants are found (``children(recursive=True)``, which reads the parent of every
    process on the machine) only in ``sample()``. ``sample_tracked()`` reads only the CPU
    times and RSS of the processes found then, from one ``/proc/<pid>/stat`` each
    (``read_stat``): a process started since is seen from the next record on. Its CPU % has
    its own window per process, since that process's previous ``sample_tracked()``.

    A process that exits is dropped from the sums, never a reason for NaN; the readings are
    NaN only when the backend itself is gone.
    """

    category = "process_tree"

    def __init__(self, pid: int, procfs: str = "/proc", pss_cpu_share: float = PSS_CPU_SHARE) -> None:
        """``procfs``: where ``<pid>/smaps_rollup`` is read (tests point it elsewhere);
        ``pss_cpu_share``: the share of one core PSS passes may take (``math.inf``: a pass at
        every ``sample()``). Raises ``psutil.NoSuchProcess`` when ``pid`` is gone (or cannot
        be read)."""
        self.pid = pid
        self._procfs = Path(procfs)
        self._pss_cpu_share = pss_cpu_share
        self._root = psutil.Process(pid)
        self._members: dict[int, _Member] = {}
        """After the first scan, always holds the backend: every reading notices when it is gone."""
        self._exited_shared_bytes = 0
        """Pages shared by the processes that exited since the last pass, their share of them."""
        self._sampled_at = time.monotonic()
        self._next_pass_at = self._sampled_at
        self._cpu_total = 0.0
        """``cpu_seconds`` as last reported."""
        self._cpu_carried = 0.0
        """CPU time that left the tree: added to the tree's sum so that the counter never falls."""
        if self._scan(self._sampled_at, born_in_window=False) is None:
            raise psutil.NoSuchProcess(pid)

    def read(self) -> Readings:
        now = time.monotonic()
        totals = self._scan(now, born_in_window=True)
        if totals is None:
            return {}
        count, cpu_seconds, memory_bytes = totals
        elapsed = now - self._sampled_at
        self._sampled_at = now
        return {
            catalogue.TREE_PROCESSES: float(count),
            catalogue.TREE_CPU: cpu_seconds / elapsed * 100,
            catalogue.TREE_MEMORY: memory_bytes / MIB,
            catalogue.TREE_CPU_SECONDS: self._cpu_total,
        }

    def _scan(self, now: float, born_in_window: bool) -> tuple[int, float, int] | None:
        """Find the tree anew and read it: (processes, CPU seconds since the previous scan,
        memory bytes), and update the tree's CPU time; None when the backend is gone.
        ``born_in_window``: the processes new since the previous scan were born after it
        (false only for the first scan)."""
        descendants = attempt(lambda: self._root.children(recursive=True))
        if descendants is None:
            return None
        found: list[tuple[_Member, int]] = []  # with its RSS now
        cpu_seconds = 0.0
        tree_cpu_seconds = 0.0
        for proc in [self._root, *descendants]:
            if proc is not self._root and runs_a_sampling_child(attempt(proc.cmdline) or []):
                continue  # a monitor's, not the training's (the backend itself is never left out)
            member = self._members.get(proc.pid)
            if member is not None and member.proc != proc:
                member = None  # its pid reused (create time differs): a new process
            stat = member.stat if member is not None else Path(f"/proc/{proc.pid}/stat")
            reading = read_stat(stat)
            if reading is None:
                continue  # exited and waited for since it was listed
            tree_cpu_seconds += reading.cpu_seconds + reading.reaped_cpu_seconds
            if reading.zombie:
                continue  # exited: its CPU time counts until it moves to the reaper's, nothing else
            cpu, rss = reading.cpu_seconds, reading.rss_bytes
            if member is None:
                member = _Member(proc, stat, 0.0 if born_in_window else cpu, cpu, now, rss)
            cpu_seconds += max(0.0, cpu - member.record_cpu_seconds)
            member.record_cpu_seconds = cpu
            found.append((member, rss))
        members = {member.proc.pid: member for member, _ in found}
        if self.pid not in members:
            return None  # the backend exited, or turned zombie, since it was listed
        # The sum falls when time leaves the tree: a process waited for outside it (an orphan
        # reparented to init) takes its time along. Prometheus reads any fall of a counter as a
        # reset and rate() then counts the whole value again, a spike: carry what was lost.
        self._cpu_carried = max(self._cpu_carried, self._cpu_total - tree_cpu_seconds)
        self._cpu_total = tree_cpu_seconds + self._cpu_carried
        full_pass = now >= self._next_pass_at
        pass_cpu_seconds = 0.0
        memory_bytes = 0
        for member, rss in found:  # after every CPU reading, so that those are taken close together
            if full_pass:
                began = time.thread_time()
                rollup = _smaps_rollup(self._procfs / str(member.proc.pid) / "smaps_rollup")
                pass_cpu_seconds += time.thread_time() - began
                member.rss_bytes = rss
                member.memory_bytes, member.private_bytes = (rss, rss) if rollup is None else rollup
                memory_bytes += member.memory_bytes
            else:
                memory_bytes += member.memory_estimate(rss)
        if full_pass:
            self._next_pass_at = now + pass_cpu_seconds / self._pss_cpu_share
            self._exited_shared_bytes = 0
        else:
            exited = (m for pid, m in self._members.items() if members.get(pid) is not m)
            self._exited_shared_bytes += sum(m.shared_bytes() for m in exited)
        self._members = members
        return len(members), cpu_seconds, memory_bytes + self._exited_shared_bytes

    def read_tracked(self) -> list[Readings]:
        now = time.monotonic()
        cpu_percent = 0.0
        memory_bytes = 0
        for pid, member in list(self._members.items()):
            reading = read_stat(member.stat)
            if reading is None or reading.zombie:
                if pid == self.pid:
                    return [{}]
                self._exited_shared_bytes += self._members.pop(pid).shared_bytes()
                continue
            cpu, rss = reading.cpu_seconds, reading.rss_bytes
            # max(): a pid reused since the last record reads a smaller, unrelated CPU time
            cpu_percent += max(0.0, cpu - member.tracked_cpu_seconds) / (now - member.tracked_at) * 100
            member.tracked_cpu_seconds, member.tracked_at = cpu, now
            memory_bytes += member.memory_estimate(rss)
        return [
            {
                catalogue.TREE_CPU: cpu_percent,
                catalogue.TREE_MEMORY: (memory_bytes + self._exited_shared_bytes) / MIB,
            }
        ]
