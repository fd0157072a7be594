"""Postmortems: a backend that dies without stopping its monitor (SIGKILL, the OOM
killer) leaves behind what its child's ring held; the next monitor announces it
once, and ``python -m sampler postmortem`` lists it, shows it and marks it read.

Every backend here is a real process that is really killed. Its child writes to
the backend's stderr, which the test reads to its end: that also proves the child
has exited.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
import pytest
from cgroups import cgroup_skip_reason, memory_cgroup
from conftest import FAST, Recorder, backend_script, gone, old_store, run_command, sampler_command, wait_for

import sampler
from ringbuf import Ring
from sampler.child import postmortem, postmortem_text, postmortem_write, snapshot
from sampler.collectors import Sources
from sampler.commands import postmortem as command
from sampler.commands.common import EXIT_USAGE
from sampler.ipc.channel import ChildParams, PostmortemTarget, open_pidfd
from sampler.ipc.status import ChildStatus
from sampler.postmortems import files as postmortem_files
from sampler.postmortems import reading as postmortems
from sampler.settings.table import MonitorSettings
from sampler.store import schema
from sampler.store.reader import StoreReader
from sampler.supervision import spawn

FALLBACK = f"{postmortem_write.FALLBACK_DIR_NAME}-{os.geteuid()}"
"""The fallback directory's name under the temporary directory."""

MEMORY = "resource/process/memory_in_use_mb"
MEMORY_PERCENT = "resource/process/memory_in_use_percent"
READY = "mon.stats()['records_logged'] >= 5"
FAST_ARGS = "interval_seconds=0.1, _min_interval_seconds=0.05"


STALLING_SINK = """
import threading
stall = threading.Event()
def sink(name, value, step):
    if stall.is_set():  # a sink stuck in a call: nothing more is logged
        print("stalled", flush=True)
        threading.Event().wait()
"""


CATEGORIES = ("cpu", "memory", "process")


def monitor_lines(options: str, ready: str = READY, categories: tuple[str, ...] = CATEGORIES) -> str:
    """Script lines: start a monitor ``mon`` of ``categories`` with ``options``, wait until
    ``ready``, print its child's pid."""
    return "\n".join(
        [
            f"mon = sampler.ResourceMonitor(categories={list(categories)!r}, sink=sink,",
            f"    step_source='seconds', {FAST_ARGS}, {options}).start()",
            f"while not ({ready}): time.sleep(0.01)",
            "print(mon.child_pid, flush=True)",
        ]
    )


class Backend:
    """A backend script run in ``tmp_path`` with ``tmp_path/tmp`` as its TMPDIR: it
    waits for a line on stdin, starts a monitor, then runs ``then``."""

    def __init__(
        self,
        tmp_path: Path,
        options: str,
        *,
        ready: str = READY,
        then: str = "time.sleep(120)",
        categories: tuple[str, ...] = CATEGORIES,
    ) -> None:
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir(exist_ok=True)
        script = tmp_path / "backend.py"
        script.write_text(
            backend_script(
                STALLING_SINK
                + "sys.stdin.readline()\n"
                + monitor_lines(options, ready, categories)
                + "\n"
                + then
            )
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], cwd=tmp_path, env={**os.environ, "TMPDIR": str(self.tmp)},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.pid = self.proc.pid
        self.child = 0
        """Its sampling child, once ``ready`` returned."""

    def ready(self) -> int:
        """Let the script start its monitor; returns the child's pid."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            _, err = self.proc.communicate(timeout=30)
            pytest.fail(f"the backend ended before its monitor was ready: {err}")
        self.child = int(line)
        return self.child

    def line(self) -> str:
        """The next line the script prints."""
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def kill(self) -> str:
        """SIGKILL the backend and reap it at once, as a shell or launcher would (the child learns
        how it ended only then); returns its stderr once the child has closed it too."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        _, err = self.proc.communicate(timeout=30)
        child = self.child
        wait_for(lambda: gone(child), timeout=5, what="the child to exit after its backend")
        return err

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)
        with contextlib.suppress(psutil.Error):
            child = psutil.Process(self.child)
            if spawn.is_sampling_child(child.cmdline()):  # still ours, not a reused pid
                child.kill()


