"""``python -m sampler runs --prune``: keeping a run store bounded. Real stores written by the
real writer, pruned by the real command in a subprocess while a live writer keeps writing."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import conftest
import psutil
import pytest
from conftest import old_store, run_command, wait_for

from sampler.commands import runs as runs_command
from sampler.settings.placement import Placement
from sampler.store import prune, schema
from sampler.store.reader import StoreReader
from sampler.store.writer import RunInfo, RunWriter, process_started_after_boot

CPU = "resource/cpu/utilization_percent"
DAY = 86400.0
POINTS_PER_RUN = 2000  # more than the few pages every store has, of 16 KiB each: a prune frees some


def sampler_command(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return conftest.sampler_command(*args, cwd=cwd, timeout=120)  # a prune of millions of points


LOST_BACKEND = """
import os, sys, time
from sampler.store.writer import RunInfo, RunWriter
writer = RunWriter(sys.argv[1], RunInfo(os.getpid(), ["train.py"], {"interval_seconds": 1.0}, time.time()))
for step in range(int(sys.argv[2])):
    writer.log("train/loss", 1.0, step)
    writer.record({"resource/cpu/utilization_percent": 1.0}, step, time.monotonic_ns(), None)
writer.flush()
print("written", flush=True)
time.sleep(60)
"""
"""A backend that writes its points, then dies (SIGKILL) without writing its end."""


def lost_run(store: Path) -> None:
    backend = subprocess.Popen(
        [sys.executable, "-c", LOST_BACKEND, str(store), str(POINTS_PER_RUN // 2)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert backend.stdout is not None and backend.stdout.readline() == "written\n"
    finally:
        backend.kill()
        backend.wait()
        if backend.stdout is not None:
            backend.stdout.close()


def record(writer: RunWriter, steps: int = POINTS_PER_RUN // 2) -> None:
    for step in range(steps):
        writer.log("train/loss", 1.0 / (step + 1), step)
        writer.record({CPU: float(step)}, step, time.monotonic_ns(), None)
    writer.flush()


def backdate(store: Path, run_id: int, days: float) -> None:
    """Make run ``run_id`` have started, written and (if it did) ended ``days`` earlier."""
    db = sqlite3.connect(store)
    shift = days * DAY
    db.execute(
        "UPDATE runs SET started_at = started_at - ?, updated_at = updated_at - ?,"
        " ended_at = ended_at - ? WHERE id = ?",
        (shift, shift, shift, run_id),
    )
    db.commit()
    db.close()


def counts(store: Path) -> dict[int, int]:
    """Run id -> its points (and its records' readings: the ``signals`` view holds both)."""
    db = sqlite3.connect(store)
    found = dict(db.execute("SELECT id, (SELECT COUNT(*) FROM signals WHERE run_id = runs.id) FROM runs"))
    db.close()
    return found


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, RunWriter]:
    """Runs 1 (ended 10 days ago), 2 (lost 10 days ago: its backend died without a word, and
    its postmortem), 3 (ended now) and 4 (started 10 days ago, writing now: live), each with
    ``POINTS_PER_RUN`` points; the writer of run 4 is returned open."""
    path = tmp_path / "runs.sqlite"
    info = {"interval_seconds": 1.0}
    for run_id in (1, 2, 3):
        if run_id == 2:
            lost_run(path)
            continue
        writer = RunWriter(
            str(path), RunInfo(os.getpid(), ["train.py"], info, time.time(), Placement("node-1"))
        )
        record(writer)
        writer.close({})
        assert writer.run_id == run_id
    live = RunWriter(str(path), RunInfo(os.getpid(), ["train.py"], info, time.time()))
    record(live)
    for run_id in (1, 2):
        backdate(path, run_id, 10)
    db = sqlite3.connect(path)
    db.execute("UPDATE runs SET started_at = started_at - ? WHERE id = 4", (10 * DAY,))
    db.execute(
        "INSERT INTO postmortems (run_id, backend_pid, host, vanished_at, written_at, records, body)"
        " VALUES (2, 1, 'node-1', 0, 0, 0, '{}')"
    )
    db.commit()
    db.close()
    return path, live


