"""Smoke test of the SIGKILL-loss benchmark: it runs end to end and prints its numbers.
Nothing here judges them beyond their being numbers; the store tests bound the loss."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_kill_loss_benchmark_prints_the_loss_at_each_interval_and_the_call_cost() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.kill_loss", "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ")]
    by_interval = {row[0].strip(): [float(cell) for cell in row[1:]] for row in rows[1:]}
    assert set(by_interval) == {"15 s", "1 s"}
    assert all(len(cells) == 5 and min(cells) >= 0 for cells in by_interval.values())
    [cost] = [line for line in done.stdout.splitlines() if line.startswith("log_signal with the store on:")]
    assert float(cost.split(":")[1].split()[0]) > 0
