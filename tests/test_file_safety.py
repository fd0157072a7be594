"""The files the monitor and its commands write hold against other users and mistakes:
a planted symlink is never followed, a read-only command never writes over a store,
an interrupted output leaves nothing behind, the store is private, and a dead
monitor's discovery entry does not stay forever."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FAST, Recorder, default_sigint, free_ports, old_store, run_command, wait_for

import sampler
from sampler.child import postmortem_write, snapshot
from sampler.commands import export, plot
from sampler.postmortems import files as postmortem_files
from sampler.prometheus import discovery
from sampler.settings.placement import Placement
from sampler.store import schema
from sampler.store.reader import StoreReader

PRECIOUS = b"a file the monitor must never touch\n"
HOST = socket.gethostname()


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside every directory the writers use, that links get planted to."""
    path = tmp_path / "elsewhere" / "victim"
    path.parent.mkdir()
    path.write_bytes(PRECIOUS)
    return path


def plant(names: list[Path], victim: Path) -> None:
    for name in names:
        name.symlink_to(victim)


def untouched(victim: Path) -> bool:
    return victim.read_bytes() == PRECIOUS


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


# --------------------------------------------------------------------------- planted symlinks


def test_a_symlink_planted_at_a_discovery_entry_s_names_is_replaced_not_followed(
    tmp_path: Path, victim: Path
) -> None:
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    path = Path(discovery.entry_path(str(sd_dir), Placement(HOST, run_id="r"), os.getpid()))
    # The final name, and the temporary name earlier releases used (pid-named, so predictable).
    plant([path, sd_dir / f".{path.name}.{os.getpid()}.tmp"], victim)
    discovery.write_entry(str(path), "127.0.0.1:9", {"host": HOST})
    assert untouched(victim)
    assert not path.is_symlink() and json.loads(path.read_text())[0]["targets"] == ["127.0.0.1:9"]


