"""The sampling child: the entry module the backend's spawn bootstrap runs.

Runs in a fresh interpreter started by the backend (never a fork of it, and
never a re-run of the user's ``__main__``). It receives its parameters and
the status block over its channel (fd 0, see ``sampler.ipc.channel``), builds the
collectors, creates an anonymous ring, hands the ring's descriptor back, and
writes one record per interval. Before each collector is built or sampled it
publishes that collector's phase in the status block, so whatever kills or
freezes the child is attributed.

It leaves when the backend asks (``STOP``) or dies, however it dies (SIGKILL
included): a watchdog thread blocked on the channel and on a pidfd of the
backend ends the child within a second even if the main thread is stuck in a
driver call. Wake-ups are sent non-blocking: if the reader falls behind and
the pipe fills, wake-ups are dropped (the records are still in the ring), so
a slow backend never stalls sampling.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import signal
import socket
import sys
import threading
import time

import psutil

from ringbuf import Ring
from sampler.child import postmortem, snapshot
from sampler.child.cadence import Cadence, Stop, inner_first, record_took
from sampler.child.peaks import PeakTracker
from sampler.child.stalls import StallWatch, gpu_fields
from sampler.collectors import Collector, build_collector, nvml
from sampler.collectors.base import starvation
from sampler.collectors.container import memory_cgroup
from sampler.collectors.gpu import GpuCollector
from sampler.ipc.channel import (
    FALLBACK_POLL_SECONDS,
    RECORD,
    RING,
    STOP,
    ChildParams,
    open_pidfd,
    receive_hello,
)
from sampler.ipc.logpipe import PipeHandler
from sampler.ipc.status import (
    EXIT_CLEAN,
    EXIT_NO_SHARED_MEMORY,
    EXIT_STARVED,
    PHASE_IDLE,
    ChildStatus,
    phase_of,
)
from sampler.prometheus import discovery
from sampler.prometheus.endpoint import Endpoint, RecordCollector, open_endpoint

log = logging.getLogger("sampler")

REBIND_SECONDS = 5.0
"""How often a child whose port was in use tries it again, at its next record."""
_EXIT_GRACE_SECONDS = 0.4
"""How long the watchdog lets the main thread finish cleanly before forcing exit."""
_LAST_RECORD_GRACE_SECONDS = 0.8
"""Likewise after ``STOP``, which has the main thread take one last record first: under the
second the backend waits before it kills the child (``STOP_TIMEOUT_SECONDS``)."""


class BackendWatch:
    """Tells when the backend has gone: a pidfd where there is one, else its pid
    no longer being our parent's (checked every ``FALLBACK_POLL_SECONDS``)."""

    def __init__(self, backend_pid: int) -> None:
        self.backend_pid = backend_pid
        try:
            self.pidfd = open_pidfd(backend_pid)
        except ProcessLookupError:
            self.pidfd = None
        # The pidfd names whichever process had that pid when it was opened;
        # if it is still our parent now, it is the backend and not a reuse.
        self.gone_at_start = os.getppid() != backend_pid

    def gone(self) -> bool:
        return os.getppid() != self.backend_pid


