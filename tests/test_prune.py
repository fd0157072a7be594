"""``python -m sampler runs --prune``: keeping a run store bounded. Real stores written by the
real writer, pruned by the real command in a subprocess while a live writer keeps writing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_command

from sampler.commands import runs as runs_command
from sampler.settings.placement import Placement
from sampler.store import prune
from sampler.store.reader import StoreReader
from sampler.store.writer import RunInfo, RunWriter

CPU = "resource/cpu/utilization_percent"
DAY = 86400.0
POINTS_PER_RUN = 200


def sampler_command(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sampler", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


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
    """Run id -> its points."""
    db = sqlite3.connect(store)
    found = dict(db.execute("SELECT id, (SELECT COUNT(*) FROM points WHERE run_id = runs.id) FROM runs"))
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