def test_prune_removes_old_ended_and_lost_runs_and_keeps_recent_and_live_ones(
    store: tuple[Path, RunWriter],
) -> None:
    path, live = store
    try:
        assert counts(path) == dict.fromkeys((1, 2, 3, 4), POINTS_PER_RUN)
        dry = sampler_command(
            "runs", str(path), "--prune", "--older-than", "7d", "--dry-run", cwd=path.parent
        )
        assert dry.returncode == 0, dry.stderr
        assert [line.split(":")[0] for line in dry.stdout.splitlines()[:2]] == [
            "would remove run 1",
            "would remove run 2",
        ], dry.stdout
        assert "ended" in dry.stdout.splitlines()[0] and "lost" in dry.stdout.splitlines()[1]
        assert f"would remove 2 runs, {2 * POINTS_PER_RUN} points and 1 postmortem" in dry.stdout
        assert counts(path) == dict.fromkeys((1, 2, 3, 4), POINTS_PER_RUN)  # a dry run removes nothing

        done = sampler_command("runs", str(path), "--prune", "--older-than", "7d", cwd=path.parent)
        assert done.returncode == 0, done.stderr
        assert f"removed 2 runs, {2 * POINTS_PER_RUN} points and 1 postmortem" in done.stdout, done.stdout
        assert "run 4 is live" in done.stdout and "reused by new points" in done.stdout
        assert counts(path) == {3: POINTS_PER_RUN, 4: POINTS_PER_RUN}
        db = sqlite3.connect(path)
        assert db.execute("SELECT COUNT(*) FROM postmortems").fetchone() == (0,)
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        db.close()

        record(live)  # the live run goes on writing into the pruned store
        assert live.error is None and counts(path)[4] == 2 * POINTS_PER_RUN
        listed = sampler_command("runs", str(path), cwd=path.parent)
        assert listed.returncode == 0, listed.stderr
        assert [row.split()[0] for row in listed.stdout.splitlines()[1:]] == ["3", "4"]

        # Run 4 last wrote before now too (its writer touches the row every 5 s), but it is live.
        everything = sampler_command("runs", str(path), "--prune", "--older-than", "0s", cwd=path.parent)
        assert everything.returncode == 0, everything.stderr
        assert everything.stdout.startswith("removed run 3:") and "removed 1 run," in everything.stdout
        assert counts(path) == {4: 2 * POINTS_PER_RUN}
    finally:
        live.close({})
    exported = sampler_command("export", str(path), "--format", "jsonl", cwd=path.parent)
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert {row["run_id"] for row in rows} == {4} and len(rows) == 2 * POINTS_PER_RUN


def test_prune_with_no_live_run_shrinks_the_file(store: tuple[Path, RunWriter]) -> None:
    path, live = store
    live.close({})
    backdate(path, 3, 1)
    backdate(path, 4, 1)
    before = path.stat().st_size
    done = sampler_command("runs", str(path), "--prune", "--before", "2999-01-01", cwd=path.parent)
    assert done.returncode == 0, done.stderr
    assert f"removed 4 runs, {4 * POINTS_PER_RUN} points and 1 postmortem" in done.stdout, done.stdout
    assert "reclaimed" in done.stdout
    assert path.stat().st_size < before
    assert sampler_command("runs", str(path), cwd=path.parent).stdout == f"{path} has no runs yet\n"
    with StoreReader(str(path)) as reader:
        assert reader.runs() == []
    again = sampler_command("runs", str(path), "--prune", "--older-than", "0s", cwd=path.parent)
    assert again.returncode == 0 and "nothing to prune" in again.stdout, again.stdout


@pytest.mark.parametrize("holder", ["writer", "reader"])
def test_a_store_another_connection_holds_keeps_its_size_and_reuses_the_space(
    store: tuple[Path, RunWriter], holder: str
) -> None:
    """A writer mid-transaction, or a reader mid-snapshot (which would pin a log the size of
    the whole store that ``VACUUM`` writes): no ``VACUUM``, the space stays for new points."""
    path, live = store
    live.close({})
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("DELETE FROM points WHERE run_id = 1")
    other = sqlite3.connect(path, isolation_level=None)
    if holder == "writer":
        other.execute("BEGIN IMMEDIATE")
    else:
        other.execute("BEGIN")
        other.execute("SELECT COUNT(*) FROM points").fetchone()
    try:
        message = prune.reclaim(db, path.stat().st_size, timeout=0.2)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert "in use" in message and "reused by new points" in message, message
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--prune"], "--prune needs --older-than AGE or --before DATE"),
        (["--dry-run"], "--dry-run, --older-than and --before go with --prune"),
        (["--older-than", "7d"], "go with --prune"),
        (["--prune", "--older-than", "7"], "expected an age such as 7d"),
        (["--prune", "--older-than", "1_0d"], "expected an age such as 7d"),
        (["--prune", "--before", "last tuesday"], "expected an ISO date"),
        (["--prune", "--older-than", "7d", "--before", "2024-01-01"], "not allowed with"),
    ],
)
def test_prune_flags_are_checked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], fragment: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_command("runs", str(tmp_path / "none.sqlite"), *argv, handler=runs_command.main)
    assert exit_info.value.code == 2
    assert fragment in capsys.readouterr().err


