"""Smoke test of the slow-sink benchmark (``bench/sink_cost.py``): it runs end to end against a
real MLflow file store and reports every mode. Nothing here judges the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)  # four fresh interpreters each importing MLflow: 10-15 s apiece on a loaded machine
def test_the_sink_cost_benchmark_reports_every_mode(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    out = tmp_path / "sink_cost.json"
    smallest = ["--rounds", "1", "--seconds", "1", "--workload", "python", "--step-ms", "5", "--warmup", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.sink_cost", *smallest, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    [cells] = json.loads(out.read_text())
    assert set(cells) == {"off", "monitor", "per-signal", "batched"}
    assert all(cell["steps_per_second"] > 0 for cell in cells.values())
    for mode in ("monitor", "per-signal", "batched"):
        cell = cells[mode]
        assert cell["records_read"] >= 1 and cell["status"] == ["ended"], cell
        assert cell["callback_seconds_per_sample"], cell  # stats()["callbacks"] timed the sink
    rows = {line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")}
    assert {"off", "monitor", "per-signal", "batched"} <= rows, done.stdout
    assert "batched / per-signal" in done.stdout
