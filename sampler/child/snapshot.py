"""What the sampling child knows the moment the backend vanishes: its ring's records copied at
once (``take``), and how the backend died (``Witness``), for its postmortem."""

from __future__ import annotations

import math
import socket
import time
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from ringbuf import Ring
from sampler import catalogue
from sampler.catalogue import MIB, PEAK_SUFFIX
from sampler.child import exitinfo
from sampler.collectors.base import attempt
from sampler.collectors.container import ERRORS, MemoryCgroup
from sampler.ipc.channel import ChildParams
from sampler.ipc.status import ChildStatus
from sampler.postmortems.files import MEMORY_FROM_MARK, MEMORY_FROM_RECORD, CgroupAtDeath, Exit

EXIT_WAIT_SECONDS = 0.5
"""The longest the child waits for the backend's exit status: the kernel has it only once the
backend's parent has reaped it."""
_LIMIT, _USED = catalogue.CONTAINER_MEMORY_LIMIT.name, catalogue.CONTAINER_MEMORY_USED.name


@dataclass(frozen=True)
class Snapshot:
    """What the child knew the moment the backend vanished."""

    params: ChildParams
    host: str
    vanished_at: float
    fields: tuple[str, ...]
    capacity: int
    logged_through: int
    """Records the backend had handled through the last one it logged (0: none)."""
    logged_step: int
    indices: list[int]
    timestamps_ns: list[int]
    """``time.monotonic_ns`` of each record."""
    values: npt.NDArray[np.float64]
    clock: tuple[float, int]
    """(``time.time()``, ``time.monotonic_ns()``) read together, to date the records."""
    exit: Exit | None = None
    """How the backend ended (``Witness.learn``); None when not looked up."""
    memory_cgroup: CgroupAtDeath | None = None
    """The backend's memory cgroup then; None without one, or when not looked up."""
    stall: dict[str, object] | None = None
    """The stall open as the backend vanished (``StallWatch.open_stall``); None when none was."""


class Witness:
    """What the child reads when it starts, to tell later how the backend died: the backend's
    pidfd, and its memory cgroup with the OOM kills counted there so far."""

    def __init__(self, pidfd: int | None, cgroup: MemoryCgroup | None) -> None:
        self.pidfd = pidfd
        self.cgroup = cgroup
        self.oom_kills_at_start = None if cgroup is None else attempt(cgroup.oom_kills, ERRORS)

    def learn(self, snap: Snapshot) -> Snapshot:
        """``snap`` with how the backend ended and its cgroup now; waits up to
        ``EXIT_WAIT_SECONDS`` for the exit status."""
        return replace(
            snap, exit=exitinfo.wait(self.pidfd, EXIT_WAIT_SECONDS), memory_cgroup=self._cgroup(snap)
        )

    def _cgroup(self, snap: Snapshot) -> CgroupAtDeath | None:
        cgroup, at_start = self.cgroup, self.oom_kills_at_start
        if cgroup is None or at_start is None:
            return None
        mark = cgroup.memory_bytes()
        used, limit = mark if mark is not None else _last_memory(snap)
        source = None if used is None else MEMORY_FROM_MARK if mark is not None else MEMORY_FROM_RECORD
        return CgroupAtDeath(
            name=cgroup.name,
            directory=str(cgroup.directory),
            version=2 if cgroup.v2 else 1,
            oom_kills_at_start=at_start,
            oom_kills_at_death=attempt(cgroup.oom_kills, ERRORS),
            memory_used_bytes=used,
            memory_limit_bytes=limit if limit is not None and math.isfinite(limit) else None,
            memory_from=source,
        )


def _last_memory(snap: Snapshot) -> tuple[float | None, float | None]:
    """(used, limit) in bytes from the last record that read the container's memory: its peak
    since the previous record where it has one; (None, None) without any."""
    columns = {name: i for i, name in enumerate(snap.fields)}
    if _USED not in columns:
        return None, None
    for row in snap.values[::-1]:
        readings = [row[columns[n]] for n in (_USED, _USED + PEAK_SUFFIX) if n in columns]
        used = [r for r in readings if math.isfinite(r)]
        if used:
            limit = row[columns[_LIMIT]] if _LIMIT in columns else math.nan
            return float(max(used)) * MIB, float(limit) * MIB if math.isfinite(limit) else None
    return None, None


def take(params: ChildParams, ring: Ring | None, status: ChildStatus, vanished_at: float) -> Snapshot:
    """Copy what the ring holds, at once: the main thread closes it when it next
    finds the channel broken."""
    through, step = status.logged()
    fields: tuple[str, ...] = ()
    capacity = 0
    indices: list[int] = []
    stamps: list[int] = []
    values = np.empty((0, 0))
    if ring is not None:
        fields, capacity = ring.fields, ring.capacity
        try:
            result = ring.read(max(0, ring.head - ring.capacity))
        except (ValueError, AttributeError):  # closed meanwhile: its records are gone
            values = np.empty((0, len(fields)))
        else:
            indices, stamps, values = result.indices.tolist(), result.timestamps_ns.tolist(), result.values
    clock = (time.time(), time.monotonic_ns())
    return Snapshot(params, socket.gethostname(), vanished_at, fields, capacity, through, step, indices,
                    stamps, values, clock)  # fmt: skip
