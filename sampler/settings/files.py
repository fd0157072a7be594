"""The YAML file: where it is looked for (first found wins), and reading it, bounded.

Only the running user's files, or root's, configure the monitor, as git trusts
only such repositories (``safe.directory``): a config file, and the ``.git``
that makes a directory the repository root, count only when owned by the
effective user or root and writable by no one else; anything else is skipped
with one warning, as if it were not there. A symbolic link counts when both the
link and what it leads to do; the file is judged as opened (``fstat``), so what
is read is what was judged.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from sampler.settings.parsers import warn, warning
from sampler.util.quoting import bounded_repr

CONFIG_FILE_NAME = "resource_monitoring.yaml"
SECTION = "resource_monitoring"
MAX_CONFIG_FILE_BYTES = 64 * 1024
"""A larger config file is ignored with a warning: PyYAML's pure-Python loader takes about 10 s
per MiB of hostile input (measured), and the documented example is 2 KiB."""
ENV_CONFIG_PATH = "WL_RESOURCE_MONITOR_CONFIG_PATH"
IGNORED_SUFFIX = ".yml"
"""A config file named with this suffix is never read; one found where the lookup looks gets a warning."""
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def label(key: object) -> str:
    """A YAML key as warnings name it: short printable text as is, anything else quoted bounded."""
    return key if isinstance(key, str) and len(key) <= 40 and key.isprintable() else bounded_repr(key, 40)


class Unusable(Exception):
    """The config file cannot be used at all; the message says why."""


def read_document(data: bytes | Unusable) -> object:
    """The YAML document of a file's ``data`` (its first ``MAX_CONFIG_FILE_BYTES``
    + 1 bytes, or why it could not be read: ``Found.data``); raises ``Unusable``.
    Bounded: the loader's every exception is caught."""
    if isinstance(data, Unusable):
        raise data
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise Unusable(f"larger than {MAX_CONFIG_FILE_BYTES // 1024} KiB, which no configuration needs")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unusable(f"not UTF-8 text (byte {exc.start})") from None
    try:
        return yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = ", ".join(part for part in (exc.context, exc.problem) if part) or type(exc).__name__
        raise Unusable(f"not valid YAML: {what[:120]}{at}") from None
    except Exception as exc:  # ValueError, RecursionError, OverflowError, MemoryError, other YAMLErrors...
        raise Unusable(f"cannot parse it: {bounded_repr(exc)}") from None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _others_can_write(found: os.stat_result) -> bool:
    """Whether someone besides the owner can write: others, or the group, unless
    the group's only member is the owner (a user private group: umask 002 makes
    every file of such a user group-writable; Debian's OpenSSH accepts it too)."""
    if found.st_mode & stat.S_IWOTH:
        return True
    if not found.st_mode & stat.S_IWGRP:
        return False
    try:
        group = grp.getgrgid(found.st_gid)
        owner = pwd.getpwuid(found.st_uid).pw_name
    except KeyError:
        return True
    members = set(group.gr_mem) | {user.pw_name for user in pwd.getpwall() if user.pw_gid == group.gr_gid}
    return members != {owner}


def distrust(found: os.stat_result, what: str = "it") -> str | None:
    """Why a file (or ``.git``) with this status must not configure the monitor
    (``what`` is owned by another user than the effective one and root, or others
    can write it), or None. A symbolic link's mode is ignored: no one writes a link."""
    owner = _user(found.st_uid)
    if found.st_uid not in (os.geteuid(), 0):
        trusted = "root" if os.geteuid() == 0 else f"you ({_user(os.geteuid())}) or root"
        return f"{what} is owned by {owner}, not by {trusted}"
    if not stat.S_ISLNK(found.st_mode) and _others_can_write(found):
        mode = stat.S_IMODE(found.st_mode)
        return f"{what} is owned by {owner}, but others can write it (mode {mode:04o})"
    return None


def _judged(path: Path) -> tuple[str | None, str]:
    """Whether ``path`` is reached through a symbolic link that must not be
    followed: (why, or None; how to name what the link leads to). Raises
    ``OSError`` when nothing is there."""
    entry = os.lstat(path)
    if not stat.S_ISLNK(entry.st_mode):
        return None, "it"
    return distrust(entry, "the link"), "the file it leads to"


def repository_root(cwd: Path) -> Path | None:
    """The nearest ancestor of ``cwd`` (itself included) whose ``.git`` counts;
    a ``.git`` that does not (``distrust``) is skipped with a warning."""
    for directory in (cwd, *cwd.parents):
        git = directory / ".git"
        try:
            problem, what = _judged(git)
            problem = problem or distrust(os.stat(git), what)
        except OSError:  # none there (a dangling link counts as none)
            continue
        if problem is None:
            return directory
        warning(
            f"resource monitor: ignoring {git}: {problem}; so {directory} is not taken as the "
            "repository root (the lookup goes on above it)"
        )
    return None


