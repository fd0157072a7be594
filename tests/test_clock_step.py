"""A step of the wall clock while a run goes on (NTP correcting it, an administrator) moves no
duration: every time the monitor stores is the run's start plus monotonic time since. The step
is made in the backend's process alone (``time.time`` patched there to jump an hour ahead, or
back, midway), never to the machine's clock; the readers run here, with their own clock stepped
too where the whole machine's would be."""

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
from sampler.store.reader import StoreReader

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
ahead[0] = float(sys.argv[2])  # the wall clock steps
sampler.signals.log_signal("train/loss", 0.5, 1)
while mon.stats()["records_logged"] < 30 or mon.stats()["store_points_written"] < 60:
    time.sleep(0.01)
print("stepped", flush=True)
sys.stdin.readline()
mon.stop()
print(f"stopped after {time.monotonic() - began}", flush=True)  # more than the run lasted
"""


@pytest.fixture(params=[3600.0, -3600.0], ids=["an hour ahead", "an hour back"])
def backend(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A backend whose wall clock stepped (``request.param`` s) after 15 records, and has logged
    15 since; it stops its monitor on a line on stdin."""
    store = tmp_path / "runs.sqlite"
    script = backend_script(BACKEND)
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(store), str(request.param)], text=True, **pipes
    )
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
    backend: tuple[subprocess.Popen[str], Path],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    proc, store = backend
    step = request.node.callspec.params["backend"]
    # A reader whose clock did not step (another host's): the run lasted seconds, not an hour.
    duration, status = duration_cell(store)
    assert re.fullmatch(r"0:\d\d", duration) and status == "running", (duration, status)

    # Readers on the backend's machine, whose clock stepped as its did: once the run has written
    # since the step (its updated_at is the wall clock's), it reads running again.
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + step)
    duration, status = wait_for(lambda: (cells := duration_cell(store))[1] == "running" and cells)
    assert re.fullmatch(r"0:\d\d", duration), duration
    status_code, frame = run_command("top", str(store), "--once", handler=top.main)
    assert status_code == 0 and re.search(r"\| running \| \d+s \|", frame.splitlines()[0]), frame
    assert "no sample for" not in frame, frame
    monkeypatch.undo()

    # It goes on telling readers it is live: its latest write's time (the wall clock's) moves on
    # every few seconds, a step back notwithstanding.
    def updated_at() -> float:
        with StoreReader(str(store)) as reader:
            return reader.run(1).updated_at

    written = updated_at()
    wait_for(lambda: updated_at() != written, timeout=60, what="the run's next write")

    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    stopped = proc.stdout.readline()
    total = float(stopped.removeprefix("stopped after "))  # monotonic s from before start to after stop
    duration, status = duration_cell(store)
    assert re.fullmatch(r"0:\d\d", duration) and status == "ended", (duration, status)
    with StoreReader(str(store)) as reader:
        run = reader.run(1)
    assert run.ended_at is not None and 0 < run.duration <= total
    assert run.ended_at - run.started_at == pytest.approx(run.duration, abs=1e-6)

    status_code, out = run_command("export", str(store), "--format", "jsonl", handler=export.main)
    assert status_code == 0
    walls = [json.loads(line)["wall_time"] for line in out.splitlines()]
    assert run.started_at <= min(walls) <= max(walls) <= run.ended_at, (
        "the points' times moved with the clock"
    )

    status_code, out = run_command("explain", str(store), "--json", handler=explain.main)
    assert status_code == 0, out
    found = json.loads(out)
    assert found["records"] >= 30
    assert [s for s in found["stretches"] if not 0 <= s["still_seconds"] <= s["seconds"] <= total] == [], (
        found
    )
    status_code, out = run_command("explain", str(store), handler=explain.main)
    assert status_code == 0 and not re.search(r"stood still for \d+m", out), out
