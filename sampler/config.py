"""Resolve the monitor's configuration: defaults, then env vars, then the YAML file.

Resolution never fails: every bad value is reported once, through the
``sampler`` logger, naming its source, the key, the value and what is used
instead, and that key keeps its env-var or default value.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("sampler")

DEFAULT_CATEGORIES: tuple[str, ...] = ("cpu", "memory", "gpu", "disk", "network", "process")
STEP_SOURCES: tuple[str, ...] = ("model_age", "seconds")
DEFAULT_STEP_SOURCE = "model_age"
DEFAULT_INTERVAL_SECONDS = 15.0
MIN_INTERVAL_SECONDS = 1.0
DEFAULT_DISK_PATH = os.path.abspath(os.sep)  # "/" or "C:\\"

CONFIG_FILE_NAME = "resource_monitoring.yaml"
SECTION = "resource_monitoring"

ENV_DISABLE = "WEIGHTSLAB_DISABLE_RESOURCE_MONITORING"
ENV_INTERVAL = "WL_RESOURCE_MONITOR_INTERVAL_SECONDS"
ENV_CATEGORIES = "WL_RESOURCE_MONITOR_CATEGORIES"
ENV_DISK_PATH = "WL_RESOURCE_MONITOR_DISK_PATH"
ENV_STEP_SOURCE = "WL_RESOURCE_MONITOR_STEP_SOURCE"
ENV_CONFIG_PATH = "WL_RESOURCE_MONITOR_CONFIG_PATH"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
_PACKAGE_DIR = Path(__file__).resolve().parent
_KNOWN = ", ".join(DEFAULT_CATEGORIES)


class _Invalid(ValueError):
    """A value that cannot be used; the message says why."""


def defaults() -> dict[str, Any]:
    """The built-in configuration, before env vars and files."""
    return {
        "enabled": True,
        "interval_seconds": DEFAULT_INTERVAL_SECONDS,
        "categories": dict.fromkeys(DEFAULT_CATEGORIES, True),
        "disk_path": DEFAULT_DISK_PATH,
        "step_source": DEFAULT_STEP_SOURCE,
        "config_file": None,
    }


def parse_interval(raw: object, source: str = "interval_seconds") -> float:
    """Seconds between samples, clamped to ``MIN_INTERVAL_SECONDS``.

    Accepts numbers and numeric strings; raises ``ValueError`` for anything
    non-numeric, non-finite or not positive. A positive value under the floor
    is clamped with a warning naming ``source`` (the variable, file or flag).
    """
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise _Invalid(f"expected a number of seconds, got {type(raw).__name__}")
    try:
        value = float(raw)
    except ValueError:
        raise _Invalid("not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise _Invalid("must be a finite number of seconds > 0")
    if value < MIN_INTERVAL_SECONDS:
        log.warning(
            "resource monitor: %s: interval_seconds=%r is below the %g s floor; using %r instead",
            source,
            raw,
            MIN_INTERVAL_SECONDS,
            MIN_INTERVAL_SECONDS,
        )
        return MIN_INTERVAL_SECONDS
    return value


def _parse_step_source(raw: object) -> str:
    value = raw.strip().lower() if isinstance(raw, str) else raw
    if value not in STEP_SOURCES:
        raise _Invalid(f"must be one of {', '.join(STEP_SOURCES)}")
    return str(value)


def _parse_disk_path(raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise _Invalid("expected a non-empty path")
    if not os.path.exists(raw):
        raise _Invalid("no such path")
    return raw


def _parse_bool(raw: object) -> bool:
    if not isinstance(raw, bool):
        raise _Invalid("expected true or false")
    return raw


def _warn(source: str, key: str, raw: object, why: str, instead: str) -> None:
    log.warning("resource monitor: %s: %s=%r is invalid (%s); %s", source, key, raw, why, instead)


def _using(value: object) -> str:
    return f"using {value!r} instead"


_IGNORED = "ignoring it"


def _apply_env(cfg: dict[str, Any], environ: Mapping[str, str]) -> None:
    raw = environ.get(ENV_DISABLE)
    if raw is not None:
        flag = raw.strip().lower()
        if flag in _TRUE:
            cfg["enabled"] = False
        elif flag not in _FALSE:
            _warn(
                ENV_DISABLE,
                ENV_DISABLE,
                raw,
                "expected 1/true/yes/on or 0/false/no/off",
                "monitoring stays enabled",
            )

    simple = ((ENV_INTERVAL, "interval_seconds", lambda raw: parse_interval(raw, ENV_INTERVAL)),
              (ENV_DISK_PATH, "disk_path", _parse_disk_path),
              (ENV_STEP_SOURCE, "step_source", _parse_step_source))  # fmt: skip
    for var, key, parse in simple:
        raw = environ.get(var)
        if raw is None:
            continue
        try:
            cfg[key] = parse(raw)
        except _Invalid as exc:
            _warn(var, key, raw, str(exc), _using(cfg[key]))

    raw = environ.get(ENV_CATEGORIES)
    if raw is not None and raw.strip():
        wanted = {name.strip().lower() for name in raw.split(",") if name.strip()}
        for name in sorted(wanted - set(DEFAULT_CATEGORIES)):
            _warn(ENV_CATEGORIES, "categories", name, f"unknown category, known: {_KNOWN}", _IGNORED)
        cfg["categories"] = {name: name in wanted for name in DEFAULT_CATEGORIES}


def _apply_file(cfg: dict[str, Any], path: Path) -> None:
    source = str(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        log.warning(
            "resource monitor: cannot read %s (%s); using env vars and defaults for every key", source, exc
        )
        return
    cfg["config_file"] = source
    if document is None:
        return
    if not isinstance(document, dict):
        why = f"expected a mapping with a {SECTION!r} key"
        _warn(source, "<top level>", document, why, "using env vars and defaults for every key")
        return
    for key in document:
        if key != SECTION:
            _warn(
                source, str(key), document[key], f"unknown top-level key, only {SECTION!r} is read", _IGNORED
            )
    section = document.get(SECTION)
    if section is None:
        return
    if not isinstance(section, dict):
        _warn(source, SECTION, section, "expected a mapping of settings", "using env vars and defaults")
        return

    parsers = {"enabled": _parse_bool,
               "interval_seconds": lambda raw: parse_interval(raw, source),
               "disk_path": _parse_disk_path,
               "step_source": _parse_step_source}  # fmt: skip
    for key, raw in section.items():
        if key == "categories":
            _apply_file_categories(cfg, source, raw)
        elif key in parsers:
            try:
                cfg[key] = parsers[key](raw)
            except _Invalid as exc:
                _warn(source, f"{SECTION}.{key}", raw, str(exc), _using(cfg[key]))
        else:
            known = ", ".join((*parsers, "categories"))
            _warn(source, f"{SECTION}.{key}", raw, f"unknown key, known: {known}", _IGNORED)


def _apply_file_categories(cfg: dict[str, Any], source: str, raw: object) -> None:
    key = f"{SECTION}.categories"
    if raw is None:
        return
    if not isinstance(raw, dict):
        _warn(source, key, raw, "expected a mapping of category: true/false", _using(cfg["categories"]))
        return
    for name, flag in raw.items():
        if name not in DEFAULT_CATEGORIES:
            _warn(source, f"{key}.{name}", flag, f"unknown category, known: {_KNOWN}", _IGNORED)
        elif not isinstance(flag, bool):
            _warn(source, f"{key}.{name}", flag, "expected true or false", _using(cfg["categories"][name]))
        else:
            cfg["categories"][name] = flag


def _repository_root(cwd: Path) -> Path | None:
    for directory in (cwd, *cwd.parents):
        if (directory / ".git").exists():
            return directory
    return None


def candidate_files(environ: Mapping[str, str], cwd: Path, package_dir: Path = _PACKAGE_DIR) -> list[Path]:
    """Where the YAML is looked for, first match wins (SPEC 4 lookup order)."""
    found: list[Path] = []
    config_dir = environ.get(ENV_CONFIG_PATH, "").strip()
    if config_dir:
        if not os.path.isdir(config_dir):
            log.warning(
                "resource monitor: %s=%r is not a directory; skipping it",
                ENV_CONFIG_PATH,
                config_dir,
            )
        found += [Path(config_dir) / ("." + CONFIG_FILE_NAME), Path(config_dir) / CONFIG_FILE_NAME]
    root = _repository_root(cwd)
    if root is not None:
        found.append(root / CONFIG_FILE_NAME)
    found += [package_dir / CONFIG_FILE_NAME, cwd / CONFIG_FILE_NAME]
    return found


def load_resource_monitoring_config(
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    *,
    package_dir: str | os.PathLike[str] = _PACKAGE_DIR,
) -> dict[str, Any]:
    """Resolve the configuration once.

    Returns a dict with ``enabled`` (bool), ``interval_seconds`` (float, s),
    ``categories`` (each of ``DEFAULT_CATEGORIES`` -> bool), ``disk_path``,
    ``step_source`` and ``config_file`` (the YAML used, or None).
    ``environ`` and ``cwd`` default to the process's own.
    """
    environ = os.environ if environ is None else environ
    cwd_path = Path(os.getcwd() if cwd is None else cwd).resolve()
    cfg = defaults()
    _apply_env(cfg, environ)
    for path in candidate_files(environ, cwd_path, Path(package_dir)):
        if path.is_file():
            _apply_file(cfg, path)
            break
    return cfg