def candidate_files(
    environ: Mapping[str, str], cwd: Path | None, package_dir: Path = PACKAGE_DIR
) -> list[Path]:
    """Where the YAML is looked for, first match wins (SPEC 4 lookup order),
    each place once. ``cwd`` None (the working directory is gone) skips the two
    places found from it."""
    found: list[Path] = []
    config_dir = environ.get(ENV_CONFIG_PATH, "").strip()
    if config_dir:
        if not os.path.isdir(config_dir):
            warn(ENV_CONFIG_PATH, config_dir, "is not a directory; skipping it")
        found += [Path(config_dir) / ("." + CONFIG_FILE_NAME), Path(config_dir) / CONFIG_FILE_NAME]
    root = repository_root(cwd) if cwd is not None else None
    if root is not None:
        found.append(root / CONFIG_FILE_NAME)
    found.append(package_dir / CONFIG_FILE_NAME)
    if cwd is not None:
        found.append(cwd / CONFIG_FILE_NAME)
    return list(dict.fromkeys(found))


def _warn_ignored_names(directory: Path, names: list[str], found: Path | None) -> None:
    """One warning for each ``.yml`` spelling of a config file in ``directory``,
    where the lookup reads only ``names`` (``.yaml``); ``found`` is the file used, if any."""
    others = [name for name in (CONFIG_FILE_NAME, "." + CONFIG_FILE_NAME) if name not in names]
    for yaml_name in [*names, *others]:
        ignored = directory / (yaml_name[: -len(".yaml")] + IGNORED_SUFFIX)
        if not os.path.isfile(ignored):
            continue
        expected = " or ".join(names)
        rename = yaml_name if yaml_name in names else names[-1]
        if found is not None and found.parent == directory:
            outcome = f"{found.name} beside it is used instead"
        else:
            outcome = f"rename it to {rename} to use it"
        warning(
            f"resource monitor: ignoring {ignored}: the configuration file is read only when named "
            f"{expected} ({IGNORED_SUFFIX} is not looked for); {outcome}"
        )


class _Distrusted(Exception):
    """The file must not configure the monitor; the message says why."""


@dataclass(frozen=True)
class Found:
    """The file the lookup settled on."""

    path: Path
    data: bytes | Unusable
    """Its first ``MAX_CONFIG_FILE_BYTES`` + 1 bytes, or why it cannot be read."""


def _read(path: Path) -> Found | None:
    """The file ``path``, read (bounded); None when there is none (nothing, or not
    a regular file). Raises ``_Distrusted``. The file is judged as opened, so a
    file swapped in after a check is never read."""
    try:
        problem, what = _judged(path)
    except OSError:  # nothing there, or not to be reached
        return None
    if problem is not None:
        raise _Distrusted(problem)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # never opens a FIFO or a device
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:  # a dangling link, or removed meanwhile
        return None
    except OSError as exc:  # there, but not to be opened (permissions): judged without reading it
        try:
            found = os.stat(path)
        except OSError:
            return None
        problem = distrust(found, what)
        if problem is not None:
            raise _Distrusted(problem) from None
        return Found(path, Unusable(f"cannot read it: {exc.strerror or type(exc).__name__}"))
    with os.fdopen(fd, "rb") as file:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            return None
        problem = distrust(found, what)
        if problem is not None:
            raise _Distrusted(problem)
        try:
            return Found(path, file.read(MAX_CONFIG_FILE_BYTES + 1))
        except OSError as exc:
            return Found(path, Unusable(f"cannot read it: {exc.strerror or type(exc).__name__}"))


def look_up(looked_for: list[Path]) -> tuple[Found | None, tuple[Path, ...]]:
    """The first file of ``looked_for`` that exists and may configure the
    monitor, read, and the files skipped before it (``distrust``), each with a
    warning; each ``.yml`` file in each directory the lookup visits (up to the
    one found) gets one too."""
    skipped: list[tuple[Path, str]] = []
    found: Found | None = None
    for path in looked_for:
        try:
            found = _read(path)
        except _Distrusted as exc:
            skipped.append((path, str(exc)))
            continue
        if found is not None:
            break
    using = "env vars and defaults" if found is None else found.path
    for path, problem in skipped:
        warning(f"resource monitor: ignoring {path}: {problem}; using {using} instead")
    visited = looked_for[: looked_for.index(found.path) + 1] if found is not None else looked_for
    names: dict[Path, list[str]] = {}
    for path in looked_for:
        names.setdefault(path.parent, []).append(path.name)
    for directory in dict.fromkeys(path.parent for path in visited):
        _warn_ignored_names(directory, names[directory], None if found is None else found.path)
    return found, tuple(path for path, _ in skipped)
