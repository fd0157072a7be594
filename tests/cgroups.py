"""Real cgroups for tests: a memory or CPU cgroup made for one test and removed after it.

Each is made inside the test process's own cgroup (cgroup v1), so the limits that already hold
the test still hold the processes moved into it, or under the cgroup2 mount root (cgroup v2,
whose rule against processes in inner cgroups forbids nesting under a leaf). It needs root and
a writable cgroup filesystem; ``cgroup_skip_reason()`` says why a test must skip otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC_MOUNTINFO = Path("/proc/self/mountinfo")
PROC_CGROUP = Path("/proc/self/cgroup")
CPU_PERIOD_US = 100_000
RMDIR_RETRY_SECONDS = 2.0


@dataclass(frozen=True)
class Cgroup:
    """A cgroup a test made: ``path`` is its directory in the cgroup filesystem."""

    path: str

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into this cgroup."""
        Path(self.path, "cgroup.procs").write_text(f"{pid}\n")

    def pids(self) -> list[int]:
        """The processes in this cgroup now."""
        return [int(line) for line in Path(self.path, "cgroup.procs").read_text().split()]


@dataclass(frozen=True)
class MemoryCgroup(Cgroup):
    limit_bytes: int


@dataclass(frozen=True)
class CpuCgroup(Cgroup):
    quota_cores: float


@dataclass(frozen=True)
class _Hierarchy:
    """Where the test process's cgroup for one controller is, and which version holds it."""

    v2: bool
    mount: Path
    own: Path


def _hierarchy(controller: str) -> _Hierarchy:
    """The hierarchy holding ``controller``; OSError when there is none or it is out of reach."""
    v1_paths: dict[str, str] = {}
    v2_path = None
    for line in PROC_CGROUP.read_text().splitlines():
        hierarchy_id, controllers, path = line.split(":", 2)
        if hierarchy_id == "0" and not controllers:
            v2_path = path
        for name in controllers.split(","):
            v1_paths[name] = path
    for line in PROC_MOUNTINFO.read_text().splitlines():
        # "id parent dev root mountpoint options [optional...] - fstype source superoptions"
        fields, _, tail = line.partition(" - ")
        root, mountpoint = fields.split()[3:5]
        fstype, _source, superoptions = tail.split()[:3]
        mount = Path(mountpoint)
        if fstype == "cgroup" and controller in superoptions.split(",") and controller in v1_paths:
            own = v1_paths[controller]
            v2 = False
        elif (
            fstype == "cgroup2"
            and v2_path is not None
            and controller in (mount / "cgroup.controllers").read_text().split()
        ):
            own = v2_path
            v2 = True
        else:
            continue
        relative = os.path.relpath(own, root)
        if relative.startswith(".."):
            raise OSError(f"the {controller} cgroup {own} lies outside its mount {mountpoint} (root {root})")
        return _Hierarchy(v2=v2, mount=mount, own=(mount / relative).resolve())
    raise OSError(f"no cgroup hierarchy has the {controller} controller")


@contextlib.contextmanager
def _cgroup(
    controller: str, settings_v1: list[tuple[str, str]], settings_v2: list[tuple[str, str]]
) -> Iterator[Path]:
    """A new cgroup with ``settings`` (file, value) written in order; on exit the processes
    still in it go back to its parent and it is removed."""
    hierarchy = _hierarchy(controller)
    if hierarchy.v2:
        parent = hierarchy.mount
        subtree = parent / "cgroup.subtree_control"
        if controller not in subtree.read_text().split():
            subtree.write_text(f"+{controller}\n")
        settings = settings_v2
    else:
        parent = hierarchy.own
        settings = settings_v1
    path = parent / f"wl-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        for name, value in settings:
            (path / name).write_text(f"{value}\n")
        yield path
    finally:
        _remove(path, parent)


