"""A postmortem as text: JSON lines, a header then one object per record (the format
``sampler.child.postmortem`` describes)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

from sampler import catalogue
from sampler.catalogue import PEAK_SUFFIX
from sampler.child.snapshot import Snapshot
from sampler.ipc.channel import PostmortemTarget
from sampler.postmortems.files import FORMAT, VERSION

XIDS_KEPT = 8
"""The latest critical XIDs a postmortem's header names."""


def lines(snap: Snapshot, target: PostmortemTarget, written_at: float) -> list[str]:
    """The postmortem as JSON lines (without line ends): the header, then the records."""
    p = snap.params
    logged = snap.logged_through > 0
    header: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "backend_pid": p.backend_pid,
        "monitored_pid": p.sources.pid,
        "host": snap.host,
        "vanished_at": snap.vanished_at,
        "written_at": written_at,
        "monitor_started_at": target.started_at,
        "interval_seconds": p.settings.interval_seconds,
        "ring_capacity": snap.capacity,
        "fields": list(snap.fields),
        "records": len(snap.indices),
        "last_logged_record": snap.logged_through - 1 if logged else None,
        "last_logged_step": snap.logged_step if logged else None,
        "exit": None if snap.exit is None else asdict(snap.exit),
        "memory_cgroup": None if snap.memory_cgroup is None else asdict(snap.memory_cgroup),
        "peaks": _peaks(snap),
        "gpu_xids": _xids(snap),
        "stall": snap.stall,
    }
    out = [json.dumps(header, allow_nan=False)]
    now_wall, now_ns = snap.clock
    for index, stamp, row in zip(snap.indices, snap.timestamps_ns, snap.values.tolist(), strict=True):
        record = {
            "record": index,
            "wall_time": round(now_wall - (now_ns - stamp) / 1e9, 6),
            "logged": index < snap.logged_through,
            "values": {f: v for f, v in zip(snap.fields, row, strict=True) if math.isfinite(v)},
        }
        out.append(json.dumps(record, allow_nan=False))
    return out


def _xids(snap: Snapshot) -> list[dict[str, int]]:
    """The critical XID errors the ring's records hold, oldest first (the latest
    ``XIDS_KEPT``): each one's GPU, its XID and the record it came in."""
    columns = [
        (int(reading.device), i)
        for i, name in enumerate(snap.fields)
        if (reading := catalogue.lookup(name)) is not None
        and reading.signal is catalogue.GPU_XID
        and not reading.variant
        and reading.device.isdigit()
    ]
    found = [
        {"gpu": gpu, "xid": int(row[i]), "record": index}
        for index, row in zip(snap.indices, snap.values.tolist(), strict=True)
        for gpu, i in columns
        if math.isfinite(row[i]) and row[i] > 0
    ]
    return found[-XIDS_KEPT:]


def _peaks(snap: Snapshot) -> dict[str, float]:
    """The last record's peaks: each ``_peak`` field that read a number, name -> value."""
    if not snap.indices:
        return {}
    last = snap.values[-1].tolist()
    return {
        f: v for f, v in zip(snap.fields, last, strict=True) if f.endswith(PEAK_SUFFIX) and math.isfinite(v)
    }
