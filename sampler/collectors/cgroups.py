"""Where a process's cgroups are: its v2 cgroup and its v1 cgroup per controller, with their
ancestors up to the mount root, read from /proc/<pid>/cgroup and the cgroup mounts.

cgroup v2 (the unified ``0::`` hierarchy) is mounted at the cgroup root or at ``unified`` under
it; cgroup v1 has one mount per controller (``memory``, ``cpu``, or a joined ``cpu,cpuacct``).
"""

from __future__ import annotations

from pathlib import Path


def parse_cgroup_file(text: str) -> tuple[str | None, dict[str, tuple[str, str]]]:
    """The v2 path, and per v1 controller (its joined controller list, its path), of one
    /proc/<pid>/cgroup ("hierarchy-id:controllers:path" per line)."""
    v2_path = None
    v1: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        hierarchy_id, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy_id == "0":
            v2_path = path
        else:
            for controller in controllers.split(","):
                v1[controller] = (controllers, path)
    return v2_path, v1


def ancestry(mount: Path, path: str) -> list[Path]:
    """The cgroup directory of ``path`` under ``mount`` and its ancestors up to ``mount``.

    A container that sees only its own cgroup mounted (no cgroup namespace) still reads the
    host's path (/docker/<id>): then the longest tail of the path that exists is its cgroup.
    """
    parts = [part for part in path.split("/") if part]
    if ".." in parts:  # a cgroup outside this namespace's root: not under the mount
        return []
    for start in range(len(parts) + 1):
        tail = parts[start:]
        if mount.joinpath(*tail).is_dir():
            return [mount.joinpath(*tail[:end]) for end in range(len(tail), -1, -1)]
    return []


def v2_ancestry(cgroup_root: Path, path: str | None) -> list[Path]:
    """The v2 cgroup ``path`` and its ancestors, own first; empty without a v2 mount."""
    if path is None:
        return []
    for mount in (cgroup_root, cgroup_root / "unified"):
        if (mount / "cgroup.controllers").is_file():
            return ancestry(mount, path)
    return []


def v1_ancestry(cgroup_root: Path, v1: dict[str, tuple[str, str]], controller: str) -> list[Path]:
    """The v1 cgroup of ``controller`` and its ancestors, own first; empty without its mount."""
    if controller not in v1:
        return []
    joined, path = v1[controller]
    for mount in (cgroup_root / joined, cgroup_root / controller):
        if mount.is_dir():
            return ancestry(mount, path)
    return []


def ancestries(
    pid: int, proc_root: str, cgroup_root: str, controllers: tuple[str, ...]
) -> tuple[list[Path], dict[str, list[Path]]]:
    """The v2 ancestry of process ``pid``, and its v1 ancestry for each of ``controllers``.
    ``OSError`` when its cgroup file or the cgroup filesystem cannot be read."""
    v2_path, v1 = parse_cgroup_file(Path(proc_root, str(pid), "cgroup").read_text())
    root = Path(cgroup_root)
    return v2_ancestry(root, v2_path), {c: v1_ancestry(root, v1, c) for c in controllers}
