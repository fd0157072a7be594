"""A stalled run, in a real backend process: the sampling child sees it, takes every thread's
stack through the dump handler (which needs no GIL) and every thread's kernel state, writes a
``stalls`` row, and closes it when the steps move again; capturing interrupts no blocking call
of the backend, and replaces no handler the user installed."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import backend_script, old_store, run_command

from sampler.commands import runs, stalls
from sampler.settings import parsers
from sampler.store import prune, schema
from sampler.supervision.stacks import STACK_SIGNAL

pytestmark = pytest.mark.skipif(
    STACK_SIGNAL is None or not sys.platform.startswith("linux"), reason="the dump handler needs Linux"
)

PRELUDE = """
steps = [0]
mon = sampler.ResourceMonitor(categories=["cpu"], store=sys.argv[1], interval_seconds=0.2,
                              _min_interval_seconds=0.05, age_source=lambda: steps[0],
                              stall_seconds=float(sys.argv[2]))
mon.start()
while steps[0] < 30 or mon.stats()["records_logged"] < 5:  # a run that has made steps
    steps[0] += 1
    time.sleep(0.05)
"""


def run_backend(tmp_path: Path, body: str, stall_seconds: float, timeout: float = 120) -> tuple[Path, str]:
    """Run ``PRELUDE`` then ``body`` in a backend process to its end: (its store, its stdout + stderr)."""
    store = tmp_path / "runs.sqlite"
    script = backend_script(PRELUDE + textwrap.dedent(body))
    done = subprocess.run(
        [sys.executable, "-c", script, str(store), str(stall_seconds)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return store, done.stdout + done.stderr


def stall_rows(store: Path) -> list[dict[str, object]]:
    db = sqlite3.connect(store)
    db.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in db.execute("SELECT * FROM stalls ORDER BY id")]
    finally:
        db.close()


def main_thread_frames(stacks: str) -> list[str]:
    lines = stacks.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("[main thread]"))
    frames = []
    for line in lines[start + 1 :]:
        if not line.strip().startswith("File "):
            break
        frames.append(line.strip())
    return frames


def stalls_output(store: Path) -> str:
    status, out = run_command("stalls", str(store), handler=stalls.main)
    assert status == 0, out
    return out


def test_a_main_thread_asleep_with_the_gil_free_is_a_stall_its_stack_shows_the_sleep_and_it_closes(
    tmp_path: Path,
) -> None:
    store, said = run_backend(
        tmp_path,
        """
        def long_wait():
            time.sleep(6)  # the GIL free: the monitor thread goes on taking records
        long_wait()
        steps[0] += 1
        time.sleep(1)  # records after the step moved: the child sees it move
        mon.stop()
        """,
        stall_seconds=2,
    )
    (row,) = stall_rows(store)
    assert row["kind"] == "steps" and row["step"] >= 30 and row["run_id"] == 1
    assert row["detected_after"] >= row["timeout"] == 2.0
    assert row["duration"] is not None and row["duration"] >= row["detected_after"]  # closed when it moved
    assert row["ended_at"] == pytest.approx(row["started_at"] + row["duration"])
    assert isinstance(row["stacks"], str)
    assert main_thread_frames(row["stacks"])[0].endswith("in long_wait")
    threads = json.loads(str(row["threads"]))
    main = next(t for t in threads if t["tid"] == t["pid"])
    assert main["state"] == "S" and main["syscall"] in ("clock_nanosleep", "nanosleep", "")
    assert "no step for" in said and "in long_wait" in said  # the one warning, naming the frame
    assert said.count("no step for") == 1
    out = stalls_output(store)
    assert "stall 1: run 1" in out and "in long_wait" in out and "lasted" in out
    print(out)
    status, listed = run_command("runs", str(store), handler=runs.main)
    assert (
        status == 0
        and f"run 1 stalled once, the longest {row['duration']:.1f} s at step {row['step']}" in listed
    )


def test_a_training_thread_holding_the_gil_in_a_c_call_is_seen_by_the_monitor_thread_taking_no_record(
    tmp_path: Path,
) -> None:
    store, said = run_backend(
        tmp_path,
        """
        import ctypes
        def hold_the_gil():
            return ctypes.PyDLL(None).sleep(5)  # libc sleep with the GIL held: no Python runs meanwhile
        print("left", hold_the_gil(), flush=True)
        steps[0] += 1
        time.sleep(1)
        mon.stop()
        """,
        stall_seconds=600,  # far off: only the monitor thread's silence can tell
    )
    (row,) = stall_rows(store)
    assert row["kind"] == "monitor"
    assert main_thread_frames(str(row["stacks"]))[0].endswith("in hold_the_gil")
    assert "left 0" in said  # the sleep was not cut short
    assert "left a record untaken" in said and "in hold_the_gil" in said  # straight to stderr
    assert row["duration"] is not None
    print(stalls_output(store))


def test_blocking_calls_of_the_backend_finish_as_without_the_monitor_while_their_stacks_are_taken(
    tmp_path: Path,
) -> None:
    store, said = run_backend(
        tmp_path,
        """
        import ctypes, threading
        libc = ctypes.CDLL(None, use_errno=True)
        r, w = os.pipe()
        got = []
        def blocked_read():
            buf = ctypes.create_string_buffer(1)
            n = libc.read(r, buf, 1)  # C code that does not retry on EINTR
            got.append((n, ctypes.get_errno(), buf.raw))
        reader = threading.Thread(target=blocked_read)
        reader.start()
        def libc_sleep():
            return libc.sleep(4)  # the GIL free; returns the seconds left if a signal cut it short
        left = libc_sleep()
        os.write(w, b"x")
        reader.join()
        print("sleep left", left, "read", got, flush=True)
        steps[0] += 1
        time.sleep(1)
        mon.stop()
        """,
        stall_seconds=1,
    )
    assert "sleep left 0 read [(1, 0, b'x')]" in said
    (row,) = stall_rows(store)
    assert main_thread_frames(str(row["stacks"]))[0].endswith("in libc_sleep")  # captured meanwhile
    assert "in blocked_read" in str(row["stacks"])


def test_a_forked_worker_stuck_on_a_lock_taken_before_the_fork_shows_where_it_waits(tmp_path: Path) -> None:
    store, said = run_backend(
        tmp_path,
        """
        import multiprocessing, threading
        lock = threading.Lock()
        def take_inherited_lock():
            lock.acquire()  # held by a thread of the parent at the fork: never released here
        def worker(queue):
            take_inherited_lock()
            queue.put("batch")
        held, release = threading.Event(), threading.Event()
        def hold():
            with lock:
                held.set()
                release.wait()
        threading.Thread(target=hold, daemon=True).start()
        held.wait()
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        worker_process = context.Process(target=worker, args=(queue,), daemon=True)
        worker_process.start()
        release.set()
        def wait_for_batch():
            try:
                return queue.get(timeout=6)
            except Exception:
                return None
        print("batch", wait_for_batch(), "worker", worker_process.pid, flush=True)
        worker_process.kill()
        worker_process.join()
        steps[0] += 1
        time.sleep(1)
        mon.stop()
        """,
        stall_seconds=2,
    )
    worker = int(said.split("worker ")[1].split()[0])
    (row,) = stall_rows(store)
    stacks = str(row["stacks"])
    assert any(frame.endswith("in wait_for_batch") for frame in main_thread_frames(stacks))
    section = stacks.split(f"--- pid {worker} ")[1].split("--- pid ")[0]
    assert "in take_inherited_lock" in section
    assert any(t["pid"] == worker for t in json.loads(str(row["threads"])))
    print(stalls_output(store))


def test_a_stall_that_lasts_is_captured_again_and_closed_when_the_steps_resume(tmp_path: Path) -> None:
    store, _ = run_backend(
        tmp_path,
        """
        def long_checkpoint():
            time.sleep(11)  # seen after about 1 s, captured again at about 4 s
        long_checkpoint()
        steps[0] += 1
        time.sleep(1)
        mon.stop()
        """,
        stall_seconds=1,
    )
    (row,) = stall_rows(store)
    stacks = str(row["stacks"])
    assert stacks.count("in long_checkpoint") >= 2 and "=== again," in stacks
    afters = sorted({t["after"] for t in json.loads(str(row["threads"]))})
    assert len(afters) >= 2 and afters[0] == pytest.approx(row["detected_after"], abs=0.01)
    assert row["duration"] is not None and row["duration"] > afters[-1]
    out = stalls_output(store)
    assert "s into the stall" in out and "lasted" in out


def test_a_run_with_steady_steps_records_no_stall(tmp_path: Path) -> None:
    store, _ = run_backend(
        tmp_path,
        """
        import random
        ends = time.monotonic() + 20
        while time.monotonic() < ends:
            steps[0] += 1
            time.sleep(random.uniform(0.01, 0.3))
        mon.stop()
        """,
        stall_seconds=2,
    )
    assert stall_rows(store) == []
    assert "no stalls" in stalls_output(store)


def test_a_handler_the_user_has_on_the_signal_is_kept_and_said_once(tmp_path: Path) -> None:
    store, said = run_backend(
        tmp_path,
        f"""
        heard = []
        mon.stop()
        signal.signal({STACK_SIGNAL}, lambda *_: heard.append(1))
        user_handler = signal.getsignal({STACK_SIGNAL})
        for _ in range(2):  # said once, however often the monitor starts
            mon.start()
            while mon.stats()["records_logged"] < 5:
                steps[0] += 1
                time.sleep(0.05)
            mon.stop()
        mon.start()
        while mon.stats()["records_logged"] < 3:
            steps[0] += 1
            time.sleep(0.05)
        time.sleep(4)  # a stall, recorded without stacks
        mon.stop()
        print("kept", signal.getsignal({STACK_SIGNAL}) is user_handler, "heard", len(heard), flush=True)
        """,
        stall_seconds=1,
    )
    assert "kept True heard 0" in said
    assert said.count("already has a handler") == 1
    rows = stall_rows(store)
    assert rows and rows[-1]["stacks"] is None
    assert "no dump handler" in str(rows[-1]["notes"])
    assert json.loads(str(rows[-1]["threads"]))  # the kernel states all the same


def test_a_version_6_store_gets_the_stalls_table_in_place_and_reads_as_none_before(tmp_path: Path) -> None:
    path = old_store(tmp_path / "old.sqlite", 6)
    out = stalls_output(path)
    assert "did not record them" in out
    schema.connect(str(path)).close()
    assert stall_rows(path) == []
    assert "no stalls" in stalls_output(path)
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (1,)  # the run kept
    db.close()


@pytest.mark.parametrize(
    ("raw", "expected"), [("auto", "auto"), (" AUTO ", "auto"), ("off", "off"), (False, "off"), (None, "off"),
                          ("2.5", 2.5), (3, 3.0)]
)  # fmt: skip
def test_stall_seconds_reads_auto_a_number_or_off(raw: object, expected: object) -> None:
    assert parsers.stall_seconds(raw, print) == expected


@pytest.mark.parametrize("raw", ["soon", "-1", "0", [], True])
def test_stall_seconds_refuses_anything_else(raw: object) -> None:
    with pytest.raises(parsers.Invalid, match="auto, a number of seconds, or off"):
        parsers.stall_seconds(raw, print)


def test_pruning_a_run_removes_its_stalls(tmp_path: Path) -> None:
    path = old_store(tmp_path / "runs.sqlite", schema.SCHEMA_VERSION)  # run 1: lost long ago
    db = schema.connect(str(path))
    db.execute(
        "INSERT INTO stalls (run_id, backend_pid, host, kind, step, started_at, detected_after, timeout,"
        " threads, notes) VALUES (1, 42, 'h', 'steps', 7, 2.0, 30.0, 30.0, '[]', '[]')"
    )
    gone = prune.remove(db, time.time())
    assert [entry.run.id for entry in gone] == [1]
    assert db.execute("SELECT COUNT(*) FROM stalls").fetchone() == (0,)
    db.close()