class Child:
    def __init__(self, params: ChildParams, sock: socket.socket, wake_fd: int, status: ChildStatus) -> None:
        self.params = params
        self.sock = sock
        self.wake_fd = wake_fd
        """The wake-up pipe's write end (non-blocking): a byte per record."""
        self.status = status
        self.stop = Stop()
        self.finished = threading.Event()
        self.collectors: list[Collector] = []
        self._tracking: list[tuple[Collector, int]] = []
        """Collectors with tracked readings, each with its phase."""
        self.ring: Ring | None = None
        """The ring while the child writes it (the watchdog reads it for a postmortem)."""
        self.ring_lock = threading.Lock()
        """Guards ``ring`` between the postmortem's copy and the main thread's close."""
        self.exposed: RecordCollector | None = None
        """What the metrics endpoint serves, when there is one."""
        self.gpu: GpuCollector | None = None
        """The GPU collector, whose devices' health the status block carries to the backend."""
        self.endpoint: Endpoint | None = None
        self._bind_again_ns: int | None = None
        """When to try again for a port that was in use (``time.monotonic_ns``); None: never."""
        self.stalls: StallWatch | None = None
        """The watch for a stalled run, fed once per record; None when stalls are not watched."""
        self.record_at_stop = threading.Event()
        """Set with ``stop`` when the backend asked the child to leave (not when it died): the
        main thread takes one last record before it leaves."""
        self._phases: list[int] = []
        """Each collector's phase, in ``collectors`` order."""
        self._tracked_at: list[int] = []
        """Where each tracked reading sits in a record's values."""

    def watch(self, backend: BackendWatch) -> None:
        """Until STOP, EOF or the backend's death, then make sure the child ends;
        after a death, first leave a postmortem (bounded: ``postmortem.leave``)."""
        # Before anything can die: the OOM kills counted so far, to tell a new one at the death.
        witness = snapshot.Witness(backend.pidfd, memory_cgroup(backend.backend_pid))
        fds = [self.sock.fileno()] + ([backend.pidfd] if backend.pidfd is not None else [])
        timeout = None if backend.pidfd is not None else FALLBACK_POLL_SECONDS
        died = True  # unless the loop ends on STOP or on EOF from a backend that lives
        while not backend.gone():
            ready, _, _ = select.select(fds, [], [], timeout)
            if backend.pidfd in ready:
                break
            if self.sock.fileno() in ready:
                try:
                    data = self.sock.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    died = postmortem.backend_died(backend.backend_pid, backend.pidfd)
                    break
                if STOP in data:
                    died = False
                    self.record_at_stop.set()
                    break
        if died:
            # Held while the ring is copied: the main thread, failing to wake the dead backend,
            # would otherwise close the ring under the copy.
            with self.ring_lock:
                if self.params.prometheus is not None and self.params.prometheus.sd_file is not None:
                    discovery.remove_entry(self.params.prometheus.sd_file)
                stall = None if self.stalls is None else self.stalls.open_stall()
                if not postmortem.leave(self.params, self.ring, self.status, time.time(), witness, stall):
                    self.status.declare_exit(EXIT_CLEAN)
                    os._exit(EXIT_CLEAN)  # a write still stuck: its thread must not keep the child alive
        self.stop.set()
        if self.finished.wait(
            _LAST_RECORD_GRACE_SECONDS if self.record_at_stop.is_set() else _EXIT_GRACE_SECONDS
        ):
            return
        self.status.declare_exit(EXIT_CLEAN)
        os._exit(EXIT_CLEAN)

    def run(self) -> int:
        p = self.params
        nvml.report_calls(self.status.note_call)  # a call that hangs or crashes is named
        for category in p.categories:
            self.status.enter(phase_of(category))
            try:
                collector = build_collector(category, p.sources)
            except psutil.NoSuchProcess:
                return EXIT_CLEAN  # the process it describes died while the child was starting
            if collector is not None:
                self.collectors.append(collector)
            if isinstance(collector, GpuCollector):
                self.gpu = collector
                self.status.set_gpus(*collector.health.words())
        self.status.enter(PHASE_IDLE)
        peaks = PeakTracker(self.collectors, p.capacity)
        fields = [name for c in self.collectors for name in c.names] + list(peaks.names)
        if self.stalls is not None:
            self.stalls.gpus = gpu_fields(fields)
        if p.prometheus is not None:
            self._serve(fields)
        try:
            ring, ring_fd = Ring.create_anonymous(fields, p.capacity)
        except OSError as exc:
            log.warning("resource monitor: the sampling child cannot create its ring: %s", exc)
            return EXIT_NO_SHARED_MEMORY
        self.ring = ring
        try:
            try:
                socket.send_fds(self.sock, [RING], [ring_fd])
            finally:
                os.close(ring_fd)
            return self._loop(ring, peaks)
        finally:
            with self.ring_lock:
                self.ring = None
                ring.close()

    def _serve(self, fields: list[str]) -> None:
        """Start the metrics endpoint before the ring is handed over, so the
        backend finds in the status block whether it serves."""
        p = self.params
        assert p.prometheus is not None
        uuids = {} if self.gpu is None else self.gpu.uuids
        stall_since = None if self.stalls is None else self.stalls.open_since
        self.exposed = RecordCollector(
            fields, p.prometheus, self.status, p.categories, uuids, stall_since, p.sources.gpus_quarantined
        )
        self._bind(time.monotonic_ns())

    def _bind(self, now_ns: int) -> None:
        """Open the endpoint; a port in use is tried again every ``REBIND_SECONDS``
        (an outgoing connection or a dead job's socket holds it for a while), every
        other failure is final."""
        assert self.params.prometheus is not None and self.exposed is not None
        self.endpoint, state = open_endpoint(self.params.prometheus, self.exposed)
        self.status.set_endpoint(state)
        self._bind_again_ns = now_ns + int(REBIND_SECONDS * 1e9) if state == -errno.EADDRINUSE else None

    def _read_tracked(self, peaks: PeakTracker) -> None:
        """One inner reading of every tracked signal, folded into the current window."""
        readings: list[float] = []
        for collector, phase in self._tracking:
            self.status.enter(phase)
            readings += collector.sample_tracked()
        self.status.enter(PHASE_IDLE)
        peaks.add(readings)

    def _loop(self, ring: Ring, peaks: PeakTracker) -> int:
        """Records every interval; between them, tracked readings at the inner rate; and one
        last record when the backend asks the child to leave (``STOP``: ``stop()``), so the
        run's end is sampled too. Returns the exit status: clean once stopped,
        ``EXIT_STARVED`` when this child can no longer read anything."""
        p = self.params
        records = Cadence(p.settings.interval_seconds)
        inner = Cadence(1.0 / p.settings.inner_rate_hz)
        self._phases = [phase_of(c.category) for c in self.collectors]
        self._tracking = [
            (c, phase) for c, phase in zip(self.collectors, self._phases, strict=True) if c.tracked
        ]
        names = [name for c in self.collectors for name in c.names]
        self._tracked_at = [names.index(name) for c in self.collectors for name in c.tracked]
        cpu_ns = 0  # CPU spent since the last record: its inner readings count towards its cost
        while True:
            due_record = records.seconds_left()
            if self._tracking and inner_first(records, inner):
                if self.stop.wait(inner.seconds_left()):
                    return self._last_record(ring, peaks, cpu_ns)
                before = time.process_time_ns()
                self._read_tracked(peaks)
                if self.stalls is not None:  # a GIL held past a record shows before the next one
                    self.stalls.feed(time.monotonic(), self.status.logged()[1])
                cpu_ns += time.process_time_ns() - before
                inner.advance()
                continue
            if self.stop.wait(due_record) or self.record_at_stop.is_set():
                return self._last_record(ring, peaks, cpu_ns)
            code = self._record(ring, peaks, inner, cpu_ns)
            if code is not None:
                return code
            cpu_ns = 0
            records.advance()
            inner.advance()

    def _last_record(self, ring: Ring, peaks: PeakTracker, cpu_ns: int) -> int:
        """The record taken at ``STOP`` (none after the backend's death)."""
        if self.record_at_stop.is_set():
            self._record(ring, peaks, None, cpu_ns)
        return EXIT_CLEAN

    def _record(self, ring: Ring, peaks: PeakTracker, inner: Cadence | None, cpu_ns: int) -> int | None:
        """Sample every collector, write the record and wake the backend; returns an exit
        status when the child must leave, else None. ``cpu_ns``: the CPU of the inner
        readings since the last record; ``inner`` (None for the last record) is told a
        record took the tracked readings."""
        before = time.process_time_ns()
        timestamp_ns = time.monotonic_ns()
        if self._tracking:
            self._read_tracked(peaks)
            if inner is not None:
                record_took(inner)
        values: list[float] = []
        marks: list[float] = []
        for collector, phase in zip(self.collectors, self._phases, strict=True):
            self.status.enter(phase)
            values += collector.sample()
            marks += collector.marks()
        self.status.enter(PHASE_IDLE)
        if self.gpu is not None:
            self.status.set_gpus(*self.gpu.health.words())
        starved, why = starvation.take()
        if starved:
            self.status.count_starved(starved)
            if all(value != value for value in values):  # every reading failed (NaN)
                log.warning(
                    "resource monitor: every reading of the sampling child failed (%s); it leaves "
                    "for a fresh child",
                    why,
                )
                return EXIT_STARVED
        peaks.include([values[i] for i in self._tracked_at])
        peaks.include(marks)  # exact, where the kernel kept a high-water mark that rose
        logged_through, step = self.status.logged()
        if self.stalls is not None:
            self.stalls.feed(timestamp_ns / 1e9, step, values)
        values += peaks.close(ring.head, logged_through)
        ring.write(values, timestamp_ns)
        if self.exposed is not None:
            self.exposed.update(values, time.time())
        if self._bind_again_ns is not None and timestamp_ns >= self._bind_again_ns:
            self._bind(timestamp_ns)
        self.status.count_sample(cpu_ns + time.process_time_ns() - before)
        try:
            os.write(self.wake_fd, RECORD)
        except BlockingIOError:
            pass  # the reader is behind; it finds the record in the ring anyway
        except (BrokenPipeError, ConnectionResetError):
            # The backend is gone. The watchdog decides what that means and may be
            # writing a postmortem of this ring: leaving now would close the ring and
            # end the interpreter under it. It sets ``stop`` once done (bounded).
            bound = (
                postmortem.EOF_DEATH_WAIT_SECONDS + snapshot.EXIT_WAIT_SECONDS + postmortem.WRITE_CAP_SECONDS
            )
            self.stop.wait(bound + 1)
            return EXIT_CLEAN
        return None

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
        for collector in self.collectors:
            collector.close()


