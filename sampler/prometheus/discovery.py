"""Prometheus file-based service discovery: one JSON file per monitor.

A Prometheus server whose ``file_sd_configs`` reads ``<prometheus_sd_dir>/*.json``
finds every rank of every job on the host (or on every host sharing the
directory) without hand-written targets. The backend writes its entry once
its child serves, and removes it at stop; if the backend dies, its child
removes it on the way out, so no target outlives its job. Where both were
killed at once, the next monitor of the host to list itself there removes
their entry (``remove_stale_entries``), but only once it can prove the backend
dead: host-network containers share the host's name and a discovery directory,
and a pid means nothing outside its own pid namespace, so each entry records
its backend's boot, pid namespace, pid and start time (``Owner``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sampler.settings.placement import Placement, whole_number
from sampler.util import atomicfile

log = logging.getLogger("sampler")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_EVERYWHERE = ("0.0.0.0", "::", "")
_PREFIX = "wl-resource-"
ENTRY_MODE = 0o644
"""Prometheus, another user, reads the entries; only their monitor may rewrite one."""
_MAX_ENTRY_BYTES = 65536
"""An entry of ours is far smaller: a larger file reads cut short, not as JSON."""
_NAMED_RUN_ID = 64
"""Characters of the run id (a launcher's has no bound) an entry's name keeps: with the host
name's 64 and its temporary's suffix, the name stays within a file name's 255 bytes."""
_PROC = "/proc"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_MAX_PID = 1 << 22
"""Linux's ``PID_MAX_LIMIT``: no pid reaches it."""


@dataclass(frozen=True)
class Owner:
    """The backend an entry is of, as its kernel knows it. The entry records it in labels
    that Prometheus drops after relabelling (``__meta_`` ones), so that the monitor of
    another backend can tell whether it still runs."""

    boot_id: str
    """The kernel's boot id: a pid namespace and a start time mean something only within
    one boot of one kernel (two hosts may share a name, and their initial namespaces'
    inode is the same)."""
    namespace: int
    """Inode of the backend's pid namespace (``/proc/<pid>/ns/pid``): one for every
    process of a host (or of a container sharing its pid namespace), another in a
    container of its own; no two live namespaces of a kernel share one."""
    pid: int
    """In that namespace (a container's first process is pid 1 in each)."""
    started: int
    """Clock ticks after boot (``/proc/<pid>/stat`` field 22): a process that reuses the
    pid started later."""

    LABELS = (
        "__meta_wl_resource_boot_id",
        "__meta_wl_resource_pid_namespace",
        "__meta_wl_resource_pid",
        "__meta_wl_resource_pid_started",
    )

    def labels(self) -> dict[str, str]:
        """The labels that record it in an entry."""
        values = (self.boot_id, str(self.namespace), str(self.pid), str(self.started))
        return dict(zip(self.LABELS, values, strict=True))

    @classmethod
    def of(cls, labels: Mapping[str, object]) -> Owner | None:
        """The owner ``labels`` record, or None where they record none (an entry of a release
        before owners were recorded, or of a system without ``/proc``) or not one of ours."""
        boot_id, *numbers = (labels.get(name) for name in cls.LABELS)
        if not isinstance(boot_id, str) or not all(isinstance(n, str) for n in numbers):
            return None
        namespace, pid, started = (whole_number(str(n)) for n in numbers)
        if namespace is None or pid is None or started is None or not 0 < pid < _MAX_PID:
            return None
        return cls(boot_id, namespace, pid, started)


def start_ticks(pid: int | str) -> int | None:
    """When process ``pid`` (``"self"``: this one) of the pid namespace ``/proc`` shows
    started, in clock ticks after boot; None where it cannot be read (gone, hidden, no ``/proc``)."""
    try:
        with open(os.path.join(_PROC, str(pid), "stat"), "rb") as file:
            stat = file.read()
        # The name (field 2, in parentheses) may hold anything; field 22 is the 20th after it.
        return int(stat[stat.rindex(b")") + 1 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def this_process() -> Owner | None:
    """This process as an entry records its owner; None where the kernel does not say
    (not Linux, or a ``/proc`` without namespaces)."""
    try:
        with open(_BOOT_ID, encoding="ascii") as file:
            boot_id = file.read().strip()
        namespace = os.stat(os.path.join(_PROC, "self", "ns", "pid")).st_ino
    except (OSError, ValueError):
        return None
    started = start_ticks("self")
    return None if started is None or not boot_id else Owner(boot_id, namespace, os.getpid(), started)


def entry_path(sd_dir: str, placement: Placement, pid: int) -> str:
    """A new entry's file: named by host, run, rank and backend pid, for a person to read,
    and a random part, so that no two monitors' entries share a name (two containers'
    backends may both be pid 1 of one host name, with one run id)."""
    run_id = placement.run_id[:_NAMED_RUN_ID]
    stem = f"{_PREFIX}{placement.host}-{run_id}-rank{placement.rank}-pid{pid}-{os.urandom(4).hex()}"
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
    target, recording this process as its owner. Raises ``OSError``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    owner = this_process()
    labels = labels if owner is None else {**labels, **owner.labels()}
    body = json.dumps([{"targets": [address], "labels": labels}], indent=1) + "\n"
    atomicfile.write(path, body.encode(), ENTRY_MODE)


def remove_entry(path: str) -> None:
    """Remove the entry, if it is there; never raises."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _gone(owner: Owner, here: Owner, proc_is_ours: bool) -> bool:
    """Whether ``owner`` provably runs no more, asked from the process ``here``: only an
    owner of this boot and pid namespace can be asked about (``kill(pid, 0)`` in another
    namespace asks about another process, or none), and it is gone when its pid is, or
    when its pid is now a process that started at another time. ``proc_is_ours``: whether
    ``/proc`` shows this pid namespace (a start time can be read)."""
    if (owner.boot_id, owner.namespace) != (here.boot_id, here.namespace):
        return False
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process has the pid
        pass
    started = start_ticks(owner.pid) if proc_is_ours else None
    return started is not None and started != owner.started


def _owner_of(body: bytes, host: str) -> Owner | None:
    """The owner ``body`` records, where it is an entry as ``write_entry`` writes it, of a
    monitor on ``host``."""
    try:
        content = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (or too deep for it), or not UTF-8
        return None
    if not (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)):
        return None
    targets, labels = content[0].get("targets"), content[0].get("labels")
    if not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        return None
    if not (isinstance(labels, dict) and labels.get("host") == host):
        return None
    return Owner.of(labels)


def _stale(directory: int, name: str, host: str, here: Owner, proc_is_ours: bool) -> bool:
    """Whether ``name`` in the directory open at ``directory`` is the entry of a
    monitor of ``host`` whose backend is provably gone. Raises ``OSError``."""
    if not (name.startswith(_UNSAFE.sub("_", f"{_PREFIX}{host}-")) and name.endswith(".json")):
        return False
    # Never through a link; a FIFO gives EOF at once, a directory EISDIR.
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    try:
        body = os.read(fd, _MAX_ENTRY_BYTES)
    finally:
        os.close(fd)
    owner = _owner_of(body, host)
    return owner is not None and _gone(owner, here, proc_is_ours)


def remove_stale_entries(sd_dir: str, host: str) -> list[str]:
    """Remove the entries in ``sd_dir`` of monitors of ``host`` (this one) whose
    backend is provably gone (``_gone``): those whose child was killed with it left
    them behind. Anything else stays: another host's entries, a live backend's, one of
    another pid namespace (another container's, which only a monitor there can judge),
    one recording no owner, a file not of our name and content, a link. Returns the
    paths removed; never raises."""
    removed: list[str] = []
    here = this_process()
    if here is None:
        return removed
    proc_is_ours = _proc_shows(here.pid)
    try:
        directory = os.open(sd_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        for name in os.listdir(directory):
            with contextlib.suppress(OSError):
                if _stale(directory, name, host, here, proc_is_ours):
                    os.unlink(name, dir_fd=directory)
                    removed.append(os.path.join(sd_dir, name))
                    log.info(
                        "resource monitor: removed %s, the discovery entry of a dead monitor", removed[-1]
                    )
    finally:
        os.close(directory)
    return removed


def _proc_shows(pid: int) -> bool:
    """Whether ``/proc`` shows the pid namespace in which this process is ``pid`` (a
    process in a namespace of its own may see its parent namespace's ``/proc``)."""
    try:
        return os.readlink(os.path.join(_PROC, "self")) == str(pid)
    except OSError:
        return False
