"""The ``WL-ResourceMonitor`` thread: wait for a record, read it, emit it.

The thread spends its life in ``select()`` on two pipes, which releases the
GIL: the child's wake-up pipe (a byte per record, EOF when the child exits)
and the monitor's own stop pipe. There is no polling timer, so an idle monitor
costs the training loop nothing.
"""

from __future__ import annotations

import logging
import os
import select

from ringbuf import Ring
from sampler.emit import Emitter
from sampler.spawn import SamplingChild
from sampler.stats import MonitorStats

log = logging.getLogger("sampler")


class Reader:
    """Body of the reader thread for one sampling child."""

    def __init__(self, child: SamplingChild, stop_fd: int, emitter: Emitter, stats: MonitorStats) -> None:
        self.child = child
        self.stop_fd = stop_fd
        self.emitter = emitter
        self.stats = stats
        self.ring: Ring | None = None
        self.cursor = 0

    def run(self) -> None:
        try:
            self._serve()
        finally:
            self.stats.child_exit_code = self.child.stop()
            if self.ring is not None:
                self.ring.close()
            os.close(self.stop_fd)

    def _serve(self) -> None:
        notify_fd = self.child.notify_fd
        while True:
            ready, _, _ = select.select([notify_fd, self.stop_fd], [], [])
            if self.stop_fd in ready:
                return
            if not os.read(notify_fd, 4096):
                self._drain()
                code = self.child.stop()
                log.warning(
                    "resource monitor: the sampling child exited (status %s); resource signals stop here",
                    code,
                )
                return
            self._drain()

    def _drain(self) -> None:
        if self.ring is None:
            try:
                self.ring = Ring.attach(self.child.ring_name)
            except (FileNotFoundError, ValueError):
                return  # the child died before its ring was ready
            # Both sides are attached: drop the name so nothing can leak it, not
            # even a SIGKILL of both processes.
            self.ring.unlink()
        result = self.ring.read(self.cursor)
        self.cursor = result.cursor
        self.stats.records_read += len(result)
        self.stats.records_lost += result.lost
        fields = self.ring.fields
        for values, timestamp_ns in zip(result.values.tolist(), result.timestamps_ns.tolist(), strict=True):
            self.emitter.emit(fields, values, timestamp_ns)
