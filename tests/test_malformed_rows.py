"""A run store or a postmortem that holds a malformed value (another tool's write, a hand-run
UPDATE, a disk that lost a block): every reader says so once, naming the run, file or row, the
column and the value (quoted, bounded), and shows the rest.

The stores and postmortems here are real: written by real monitors, one of whose backends is
really killed; each test corrupts a copy with SQL (or edits a copy of the file) and runs the
real commands through their dispatcher.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FAST, backend_script, gone, run_command, wait_for

import sampler
from sampler.commands import explain, export, plot, postmortem, runs, top
from sampler.util.quoting import bounded_repr

CPU = "resource/cpu/utilization_percent"
LOSS = "train/loss"
HANDLERS: dict[str, Callable[..., int]] = {
    "runs": runs.main,
    "export": export.main,
    "top": top.main,
    "explain": explain.main,
    "plot": plot.main,
    "postmortem": postmortem.main,
}


def command(*argv: str) -> tuple[int, str]:
    """``python -m sampler *argv``, in this process: (exit status, what it printed)."""
    return run_command(*argv, handler=HANDLERS[argv[0]])


def _trained_runs(path: Path) -> None:
    """Two runs of a real monitor on ``path``, each training 40 steps with a loss logged."""
    for _ in range(2):
        step = [0]
        with sampler.ResourceMonitor(
            categories=["cpu", "memory"], store=path, age_source=lambda s=step: s[0], **FAST
        ) as mon:
            s = 0
            while s < 40 or mon.stats()["records_logged"] < 5:
                s += 1
                step[0] = s
                sampler.signals.log_signal(LOSS, 1.0 / s, s)
                time.sleep(0.02)
                assert s < 3000, "no 5 samples in 60 s"


def _killed_backend(cwd: Path, option: str, ready: str) -> str:
    """A real backend whose monitor has ``option`` (a store or a postmortem directory), SIGKILLed
    once ``ready``; returns once its child has written the postmortem and exited."""
    script = backend_script(
        f"""
        mon = sampler.ResourceMonitor(categories=['cpu', 'memory', 'process'], step_source='seconds',
                                      interval_seconds=0.1, _min_interval_seconds=0.05, {option})
        mon.start()
        while not ({ready} and mon.child_pid):
            time.sleep(0.01)
        print(mon.child_pid, flush=True)
        time.sleep(120)
        """
    )
    backend = subprocess.Popen(
        [sys.executable, "-c", script], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert backend.stdout is not None
        line = backend.stdout.readline()
    finally:
        backend.send_signal(signal.SIGKILL)
        _, err = backend.communicate(timeout=60)
    assert line.strip().isdigit(), (line, err)
    child = int(line)
    wait_for(lambda: gone(child), timeout=30, what="the child to write its postmortem and exit")
    return err


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a real store: runs 1 and 2 trained, run 3 killed with two postmortems of it, a real
    postmortem file)."""
    where = tmp_path_factory.mktemp("originals")
    store = where / "runs.sqlite"
    _trained_runs(store)
    logged = "mon.stats()['records_logged'] >= 5"
    _killed_backend(where, f"store={str(store)!r}", f"{logged} and mon.stats()['store_points_written']")
    directory = where / "postmortems"
    err = _killed_backend(where, f"postmortem_dir={str(directory)!r}, store=None", logged)
    db = sqlite3.connect(store, isolation_level=None)
    db.execute(
        "INSERT INTO postmortems (run_id, backend_pid, host, vanished_at, written_at, records, body)"
        " SELECT run_id, backend_pid, host, vanished_at + 1, written_at + 1, records, body FROM postmortems"
    )
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    [file] = list(directory.iterdir()) or [err]
    return store, file


@pytest.fixture
def store(originals: tuple[Path, Path], tmp_path: Path) -> Path:
    """This test's copy of the real store."""
    copy = tmp_path / "runs.sqlite"
    source = sqlite3.connect(originals[0])
    target = sqlite3.connect(copy)
    source.backup(target)
    source.close()
    target.close()
    return copy


