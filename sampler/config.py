"""Resolve the monitor's configuration: defaults, then env vars, then the YAML file.

One table, ``FIELDS``, describes every setting once: its YAML key, env var,
command-line flag, default, parsers and help. A parser raises ``Invalid`` for a
value it cannot use, and reports a value it uses but not as given (an interval
clamped to the floor or the ceiling, a disk path that does not exist yet)
through its ``remark`` callback. Each front end decides what ``Invalid`` means:

- env vars and the YAML file (``load_resource_monitoring_config``): one warning
  on the ``sampler`` logger naming the variable or file, the key, the value
  (quoted bounded) and what is used instead; the key keeps its env-var or
  default value. Resolution never raises.
- the Python API (``resolve_api_settings``): ``TypeError`` or ``ValueError``.
- the command line (``sampler.commands``): an argparse error.

A remark is one warning everywhere.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sampler.quoting import bounded_repr

log = logging.getLogger("sampler")

DEFAULT_CATEGORIES: tuple[str, ...] = ("cpu", "memory", "gpu", "disk", "network", "process")
STEP_SOURCES: tuple[str, ...] = ("model_age", "seconds")
DEFAULT_STEP_SOURCE = "model_age"
DEFAULT_INTERVAL_SECONDS = 15.0
MIN_INTERVAL_SECONDS = 1.0
MAX_INTERVAL_SECONDS = 86400.0
"""One day, the longest interval: a longer one samples too rarely to plot, and a far longer one
(1e12 s) overflows the monitor thread's ``select()`` timeout."""
DEFAULT_DISK_PATH = os.path.abspath(os.sep)  # "/" or "C:\\"

CONFIG_FILE_NAME = "resource_monitoring.yaml"
SECTION = "resource_monitoring"
MAX_CONFIG_FILE_BYTES = 64 * 1024
"""A larger config file is ignored with a warning: PyYAML's pure-Python loader takes about 10 s
per MiB of hostile input (measured), and the documented example is 2 KiB."""

ENV_DISABLE = "WEIGHTSLAB_DISABLE_RESOURCE_MONITORING"
ENV_INTERVAL = "WL_RESOURCE_MONITOR_INTERVAL_SECONDS"
ENV_CATEGORIES = "WL_RESOURCE_MONITOR_CATEGORIES"
ENV_DISK_PATH = "WL_RESOURCE_MONITOR_DISK_PATH"
ENV_STEP_SOURCE = "WL_RESOURCE_MONITOR_STEP_SOURCE"
ENV_CONFIG_PATH = "WL_RESOURCE_MONITOR_CONFIG_PATH"

API_SOURCE = "ResourceMonitor"
"""How warnings name the Python API as the source of a value."""

_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("0", "false", "no", "off")
_WORDS = "1/true/yes/on or 0/false/no/off"
_KNOWN = ", ".join(DEFAULT_CATEGORIES)
_PACKAGE_DIR = Path(__file__).resolve().parent
_EVERY_KEY = "using env vars and defaults for every key"


class Invalid(ValueError):
    """A value a field cannot use; ``str()`` says why.

    ``wrong_type``: the value is of the wrong kind, not merely out of range.
    ``usable``: the part that can still be used, when only some of the value
    is bad (an allowlist naming unknown categories besides known ones), for the
    front ends that accept a partial value; None when nothing is usable.
    """

    def __init__(self, reason: str, *, wrong_type: bool = False, usable: object = None) -> None:
        super().__init__(reason)
        self.wrong_type = wrong_type
        self.usable = usable


Remark = Callable[[str], None]
"""Told, as text that follows the value in a warning, about a value used but not as given."""
Parser = Callable[[Any, Remark], Any]


def warn(where: str, raw: object, text: str) -> None:
    """One warning about the value ``raw`` found at ``where`` (an env var,
    ``file: key``, a flag); ``text`` says what is wrong and what is used."""
    log.warning("resource monitor: %s=%s %s", where, bounded_repr(raw), text)


# --------------------------------------------------------------------------- parsers


