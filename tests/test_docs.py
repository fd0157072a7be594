"""The README and the manual under docs/: every relative link reaches a file that exists,
every #anchor a heading of that file, nothing points outside the repository, and the
README's PyTorch quick start runs as written. CI also builds docs/ with
``mkdocs build --strict``, which fails on the same mistakes; this needs no MkDocs."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
EXTERNAL = re.compile(r"^(https?:|mailto:)", re.I)


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks, with code spans removed."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(CODE_SPAN.sub("", line))
    return lines


def heading_text(heading: str) -> str:
    """A heading as it reads: links become their text, code and emphasis marks go."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[`*]", "", heading).strip()


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading_text(heading).lower()).replace(" ", "-")


def mkdocs_slug(heading: str) -> str:
    """MkDocs' (Python-Markdown's toc) anchor: ASCII only, punctuation dropped, runs of spaces
    and hyphens one hyphen."""
    text = unicodedata.normalize("NFKD", heading_text(heading)).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def headings(page: Path) -> list[str]:
    """The headings of a Markdown file, outside code blocks."""
    return [
        m.group(2) for line in prose_lines(page.read_text(encoding="utf-8")) if (m := HEADING.match(line))
    ]


def anchors(page: Path) -> set[str]:
    """The anchors a link may use: those GitHub and MkDocs both give a heading of ``page``."""
    return {github_slug(h) for h in headings(page) if github_slug(h) == mkdocs_slug(h)}


def links(page: Path) -> list[str]:
    """Every link target written in a Markdown file, outside code."""
    return [m.group(1) for line in prose_lines(page.read_text(encoding="utf-8")) for m in LINK.finditer(line)]


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` that reach no file, or no heading of it, or leave
    the repository (the manual's links also must stay inside docs/, for MkDocs)."""
    broken = []
    inside = DOCS if page.parent == DOCS else ROOT
    for target in links(page):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_relative_to(inside):
            broken.append(f"{target}: leaves {'docs/' if inside == DOCS else 'the repository'}")
        elif not file.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(file):
            broken.append(f"{target}: no heading of {file.name} has that anchor")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_reaches_a_file_and_a_heading(page: Path) -> None:
    assert links(page), f"{page.name} links to nothing"
    assert broken_links(page) == []


def test_the_slugs_are_githubs_and_mkdocs() -> None:
    assert github_slug("The run store's schema (version 3)") == "the-run-stores-schema-version-3"
    assert mkdocs_slug("The run store's schema (version 3)") == "the-run-stores-schema-version-3"
    assert (
        github_slug("What `stats()` reports") == mkdocs_slug("What `stats()` reports") == "what-stats-reports"
    )
    assert github_slug("Weights & Biases") == "weights--biases" != mkdocs_slug("Weights & Biases")


def test_a_broken_link_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a missing file, a missing anchor and a way out are each caught."""
    monkeypatch.setattr(sys.modules[__name__], "DOCS", tmp_path)
    (tmp_path / "a.md").write_text("# A\n\n## Known limits\n\n```\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text(
        "# B\n\n[ok](a.md#known-limits) [self](#b) `[code](nowhere.md)` [web](https://www.mkdocs.org/)\n"
        "[gone](c.md) [anchor](a.md#known-limit) [fenced](a.md#not-a-heading) [out](../spec.md)\n"
    )
    assert [b.split(":")[0] for b in broken_links(page)] == [
        "c.md",
        "a.md#known-limit",
        "a.md#not-a-heading",
        "../spec.md",
    ]


def test_the_mkdocs_nav_is_every_page_of_the_manual() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"
    nav = [next(iter(entry.values())) for entry in config["nav"]]
    assert sorted(nav) == sorted(p.name for p in DOCS.glob("*.md"))
    assert config["validation"]["links"]["anchors"] == "warn"


def readme_python_block(after: str) -> str:
    """The first ```python block of the README after the line ``after``, as written."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text[text.index(f"\n{after}\n") :].split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.timeout(400)  # 20,000 real training steps: 20 s alone, minutes on a loaded machine
def test_the_readme_pytorch_quick_start_runs_as_written(tmp_path: Path) -> None:
    """The quick start, verbatim, at the 1 s floor: the store holds the loss and resource
    points, and every resource point sits at a step the loss curve has."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(readme_python_block("## Quick start: a PyTorch script"))
    env = {
        **os.environ,
        "WL_RESOURCE_MONITOR_INTERVAL_SECONDS": "1",
        "WL_RESOURCE_MONITOR_CATEGORIES": "cpu",
        "OMP_NUM_THREADS": "1",  # one core for the training: no thread thrashing beside other work
    }
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=360
    )
    assert done.returncode == 0, done.stderr
    db = sqlite3.connect(tmp_path / "runs.sqlite")
    try:
        loss, cpu = (
            {step for (step,) in db.execute("SELECT step FROM signals WHERE name = ?", (name,))}
            for name in ("train/loss", "resource/cpu/utilization_percent")
        )
    finally:
        db.close()
    assert len(loss) == 20_000 and len(cpu) >= 2 and cpu <= loss and max(cpu) > 0