def corrupt(store: Path, sql: str) -> None:
    db = sqlite3.connect(store, isolation_level=None)
    assert db.execute(sql).rowcount == 1, sql
    db.close()


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[str]]]:
    caplog.set_level(logging.WARNING, logger="sampler")
    yield lambda: [
        r.getMessage() for r in caplog.records if r.name == "sampler" and r.levelno >= logging.WARNING
    ]


def runs_rows(store: Path) -> dict[str, list[str]]:
    status, out = command("runs", str(store))
    assert status == 0, out
    return {line.split()[0]: line.split() for line in out.splitlines()[1:]}


def exported(store: Path, *options: str) -> list[dict[str, Any]]:
    status, out = command("export", str(store), *options)
    assert status == 0, out
    if "jsonl" in options:
        return [json.loads(line) for line in out.splitlines()]
    return list(csv.DictReader(io.StringIO(out)))


def every_reader(store: Path, plot_in: Path | None = None) -> dict[str, Any]:
    """What each command that reads runs and points shows of the store (each must succeed):
    ``runs``, ``export`` in each form, ``top`` and ``explain`` of runs 1 and 2, and with
    ``plot_in``, ``plot`` of run 1 drawn there."""
    shown: dict[str, Any] = {"runs": runs_rows(store)}
    for options in ((), ("--format", "jsonl"), ("--wide",)):
        shown[" ".join(("export", *options))] = exported(store, *options)
    for run in ("1", "2"):
        for argv in (("top", "--once", "--run", run), ("explain", "--run", run)):
            status, out = command(argv[0], str(store), *argv[1:])
            assert status == 0, out
            shown[f"{argv[0]} {run}"] = out
    if plot_in is not None:
        status, out = command("plot", str(store), "--run", "1", "-o", str(plot_in / "plot.png"))
        assert status == 0, out
    return shown


@pytest.fixture(scope="module")
def before(originals: tuple[Path, Path]) -> dict[str, Any]:
    """What every reader shows of the store before a test corrupts its copy."""
    return every_reader(originals[0])


def of_run(rows: list[dict[str, Any]], run: int) -> list[dict[str, Any]]:
    return [row for row in rows if str(row["run_id"]) == str(run)]


RUN_COLUMNS = [
    ("command", "'not json'", "'not json'"),
    ("command", """'{"argv": 1}'""", """'{"argv": 1}'"""),
    ("command", """'["python", 7]'""", """'["python", 7]'"""),
    ("stats", "substr(stats, 1, 20)", "'{"),
    ("stats", """'{"restarts": "many"}'""", "'many'"),
    ("stats", """'{"deaths": {"a": 1}}'""", "{'a': 1}"),
    ("stats", "'[1]'", "'[1]'"),
    ("pid", str(2**40), str(2**40)),
    ("pid", "'init'", "'init'"),
    ("config", "'{'", "'{'"),
    ("config", """'{"interval_seconds": "abc"}'""", "'abc'"),
    ("config", """'{"interval_seconds": 1e999}'""", "inf"),
    ("config", """'{"step_source": [1]}'""", "[1]"),
    ("started_at", "'yesterday'", "'yesterday'"),
    ("started_at", "1e300", "1e+300"),
    ("updated_at", "x'00ff'", "b'\\x00\\xff'"),
    ("ended_at", "'later'", "'later'"),
    ("host", "CAST(x'ff41' AS TEXT)", "b'\\xffA'"),
    ("host", "x'41'", "b'A'"),
    ("version", "CAST(x'c3' AS TEXT)", "b'\\xc3'"),
    ("rank", "'first'", "'first'"),
    ("world_size", "0", "0"),
    ("local_world_size", "1.5", "1.5"),
    ("launch_id", "x'ff'", "b'\\xff'"),
    ("elapsed", "'long'", "'long'"),
    ("elapsed", "-1.5", "-1.5"),
]


