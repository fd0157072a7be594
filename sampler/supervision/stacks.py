"""Backend side of a stall's evidence: every thread's Python stack, dumped on a signal of the
monitor's own into an anonymous memory file the sampling child reads.

``faulthandler``'s handler runs in C and needs no GIL, so it answers while another thread holds
the GIL in a C call. It is registered without ``chain``: chaining drops ``SA_RESTART`` and, with
no earlier handler, raises the signal again under its default action, which for a real-time
signal ends the process. Registered plainly it has ``SA_RESTART``, so a read or write the signal
lands in restarts. The child sends the signal to the monitor thread alone (``tgkill``), so the
other threads' blocking calls never see it (libc ``sleep`` returns early on any handled signal,
``SA_RESTART`` or not).

A handler someone else already has on the signal (one set from Python or from C, as the kernel
reports it) is never replaced: the monitor then goes without stacks, says so once, and stalls
carry the threads' kernel states alone. One set after the handler was registered is seen by the
monitor thread (``replaced``, per batch of records: the kernel's handler address is no longer
the one ``faulthandler`` set), which says so once and tells the child, which then no longer
signals the backend: the signal would run that handler, not the dump. The memory file is
``memfd_create``'s: no path, nothing another user could plant or read, and it goes with the last
process that holds it.
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import threading
from typing import Any

from sampler.child.capture import caught

log = logging.getLogger("sampler")

STACK_SIGNAL: int | None = signal.SIGRTMIN + 13 if hasattr(signal, "SIGRTMIN") else None
"""The real-time signal whose handler dumps the stacks (None where there are none)."""

_lock = threading.Lock()
_users = 0
_fd: int | None = None
_owner_pid = 0
"""The process that registered the handler (a forked copy inherits it, and starts afresh)."""
_said = False
_handler: int | None = None
"""The address of the C handler ``faulthandler`` set on the signal, as the kernel has it."""
_said_replaced = False
_SIGACTION_BYTES = 256
"""Room for libc's ``struct sigaction``, whose first member is the handler on Linux."""
_sigaction: Any = None


def install() -> int | None:
    """Register the dump handler (once per process, counted); returns the descriptor of the
    memory file it writes to (the caller does not close it: ``release`` does), or None when
    there is none: no real-time signals, no ``memfd_create``, or the signal is someone else's."""
    global _users, _fd, _owner_pid, _said, _handler
    with _lock:
        if _owner_pid != os.getpid():  # first use, or a forked copy of a process that registered
            _users, _fd, _owner_pid = 0, None, os.getpid()
        if _fd is not None:
            _users += 1
            return _fd
        signum = STACK_SIGNAL
        if signum is None or not hasattr(os, "memfd_create"):
            return None
        if signal.getsignal(signum) not in (signal.SIG_DFL, None) or caught(os.getpid(), signum):
            if not _said:
                _said = True
                log.warning(
                    "resource monitor: signal %d (SIGRTMIN+%d) already has a handler in this process; "
                    "keeping it, so a stall is recorded with each thread's kernel state but without "
                    "Python stacks",
                    signum,
                    signum - signal.SIGRTMIN,
                )
            return None
        fd = os.memfd_create("wl-resource-monitor-stacks", os.MFD_CLOEXEC)
        try:
            faulthandler.register(signum, file=fd, all_threads=True, chain=False)
        except (OSError, RuntimeError, ValueError) as exc:
            os.close(fd)
            log.warning("resource monitor: no Python stacks for stalls: %s", exc)
            return None
        _fd, _users, _handler = fd, 1, _current_handler(signum)
        return fd


def _current_handler(signum: int) -> int | None:
    """The address of the handler the kernel has on ``signum`` now (None where unreadable)."""
    global _sigaction
    action = ctypes.create_string_buffer(_SIGACTION_BYTES)
    try:
        if _sigaction is None:
            _sigaction = ctypes.CDLL(None, use_errno=True).sigaction
        if _sigaction(signum, None, action) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return ctypes.c_void_p.from_buffer(action).value or 0


def replaced() -> bool:
    """Whether another handler has taken the dump's signal since ``install`` (said once); False
    while none is installed in this process, or where the handler cannot be read."""
    global _said_replaced
    if _fd is None or _owner_pid != os.getpid() or _handler is None or STACK_SIGNAL is None:
        return False
    now = _current_handler(STACK_SIGNAL)
    if now is None or now == _handler:
        return False
    if not _said_replaced:
        _said_replaced = True
        log.warning(
            "resource monitor: another handler took signal %d (SIGRTMIN+%d) after the monitor started; "
            "stalls are recorded from now on with each thread's kernel state but without Python stacks",
            STACK_SIGNAL,
            STACK_SIGNAL - signal.SIGRTMIN,
        )
    return True


def release() -> None:
    """Undo one ``install``; the last one unregisters the handler and closes the memory file.
    Called from the monitor thread once its child is gone: a signal the child sent earlier
    was delivered to this very thread before it got here."""
    global _users, _fd
    with _lock:
        if _owner_pid != os.getpid() or _fd is None:
            return
        _users -= 1
        if _users > 0:
            return
        assert STACK_SIGNAL is not None
        faulthandler.unregister(STACK_SIGNAL)
        os.close(_fd)
        _fd = None
