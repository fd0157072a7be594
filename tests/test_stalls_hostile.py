"""Stall captures against a hostile backend, in real processes: one frozen with SIGSTOP, one
whose dump signal a user's handler took after the monitor started, one with more threads than
``faulthandler`` dumps, a tree with an exec'd program that must never be signalled, and a run
store another process holds locked when the stall is written."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import backend_script, wait_for
from test_stalls import PRELUDE, run_backend, stall_rows, stalls_output

from sampler.supervision.spawn import is_sampling_child
from sampler.supervision.stacks import STACK_SIGNAL

pytestmark = pytest.mark.skipif(
    STACK_SIGNAL is None or not sys.platform.startswith("linux"), reason="the dump handler needs Linux"
)


def rows_now(store: Path) -> list[dict[str, object]]:
    """The store's stall rows, none while it has no table yet."""
    try:
        return stall_rows(store) if store.exists() else []
    except sqlite3.OperationalError:
        return []


def test_a_frozen_backend_is_not_signalled_its_stall_says_why_and_an_execd_program_lives(
    tmp_path: Path,
) -> None:
    store, go_on = tmp_path / "runs.sqlite", tmp_path / "go-on"
    body = f"""
        import subprocess
        sleeper = subprocess.Popen(["sleep", "300"])  # fork then exec: no handler of ours in it
        print("ready", flush=True)
        while not os.path.exists({str(go_on)!r}):
            steps[0] += 1
            time.sleep(0.05)
        print("sleeper", sleeper.poll(), flush=True)
        sleeper.kill()
        sleeper.wait()
        mon.stop()
        """
    script = backend_script(PRELUDE + textwrap.dedent(body))
    # Only the monitor thread's silence can tell a frozen backend: the step timeout is far off.
    backend = subprocess.Popen(
        [sys.executable, "-c", script, str(store), "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert backend.stdout is not None and backend.stdout.readline() == "ready\n"
        os.kill(backend.pid, signal.SIGSTOP)
        try:
            (row,) = wait_for(lambda: rows_now(store), what="the frozen backend's stall")
        finally:
            os.kill(backend.pid, signal.SIGCONT)
        wait_for(lambda: rows_now(store)[0]["duration"] is not None, what="the stall closed")
        go_on.touch()
        said, errors = backend.communicate(timeout=60)
    finally:
        if backend.poll() is None:
            backend.kill()
            backend.communicate()
    assert backend.returncode == 0, errors
    assert "sleeper None" in said  # the exec'd program was never signalled (it would have died)
    assert row["kind"] == "monitor" and row["stacks"] is None
    notes = json.loads(str(row["notes"]))
    assert any("stopped (SIGSTOP); not signalled" in note for note in notes), notes
    assert not any("no dump in" in note for note in notes), notes  # no signal left pending
    threads = json.loads(str(row["threads"]))
    assert {t["state"] for t in threads if t["pid"] == backend.pid} == {"T"}
    assert "stopped (SIGSTOP)" in errors  # the warning, straight to stderr


def test_a_handler_the_user_sets_after_the_monitor_started_is_never_run_by_a_capture(tmp_path: Path) -> None:
    store, said = run_backend(
        tmp_path,
        f"""
        heard = []
        signal.signal({STACK_SIGNAL}, lambda *_: heard.append(1))
        records = mon.stats()["records_logged"]
        while mon.stats()["records_logged"] < records + 3:  # the monitor thread has seen it
            steps[0] += 1
            time.sleep(0.05)
        def long_wait():
            time.sleep(4)
        long_wait()
        steps[0] += 1
        time.sleep(1)
        mon.stop()
        print("heard", len(heard), flush=True)
        """,
        stall_seconds=1,
    )
    assert "heard 0" in said
    assert said.count("after the monitor started; stalls are recorded from now on") == 1  # said once
    (row,) = stall_rows(store)
    assert row["stacks"] is None
    assert any("after the monitor started" in note for note in json.loads(str(row["notes"])))
    assert json.loads(str(row["threads"]))  # the kernel states all the same


def test_a_backend_with_more_threads_than_the_dump_holds_says_its_main_thread_is_left_out(
    tmp_path: Path,
) -> None:
    store, said = run_backend(
        tmp_path,
        """
        import threading
        release = threading.Event()
        pool = [threading.Thread(target=release.wait, daemon=True) for _ in range(150)]
        for thread in pool:
            thread.start()
        def long_wait():
            time.sleep(4)
        long_wait()
        release.set()
        steps[0] += 1
        time.sleep(1)
        mon.stop()
        """,
        stall_seconds=1,
    )
    (row,) = stall_rows(store)
    stacks = str(row["stacks"])
    first = stacks.split("=== again")[0]  # a capture again, should the stall last, holds as many
    assert "[main thread]" not in first and first.count("Thread 0x") == 100  # faulthandler's bound
    notes = json.loads(str(row["notes"]))
    assert any("no Python stack of the main thread" in note and "has 15" in note for note in notes), notes
    assert "no Python stack of the main thread" in said  # the warning says so, not nothing


def test_a_stall_written_while_another_process_holds_the_store_locked_is_recorded_once_it_is_free(
    tmp_path: Path,
) -> None:
    store, said = run_backend(
        tmp_path,
        """
        import subprocess
        holder = subprocess.Popen(
            [sys.executable, "-c", "import sqlite3, sys, time\\n"
             "db = sqlite3.connect(sys.argv[1], isolation_level=None)\\n"
             "db.execute('BEGIN EXCLUSIVE')\\n"
             "print('held', flush=True)\\n"
             "time.sleep(5)\\n"
             "db.execute('COMMIT')", sys.argv[1]],
            stdout=subprocess.PIPE, text=True,
        )
        assert holder.stdout.readline() == "held\\n"
        def long_wait():
            time.sleep(3)  # seen after 1 s, while the store is held for 5 s
        long_wait()
        holder.wait()
        steps[0] += 1
        time.sleep(1)
        mon.stop()
        """,
        stall_seconds=1,
    )
    (row,) = stall_rows(store)
    assert "in long_wait" in str(row["stacks"])
    assert "cannot record a stall" not in said


def test_a_forked_worker_that_blocks_the_signal_is_not_signalled_and_the_stall_says_so(
    tmp_path: Path,
) -> None:
    store, said = run_backend(
        tmp_path,
        f"""
        import multiprocessing
        def masked_worker(ready):
            signal.pthread_sigmask(signal.SIG_BLOCK, [{STACK_SIGNAL}])  # a signal would wait, queued
            ready.set()
            time.sleep(60)
        context = multiprocessing.get_context("fork")
        ready = context.Event()
        worker = context.Process(target=masked_worker, args=(ready,), daemon=True)
        worker.start()
        ready.wait()
        def long_wait():
            time.sleep(4)
        long_wait()
        print("worker", worker.pid, flush=True)
        worker.kill()
        worker.join()
        steps[0] += 1
        time.sleep(1)
        mon.stop()
        """,
        stall_seconds=1,
    )
    worker = int(said.split("worker ")[1].split()[0])
    (row,) = stall_rows(store)
    notes = json.loads(str(row["notes"]))
    assert (
        f"no Python stacks of pid {worker}: thread {worker} blocks signal {STACK_SIGNAL}; not signalled"
        in notes
    )
    assert not any("no dump in" in note for note in notes), notes
    assert "in long_wait" in str(row["stacks"])  # the backend's own dump all the same


def sampling_children(pid: int) -> list[int]:
    """The sampling children of process ``pid`` now running."""
    found = []
    for child in psutil.Process(pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and is_sampling_child(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def test_a_stall_whose_sampling_child_is_killed_is_closed_by_the_next_child_when_the_steps_resume(
    tmp_path: Path,
) -> None:
    store, go_on = tmp_path / "runs.sqlite", tmp_path / "go-on"
    body = f"""
        def long_wait():
            while not os.path.exists({str(go_on)!r}):
                time.sleep(0.05)
        long_wait()
        import sqlite3
        def closed():
            db = sqlite3.connect(sys.argv[1], timeout=10)
            try:
                return db.execute("SELECT duration FROM stalls").fetchone()[0] is not None
            finally:
                db.close()
        deadline = time.monotonic() + 90  # the next child may still be starting on a loaded machine
        while not closed() and time.monotonic() < deadline:
            steps[0] += 1  # training goes on: the next child sees the step move
            time.sleep(0.1)
        mon.stop()
        """
    script = backend_script(PRELUDE + textwrap.dedent(body))
    backend = subprocess.Popen(
        [sys.executable, "-c", script, str(store), "1"], stderr=subprocess.PIPE, text=True
    )
    try:
        (row,) = wait_for(lambda: rows_now(store), what="the stall")
        (first,) = wait_for(lambda: sampling_children(backend.pid), what="the sampling child")
        os.kill(first, signal.SIGKILL)  # during the stall: the supervisor starts another child
        wait_for(
            lambda: [pid for pid in sampling_children(backend.pid) if pid != first], what="the next child"
        )
        go_on.touch()
        moved_at = time.time()
        _, errors = backend.communicate(timeout=120)
    finally:
        if backend.poll() is None:
            backend.kill()
            backend.communicate()
    assert backend.returncode == 0, errors
    (closed,) = stall_rows(store)
    assert closed["id"] == row["id"] and closed["duration"] is not None, closed
    assert closed["started_at"] + closed["duration"] >= moved_at - 0.5  # it lasted until the step moved
    notes = json.loads(str(closed["notes"]))
    assert any("sampling child watching it was restarted" in note for note in notes), notes
    out = stalls_output(store)
    print(out)
    assert "lasted until the run ended" not in out
