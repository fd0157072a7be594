"""The YAML file: where it is looked for (first found wins), and reading it, bounded."""

from __future__ import annotations

import os
from collections.abc import Mapping
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


def read_document(path: Path) -> object:
    """The file's YAML document; raises ``Unusable``. Bounded: at most
    ``MAX_CONFIG_FILE_BYTES`` are read, and the loader's every exception is caught."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        raise Unusable(f"cannot read it: {exc.strerror or type(exc).__name__}") from None
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


def repository_root(cwd: Path) -> Path | None:
    for directory in (cwd, *cwd.parents):
        if os.path.exists(directory / ".git"):
            return directory
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


def look_up(looked_for: list[Path]) -> Path | None:
    """The first file of ``looked_for`` that exists, warning about ``.yml``
    files in each directory the lookup visits (up to the one found)."""
    found = next((path for path in looked_for if os.path.isfile(path)), None)
    visited = looked_for[: looked_for.index(found) + 1] if found is not None else looked_for
    names: dict[Path, list[str]] = {}
    for path in looked_for:
        names.setdefault(path.parent, []).append(path.name)
    for directory in dict.fromkeys(path.parent for path in visited):
        _warn_ignored_names(directory, names[directory], found)
    return found
