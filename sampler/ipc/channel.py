"""What crosses between the backend and its sampling child, and how each side
learns that the other is gone.

One Unix stream socket pair joins them; the child's end is its stdin.

- backend -> child, once: the hello, ``ChildParams`` as length-prefixed JSON,
  carrying the status block's descriptor and the write ends of the wake-up
  pipe and of the log pipe (SCM_RIGHTS), and, where the backend has a stack
  dump handler (``sampler.supervision.stacks``), the memory file it writes to;
- child -> backend, once: ``RING``, carrying the ring's descriptor;
- child -> backend, per record: ``RECORD``, one byte on the wake-up pipe, which
  wakes the reader thread. A pipe, not the socket: reading a byte from a pipe
  touches far less kernel code and memory than receiving one on a socket, and
  the reader pays for every cold page it touches;
- child -> backend, as it logs: its ``sampler`` logger's records on the log pipe
  (``sampler.ipc.logpipe``), which the backend logs;
- backend -> child: ``STOP``, the request to leave.

Shared memory therefore never has a name another process could read off a
command line and squat, and no segment can be left behind: both are
anonymous and live exactly as long as some process maps them.

Death is never read from EOF on the socket. A process forked by the backend
(a DataLoader worker, say) holds copies of whatever descriptors the backend
had at that moment, including, if it forked while a child was being started,
the child's own end; EOF then never arrives while the fork lives. Each side
instead watches the other by pid: with a pidfd (Linux 5.3+), which becomes
readable the moment the process exits and cannot be confused by pid reuse,
or else by polling (``FALLBACK_POLL_SECONDS``).
"""

from __future__ import annotations

import json
import os
import socket
import struct
from dataclasses import asdict, dataclass

from sampler.collectors import Sources
from sampler.settings.table import MonitorSettings

RING = b"R"
RECORD = b"."
STOP = b"q"

FALLBACK_POLL_SECONDS = 0.25
"""Where pidfds are missing, how often each side checks that the other lives."""

_LENGTH = struct.Struct("<I")
_MAX_HELLO = 1 << 20
_HELLO_FDS = 3
"""Descriptors every hello carries; one more with ``ChildParams.stacks.signal`` set."""


@dataclass(frozen=True)
class PostmortemTarget:
    """Where the child writes what its ring holds if the backend dies under it."""

    directory: str | None
    """Directory for a JSONL postmortem (used when there is no store), or None."""
    store: str | None
    """The run store's SQLite file, or None."""
    started_at: float
    """When the monitor started, s since the epoch: with the backend's pid, names the run in the store."""


@dataclass(frozen=True)
class PrometheusTarget:
    """The metrics endpoint the child serves."""

    address: str
    """Address to bind."""
    port: int
    """Port to bind: the configured one plus the local rank."""
    labels: dict[str, str]
    """On every metric: host, rank, local_rank, run_id."""
    info: dict[str, str]
    """Further labels of the ``monitor_info`` metric."""
    sd_file: str | None
    """The discovery entry naming this endpoint: the child removes it if the backend dies."""
    host_wide: bool = True
    """This rank exports the host-wide series (it samples the host, or every rank does)."""


@dataclass(frozen=True)
class StackTarget:
    """Where the child looks when the run stalls (``sampler.child.stalls``)."""

    signal: int | None
    """The signal whose handler dumps every thread's stack into the memory file the hello carries;
    None: the backend has no such handler (the hello then carries no memory file)."""
    monitor_tid: int
    """Native id of the backend's monitor thread: the one signalled, so that no other thread's
    blocking call is interrupted."""
    main_ident: int
    """``threading.main_thread().ident`` in the backend, as the dump names it."""


