"""The sampling child's log lines, carried to the backend's ``sampler`` logger over a pipe.

The child's ``sampler`` logger writes each record, formatted, to the pipe's write end (handed
over with the hello) with one non-blocking ``write``: a frame of its level and its text, ended
by a NUL, at most ``PIPE_BUF`` bytes so that it arrives whole. A full pipe (a backend too busy
to read) never stalls the child: the record is dropped and counted, and the next record that
fits is preceded by a line saying how many were dropped. The backend's reader thread reads the
read end as it reads records and logs each line once, at its level, where the user configured
logging.
"""

from __future__ import annotations

import logging
import os
import select

log = logging.getLogger("sampler")

FRAME_BYTES = select.PIPE_BUF
"""The most one record takes in the pipe: a write of at most this much is never split."""
_END = b"\0"


def frame(level: int, text: str) -> bytes:
    """One record as it crosses: ``<level> <text>`` then a NUL, cut to ``FRAME_BYTES``."""
    body = f"{level} {text}".replace("\0", "\\0").encode("utf-8", "replace")
    return body[: FRAME_BYTES - 1] + _END


class PipeHandler(logging.Handler):
    """Child side: each record to the backend through the pipe ``fd`` (non-blocking)."""

    def __init__(self, fd: int) -> None:
        super().__init__(logging.INFO)
        self.fd = fd
        self.dropped = 0
        """Records dropped since the latest one that went through (the pipe was full)."""
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        framed = frame(record.levelno, self.format(record))
        if self.dropped:
            note = (
                f"resource monitor: {self.dropped} log lines of the sampling child (pid {os.getpid()}) "
                "were dropped: the backend did not read them in time"
            )
            if not self._write(frame(logging.WARNING, note)):
                self.dropped += 1
                return
            self.dropped = 0
        if not self._write(framed):
            self.dropped += 1

    def _write(self, framed: bytes) -> bool:
        """Whether ``framed`` went into the pipe whole (a pipe that is gone takes it too)."""
        try:
            os.write(self.fd, framed)
        except BlockingIOError:
            return False
        except OSError:
            pass  # the backend is gone: nobody is left to tell
        return True


class LogReader:
    """Backend side: the read end ``fd`` of a child's log pipe (non-blocking); ``read()`` logs
    what arrived."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._partial = b""

    def read(self) -> bool:
        """Log every whole line that arrived; False once the pipe is at its end."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return True
            if not data:
                return False
            *lines, self._partial = (self._partial + data).split(_END)
            for line in lines:
                level, _, text = line.decode("utf-8", "replace").partition(" ")
                log.log(int(level), "%s", text)
