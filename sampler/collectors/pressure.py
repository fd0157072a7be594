"""Pressure stall information (PSI): the share of time tasks were stalled waiting for CPU, memory or I/O.

Linux 4.20+ counts, per resource, the microseconds during which some task (``some``) or every
non-idle task at once (``full``) was stalled on it: system-wide in /proc/pressure/<resource>, and
per cgroup v2 in <cgroup>/<resource>.pressure. Each signal is that counter's growth since the
previous sample over the wall time between them, in %. The files are found and probed once, in
``open()``: where the kernel has no PSI (no files, or reads failing with EOPNOTSUPP, as under
``psi=0``) their signals are absent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sampler import catalogue
from sampler.catalogue import Signal
from sampler.collectors.base import Collector, Readings, attempt, log
from sampler.collectors.cgroups import ancestries

ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError)
"""What a pressure reading may meet: no PSI (ENOENT, EOPNOTSUPP), the cgroup gone, text that is not PSI's."""

READ_BYTES = 4096
"""One read takes a whole pressure file (two lines of under 100 bytes each)."""

Lines = tuple[tuple[str, Signal], ...]
"""The lines read of one resource's file (``some``, ``full``), each with its signal."""
SYSTEM: tuple[tuple[str, Lines], ...] = (
    ("cpu", (("some", catalogue.PRESSURE_CPU_SOME),)),
    ("memory", (("some", catalogue.PRESSURE_MEMORY_SOME), ("full", catalogue.PRESSURE_MEMORY_FULL))),
    ("io", (("some", catalogue.PRESSURE_IO_SOME), ("full", catalogue.PRESSURE_IO_FULL))),
)
"""Each resource and the lines read of it system-wide, from /proc/pressure (a CPU ``full`` line
is only meaningful per cgroup, and kernels before 5.13 write none)."""
CGROUP: tuple[tuple[str, Lines], ...] = (
    ("cpu", (("some", catalogue.PRESSURE_CGROUP_CPU_SOME),)),
    (
        "memory",
        (("some", catalogue.PRESSURE_CGROUP_MEMORY_SOME), ("full", catalogue.PRESSURE_CGROUP_MEMORY_FULL)),
    ),
    ("io", (("some", catalogue.PRESSURE_CGROUP_IO_SOME), ("full", catalogue.PRESSURE_CGROUP_IO_FULL))),
)
"""The same of the backend's cgroup, from its cgroup v2 directory."""
SYSTEM_NAMES = tuple(signal.name for _, lines in SYSTEM for _, signal in lines)
CGROUP_NAMES = tuple(signal.name for _, lines in CGROUP for _, signal in lines)


@dataclass(frozen=True)
class _File:
    """One pressure file: its path, the lines read of it (``some``, ``full``) and their signals."""

    path: str
    lines: tuple[str, ...]
    signals: tuple[Signal, ...]

    def totals(self) -> list[int]:
        """Its ``total=`` counters now (µs), in ``lines`` order; raises one of ``ERRORS`` on failure."""
        return _totals(_read(self.path), self.lines)


def _read(path: str) -> bytes:
    """The pressure file's text; OSError where there is none (EOPNOTSUPP: the kernel has PSI off)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, READ_BYTES)
    finally:
        os.close(fd)


def _totals(text: bytes, lines: tuple[str, ...]) -> list[int]:
    """The ``total=`` counters (µs) of ``lines`` in a pressure file's ``text``
    (``some avg10=0.12 avg60=0.05 avg300=0.01 total=123456``, one line per kind)."""
    totals: dict[str, int] = {}
    for line in text.decode("ascii").splitlines():
        kind, _, fields = line.partition(" ")
        for field in fields.split():
            if field.startswith("total="):
                totals[kind] = int(field.removeprefix("total="))
    missing = [kind for kind in lines if kind not in totals]
    if missing:
        raise ValueError(f"no {' or '.join(missing)} total in {text[:200]!r}")
    return [totals[kind] for kind in lines]


def _files(directory: Path, pattern: str, resources: tuple[tuple[str, Lines], ...]) -> list[_File]:
    """The three resources' files in ``directory`` (``pattern`` names one from its resource)."""
    return [
        _File(
            str(directory / pattern.format(resource)),
            tuple(line for line, _ in lines),
            tuple(signal for _, signal in lines),
        )
        for resource, lines in resources
    ]


INITIAL_CGROUP_NAMESPACE = "cgroup:[4026531835]"
"""``/proc/<pid>/ns/cgroup`` of a process in the host's own cgroup namespace (the kernel's
fixed inode for it, ``PROC_CGROUP_INIT_INO``)."""


def _cgroup_directory(pid: int, proc_root: str, cgroup_root: str) -> Path | None:
    """The cgroup v2 directory of process ``pid``; None outside cgroup v2, out of reach, or at
    the host's root cgroup, whose pressure is the system's (the same counters) again. A
    container's root under its own cgroup namespace is its cgroup, and counts."""
    try:
        ancestry, _ = ancestries(pid, proc_root, cgroup_root, ())
    except OSError as exc:  # the process is gone, or is_dir() was denied
        log.debug("resource monitor: no cgroup pressure for process %d: %s", pid, exc)
        return None
    if len(ancestry) == 1 and _namespace(pid, proc_root) == INITIAL_CGROUP_NAMESPACE:
        return None
    return ancestry[0] if ancestry else None


def _namespace(pid: int, proc_root: str) -> str | None:
    try:
        return os.readlink(Path(proc_root, str(pid), "ns", "cgroup"))
    except OSError:  # no cgroup namespaces (before Linux 4.6), or the process is gone
        return None


class PressureCollector(Collector):
    """Share of the wall time since the previous sample (%) that tasks were stalled on CPU,
    memory and I/O, system-wide and in the backend's cgroup v2. The first sample has no
    window, and a counter that went backwards (the cgroup was replaced) none either: NaN."""

    category = "pressure"

    def __init__(self, files: Sequence[_File]) -> None:
        self._files = tuple(files)
        self._last: list[tuple[int, list[int]] | None] = [None] * len(self._files)
        """Per file, (monotonic ns, its totals in µs) at the previous sample; None: no window."""

    @classmethod
    def open(
        cls, pid: int, *, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
    ) -> PressureCollector | None:
        """The collector of the system's pressure and process ``pid``'s cgroup's; None when no
        pressure file can be read. Each file is read once here: one that is missing or fails
        (EOPNOTSUPP where the kernel has PSI off) is left out."""
        files = _files(Path(proc_root, "pressure"), "{}", SYSTEM)
        cgroup = _cgroup_directory(pid, proc_root, cgroup_root)
        if cgroup is not None:
            files += _files(cgroup, "{}.pressure", CGROUP)
        readable = [file for file in files if attempt(file.totals, ERRORS) is not None]
        return cls(readable) if readable else None

    def signals(self) -> tuple[Signal, ...]:
        return tuple(signal for file in self._files for signal in file.signals)

    def read(self) -> Readings:
        readings: Readings = {}
        for index, file in enumerate(self._files):
            totals = attempt(file.totals, ERRORS)
            now = time.monotonic_ns()
            last = self._last[index]
            self._last[index] = None if totals is None else (now, totals)
            if totals is None or last is None:
                continue
            elapsed_us = (now - last[0]) / 1000
            for signal, total, before in zip(file.signals, totals, last[1], strict=True):
                # The kernel's clock and ours are read a moment apart: a fully stalled window
                # may come out a hair above 100 %. (NaN first: min() keeps it, no rate.)
                readings[signal] = min(catalogue.rate(total, before, elapsed_us) * 100, 100.0)
        return readings
