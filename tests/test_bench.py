"""Smoke test of the overhead benchmark: it runs end to end and reports every
mode. Nothing here judges the numbers; the benchmark itself does that."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_quick_benchmark_produces_every_number(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    smallest = ["--quick", "--rounds", "1", "--seconds", "0.3", "--devices", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "bench", *smallest, "--json", str(out), "--plot", str(tmp_path / "bench.png")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert {"machine", "command", "profile", "cells", "slowdowns", "scaling", "targets"} <= set(report)
    cells = report["cells"]
    for workload in ("gil", "numpy", "latency"):
        for interval in ("1s", "0.01s"):
            for mode in ("off", "thread", "process"):
                cell = cells[f"{workload}@{interval}/{mode}"]
                assert cell["steps_per_second"]["median"] > 0
                assert cell["step_ms_p99"]["median"] is not None
            for mode in ("thread", "process"):
                assert cells[f"{workload}@{interval}/{mode}"]["start_ms"]["median"] is not None
                assert report["slowdowns"][f"{workload}@{interval}/{mode}"]["median_percent"] is not None
    for mode in ("thread", "process"):
        idle = cells[f"idle@0.01s/{mode}"]
        assert idle["samples"] > 0
        assert idle["backend_cpu_ms_per_sample"]["median"] is not None
        assert idle["sample_to_sink_ms"]["p99"] is not None
    assert cells["idle@0.01s/process"]["child_cpu_ms_per_sample"]["median"] is not None
    assert {(row["mode"], row["devices"]) for row in report["scaling"]} >= {("thread", 1), ("process", 1)}
    assert all(row["backend_cpu_ms_per_sample"] is not None for row in report["scaling"])
    assert len(report["targets"]) == 5 and all("met" in t for t in report["targets"])
    assert "## Targets" in done.stdout
    if importlib.util.find_spec("matplotlib") is not None:  # the optional "plot" extra
        assert (tmp_path / "bench.png").stat().st_size > 0
