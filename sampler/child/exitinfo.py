"""How the backend ended, learned by the child, which is not its parent and cannot wait for it.

Since Linux 6.15 the kernel keeps the exit status of a process that has a pidfd once its parent
has reaped it, and hands it to whoever holds the pidfd: ioctl ``PIDFD_GET_INFO`` with
``PIDFD_INFO_EXIT`` in the request's mask. Older kernels answer ENOTTY (no ``PIDFD_GET_INFO``,
before 6.13) or a mask without the bit (6.13, 6.14; ESRCH once the process is reaped).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time

from sampler.postmortems.files import Exit

PIDFD_INFO_EXIT = 1 << 3
_INFO = struct.Struct("=QQ11Ii")
"""``struct pidfd_info`` as first published (``PIDFD_INFO_SIZE_VER0``, 64 bytes): mask, cgroupid,
then pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid (u32 each), then
exit_code (s32, a wait status, where ``spare0`` was before 6.15)."""
PIDFD_GET_INFO = (3 << 30) | (_INFO.size << 16) | (0xFF << 8) | 11
"""``_IOWR(PIDFS_IOCTL_MAGIC = 0xFF, 11, struct pidfd_info)`` = 0xC040FF0B (the same number on
the architectures with other ioctl encodings). The size is part of the number: a kernel with a
longer struct answers the 64 bytes asked for."""
POLL_SECONDS = 0.01
"""How often ``wait`` asks again while the exit status is not there yet."""


def read(pidfd: int) -> Exit | None:
    """How the process behind ``pidfd`` ended; None while the kernel has no exit status for it
    (it runs, or its parent has not reaped it yet, or the kernel keeps none: before 6.15).
    ``OSError`` where the kernel cannot answer: ENOTTY (no ``PIDFD_GET_INFO``, or not a pidfd),
    EINVAL, ESRCH (reaped, on a kernel that keeps no exit status)."""
    info = bytearray(_INFO.size)
    struct.pack_into("=Q", info, 0, PIDFD_INFO_EXIT)  # the mask: what we ask for
    fcntl.ioctl(pidfd, PIDFD_GET_INFO, info)
    mask, *_, status = _INFO.unpack(info)  # the mask now says what the kernel filled in
    if not mask & PIDFD_INFO_EXIT:
        return None
    if os.WIFSIGNALED(status):
        return Exit(signal=os.WTERMSIG(status), core_dumped=os.WCOREDUMP(status))
    return Exit(status=os.WEXITSTATUS(status))


def wait(pidfd: int | None, seconds: float) -> Exit:
    """How the process behind ``pidfd`` (exited) ended, asking every ``POLL_SECONDS`` for up to
    ``seconds``: the kernel has it only once the parent has reaped it. Where it cannot be
    learned, an ``Exit`` whose ``unknown`` says why."""
    if pidfd is None:
        return Exit(unknown="the child had no pidfd of the backend (Linux before 5.3, or refused)")
    deadline = time.monotonic() + seconds
    while True:
        try:
            found = read(pidfd)
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            return Exit(unknown=f"the kernel tells no exit status to a non-parent ({name}; Linux 6.15+ does)")
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            return Exit(
                unknown=f"no exit status within {seconds:g} s: its parent had not reaped it, or the kernel "
                "keeps none (before Linux 6.15)"
            )
        time.sleep(POLL_SECONDS)
