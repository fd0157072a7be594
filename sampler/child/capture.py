"""A stalled backend's evidence, taken from outside it: every thread's kernel state from
``/proc``, and every thread's Python stack from the dump handler the backend installed
(``sampler.supervision.stacks``), which runs in C and needs no GIL.

Kernel states are read first, so the signal that asks for the stacks does not change them.
The signal goes to one thread of one process at a time (``tgkill``): in the backend its
monitor thread, whose wait restarts, never the main thread, whose blocking C calls (libc
``sleep``) would return early; in each other process of its tree (forked DataLoader workers
inherit the handler and the memory file), its main thread, and only where ``/proc`` shows the
signal caught there: an uncaught real-time signal ends a process. A process that is stopped or
traced, a thread that blocks the signal, and a backend whose handler on it someone replaced
are not signalled, and the stall says why: their dump would come late, into a later one, or the
signal would run someone else's handler. Each dump is what the memory
file grew by, read once it has stopped growing (bounded by ``DUMP_WAIT_SECONDS``); the file is
then emptied, so it holds one dump at most.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import time
from dataclasses import asdict, dataclass, field

import psutil

from sampler.ipc.channel import StackTarget

SYS_TGKILL: int | None = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
"""``tgkill``'s system call number on this machine (Python has no call for another process's thread)."""
DUMP_WAIT_SECONDS = 2.0
"""The longest wait for one process's dump: a frozen process never writes one."""
DUMP_QUIET_SECONDS = 0.05
"""A dump that has not grown for this long is whole."""
_POLL_SECONDS = 0.005
DUMP_THREADS = 100
"""Threads ``faulthandler`` dumps at most, newest first (its compiled-in bound): the main
thread, the oldest, is left out of a backend with more."""
STOPPED = frozenset("Tt")
"""Kernel states of a thread that cannot run a handler now: stopped, or stopped by its tracer."""
SYSCALLS: dict[str, dict[int, str]] = {
    "x86_64": {
        0: "read", 1: "write", 7: "poll", 23: "select", 35: "nanosleep", 61: "wait4", 202: "futex",
        232: "epoll_wait", 230: "clock_nanosleep", 247: "waitid", 270: "pselect6", 271: "ppoll",
        281: "epoll_pwait", 17: "pread64", 45: "recvfrom", 47: "recvmsg", 43: "accept", 288: "accept4",
        42: "connect", 44: "sendto", 46: "sendmsg", 16: "ioctl", 34: "pause", 74: "fsync", 75: "fdatasync",
    },
    "aarch64": {
        63: "read", 64: "write", 73: "ppoll", 72: "pselect6", 101: "nanosleep", 98: "futex",
        22: "epoll_pwait", 115: "clock_nanosleep", 260: "wait4", 95: "waitid", 67: "pread64",
        207: "recvfrom", 212: "recvmsg", 202: "accept", 242: "accept4", 203: "connect", 29: "ioctl",
        82: "fsync", 83: "fdatasync",
    },
}  # fmt: skip
"""Names of the system calls a stuck thread is usually in (others are shown by number)."""
_libc: ctypes.CDLL | None = None


@dataclass(frozen=True)
class ThreadState:
    """One thread as the kernel sees it."""

    pid: int
    tid: int
    name: str
    state: str
    """``R`` running, ``S`` sleeping, ``D`` in uninterruptible wait (I/O), ``T`` stopped, ..."""
    wchan: str
    """The kernel function it waits in, ``""`` when none or unreadable."""
    syscall: str
    """The system call it is in (``futex``, ``read``, ``#n``), ``running``, or ``""`` when unreadable."""


