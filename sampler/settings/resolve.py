"""Resolution: the one way settings are decided, for every front end.

Defaults, then env vars, then the first YAML file found, then (for
``ResourceMonitor``) the arguments passed: ``resolve_settings`` gives the frozen
``MonitorSettings`` every stage receives, ``resolve_config`` the same values with
where each came from and every warning (``python -m sampler config``).

What ``Invalid`` means depends on where the value came from: for an env var or
the file, one warning naming the variable or file, the key, the value (quoted
bounded) and what is used instead (resolution never raises for them); for an
argument of the Python API, ``TypeError`` or ``ValueError``; on the command line
(``sampler.commands``), an argparse error. A remark is one warning everywhere.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sampler.catalogue import DEFAULT_CATEGORIES
from sampler.settings import files, parsers, selection
from sampler.settings.parsers import (
    DEFAULT_POSTMORTEM_DIR,
    MIN_INTERVAL_SECONDS,
    Invalid,
    Parser,
    warn,
    warning,
)
from sampler.settings.selection import KNOWN
from sampler.settings.table import (
    API_FIELDS,
    CATEGORIES,
    FIELDS,
    INTERVAL,
    POSTMORTEM_DIR,
    Field,
    MonitorSettings,
    defaults,
    settled,
)
from sampler.util.quoting import bounded_repr

DEFAULT_SOURCE = "built-in default"
"""How ``Resolution.sources`` names a value no env var or file set."""
API_SOURCE = "ResourceMonitor"
"""How warnings and ``Resolution.sources`` name the Python API as the source of a value."""
_EVERY_KEY = "using env vars and defaults for every key"
_IN_FILE = {field.key: field for field in FIELDS}


class _State:
    """The values being resolved and where each came from."""

    def __init__(self) -> None:
        self.values = defaults()
        self.sources: dict[str, str] = {field.key: DEFAULT_SOURCE for field in FIELDS}
        self.sources.update({f"{CATEGORIES.key}.{name}": DEFAULT_SOURCE for name in DEFAULT_CATEGORIES})

    def set(self, field: Field, value: Any, where: str) -> None:
        self.values[field.key] = value
        self.sources[field.key] = where
        if field is CATEGORIES:
            for name in DEFAULT_CATEGORIES:
                self.sources[f"{CATEGORIES.key}.{name}"] = where


def _apply(state: _State, field: Field, parse: Parser, raw: object, where: str) -> None:
    """Set ``field`` to ``parse(raw)``, from ``where``; when that fails, warn
    once and keep the previous value, or use the usable part of ``raw``."""
    try:
        state.set(field, parse(raw, functools.partial(warn, where, raw)), where)
    except Invalid as exc:
        if exc.usable is None:
            using = field.show(state.values[field.key])
            warn(where, raw, f"is invalid ({exc}); using {field.key}={using} instead")
        else:
            state.set(field, exc.usable, where)
            warn(
                where,
                raw,
                f"is partly invalid ({exc}); ignoring that part, using {field.key}={field.show(exc.usable)}",
            )


def _apply_env(state: _State, environ: Mapping[str, str]) -> None:
    for field in FIELDS:
        if field.env is None or field.from_text is None or field.env not in environ:
            continue
        text = environ[field.env]
        if field.blank_is_unset and not text.strip():
            continue
        _apply(state, field, field.from_text, text, field.env)


def _apply_file(state: _State, found: files.Found) -> bool:
    """Apply the file's keys; False when the file cannot be used at all (read or parsed)."""
    source = str(found.path)
    try:
        document = files.read_document(found.data)
    except files.Unusable as exc:
        warning(f"resource monitor: cannot use {source} ({exc}); {_EVERY_KEY}")
        return False
    state.values["config_file"] = source
    if document is None:
        return True
    if not isinstance(document, dict):
        warn(
            f"{source}: <top level>",
            document,
            f"is invalid (expected a mapping with a {files.SECTION!r} key); {_EVERY_KEY}",
        )
        return True
    for key, raw in document.items():
        if key != files.SECTION:
            warn(
                f"{source}: {files.label(key)}",
                raw,
                f"is an unknown top-level key (only {files.SECTION!r} is read); ignoring it",
            )
    section = document.get(files.SECTION)
    if section is None:
        return True
    if not isinstance(section, dict):
        warn(
            f"{source}: {files.SECTION}",
            section,
            f"is invalid (expected a mapping of settings); {_EVERY_KEY}",
        )
        return True
    for key, raw in section.items():
        field = _IN_FILE.get(key) if isinstance(key, str) else None
        where = f"{source}: {files.SECTION}.{files.label(key)}"
        if field is None:
            warn(where, raw, f"is an unknown key (known: {', '.join(_IN_FILE)}); ignoring it")
        elif field is CATEGORIES:
            _apply_file_categories(state, where, raw)
        else:
            _apply(state, field, field.from_value, raw, where)
    return True


