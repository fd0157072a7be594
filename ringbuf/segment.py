"""POSIX shared-memory segments, named or anonymous, without a resource tracker.

``multiprocessing.shared_memory.SharedMemory`` on Python <= 3.12 registers every
segment, created *or attached*, with a per-interpreter resource-tracker process
that unlinks the name when that interpreter exits: an unrelated process that
merely attaches would delete the owner's segment, and the tracker is one more
process per interpreter. The ring manages names itself (the owner unlinks as
soon as the other side is attached), so this module calls ``_posixshmem``, the
stdlib's own binding of shm_open/shm_unlink that ``SharedMemory`` is built on.

An anonymous segment has no name at all: it is shared by handing its
descriptor to the other process, so nobody can guess, squat or leak it.
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
_NAME_ATTEMPTS = 8
"""Fresh names tried before giving up when a chosen name already exists."""


def _require_posix() -> None:
    if _posixshmem is None:
        raise OSError("POSIX shared memory (shm_open) is not available on this platform")


def new_name() -> str:
    """A fresh, unguessable segment name."""
    return NAME_PREFIX + secrets.token_hex(8)


def _open_new(name: str | None) -> tuple[str, int]:
    """shm_open a segment that did not exist: (its name, fd).

    ``O_EXCL`` means we never open a segment someone else made, whoever they
    are; a generated name that collides (another user squatting names, say)
    is replaced by a fresh one, an explicit one raises ``FileExistsError``.
    """
    _require_posix()
    for _ in range(_NAME_ATTEMPTS if name is None else 1):
        candidate = name or new_name()
        try:
            fd = _posixshmem.shm_open("/" + candidate, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        except FileExistsError:
            if name is not None:
                raise
            continue
        return candidate, fd
    raise FileExistsError(f"{_NAME_ATTEMPTS} fresh shared-memory names in a row already existed")


def _reserve_and_map(fd: int, size: int) -> mmap.mmap:
    """Size the segment behind ``fd`` and map it.

    ``ftruncate`` alone reserves nothing, so a full ``/dev/shm`` would show up
    later as a SIGBUS on the first write. ``posix_fallocate`` turns that into
    a clean ``OSError(ENOSPC)`` here.
    """
    if size <= 0:
        raise ValueError(f"segment size must be positive, got {size}")
    os.ftruncate(fd, size)
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)
    return mmap.mmap(fd, size)


class Segment:
    """A shared-memory segment mapped into this process; ``name`` is None for
    an anonymous one (shared by passing a descriptor, never by name)."""

    def __init__(self, name: str | None, buf: mmap.mmap) -> None:
        self.name = name
        self.buf = buf

    @classmethod
    def create(cls, size: int, name: str | None = None) -> Segment:
        """Create and map a new named segment of ``size`` bytes, reserved up front
        (a half-made segment is unlinked)."""
        name, fd = _open_new(name)
        try:
            buf = _reserve_and_map(fd, size)
        except BaseException:
            unlink(name)
            raise
        finally:
            os.close(fd)
        return cls(name, buf)

    @classmethod
    def create_anonymous(cls, size: int) -> tuple[Segment, int]:
        """A new segment that has no name, and a descriptor for it.

        Another process gets the segment only through that descriptor (inherited,
        or sent over a Unix socket with ``socket.send_fds``), so there is no name
        to guess, squat or leak. Linux: ``memfd_create``. Elsewhere (or where
        memfd is forbidden): ``shm_open`` with a fresh unguessable name that is
        unlinked at once. The caller owns the descriptor and closes it.
        """
        fd = _memfd(size)
        if fd is None:
            name, fd = _open_new(None)
            unlink(name)
        try:
            return cls(None, _reserve_and_map(fd, size)), fd
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map an existing segment; ``FileNotFoundError`` if the name is gone."""
        _require_posix()
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            return cls(name, _map_existing(fd, repr(name)))
        finally:
            os.close(fd)

    @classmethod
    def from_fd(cls, fd: int) -> Segment:
        """Map the whole segment behind ``fd`` (which stays the caller's to close)."""
        return cls(None, _map_existing(fd, f"descriptor {fd}"))

    def close(self) -> None:
        """Unmap. Every numpy view of ``buf`` must be dropped first."""
        if not self.buf.closed:
            self.buf.close()


def _memfd(size: int) -> int | None:
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        return int(create(NAME_PREFIX + "anon", os.MFD_CLOEXEC))
    except OSError:  # ENOSYS on old kernels, EPERM under some seccomp profiles
        return None


def _map_existing(fd: int, what: str) -> mmap.mmap:
    size = os.fstat(fd).st_size
    if size == 0:
        raise ValueError(f"shared-memory segment {what} is empty")
    return mmap.mmap(fd, size)


def unlink(name: str) -> bool:
    """Remove a segment's name (mappings stay valid).

    False if the name was already gone, or belongs to another user and is not
    ours to remove (``PermissionError`` under the sticky ``/dev/shm``).
    """
    _require_posix()
    try:
        _posixshmem.shm_unlink("/" + name)
    except (FileNotFoundError, PermissionError):
        return False
    return True