def _remove(path: Path, parent: Path) -> None:
    """Move what is left in ``path`` to ``parent`` and remove ``path``, retrying while the
    kernel still counts exiting processes in it."""
    deadline = time.monotonic() + RMDIR_RETRY_SECONDS
    while True:
        for pid in Cgroup(str(path)).pids():
            with contextlib.suppress(ProcessLookupError):  # exited since the listing
                Cgroup(str(parent)).add(pid)
        try:
            path.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int, swap_bytes: int = 0) -> Iterator[MemoryCgroup]:
    """A new memory cgroup limited to ``limit_bytes`` of memory and ``swap_bytes`` of swap
    beside it (none by default: swap cannot dodge the limit)."""
    v1 = [("memory.limit_in_bytes", str(limit_bytes))]
    hierarchy = _hierarchy("memory")
    if not hierarchy.v2 and (hierarchy.own / "memory.memsw.limit_in_bytes").exists():
        # After the limit (memsw >= limit); memsw counts memory and swap together.
        v1.append(("memory.memsw.limit_in_bytes", str(limit_bytes + swap_bytes)))
    if swap_bytes and not hierarchy.v2:
        v1.append(("memory.swappiness", "100"))  # swap as readily as the page cache is dropped
    v2 = [("memory.max", str(limit_bytes)), ("memory.swap.max", str(swap_bytes))]
    with _cgroup("memory", v1, v2) as path:
        yield MemoryCgroup(path=str(path), limit_bytes=limit_bytes)


@contextlib.contextmanager
def cpu_cgroup(quota_cores: float) -> Iterator[CpuCgroup]:
    """A new CPU cgroup whose processes together get ``quota_cores`` CPUs of time (CFS quota)."""
    quota_us = round(quota_cores * CPU_PERIOD_US)
    v1 = [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", str(quota_us))]
    v2 = [("cpu.max", f"{quota_us} {CPU_PERIOD_US}")]
    with _cgroup("cpu", v1, v2) as path:
        yield CpuCgroup(path=str(path), quota_cores=quota_cores)


@functools.cache
def cgroup_skip_reason(controller: str = "memory") -> str | None:
    """None when a real cgroup for ``controller`` ("memory" or "cpu") can be made here (a probe
    one is made and removed); else why not, for ``pytest.skip``."""
    if os.geteuid() != 0:
        return "making cgroups needs root"
    probe = memory_cgroup(64 * 1024**2) if controller == "memory" else cpu_cgroup(0.5)
    try:
        with probe:
            return None
    except (OSError, ValueError) as exc:
        return f"cannot make a {controller} cgroup here: {exc}"


SWAP_FILE_DIR = Path("/var/tmp")
"""Where a test's swap file goes: a disk filesystem (tmpfs cannot hold swap)."""


@contextlib.contextmanager
def swap_file(size_bytes: int) -> Iterator[Path]:
    """A swap file of ``size_bytes`` turned on for the machine (``swapon``), off and removed
    after; OSError where it cannot be (not root, no CAP_SYS_ADMIN, a filesystem that refuses)."""
    path = SWAP_FILE_DIR / f"wl-test-swap-{uuid.uuid4().hex[:12]}"
    made = path.open("xb")  # a new file: never one another user made first in the shared directory
    try:
        with made:
            os.posix_fallocate(made.fileno(), 0, size_bytes)
        path.chmod(0o600)
        for command in (["mkswap", str(path)], ["swapon", str(path)]):
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
            if done.returncode:
                raise OSError(f"{' '.join(command)} failed: {done.stderr.strip() or done.returncode}")
        try:
            yield path
        finally:
            subprocess.run(["swapoff", str(path)], capture_output=True, timeout=120, check=True)
    finally:
        path.unlink(missing_ok=True)


@functools.cache
def swap_skip_reason() -> str | None:
    """None when this machine lets a test turn a swap file on (a probe one is made, turned on
    and off) and make a memory cgroup; else why not, for ``pytest.skip``."""
    memory = cgroup_skip_reason("memory")
    if memory is not None:
        return memory
    try:
        with swap_file(16 * 1024**2):
            return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot turn swap on here: {exc}"