def start(backends: list[Backend], tmp_path: Path, options: str, **kwargs: str) -> Backend:
    backend = Backend(tmp_path, options, **kwargs)
    backends.append(backend)
    backend.ready()
    return backend


def parse(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    header, *records = [json.loads(line) for line in text.splitlines()]
    return header, records


def files(directory: Path) -> list[Path]:
    return sorted(directory.glob("postmortem-*.jsonl")) if directory.is_dir() else []


def announcements(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "postmortem" in r.getMessage()
    ]


def announced_in_a_new_process(directory: Path | None, store: Path | None) -> str:
    """What a fresh process's monitor start would announce for these places."""
    code = (
        "import logging, sys; logging.basicConfig(format='%(message)s')\n"
        "from sampler.postmortems import reading as postmortems\n"
        "postmortems.announce(sys.argv[1] or None, sys.argv[2] or None)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(directory or ""), str(store or "")], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stderr


def check_records(header: dict[str, Any], records: list[dict[str, Any]], pid: int) -> None:
    """What every postmortem of a backend monitored with ``Backend`` holds."""
    assert header["backend_pid"] == header["monitored_pid"] == pid
    assert header["records"] == len(records) >= 5
    assert MEMORY in header["fields"] and MEMORY + "_peak" in header["fields"]
    numbers = [r["record"] for r in records]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    times = [r["wall_time"] for r in records]
    assert (
        times == sorted(times)
        and times[-1] < header["written_at"]
        and header["vanished_at"] <= header["written_at"]
    )
    assert records[0]["logged"] and header["last_logged_record"] in numbers
    for record in records:
        assert record["logged"] == (record["record"] <= header["last_logged_record"])
    for record in alive(records):
        assert {MEMORY, MEMORY + "_peak", MEMORY + "_mean"} <= record["values"].keys()
        assert record["values"][MEMORY] > 0 and record["values"][MEMORY + "_peak"] > 0


def alive(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records read while the backend still had its memory. Those after them read it
    being torn down (killed, its memory already released, maybe reaped): no memory
    reading, 0 % of memory in use. How many there are depends on how long the teardown
    takes and when the child sees the death, so on the load; the first several are alive."""
    count = next((i for i, r in enumerate(records) if MEMORY not in r["values"]), len(records))
    dying = records[count:]
    torn_down = [r for r in dying if MEMORY not in r["values"] and r["values"].get(MEMORY_PERCENT, 0.0) == 0]
    assert torn_down == dying and count >= 5, records
    return records[:count]


def test_a_sigkilled_backend_leaves_a_postmortem_the_next_monitor_announces_once(
    tmp_path: Path, backends: list[Backend], caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "postmortems"
    backend = start(
        backends, tmp_path, f"postmortem_dir={str(directory)!r}", then="stall.set()\ntime.sleep(120)"
    )
    assert backend.line() == "stalled\n"
    err = backend.kill()
    [path] = files(directory)
    header, records = parse(path.read_text())
    check_records(header, records, backend.pid)
    assert path.name == postmortem_files.file_name(header["vanished_at"], backend.pid)
    assert not records[-1]["logged"]  # the record the sink stalled on, at least
    assert f"pid {backend.pid}) died" in err and str(path) in err, err

    caplog.set_level(logging.WARNING, logger="sampler")
    monitor = sampler.ResourceMonitor(categories=["cpu"], sink=Recorder(), postmortem_dir=directory, **FAST)
    for _ in range(2):
        monitor.start()
        monitor.stop()
    [announcement] = announcements(caplog)
    assert f"of pid {backend.pid}" in announcement and f"{len(records)} records" in announcement
    assert f"python -m sampler postmortem --dir {directory} --show 1" in announcement

    status, listing = run_command("postmortem", "--dir", str(directory), handler=command.main)
    assert status == 0 and str(backend.pid) in listing.splitlines()[1] and str(path) in listing
    status, shown = run_command("postmortem", "--dir", str(directory), "--show", "1", handler=command.main)
    assert status == 0 and f"backend pid {backend.pid}" in shown
    assert f"; {sum(not r['logged'] for r in records)} never logged" in shown
    [memory_row] = [line.split() for line in shown.splitlines() if line.startswith(MEMORY + " ")]
    peak = max(max(r["values"][MEMORY], r["values"][MEMORY + "_peak"]) for r in alive(records))
    assert len(memory_row) == 1 + command.DEFAULT_LAST + 1
    assert float(memory_row[-1]) == pytest.approx(peak, abs=0.05)
    last = records[-1]["values"].get(MEMORY)  # none when it read the backend being torn down
    assert memory_row[-2] == "-" if last is None else float(memory_row[-2]) == pytest.approx(last, abs=0.05)

    assert not path.exists() and files(directory) == [
        path.with_name(path.name.replace(".jsonl", ".read.jsonl"))
    ]
    status, listing = run_command("postmortem", "--dir", str(directory), handler=command.main)
    assert status == 0 and "no postmortems waiting" in listing
    assert "postmortem" not in announced_in_a_new_process(directory, None)


def test_with_a_store_the_postmortem_lands_in_the_store_with_its_run(
    tmp_path: Path, backends: list[Backend], caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "runs.sqlite"
    backend = start(
        backends, tmp_path, f"store={str(store)!r}", ready=f"{READY} and mon.stats()['store_points_written']"
    )
    err = backend.kill()
    with StoreReader(str(store)) as reader:
        run = reader.run()
        [row] = reader.postmortems()
        header, records = parse(reader.postmortem_body(row.id))
    assert run.pid == row.backend_pid == backend.pid and row.run_id == run.id and row.read_at is None
    assert row.records == len(records) and row.vanished_at == header["vanished_at"]
    assert header["monitor_started_at"] == run.started_at
    check_records(header, records, backend.pid)
    assert not (tmp_path / ".resource_monitor").exists()  # the default directory is for runs without a store
    assert f"the run store {store} (postmortem {row.id})" in err, err

    caplog.set_level(logging.WARNING, logger="sampler")
    monitor = sampler.ResourceMonitor(
        categories=["cpu"], sink=Recorder(), store=store, postmortem_dir=None, **FAST
    )
    for _ in range(2):
        monitor.start()
        monitor.stop()
    [announcement] = announcements(caplog)
    assert f"of pid {backend.pid}" in announcement and f"{store} (postmortem {row.id})" in announcement

    status, listing = run_command("postmortem", "--store", str(store), handler=command.main)
    assert status == 0 and f"{store} (postmortem {row.id})" in listing
    assert listing.splitlines()[1].split()[6] == str(run.id)  # the death's date and time are two
    status, shown = run_command("postmortem", "--store", str(store), "--show", "latest", handler=command.main)
    assert status == 0 and f"run {run.id} of the store" in shown and MEMORY in shown
    with StoreReader(str(store)) as reader:
        assert reader.postmortems(unread_only=True) == []
    assert "postmortem" not in announced_in_a_new_process(None, store)


def test_the_command_finds_the_store_a_script_named_in_its_working_directory(
    tmp_path: Path, backends: list[Backend]
) -> None:
    """A script that used ``store="runs.sqlite"`` as the README shows, then was killed: a bare
    ``postmortem`` run where it ran lists its postmortem (not 'none in resource_monitor.sqlite')."""
    backend = start(
        backends, tmp_path, "store='runs.sqlite'", ready=f"{READY} and mon.stats()['store_points_written']"
    )
    backend.kill()
    (tmp_path / "notes.db").write_text("not SQLite")  # neither is looked at as a store
    sqlite3.connect(tmp_path / "other.sqlite").execute("CREATE TABLE t (a)").connection.close()
    listing = sampler_command("postmortem", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    [row] = listing.stdout.splitlines()[1:]
    assert row.endswith("runs.sqlite (postmortem 1)") and f" {backend.pid} " in row, listing.stdout

    # Another program holds the store locked (a browser of SQLite files, a long write): its
    # postmortem cannot be listed now, which is said, naming it, rather than "no run store here".
    # A FIFO and a directory with a store's name are not opened: nothing waits on them.
    os.mkfifo(tmp_path / "x.sqlite")
    (tmp_path / "d.sqlite3").mkdir()
    locked = sqlite3.connect(tmp_path / "runs.sqlite", isolation_level=None)
    try:
        locked.execute("PRAGMA locking_mode=EXCLUSIVE")
        locked.execute("BEGIN EXCLUSIVE")
        blocked = sampler_command("postmortem", cwd=tmp_path)
    finally:
        locked.close()
    assert blocked.returncode == 0, blocked.stderr
    [warning] = blocked.stderr.splitlines()
    assert "cannot read runs.sqlite (database is locked)" in warning and "--store runs.sqlite" in warning
    assert "no run store here could be read (other.sqlite, runs.sqlite)" in blocked.stdout, blocked.stdout


def test_the_command_says_where_else_to_look_when_it_finds_none(tmp_path: Path) -> None:
    done = sampler_command("postmortem", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no run store here" in done.stdout and "--store PATH" in done.stdout, done.stdout


def test_a_backend_the_oom_killer_takes_leaves_its_climb_to_the_limit(
    tmp_path: Path, backends: list[Backend]
) -> None:
    reason = cgroup_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    directory = tmp_path / "postmortems"
    limit_mb = 300
    hog = "hog = []\nwhile True:\n    hog.append(b'x' * (8 << 20))\n    time.sleep(0.05)"
    with memory_cgroup(limit_mb * 1024**2) as group:
        backend = Backend(tmp_path, f"postmortem_dir={str(directory)!r}", then=hog)
        backends.append(backend)
        group.add(backend.pid)  # before its monitor starts: the child is born in the cgroup too
        backend.ready()
        assert backend.proc.wait(timeout=60) == -signal.SIGKILL
        err = backend.kill()
        # Should the OOM killer take the child first, the monitor restarts it, and the
        # cgroup's OOM kill count tells.
        oom = Path(group.path, "memory.oom_control")
        assert files(directory), f"no postmortem; {oom.read_text() if oom.exists() else ''}; stderr: {err}"
    [path] = files(directory)
    header, records = parse(path.read_text())
    check_records(header, records, backend.pid)
    memory = [max(r["values"][MEMORY], r["values"][MEMORY + "_peak"]) for r in alive(records)]
    print(f"memory_in_use_mb over the last {len(memory)} records: {memory[0]:.0f} -> {max(memory):.0f}")
    assert max(memory) > 0.6 * limit_mb and max(memory) - memory[0] > 0.4 * limit_mb
    assert max(memory) < 1.1 * limit_mb


def test_an_unwritable_directory_falls_back_to_the_temporary_one(
    tmp_path: Path, backends: list[Backend]
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    directory = tmp_path / "a-file" / "postmortems"
    backend = start(backends, tmp_path, f"postmortem_dir={str(directory)!r}")
    err = backend.kill()
    [path] = files(backend.tmp / FALLBACK)
    check_records(*parse(path.read_text()), backend.pid)
    assert f"cannot write a postmortem into {directory}" in err and f"is in {path}" in err, err


@pytest.mark.parametrize("how", ["locked", "corrupt"])
def test_a_store_that_cannot_be_written_falls_back_to_the_directory(
    tmp_path: Path, backends: list[Backend], how: str
) -> None:
    store = tmp_path / "runs.sqlite"
    directory = tmp_path / "postmortems"
    if how == "corrupt":
        store.write_bytes(b"this is not a database, whatever its name says\n" * 100)
    ready = READY if how == "corrupt" else f"{READY} and mon.stats()['store_points_written']"
    backend = start(
        backends, tmp_path, f"store={str(store)!r}, postmortem_dir={str(directory)!r}", ready=ready
    )
    holder = sqlite3.connect(store, isolation_level=None)
    try:
        if how == "locked":
            holder.execute("BEGIN EXCLUSIVE")  # another writer that holds on past the child's patience
        err = backend.kill()
    finally:
        holder.close()
    [path] = files(directory)
    check_records(*parse(path.read_text()), backend.pid)
    assert f"cannot write a postmortem into the run store {store}" in err and f"is in {path}" in err, err
    if how == "locked":
        with StoreReader(str(store)) as reader:
            assert reader.postmortems() == []


def test_a_monitor_stopped_normally_leaves_no_postmortem(tmp_path: Path, backends: list[Backend]) -> None:
    """One monitor stopped by stop(), one by the exit of its backend (atexit)."""
    directory = tmp_path / "postmortems"
    options = f"postmortem_dir={str(directory)!r}"
    backend = start(backends, tmp_path, options, then="mon.stop()\n" + monitor_lines(options))
    out, err = backend.proc.communicate(timeout=60)
    assert backend.proc.returncode == 0, err
    first, second = backend.child, int(out)
    wait_for(lambda: gone(first) and gone(second), timeout=5, what="both children to exit")
    assert not directory.exists() and not (backend.tmp / FALLBACK).exists()
    assert "postmortem" not in err, err


def test_eof_from_a_backend_that_lives_is_no_death(tmp_path: Path, backends: list[Backend]) -> None:
    directory = tmp_path / "postmortems"
    then = (
        "import socket, psutil\n"
        "first = mon.child_pid\n"
        "mon._run.supervisor.child.sock.shutdown(socket.SHUT_WR)\n"  # EOF, with no STOP, from a live backend
        "def gone(pid):\n"  # reaped between the two questions is gone too
        "    try:\n"
        "        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE\n"
        "    except psutil.NoSuchProcess:\n"
        "        return True\n"
        "while not gone(first):\n"
        "    time.sleep(0.01)\n"
        "print('left', flush=True)\n"
        "time.sleep(120)"
    )
    backend = start(backends, tmp_path, f"postmortem_dir={str(directory)!r}", then=then)
    assert backend.line() == "left\n"
    assert files(directory) == []


def test_no_directory_and_no_store_writes_nothing(tmp_path: Path, backends: list[Backend]) -> None:
    backend = start(backends, tmp_path, "postmortem_dir=None")
    err = backend.kill()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backend.py", "tmp"]
    assert list(backend.tmp.iterdir()) == [] and "postmortem" not in err, err


@contextlib.contextmanager
def hung_mount(path: Path) -> Iterator[None]:
    """A FUSE filesystem at ``path`` whose server never answers: whatever touches it
    waits (killably) until it is unmounted. Skips the test where it cannot be mounted."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError as exc:
        pytest.skip(f"no FUSE here: {exc}")
    try:
        options = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}".encode()
        if libc.mount(b"hung", str(path).encode(), b"fuse", 0, options) != 0:
            pytest.skip(f"cannot mount FUSE here: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            libc.umount2(str(path).encode(), 2)  # MNT_DETACH
    finally:
        os.close(fd)  # aborts the connection: whatever still waits gets an error


def test_a_postmortem_stuck_in_a_hung_filesystem_does_not_keep_the_child(
    tmp_path: Path, backends: list[Backend]
) -> None:
    mount = tmp_path / "mnt"
    mount.mkdir()
    backend = start(backends, tmp_path, f"postmortem_dir={str(mount / 'postmortems')!r}")
    with hung_mount(mount):
        err = backend.kill()
    assert f"could not be written within {postmortem.WRITE_CAP_SECONDS:g} s" in err, err
    assert files(mount / "postmortems") == []


def test_a_full_stderr_pipe_does_not_hold_the_child(tmp_path: Path, backends: list[Backend]) -> None:
    """Nobody drains the backend's stderr, which the child shares: it says nothing, but leaves."""
    directory = tmp_path / "postmortems"
    fill = (
        "import fcntl\n"
        "flags = fcntl.fcntl(2, fcntl.F_GETFL)\n"
        "fcntl.fcntl(2, fcntl.F_SETFL, flags | os.O_NONBLOCK)\n"
        "try:\n"
        "    while True: os.write(2, b'x' * 4096)\n"
        "except BlockingIOError:\n"
        "    pass\n"
        "fcntl.fcntl(2, fcntl.F_SETFL, flags)\n"
        "print('full', flush=True)\n"
        "time.sleep(120)"
    )
    backend = start(backends, tmp_path, f"postmortem_dir={str(directory)!r}", then=fill)
    assert backend.line() == "full\n"
    backend.proc.send_signal(signal.SIGKILL)
    backend.proc.wait(timeout=30)
    child = backend.child
    wait_for(lambda: gone(child), timeout=10, what="the child to exit")
    [path] = files(directory)
    check_records(*parse(path.read_text()), backend.pid)


def write_postmortem(directory: Path, vanished_at: float, pid: int) -> Path:
    """A minimal postmortem file, as the format describes it."""
    header = {"format": postmortem_files.FORMAT, "version": 1, "backend_pid": pid, "host": "h",
              "vanished_at": vanished_at, "fields": [MEMORY], "records": 1}  # fmt: skip
    record = {"record": 0, "wall_time": vanished_at - 1, "logged": True, "values": {MEMORY: 12.5}}
    path = directory / postmortem_files.file_name(vanished_at, pid)
    path.write_text(json.dumps(header) + "\n" + json.dumps(record) + "\n")
    return path


def test_foreign_and_corrupt_files_do_not_break_the_announcement(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "postmortems"
    directory.mkdir()
    good = write_postmortem(directory, 1_700_000_000.0, 4242)
    (directory / "notes.txt").write_text("mine")
    (directory / postmortem_files.file_name(1_700_000_001.0, 7)).write_text("{truncated")
    (directory / postmortem_files.file_name(1_700_000_002.0, 8)).write_bytes(b"\xff\xfe binary")
    (directory / postmortem_files.file_name(1_700_000_002.5, 10)).write_text(
        "[" * 100_000
    )  # too deep for json
    (directory / postmortem_files.file_name(1_700_000_003.0, 9)).mkdir()
    (directory / "postmortem-29991399T000000.000Z-pid1.jsonl").write_text("{}")  # no such date
    (directory / f".{good.name}.abc.tmp").write_text("half a postm")
    caplog.set_level(logging.DEBUG, logger="sampler")
    postmortems.announce(str(directory), None)
    [announcement] = announcements(caplog)
    assert "of pid 4242" in announcement and ", 1 record)" in announcement and "--show 1" in announcement
    assert sum("is named like a postmortem but is not one" in r.getMessage() for r in caplog.records) == 3

    status, listing = run_command("postmortem", "--dir", str(directory), handler=command.main)
    assert status == 0 and len(listing.splitlines()) == 5 and listing.count("unreadable") == 3
    for number in ("2", "4"):
        status, _ = run_command("postmortem", "--dir", str(directory), "--show", number, handler=command.main)
        assert status == EXIT_USAGE
    status, shown = run_command("postmortem", "--dir", str(directory), "--show", "1", handler=command.main)
    assert status == 0 and "12.5" in shown


def test_a_broken_directory_or_store_is_never_announced_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("x")
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"garbage" * 100)
    caplog.set_level(logging.DEBUG, logger="sampler")
    postmortems.announce(str(not_a_directory), str(corrupt))
    postmortems.announce(str(tmp_path / "missing"), str(tmp_path / "missing.sqlite"))
    assert announcements(caplog) == []
    assert sum("no postmortems read from" in r.getMessage() for r in caplog.records) == 4

    odd = tmp_path / "odd.sqlite"
    db = schema.connect(str(odd))
    db.execute(
        "INSERT INTO postmortems (backend_pid, host, vanished_at, written_at, records, body)"
        " VALUES (3, 'h', 1e300, 1e300, 0, '')"
    )
    db.close()
    postmortems.announce(None, str(odd))
    *malformed, announcement = announcements(caplog)
    assert "of pid 3 (died at ?, 0 records)" in announcement
    assert [m.split(": ")[2:4] for m in malformed] == [
        ["postmortem 1", "vanished_at 1e+300 is not a time; read as unknown"],
        ["postmortem 1", "written_at 1e+300 is not a time; read as unknown"],
    ]


def test_the_command_refuses_what_it_cannot_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "postmortems"
    status, _ = run_command("postmortem", "--dir", str(directory), handler=command.main)
    assert status == EXIT_USAGE and f"no directory at {directory}" in capsys.readouterr().err
    directory.mkdir()
    write_postmortem(directory, 1_700_000_000.0, 1)
    status, _ = run_command("postmortem", "--dir", str(directory), "--show", "2", handler=command.main)
    assert status == EXIT_USAGE and "there is no postmortem 2; there are 1" in capsys.readouterr().err
    status, _ = run_command("postmortem", "--store", str(tmp_path / "no.sqlite"), handler=command.main)
    assert status == EXIT_USAGE and "no run store at" in capsys.readouterr().err
    status, out = run_command("postmortem", "--dir", str(directory), "--mark-read", handler=command.main)
    assert status == 0 and "marked 1 read" in out
    status, out = run_command("postmortem", "--dir", str(directory), "--all", handler=command.main)
    assert status == 0 and out.splitlines()[1].split()[7] == "yes"


def test_a_version_1_store_opened_for_writing_gets_the_postmortems_table(tmp_path: Path) -> None:
    path = old_store(tmp_path / "old.sqlite", 1)
    with pytest.raises(schema.StoreVersionError, match="older one"):
        StoreReader(str(path))
    schema.connect(str(path)).close()
    with StoreReader(str(path)) as reader:
        assert reader.db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
        assert reader.postmortems() == []
        assert reader.run().pid == 42 and reader.series(1, "train/loss").values == [0.25]
        columns = [row[1] for row in reader.db.execute("PRAGMA table_info(postmortems)")]
    assert columns == ["id", "run_id", "backend_pid", "host", "vanished_at", "written_at", "records", "body",
                       "read_at"]  # fmt: skip


def test_several_postmortems_announced_from_several_threads_make_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "postmortems"
    directory.mkdir()
    write_postmortem(directory, 1_700_000_000.0, 5)
    write_postmortem(directory, 1_700_000_060.0, 6)
    caplog.set_level(logging.WARNING, logger="sampler")
    threads = [threading.Thread(target=postmortems.announce, args=(str(directory), None)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [announcement] = announcements(caplog)
    assert f"2 postmortems (pids 5, 6) are waiting in {directory}; the latest, of pid 6," in announcement
    assert announcement.endswith(f"list them with `python -m sampler postmortem --dir {directory}`")


@contextlib.contextmanager
def child_side(
    fields: list[str], records: int, directory: Path | None, store: Path | None
) -> Iterator[tuple[ChildParams, Ring, ChildStatus]]:
    """What the child holds when its backend dies: params, a ring with ``records``
    written, and a status block whose backend has logged all but the last."""
    ring, ring_fd = Ring.create_anonymous(fields, 16)
    os.close(ring_fd)
    status, status_fd = ChildStatus.create()
    os.close(status_fd)
    for k in range(records):
        ring.write([float(k)] * len(fields))
    status.publish_logged(records - 2, 3)
    target = PostmortemTarget(
        None if directory is None else str(directory), None if store is None else str(store), 1.5
    )
    sources = Sources(disk_path=os.sep, pid=os.getpid(), nvml_module="pynvml")
    params = ChildParams(("memory",), MonitorSettings(interval_seconds=1.0), sources, os.getpid(), 16, target)
    try:
        yield params, ring, status
    finally:
        ring.close()
        status.close()


def test_a_ring_closed_or_never_made_gives_a_postmortem_without_records(tmp_path: Path) -> None:
    with child_side([MEMORY], 3, tmp_path, None) as (params, ring, status):
        ring.close()  # the main thread found the channel broken first
        closed = snapshot.take(params, ring, status, 100.0)
        never = snapshot.take(params, None, status, 100.0)
    assert closed.fields == (MEMORY,) and closed.indices == [] and never.fields == () and never.indices == []
    assert params.postmortem is not None
    header, records = parse("\n".join(postmortem_text.lines(closed, params.postmortem, 101.0)))
    assert header["records"] == 0 and records == [] and header["last_logged_record"] == 1


def test_two_monitors_of_one_backend_dying_in_one_millisecond_keep_both(tmp_path: Path) -> None:
    with child_side([MEMORY], 20, tmp_path, None) as (params, ring, status):
        snap = snapshot.take(params, ring, status, 1_700_000_000.25)
    assert params.postmortem is not None
    first = postmortem_write.write(snap, params.postmortem)
    second = postmortem_write.write(snap, params.postmortem)
    assert first is not None and second is not None and first != second
    found = postmortems.in_directory(str(tmp_path))
    assert [f.path for f in found] == sorted([first, second]) and {f.backend_pid for f in found} == {
        os.getpid()
    }
    header, records = parse(Path(second).read_text())
    assert header["records"] == len(records) == 16  # the ring's capacity: the 4 oldest were overwritten
    assert [r["record"] for r in records] == list(range(4, 20))
    assert [r["logged"] for r in records[-2:]] == [True, False]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_store_without_the_run_gets_the_postmortem_with_no_run(tmp_path: Path) -> None:
    store = tmp_path / "new.sqlite"
    with child_side([MEMORY, MEMORY + "_peak"], 3, None, store) as (params, ring, status):
        ring.write([3.0, math.nan])  # a reading that failed: left out, JSON has no NaN
        snap = snapshot.take(params, ring, status, 100.0)
    assert params.postmortem is not None
    assert postmortem_write.write(snap, params.postmortem) == f"the run store {store} (postmortem 1)"
    with StoreReader(str(store)) as reader:
        [row] = reader.postmortems()
        header, records = parse(reader.postmortem_body(row.id))
    assert row.run_id is None and row.records == 4 and header["monitor_started_at"] == 1.5
    assert [r["values"] for r in records[-2:]] == [{MEMORY: 2.0, MEMORY + "_peak": 2.0}, {MEMORY: 3.0}]


def unwritable_postmortem(tmp_path: Path) -> tuple[Path, snapshot.Snapshot, PostmortemTarget]:
    """A postmortem taken, whose directory cannot be made (a file ``a-file`` is in its
    way): (that file, the snapshot, its target), for the fallback to take."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with child_side([MEMORY], 3, blocker / "postmortems", None) as (params, ring, status):
        snap = snapshot.take(params, ring, status, 100.0)
    assert params.postmortem is not None
    return blocker, snap, params.postmortem


def test_nowhere_to_write_says_so_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    blocker, snap, target = unwritable_postmortem(tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(blocker))  # the fallback lies under it too
        assert postmortem_write.write(snap, target) is None
    err = capfd.readouterr().err
    assert f"cannot write a postmortem into {blocker / 'postmortems'}" in err
    assert f"cannot write a postmortem into {blocker / FALLBACK}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_eof_is_a_death_only_once_the_backend_is_gone() -> None:
    """After EOF the child asks: our parent lives (with a pidfd or, where there is
    none, by its pid), a process that is not our parent any more is gone."""
    parent = os.getppid()
    pidfd = open_pidfd(parent)
    try:
        assert not postmortem.backend_died(parent, pidfd)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    assert not postmortem.backend_died(parent, None)
    assert postmortem.backend_died(os.getpid(), None)


@pytest.mark.parametrize("planted", ["link", "another user's"])
def test_a_fallback_directory_planted_by_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], planted: str
) -> None:
    shared = tmp_path / "tmp"  # stands for /tmp, where any user can make the fallback's name first
    shared.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    if planted == "link":
        (shared / FALLBACK).symlink_to(victim)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to make a directory another user owns")
        (shared / FALLBACK).mkdir()
        os.chown(shared / FALLBACK, 65534, 65534)
    _, snap, target = unwritable_postmortem(tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(shared))
        assert postmortem_write.write(snap, target) is None
    err = capfd.readouterr().err
    assert f"cannot write a postmortem into {shared / FALLBACK}" in err and "not a private directory" in err
    assert list(victim.iterdir()) == [] and list((shared / FALLBACK).iterdir()) == []


def test_the_fallback_directory_is_made_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, snap, target = unwritable_postmortem(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = postmortem_write.write(snap, target)
    assert path is not None and Path(path).parent == tmp_path / FALLBACK
    assert stat.S_IMODE((tmp_path / FALLBACK).stat().st_mode) == 0o700


def test_a_postmortem_s_planted_text_is_shown_escaped(tmp_path: Path) -> None:
    """A postmortem directory may be shared: what its files say reaches a terminal escaped."""
    directory = tmp_path / "postmortems"
    evil = "\x1b]0;owned\x07\x1b[2J\u202e"
    with child_side([MEMORY], 3, directory, None) as (params, ring, status):
        snap = snapshot.take(params, ring, status, 100.0)
    assert params.postmortem is not None
    [path] = [Path(p) for p in [postmortem_write.write(snap, params.postmortem)] if p is not None]
    header, *rest = path.read_text().splitlines()
    fields = json.loads(header)
    cgroup = postmortem_files.CgroupAtDeath(evil, evil, 1, 0, 1, None, None, evil)
    fields.update(host=evil, fields=[MEMORY + evil], memory_cgroup=asdict(cgroup),
                  exit=asdict(postmortem_files.Exit(unknown=evil)))  # fmt: skip
    records = [json.loads(line) for line in rest]
    for record in records:
        record["values"] = {MEMORY + evil: record["values"][MEMORY]}
    path.write_text("\n".join(json.dumps(line) for line in [fields, *records]) + "\n")
    for argv in (("--all",), ("--show", "1")):
        status, out = run_command("postmortem", "--dir", str(directory), *argv, handler=command.main)
        assert status == 0, out
        assert not [c for c in out if not c.isprintable() and c != "\n"], repr(out)
        assert "\\x1b]0;owned\\x07" in out and "\\u202e" in out