def _apply_file_categories(state: _State, where: str, raw: object) -> None:
    """A list: only these (as the env var's allowlist). A mapping: per-category
    flags, omitted ones keep their value."""
    if raw is None:
        return
    if isinstance(raw, list):
        _apply(state, CATEGORIES, selection.categories_from_list, raw, where)
        return
    categories: dict[str, bool] = state.values[CATEGORIES.key]
    if not isinstance(raw, dict):
        using = selection.show_categories(categories)
        warn(
            where,
            raw,
            "is invalid (expected a mapping of category: true/false, or a list of category names); "
            f"using categories={using} instead",
        )
        return
    before = state.sources[CATEGORIES.key]
    touched: list[str] = []
    for name, flag in raw.items():
        entry = f"{where}.{files.label(name)}"
        category = selection.category(name)
        if category is None:
            warn(entry, flag, f"is not a known category (known: {KNOWN}); ignoring it")
            continue
        try:
            categories[category] = parsers.flag(flag)
        except Invalid as exc:
            warn(
                entry,
                flag,
                f"is invalid ({exc}); using categories.{category}={categories[category]!r} instead",
            )
            continue
        state.sources[f"{CATEGORIES.key}.{category}"] = entry
        if category not in touched:
            touched.append(category)
    if len(touched) == len(DEFAULT_CATEGORIES):
        state.sources[CATEGORIES.key] = where
    elif touched:
        named = ", ".join(name for name in DEFAULT_CATEGORIES if name in touched)
        state.sources[CATEGORIES.key] = f"{before}, then {where} ({named})"


@dataclass(frozen=True)
class Resolution:
    """The configuration resolved, with where each value came from."""

    values: dict[str, Any]
    """What ``load_resource_monitoring_config`` returns."""
    sources: dict[str, str]
    """Key -> where its value came from: ``DEFAULT_SOURCE``, an env var's name, or
    ``"<file>: resource_monitoring.<key>"``. Besides each key of ``FIELDS``,
    ``"categories.<name>"`` for each category (a file's mapping sets categories one
    by one; then ``"categories"`` says ``"<before>, then <file>: ... (<names>)"``)."""
    looked_for: tuple[Path, ...]
    """Where the file was looked for, in lookup order."""
    used_file: Path | None
    """The file whose keys apply, or None."""
    found_file: Path | None
    """The first file found: the one used unless it could not be read or parsed."""
    skipped: tuple[Path, ...]
    """Files looked for before it that were skipped, with a warning: another
    user's, or others can write them (``files.distrust``)."""
    warnings: tuple[str, ...]
    """Every warning emitted while resolving, in order."""


def resolve_config(
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    *,
    package_dir: str | os.PathLike[str] = files.PACKAGE_DIR,
    log_warnings: bool = True,
) -> Resolution:
    """Resolve the configuration once, recording where each value came from;
    never raises for bad configuration.

    ``environ`` and ``cwd`` default to the process's own. Each warning is
    logged on the ``sampler`` logger (unless ``log_warnings`` is false) and kept
    in ``Resolution.warnings``.
    """
    environ = os.environ if environ is None else environ
    try:
        cwd_path: Path | None = Path(os.getcwd() if cwd is None else cwd).resolve()
    except (OSError, RuntimeError):  # the working directory was removed; a symlink loop
        cwd_path = None
    with parsers.collecting(log_warnings) as collected:
        state = _State()
        if cwd_path is not None:  # relative to where the monitor is started from, as the API reads it
            state.values[POSTMORTEM_DIR.key] = str(cwd_path / DEFAULT_POSTMORTEM_DIR)
        _apply_env(state, environ)
        looked_for = files.candidate_files(environ, cwd_path, Path(package_dir))
        found, skipped = files.look_up(looked_for)
        used = found.path if found is not None and _apply_file(state, found) else None
    return Resolution(
        values=state.values,
        sources=state.sources,
        looked_for=tuple(looked_for),
        used_file=used,
        found_file=None if found is None else found.path,
        skipped=skipped,
        warnings=tuple(collected),
    )


