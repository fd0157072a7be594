"""What a postmortem is on disk: its format name and version, and its file name,
which the child that writes one and the reader that finds it share."""

from __future__ import annotations

import calendar
import math
import re
import time

FORMAT = "wl-resource-monitor postmortem"
VERSION = 1
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
