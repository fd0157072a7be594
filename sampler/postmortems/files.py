"""What a postmortem is on disk: its format name and version, its file name, and the
typed parts of its header that say how the backend died, which the child that writes one
and the reader that finds it share."""

from __future__ import annotations

import calendar
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

FORMAT = "wl-resource-monitor postmortem"
VERSION = 2
"""2: the header says how the backend died (``exit``, ``memory_cgroup``) and has ``peaks``;
a version 1 header has none of them and reads as one whose cause was not recorded."""
FILE_NAME = re.compile(r"postmortem-(\d{8}T\d{6})\.(\d{3})Z-pid(\d+)(?:-\d+)?(\.read)?\.jsonl")
"""A postmortem file's name: UTC time of the death (s, ms), backend pid, then
``.read`` once someone has read it (``python -m sampler postmortem``)."""
READ_MARK = ".read"
_TIME_FORMAT = "%Y%m%dT%H%M%S"


def file_name(vanished_at: float, backend_pid: int) -> str:
    """The postmortem file's name: sorts by time, names the pid."""
    seconds = math.floor(vanished_at)
    millis = min(999, round((vanished_at - seconds) * 1000))
    utc = time.strftime(_TIME_FORMAT, time.gmtime(seconds))
    return f"postmortem-{utc}.{millis:03d}Z-pid{backend_pid}.jsonl"


def parse_file_name(name: str) -> tuple[float, int, bool] | None:
    """(death time in s since the epoch, backend pid, read) of a postmortem file's
    name, None for any other name."""
    match = FILE_NAME.fullmatch(name)
    if match is None:
        return None
    utc, millis, pid, read = match.groups()
    try:
        seconds = calendar.timegm(time.strptime(utc, _TIME_FORMAT))
    except ValueError:  # digits in the right places, but no date ("20251399T...")
        return None
    return seconds + int(millis) / 1000, int(pid), read is not None


T = TypeVar("T")


def _typed(cls: Callable[..., T], value: object, kinds: dict[str, tuple[type, ...]]) -> T | None:
    """``cls`` from a header's JSON object whose every field (``kinds``: name -> the types it may
    have) is there with its type; None otherwise (a file others may write can say anything)."""
    if not isinstance(value, dict):
        return None
    found: dict[str, Any] = {}
    for name, kind in kinds.items():
        item = value.get(name)
        # JSON's true is a Python int too: a bool is only what may be a bool.
        if not isinstance(item, kind) or (isinstance(item, bool) and bool not in kind):
            return None
        found[name] = item
    return cls(**found)


@dataclass(frozen=True)
class Exit:
    """How the backend ended, as the kernel told the child through its pidfd: its exit
    ``status``, or the ``signal`` that ended it (``core_dumped`` then says whether it left a
    core); neither when it could not be learned, and ``unknown`` says why."""

    status: int | None = None
    signal: int | None = None
    core_dumped: bool = False
    unknown: str | None = None

    @classmethod
    def from_json(cls, value: object) -> Exit | None:
        kinds = {"status": (int, type(None)), "signal": (int, type(None)), "core_dumped": (bool,),
                 "unknown": (str, type(None))}  # fmt: skip
        return _typed(cls, value, kinds)


MEMORY_FROM_MARK = "high-water mark"
"""``CgroupAtDeath.memory_from``: the cgroup's own high-water mark and limit."""
MEMORY_FROM_RECORD = "last record"
"""``CgroupAtDeath.memory_from``: the last record's ``container/memory_used_mb`` (its peak where
it has one) and ``container/memory_limit_mb``, where the mark could not be read."""


@dataclass(frozen=True)
class CgroupAtDeath:
    """The backend's memory cgroup (``name`` as /proc/<pid>/cgroup names it, its ``directory``,
    cgroup ``version`` 1 or 2): its OOM kill count when the child started and when the backend
    vanished (None: unreadable then), and its memory then, in bytes (None: unknown, or no
    limit); ``memory_from`` says where that came from (None: nowhere)."""

    name: str
    directory: str
    version: int
    oom_kills_at_start: int
    oom_kills_at_death: int | None
    memory_used_bytes: float | None
    memory_limit_bytes: float | None
    memory_from: str | None

    @property
    def oom_kills(self) -> int | None:
        """Processes of the cgroup the OOM killer took while the child watched; None when that
        cannot be told (a count unreadable, or gone back: the cgroup was replaced)."""
        if self.oom_kills_at_death is None or self.oom_kills_at_death < self.oom_kills_at_start:
            return None
        return self.oom_kills_at_death - self.oom_kills_at_start

    @classmethod
    def from_json(cls, value: object) -> CgroupAtDeath | None:
        number = (int, float, type(None))
        kinds = {"name": (str,), "directory": (str,), "version": (int,), "oom_kills_at_start": (int,),
                 "oom_kills_at_death": (int, type(None)), "memory_used_bytes": number,
                 "memory_limit_bytes": number, "memory_from": (str, type(None))}  # fmt: skip
        return _typed(cls, value, kinds)
