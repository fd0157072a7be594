"""Rules a mutation review found unpinned: the store queue's bound drops the
oldest points, a copy forked from C finds the inherited monitor inert, and a
quiet run whose process lives is not lost before the reader's floor."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import backend_script

from sampler.store import writer as writer_module
from sampler.store.reader import StoreReader
from sampler.store.writer import RunInfo, RunWriter


def test_a_full_queue_drops_its_oldest_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While another writer holds the store's lock, what is logged beyond the
    bound costs the oldest points: once the lock goes, the newest ``bound`` are written."""
    bound, logged = 100, 250
    monkeypatch.setattr(writer_module, "MAX_QUEUED_POINTS", bound)
    store = tmp_path / "runs.sqlite"
    writer = RunWriter(str(store), RunInfo(os.getpid(), ["train"], {}, time.time()))
    other = sqlite3.connect(store, isolation_level=None)
    try:
        writer.flush()  # the store opened and the run's row written
        assert writer.error is None and writer.run_id is not None
        other.execute("BEGIN EXCLUSIVE")
        for step in range(logged):
            writer.log("train/loss", float(step), step)
            if step % 50 == 49:
                writer.flush()  # refused: the queue keeps at most `bound` points
                assert writer.error is not None and "locked" in writer.error
        assert writer.points_written == 0 and writer.points_dropped == logged - bound
        other.execute("ROLLBACK")
    finally:
        other.close()
        writer.close({})
    assert writer.points_written == bound and writer.points_dropped == logged - bound
    with StoreReader(str(store)) as reader:
        loss = reader.series(writer.run_id, "train/loss")
    assert loss.steps == list(range(logged - bound, logged)), loss.steps
    assert loss.values == [float(s) for s in loss.steps]


def test_a_copy_forked_from_c_cannot_stop_the_parents_monitor(tmp_path: Path) -> None:
    """A fork made by C code runs no at-fork hook; only the monitor's pid check
    keeps the copy's ``stop()`` from stopping the parent's thread and child."""
    script = tmp_path / "backend.py"
    script.write_text(
        backend_script(
            """
            import ctypes, json, psutil
            got = []
            mon = sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: got.append(a),
                                          step_source="seconds", interval_seconds=0.1,
                                          _min_interval_seconds=0.05).start()
            deadline = time.monotonic() + 30
            while (len(got) < 2 or mon.child_pid is None) and time.monotonic() < deadline:
                time.sleep(0.01)
            child = mon.child_pid
            libc = ctypes.PyDLL(None)  # keeps the GIL across fork(): the copy can run Python
            forked_at = time.monotonic()
            pid = libc.fork()
            if pid == 0:
                signal.alarm(10)  # a deadlock in the copy ends it instead of the test
                try:
                    mon.stop()
                except BaseException:
                    os._exit(2)
                os._exit(0)
            status = None
            while status is None and time.monotonic() < forked_at + 15:
                done, raw = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = os.waitstatus_to_exitcode(raw)
                else:
                    time.sleep(0.01)
            exited_after = time.monotonic() - forked_at
            if status is None:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            before = len(got)
            deadline = time.monotonic() + 15
            while len(got) < before + 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            child_alive = psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE
            report = {"status": status, "exited_after": exited_after, "before": before,
                      "after": len(got), "running": mon.running, "child": child,
                      "child_pid": mon.child_pid, "child_alive": child_alive}
            mon.stop()
            print(json.dumps(report))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["running"] and result["after"] >= result["before"] + 3, result
    assert result["child_alive"] and result["child_pid"] == result["child"], result
    # It left by itself (the alarm would have ended a deadlocked copy with SIGALRM), however long it
    # took on this machine: the bound on its wait is the generous 15 s above.
    assert result["status"] == 0, result
    print(f"the copy's stop() returned {result['exited_after']:.2f} s after the fork")


def test_a_quiet_run_whose_process_lives_is_lost_only_past_the_floor(tmp_path: Path) -> None:
    """Lost after max(3 intervals, 30 s) without a write, even with the process
    alive; before that, running."""
    store = tmp_path / "runs.sqlite"
    for interval in (1.0, 15.0):
        info = RunInfo(os.getpid(), ["train"], {"interval_seconds": interval}, time.time())
        writer = RunWriter(str(store), info)
        try:
            writer.flush()  # the run's row, updated_at now, no end time yet
            assert writer.error is None
            with StoreReader(str(store)) as reader:
                run = reader.run(writer.run_id)
        finally:
            writer.close({})
        alive = run.process_alive()
        assert alive is True and run.ended_at is None and run.interval == interval
        floor = max(3 * interval, 30.0)
        assert run.status_at(time.time(), alive) == "running"
        for quiet in (5.0, 20.0, floor - 0.5):
            assert run.status_at(run.updated_at + quiet, alive) == "running", (interval, quiet)
        assert run.status_at(run.updated_at + floor + 0.5, alive) == "lost", interval
        assert run.status_at(run.updated_at + floor + 0.5, None) == "lost", interval
