"""Issue 8: the commands a person runs against a run store, end to end with
real processes (``python -m sampler ...`` in a subprocess)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import FAST, default_sigint, sampler_command, wait_for

import sampler
from sampler.collectors.host import SWAP_NAMES
from sampler.commands import common
from sampler.settings.placement import Placement
from sampler.store.reader import StoreReader
from sampler.store.writer import RunInfo, RunWriter

CPU = "resource/cpu/utilization_percent"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A store with two runs: one with a training loss beside its resources, one without."""
    path = tmp_path / "runs.sqlite"
    for run in range(2):
        step = [0]
        with sampler.ResourceMonitor(
            categories=["cpu", "memory"],
            store=path,
            age_source=lambda s=step: s[0],
            **FAST,
        ) as mon:
            # Training goes on until 3 samples were logged along the way: on a loaded machine
            # the child may start late, and samples at a step that no longer moves are dropped.
            s = 0
            while s < 29 or mon.stats()["records_logged"] < 3:
                s += 1
                step[0] = s
                if run == 0 and s < 30:
                    sampler.signals.log_signal("train/loss", 1.0 / s, s)
                time.sleep(0.02)
                assert s < 1500, "no 3 samples in 30 s"
    return path


def test_runs_lists_each_run_with_its_samples_and_status(store: Path) -> None:
    done = sampler_command("runs", str(store), cwd=store.parent)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split() == [
        *("id", "started", "duration", "host", "pid", "samples", "last", "step", "GPU", "energy", "status")
    ]
    assert [row.split()[0] for row in rows] == ["1", "2"]
    with StoreReader(str(store)) as reader:
        for row, run in zip(rows, reader.runs(), strict=True):
            cells = row.split()
            assert cells[4] == run.host and int(cells[5]) == run.pid and cells[-1] == "ended"
            assert cells[-2] == "-"  # no GPU counted energy
            assert int(cells[6]) == len(reader.series(run.id, CPU).steps) >= 3


def test_export_long_csv_has_every_point(store: Path) -> None:
    done = sampler_command("export", str(store), cwd=store.parent)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    db = sqlite3.connect(store)
    assert len(rows) == db.execute("SELECT COUNT(*) FROM signals").fetchone()[0]
    db.close()
    loss = [r for r in rows if r["name"] == "train/loss"]
    assert [int(r["step"]) for r in loss] == list(range(1, 30)) and float(loss[1]["value"]) == 0.5
    assert {r["run_id"] for r in rows} == {"1", "2"}


def test_export_wide_is_one_row_per_step_with_a_column_per_signal(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "wide.csv"
    done = sampler_command("export", str(store), "--run", "1", "--wide", "-o", str(out), cwd=store.parent)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open()))
    memory = "resource/memory/system_utilization_percent"
    throughput = "resource/progress/steps_per_second"
    swap = [name for name in rows[0] if name in SWAP_NAMES]  # recorded where the machine has swap
    assert swap in ([], sorted(SWAP_NAMES))
    assert [name for name in rows[0] if name not in swap] == [
        "run_id", "step", "wall_time", CPU, f"{CPU}_mean", f"{CPU}_peak", memory, f"{memory}_peak",
        throughput, "train/loss",
    ]  # fmt: skip
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(set(steps)) and set(range(1, 30)) <= set(steps)
    by_step = {int(r["step"]): r for r in rows}
    assert float(by_step[4]["train/loss"]) == 0.25
    assert any(r[CPU] for r in rows) and any(r[CPU] == "" for r in rows)  # resources at some steps only


