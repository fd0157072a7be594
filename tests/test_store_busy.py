"""A run store another process holds: at a run's first open, at its stop, and while a
monitor thread busy in a slow sink is stopped. Real SQLite files, real locks, real monitors."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import FAST, backend_script, wait_for

import sampler
from sampler.store import schema
from sampler.store.reader import StoreReader
from sampler.store.writer import FLUSH_SECONDS, RunInfo, RunWriter

CPU = "resource/cpu/utilization_percent"


def monitor_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "WL-ResourceMonitor"]


@pytest.mark.parametrize("kind", ["new store", "existing store"])
def test_a_store_held_by_another_writer_when_the_run_starts_keeps_the_whole_run(
    tmp_path: Path, kind: str
) -> None:
    """Another connection holds the write lock through the run's first samples (a new file:
    the switch to WAL cannot happen; an existing store: the run row cannot be inserted). Once
    it lets go the run is written, its row and every point logged meanwhile, and it ends."""
    store = tmp_path / "runs.sqlite"
    if kind == "existing store":
        schema.connect(str(store)).close()
    other = sqlite3.connect(store, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    held = True
    logged = 0
    try:
        with sampler.ResourceMonitor(categories=["cpu"], store=store, step_source="seconds", **FAST) as mon:

            def log_while(condition: object) -> bool:
                nonlocal logged
                sampler.signals.log_signal("train/loss", float(logged), logged)
                logged += 1
                return bool(condition)

            wait_for(
                lambda: log_while("locked" in (mon.stats()["store_error"] or "")),
                what="the store found busy",
            )
            wait_for(lambda: log_while(mon.stats()["records_logged"] >= 5), what="samples while it is held")
            assert mon.stats()["store_points_written"] == 0
            other.execute("ROLLBACK")
            held = False
            seen = mon.stats()["records_logged"]
            wait_for(lambda: log_while(mon.stats()["records_logged"] >= seen + 2), what="samples after")
            stats = mon.stats()
    finally:
        if held:
            other.execute("ROLLBACK")
        other.close()
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
        assert run.status == "ended" and run.pid == os.getpid()
        assert reader.series(run.id, "train/loss").steps == list(range(logged))
        assert len(reader.series(run.id, CPU).steps) >= stats["records_logged"]
    assert mon.stats()["store_error"] is None and mon.stats()["store_points_dropped"] == 0


def test_a_store_that_was_busy_at_open_is_tried_again_as_soon_as_a_busy_write_would_be(
    tmp_path: Path,
) -> None:
    """Another writer's lock is soon gone: an open it refused is due again a second later,
    like a write it refused, not after the wait for a broken store."""
    store = tmp_path / "runs.sqlite"
    schema.connect(str(store)).close()
    other = sqlite3.connect(store, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    writer = RunWriter(str(store), RunInfo(os.getpid(), ["train"], {}, time.time()))
    try:
        writer.log("train/loss", 0.5, 0)
        failed_at = time.monotonic()
        writer.flush()
        due = writer.next_flush()
        assert writer.error is not None and "locked" in writer.error
        assert due is not None and failed_at + FLUSH_SECONDS <= due <= time.monotonic() + FLUSH_SECONDS
    finally:
        other.execute("ROLLBACK")
        other.close()
        writer.close({})
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
        assert run.status == "ended" and reader.series(run.id, "train/loss").steps == [0]


def test_the_last_write_is_attempted_at_stop_even_when_the_store_never_opened_before(
    tmp_path: Path,
) -> None:
    """Every attempt so far found the store busy, and the next is not due yet: stop makes
    one all the same, waiting for the lock up to the final timeout."""
    store = tmp_path / "runs.sqlite"
    schema.connect(str(store)).close()
    other = sqlite3.connect(store, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    writer = RunWriter(str(store), RunInfo(os.getpid(), ["train"], {}, time.time()))
    try:
        writer.log("train/loss", 0.5, 0)
        writer.flush()
        assert writer.error is not None and "locked" in writer.error
    finally:
        other.execute("ROLLBACK")
        other.close()
    writer.log("train/loss", 0.25, 1)
    writer.close({"running": False})
    assert writer.error is None and writer.points_written == 2
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
        assert run.status == "ended" and reader.series(run.id, "train/loss").steps == [0, 1]


RANK = """
import os, sys, time
from sampler.store.writer import RunInfo, RunWriter
store, go, points, core = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
os.sched_setaffinity(0, {core})  # a loaded machine: the rank gets a sliver of one core
os.nice(19)
writer = RunWriter(store, RunInfo(os.getpid(), ["train.py"], {"interval_seconds": 1.0}, time.time()))
for step in range(points):  # a sample every 0.1 s, as a fast monitor's
    writer.log("train/loss", 1.0, step)
    writer.record({"resource/cpu/utilization_percent": 1.0}, step, time.monotonic_ns(), None)
    time.sleep(0.1)