def load_resource_monitoring_config(
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    *,
    package_dir: str | os.PathLike[str] = files.PACKAGE_DIR,
) -> dict[str, Any]:
    """Resolve the configuration once; never raises for bad configuration.

    Returns a dict with ``enabled`` (bool), ``interval_seconds`` (float, s),
    ``categories`` (each of ``DEFAULT_CATEGORIES`` -> bool), ``disk_path``
    (absolute), ``step_source``, ``store`` (absolute path of the run store's
    SQLite file, or None) and ``config_file`` (the YAML used, or None).
    ``environ`` and ``cwd`` default to the process's own. ``resolve_config``
    also says where each value came from.
    """
    return resolve_config(environ, cwd, package_dir=package_dir).values


def resolve_settings(
    arguments: Mapping[str, object],
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    package_dir: str | os.PathLike[str] = files.PACKAGE_DIR,
    min_interval_seconds: float = MIN_INTERVAL_SECONDS,
) -> tuple[MonitorSettings, Resolution]:
    """``ResourceMonitor``'s settings: each of ``arguments`` (keyed as ``FIELDS``)
    wins; the rest come from the configuration, exactly as for the process-wide
    monitor. An argument is read by the parser its YAML value is, and a bad one
    raises (``TypeError`` for the wrong type, ``ValueError`` for a bad value; an
    unknown key is a ``TypeError``, as Python says of an unexpected keyword),
    where a bad env var or file value is warned about and replaced. The interval's
    floor is ``min_interval_seconds`` (below 1 s only for tests and benchmarks).
    """
    unknown = [key for key in arguments if key not in _API]
    if unknown:
        raise TypeError(f"ResourceMonitor() got an unexpected keyword argument {unknown[0]!r}")
    resolution = resolve_config(environ, cwd, package_dir=package_dir)
    values, sources = dict(resolution.values), dict(resolution.sources)
    for key, raw in arguments.items():
        field = _API[key]
        parse = field.from_value
        if field is INTERVAL:
            if isinstance(raw, str):
                raise TypeError(
                    f"interval_seconds={bounded_repr(raw)}: expected a number of seconds, got str"
                )
            parse = functools.partial(parsers.interval, floor=min_interval_seconds)
        values[key] = _from_api(field, raw, parse, values.get(key, field.default))
        sources[key] = API_SOURCE
        if field is CATEGORIES:
            sources.update({f"{CATEGORIES.key}.{name}": API_SOURCE for name in DEFAULT_CATEGORIES})
    return settled(values), Resolution(
        values=values,
        sources=sources,
        looked_for=resolution.looked_for,
        used_file=resolution.used_file,
        found_file=resolution.found_file,
        skipped=resolution.skipped,
        warnings=resolution.warnings,
    )


_API = {field.key: field for field in API_FIELDS}


def _from_api(field: Field, raw: object, parse: Parser, configured: Any) -> Any:
    """An argument, parsed; a soft failure (a store whose directory is missing) warns
    and keeps the configured value."""
    where = f"{API_SOURCE}: {field.key}"
    try:
        return parse(raw, functools.partial(warn, where, raw))
    except Invalid as exc:
        if exc.soft:
            warn(where, raw, f"is unusable ({exc}); using {field.key}={field.show(configured)} instead")
            return configured
        error = TypeError if exc.wrong_type else ValueError
        raise error(f"{field.key}={bounded_repr(raw)}: {exc}") from None