@pytest.mark.parametrize(("column", "value", "quoted"), RUN_COLUMNS)
def test_a_malformed_column_of_a_run_is_said_once_and_the_rest_is_shown(
    store: Path,
    tmp_path: Path,
    before: dict[str, Any],
    warnings: Callable[[], list[str]],
    column: str,
    value: str,
    quoted: str,
) -> None:
    corrupt(store, f"UPDATE runs SET {column} = {value} WHERE id = 1")
    after = every_reader(store, tmp_path)
    assert set(after["runs"]) == {"1", "2", "3"} and after["runs"]["2"] == before["runs"]["2"]
    for key in ("export", "export --format jsonl", "export --wide"):
        assert of_run(after[key], 1) == of_run(before[key], 1)
        assert of_run(after[key], 2) == of_run(before[key], 2)
    assert after["explain 2"] == before["explain 2"]
    [said] = warnings()
    assert f"{store}: run 1: {column} " in said and quoted in said, said
    status, out = command("runs", str(store), "--prune", "--older-than", "1s")
    assert status == 0 and "removed run 2" in out, out


POINT_COLUMNS = [
    ("step", "'abc'", "'abc'"),
    ("step", "2.5", "2.5"),
    ("wall_time", "'noon'", "'noon'"),
    ("wall_time", "1e300", "1e+300"),
    ("value", "'high'", "'high'"),
    ("value", "x'00'", "b'\\x00'"),
]


@pytest.mark.parametrize(("column", "value", "quoted"), POINT_COLUMNS)
def test_a_malformed_point_is_left_out_and_said_once(
    store: Path,
    tmp_path: Path,
    before: dict[str, Any],
    warnings: Callable[[], list[str]],
    column: str,
    value: str,
    quoted: str,
) -> None:
    corrupt(
        store,
        f"UPDATE points SET {column} = {value} WHERE rowid = (SELECT MIN(rowid) FROM points"
        f" WHERE run_id = 1 AND name_id = (SELECT id FROM signal_names WHERE name = '{LOSS}'))",
    )
    after = every_reader(store, tmp_path)
    for key in ("export", "export --format jsonl"):
        assert len(of_run(after[key], 1)) == len(of_run(before[key], 1)) - 1
        assert of_run(after[key], 2) == of_run(before[key], 2)
    [said] = warnings()
    assert f"{store}: run 1: 1 point whose {column} " in said and LOSS in said and quoted in said, said


RECORD_COLUMNS = [
    ("step", "'abc'", "'abc'"),
    ("step", "2.5", "2.5"),
    ("wall_ms", "'noon'", "'noon'"),
    ("wall_ms", "1e300", "1e+300"),
    ("wall_ms", "-5", "-5"),
]


@pytest.mark.parametrize(("column", "value", "quoted"), RECORD_COLUMNS)
def test_a_malformed_record_is_left_out_and_said_once(
    store: Path,
    tmp_path: Path,
    before: dict[str, Any],
    warnings: Callable[[], list[str]],
    column: str,
    value: str,
    quoted: str,
) -> None:
    """A record whose step or time is malformed goes with all its readings; the others stay."""
    first = first_record(store)
    readings = sum(
        1
        for row in of_run(before["export"], 1)
        if row["name"].startswith("resource/") and (row["step"], row["wall_time"]) == first
    )
    assert readings > 1
    corrupt(store, f"UPDATE records SET {column} = {value} WHERE run_id = 1 AND seq = 0")
    after = every_reader(store, tmp_path)
    for key in ("export", "export --format jsonl"):
        assert len(of_run(after[key], 1)) == len(of_run(before[key], 1)) - readings
        assert of_run(after[key], 2) == of_run(before[key], 2)
    [said] = warnings()
    assert f"{store}: run 1: 1 record whose step or wall_ms " in said and quoted in said, said


def first_record(store: Path) -> tuple[str, str]:
    """(step, wall time) of run 1's first record, as the CSV export writes them."""
    db = sqlite3.connect(store)
    ((step, wall),) = db.execute("SELECT step, wall_ms / 1000.0 FROM records WHERE run_id = 1 AND seq = 0")
    db.close()
    return str(step), str(wall)