def main() -> int:
    # The backend spawned us with SIGINT blocked: ignore it before unblocking,
    # so a Ctrl-C that was pending since exec is discarded too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    sock = socket.socket(fileno=0)
    try:
        params, status_fd, wake_fd, log_fd, stacks_fd = receive_hello(sock)
    except (ConnectionError, OSError):
        return EXIT_CLEAN  # the backend is gone before it could say anything
    status = ChildStatus.from_fd(status_fd)
    os.close(status_fd)
    backend = BackendWatch(params.backend_pid)
    if backend.gone_at_start:
        status.declare_exit(EXIT_CLEAN)
        return EXIT_CLEAN
    os.set_blocking(wake_fd, False)
    os.set_blocking(log_fd, False)
    log.addHandler(PipeHandler(log_fd))  # to the backend's sampler logger, not to stderr
    log.setLevel(logging.INFO)
    log.propagate = False
    child = Child(params, sock, wake_fd, status)
    if params.stacks is not None:
        child.stalls = StallWatch(params, params.stacks, stacks_fd, wake_fd, status)
        child.stalls.take_over()
    threading.Thread(target=child.watch, args=(backend,), name="backend-watch", daemon=True).start()
    code = 1  # an exception escaping run() below
    try:
        code = child.run()
    except (BrokenPipeError, ConnectionResetError):
        code = EXIT_CLEAN  # the backend is gone
    finally:
        child.close()
        status.declare_exit(code)
        child.finished.set()
    return code


if __name__ == "__main__":
    sys.exit(main())