def parse_seconds(raw: object) -> float:
    """A finite number of seconds > 0, from a real number (not a bool) or its text.

    A finite number beyond the float range (``10**400``, ``"1e400"``) counts as
    the largest float. Raises ``Invalid``.
    """
    if isinstance(raw, bool) or not isinstance(raw, (numbers.Real, str)):
        raise Invalid(f"expected a number of seconds, got {type(raw).__name__}", wrong_type=True)
    try:
        value = float(raw)
        overflowed = isinstance(raw, str) and math.isinf(value) and "inf" not in raw.lower()
    except ValueError:
        raise Invalid("not a number") from None
    except OverflowError:  # an int or a fraction beyond the float range
        value, overflowed = (-1.0 if isinstance(raw, numbers.Real) and raw < 0 else 1.0), True
    if overflowed:
        value = math.copysign(sys.float_info.max, value)
    if not math.isfinite(value) or value <= 0:
        raise Invalid("expected a finite number of seconds > 0")
    return value


def _interval(raw: object, remark: Remark, floor: float = MIN_INTERVAL_SECONDS) -> float:
    """Seconds between samples from a number or its text, clamped to
    [``floor``, ``MAX_INTERVAL_SECONDS``] with a remark."""
    seconds = parse_seconds(raw)
    if seconds < floor:
        remark(f"is below the {floor:g} s floor; using interval_seconds={float(floor)!r} instead")
        return float(floor)
    if seconds > MAX_INTERVAL_SECONDS:
        ceiling = MAX_INTERVAL_SECONDS
        remark(f"is above the {ceiling:g} s (one day) ceiling; using interval_seconds={ceiling!r} instead")
        return ceiling
    return seconds


def _word(text: str) -> bool:
    """A boolean word as the env vars read it: 1/true/yes/on or 0/false/no/off, any case."""
    word = text.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise Invalid(f"expected {_WORDS}")


