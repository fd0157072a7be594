"""Issue 8: the run store, written by a real monitor into a real SQLite file
and read back the way other processes read it."""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import FAST, Recorder, backend_script, gone, old_store, wait_for

import sampler
from sampler.store import schema
from sampler.store.reader import StoreReader
from sampler.store.writer import FLUSH_SECONDS, REOPEN_SECONDS, WRITE_EVERY_SECONDS, RunInfo, RunWriter

CPU = "resource/cpu/utilization_percent"


def logged(mon: sampler.ResourceMonitor) -> int:
    return int(mon.stats()["records_logged"])


def test_a_run_holds_its_resources_and_everything_else_logged_beside_them(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    model_age = [0]
    with sampler.ResourceMonitor(
        categories=["cpu", "process"], store=store, age_source=lambda: model_age[0], **FAST
    ) as mon:
        for step in range(1, 40):
            model_age[0] = step
            sampler.signals.log_signal("train/loss", 1.0 / step, step)
            time.sleep(0.02)
        wait_for(
            lambda: mon.stats()["records_logged"] > 0,
            what="a record (a loaded machine starts the child late)",
        )
        wait_for(lambda: mon.stats()["store_points_written"] > 0)
    stats = mon.stats()
    assert stats["store_path"] == str(store) and stats["store_error"] is None
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
        names = reader.names(run.id)
        loss = reader.series(run.id, "train/loss")
        cpu = reader.series(run.id, CPU)
    assert run.status == "ended" and run.pid == os.getpid() and run.host == socket.gethostname()
    assert run.command == list(sys.orig_argv) and run.config["interval_seconds"] == 0.1
    assert run.version and run.stats is not None and run.stats["records_logged"] == stats["records_logged"]
    assert {"train/loss", CPU, "resource/process/memory_in_use_mb"} <= set(names)
    assert loss.steps == list(range(1, 40)) and loss.values[0] == 1.0  # nothing logged was lost
    assert cpu.steps == sorted(set(cpu.steps)) and 0 < len(cpu.steps) <= stats["records_logged"]
    assert all(abs(w - time.time()) < 60 for w in loss.wall_times + cpu.wall_times)
    # The documented interface: the view and the index "one signal of one run by step".
    db = sqlite3.connect(store)
    plan = db.execute(
        "EXPLAIN QUERY PLAN SELECT step, value FROM points WHERE run_id = 1 AND name_id = 1 ORDER BY step"
    ).fetchall()
    rows = db.execute("SELECT COUNT(*) FROM signals WHERE run_id = ? AND name = ?", (run.id, "train/loss"))
    assert "points_by_signal" in str(plan) and rows.fetchone()[0] == 39
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_logging_never_waits_for_the_store_and_a_locked_store_loses_nothing(tmp_path: Path) -> None:
    """Another writer holds the store's lock for a while: the training thread's
    log_signal calls return at once, and everything is written once it is free."""
    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(categories=["cpu"], store=store, step_source="seconds", **FAST) as mon:
        wait_for(lambda: mon.stats()["store_points_written"] > 0)
        other = sqlite3.connect(store, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # held like a long transaction of another writer
        began = time.perf_counter()
        for step in range(500):
            sampler.signals.log_signal("train/loss", float(step), step)
        slowest_call = time.perf_counter() - began
        written = mon.stats()["store_points_written"]
        seen = logged(mon)
        wait_for(lambda: logged(mon) >= seen + 3, what="samples while the store is locked")
        assert mon.stats()["store_points_written"] == written  # nothing could be written meanwhile
        other.execute("ROLLBACK")
        other.close()
        wait_for(lambda: mon.stats()["store_points_written"] > written + 500, what="the queue written")
    assert slowest_call < 0.5  # 500 calls; each only appends to a queue
    with StoreReader(str(store)) as reader:
        assert reader.series(1, "train/loss").steps == list(range(500))
        assert len(reader.series(1, CPU).steps) >= seen + 3


def test_nothing_logged_is_lost_at_interpreter_exit(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    script = tmp_path / "train.py"
    script.write_text(
        backend_script(
            f"""
            mon = sampler.ResourceMonitor(categories=["cpu"], store={str(store)!r}, step_source="seconds",
                                          interval_seconds=0.1, _min_interval_seconds=0.05).start()
            while mon.stats()["records_logged"] < 2:
                time.sleep(0.01)
            for step in range(1000):
                sampler.signals.log_signal("train/loss", float(step), step)
            # no stop(): the interpreter's exit does it
            """
        )
    )
    subprocess.run([sys.executable, str(script)], check=True, timeout=60, cwd=tmp_path)
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
        assert run.status == "ended" and run.stats is not None and run.stats["running"] is False
        assert reader.series(run.id, "train/loss").steps == list(range(1000))


def stored_steps(store: Path, name: str) -> list[int]:
    """The steps of ``name`` the store holds now, read as another process reads them
    (none while the file or its schema does not exist yet)."""
    try:
        db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    except sqlite3.Error:
        return []
    try:
        return [
            row[0] for row in db.execute("SELECT step FROM signals WHERE name = ? ORDER BY step", (name,))
        ]
    except sqlite3.Error:
        return []
    finally:
        db.close()


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_sigkilled_backend_loses_about_a_second_of_what_it_logged_whatever_the_interval(
    tmp_path: Path, isolation: str
) -> None:
    """Sampling every 15 s, a backend logs its loss 100 times a second and is SIGKILLed
    3 s of logging after the store first held some: the store holds all of it but the
    last second or so, not everything since the last sample."""
    store = tmp_path / "runs.sqlite"
    script = tmp_path / "train.py"
    script.write_text(
        backend_script(
            f"""
            mon = sampler.ResourceMonitor(categories=["cpu"], store={str(store)!r}, interval_seconds=15,
                                          step_source="seconds", isolation={isolation!r}).start()
            while {isolation!r} == "process" and mon.child_pid is None:
                time.sleep(0.01)
            print(mon.child_pid or 0, flush=True)
            step = 0
            while True:
                sampler.signals.log_signal("train/loss", 1.0, step)
                print(step, time.time(), flush=True)  # logged by now
                step += 1
                time.sleep(0.01)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline() or 0)
        logged_at: dict[int, float] = {}
        first_stored_at = None
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            step, wall = line.split()
            logged_at[int(step)] = float(wall)
            if first_stored_at is None and int(step) % 10 == 0 and stored_steps(store, "train/loss"):
                first_stored_at = float(wall)
            if first_stored_at is not None and float(wall) - first_stored_at >= 3.0:
                break
            assert time.monotonic() < deadline, "the store never held the loss, or logging stalled"
        proc.kill()
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    for line in rest.split("\n")[:-1]:  # whole lines only: the kill may cut the last one short
        step, wall = line.split()
        logged_at[int(step)] = float(wall)
    if child:
        wait_for(lambda: gone(child), timeout=10, what="the sampling child to leave after its backend")
    steps = stored_steps(store, "train/loss")
    last = max(logged_at)
    assert proc.returncode == -signal.SIGKILL and steps == list(range(len(steps))), steps[-5:]
    lost_seconds = logged_at[last] - logged_at[steps[-1]]
    assert lost_seconds < 1.5, f"steps {steps[-1] + 1}..{last} ({lost_seconds:.1f} s of logging) were lost"


def test_what_is_logged_while_a_dead_child_awaits_its_restart_reaches_the_store(tmp_path: Path) -> None:
    """The monitor thread waits out a minute of restart backoff: a point logged then
    is written within about a second all the same."""
    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(
        categories=["cpu"], store=store, step_source="seconds", interval_seconds=15, _restart_backoff=(60, 60)
    ) as mon:
        wait_for(lambda: mon.stats()["store_points_written"] > 0, what="the first sample written")
        os.kill(mon.child_pid, signal.SIGKILL)
        wait_for(lambda: mon.stats()["deaths"], what="the death seen, the backoff begun")
        logged_at = time.monotonic()
        sampler.signals.log_signal("train/loss", 0.5, 1)
        wait_for(lambda: stored_steps(store, "train/loss") == [1], timeout=10, what="the point written")
        took = time.monotonic() - logged_at
        assert mon.stats()["restarts"] == 0  # still in the backoff
    assert took < 2.0, took


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_the_queue_wakes_the_monitor_thread_once_and_is_due_a_second_after_its_oldest_point(
    tmp_path: Path,
) -> None:
    """The writer's side of the timed write: with nothing queued there is no timer (the
    thread sleeps until its next record), and the first point logged into the empty
    queue makes ``wake_fd`` readable, one byte for however many follow; what is queued
    is due ``FLUSH_SECONDS`` after its oldest point, and again a second after a write
    another writer's lock refused, ``REOPEN_SECONDS`` after one a broken store refused."""
    store = tmp_path / "runs.sqlite"
    writer = RunWriter(str(store), RunInfo(1, ["train"], {}, time.time()))
    try:
        assert writer.next_flush() is None and not readable(writer.wake_fd)
        began = time.monotonic()
        for step in range(3):
            writer.log("train/loss", 0.5, step)
        assert os.read(writer.wake_fd, 16) == b"w"
        due = writer.next_flush()
        assert due is not None and began + FLUSH_SECONDS - 0.01 <= due <= time.monotonic() + FLUSH_SECONDS
        writer.log("train/loss", 0.5, 3)
        assert not readable(writer.wake_fd)  # the thread has a timer for this queue already
        writer.flush()
        assert writer.next_flush() is None and stored_steps(store, "train/loss") == [0, 1, 2, 3]

        other = sqlite3.connect(store, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        writer.log("train/loss", 0.5, 4)
        writer.woken()
        failed_at = time.monotonic()
        writer.flush()
        due = writer.next_flush()
        assert writer.error is not None and "locked" in writer.error
        assert due is not None and failed_at + FLUSH_SECONDS <= due <= time.monotonic() + FLUSH_SECONDS
        other.execute("ROLLBACK")
        other.close()
        writer.flush()
        assert writer.next_flush() is None and stored_steps(store, "train/loss") == [0, 1, 2, 3, 4]
    finally:
        writer.close({})

    broken = RunWriter("/proc/resource_monitor_runs.sqlite", RunInfo(1, ["train"], {}, time.time()))
    try:
        broken.log("train/loss", 0.5, 0)
        failed_at = time.monotonic()
        broken.flush()
        due = broken.next_flush()
        assert broken.error is not None and due is not None and due >= failed_at + REOPEN_SECONDS
    finally:
        broken.close({})


def test_a_store_another_process_reads_while_it_is_written(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(categories=["cpu"], store=store, step_source="seconds", **FAST) as mon:
        wait_for(lambda: mon.stats()["store_points_written"] > 0)
        code = (
            "import sys; from sampler.store.reader import StoreReader\n"
            "r = StoreReader(sys.argv[1]); run = r.run()\n"
            "print(run.status, len(r.series(run.id, sys.argv[2]).steps))"
        )
        seen: list[list[str]] = []

        def read_again() -> bool:
            """One more read by another process: has it seen the run grow since the first?"""
            done = subprocess.run(
                [sys.executable, "-c", code, str(store), CPU], capture_output=True, text=True
            )
            assert done.returncode == 0, done.stderr
            seen.append(done.stdout.split())
            return int(seen[-1][1]) > int(seen[0][1])

        wait_for(read_again, timeout=30, what="another process to see the run grow")
    assert [status for status, _ in seen] == ["running"] * len(seen)
    counts = [int(n) for _, n in seen]
    assert counts == sorted(counts) and counts[0] > 0


@pytest.mark.parametrize("kind", ["read-only filesystem", "corrupt file"])
def test_a_store_that_cannot_be_used_is_said_once_and_monitoring_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    if kind == "read-only filesystem":
        store = Path("/proc/resource_monitor_runs.sqlite")  # /proc takes no new files, even from root
    else:
        store = tmp_path / "runs.sqlite"
        store.write_bytes(b"this is not a SQLite database" * 100)
    sink = Recorder()
    with sampler.ResourceMonitor(
        categories=["cpu"], store=store, sink=sink, step_source="seconds", **FAST
    ) as mon:
        wait_for(lambda: logged(mon) >= 4, what="monitoring despite the store")
        stats = mon.stats()
    assert stats["store_error"] and stats["store_points_written"] == 0 and mon.stats()["error"] is None
    assert len(sink.values(CPU)) >= 4
    failures = [r for r in caplog.records if "the store" in r.getMessage() and r.levelno == logging.WARNING]
    assert len(failures) == 1 and str(store) in failures[0].getMessage(), [r.getMessage() for r in failures]
    if kind == "corrupt file":
        assert store.read_bytes().startswith(b"this is not a SQLite database")  # left as it was


def unshare_works() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not unshare_works(), reason="needs root to mount a small tmpfs in a private mount namespace"
)
def test_a_full_disk_is_said_once_and_what_is_queued_is_kept(tmp_path: Path) -> None:
    """A real 1 MiB filesystem: the store fills it; monitoring goes on, the
    failure is reported once, and nothing is silently gone (written or counted).

    The store is seen written before the filling starts: what the first write holds
    would otherwise depend on how soon the sampling child starts (on a loaded machine,
    late enough for the first write to hold more than the disk)."""
    script = tmp_path / "backend.py"
    script.write_text(
        backend_script(
            """
            import json
            with sampler.ResourceMonitor(categories=["cpu", "process"], store=sys.argv[1],
                                         step_source="seconds", interval_seconds=0.1,
                                         _min_interval_seconds=0.05) as mon:
                sampler.signals.log_signal("train/loss", 0.0, 0)
                while not mon.stats()["store_points_written"]:
                    time.sleep(0.01)
                step = 1
                while mon.stats()["store_error"] is None and step < 200_000:
                    sampler.signals.log_signal("train/loss", float(step), step)
                    step += 1
                    if step % 1000 == 0:
                        time.sleep(0.05)
                full = mon.stats()["records_logged"]
                while mon.stats()["records_logged"] < full + 5:  # monitoring goes on
                    time.sleep(0.01)
                during = mon.stats()
            print(json.dumps({"logged": step, "during": during, "after": mon.stats()}))
            """
        )
    )
    small = tmp_path / "small"  # mounted in the private namespace only
    small.mkdir()
    shell = (
        f"mount -t tmpfs -o size=1m tmpfs {small} && exec {sys.executable} {script} {small / 'runs.sqlite'}"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    during, after = result["during"], result["after"]
    assert "full" in during["store_error"] and during["error"] is None and during["store_points_written"] > 0
    # Every loss and every resource reading was written, or counted dropped at stop.
    points = result["logged"] + after["signals_logged"]
    assert after["store_points_written"] + after["store_points_dropped"] == points, after
    assert done.stderr.count("resource monitor: the store") == 1, done.stderr


def test_a_store_from_a_newer_release_is_refused_not_damaged(tmp_path: Path, caplog) -> None:
    store = tmp_path / "runs.sqlite"
    db = sqlite3.connect(store)
    db.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    db.close()
    with sampler.ResourceMonitor(categories=["cpu"], store=store, step_source="seconds", **FAST) as mon:
        wait_for(lambda: logged(mon) >= 2)
        error = mon.stats()["store_error"]
    assert f"schema version {schema.SCHEMA_VERSION + 1}, written by a newer release" in error
    db = sqlite3.connect(store)
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION + 1
    assert db.execute("SELECT name FROM sqlite_master").fetchall() == []
    db.close()


def test_an_empty_file_is_made_a_store_and_two_writers_share_it(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    store.touch()
    barrier = threading.Barrier(2)
    ids: list[int] = []

    def writer() -> None:
        barrier.wait()
        db = schema.connect(str(store), timeout=5)
        ids.append(db.execute("PRAGMA user_version").fetchone()[0])
        db.close()

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ids == [schema.SCHEMA_VERSION] * 2
    with pytest.raises(sqlite3.DatabaseError):
        schema.connect(str(tmp_path / "missing.sqlite"), readonly=True)


def test_resource_signals_that_reach_no_one_are_said_once(caplog: pytest.LogCaptureFixture, tmp_path) -> None:
    def unheard() -> list[str]:
        return [r.getMessage() for r in caplog.records if "reach no one" in r.getMessage()]

    with sampler.ResourceMonitor(categories=["cpu"], step_source="seconds", **FAST) as mon:
        wait_for(lambda: logged(mon) >= 3)
    (warning,) = unheard()
    assert "store=" in warning and "subscribe" in warning
    caplog.clear()
    off = sampler.signals.subscribe(lambda *a: None)
    try:
        with sampler.ResourceMonitor(categories=["cpu"], step_source="seconds", **FAST) as mon:
            wait_for(lambda: logged(mon) >= 2)
    finally:
        off()
    with sampler.ResourceMonitor(
        categories=["cpu"], step_source="seconds", store=tmp_path / "r.sqlite", **FAST
    ) as mon:
        wait_for(lambda: logged(mon) >= 2)
    with sampler.ResourceMonitor(categories=["cpu"], step_source="seconds", sink=Recorder(), **FAST) as mon:
        wait_for(lambda: logged(mon) >= 2)
    assert unheard() == []


def test_the_store_key_in_the_yaml_turns_it_on_for_the_process_wide_monitor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "resource_monitoring.yaml").write_text(
        "resource_monitoring:\n  interval_seconds: 1\n  store: runs.sqlite\n  categories: {gpu: false}\n"
    )
    monkeypatch.setenv("WL_RESOURCE_MONITOR_CONFIG_PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    mon = sampler.start_resource_monitor_from_config()
    assert mon is not None and mon.store == str(tmp_path / "runs.sqlite")
    wait_for(lambda: mon.stats()["store_points_written"] > 0)
    sampler.stop_resource_monitor()
    with StoreReader(str(tmp_path / "runs.sqlite")) as reader:
        assert reader.run().status == "ended"


def test_numpy_scalars_are_stored_and_what_is_no_number_is_skipped_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One bad value must not block the queue it is in (SQLite would refuse
    the whole transaction, every time)."""
    import numpy as np

    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(categories=["cpu"], store=store, step_source="seconds", **FAST) as mon:
        sampler.signals.log_signal("train/loss", np.float32(0.5), np.int64(3))  # type: ignore[arg-type]
        sampler.signals.log_signal("train/note", "diverged", 1)  # type: ignore[arg-type]
        sampler.signals.log_signal("train/note", "again", 2)  # type: ignore[arg-type]
        sampler.signals.log_signal("train/accuracy", 0.75, 4)
        wait_for(lambda: mon.stats()["store_points_written"] >= 3)
        stats = mon.stats()
    with StoreReader(str(store)) as reader:
        assert reader.series(1, "train/loss").steps == [3] and reader.series(1, "train/loss").values == [0.5]
        assert reader.series(1, "train/accuracy").values == [0.75]
        assert "train/note" not in reader.names(1)
    assert stats["store_points_dropped"] == 2 and stats["store_error"] is None
    skipped = [r.getMessage() for r in caplog.records if "cannot store" in r.getMessage()]
    assert len(skipped) == 1 and "train/note" in skipped[0]


def test_fast_sampling_batches_its_writes_into_a_few_transactions_a_second(tmp_path: Path) -> None:
    """Every sample at 20 per second, but a transaction only every ``WRITE_EVERY_SECONDS``
    (SQLite's data_version, seen from another connection, counts them): a loaded machine makes
    fewer of both, never more transactions a second."""
    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(
        categories=["cpu"],
        store=store,
        step_source="seconds",
        interval_seconds=0.05,
        _min_interval_seconds=0.01,
    ) as mon:
        wait_for(lambda: mon.stats()["store_points_written"] > 0)
        watcher = sqlite3.connect(store)
        versions, seen = set(), mon.stats()["records_logged"]
        began = time.monotonic()

        def forty_samples_later() -> bool:
            versions.add(watcher.execute("PRAGMA data_version").fetchone()[0])
            return mon.stats()["records_logged"] >= seen + 40

        wait_for(forty_samples_later, timeout=60, what="40 samples")
        elapsed = time.monotonic() - began
        watcher.close()
    print(f"{len(versions) - 1} transactions in {elapsed:.1f} s")
    assert 2 <= len(versions) <= elapsed / WRITE_EVERY_SECONDS + 3, (len(versions), elapsed)
    with StoreReader(str(store)) as reader:
        assert len(reader.series(1, CPU).steps) == mon.stats()["records_logged"]  # all of them, at stop


def test_an_on_sample_hook_hears_the_signals(caplog: pytest.LogCaptureFixture) -> None:
    with sampler.ResourceMonitor(categories=["cpu"], step_source="seconds", on_sample=print, **FAST) as mon:
        wait_for(lambda: logged(mon) >= 2)
    assert not [r for r in caplog.records if "reach no one" in r.getMessage()]


# --------------------------------------------------------------------------- schema version 3: placement


def test_a_version_2_store_opened_for_writing_gets_the_placement_columns(tmp_path: Path) -> None:
    path = old_store(tmp_path / "old.sqlite", 2)
    with pytest.raises(schema.StoreVersionError, match="older one"):
        StoreReader(str(path))
    schema.connect(str(path)).close()
    with StoreReader(str(path)) as reader:
        assert reader.db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
        (run,) = reader.runs()
        assert (run.pid, run.host, run.version) == (42, "h", "0.0.2")
        assert (run.rank, run.local_rank, run.world_size, run.local_world_size) == (0, 0, 1, 1)
        assert run.launch_id is None
        assert reader.series(1, "train/loss").values == [0.25] and reader.postmortems() == []
        columns = [row[1] for row in reader.db.execute("PRAGMA table_info(runs)")]
    placement = columns[columns.index("rank") :][:5]
    assert placement == ["rank", "local_rank", "world_size", "local_world_size", "launch_id"]
    schema.connect(str(path)).close()  # opened again: nothing left to migrate
    with StoreReader(str(path)) as reader:
        assert [r.id for r in reader.runs()] == [1]


def test_a_run_row_records_where_the_backend_sits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "TORCHELASTIC_RUN_ID": "job-42",
    }.items():
        monkeypatch.setenv(name, value)
    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(categories=["process"], store=store, step_source="seconds", **FAST) as mon:
        wait_for(lambda: mon.stats()["store_points_written"] > 0)
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
    assert (run.rank, run.local_rank, run.world_size, run.local_world_size) == (3, 1, 4, 2)
    assert run.launch_id == "job-42" and run.host == socket.gethostname()
    assert run.config["host_sampling"] == "local_rank_0"


def test_a_run_written_without_a_placement_is_rank_0_alone(tmp_path: Path) -> None:
    from sampler.settings.placement import Placement

    store = str(tmp_path / "runs.sqlite")
    alone = RunWriter(store, RunInfo(pid=7, command=["a"], config={}, started_at=1.0))
    alone.flush()
    alone.close({})
    placed = Placement(
        "node-b", rank=5, local_rank=1, world_size=8, local_world_size=4, run_id="10.0.0.1:29500"
    )
    other = RunWriter(store, RunInfo(8, ["b"], {}, 2.0, placed))
    other.flush()
    other.close({})
    with StoreReader(store) as reader:
        first, second = reader.runs()
    assert (first.host, first.rank, first.local_rank, first.world_size, first.local_world_size) == (
        socket.gethostname(),
        0,
        0,
        1,
        1,
    )
    assert not first.launch_id  # the default placement names no launch
    assert (second.host, second.rank, second.local_rank, second.world_size, second.local_world_size) == (
        "node-b",
        5,
        1,
        8,
        4,
    )
    assert second.launch_id == "10.0.0.1:29500" and second.pid == 8
