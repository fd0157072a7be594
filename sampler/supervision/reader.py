"""Reading one sampling child: wait for a record, read it, emit it, and notice
when the child died, is stuck, or has sent nothing for too long.

The ``WL-ResourceMonitor`` thread spends its life in ``poll()``, which
releases the GIL, on the child's channel until the ring is handed over and on
the child's wake-up pipe (a byte per record) from then on, the child's pidfd
(readable once it exits), the monitor's stop pipe and, with a run store, the
store's wake-up pipe (a byte when the pipeline logs into an empty queue).
Its only timeouts are the moment the child would be overdue (the current
phase's deadline, read from the status block) and, while the store's queue
holds points, the moment they are due to be written, so in steady state with
nothing logged it wakes once per record and never polls. Where pidfds are
missing it also wakes every ``FALLBACK_POLL_SECONDS`` to ask whether the child
still lives.

A thread woken after an idle second pays mostly for the memory it touches
(cold caches and page walks are charged as its CPU), so what a record costs is
kept to the least: the descriptors are registered once per child, the wake-up
bytes land in a buffer allocated once, and the record goes from one copy of its
slot to the sink with nothing built that no one reads.
"""

from __future__ import annotations

import enum
import logging
import os
import select
import socket
import time

from ringbuf import Ring
from sampler.ipc.channel import FALLBACK_POLL_SECONDS
from sampler.ipc.logpipe import LogReader
from sampler.ipc.status import PHASE_IDLE, PHASE_STARTING, ChildStatus, Snapshot, category_of
from sampler.pipeline.emit import Emitter
from sampler.pipeline.stats import MonitorStats
from sampler.supervision import stacks
from sampler.supervision.exposition import Exposition
from sampler.supervision.spawn import SamplingChild

log = logging.getLogger("sampler")

STARTUP_DEADLINE_SECONDS = 30.0
"""Interpreter start-up and imports may take this long before the child counts
as stuck (a loaded machine can take seconds to import numpy)."""
STALL_SLACK_NS = 500_000_000
"""Waking this much later than planned means the reader itself was stalled."""
STALL_GRACE_NS = 1_000_000_000
"""After such a stall the child gets this long to show progress before a hang is declared."""
NO_RECORD_INTERVALS = 3
NO_RECORD_MIN_SECONDS = 10.0
"""A child that has sent no record this many intervals (and at least this many
seconds) after it was started gets the monitor to say so, once."""
CPU_STAT_EVERY = 16
"""The child's CPU per sample is read from its status block every this many records."""
MAX_WAIT_NS = 3600 * 10**9
"""The longest single wait, whatever the deadlines say."""
WAKE_BYTES = 4096
"""The most wake-up bytes (one per record) taken from the pipe at once."""
_POLL_NS = int(FALLBACK_POLL_SECONDS * 1e9)


