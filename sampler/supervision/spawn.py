"""Backend side of the sampling child: start it, hear from it, stop it.

The child is a fresh interpreter started with ``os.posix_spawn``:

- never a fork of the backend (unsafe with CUDA and threads), and never a
  re-import of the user's ``__main__`` as ``multiprocessing`` spawn would do;
- nothing to wait on. ``subprocess`` learns whether exec worked by reading a
  pipe until EOF; a process the backend forks at that moment (a DataLoader
  worker) inherits the pipe's write end and keeps EOF away for its whole
  life, freezing the monitor thread inside ``Popen``. glibc's posix_spawn
  reports exec failure itself (the parent is suspended until the child has
  exec'd), so no descriptor a fork could copy stands between us and the result;
- its import path is the backend's ``sys.path`` in the backend's own order,
  set by a two-line bootstrap before anything else is imported. ``PYTHONPATH``
  would put every entry ahead of the standard library, so a site-packages
  module with a standard-library name (the old ``pathlib`` backport) would
  break only the child;
- SIGINT is blocked from its first instruction until it ignores it: Ctrl-C in
  a terminal reaches the whole process group, and the child leaves when the
  backend does, not on a keypress the backend may survive.
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
from pathlib import Path

from sampler.collectors.tree import SAMPLING_CHILD_PROGRAM
from sampler.ipc.channel import FALLBACK_POLL_SECONDS, STOP, ChildParams, open_pidfd, send_hello

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
STOP_TIMEOUT_SECONDS = 1.0
"""How long ``stop()`` waits for the child to leave on its own before killing it."""

# Runs as ``python -c``: close whatever non-inheritable descriptors C code left
# open without O_CLOEXEC (a user's pipe must not stay open in our child), set
# the import path, then hand over to the entry module.
_BOOTSTRAP = (
    "import os, sys; os.closerange(3, max(256, os.sysconf('SC_OPEN_MAX')));"
    " sys.path[:] = sys.argv[1:]; del sys.argv[1:];"
    f" {SAMPLING_CHILD_PROGRAM}; sys.exit(main())"
)


def child_argv() -> list[str]:
    """The command line of a sampling child (the bootstrap, then its import path)."""
    entries = [os.path.abspath(p or os.curdir) for p in sys.path]
    if _PACKAGE_ROOT not in entries:
        entries.append(_PACKAGE_ROOT)
    return [sys.executable, "-c", _BOOTSTRAP, *dict.fromkeys(entries)]


def is_sampling_child(cmdline: list[str]) -> bool:
    """Whether a process command line is one of ours (for tests and tools)."""
    return cmdline[1:3] == ["-c", _BOOTSTRAP]


class SamplingChild:
    """One sampling child process and the backend's end of its channel."""

    def __init__(self, params: ChildParams, status_fd: int, stacks_fd: int | None = None) -> None:
        self.params = params
        self._status_fd = status_fd
        self._stacks_fd = stacks_fd
        """The stack dump's memory file, sent in the hello (``sampler.supervision.stacks`` owns it)."""
        self.pid: int | None = None
        self.sock: socket.socket | None = None
        self.wake_fd: int | None = None
        """The read end of the wake-up pipe: a byte per record (``sampler.ipc.channel``)."""
        self.log_fd: int | None = None
        """The read end of the log pipe, non-blocking: the child's log lines (``sampler.ipc.logpipe``)."""
        self.pidfd: int | None = None
        """Readable once the child has exited; None where pidfds are missing."""
        self.exited = False
        # kill() may come from stop() in another thread while the reader closes:
        # the pidfd must not be used once closed (its number may be reused).
        self._lock = threading.Lock()
        self.returncode: int | None = None
        """Exit status once reaped (negative: the signal that ended it); stays
        None when it cannot be known (SIGCHLD ignored, or reaped by someone else)."""

    def start(self) -> None:
        """Launch the child and send it the hello; returns as soon as it exists."""
        if not hasattr(os, "posix_spawn"):  # Windows: the monitor samples in-thread there
            raise OSError("os.posix_spawn is not available on this platform")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.wake_fd, wake_w = os.pipe()
        self.log_fd, log_w = os.pipe()
        os.set_blocking(self.log_fd, False)
        try:
            self.pid = os.posix_spawn(
                sys.executable,
                child_argv(),
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, theirs.fileno(), 0),
                    (os.POSIX_SPAWN_DUP2, 2, 1),  # a stray print lands on stderr, not the backend's stdout
                ],
                setsigmask=[signal.SIGINT],
            )
        except BaseException:
            ours.close()
            os.close(wake_w)
            os.close(log_w)
            self.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        try:
            self.pidfd = open_pidfd(self.pid)
        except ProcessLookupError:  # gone already and reaped for us (SIGCHLD ignored)
            self.exited = True
        try:
            with contextlib.suppress(OSError):  # it died already; the reader finds out from the pidfd or EOF
                send_hello(ours, self.params, self._status_fd, wake_w, log_w, self._stacks_fd)
        finally:
            os.close(wake_w)  # the child's alone now: its exit is EOF on the pipe
            os.close(log_w)

    def poll(self) -> bool:
        """Whether the child has exited; reaps it (without blocking) if so."""
        with self._lock:
            return self._poll()

    def _poll(self) -> bool:
        if self.exited or self.pid is None:
            return self.exited
        try:
            if self.pidfd is not None:
                result = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)
                if result is None:
                    return False
                code = result.si_status
                self.returncode = code if result.si_code == os.CLD_EXITED else -code
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid == 0:
                    return False
                self.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass  # reaped by the kernel (SIGCHLD ignored) or by someone else: status unknown
        self.exited = True
        return True

    def request_stop(self) -> None:
        """Ask the child to leave, without waiting; safe from any thread."""
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # gone already, or closed by the reader thread meanwhile
                sock.send(STOP, socket.MSG_DONTWAIT)

    def kill(self) -> None:
        """SIGKILL the child without reaping it; safe from any thread."""
        with self._lock:
            if self.exited or self.pid is None:
                return
            try:
                if self.pidfd is not None:
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                elif not self._poll():  # not reaped yet, so the pid is still the child's
                    os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass  # it has exited meanwhile

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the child to exit; True if it has."""
        deadline = time.monotonic() + timeout
        while not self.poll():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.pidfd is not None:
                select.select([self.pidfd], [], [], left)
            else:
                time.sleep(min(left, FALLBACK_POLL_SECONDS / 10))
        return True

    def stop(self) -> None:
        """End the child in bounded time and release its descriptors; idempotent.

        ``STOP`` is the request to leave; a child stuck inside a call is
        killed after ``STOP_TIMEOUT_SECONDS``.
        """
        self.request_stop()
        if not self.wait(STOP_TIMEOUT_SECONDS):
            self.kill()
            self.wait(STOP_TIMEOUT_SECONDS)
        self.close()

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()
        for fd in (self.wake_fd, self.log_fd):
            if fd is not None:
                os.close(fd)
        self.wake_fd = self.log_fd = None
        with self._lock:
            pidfd, self.pidfd = self.pidfd, None
            if pidfd is not None:
                os.close(pidfd)