writer.close({"running": False})
print(writer.run_id, writer.points_written, writer.points_dropped, writer.error, flush=True)
os._exit(0)  # not an interpreter's exit at a sliver of a core
"""
"""A rank that, the moment ``go`` exists, opens the store on a core a busy loop holds, writes
``points`` steps over as many tenths of a second and stops."""


@pytest.mark.usefixtures("whole_machine")  # it pins a busy loop to a core
@pytest.mark.timeout(300)  # a minute on a machine loaded besides
def test_four_ranks_creating_one_store_at_once_on_a_loaded_machine_each_get_their_run(tmp_path: Path) -> None:
    """Each rank finds the store being created (switched to WAL, migrated) or written by
    another, and gets so little CPU that the others hold it for a while."""
    store, go = tmp_path / "runs.sqlite", tmp_path / "go"
    core, points = max(os.sched_getaffinity(0)), 30
    spin = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile 1: pass"]
    )
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(store), str(go), str(points), str(core)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for rank in ranks:  # imported, before the load
            assert rank.stdout is not None and rank.stdout.readline() == "ready\n"
        go.touch()
        outputs = [rank.communicate(timeout=120) for rank in ranks]
    finally:
        spin.kill()
        spin.wait()
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.communicate()
    for rank, (out, err) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, err
        assert out.split()[1:] == [str(2 * points), "0", "None"], (out, err)
    with StoreReader(str(store)) as reader:
        runs = reader.runs()
        assert sorted(run.pid for run in runs) == sorted(rank.pid for rank in ranks)
        for run in runs:
            assert run.status == "ended"
            assert reader.series(run.id, "train/loss").steps == list(range(points))


def test_a_monitor_stopped_while_its_thread_is_busy_in_the_sink_ends_its_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The sink hangs at stop: stop() gives up waiting for the thread, but the run store gets
    its last write all the same, with everything logged until then, so the run reads ended,
    never lost; the thread, once the sink returns, writes nothing more and ends quietly."""
    store = tmp_path / "runs.sqlite"
    hang, entered, release = threading.Event(), threading.Event(), threading.Event()

    def sink(name: str, value: float, step: int) -> None:
        if hang.is_set():
            entered.set()
            release.wait(60)

    mon = sampler.ResourceMonitor(categories=["cpu"], store=store, sink=sink, step_source="seconds", **FAST)
    try:
        mon.start()
        wait_for(lambda: mon.stats()["store_points_written"] > 0, what="the run written")
        hang.set()
        wait_for(entered.is_set, what="the sink to hang")
        for step in range(50):
            sampler.signals.log_signal("train/loss", float(step), step)
        mon.stop()
        assert "busy in a call" in caplog.text
        with StoreReader(str(store)) as reader:
            (run,) = reader.runs()
            assert run.ended_at is not None and run.status == "ended"
            assert run.stats is not None and run.stats["running"] is False
            assert reader.series(run.id, "train/loss").steps == list(range(50))
            written = reader.counts(run.id)
    finally:
        release.set()
    wait_for(lambda: not monitor_threads(), what="the monitor thread to end once the sink returned")
    with StoreReader(str(store)) as reader:
        (after,) = reader.runs()
        assert after.ended_at == run.ended_at and reader.counts(run.id) == written
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_backend_that_exits_while_its_monitor_thread_is_busy_in_the_sink_leaves_an_ended_run(
    tmp_path: Path,
) -> None:
    """The same at interpreter exit (no stop() of its own): the run reads ended afterwards."""
    store = tmp_path / "runs.sqlite"
    script = tmp_path / "train.py"
    script.write_text(
        backend_script(
            f"""
            import threading
            hang, entered = threading.Event(), threading.Event()
            def sink(name, value, step):
                if hang.is_set():
                    entered.set()
                    threading.Event().wait(60)
            mon = sampler.ResourceMonitor(categories=["cpu"], store={str(store)!r}, sink=sink,
                                          step_source="seconds", interval_seconds=0.1,
                                          _min_interval_seconds=0.05).start()
            while not mon.stats()["store_points_written"]:
                time.sleep(0.01)
            hang.set()
            entered.wait(60)
            for step in range(100):
                sampler.signals.log_signal("train/loss", float(step), step)
            # no stop(): the interpreter's exit does it
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
        assert run.status == "ended", done.stderr
        assert reader.series(run.id, "train/loss").steps == list(range(100))