@dataclass
class Evidence:
    stacks: str | None = None
    """Every dump taken, each after a ``--- pid N ...`` line; None when none could be."""
    threads: list[ThreadState] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What could not be captured, and why."""
    cpu_seconds: float = 0.0
    """The child's CPU time for this capture."""
    handler_seconds: float | None = None
    """The backend monitor thread's CPU time across its dump (the handler's cost), when known."""

    def thread_rows(self, after: float) -> list[dict[str, object]]:
        """The threads as the store keeps them, each with ``after``: seconds into the stall."""
        return [{**asdict(thread), "after": round(after, 3)} for thread in self.threads]


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("ascii", "replace").strip()
    except OSError:
        return ""


def thread_states(pid: int) -> list[ThreadState]:
    """Every thread of ``pid`` now (none if it is gone)."""
    names = SYSCALLS.get(platform.machine(), {})
    try:
        tids = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []
    states = []
    for tid in tids:
        where = f"/proc/{pid}/task/{tid}"
        stat = _read(f"{where}/stat")
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if not stat:
            continue
        wchan = _read(f"{where}/wchan")
        raw = _read(f"{where}/syscall").split()  # needs ptrace access: often refused, then ""
        if raw and raw[0].lstrip("-").isdigit():
            number = int(raw[0])
            syscall = names.get(number, f"#{number}")
        else:
            syscall = raw[0] if raw else ""
        states.append(
            ThreadState(
                pid, tid, name, rest.split()[0] if rest else "?", "" if wchan == "0" else wchan, syscall
            )
        )
    return states


def _tgkill(pid: int, tid: int, signum: int) -> None:
    global _libc
    assert SYS_TGKILL is not None
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.syscall(SYS_TGKILL, pid, tid, signum) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def _thread_cpu_ns(pid: int, tid: int) -> int | None:
    """A thread's CPU time so far (ns, ``schedstat``), None where unreadable."""
    fields = _read(f"/proc/{pid}/task/{tid}/schedstat").split()
    return int(fields[0]) if fields and fields[0].isdigit() else None


def _mask_bit(path: str, key: str, signum: int) -> bool:
    """Whether ``signum``'s bit is set in the ``key`` mask of a ``/proc`` status file."""
    for line in _read(path).splitlines():
        if line.startswith(key):
            try:
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
            except (ValueError, IndexError):
                return False
    return False


