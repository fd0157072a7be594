"""Counters the reader thread keeps and ``ResourceMonitor.stats()`` reports."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class MonitorStats:
    """Written by the reader thread only; read as a snapshot from any thread."""

    records_read: int = 0
    """Records taken from the ring."""
    records_logged: int = 0
    """Records whose signals went to the sink."""
    records_dropped: int = 0
    """Records not logged because their step equals the last logged step."""
    records_lost: int = 0
    """Records overwritten in the ring before the reader got to them."""
    signals_logged: int = 0
    sink_errors: int = 0
    restarts: int = 0
    quarantined: list[str] = field(default_factory=list)
    child_exit_code: int | None = None
    last_record_monotonic: float | None = None

    def snapshot(self) -> dict[str, Any]:
        out = asdict(self)
        last = out.pop("last_record_monotonic")
        out["seconds_since_last_record"] = None if last is None else time.monotonic() - last
        return out
