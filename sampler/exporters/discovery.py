"""Prometheus file-based service discovery: one JSON file per monitor.

A Prometheus server whose ``file_sd_configs`` reads ``<prometheus_sd_dir>/*.json``
finds every rank of every job on the host (or on every host sharing the
directory) without hand-written targets. The backend writes its entry once
its child serves, and removes it at stop; if the backend dies, its child
removes it on the way out, so no target outlives its job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re

from sampler.placement import Placement

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_EVERYWHERE = ("0.0.0.0", "::", "")


def entry_path(sd_dir: str, placement: Placement, pid: int) -> str:
    """The entry's file: named by host, run, rank and backend pid, so ranks
    and jobs sharing the directory never collide."""
    stem = f"wl-resource-{placement.host}-{placement.run_id}-rank{placement.rank}-{pid}"
    return os.path.join(sd_dir, _UNSAFE.sub("_", stem) + ".json")


def target(address: str, port: int, host: str) -> str:
    """``host:port`` as a Prometheus server reaches the endpoint: the bound
    address, or this host's name when it listens on every interface."""
    name = host if address in _EVERYWHERE else address
    if ":" in name:  # an IPv6 address
        name = f"[{name}]"
    return f"{name}:{port}"


def write_entry(path: str, address: str, labels: dict[str, str]) -> None:
    """Write (atomically: Prometheus may read at any moment) the entry for one
    target. Raises ``OSError``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = json.dumps([{"targets": [address], "labels": labels}], indent=1) + "\n"
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(body)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def remove_entry(path: str) -> None:
    """Remove the entry, if it is there; never raises."""
    with contextlib.suppress(OSError):
        os.unlink(path)