def caught(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler on ``signum`` (``SigCgt`` in ``/proc``)."""
    return _mask_bit(f"/proc/{pid}/status", "SigCgt:", signum)


def blocked(pid: int, tid: int, signum: int) -> bool:
    """Whether thread ``tid`` of ``pid`` blocks ``signum`` (``SigBlk``: a thread forked or started
    from one that blocked it keeps it blocked)."""
    return _mask_bit(f"/proc/{pid}/task/{tid}/status", "SigBlk:", signum)


def dump(memfd: int, pid: int, tid: int, signum: int) -> str | None:
    """Signal thread ``tid`` of ``pid`` and return what its handler wrote; None if nothing came
    within ``DUMP_WAIT_SECONDS``. Raises ``OSError`` when the signal cannot be sent."""
    before = os.fstat(memfd).st_size
    _tgkill(pid, tid, signum)
    size, changed = before, time.monotonic()
    deadline = changed + DUMP_WAIT_SECONDS
    while True:
        now = time.monotonic()
        grown = os.fstat(memfd).st_size
        if grown != size:
            size, changed = grown, now
        elif size > before and now - changed >= DUMP_QUIET_SECONDS:
            break
        if now >= deadline:
            break
        time.sleep(_POLL_SECONDS)
    if size == before:
        return None
    text = os.pread(memfd, size - before, before).decode("utf-8", "replace")
    # The backend, its forks and this process share the file's offset (one open file, passed and
    # inherited): emptied and rewound, the next dump starts at 0 and the file never grows past one.
    with contextlib.suppress(OSError):
        os.ftruncate(memfd, 0)
        os.lseek(memfd, 0, os.SEEK_SET)
    return text


def label(text: str, target: StackTarget) -> str:
    """The backend's dump with its main and monitor threads named."""
    main = f"hread 0x{target.main_ident:016x} "
    out = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")) and main in line:
            line += "  [main thread]"
        elif line.startswith("Current thread 0x"):
            line += "  [WL-ResourceMonitor, which took the signal]"
        out.append(line)
    return "\n".join(out)


def main_frames(stacks: str, count: int = 3) -> list[str]:
    """The main thread's innermost ``count`` frames in a labelled dump (``File ... in f``)."""
    frames: list[str] = []
    inside = False
    for line in stacks.splitlines():
        if line.endswith("[main thread]"):
            inside = True
        elif inside and line.strip().startswith("File "):
            frames.append(line.strip())
            if len(frames) == count:
                break
        elif inside:
            break
    return frames


def capture(pid: int, target: StackTarget, memfd: int | None, handler_replaced: bool = False) -> Evidence:
    """Everything that can be learned about ``pid`` and its tree (less this process) now;
    ``handler_replaced``: the backend said another handler took the dump's signal."""
    began = time.process_time()
    evidence = Evidence()
    try:
        tree = [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True) if p.pid != os.getpid()]
    except psutil.Error:
        tree = [pid]
    for member in tree:
        evidence.threads += thread_states(member)
    if not any(t.syscall for t in evidence.threads):
        evidence.notes.append("system calls unreadable (/proc/<pid>/syscall needs ptrace access)")
    signum = target.signal
    if signum is None or memfd is None:
        evidence.notes.append("no Python stacks: the backend has no dump handler (its signal is taken)")
    elif SYS_TGKILL is None:
        evidence.notes.append(f"no Python stacks: tgkill is unknown on {platform.machine()}")
    else:
        parts = []
        for member in tree:
            tid = target.monitor_tid if member == pid else member
            if member == pid and handler_replaced:
                evidence.notes.append(
                    f"no Python stacks: another handler took signal {signum} after the monitor started"
                )
                continue  # the signal would run the user's handler, not the dump
            if not caught(member, signum):
                if member == pid:
                    evidence.notes.append(f"no Python stacks: the backend no longer catches signal {signum}")
                continue  # a process that runs no handler of ours: the signal would end it
            stopped = {t.state for t in evidence.threads if t.pid == member and t.tid == tid} & STOPPED
            if stopped:
                # A stopped process takes the signal only when it runs again, and its dump would
                # then land in the middle of a later one; a traced one's tracer would see it.
                how = "traced by a debugger" if "t" in stopped else "stopped (SIGSTOP)"
                evidence.notes.append(f"no Python stacks of pid {member}: it is {how}; not signalled")
                continue
            if blocked(member, tid, signum):
                # Queued until it unblocks it, one per capture, each then a dump in a later one.
                evidence.notes.append(
                    f"no Python stacks of pid {member}: thread {tid} blocks signal {signum}; not signalled"
                )
                continue
            cpu_before = _thread_cpu_ns(member, tid) if member == pid else None
            try:
                text = dump(memfd, member, tid, signum)
            except OSError as exc:
                evidence.notes.append(f"no Python stacks of pid {member}: {exc}")
                continue
            if text is None:
                evidence.notes.append(f"no Python stacks of pid {member}: no dump in {DUMP_WAIT_SECONDS:g} s")
                continue
            if member == pid:
                cpu_after = _thread_cpu_ns(member, tid)
                if cpu_before is not None and cpu_after is not None:
                    evidence.handler_seconds = (cpu_after - cpu_before) / 1e9
                text = label(text, target)
                if "[main thread]" not in text:
                    count = sum(t.pid == pid for t in evidence.threads)
                    evidence.notes.append(
                        f"no Python stack of the main thread: faulthandler dumps the newest {DUMP_THREADS} "
                        f"threads and the backend has {count}; its kernel state is listed"
                    )
                parts.append(f"--- pid {member} (the backend)\n{text}")
            else:
                parts.append(f"--- pid {member} (a process of the backend's tree)\n{text}")
        evidence.stacks = "\n".join(parts) if parts else None
    evidence.cpu_seconds = time.process_time() - began
    return evidence
