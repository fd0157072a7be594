"""Reading one sampling child: wait for a record, read it, emit it, and notice
when the child died or is stuck.

The ``WL-ResourceMonitor`` thread spends its life in ``select()`` on two pipes,
which releases the GIL: the child's wake-up pipe (a byte per record, EOF when
the child exits) and the monitor's stop pipe. Its only timeout is the moment
the child would be overdue (the current phase's deadline, read from the status
block), so in steady state it wakes once per record and never polls.
"""

from __future__ import annotations

import enum
import os
import select
import time

from ringbuf import Ring
from sampler.emit import Emitter
from sampler.spawn import SamplingChild
from sampler.stats import MonitorStats
from sampler.status import PHASE_IDLE, PHASE_STARTING, ChildStatus, Snapshot

STARTUP_DEADLINE_SECONDS = 30.0
"""Interpreter start-up and imports may take this long before the child counts
as stuck (a loaded machine can take seconds to import numpy)."""
STALL_SLACK_NS = 500_000_000
"""Waking this much later than planned means the reader itself was stalled."""
STALL_GRACE_NS = 1_000_000_000
"""After such a stall the child gets this long to show progress before a hang is declared."""


class Outcome(enum.Enum):
    STOPPED = "stopped"
    """``stop()`` was called."""
    EXITED = "exited"
    """The child's wake-up pipe closed: it exited or was killed."""
    HUNG = "hung"
    """The child overran a deadline; it is still running and must be killed."""


class ChildReader:
    """Serves one child until it stops, exits or hangs."""

    def __init__(
        self,
        child: SamplingChild,
        status: ChildStatus,
        stop_fd: int,
        emitter: Emitter,
        stats: MonitorStats,
        *,
        interval: float,
        hang_deadline: float,
    ) -> None:
        self.child = child
        self.status = status
        self.stop_fd = stop_fd
        self.emitter = emitter
        self.stats = stats
        self.interval_ns = int(interval * 1e9)
        self.hang_deadline_ns = int(hang_deadline * 1e9)
        self.ring: Ring | None = None
        self.cursor = 0
        self.hung_phase: int | None = None

    def _deadline_ns(self, snap: Snapshot) -> int:
        """When the child's current phase becomes overdue (monotonic ns)."""
        if snap.phase == PHASE_STARTING:
            return snap.since_ns + int(STARTUP_DEADLINE_SECONDS * 1e9)
        if snap.phase == PHASE_IDLE:  # the next sample must start, then finish
            return snap.since_ns + self.interval_ns + self.hang_deadline_ns
        return snap.since_ns + self.hang_deadline_ns

    def serve(self) -> Outcome:
        notify_fd = self.child.notify_fd
        grace_until = 0
        while True:
            snap = self.status.read()
            wake_at = max(self._deadline_ns(snap), grace_until)
            timeout = max(0, wake_at - time.monotonic_ns()) / 1e9
            ready, _, _ = select.select([notify_fd, self.stop_fd], [], [], timeout)
            if self.stop_fd in ready:
                return Outcome.STOPPED
            if notify_fd in ready:
                alive = bool(os.read(notify_fd, 4096))
                # CPU per sample from the snapshot taken before the wait: one
                # sample behind, and one status read per wake-up instead of two.
                self.stats.child_cpu_seconds_per_sample = snap.cpu_seconds_per_sample
                self._drain()
                if not alive:
                    return Outcome.EXITED
                continue
            now = time.monotonic_ns()
            if now - wake_at > STALL_SLACK_NS:
                # We woke far later than planned: this process or the whole
                # machine stalled (a VM pause, a long sink call), and the child
                # with it. Give it a moment to move before judging it.
                grace_until = now + STALL_GRACE_NS
                continue
            snap = self.status.read()  # the phase may have moved on since we slept
            if now >= self._deadline_ns(snap):
                self.hung_phase = snap.phase
                return Outcome.HUNG

    def _drain(self) -> None:
        if self.ring is None:
            try:
                self.ring = Ring.attach(self.child.ring_name)
            except (FileNotFoundError, ValueError):
                return  # the child died before its ring was ready
            # Both sides hold both segments now: drop the names so nothing can
            # leak them, not even a SIGKILL of both processes.
            self.ring.unlink()
            self.status.unlink()
        rows = self.ring.read_rows(self.cursor)
        self.cursor = rows.cursor
        self.stats.records_read += len(rows.indices)
        self.stats.records_lost += rows.lost
        fields = self.ring.fields
        for values, timestamp_ns in zip(rows.values, rows.timestamps_ns, strict=True):
            self.emitter.emit(fields, values, timestamp_ns)

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
