"""Prometheus file-based service discovery: one JSON file per monitor.

A Prometheus server whose ``file_sd_configs`` reads ``<prometheus_sd_dir>/*.json``
finds every rank of every job on the host (or on every host sharing the
directory) without hand-written targets. The backend writes its entry once
its child serves, and removes it at stop; if the backend dies, its child
removes it on the way out, so no target outlives its job. Where both were
killed at once, the next monitor of the host to list itself there removes
their entry (``remove_stale_entries``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re

from sampler.settings.placement import Placement
from sampler.util import atomicfile

log = logging.getLogger("sampler")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_EVERYWHERE = ("0.0.0.0", "::", "")
_PREFIX = "wl-resource-"
_NAME = re.compile(r"wl-resource-.*-rank\d+-pid(\d+)\.json")
"""An entry's file name; the group is its backend's pid."""
ENTRY_MODE = 0o644
"""Prometheus, another user, reads the entries; only their monitor may rewrite one."""
_MAX_ENTRY_BYTES = 65536
"""An entry of ours is far smaller: a larger file reads cut short, not as JSON."""


def entry_path(sd_dir: str, placement: Placement, pid: int) -> str:
    """The entry's file: named by host, run, rank and backend pid (last, so the
    name alone says which process to ask), so ranks and jobs sharing the
    directory never collide."""
    stem = f"{_PREFIX}{placement.host}-{placement.run_id}-rank{placement.rank}-pid{pid}"
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
    atomicfile.write(path, body.encode(), ENTRY_MODE)


def remove_entry(path: str) -> None:
    """Remove the entry, if it is there; never raises."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _dead(pid: int) -> bool:
    """Whether no process ``pid`` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # another user's; a number no pid can be
        return False
    return False


def _is_entry_of(body: bytes, host: str) -> bool:
    """Whether ``body`` is an entry as ``write_entry`` writes it, of a monitor on ``host``."""
    try:
        content = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (or too deep for it), or not UTF-8
        return False
    if not (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)):
        return False
    targets, labels = content[0].get("targets"), content[0].get("labels")
    if not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        return False
    return isinstance(labels, dict) and labels.get("host") == host


def _stale(directory: int, name: str, host: str) -> bool:
    """Whether ``name`` in the directory open at ``directory`` is the entry of a
    monitor of ``host`` whose backend is dead. Raises ``OSError``."""
    match = _NAME.fullmatch(name)
    if match is None or not name.startswith(_UNSAFE.sub("_", f"{_PREFIX}{host}-")):
        return False
    if not _dead(int(match.group(1))):
        return False
    # Never through a link; a FIFO gives EOF at once, a directory EISDIR.
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    try:
        body = os.read(fd, _MAX_ENTRY_BYTES)
    finally:
        os.close(fd)
    return _is_entry_of(body, host)


def remove_stale_entries(sd_dir: str, host: str) -> list[str]:
    """Remove the entries in ``sd_dir`` of monitors of ``host`` (this one) whose
    backend is dead: those whose child was killed with it left them behind.
    Anything else stays: another host's entries, a live pid's, a file not of our
    name and content, a link. Returns the paths removed; never raises."""
    removed: list[str] = []
    try:
        directory = os.open(sd_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        for name in os.listdir(directory):
            with contextlib.suppress(OSError):
                if _stale(directory, name, host):
                    os.unlink(name, dir_fd=directory)
                    removed.append(os.path.join(sd_dir, name))
                    log.info(
                        "resource monitor: removed %s, the discovery entry of a dead monitor", removed[-1]
                    )
    finally:
        os.close(directory)
    return removed