def test_a_symlink_planted_at_a_postmortem_s_names_is_never_followed(tmp_path: Path, victim: Path) -> None:
    from test_postmortem import MEMORY, child_side

    directory = tmp_path / "postmortems"
    directory.mkdir()
    with child_side([MEMORY], 3, directory, None) as (params, ring, status):
        snap = snapshot.take(params, ring, status, 1_700_000_000.25)
    assert params.postmortem is not None
    name = directory / postmortem_files.file_name(snap.vanished_at, os.getpid())
    plant([name, name.with_name(name.stem + f"-{os.getpid()}.jsonl")], victim)
    written = postmortem_write.write(snap, params.postmortem)
    assert untouched(victim)
    assert written is not None and not Path(written).is_symlink()
    assert json.loads(Path(written).read_text().splitlines()[0])["records"] == 3
    assert stat.S_IMODE(os.stat(written).st_mode) == 0o600
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A run store of one run with one ``train/loss`` point."""
    return old_store(tmp_path / "runs.sqlite", schema.SCHEMA_VERSION)


def test_a_symlink_at_the_export_s_output_is_refused_not_followed(
    store: Path, tmp_path: Path, victim: Path
) -> None:
    out = tmp_path / "out.csv"
    plant([out], victim)
    status, _ = run_command("export", str(store), "-o", str(out), handler=export.main)
    assert status == 2 and untouched(victim) and out.is_symlink()  # test_outputs: the message


def test_a_symlink_at_the_plot_s_default_output_is_refused_not_followed(
    store: Path, tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs-run1.png"
    plant([out], victim)
    status, printed = run_command("plot", str(store), handler=plot.main)
    assert status == 2 and printed == "" and untouched(victim) and out.is_symlink()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# --------------------------------------------------------------------------- outputs over the store


def output_over(store: Path, how: str) -> Path:
    """A path naming ``store`` itself (``how``), or another SQLite file."""
    if how == "the store":
        return store
    other = store.with_name(f"{how.replace(' ', '-')}.sqlite")
    if how == "a symlink to it":
        other.symlink_to(store)
    elif how == "a hard link to it":
        os.link(store, other)
    else:
        sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    return other


@pytest.mark.parametrize("how", ["the store", "a symlink to it", "a hard link to it", "another database"])
@pytest.mark.parametrize("command", ["export", "plot"])
def test_an_output_over_the_store_or_any_sqlite_file_is_refused(
    store: Path, command: str, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = output_over(store, how)
    before = {p: p.read_bytes() for p in (store, out)}
    handler = {"export": export.main, "plot": plot.main}[command]
    status, printed = run_command(command, str(store), "-o", str(out), handler=handler)
    err = capsys.readouterr().err
    assert status == 2 and printed == "" and err.count("\n") == 1 and "Traceback" not in err
    what = "an SQLite database" if how == "another database" else f"the run store {store}"
    assert f"refusing to write over {out}: it is {what}" in err
    assert {p: p.read_bytes() for p in before} == before
    with StoreReader(str(store)) as reader:
        assert [run.id for run in reader.runs()] == [1]


@pytest.mark.parametrize("where", ["a missing directory", "a directory"])
@pytest.mark.parametrize("command", ["export", "plot"])
def test_an_output_that_cannot_be_a_file_is_one_line_and_status_2(
    store: Path, tmp_path: Path, command: str, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = {"a missing directory": tmp_path / "no" / "such" / "out", "a directory": tmp_path}[where]
    handler = {"export": export.main, "plot": plot.main}[command]
    status, printed = run_command(command, str(store), "-o", str(out), handler=handler)
    err = capsys.readouterr().err
    assert status == 2 and printed == "" and err.count("\n") == 1 and "Traceback" not in err
    assert (f"{out} is a directory" if where == "a directory" else f"cannot write {out}") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.sqlite"]


def written(directory: Path) -> bool:
    """Whether a file in ``directory`` holds something (one renamed meanwhile aside)."""
    with os.scandir(directory) as entries:
        for found in entries:
            with contextlib.suppress(FileNotFoundError):
                if found.stat().st_size > 0:
                    return True
    return False


def test_an_interrupted_export_leaves_no_half_file_and_no_temporary(store: Path, tmp_path: Path) -> None:
    rows = 2_000_000  # long enough to export (seconds) that the interrupt lands mid-way
    db = sqlite3.connect(store, isolation_level=None)
    db.execute(
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?)"
        " INSERT INTO points SELECT 1, 1, x, x, 0.5 FROM n",
        (rows,),
    )
    db.close()
    out = tmp_path / "out" / "all.csv"
    out.parent.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sampler", "export", str(store), "-o", str(out)],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        # Something written, on its way: streamed to a temporary beside the output, not held in memory.
        wait_for(lambda: written(out.parent), what="export output")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGINT, f"not interrupted mid-way: {proc.returncode} {err}"
    assert list(out.parent.iterdir()) == []


# --------------------------------------------------------------------------- the store's mode


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_a_new_store_and_its_wal_and_shm_are_private(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / "runs.sqlite"
    db = schema.connect(str(path))
    try:
        db.execute("INSERT INTO signal_names (name) VALUES ('x')")
        files = [path, path.with_name("runs.sqlite-wal"), path.with_name("runs.sqlite-shm")]
        assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == {f.name: 0o600 for f in files}
    finally:
        db.close()


def test_an_existing_store_keeps_its_mode(tmp_path: Path, umask_022: None) -> None:
    path = old_store(tmp_path / "shared.sqlite", 2)
    path.chmod(0o640)
    schema.connect(str(path)).close()  # migrated in place
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    with StoreReader(str(path)) as reader:
        assert [run.id for run in reader.runs()] == [1]


# --------------------------------------------------------------------------- stale discovery entries


def entry(sd_dir: Path, host: str, pid: int, run_id: str, body: object = None) -> Path:
    """An entry as a monitor of ``host`` with backend ``pid`` (of this pid namespace) writes it
    (``body``: other content)."""
    path = Path(discovery.entry_path(str(sd_dir), Placement(host, run_id=run_id), pid))
    here = discovery.this_process()
    assert here is not None
    owner = dataclasses.replace(here, pid=pid, started=discovery.start_ticks(pid) or 0)
    labels = {"host": host, "rank": "0", "local_rank": "0", "run_id": run_id, **owner.labels()}
    content = [{"targets": ["127.0.0.1:9"], "labels": labels}] if body is None else body
    path.write_text(json.dumps(content))
    return path


def planted_entries(sd_dir: Path, elsewhere: Path) -> tuple[Path, list[Path]]:
    """A dead monitor's entry of this host, and what must stay: a live pid's entry,
    another host's dead pid's, a file of ours by name but not by content, one by
    content but not by name, a file not of ours, and a link at a dead pid's name
    to an entry outside."""
    sd_dir.mkdir(exist_ok=True)
    dead = dead_pid()
    stale = entry(sd_dir, HOST, dead, "stale")
    kept = [
        entry(sd_dir, HOST, os.getppid(), "alive"),
        entry(sd_dir, "another-host", dead, "stale"),
        entry(sd_dir, HOST, dead, "notes", body={"targets": ["127.0.0.1:9"]}),
        entry(sd_dir, "another-host", dead, "mine", body=[{"targets": [], "labels": {"host": HOST}}]),
        sd_dir / "hand-written.json",
    ]
    kept[-1].write_text(json.dumps([{"targets": ["127.0.0.1:9"], "labels": {"host": HOST}}]))
    linked = entry(elsewhere, HOST, dead, "linked")
    link = sd_dir / linked.name
    link.symlink_to(linked)
    return stale, [*kept, link, linked]


def test_only_a_dead_monitor_s_entry_of_this_host_is_removed(tmp_path: Path) -> None:
    sd_dir = tmp_path / "sd"
    stale, kept = planted_entries(sd_dir, tmp_path)
    before = {p: p.read_bytes() for p in kept}
    assert discovery.remove_stale_entries(str(sd_dir), HOST) == [str(stale)]
    assert not stale.exists()
    assert {p: p.read_bytes() for p in kept} == before and kept[-2].is_symlink()


def test_a_monitor_listing_itself_removes_a_dead_monitor_s_entry(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    sd_dir = tmp_path / "sd"
    stale, kept = planted_entries(sd_dir, tmp_path)
    options = {**FAST, "step_source": "seconds", "postmortem_dir": None, "sink": Recorder()}
    with sampler.ResourceMonitor(
        prometheus_port=free_ports(), prometheus_sd_dir=str(sd_dir), **options
    ) as mon:
        wait_for(lambda: mon.stats()["prometheus_endpoint"], what="the endpoint")
        wait_for(lambda: not stale.exists(), what="the stale entry to go")
        own = set(sd_dir.iterdir()) - set(kept)
    assert len(own) == 1 and all(p.exists() or p.is_symlink() for p in kept)