def test_pruning_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    done = sampler_command("runs", "none.sqlite", "--prune", "--older-than", "7d", cwd=tmp_path)
    assert done.returncode == 2 and "no run store at none.sqlite" in done.stderr
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- a suspended backend


SUSPENDABLE_BACKEND = """
import os, sys, time
from sampler.store.writer import RunInfo, RunWriter
writer = RunWriter(sys.argv[1], RunInfo(os.getpid(), ["train.py"], {"interval_seconds": 1.0}, time.time()))
step = 0
for line in sys.stdin:
    for _ in range(int(line)):
        writer.log("train/loss", 1.0, step)
        writer.record({"resource/cpu/utilization_percent": 1.0}, step, time.monotonic_ns(), None)
        step += 1
    writer.flush()
    print("written", writer.run_id, flush=True)
writer.close({})
print("closed", writer.run_id, writer.points_written, writer.points_dropped, flush=True)
"""
"""A backend that writes as many steps as each line of its input says, then says so."""


class Backend:
    """``SUSPENDABLE_BACKEND`` writing ``store``."""

    def __init__(self, store: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SUSPENDABLE_BACKEND, str(store)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def write(self, steps: int) -> int:
        """Have it write ``steps`` steps; returns the run it says it wrote them into."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{steps}\n")
        self.proc.stdin.flush()
        said, run_id = self.proc.stdout.readline().split()
        assert said == "written"
        return int(run_id)

    def suspend(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        wait_for(lambda: psutil.Process(self.proc.pid).status() == psutil.STATUS_STOPPED, what="it suspended")

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def finish(self) -> tuple[str, str]:
        """Let it stop; returns what it printed and its standard error."""
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return out, err

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def rows(store: Path, query: str, *args: object) -> list[tuple[object, ...]]:
    db = sqlite3.connect(store)
    try:
        return db.execute(query, args).fetchall()
    finally:
        db.close()


def test_a_suspended_backend_is_never_pruned(tmp_path: Path, backends: list[Backend]) -> None:
    """SIGSTOPped (Ctrl-Z, scontrol suspend) for longer than a run may go quiet: its run reads
    suspended (it read lost), in ``runs`` and ``top`` too, its process living on this host, the
    one that started it, so the run stays; on SIGCONT its points go on into it."""
    store = tmp_path / "runs.sqlite"
    backend = Backend(store)
    backends.append(backend)
    run_id = backend.write(50)
    backend.suspend()
    backdate(store, run_id, 10)
    with StoreReader(str(store)) as reader:
        assert reader.run(run_id).status == "suspended"  # quiet for 10 days, and stopped
    listed = sampler_command("runs", str(store), cwd=tmp_path)
    assert listed.stdout.splitlines()[1].split()[-1] == "suspended", listed.stdout
    top = sampler_command("top", str(store), "--once", cwd=tmp_path)
    assert " | suspended | " in top.stdout.splitlines()[0], top.stdout
    dry = sampler_command("runs", str(store), "--prune", "--older-than", "7d", "--dry-run", cwd=tmp_path)
    done = sampler_command("runs", str(store), "--prune", "--older-than", "7d", cwd=tmp_path)
    assert dry.returncode == 0 and "nothing to prune" in dry.stdout, dry.stdout + dry.stderr
    assert done.returncode == 0 and "nothing to prune" in done.stdout, done.stdout + done.stderr
    assert counts(store) == {run_id: 100}
    backend.resume()
    assert backend.write(50) == run_id
    out, err = backend.finish()
    assert out.split()[:2] == ["closed", str(run_id)] and "no longer in the store" not in err
    assert counts(store) == {run_id: 200}


def test_a_live_pid_that_another_process_took_keeps_no_run(tmp_path: Path) -> None:
    """The run's pid lives, but the process holding it started at another time than the one
    the run recorded: a recycled pid, and the run is pruned as lost."""
    store = tmp_path / "runs.sqlite"
    writer = RunWriter(str(store), RunInfo(os.getpid(), ["train.py"], {"interval_seconds": 1.0}, time.time()))
    record(writer)
    db = sqlite3.connect(store)
    db.execute("UPDATE runs SET pid_started_after_boot = pid_started_after_boot - 1")
    db.commit()
    db.close()
    backdate(store, 1, 10)
    done = sampler_command("runs", str(store), "--prune", "--older-than", "7d", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("removed run 1:"), done.stdout + done.stderr
    assert counts(store) == {}
    record(writer)  # it was this process all along: it says so, and goes on in a new run
    writer.close({})
    assert writer.run_id == 2 and counts(store) == {2: POINTS_PER_RUN}


def test_run_ids_are_never_given_again(tmp_path: Path) -> None:
    """The newest run pruned: the next run takes a new id, not its."""
    store = tmp_path / "runs.sqlite"
    for _ in range(2):
        writer = RunWriter(str(store), RunInfo(os.getpid(), ["train.py"], {}, time.time()))
        record(writer)
        writer.close({})
    backdate(store, 2, 10)
    done = sampler_command("runs", str(store), "--prune", "--older-than", "7d", cwd=tmp_path)
    assert done.returncode == 0 and "removed 1 run," in done.stdout, done.stdout + done.stderr
    writer = RunWriter(str(store), RunInfo(os.getpid(), ["train.py"], {}, time.time()))
    record(writer)
    writer.close({})
    assert writer.run_id == 3 and counts(store) == {1: POINTS_PER_RUN, 3: POINTS_PER_RUN}


def test_a_backend_whose_run_was_pruned_while_suspended_goes_on_in_a_new_run(
    tmp_path: Path, backends: list[Backend]
) -> None:
    """A run whose process cannot be seen from here (its row names another host: a store on a
    shared filesystem) is pruned while its backend is suspended, and another run starts. On
    SIGCONT the backend says once that its run is gone and goes on in a run of its own: its
    points land neither in the other run nor under the id that is gone."""
    store = tmp_path / "runs.sqlite"
    backend = Backend(store)
    backends.append(backend)
    first = backend.write(50)
    backend.suspend()
    backdate(store, first, 10)
    db = sqlite3.connect(store)
    db.execute("UPDATE runs SET host = 'node-elsewhere' WHERE id = ?", (first,))
    db.commit()
    db.close()
    done = sampler_command("runs", str(store), "--prune", "--older-than", "7d", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith(f"removed run {first}:"), done.stdout
    other = RunWriter(str(store), RunInfo(os.getpid(), ["other.py"], {}, time.time()))
    record(other, 10)
    backend.resume()
    again = backend.write(50)
    record(other, 10)
    other.close({})
    out, err = backend.finish()
    assert len({first, other.run_id, again}) == 3, (first, other.run_id, again)
    assert out.split()[:2] == ["closed", str(again)]
    assert err.count(f"run {first} is no longer in the store") == 1, err
    assert counts(store) == {other.run_id: 40, again: 100}
    assert rows(store, "SELECT COUNT(*) FROM points WHERE run_id = ?", first) == [(0,)]


def test_a_version_3_store_is_read_as_it_is_and_keeps_its_ids_once_migrated(tmp_path: Path) -> None:
    """A store of the version before: readers take it as it is. Pruning migrates it: no id is
    given again, not even one whose row is gone but whose points a writer left behind; a run
    whose row cannot say when its process started (none could) goes by the pid alone."""
    path = old_store(tmp_path / "old.sqlite", 3)  # run 1: pid 42 on host h, lost long ago
    db = sqlite3.connect(path)
    db.execute(
        "INSERT INTO runs (started_at, updated_at, host, pid, command, config, version)"
        " VALUES (1.0, 2.0, ?, ?, '[]', '{}', '0.0.3')",
        (socket.gethostname(), os.getpid()),
    )  # run 2: quiet for decades, but this process lives
    db.execute("INSERT INTO points VALUES (5, 1, 0, 1.0, 0.5)")  # points of a run 5 pruned before
    db.commit()
    db.close()
    with StoreReader(str(path)) as reader:
        assert [(run.id, run.status) for run in reader.runs()] == [(1, "lost"), (2, "lost")]
        assert reader.db.execute("PRAGMA user_version").fetchone() == (3,)
    done = sampler_command("runs", str(path), "--prune", "--before", "2999-01-01", cwd=tmp_path)
    assert done.returncode == 0 and "removed 1 run, 1 points" in done.stdout, done.stdout + done.stderr
    assert rows(path, "PRAGMA user_version") == [(schema.SCHEMA_VERSION,)]
    assert rows(path, "SELECT id, pid_started_after_boot FROM runs") == [(2, None)]
    assert counts(path) == {2: 0} and rows(path, "SELECT COUNT(*) FROM points") == [(0,)]
    writer = RunWriter(str(path), RunInfo(os.getpid(), ["train.py"], {}, time.time()))
    record(writer, 1)
    writer.close({})
    assert writer.run_id == 6


# --------------------------------------------------------------------------- a large prune beside a writer

BIG = 2_000_000
"""Points of the run a prune removes while another stops: seconds of deleting."""


def ended_run_of(store: Path, points: int) -> None:
    """A store whose run 1 ended 10 days ago with ``points`` points (5 signals)."""
    db = schema.connect(str(store))
    old = time.time() - 10 * DAY
    db.execute(
        "INSERT INTO runs (started_at, updated_at, ended_at, host, pid, command, config, version)"
        " VALUES (?, ?, ?, 'node-1', 1, '[]', '{}', 'test')",
        (old, old, old),
    )
    db.executemany("INSERT INTO signal_names (name) VALUES (?)", [(f"train/s{i}",) for i in range(5)])
    db.execute("BEGIN")
    db.execute("DROP INDEX points_by_signal")  # made again after: much faster than kept along
    db.execute(
        "WITH RECURSIVE n(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM n WHERE x < ?)"
        " INSERT INTO points SELECT 1, 1 + x % 5, x / 5, ? + x / 5, 0.5 FROM n",
        (points - 1, old),
    )
    db.execute("CREATE INDEX points_by_signal ON points (run_id, name_id, step)")
    db.execute("COMMIT")
    db.close()


def writing_held(store: Path) -> bool:
    """Whether another connection holds the store's write lock now."""
    db = sqlite3.connect(store, timeout=0, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        db.close()


@pytest.mark.timeout(600)  # a minute or two on a loaded machine: the store is made, then pruned
def test_a_run_that_stops_while_millions_of_points_are_pruned_ends_with_all_its_points(
    tmp_path: Path,
) -> None:
    """The prune deletes in short transactions: the stopping run's last write, which waits for
    the store up to its final timeout, gets in; its end time and every point are stored."""
    store = tmp_path / "runs.sqlite"
    ended_run_of(store, BIG)
    live = RunWriter(str(store), RunInfo(os.getpid(), ["train.py"], {"interval_seconds": 1.0}, time.time()))
    record(live)
    pruning = subprocess.Popen(
        [sys.executable, "-m", "sampler", "runs", str(store), "--prune", "--older-than", "7d"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_for(
            lambda: writing_held(store) or rows(store, "SELECT COUNT(*) FROM runs WHERE id = 1") == [(0,)],
            timeout=60,
            what="the prune to delete",
        )
        for step in range(POINTS_PER_RUN // 2, POINTS_PER_RUN):
            live.log("train/loss", 1.0, step)
        live.close({"running": False})
        out, err = pruning.communicate(timeout=600)
    finally:
        if pruning.poll() is None:
            pruning.kill()
            pruning.communicate()
    assert pruning.returncode == 0, err
    assert f"removed 1 run, {BIG} points" in out, out
    assert live.error is None and live.points_dropped == 0
    assert live.points_written == POINTS_PER_RUN + POINTS_PER_RUN // 2
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
        assert run.id == live.run_id and run.status == "ended"
        assert reader.series(run.id, "train/loss").steps == list(range(POINTS_PER_RUN))
    assert counts(store) == {live.run_id: POINTS_PER_RUN + POINTS_PER_RUN // 2}
    assert rows(store, "SELECT COUNT(*) FROM points WHERE run_id = 1") == [(0,)]


def test_when_a_process_started_is_read_on_a_clock_no_step_moves(tmp_path: Path) -> None:
    """The kernel's count of ticks from boot to the process's start (``/proc/PID/stat``), which
    a step of the wall clock leaves as it is, unlike the start in seconds since the epoch."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fields = Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()
        ticks = int(fields[19])  # starttime, the 22nd field; the text after the name starts at the 3rd
        started = process_started_after_boot(child.pid)
        assert started is not None and abs(started - ticks / os.sysconf("SC_CLK_TCK")) < 0.01
    finally:
        child.kill()
        child.wait()
    assert process_started_after_boot(child.pid) is None


@pytest.mark.parametrize("start", ["'yesterday'", "x'00'", "1e999", "-1e999"])
def test_a_malformed_start_time_is_read_as_unknown(tmp_path: Path, start: str) -> None:
    """A start another tool wrote that is no time: the pid alone says the run is live."""
    store = tmp_path / "runs.sqlite"
    writer = RunWriter(str(store), RunInfo(os.getpid(), ["train.py"], {"interval_seconds": 1.0}, time.time()))
    record(writer)
    db = sqlite3.connect(store)
    db.execute(f"UPDATE runs SET pid_started_after_boot = {start}")
    db.commit()
    db.close()
    backdate(store, 1, 10)
    done = sampler_command("runs", str(store), "--prune", "--older-than", "7d", cwd=tmp_path)
    assert done.returncode == 0 and "nothing to prune" in done.stdout, done.stdout + done.stderr
    writer.close({})


@pytest.mark.timeout(600)  # a minute or two on a loaded machine: the store is made, then pruned twice
def test_the_points_a_prune_cut_short_left_go_with_the_next_prune(tmp_path: Path) -> None:
    """A prune killed while it deletes points (its runs' rows already gone) leaves points no run
    holds; the next prune deletes them, and says what it removed before that."""
    store = tmp_path / "runs.sqlite"
    ended_run_of(store, BIG // 2)
    pruning = subprocess.Popen(
        [sys.executable, "-m", "sampler", "runs", str(store), "--prune", "--older-than", "7d"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_for(lambda: rows(store, "SELECT COUNT(*) FROM runs") == [(0,)], timeout=60, what="run 1 gone")
        wait_for(lambda: rows(store, "SELECT COUNT(*) < ? FROM points", BIG // 2) == [(1,)], timeout=60)
        pruning.kill()
        out, _ = pruning.communicate(timeout=60)
    finally:
        if pruning.poll() is None:
            pruning.kill()
            pruning.communicate()
    assert out.startswith("removed run 1:"), out  # said before its points went
    ((left,),) = rows(store, "SELECT COUNT(*) FROM points")
    assert 0 < left < BIG // 2
    again = sampler_command("runs", str(store), "--prune", "--older-than", "7d", cwd=tmp_path)
    assert again.returncode == 0 and "nothing to prune" in again.stdout, again.stdout + again.stderr
    assert rows(store, "SELECT COUNT(*) FROM points") == [(0,)]


def hidepid_works() -> bool:
    """Root, and a private mount namespace with /proc mounted anew, hiding others' processes."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None:
        return False
    shell = "mount -t proc -o hidepid=2 proc /proc"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell], capture_output=True
    )
    return done.returncode == 0


@pytest.mark.skipif(
    not hidepid_works(), reason="needs root, unshare and setpriv to prune as nobody under hidepid"
)
def test_a_prune_by_another_user_who_cannot_see_the_backend_keeps_its_run(
    tmp_path: Path, backends: list[Backend]
) -> None:
    """/proc mounted with hidepid=2 (hardened clusters do so) hides root's processes from user
    nobody, who prunes a store shared with root: root's suspended backend still exists for
    kill(pid, 0), so its run stays."""
    shared = tmp_path / "shared"
    shared.mkdir()
    store = shared / "runs.sqlite"
    backend = Backend(store)
    backends.append(backend)
    run_id = backend.write(50)
    backend.suspend()
    backdate(store, run_id, 10)
    nobody = pwd.getpwnam("nobody")
    for path in (shared, *shared.iterdir()):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    prune_as_nobody = (  # with the right to pass through the test's directories (root's), no other
        "mount -t proc -o hidepid=2 proc /proc && exec setpriv --reuid=nobody --regid=nogroup --clear-groups"
        " --inh-caps=+dac_read_search --ambient-caps=+dac_read_search"
        f" {sys.executable} -m sampler runs {store} --prune --older-than 7d"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", prune_as_nobody],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=shared,
    )
    assert done.returncode == 0 and "nothing to prune" in done.stdout, done.stdout + done.stderr
    assert counts(store) == {run_id: 100}
    backend.resume()
    assert backend.write(50) == run_id
