"""Backend side of the sampling child: start it, hear from it, stop it.

The child is a fresh interpreter started with ``subprocess`` running
``-m sampler.child``: no fork of the backend (unsafe with CUDA and threads), and
no re-import of the user's ``__main__`` as ``multiprocessing`` spawn would do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ringbuf.segment import unlink

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
STOP_TIMEOUT_SECONDS = 1.0
"""How long ``stop()`` waits for the child to leave on its own before killing it."""


def _child_sys_path() -> str:
    """The backend's import path, so the child finds ``sampler`` and whatever
    module ``nvml_module`` names exactly as the backend would."""
    entries = [_PACKAGE_ROOT] + [os.path.abspath(p or os.curdir) for p in sys.path]
    return os.pathsep.join(dict.fromkeys(entries))


class SamplingChild:
    """One sampling child process, and the names of the ring it writes and the
    status block it keeps (``params["ring"]``, ``params["status"]``)."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.ring_name: str = params["ring"]
        self.status_name: str = params["status"]
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def notify_fd(self) -> int:
        """Readable when a record has landed; EOF when the child has exited."""
        assert self._proc is not None and self._proc.stdout is not None
        return self._proc.stdout.fileno()

    def start(self) -> None:
        """Launch the child; returns as soon as the process exists."""
        env = dict(os.environ, PYTHONPATH=_child_sys_path())
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "sampler.child", json.dumps(self.params)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=_PACKAGE_ROOT,  # so a user's own "sampler" in their cwd cannot shadow ours
            env=env,
        )

    def request_stop(self) -> None:
        """Ask the child to leave (EOF on its stdin) without waiting; safe from any thread."""
        proc = self._proc
        if proc is not None and proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()

    def kill(self) -> None:
        """SIGKILL the child without reaping it; safe from any thread."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def exit_code(self) -> int | None:
        """The child's exit status once it has ended, else None."""
        return self._proc.poll() if self._proc is not None else None

    def stop(self) -> int | None:
        """End the child in bounded time and release its pipes; idempotent.

        Closing stdin is the request to leave; a child stuck inside a call is
        killed after ``STOP_TIMEOUT_SECONDS``. The shared-memory names are
        unlinked in case the child died before the backend attached.
        """
        self.request_stop()
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        assert proc.stdout is not None
        try:
            code = proc.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        proc.stdout.close()
        unlink(self.ring_name)
        unlink(self.status_name)
        return code