@pytest.mark.parametrize(("value", "quoted"), [("'high'", "'high'"), ("x'00'", "b'\\x00'")])
def test_a_malformed_reading_is_left_out_and_said_once(
    store: Path,
    tmp_path: Path,
    before: dict[str, Any],
    warnings: Callable[[], list[str]],
    value: str,
    quoted: str,
) -> None:
    corrupt(store, f'UPDATE records SET "{CPU}" = {value} WHERE run_id = 1 AND seq = 1')
    after = every_reader(store, tmp_path)
    for key in ("export", "export --format jsonl"):
        assert len(of_run(after[key], 1)) == len(of_run(before[key], 1)) - 1
        assert of_run(after[key], 2) == of_run(before[key], 2)
    [said] = warnings()
    assert f"{store}: run 1: 1 reading of {CPU} " in said and quoted in said, said


@pytest.mark.parametrize(
    ("value", "raw", "shown"), [("CAST(x'74ff' AS TEXT)", b"t\xff", "t\ufffd"), ("x'74'", b"t", "t")]
)
def test_a_malformed_signal_name_is_said_once_and_its_points_are_shown(
    store: Path,
    tmp_path: Path,
    before: dict[str, Any],
    warnings: Callable[[], list[str]],
    value: str,
    raw: bytes,
    shown: str,
) -> None:
    corrupt(store, f"UPDATE signal_names SET name = {value} WHERE name = '{LOSS}'")
    after = every_reader(store, tmp_path)
    for key in ("export", "export --format jsonl"):
        renamed = [{**row, "name": LOSS} if row["name"] == shown else row for row in after[key]]
        assert renamed == before[key]
    [said] = warnings()
    assert f"{store}: signal " in said and f"name {bounded_repr(raw)}" in said, said


POSTMORTEM_COLUMNS = [
    ("backend_pid", str(2**40), str(2**40)),
    ("host", "CAST(x'ff' AS TEXT)", "b'\\xff'"),
    ("vanished_at", "'dawn'", "'dawn'"),
    ("written_at", "x'01'", "b'\\x01'"),
    ("records", "'many'", "'many'"),
    ("read_at", "'never'", "'never'"),
    ("run_id", "'first'", "'first'"),
]


def postmortem_listing(*argv: str) -> list[list[str]]:
    status, out = command("postmortem", *argv, "--all")
    assert status == 0, out
    return [line.split() for line in out.splitlines()[1:]]


@pytest.mark.parametrize(("column", "value", "quoted"), POSTMORTEM_COLUMNS)
def test_a_malformed_postmortem_row_is_said_once_and_the_rest_is_shown(
    store: Path, warnings: Callable[[], list[str]], column: str, value: str, quoted: str
) -> None:
    status, second = command("postmortem", "--store", str(store), "--show", "2")
    assert status == 0, second
    before = postmortem_listing("--store", str(store))
    corrupt(store, f"UPDATE postmortems SET {column} = {value} WHERE id = 1")
    after = postmortem_listing("--store", str(store))
    assert len(after) == 2 and before[1][1:] in (row[1:] for row in after)
    number = next(str(n) for n, row in enumerate(after, 1) if row[1:] == before[1][1:])
    status, shown = command("postmortem", "--store", str(store), "--show", number)
    assert status == 0 and shown.splitlines()[2:] == second.splitlines()[2:], shown
    status, _ = command("postmortem", "--store", str(store), "--show", str(3 - int(number)))
    assert status == 0
    [said] = warnings()
    assert f"{store}: postmortem 1: {column} " in said and quoted in said, said


OOM_AT_10_TO_THE_400 = {"name": "/job", "directory": "/sys/fs/cgroup/job", "version": 2,
                        "oom_kills_at_start": 0, "oom_kills_at_death": 1, "memory_used_bytes": 10**400,
                        "memory_limit_bytes": 10**400, "memory_from": "high-water mark"}  # fmt: skip
