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
the socket fills, wake-ups are dropped (the records are still in the ring), so
a slow backend never stalls sampling.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time

import psutil

from ringbuf import Ring
from sampler.collectors import Collector, build_collector
from sampler.collectors.cadence import Cadence
from sampler.ipc.channel import (
    FALLBACK_POLL_SECONDS,
    RECORD,
    RING,
    STOP,
    ChildParams,
    open_pidfd,
    receive_hello,
)
from sampler.ipc.status import EXIT_CLEAN, EXIT_NO_SHARED_MEMORY, PHASE_IDLE, ChildStatus, phase_of

_EXIT_GRACE_SECONDS = 0.4
"""How long the watchdog lets the main thread finish cleanly before forcing exit."""


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
    def __init__(self, params: ChildParams, sock: socket.socket, status: ChildStatus) -> None:
        self.params = params
        self.sock = sock
        self.status = status
        self.stop = threading.Event()
        self.finished = threading.Event()
        self.collectors: list[Collector] = []

    def watch(self, backend: BackendWatch) -> None:
        """Until STOP, EOF or the backend's death, then make sure the child ends."""
        fds = [self.sock.fileno()] + ([backend.pidfd] if backend.pidfd is not None else [])
        timeout = None if backend.pidfd is not None else FALLBACK_POLL_SECONDS
        while not backend.gone():
            ready, _, _ = select.select(fds, [], [], timeout)
            if backend.pidfd in ready:
                break
            if self.sock.fileno() in ready:
                try:
                    data = self.sock.recv(4096)
                except OSError:
                    break
                if not data or STOP in data:
                    break
        self.stop.set()
        if self.finished.wait(_EXIT_GRACE_SECONDS):
            return
        self.status.declare_exit(EXIT_CLEAN)
        os._exit(EXIT_CLEAN)

    def run(self) -> int:
        p = self.params
        for category in p.categories:
            self.status.enter(phase_of(category))
            try:
                collector = build_collector(
                    category, disk_path=p.disk_path, pid=p.target_pid, nvml_module=p.nvml_module
                )
            except psutil.NoSuchProcess:
                return EXIT_CLEAN  # the process it describes died while the child was starting
            if collector is not None:
                self.collectors.append(collector)
        self.status.enter(PHASE_IDLE)
        fields = [name for c in self.collectors for name in c.names]
        try:
            ring, ring_fd = Ring.create_anonymous(fields, p.capacity)
        except OSError as exc:
            print(f"resource monitor child: cannot create the ring: {exc}", file=sys.stderr)
            return EXIT_NO_SHARED_MEMORY
        try:
            try:
                socket.send_fds(self.sock, [RING], [ring_fd])
            finally:
                os.close(ring_fd)
            self._loop(ring, p.interval)
        finally:
            ring.close()
        return EXIT_CLEAN

    def _loop(self, ring: Ring, interval: float) -> None:
        cadence = Cadence(interval)
        phases = [phase_of(c.category) for c in self.collectors]
        while not self.stop.wait(cadence.seconds_left()):
            cpu_before = time.process_time_ns()
            timestamp_ns = time.monotonic_ns()
            values: list[float] = []
            for collector, phase in zip(self.collectors, phases, strict=True):
                self.status.enter(phase)
                values += collector.sample()
            self.status.enter(PHASE_IDLE)
            ring.write(values, timestamp_ns)
            self.status.count_sample(time.process_time_ns() - cpu_before)
            # A full socket means the reader is behind; it finds the record in the ring anyway.
            with contextlib.suppress(BlockingIOError):
                self.sock.send(RECORD, socket.MSG_DONTWAIT)
            cadence.advance()

    def close(self) -> None:
        for collector in self.collectors:
            collector.close()


def main() -> int:
    # The backend spawned us with SIGINT blocked: ignore it before unblocking,
    # so a Ctrl-C that was pending since exec is discarded too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    sock = socket.socket(fileno=0)
    try:
        params, status_fd = receive_hello(sock)
    except (ConnectionError, OSError):
        return EXIT_CLEAN  # the backend is gone before it could say anything
    status = ChildStatus.from_fd(status_fd)
    os.close(status_fd)
    backend = BackendWatch(params.backend_pid)
    if backend.gone_at_start:
        status.declare_exit(EXIT_CLEAN)
        return EXIT_CLEAN
    child = Child(params, sock, status)
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
