"""``python -m sampler config``: the configuration a backend started here would
use, each value with where it came from, the files looked for and the one used,
and every warning.

It resolves the configuration exactly as a backend does (SPEC 4: defaults, env
vars, the first YAML file found), in this process's working directory and
environment; it never fails for bad configuration, which it reports instead
(exit status 0). ``--json`` prints the same for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from sampler import settings
from sampler.commands.common import EXIT_BROKEN_PIPE, silence

USED = "used"
UNUSABLE = "found, cannot be used (see warnings)"
NOT_FOUND = "not found"
SHADOWED = "present, not used (an earlier file wins)"
SKIPPED = "skipped: another user's, or others can write it (see warnings)"
ABSENT_LATER = "not present"


def add_parser(commands: Any) -> None:
    """Register ``config`` with the ``add_subparsers()`` object ``commands``."""
    parser = commands.add_parser(
        "config",
        help="show the resolved configuration, where each value came from, and every warning",
        description=(
            "Show the configuration a backend started here would use: each value with where it came "
            "from (built-in default, env var, or file and key), the files looked for in lookup order "
            "and the one used, and every warning. Exit status 0 even for bad configuration."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print it as JSON, for scripts")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``python -m sampler config``; returns 0 (141 when the reader of ``out`` went away)."""
    out: TextIO = getattr(args, "out", None) or sys.stdout
    resolution = settings.resolve_config(log_warnings=False)
    text = json.dumps(as_json(resolution), indent=2) if args.json else format_text(resolution)
    try:
        _write(out, text + "\n")
        out.flush()
    except BrokenPipeError:
        silence(out)
        return EXIT_BROKEN_PIPE
    return 0


# --------------------------------------------------------------------------- what is shown


def file_statuses(resolution: settings.Resolution) -> list[tuple[Path, str]]:
    """Each file looked for, in lookup order, with what became of it."""
    statuses: list[tuple[Path, str]] = []
    reached = True
    for path in resolution.looked_for:
        if path in resolution.skipped:
            status = SKIPPED
        elif path == resolution.found_file:
            status = USED if resolution.used_file == path else UNUSABLE
            reached = False
        elif reached:
            status = NOT_FOUND
        else:
            status = SHADOWED if os.path.isfile(path) else ABSENT_LATER
        statuses.append((path, status))
    return statuses


def as_json(resolution: settings.Resolution) -> dict[str, Any]:
    """The resolution as JSON-ready data: ``values``, ``sources``, ``files``
    (each ``{"path", "status"}`` in lookup order), ``used_file`` and ``warnings``."""
    return {
        "values": resolution.values,
        "sources": resolution.sources,
        "files": [{"path": str(path), "status": status} for path, status in file_statuses(resolution)],
        "used_file": None if resolution.used_file is None else str(resolution.used_file),
        "warnings": list(resolution.warnings),
    }


def _show(value: object) -> str:
    """A value as one line of text."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return _one_line(str(value))


def _one_line(text: str) -> str:
    """``text``, or its repr when it holds anything unprintable (a newline in a path)."""
    return text if text.isprintable() else repr(text)


def format_text(resolution: settings.Resolution) -> str:
    """The report ``python -m sampler config`` prints: a line per key with its
    value and source (and per category), the files looked for, the warnings."""
    values, sources = resolution.values, resolution.sources
    rows: list[tuple[str, str, str]] = []
    for field in settings.FIELDS:
        value = values[field.key]
        shown = settings.CATEGORIES.show(value) if field is settings.CATEGORIES else _show(value)
        rows.append((field.key, shown, sources[field.key]))
        if field is settings.CATEGORIES:
            for name in settings.DEFAULT_CATEGORIES:
                rows.append((f"  {name}", "on" if value[name] else "off", sources[f"{field.key}.{name}"]))
    key_width = max(len(key) for key, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    lines = ["configuration (what a backend started here would use; a tool's flags beat it):"]
    lines += [
        f"  {key:<{key_width}}  {value:<{value_width}}  {_one_line(source)}".rstrip()
        for key, value, source in rows
    ]
    lines.append("")
    lines.append("files looked for, in lookup order (the first one found is used):")
    statuses = file_statuses(resolution)
    path_width = max((len(_one_line(str(path))) for path, _ in statuses), default=0)
    for number, (path, status) in enumerate(statuses, 1):
        marker = "*" if status == USED else " "
        lines.append(f"{marker} {number}. {_one_line(str(path)):<{path_width}}  {status}")
    if resolution.used_file is None:
        lines.append("  no file used: env vars and built-in defaults apply")
    lines.append("")
    if resolution.warnings:
        lines.append(f"warnings ({len(resolution.warnings)}):")
        lines += [f"  {_one_line(warning)}" for warning in resolution.warnings]
    else:
        lines.append("no warnings")
    return "\n".join(lines)


# --------------------------------------------------------------------------- output


def _write(out: TextIO, text: str) -> None:
    """Write ``text``; what ``out``'s encoding cannot hold (a path's undecodable
    bytes, kept as surrogates) is written as backslash escapes instead of failing."""
    encoding = getattr(out, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        try:
            text = text.encode(encoding, "backslashreplace").decode(encoding)
        except LookupError:
            text = text.encode("ascii", "backslashreplace").decode("ascii")
    out.write(text)