def _flag(raw: object) -> bool:
    """A YAML or API boolean: a bool, or a word as the env vars read it."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        return _word(raw)
    raise Invalid(f"expected true or false, got {type(raw).__name__}", wrong_type=True)


def _enabled_from_disable_var(text: str, remark: Remark) -> bool:
    """``WEIGHTSLAB_DISABLE_RESOURCE_MONITORING``: a true word disables; blank or a false word does not."""
    return not _word(text) if text.strip() else True


def _enabled(raw: object, remark: Remark) -> bool:
    return _flag(raw)


def _category(name: object) -> str | None:
    """The category ``name`` refers to (any case, surrounding blanks ignored), or None."""
    if isinstance(name, str):
        key = name.strip().lower()
        if key in DEFAULT_CATEGORIES:
            return key
    return None


def _unknown(names: list[object]) -> str:
    """``unknown categories 'a', 'b'; known: ...``, naming at most five."""
    shown = ", ".join(bounded_repr(name, 30) for name in names[:5]) + (", ..." if len(names) > 5 else "")
    return f"unknown {'category' if len(names) == 1 else 'categories'} {shown}; known: {_KNOWN}"


def _categories_from_text(text: str, remark: Remark) -> dict[str, bool]:
    """A comma-separated allowlist (any case); blank means all.

    Raises ``Invalid`` when it names no known category, and, with the known
    ones as ``usable``, when it names unknown ones besides.
    """
    if not text.strip():
        return dict.fromkeys(DEFAULT_CATEGORIES, True)
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    known = {_category(entry) for entry in entries} - {None}
    if not known:
        raise Invalid(f"names no known category; expected a comma-separated list of {_KNOWN}")
    enabled = {name: name in known for name in DEFAULT_CATEGORIES}
    unknown: list[object] = [entry for entry in entries if _category(entry) is None]
    if unknown:
        raise Invalid(_unknown(unknown), usable=enabled)
    return enabled


def _categories(raw: object, remark: Remark) -> dict[str, bool]:
    """None (all), an iterable of names (an allowlist), or a mapping name ->
    flag (a bool or a word as the env vars read it), whose unlisted names are off."""
    if raw is None:
        return dict.fromkeys(DEFAULT_CATEGORIES, True)
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Iterable):
        raise Invalid(
            "expected a list of category names such as ['cpu', 'gpu'], a mapping name -> bool, "
            f"or None; got {type(raw).__name__}",
            wrong_type=True,
        )
    names: list[object] = list(raw)
    unknown = [name for name in names if _category(name) is None]
    if unknown:
        raise Invalid(_unknown(unknown))
    enabled: set[str | None] = set()
    for name in names:
        try:
            on = _flag(raw[name]) if isinstance(raw, Mapping) else True
        except Invalid as exc:
            raise Invalid(f"{bounded_repr(name, 30)}: {exc}", wrong_type=exc.wrong_type) from None
        if on:
            enabled.add(_category(name))
    return {name: name in enabled for name in DEFAULT_CATEGORIES}


def _show_categories(value: Mapping[str, bool]) -> str:
    return ",".join(name for name in DEFAULT_CATEGORIES if value[name]) or "none"


def _disk_path(raw: object, remark: Remark) -> str:
    """A non-empty path (str or ``os.PathLike``), made absolute. One that does
    not exist (yet) is kept, with a remark."""
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if not isinstance(raw, str):
        raise Invalid(f"expected a path, got {type(raw).__name__}", wrong_type=True)
    if not raw.strip():
        raise Invalid("expected a non-empty path")
    if "\0" in raw:
        raise Invalid("a path cannot contain a NUL character")
    path = os.path.abspath(raw)
    if not os.path.exists(path) and path not in _reported_missing:
        # Once per path: the same path passes through the config and then the API.
        _reported_missing.add(path)
        remark(
            "does not exist (yet); keeping it: the disk usage readings are skipped until it appears "
            "(the disk I/O counters keep flowing)"
        )
    return path


_reported_missing: set[str] = set()


def _step_source(raw: object, remark: Remark) -> str:
    """One of ``STEP_SOURCES``, any case."""
    if not isinstance(raw, str):
        raise Invalid(f"expected one of {', '.join(STEP_SOURCES)}, got {type(raw).__name__}", wrong_type=True)
    value = raw.strip().lower()
    if value not in STEP_SOURCES:
        raise Invalid(f"expected one of {', '.join(STEP_SOURCES)}")
    return value


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Field:
    """One setting, described once for every front end."""

    key: str
    """Key in the YAML section and in the resolved dict."""
    env: str | None
    """Environment variable, or None."""
    flag: str | None
    """Flag of ``python -m sampler run``, or None."""
    default: Any
    from_text: Parser
    """Reads an env var's or a flag's text."""
    from_value: Parser
    """Reads a Python API argument, and a YAML value (but for categories, whose
    YAML form is a mapping of per-category flags that omitted ones keep)."""
    help: str
    show: Callable[[Any], str] = bounded_repr
    """Quotes a value of this field in a warning."""


ENABLED = Field(
    key="enabled",
    env=ENV_DISABLE,
    flag=None,
    default=True,
    from_text=_enabled_from_disable_var,
    from_value=_enabled,
    help="master switch; its env var disables monitoring when 1/true/yes/on",
)
INTERVAL = Field(
    key="interval_seconds",
    env=ENV_INTERVAL,
    flag="--interval",
    default=DEFAULT_INTERVAL_SECONDS,
    from_text=_interval,
    from_value=_interval,
    help=f"seconds between samples (floor {MIN_INTERVAL_SECONDS:g}, ceiling {MAX_INTERVAL_SECONDS:g})",
)
CATEGORIES = Field(
    key="categories",
    env=ENV_CATEGORIES,
    flag="--categories",
    default=dict.fromkeys(DEFAULT_CATEGORIES, True),
    from_text=_categories_from_text,
    from_value=_categories,
    help=f"comma-separated allowlist of {_KNOWN}",
    show=_show_categories,
)
DISK_PATH = Field(
    key="disk_path",
    env=ENV_DISK_PATH,
    flag="--disk-path",
    default=DEFAULT_DISK_PATH,
    from_text=_disk_path,
    from_value=_disk_path,
    help="filesystem the disk usage signals report",
)
STEP_SOURCE = Field(
    key="step_source",
    env=ENV_STEP_SOURCE,
    flag="--step-source",
    default=DEFAULT_STEP_SOURCE,
    from_text=_step_source,
    from_value=_step_source,
    help=f"x axis of the curves: {' or '.join(STEP_SOURCES)}",
)

FIELDS: tuple[Field, ...] = (ENABLED, INTERVAL, CATEGORIES, DISK_PATH, STEP_SOURCE)
_BY_KEY = {field.key: field for field in FIELDS}


def defaults() -> dict[str, Any]:
    """The built-in configuration, before env vars and files."""
    cfg = {
        field.key: dict(field.default) if isinstance(field.default, dict) else field.default
        for field in FIELDS
    }
    cfg["config_file"] = None
    return cfg


# --------------------------------------------------------------------------- the Python API


@dataclass(frozen=True)
class ApiSettings:
    """``ResourceMonitor``'s settings, validated."""

    interval_seconds: float
    """Seconds between samples, within [floor, ``MAX_INTERVAL_SECONDS``]."""
    categories: tuple[str, ...]
    """The enabled categories, in ``DEFAULT_CATEGORIES`` order."""
    disk_path: str
    """Absolute path of the filesystem the disk usage signals report; may not exist (yet)."""
    step_source: str
    """One of ``STEP_SOURCES``."""


