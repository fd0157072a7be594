"""The floor: what any monitor thread costs at least, a bare thread woken through a pipe once per sample."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
from collections.abc import Callable

from bench.overhead.plan import FLOOR_SIGNALS
from bench.overhead.workloads import noop_sink

FLOOR_WRITER = """
import os, sys, time
fd, interval = int(sys.argv[1]), float(sys.argv[2])
due = time.monotonic()
try:
    while True:
        due += interval
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            due = time.monotonic()
        os.write(fd, b"x")
except OSError:  # the reader closed its end
    pass
"""
"""Another process that writes a byte per sample at the interval, as the sampling child does."""


class Floor:
    """A daemon thread that sleeps in ``select()``, is woken through a pipe by
    another process once per sample, and makes the same number of sink calls
    per sample (``FLOOR_SIGNALS``). Nothing else."""

    THREAD = "bench-floor"

    def __init__(self, interval: float, sink: Callable[[str, float, int], object] = noop_sink) -> None:
        self.samples = 0
        self.first = threading.Event()
        """Set at the first wake."""
        self._names = tuple(f"resource/floor/{i}" for i in range(FLOOR_SIGNALS))
        self._values = [float(i) for i in range(FLOOR_SIGNALS)]
        self._sink = sink
        self._read, write = os.pipe()
        self._stop_r, self._stop_w = os.pipe()
        self._writer = subprocess.Popen(
            [sys.executable, "-c", FLOOR_WRITER, str(write), str(interval)], pass_fds=(write,)
        )
        os.close(write)
        self.thread = threading.Thread(target=self._run, name=self.THREAD, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        read, stop, sink, names, values = self._read, self._stop_r, self._sink, self._names, self._values
        step = 0
        while True:
            ready, _, _ = select.select([read, stop], [], [])
            if stop in ready:
                return
            woken = len(os.read(read, 4096))  # one byte per sample
            if not woken:
                return
            for _ in range(woken):
                step += 1
                for name, value in zip(names, values, strict=True):
                    sink(name, value, step)
            self.samples += woken
            if not self.first.is_set():  # Event.set() takes a lock: not at every wake
                self.first.set()

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        self.thread.join()
        for fd in (self._read, self._stop_r, self._stop_w):
            os.close(fd)
        try:
            self._writer.wait(5)
        except subprocess.TimeoutExpired:
            self._writer.kill()
            self._writer.wait()
