"""Smoke test of the side-by-side benchmark (``bench/record_costs.py``) in its quick form: every
benchmark it runs reports, and the one table holds each number. Nothing here judges them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(400)  # a monitor measured, a store written twice, three analysis views
@pytest.mark.usefixtures("whole_machine")  # it loads the machine to measure it
def test_the_record_costs_benchmark_prints_every_number_in_one_table(tmp_path: Path) -> None:
    out = tmp_path / "costs.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.record_costs", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=360,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout.split("## Issue 27, side by side")[1]
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        "store, 0 GPUs (" + rows[1].split("(")[1],
        "store, 1 GPUs (" + rows[2].split("(")[1],
        "explain",
        "explain, many stretches",
        "explain --launch",
        "plot --launch",
        "monitoring CPU, cpu/memory/disk/network/process at 1 s",
    ]
    numbers = json.loads(out.read_text())
    assert [cell["gpus"] for cell in numbers["store"]] == [0, 1]
    assert set(numbers["analysis"]) == {
        "explain",
        "explain, many stretches",
        "explain --launch",
        "plot --launch",
    }
    (monitor,) = numbers["monitor"]
    assert monitor["monitor"] > 0 and monitor["psutil"] > 0 and "CPUs" in numbers["machine"]