def resolve_api_settings(
    *,
    interval_seconds: object,
    categories: object,
    disk_path: object,
    step_source: object,
    min_interval_seconds: float = MIN_INTERVAL_SECONDS,
) -> ApiSettings:
    """Validate the Python API's settings with the parsers env vars and YAML use.

    ``interval_seconds``: a real number (not a bool, not text), finite and
    > 0, clamped with a warning to [``min_interval_seconds``,
    ``MAX_INTERVAL_SECONDS``]. ``categories``: None (all), an iterable of
    names, or a mapping name -> bool (or a word as the env vars read it) whose
    unlisted names are off. ``disk_path``: a non-empty str or os.PathLike,
    made absolute; one that does not exist (yet) is kept with a warning.
    ``step_source``: one of ``STEP_SOURCES``. Raises ``TypeError`` for a value
    of the wrong type and ``ValueError`` for a bad value.
    """
    if isinstance(interval_seconds, str):
        raise TypeError(
            f"interval_seconds={bounded_repr(interval_seconds)}: expected a number of seconds, got str"
        )
    interval = _from_api(INTERVAL, interval_seconds, functools.partial(_interval, floor=min_interval_seconds))
    enabled = _from_api(CATEGORIES, categories, CATEGORIES.from_value)
    return ApiSettings(
        interval_seconds=interval,
        categories=tuple(name for name in DEFAULT_CATEGORIES if enabled[name]),
        disk_path=_from_api(DISK_PATH, disk_path, DISK_PATH.from_value),
        step_source=_from_api(STEP_SOURCE, step_source, STEP_SOURCE.from_value),
    )


def _from_api(field: Field, raw: object, parse: Parser) -> Any:
    try:
        return parse(raw, functools.partial(warn, f"{API_SOURCE}: {field.key}", raw))
    except Invalid as exc:
        error = TypeError if exc.wrong_type else ValueError
        raise error(f"{field.key}={bounded_repr(raw)}: {exc}") from None


# --------------------------------------------------------------------------- env vars and the file


def _apply(cfg: dict[str, Any], field: Field, parse: Parser, raw: object, where: str) -> None:
    """``cfg[field.key] = parse(raw)``; when that fails, warn once and keep the
    previous value, or the usable part of ``raw``."""
    try:
        cfg[field.key] = parse(raw, functools.partial(warn, where, raw))
    except Invalid as exc:
        if exc.usable is None:
            warn(where, raw, f"is invalid ({exc}); using {field.key}={field.show(cfg[field.key])} instead")
        else:
            cfg[field.key] = exc.usable
            warn(
                where,
                raw,
                f"is partly invalid ({exc}); ignoring that part, using {field.key}={field.show(exc.usable)}",
            )


def _apply_env(cfg: dict[str, Any], environ: Mapping[str, str]) -> None:
    for field in FIELDS:
        if field.env is not None and field.env in environ:
            _apply(cfg, field, field.from_text, environ[field.env], field.env)


def _label(key: object) -> str:
    """A YAML key as warnings name it: short printable text as is, anything else quoted bounded."""
    return key if isinstance(key, str) and len(key) <= 40 and key.isprintable() else bounded_repr(key, 40)


class _Unusable(Exception):
    """The config file cannot be used at all; the message says why."""


