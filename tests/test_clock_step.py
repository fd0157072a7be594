"""A step of the wall clock while a run goes on (NTP correcting it, an administrator, a VM
resumed) moves no duration: every time the monitor stores is the run's start plus monotonic
time since. The step is made in the backend's process alone (``time.time`` patched there to
jump an hour ahead midway), never to the machine's clock; the readers run here, with their own
clock stepped too where the whole machine's would be."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import backend_script, run_command, wait_for

from sampler.commands import explain, export, runs, top

STEP_SECONDS = 3600.0

BACKEND = """
real_time, real_time_ns = time.time, time.time_ns
ahead = [0.0]
time.time = lambda: real_time() + ahead[0]
time.time_ns = lambda: real_time_ns() + int(ahead[0] * 1e9)
began = time.monotonic()
age = lambda: int((time.monotonic() - began) * 100)  # 100 steps/s, on the clock no step moves
mon = sampler.ResourceMonitor(categories=["cpu"], store=sys.argv[1], interval_seconds=0.1,
                              _min_interval_seconds=0.05, age_source=age)
mon.start()
while mon.stats()["records_logged"] < 15:
    time.sleep(0.01)
ahead[0] = float(sys.argv[2])  # the wall clock steps an hour ahead
sampler.signals.log_signal("train/loss", 0.5, 1)
while mon.stats()["records_logged"] < 30 or mon.stats()["store_points_written"] < 60:
    time.sleep(0.01)
print("stepped", flush=True)
sys.stdin.readline()
mon.stop()
print("stopped", flush=True)
"""


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A backend whose wall clock stepped an hour ahead after 15 records, and has logged 15
    since; it stops its monitor on a line on stdin."""
    store = tmp_path / "runs.sqlite"
    script = backend_script(BACKEND)
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    proc = subprocess.Popen([sys.executable, "-c", script, str(store), str(STEP_SECONDS)], text=True, **pipes)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "stepped\n"
        yield proc, store
    finally:
        proc.kill()
        proc.communicate(timeout=60)


def duration_cell(store: Path) -> tuple[str, str]:
    """``runs``' (duration, status) of run 1."""
    status, out = run_command("runs", str(store), handler=runs.main)
    assert status == 0, out
    cells = out.splitlines()[1].split()
    return cells[3], cells[-1]


def test_a_wall_clock_step_moves_no_duration(
    backend: tuple[subprocess.Popen[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, store = backend
    # A reader whose clock did not step (another host's): the run lasted seconds, not an hour.
    duration, status = duration_cell(store)
    assert re.fullmatch(r"0:\d\d", duration) and status == "running", (duration, status)

    # Readers on the backend's machine, whose clock stepped as its did: once the run has written
    # since the step (its updated_at is the wall clock's), it reads running again.
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + STEP_SECONDS)
    duration, status = wait_for(lambda: (cells := duration_cell(store))[1] == "running" and cells)
    assert re.fullmatch(r"0:\d\d", duration), duration
    status_code, frame = run_command("top", str(store), "--once", handler=top.main)
    assert status_code == 0 and re.search(r"\| running \| \d+s \|", frame.splitlines()[0]), frame
    assert "no sample for" not in frame, frame
    monkeypatch.undo()

    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "stopped\n"
    duration, status = duration_cell(store)
    assert re.fullmatch(r"0:\d\d", duration) and status == "ended", (duration, status)

    status_code, out = run_command("export", str(store), "--format", "jsonl", handler=export.main)
    assert status_code == 0
    walls = [json.loads(line)["wall_time"] for line in out.splitlines()]
    assert max(walls) - min(walls) < 60, "the points' times jumped with the clock"

    status_code, out = run_command("explain", str(store), "--json", handler=explain.main)
    assert status_code == 0, out
    found = json.loads(out)
    assert found["records"] >= 30
    assert [s for s in found["stretches"] if s["seconds"] > 60 or s["still_seconds"] > 60] == [], found
    status_code, out = run_command("explain", str(store), handler=explain.main)
    assert status_code == 0 and not re.search(r"stood still for \d+m", out), out
