"""The sampling child: ``python -m sampler.child '<json parameters>'``.

Runs in a fresh interpreter started by the backend (never a fork of it, and
never a re-run of the user's ``__main__``). It attaches the status block the
backend made, builds the collectors, creates the ring under the name the
backend chose, and writes one record per interval. Before each collector is
built or sampled it publishes that collector's phase in the status block, so
whatever kills or freezes the child is attributed.

Pipes shared with the backend:

- stdin: the backend holds the write end and never writes. EOF means the
  backend has stopped the monitor or died, however it died (SIGKILL included);
  a watchdog thread blocked on it then ends the child within a second, even if
  the main thread is stuck inside a driver call.
- stdout (fd 1): one byte per record, to wake the backend's reader thread. It
  is non-blocking: if the reader falls behind and the pipe fills, wake-ups are
  dropped (the records are still in the ring), so a slow backend never stalls
  sampling. Python's own ``sys.stdout`` is pointed at stderr so a stray print
  cannot land in the wake-up pipe.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

import psutil

from ringbuf import Ring
from ringbuf.segment import unlink
from sampler.cadence import Cadence
from sampler.collectors import Collector, build_collector
from sampler.status import EXIT_NO_SHARED_MEMORY, PHASE_IDLE, ChildStatus, phase_of

_EXIT_GRACE_SECONDS = 0.4
"""How long the watchdog lets the main thread finish cleanly before forcing exit."""


class Child:
    def __init__(self, params: dict[str, Any], notify_fd: int) -> None:
        self.params = params
        self.ring_name: str = params["ring"]
        self.notify_fd = notify_fd
        self.stop = threading.Event()
        self.finished = threading.Event()
        # Held while the ring is created and while the watchdog unlinks it, so a
        # ring is never created after the watchdog decided to leave.
        self.ring_lock = threading.Lock()
        self.status = ChildStatus.attach(params["status"])
        self.collectors: list[Collector] = []

    def watch_parent(self) -> None:
        """Block on stdin until EOF, then make sure the child ends."""
        while True:
            try:
                if not os.read(0, 4096):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        self.stop.set()
        if self.finished.wait(_EXIT_GRACE_SECONDS):
            return
        self.ring_lock.acquire(timeout=_EXIT_GRACE_SECONDS)
        unlink(self.ring_name)
        unlink(self.status.name)
        os._exit(0)

    def run(self) -> int:
        p = self.params
        for category in p["categories"]:
            self.status.enter(phase_of(category))
            try:
                collector = build_collector(
                    category, disk_path=p["disk_path"], pid=p["pid"], nvml_module=p["nvml_module"]
                )
            except psutil.NoSuchProcess:
                return 0  # the backend died while the child was starting
            if collector is not None:
                self.collectors.append(collector)
        self.status.enter(PHASE_IDLE)
        fields = [name for c in self.collectors for name in c.names]
        with self.ring_lock:
            if self.stop.is_set():
                return 0
            try:
                ring = Ring.create(fields, p["capacity"], name=self.ring_name)
            except OSError as exc:
                print(f"resource monitor child: cannot create the ring: {exc}", file=sys.stderr)
                return EXIT_NO_SHARED_MEMORY
        try:
            self._notify()
            self._loop(ring, float(p["interval"]))
        finally:
            ring.close()
        return 0

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
            self._notify()
            cadence.advance()

    def _notify(self) -> None:
        # A full pipe means the reader is behind; it finds the record in the ring anyway.
        with contextlib.suppress(BlockingIOError):
            os.write(self.notify_fd, b".")

    def close(self) -> None:
        for collector in self.collectors:
            collector.close()


def main(argv: list[str]) -> int:
    params = json.loads(argv[1])
    notify_fd = os.dup(1)
    os.dup2(2, 1)
    os.set_blocking(notify_fd, False)
    child = Child(params, notify_fd)
    threading.Thread(target=child.watch_parent, name="parent-watch", daemon=True).start()
    code = 0
    try:
        code = child.run()
    except BrokenPipeError:
        pass  # the backend is gone
    finally:
        child.close()
        # Normally the backend unlinked both once attached; if it died first,
        # nobody else will.
        unlink(child.ring_name)
        unlink(child.status.name)
        child.finished.set()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
