"""Creating a file atomically, never through a link: the one way the monitor and
its commands write a file under a name.

The bytes go to a new temporary file beside the final name, created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` under an unguessable name, then renamed over
the final name. A link planted at either name is never followed: the rename
replaces a link at the final name rather than writing through it. A reader sees
the whole file or none of it, and a write that fails or is interrupted leaves
neither a half file nor its temporary behind.

An output a person names (``export -o``, ``plot -o``) is :func:`output`: the
same where the name is free or a regular file; where it is something else
already (a terminal, a FIFO, a device), that is written into, since a rename
would replace it (as root, ``/dev/null`` would become a regular file).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from sampler.util.quoting import printable

OUTPUT_MODE = 0o666
"""The mode of an output a person asked for (a plot, an export), less the umask:
as ``open(path, "w")`` would make it."""
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], mode: int, *, exclusive: bool = False) -> Iterator[BinaryIO]:
    """A new file to write, which becomes ``path`` once the block ends without an
    exception (and is removed if it raises). ``mode``: as ``os.open`` takes it,
    less the umask. ``exclusive``: never replace what is at ``path`` already (a
    link included), raising ``FileExistsError`` instead. Raises ``OSError``."""
    directory, name = os.path.split(os.fspath(path))
    temporary = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
    fd = os.open(temporary, _CREATE, mode)
    try:
        with os.fdopen(fd, "wb") as file:
            yield file
        if exclusive:
            os.link(temporary, path)  # unlike a rename, fails on any name that exists
            os.unlink(temporary)
        else:
            os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write(path: str | os.PathLike[str], data: bytes, mode: int, *, exclusive: bool = False) -> None:
    """Write ``data`` as the file ``path``, atomically, never through a link (see
    :func:`replacing`). Raises ``OSError``."""
    with replacing(path, mode, exclusive=exclusive) as file:
        file.write(data)


@contextlib.contextmanager
def output(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """The output a person named ``path``, to write: a new file replacing it as
    :func:`replacing` does when nothing (``OUTPUT_MODE``) or a regular file (its
    permission bits) is there; else what is there (a terminal, a FIFO, a device), opened and written
    into directly, never renamed over, never truncated. A symbolic link there is
    refused (``OSError`` ELOOP, saying so): following one planted in a shared
    directory writes wherever its maker chose, and replacing it destroys the
    user's link. Raises ``OSError``."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    if found is not None and stat.S_ISLNK(found.st_mode):
        raise OSError(
            errno.ELOOP,
            f"it is a symbolic link (to {printable(os.readlink(path))}), which an output is never "
            "written through: name the file itself, or -o - for standard output",
        )
    if found is None:
        with replacing(path, OUTPUT_MODE) as file:
            yield file
        return
    if stat.S_ISREG(found.st_mode):  # replaced by a file of its mode: a private export stays private
        with replacing(path, 0o600) as file:
            os.fchmod(file.fileno(), stat.S_IMODE(found.st_mode) & 0o777)
            yield file
        return
    # O_NOFOLLOW: a link swapped in meanwhile is refused too; O_NOCTTY: a terminal
    # opened here never becomes the controlling one of a process that has none.
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "wb") as file:
        yield file
