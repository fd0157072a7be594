"""Smoke test of the analysis memory benchmark (``bench/analysis_memory.py``): small synthesized
stores of schema version 6, each view run in its own interpreter and measured. Nothing here
judges the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)  # three fresh interpreters, one drawing a figure
def test_the_analysis_memory_benchmark_measures_every_view(tmp_path: Path) -> None:
    out = tmp_path / "analysis.json"
    quick = ["--hours", "0.2", "--launch-hours", "0.1", "--ranks", "2", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.analysis_memory", *quick],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert set(results) == {"explain", "explain, many stretches", "explain --launch", "plot --launch"}
    for result in results.values():
        assert result["status"] == 0 and result["seconds"] > 0 and result["peak_mb"] > 0, result
    assert "| explain | " in done.stdout and "| plot --launch | " in done.stdout, done.stdout