def _read_document(path: Path) -> object:
    """The file's YAML document; raises ``_Unusable``. Bounded: at most
    ``MAX_CONFIG_FILE_BYTES`` are read, and the loader's every exception is caught."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        raise _Unusable(f"cannot read it: {exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise _Unusable(f"larger than {MAX_CONFIG_FILE_BYTES // 1024} KiB, which no configuration needs")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Unusable(f"not UTF-8 text (byte {exc.start})") from None
    try:
        return yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = ", ".join(part for part in (exc.context, exc.problem) if part) or type(exc).__name__
        raise _Unusable(f"not valid YAML: {what[:120]}{at}") from None
    except Exception as exc:  # ValueError, RecursionError, OverflowError, MemoryError, other YAMLErrors...
        raise _Unusable(f"cannot parse it: {bounded_repr(exc)}") from None


def _apply_file(cfg: dict[str, Any], path: Path) -> None:
    source = str(path)
    try:
        document = _read_document(path)
    except _Unusable as exc:
        log.warning("resource monitor: cannot use %s (%s); %s", source, exc, _EVERY_KEY)
        return
    cfg["config_file"] = source
    if document is None:
        return
    if not isinstance(document, dict):
        warn(
            f"{source}: <top level>",
            document,
            f"is invalid (expected a mapping with a {SECTION!r} key); {_EVERY_KEY}",
        )
        return
    for key, raw in document.items():
        if key != SECTION:
            warn(
                f"{source}: {_label(key)}",
                raw,
                f"is an unknown top-level key (only {SECTION!r} is read); ignoring it",
            )
    section = document.get(SECTION)
    if section is None:
        return
    if not isinstance(section, dict):
        warn(f"{source}: {SECTION}", section, f"is invalid (expected a mapping of settings); {_EVERY_KEY}")
        return
    for key, raw in section.items():
        field = _BY_KEY.get(key) if isinstance(key, str) else None
        where = f"{source}: {SECTION}.{_label(key)}"
        if field is None:
            warn(where, raw, f"is an unknown key (known: {', '.join(_BY_KEY)}); ignoring it")
        elif field is CATEGORIES:
            _apply_file_categories(cfg["categories"], where, raw)
        else:
            _apply(cfg, field, field.from_value, raw, where)


def _apply_file_categories(categories: dict[str, bool], where: str, raw: object) -> None:
    """Per-category flags: omitted ones keep their value."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        using = _show_categories(categories)
        warn(
            where,
            raw,
            f"is invalid (expected a mapping of category: true/false); using categories={using} instead",
        )
        return
    for name, flag in raw.items():
        entry = f"{where}.{_label(name)}"
        category = _category(name)
        if category is None:
            warn(entry, flag, f"is not a known category (known: {_KNOWN}); ignoring it")
            continue
        try:
            categories[category] = _flag(flag)
        except Invalid as exc:
            warn(
                entry,
                flag,
                f"is invalid ({exc}); using categories.{category}={categories[category]!r} instead",
            )


# --------------------------------------------------------------------------- lookup


def _repository_root(cwd: Path) -> Path | None:
    for directory in (cwd, *cwd.parents):
        if os.path.exists(directory / ".git"):
            return directory
    return None


def candidate_files(
    environ: Mapping[str, str], cwd: Path | None, package_dir: Path = _PACKAGE_DIR
) -> list[Path]:
    """Where the YAML is looked for, first match wins (SPEC 4 lookup order).
    ``cwd`` None (the working directory is gone) skips the two places found from it."""
    found: list[Path] = []
    config_dir = environ.get(ENV_CONFIG_PATH, "").strip()
    if config_dir:
        if not os.path.isdir(config_dir):
            warn(ENV_CONFIG_PATH, config_dir, "is not a directory; skipping it")
        found += [Path(config_dir) / ("." + CONFIG_FILE_NAME), Path(config_dir) / CONFIG_FILE_NAME]
    root = _repository_root(cwd) if cwd is not None else None
    if root is not None:
        found.append(root / CONFIG_FILE_NAME)
    found.append(package_dir / CONFIG_FILE_NAME)
    if cwd is not None:
        found.append(cwd / CONFIG_FILE_NAME)
    return found


def load_resource_monitoring_config(
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    *,
    package_dir: str | os.PathLike[str] = _PACKAGE_DIR,
) -> dict[str, Any]:
    """Resolve the configuration once; never raises for bad configuration.

    Returns a dict with ``enabled`` (bool), ``interval_seconds`` (float, s),
    ``categories`` (each of ``DEFAULT_CATEGORIES`` -> bool), ``disk_path``
    (absolute), ``step_source`` and ``config_file`` (the YAML used, or None).
    ``environ`` and ``cwd`` default to the process's own.
    """
    environ = os.environ if environ is None else environ
    try:
        cwd_path: Path | None = Path(os.getcwd() if cwd is None else cwd).resolve()
    except OSError:  # the working directory was removed
        cwd_path = None
    cfg = defaults()
    _apply_env(cfg, environ)
    for path in candidate_files(environ, cwd_path, Path(package_dir)):
        if os.path.isfile(path):
            _apply_file(cfg, path)
            break
    return cfg