SIGKILL = {"status": None, "signal": 9, "core_dumped": False, "unknown": None}
POSTMORTEM_VALUES: list[tuple[str, Callable[[dict[str, Any], list[dict[str, Any]]], None]]] = [
    ("vanished_at", lambda header, records: header.update(vanished_at=10**400)),
    ("monitor_started_at", lambda header, records: header.update(monitor_started_at=10**400)),
    ("wall_time", lambda header, records: records[1].update(wall_time=-(10**400))),
    ("values", lambda header, records: records[-1]["values"].update({CPU: 10**400})),
    (
        "memory_cgroup",
        lambda header, records: header.update(memory_cgroup=OOM_AT_10_TO_THE_400, exit=SIGKILL),
    ),
]


@pytest.mark.parametrize(("key", "change"), POSTMORTEM_VALUES, ids=[key for key, _ in POSTMORTEM_VALUES])
def test_a_postmortem_file_with_a_number_no_float_holds_is_shown_with_one_warning(
    originals: tuple[Path, Path],
    tmp_path: Path,
    warnings: Callable[[], list[str]],
    key: str,
    change: Callable[[dict[str, Any], list[dict[str, Any]]], None],
) -> None:
    directory = tmp_path / "postmortems"
    directory.mkdir()
    good = Path(shutil.copy(originals[1], directory))
    bad = directory / good.name.replace(".jsonl", "-2.jsonl")  # a second postmortem of that death
    header, *records = [json.loads(line) for line in good.read_text().splitlines()]
    change(header, records)
    bad.write_text("".join(json.dumps(line) + "\n" for line in [header, *records]))
    listed = postmortem_listing("--dir", str(directory))
    [number] = [str(n) for n, row in enumerate(listed, 1) if row[-1] == str(bad)]
    status, shown = command("postmortem", "--dir", str(directory), "--show", number)
    assert status == 0, shown
    status, intact = command("postmortem", "--dir", str(directory), "--show", str(3 - int(number)))
    assert status == 0 and "10000000000" not in shown + intact
    [said] = warnings()
    assert f"{bad}: " in said and key in said and "an integer of 1329 bits" in said, said


def test_a_warning_shows_the_text_others_planted_escaped(
    originals: tuple[Path, Path], store: Path, tmp_path: Path, warnings: Callable[[], list[str]]
) -> None:
    """A signal name or a postmortem's key that others wrote reaches the terminal escaped in a
    warning too."""
    evil = "\x1b]0;owned\x07\x1b[2J\u202e"
    db = sqlite3.connect(store, isolation_level=None)
    db.execute("UPDATE signal_names SET name = ? WHERE name = ?", (LOSS + evil, LOSS))
    db.execute(
        "UPDATE points SET step = 'abc' WHERE rowid = (SELECT MIN(rowid) FROM points WHERE run_id = 1"
        " AND name_id = (SELECT id FROM signal_names WHERE name = ?))",
        (LOSS + evil,),
    )
    db.close()
    exported(store)
    directory = tmp_path / "postmortems"
    directory.mkdir()
    path = Path(shutil.copy(originals[1], directory))
    header, *records = [json.loads(line) for line in path.read_text().splitlines()]
    records[-1]["values"][CPU + evil] = 10**400
    path.write_text("".join(json.dumps(line) + "\n" for line in [header, *records]))
    status, _ = command("postmortem", "--dir", str(directory), "--show", "1")
    assert status == 0
    said = warnings()
    assert len(said) == 2 and all("\\x1b]0;owned\\x07\\x1b[2J\\u202e" in line for line in said), said
    assert [c for line in said for c in line if not c.isprintable()] == [], said


@pytest.mark.parametrize("name", ["runs#1.sqlite", "runs?mode=rw.sqlite", "runs%20a.sqlite"])
def test_a_store_whose_name_sqlite_would_read_as_a_uri_is_read_and_nothing_is_made(
    store: Path, before: dict[str, Any], name: str
) -> None:
    """A reader opens the store its path names, read-only, whatever characters the name holds
    (``#``, ``?`` and ``%`` mean something in the URI SQLite is given): it made an empty ``runs``
    beside it and read that instead."""
    named = store.rename(store.with_name(name))
    assert runs_rows(named) == before["runs"]
    assert {p.name for p in named.parent.iterdir()} <= {name, f"{name}-wal", f"{name}-shm"}
