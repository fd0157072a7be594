"""Smoke test of the store density benchmark (``bench/store_density.py``): a real monitor's
records written in both layouts, every number reported. Nothing here judges the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_store_density_benchmark_reports_both_layouts(tmp_path: Path) -> None:
    out = tmp_path / "density.json"
    quick = ["--seconds", "1", "--hours", "0.01", "--gpus", "0,1", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.store_density", *quick],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    cells = json.loads(out.read_text())
    assert [cell["gpus"] for cell in cells] == [0, 1] and all(cell["records"] == 36 for cell in cells)
    assert cells[1]["readings_per_record"] > cells[0]["readings_per_record"] > 0
    for cell in cells:
        for layout in ("v3 points", "v6 records"):
            assert cell[layout]["bytes_per_record"] > 0 and cell[layout]["mib_per_hour"] > 0
        assert cell["ratio"] > 0
    assert "| 0 | " in done.stdout and "v6 / v3" in done.stdout, done.stdout