class Outcome(enum.Enum):
    STOPPED = "stopped"
    """``stop()`` was called."""
    EXITED = "exited"
    """The child exited or was killed."""
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
        exposition: Exposition | None = None,
    ) -> None:
        self.child = child
        self.status = status
        self.stop_fd = stop_fd
        self.emitter = emitter
        self.stats = stats
        self.interval = interval
        self.interval_ns = int(interval * 1e9)
        self.hang_deadline_ns = int(hang_deadline * 1e9)
        self.no_record_ns = int(max(NO_RECORD_INTERVALS * interval, NO_RECORD_MIN_SECONDS) * 1e9)
        self.ring: Ring | None = None
        self.cursor = 0
        self.records = 0
        self.hung_phase: int | None = None
        self.exposition = exposition
        self.base_starved = stats.readings_starved
        """Readings earlier children lost to starvation (this child's block counts from 0)."""
        self.base_gpu_errors = stats.gpu_errors
        """GPU stops in earlier children (likewise)."""
        self._wake_buffers = [bytearray(WAKE_BYTES)]
        """Where the wake-up bytes are read into (``os.readv``): nothing allocated per record."""

    def _deadline_ns(self, snap: Snapshot) -> int:
        """When the child's current phase becomes overdue (monotonic ns)."""
        if snap.phase == PHASE_STARTING:
            return snap.since_ns + int(STARTUP_DEADLINE_SECONDS * 1e9)
        if snap.phase == PHASE_IDLE:  # the next sample must start, then finish
            return snap.since_ns + self.interval_ns + self.hang_deadline_ns
        return snap.since_ns + self.hang_deadline_ns

    def serve(self) -> Outcome:
        child = self.child
        assert child.sock is not None and child.wake_fd is not None
        wake_fd = child.wake_fd
        # Where the child is heard: its channel until the ring comes, then the wake-up pipe.
        heard_fd = child.sock.fileno() if self.ring is None else wake_fd
        pidfd = child.pidfd
        emitter, wake_buffers = self.emitter, self._wake_buffers
        store_fd = emitter.store_wake_fd  # None: no run store, now or later
        logs = None if child.log_fd is None else LogReader(child.log_fd)
        poller = select.poll()
        for fd in (heard_fd, self.stop_fd, pidfd, store_fd, child.log_fd):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        started_ns = time.monotonic_ns()
        warn_at: int | None = started_ns + self.no_record_ns
        grace_until = 0
        due_at = self._deadline_ns(self.status.read())
        next_record: float | None = None  # when the child's next record is expected (monotonic s)
        while True:
            wake_at = max(due_at, grace_until)
            if warn_at is not None:
                wake_at = min(wake_at, warn_at)
            store_due = None if store_fd is None else emitter.store_due(next_record)
            if store_due is not None:
                wake_at = min(wake_at, int(store_due * 1e9))
            # Planned wake-up: the earliest deadline (maybe already past, if
            # we got here late), or the next poll where there is no pidfd.
            now = time.monotonic_ns()
            planned = min(wake_at, now + (MAX_WAIT_NS if pidfd is not None else _POLL_NS))
            # fd -> events; a hang-up or error counts as ready, as select() has it.
            ready = dict(poller.poll(max(0, planned - now) / 1e6))
            woke = time.monotonic_ns()
            if self.stop_fd in ready:
                return Outcome.STOPPED
            if store_fd is not None:
                emitter.serve_store(ready, store_due)
            if logs is not None and logs.fd in ready and not logs.read():
                poller.unregister(logs.fd)  # at its end: the child is gone
                logs = None
            if heard_fd in ready:
                if self.ring is None:
                    alive = self._receive()
                    if self.ring is not None:  # from here on only wake-up bytes come, one per record
                        poller.unregister(heard_fd)
                        heard_fd = wake_fd
                        poller.register(heard_fd, select.POLLIN)
                else:
                    alive = os.readv(heard_fd, wake_buffers) > 0
                if self._drain():
                    # The child has just written a record, so it is idle from
                    # about now: its next deadline needs no status read, which
                    # keeps a wake-up as small as a bare thread's.
                    now = time.monotonic_ns()
                    due_at = now + self.interval_ns + self.hang_deadline_ns
                    next_record = now / 1e9 + self.interval
                    warn_at = None
                else:  # the ring handed over, or an exit: what is the child doing now?
                    due_at = self._deadline_ns(self.status.read())
                if not alive:
                    if logs is not None:
                        logs.read()  # what it said before it left
                    return Outcome.EXITED
                continue  # the channel first: records sent just before an exit still count
            if (pidfd is not None and pidfd in ready) or (pidfd is None and child.poll()):
                self._drain()
                if logs is not None:
                    logs.read()
                return Outcome.EXITED
            now = time.monotonic_ns()
            if woke - planned > STALL_SLACK_NS:
                # We woke far later than planned: this process or the whole
                # machine stalled (a VM pause, a long sink call), and the child
                # with it. Give it a moment to move before judging it.
                grace_until = now + STALL_GRACE_NS
                continue
            if warn_at is not None and now >= warn_at:
                warn_at = None
                self._report_silence(self.status.read(), now - started_ns)
            if now < max(due_at, grace_until):
                continue  # woke to poll or to warn: nothing is overdue
            snap = self.status.read()  # what the child is doing, and since when
            due_at = self._deadline_ns(snap)
            if now >= due_at:
                self.hung_phase = snap.phase
                return Outcome.HUNG

    def _receive(self) -> bool:
        """Take what the child sent before its ring (the ring's descriptor); False at
        end of channel (a child that left without reading all we sent resets it
        instead of closing it)."""
        assert self.child.sock is not None
        try:
            data, fds, _, _ = socket.recv_fds(self.child.sock, 4096, 1)
        except ConnectionResetError:
            return False
        for fd in fds:
            try:
                if self.ring is None:
                    self.ring = Ring.from_fd(fd)
                    if self.exposition is not None:  # the child started its endpoint before this
                        self.exposition.seen(self.status.endpoint())
            finally:
                os.close(fd)
        return bool(data)

    def _report_silence(self, snap: Snapshot, waited_ns: int) -> None:
        """No record since this child started: say once what we are waiting for."""
        seconds = waited_ns / 1e9
        in_phase = (time.monotonic_ns() - snap.since_ns) / 1e9
        if snap.phase == PHASE_STARTING:
            what = f"sampling child (pid {self.child.pid}) to finish starting (importing, {in_phase:.0f} s)"
        elif snap.phase == PHASE_IDLE and self.ring is None:
            what = f"sampling child (pid {self.child.pid}) to hand over its ring"
        elif snap.phase == PHASE_IDLE:
            what = f"first record of the sampling child (pid {self.child.pid}), idle for {in_phase:.0f} s"
        else:
            what = (
                f"sampling child (pid {self.child.pid}) to return from the {category_of(snap.phase)} "
                f"collector ({in_phase:.0f} s in it)"
            )
        self.stats.waiting_for = what
        log.warning(
            "resource monitor: no sample %.0f s after the sampling child started; waiting for the %s. "
            "stats()['waiting_for'] shows this until a sample arrives.",
            seconds,
            what,
        )

    def take_last(self) -> None:
        """After ``stop()``, once the child has left: emit what it wrote since the last drain,
        the record it takes at ``STOP`` included (none if it was killed first)."""
        self._drain()

    def _drain(self) -> int:
        """Read and emit every record the ring holds for us; returns how many."""
        ring = self.ring
        if ring is None:
            return 0
        records, self.cursor, lost = ring.read_committed(self.cursor)
        count = len(records)
        stats, status = self.stats, self.status
        stats.records_read += count
        if lost:
            stats.records_lost += lost
            status.publish_lost(stats.records_lost)
        if not count:
            return 0
        if not self.records:  # the child's first: what it was waited for (if said) is not, from it on
            stats.waiting_for = None
        emit, fields = self.emitter.emit, ring.fields
        for index, values, timestamp_ns in records:
            step = emit(fields, values, timestamp_ns)
            if step is not None:  # the child carries peaks over the records after this one
                status.publish_logged(index, step)
                totals = self.emitter.phase_totals
                if totals is not None and totals.steps:  # the steps' phases, for the endpoint
                    status.publish_phases(totals.steps, [ns / 1e9 for ns in totals.ns])
        status.publish_handler_replaced(stacks.replaced())  # before the child asks for stacks
        starved = status.starved()  # the word sits on the status page the records just touched
        if self.base_starved + starved != stats.readings_starved:
            self._note_starved(starved)
        self._note_gpus()
        if self.exposition is not None:  # a child whose port was in use may have bound it since
            self.exposition.seen(status.endpoint())
        if self.records % CPU_STAT_EVERY == 0:
            stats.child_cpu_seconds_per_sample = status.read().cpu_seconds_per_sample
        self.records += count
        return count

    def _note_starved(self, starved: int) -> None:
        """Count the readings this child lost for want of descriptors or memory
        (``starved``, from its status block), and say once when the first are lost."""
        stats = self.stats
        if self.base_starved + starved == stats.readings_starved:
            return
        if stats.readings_starved == 0:
            log.warning(
                "resource monitor: the sampling child (pid %s) is skipping readings because it ran out of "
                "file descriptors or memory (EMFILE, ENFILE or ENOMEM); stats()['readings_starved'] counts "
                "them, and a child whose every reading fails is replaced",
                self.child.pid,
            )
        stats.readings_starved = self.base_starved + starved

    def _note_gpus(self) -> None:
        """Take the child's count of GPU devices not reading and of stops (it says them itself)."""
        stats = self.stats
        stats.gpus_not_reading, _, stops = self.status.gpus()
        stats.gpu_errors = self.base_gpu_errors + stops

    def close(self) -> None:
        self._note_starved(self.status.starved())  # a child left for starvation wrote no record saying so
        if self.ring is not None:  # a child that handed over no ring may have said nothing of its GPUs
            self._note_gpus()
            self.ring.close()
            self.ring = None
