"""A signal's name is written once, in ``sampler/catalogue.py``: everything else in the package
refers to its entry (``catalogue.GPU_POWER``) and builds names from it.

Read from the source: every string literal but docstrings, f-strings' parts included.
"""

from __future__ import annotations

import ast
from pathlib import Path

from sampler import catalogue

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = Path("sampler", "catalogue.py")
_SUFFIXES = frozenset(s.suffix for s in catalogue.SIGNALS.values())
_VARIANTS = (catalogue.PEAK_SUFFIX, catalogue.MEAN_SUFFIX, catalogue.RATE_SUFFIX, catalogue.PER_STEP_SUFFIX)


def names_a_signal(text: str) -> bool:
    """``resource/...``, ``<category>/...``, or what follows a signal's category (``power_watts``,
    a ``_peak`` of one ...)."""
    if text.startswith(catalogue.PREFIX):
        return True
    category, slash, rest = text.partition("/")
    if slash and rest and category in catalogue.CATEGORIES:
        return True
    for variant in _VARIANTS:
        text = text.removesuffix(variant)
    return text in _SUFFIXES and "_" in text


def literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal in ``source`` that names a signal, docstrings aside."""
    tree = ast.parse(source)
    docstrings = {
        id(statement.value)
        for node in ast.walk(tree)
        if isinstance(body := getattr(node, "body", None), list)
        for statement in body
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
    }
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and names_a_signal(node.value)
    )


def written() -> dict[Path, list[tuple[int, str]]]:
    """Module -> the signal names it writes, for every module of the package but the catalogue."""
    found = {}
    for path in sorted((ROOT / "sampler").rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative != CATALOGUE and (hits := literals(path.read_text(encoding="utf-8"))):
            found[relative] = hits
    return found


def test_no_signal_name_is_written_outside_the_catalogue() -> None:
    assert written() == {}


def test_a_name_written_is_found() -> None:
    source = '''
"""resource/cpu/utilization_percent in a docstring is prose."""
CPU = "resource/cpu/utilization_percent"
KEY = "disk/read_mb"
GPU = f"resource/gpu/{index}/{suffix}"
POWER = ("power_watts", "utilization_percent_peak")
CATEGORY = "cpu"
UNRELATED = ("read", "a/b", "resource")
'''
    assert literals(source) == [
        (3, "resource/cpu/utilization_percent"),
        (4, "disk/read_mb"),
        (5, "resource/gpu/"),
        (6, "power_watts"),
        (6, "utilization_percent_peak"),
    ]
