"""Cgroup limits of the backend: its memory limit and usage, its CPU quota and throttling.

Only what has a limit is reported; a process under no limit at all has no container collector.
The cgroup files are found once, in ``open()`` (``sampler.collectors.cgroups``): cgroup v2
first, then cgroup v1. The limit that applies is the smallest over the process's cgroup and its
ancestors up to the mount root.

``memory_cgroup()`` finds the same memory cgroup for the child's postmortem: its OOM kills
(v2 ``memory.events``, v1 ``memory.oom_control``, ``oom_kill N``), its high-water mark and limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sampler import catalogue
from sampler.catalogue import MIB, Signal
from sampler.collectors.base import MISSING, Collector, Readings, attempt, log
from sampler.collectors.cgroups import ancestries

ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError)
"""What a cgroup reading may meet: the file gone with its cgroup, or text that is not a number."""

V1_UNLIMITED_BYTES = 1 << 62
"""cgroup v1 writes "no memory limit" as the largest page-aligned counter (about 2**63 bytes)."""

MEMORY = (
    catalogue.CONTAINER_MEMORY_LIMIT,
    catalogue.CONTAINER_MEMORY_USED,
    catalogue.CONTAINER_MEMORY_PERCENT,
)
"""The signals read under a memory limit."""
CPU = (catalogue.CONTAINER_CPU_QUOTA, catalogue.CONTAINER_CPU_THROTTLED)
"""The signals read under a CPU quota."""
MEMORY_NAMES = tuple(s.name for s in catalogue.record_layout("container", MEMORY))
CPU_NAMES = tuple(s.name for s in catalogue.record_layout("container", CPU))
"""Their fields, the throttled time's rate included."""


def _read(path: Path) -> str:
    return path.read_text().strip()


def _v2_memory_limit_bytes(level: Path) -> float:
    text = _read(level / "memory.max")
    return math.inf if text == "max" else int(text)


def _v1_memory_limit_bytes(level: Path) -> float:
    value = int(_read(level / "memory.limit_in_bytes"))
    return math.inf if value >= V1_UNLIMITED_BYTES else value


def _v2_quota_cores(level: Path) -> float:
    quota, period = _read(level / "cpu.max").split()
    return math.inf if quota == "max" else int(quota) / int(period)


def _v1_quota_cores(level: Path) -> float:
    quota = int(_read(level / "cpu.cfs_quota_us"))
    return math.inf if quota < 0 else quota / int(_read(level / "cpu.cfs_period_us"))


@dataclass(frozen=True)
class _Limit:
    """One limit along a cgroup's ancestry: ``levels`` are the cgroups that can set it, the
    process's own first; ``read`` gives one level's limit (inf: none there)."""

    levels: tuple[Path, ...]
    read: Callable[[Path], float]

    def value(self) -> float:
        """The smallest limit over the levels, inf when none is set; raises if any level is unreadable."""
        return min((self.read(level) for level in self.levels), default=math.inf)

    def binding(self) -> Path | None:
        """The level whose limit is the smallest now; None when no level sets one or one is unreadable."""
        limits = attempt(lambda: [self.read(level) for level in self.levels], ERRORS)
        if not limits or not math.isfinite(min(limits)):
            return None
        return self.levels[limits.index(min(limits))]


@dataclass(frozen=True)
class _Memory:
    limit_bytes: _Limit
    usage_file: Path


@dataclass(frozen=True)
class _Cpu:
    quota_cores: _Limit
    stat_file: Path
    """cpu.stat of the cgroup whose quota binds: the kernel counts throttling where the quota is."""
    throttled_key: str
    throttled_units_per_second: float


def _with_file(ancestry: list[Path], name: str) -> tuple[Path, ...]:
    return tuple(level for level in ancestry if (level / name).is_file())


