"""Creating a file atomically, never through a link: the one way the monitor and
its commands write a file under a name.

The bytes go to a new temporary file beside the final name, created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` under an unguessable name, then renamed over
the final name. A link planted at either name is never followed: the rename
replaces a link at the final name rather than writing through it. A reader sees
the whole file or none of it, and a write that fails or is interrupted leaves
neither a half file nor its temporary behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import BinaryIO

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