@dataclass(frozen=True)
class ChildParams:
    """Everything the child needs to know, sent once in the hello."""

    categories: tuple[str, ...]
    """The categories this rank samples (``settings.categories`` less those left to another rank)."""
    settings: MonitorSettings
    """The monitor's settings, unchanged (``interval_seconds``, ``inner_rate_hz``, ...)."""
    sources: Sources
    """Which disk, process and GPUs the collectors read (``sources.pid`` is the
    process the process categories describe: the backend, or one it watches)."""
    backend_pid: int
    """The backend, whose death ends the child."""
    capacity: int
    """Records the ring holds."""
    postmortem: PostmortemTarget | None = None
    """Where to leave a postmortem if the backend dies; None for nowhere."""
    prometheus: PrometheusTarget | None = None
    """The metrics endpoint to serve; None for none."""
    stacks: StackTarget | None = None
    """Who to ask for stacks when the run stalls; None: nobody (stalls are not watched)."""

    def encode(self) -> bytes:
        body = json.dumps(asdict(self)).encode("utf-8")
        return _LENGTH.pack(len(body)) + body

    @classmethod
    def decode(cls, body: bytes) -> ChildParams:
        fields = json.loads(body)
        fields["categories"] = tuple(fields["categories"])
        fields["settings"] = MonitorSettings.from_row(fields["settings"])
        sources = fields["sources"]
        if isinstance(sources["gpu_devices"], list):
            sources["gpu_devices"] = tuple(sources["gpu_devices"])
        if sources["gpu_share"] is not None:
            sources["gpu_share"] = tuple(sources["gpu_share"])
        for key in ("gpus_read", "gpus_stopped", "gpus_quarantined"):
            sources[key] = tuple(sources[key])
        fields["sources"] = Sources(**sources)
        if fields["postmortem"] is not None:
            fields["postmortem"] = PostmortemTarget(**fields["postmortem"])
        if fields["prometheus"] is not None:
            fields["prometheus"] = PrometheusTarget(**fields["prometheus"])
        if fields.get("stacks") is not None:
            fields["stacks"] = StackTarget(**fields["stacks"])
        return cls(**fields)


def send_hello(
    sock: socket.socket, params: ChildParams, status_fd: int, wake_fd: int, log_fd: int, stacks_fd: int | None
) -> None:
    """Send the hello with the status block's, the wake-up pipe's and the log pipe's descriptors
    attached, and the stack dump's memory file when ``params.stacks.signal`` is set."""
    socket.send_fds(sock, [params.encode()], [status_fd, wake_fd, log_fd, *_stacks(params, stacks_fd)])


def _stacks(params: ChildParams, stacks_fd: int | None) -> list[int]:
    has_signal = params.stacks is not None and params.stacks.signal is not None
    if has_signal != (stacks_fd is not None):
        raise ValueError("a stack signal goes with its memory file, and only with it")
    return [] if stacks_fd is None else [stacks_fd]


def receive_hello(sock: socket.socket) -> tuple[ChildParams, int, int, int, int | None]:
    """Block until the whole hello has arrived: (params, status block descriptor,
    wake-up pipe's write end, log pipe's write end, the stack dump's memory file or None).

    Reads exactly the hello's bytes, so a ``STOP`` sent right after it stays
    in the socket for whoever reads next. ``ConnectionError`` if the backend
    is gone before sending it all, or sent something else.
    """
    fds: list[int] = []
    header = _receive_exactly(sock, _LENGTH.size, fds)
    (length,) = _LENGTH.unpack(header)
    if length > _MAX_HELLO:
        raise ConnectionError(f"a hello of {length} bytes is not one")
    body = _receive_exactly(sock, length, fds)
    params = ChildParams.decode(body)
    expected = _HELLO_FDS + (params.stacks is not None and params.stacks.signal is not None)
    if len(fds) != expected:
        for fd in fds:
            os.close(fd)
        raise ConnectionError(f"the hello carried {len(fds)} descriptors, expected {expected}")
    return params, fds[0], fds[1], fds[2], fds[3] if expected > _HELLO_FDS else None


def _receive_exactly(sock: socket.socket, size: int, fds: list[int]) -> bytes:
    buf = b""
    while len(buf) < size:
        data, got, _, _ = socket.recv_fds(sock, size - len(buf), _HELLO_FDS + 1)
        fds += got
        if not data:
            raise ConnectionError("the backend closed the channel before the hello")
        buf += data
    return buf


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once it exits), or None where the kernel
    or platform has none. ``ProcessLookupError`` if ``pid`` is already gone."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return int(pidfd_open(pid))
    except ProcessLookupError:
        raise
    except OSError:  # ENOSYS before Linux 5.3, EPERM under some seccomp profiles
        return None