def test_export_jsonl_and_a_nan_loss(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(categories=["cpu"], store=path, step_source="seconds", **FAST) as mon:
        sampler.signals.log_signal("train/loss", float("nan"), 1)
        sampler.signals.log_signal("train/loss", 0.5, 2)
        wait_for(lambda: mon.stats()["store_points_written"] >= 2)
    done = sampler_command("export", str(path), "--format", "jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    loss = [r for r in records if r["name"] == "train/loss"]
    assert loss == [
        {"run_id": 1, "name": "train/loss", "step": 1, "wall_time": loss[0]["wall_time"]},  # NaN: no value
        {"run_id": 1, "name": "train/loss", "step": 2, "wall_time": loss[1]["wall_time"], "value": 0.5},
    ]


@pytest.mark.parametrize("command", ["runs", "export"])
def test_a_missing_store_or_run_is_one_line_and_status_2(tmp_path: Path, command: str) -> None:
    done = sampler_command(command, str(tmp_path / "nothing.sqlite"), cwd=tmp_path)
    assert (
        done.returncode == 2
        and done.stderr.strip() == f"error: no run store at {tmp_path / 'nothing.sqlite'}"
    )
    not_a_store = tmp_path / "notes.txt"
    not_a_store.write_text("hello")
    done = sampler_command(command, str(not_a_store), cwd=tmp_path)
    assert (
        done.returncode == 2
        and done.stderr.count("\n") == 1
        and "cannot be read as a run store" in done.stderr
    )


def test_export_of_a_run_that_is_not_there(store: Path) -> None:
    done = sampler_command("export", str(store), "--run", "7", cwd=store.parent)
    assert done.returncode == 2 and "has no run 7" in done.stderr


def test_run_watches_another_process_and_records_it(tmp_path: Path) -> None:
    """``run --pid``: a trainer started elsewhere; the process signals are its,
    the store says whose run it is, and the settings are printed with their sources."""
    trainer = subprocess.Popen(
        [sys.executable, "-c", "import time\nblock = bytearray(200 * 1024 * 1024)\ntime.sleep(60)"]
    )
    try:
        wait_for(
            lambda: psutil.Process(trainer.pid).memory_info().rss > 150 * 1024**2, what="the trainer's RSS"
        )
        done = sampler_command(
            "run", "--pid", str(trainer.pid), "--interval", "1", "--duration", "2.6",
            "--categories", "process", cwd=tmp_path,
        )  # fmt: skip
    finally:
        trainer.kill()
        trainer.wait()
    assert done.returncode == 0, done.stderr
    assert re.search(rf"pid +{trainer.pid} +--pid", done.stderr), done.stderr
    assert re.search(rf"store +{tmp_path / 'resource_monitor.sqlite'} +run's default", done.stderr)
    assert "run's default" in done.stderr and "--interval" in done.stderr
    with StoreReader(str(tmp_path / "resource_monitor.sqlite")) as reader:
        run = reader.run()
        rss = reader.series(run.id, "resource/process/memory_in_use_mb").values
    assert run.pid == trainer.pid and run.command[0] == sys.executable and run.status == "ended"
    assert rss and min(rss) > 190  # the trainer's memory, not the CLI's (~40 MB)


def test_run_no_store_records_nothing(tmp_path: Path) -> None:
    done = sampler_command("run", "--no-store", "--interval", "1", "--duration", "1.5", "--categories", "cpu",
                           cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert re.search(r"store +none +--no-store", done.stderr), done.stderr
    assert list(tmp_path.iterdir()) == []


def test_run_refuses_a_process_that_is_not_there(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    done = sampler_command("run", "--pid", str(gone.pid), cwd=tmp_path)
    assert done.returncode == 2 and f"{gone.pid}: no such process" in done.stderr


def test_run_ctrl_c_ends_the_run_in_the_store(tmp_path: Path) -> None:
    run = subprocess.Popen(
        [sys.executable, "-m", "sampler", "run", "--interval", "1", "--categories", "cpu"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint,
    )  # fmt: skip
    try:
        assert run.stdout is not None
        wait_for(lambda: run.stdout.readline().startswith("step"), what="a first sample")
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=15) == 0
    finally:
        run.kill()
        run.wait()
    with StoreReader(str(tmp_path / "resource_monitor.sqlite")) as reader:
        assert reader.run().status == "ended"


def test_every_command_has_help(tmp_path: Path) -> None:
    done = sampler_command("--help", cwd=tmp_path)
    assert done.returncode == 0
    for command in ("demo", "run", "runs", "export", "config", "plot", "top"):
        assert command in done.stdout
        sub = sampler_command(command, "--help", cwd=tmp_path)
        assert sub.returncode == 0 and "usage: python -m sampler " + command in sub.stdout, sub.stderr


def test_the_installed_script_names_itself_in_its_help(tmp_path: Path) -> None:
    """``wl-resource-monitor --help`` said ``usage: python -m sampler``: not what the user typed."""
    script = Path(sys.executable).parent / "wl-resource-monitor"
    for argv in ([], ["runs"]):
        done = subprocess.run(
            [str(script), *argv, "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(" ".join(["usage: wl-resource-monitor", *argv]) + " "), done.stdout


def test_demo_trains_records_and_draws(tmp_path: Path) -> None:
    """The README's first command, shortened: a real training run with the
    monitor and the store on, a PNG at the end, and the commands to look further."""
    env = {**os.environ, "PATH": str(tmp_path)}  # no "python" on the PATH: the path is printed
    done = sampler_command("demo", "--duration", "6", cwd=tmp_path, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    png = tmp_path / "demo-run1.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    with StoreReader(str(tmp_path / "resource_monitor.sqlite")) as reader:
        run = reader.run()
        loss = reader.series(run.id, "train/loss")
        cpu = reader.series(run.id, CPU)
        accuracy = reader.series(run.id, "train/accuracy")
    assert run.status == "ended" and len(loss.steps) >= 10  # 45 and 88 beside two busy loops
    assert accuracy.steps or max(loss.steps) < 100  # held out every 100 steps
    assert len(cpu.steps) >= 3 and set(cpu.steps) <= set(loss.steps)  # stamped at the model's age
    assert loss.values[-1] < loss.values[0]  # it learned
    for command in ("runs", "plot", "explain", "export", "top"):  # with the interpreter that ran the demo
        assert f"{sys.executable} -m sampler {command} resource_monitor.sqlite" in done.stdout
    assert "100%" in done.stderr  # the progress bar ran to the end

    # Run in a checkout, neither the demo nor the commands it suggests leave files git would list.
    plotted = sampler_command("plot", "resource_monitor.sqlite", "--run", str(run.id), cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr
    exported = sampler_command(
        "export", "resource_monitor.sqlite", "--run", str(run.id), "--wide", cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    (tmp_path / f"run{run.id}.csv").write_text(exported.stdout)  # `... > run1.csv`, as the demo says
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    git = shutil.which("git")
    assert git is not None
    subprocess.run([git, "init", "-q"], cwd=tmp_path, check=True, timeout=60)
    status = subprocess.run(
        [git, "status", "--porcelain", "--untracked-files=all"],
        cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert status.stdout.splitlines() == ["?? .gitignore"], status.stdout


@pytest.mark.parametrize("command", [["export"], ["export", "--wide"], ["runs"], ["top", "--once"]])
def test_a_closed_pipe_ends_any_command_quietly(store: Path, command: list[str]) -> None:
    """``python -m sampler export STORE | head -2``: status 141, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sampler", command[0], str(store), *command[1:]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=store.parent, env={**os.environ, "COLUMNS": "60"},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=30) in (0, 141)  # 0 only if it had written everything already
    assert b"Traceback" not in proc.stderr.read()
    proc.stderr.close()


def test_runs_and_top_agree_that_a_killed_backend_is_lost(tmp_path: Path) -> None:
    """The backend died without writing its end; on this host its pid is gone,
    so every command says lost at once (not 'running' for another 30 s)."""
    script = tmp_path / "backend.py"
    script.write_text(
        "import time, sampler\n"
        "m = sampler.ResourceMonitor(categories=['cpu'], store='runs.sqlite', step_source='seconds',\n"
        "                            interval_seconds=0.1, _min_interval_seconds=0.05).start()\n"
        "while m.stats()['store_points_written'] < 2: time.sleep(0.01)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    backend = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert backend.stdout is not None and backend.stdout.readline() == "ready\n"
    finally:
        backend.kill()
        backend.wait()
    runs = sampler_command("runs", "runs.sqlite", cwd=tmp_path)
    top = sampler_command("top", "runs.sqlite", "--once", cwd=tmp_path)
    assert runs.stdout.splitlines()[1].split()[-1] == "lost", runs.stdout
    assert " | lost | " in top.stdout.splitlines()[0], top.stdout


def test_runs_gives_a_killed_run_the_time_of_its_last_record(tmp_path: Path) -> None:
    """The run's latest-write time is refreshed every few seconds (``TOUCH_EVERY_SECONDS``):
    a backend killed between two refreshes lasted until its last record, not its last refresh."""
    script = tmp_path / "backend.py"
    script.write_text(
        "import time, sampler\n"
        "m = sampler.ResourceMonitor(categories=['cpu'], store='runs.sqlite', step_source='seconds',\n"
        "                            interval_seconds=0.1, _min_interval_seconds=0.05).start()\n"
        "time.sleep(120)\n"
    )
    path = tmp_path / "runs.sqlite"

    def records_ahead_of_the_refresh() -> float | None:
        """Seconds from the run's start to its newest record, once that is 2 s past its last refresh."""
        if not path.exists():
            return None
        try:
            with sqlite3.connect(path) as db:
                row = db.execute(
                    "SELECT r.elapsed, (SELECT MAX(wall_ms) / 1000.0 FROM records WHERE run_id = r.id)"
                    " - r.started_at FROM runs AS r"
                ).fetchone()
        except sqlite3.OperationalError:  # its tables are not made yet
            return None
        return row[1] if row is not None and row[1] is not None and row[1] >= row[0] + 2 else None

    backend = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        lasted = wait_for(records_ahead_of_the_refresh, 60, "a record 2 s newer than the run's refresh")
    finally:
        backend.kill()
        backend.wait()
    runs = sampler_command("runs", "runs.sqlite", cwd=tmp_path)
    minutes, seconds = runs.stdout.splitlines()[1].split()[3].split(":")
    assert 60 * int(minutes) + int(seconds) >= int(lasted), (lasted, runs.stdout)


def test_runs_names_the_rank_of_a_multi_rank_job(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    for rank in range(2):
        where = Placement("node-7", rank=rank, local_rank=rank, world_size=2, local_world_size=2, run_id="j")
        writer = RunWriter(str(path), RunInfo(100 + rank, ["train"], {}, time.time(), where))
        writer.record({CPU: 1.0}, 1, time.monotonic_ns(), None)
        writer.close({})
    done = sampler_command("runs", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    launch, *rows = done.stdout.splitlines()[1:]
    assert launch == "launch j: 2 of 2 ranks"  # the ranks are listed under their launch
    assert ["node-7 rank 0/2" in rows[0], "node-7 rank 1/2" in rows[1]] == [True, True]


def test_runs_shows_a_planted_host_escaped(tmp_path: Path) -> None:
    """A store another user can write: its host names reach the reader's terminal escaped."""
    path = tmp_path / "runs.sqlite"
    writer = RunWriter(str(path), RunInfo(100, ["train"], {}, time.time()))
    writer.record({CPU: 1.0}, 1, time.monotonic_ns(), None)
    writer.close({})
    db = sqlite3.connect(path)
    db.execute("UPDATE runs SET host = ?", ("evil\x1b[2J\x1b]0;owned\x07\n\x9b1m\u202ehost",))
    db.commit()
    db.close()
    done = sampler_command("runs", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [c for c in done.stdout if c != "\n" and not c.isprintable()] == [], done.stdout
    _, row = done.stdout.splitlines()
    assert row.split()[4] == "evil\\x1b[2J\\x1b]0;owned\\x07\\n\\x9b1m\\u202ehost"


def test_run_pid_says_the_process_ended_and_ends_the_run(tmp_path: Path) -> None:
    """``run --pid``: when the watched process exits (here it stays a zombie, unreaped, as
    a parent that is slow to wait leaves it), the run says so once and stops, status 0."""
    trainer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    run = subprocess.Popen(
        [sys.executable, "-m", "sampler", "run", "--pid", str(trainer.pid), "--interval", "1",
         "--categories", "process"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert run.stdout is not None and trainer.stdin is not None
        wait_for(lambda: run.stdout.readline().startswith("step"), what="a first sample")
        trainer.stdin.close()  # it exits
        out, err = run.communicate(timeout=60)
    finally:
        run.kill()
        run.wait()
        trainer.kill()
        trainer.wait()
    assert run.returncode == 0, err
    assert [line for line in out.splitlines() if "ended" in line] == [f"process {trainer.pid} ended"], out
    assert out.rstrip().endswith("0 sink errors") and "Traceback" not in err
    with StoreReader(str(tmp_path / "resource_monitor.sqlite")) as reader:
        recorded = reader.run()
    assert recorded.pid == trainer.pid and recorded.status == "ended"


def test_the_follow_up_commands_name_the_interpreter_that_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python"
    python.symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert common.this_python() == ".venv/bin/python"
    monkeypatch.setenv("PATH", str(venv))
    assert common.this_python() == "python"