def _find_memory(v2: list[Path], v1: list[Path]) -> _Memory | None:
    for ancestry, limit_file, usage_file, read in (
        (v2, "memory.max", "memory.current", _v2_memory_limit_bytes),
        (v1, "memory.limit_in_bytes", "memory.usage_in_bytes", _v1_memory_limit_bytes),
    ):
        levels = _with_file(ancestry, limit_file)
        if levels:
            limit = _Limit(levels, read)
            return _Memory(limit, levels[0] / usage_file) if limit.binding() else None
    return None


def _find_cpu(v2: list[Path], v1: list[Path]) -> _Cpu | None:
    for ancestry, limit_file, read, key, per_second in (
        (v2, "cpu.max", _v2_quota_cores, "throttled_usec", 1e6),
        (v1, "cpu.cfs_quota_us", _v1_quota_cores, "throttled_time", 1e9),
    ):
        levels = _with_file(ancestry, limit_file)
        if levels:
            limit = _Limit(levels, read)
            binding = limit.binding()
            return _Cpu(limit, binding / "cpu.stat", key, per_second) if binding else None
    return None


def _finite(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else MISSING


class ContainerCollector(Collector):
    """The cgroup limits that hold one process: memory limit and usage when a memory limit is
    set, CPU quota and throttled time when a CPU quota is set."""

    category = "container"

    def __init__(self, memory: _Memory | None, cpu: _Cpu | None) -> None:
        self._memory = memory
        self._cpu = cpu
        self._high_water = None if memory is None else self._read_high_water(memory)
        """The cgroup's usage high-water mark (bytes) at the previous ``marks()``."""

    @classmethod
    def open(
        cls, pid: int, *, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
    ) -> ContainerCollector | None:
        """The collector of process ``pid``; None when it runs under no memory or CPU limit, or
        its cgroups cannot be read (it is gone, or they are out of reach)."""
        try:
            v2, v1 = ancestries(pid, proc_root, cgroup_root, ("memory", "cpu"))
            memory = _find_memory(v2, v1["memory"])
            cpu = _find_cpu(v2, v1["cpu"])
        except OSError as exc:  # is_dir() and is_file() raise for denied access, too long a name
            log.debug("resource monitor: no container signals for process %d: %s", pid, exc)
            return None
        if memory is None and cpu is None:
            return None
        return cls(memory, cpu)

    def _used_bytes(self, memory: _Memory) -> float | None:
        return attempt(lambda: int(_read(memory.usage_file)), ERRORS)

    def _throttled_seconds(self, cpu: _Cpu) -> float | None:
        def read() -> float:
            for line in _read(cpu.stat_file).splitlines():
                key, _, value = line.partition(" ")
                if key == cpu.throttled_key:
                    return int(value) / cpu.throttled_units_per_second
            raise ValueError(f"no {cpu.throttled_key} in {cpu.stat_file}")

        return attempt(read, ERRORS)

    def signals(self) -> tuple[Signal, ...]:
        return (MEMORY if self._memory else ()) + (CPU if self._cpu else ())

    def read(self) -> Readings:
        readings: Readings = {}
        if self._memory:
            limit = _finite(attempt(self._memory.limit_bytes.value, ERRORS))
            used = _finite(self._used_bytes(self._memory))
            readings[catalogue.CONTAINER_MEMORY_LIMIT] = limit / MIB
            readings[catalogue.CONTAINER_MEMORY_USED] = used / MIB
            readings[catalogue.CONTAINER_MEMORY_PERCENT] = used / limit * 100 if limit > 0 else MISSING
        if self._cpu:
            readings[catalogue.CONTAINER_CPU_QUOTA] = _finite(attempt(self._cpu.quota_cores.value, ERRORS))
            readings[catalogue.CONTAINER_CPU_THROTTLED] = _finite(self._throttled_seconds(self._cpu))
        return readings

    def read_tracked(self) -> list[Readings]:
        """The memory usage (MB), reading only the usage file."""
        if not self._memory:
            return [{}]
        return [{catalogue.CONTAINER_MEMORY_USED: _finite(self._used_bytes(self._memory)) / MIB}]

    def read_marks(self) -> list[Readings]:
        """The usage peak (MB) when the cgroup's high-water mark (v2 ``memory.peak``, v1
        ``memory.max_usage_in_bytes``, beside the usage file) rose since the previous call. The
        mark is the container runtime's too: it is read, never reset."""
        if not self._memory:
            return [{}]
        last, self._high_water = self._high_water, self._read_high_water(self._memory)
        now = self._high_water
        if last is None or now is None or now <= last:
            return [{}]
        return [{catalogue.CONTAINER_MEMORY_USED: now / MIB}]

    def _read_high_water(self, memory: _Memory) -> int | None:
        name = "memory.peak" if memory.usage_file.name == "memory.current" else "memory.max_usage_in_bytes"
        return attempt(lambda: int(_read(memory.usage_file.with_name(name))), ERRORS)


def _oom_kills(events_file: Path) -> int:
    for line in _read(events_file).splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    raise ValueError(f"no oom_kill in {events_file} (cgroup v1 before Linux 4.13)")


@dataclass(frozen=True)
class MemoryCgroup:
    """The memory cgroup that holds a process: ``levels`` are its directory and its ancestors
    up to the mount root (``levels[-1]``), ``v2`` whether it is the unified hierarchy's."""

    levels: tuple[Path, ...]
    v2: bool

    @property
    def directory(self) -> Path:
        return self.levels[0]

    @property
    def name(self) -> str:
        """The cgroup as /proc/<pid>/cgroup names it: its path under the mount."""
        below = self.directory.relative_to(self.levels[-1])
        return "/" if below == Path() else "/" + below.as_posix()

    def oom_kills(self) -> int:
        """How many of its processes the OOM killer has killed since the cgroup was made (the
        kernel counts a kill in the victim's cgroup; v2 adds those of its descendants).
        ``OSError`` or ``ValueError`` when it cannot be read."""
        return _oom_kills(self.directory / ("memory.events" if self.v2 else "memory.oom_control"))

    def _limit(self) -> _Limit:
        limit_file, read = (
            ("memory.max", _v2_memory_limit_bytes)
            if self.v2
            else ("memory.limit_in_bytes", _v1_memory_limit_bytes)
        )
        return _Limit(_with_file(list(self.levels), limit_file), read)

    def memory_bytes(self) -> tuple[float, float] | None:
        """(high-water mark, limit) in bytes of the level whose limit binds (its own cgroup when
        none does: limit inf), read and never reset (v2 ``memory.peak``, Linux 5.19+; v1
        ``memory.max_usage_in_bytes``); None when the mark cannot be read."""
        limit = attempt(self._limit, ERRORS)
        if limit is None:
            return None
        level = limit.binding() or self.directory
        peak_file = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        peak = attempt(lambda: int(_read(level / peak_file)), ERRORS)
        bound = attempt(limit.value, ERRORS)
        return None if peak is None else (peak, math.inf if bound is None else bound)


def memory_cgroup(
    pid: int, *, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
) -> MemoryCgroup | None:
    """The memory cgroup of process ``pid`` (v2 where its cgroup there has the memory controller,
    else v1's); None when it has none whose OOM kills can be counted (the v2 root cgroup), or
    its cgroups cannot be read (it is gone, or they are out of reach)."""
    try:
        v2, v1 = ancestries(pid, proc_root, cgroup_root, ("memory",))
        for ancestry, events_file, is_v2 in (
            (v2, "memory.events", True),
            (v1["memory"], "memory.oom_control", False),
        ):
            if ancestry and (ancestry[0] / events_file).is_file():
                return MemoryCgroup(tuple(ancestry), is_v2)
    except OSError as exc:
        log.debug("resource monitor: no memory cgroup of process %d: %s", pid, exc)
    return None
