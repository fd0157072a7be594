"""Named POSIX shared-memory segments without a resource tracker.

``multiprocessing.shared_memory.SharedMemory`` on Python <= 3.12 registers every
segment, created *or attached*, with a per-interpreter resource-tracker process
that unlinks the name when that interpreter exits: an unrelated process that
merely attaches would delete the owner's segment, and the tracker is one more
process per interpreter. The ring manages names itself (the owner unlinks as
soon as the other side is attached), so this module calls ``_posixshmem``, the
stdlib's own binding of shm_open/shm_unlink that ``SharedMemory`` is built on.
"""

from __future__ import annotations

import mmap
import os
import secrets

try:
    import _posixshmem  # type: ignore[import-not-found]
except ImportError:  # Windows: no POSIX shared memory
    _posixshmem = None

NAME_PREFIX = "wlrb_"
"""Every segment this package names is ``NAME_PREFIX`` + 16 hex digits."""


def _require_posix() -> None:
    if _posixshmem is None:
        raise OSError("POSIX shared memory (shm_open) is not available on this platform")


def new_name() -> str:
    """A fresh, unguessable segment name."""
    return NAME_PREFIX + secrets.token_hex(8)


class Segment:
    """A named shared-memory segment mapped into this process."""

    def __init__(self, name: str, buf: mmap.mmap) -> None:
        self.name = name
        self.buf = buf

    @classmethod
    def create(cls, size: int, name: str | None = None) -> Segment:
        """Create and map a new segment of ``size`` bytes, reserved up front.

        ``ftruncate`` alone reserves nothing, so a full ``/dev/shm`` would show up
        later as a SIGBUS on the first write. ``posix_fallocate`` turns that into
        a clean ``OSError(ENOSPC)`` here, and the half-made segment is unlinked.
        """
        _require_posix()
        if size <= 0:
            raise ValueError(f"segment size must be positive, got {size}")
        name = name or new_name()
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            buf = mmap.mmap(fd, size)
        except BaseException:
            unlink(name)
            raise
        finally:
            os.close(fd)
        return cls(name, buf)

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map an existing segment; ``FileNotFoundError`` if the name is gone."""
        _require_posix()
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise ValueError(f"shared-memory segment {name!r} is empty")
            buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, buf)

    def close(self) -> None:
        """Unmap. Every numpy view of ``buf`` must be dropped first."""
        if not self.buf.closed:
            self.buf.close()


def unlink(name: str) -> bool:
    """Remove a segment's name (mappings stay valid); False if it was already gone."""
    _require_posix()
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return False
    return True
