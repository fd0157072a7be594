"""Where ``export -o`` and ``plot -o`` write: a new or regular file is replaced atomically
(``test_file_safety``), anything else that is already there (a terminal, a FIFO, a socket) is
written into, never renamed over, a symbolic link is refused, and ``-o -`` is standard output.

Each target is one the test makes: a FIFO in ``tmp_path`` with a thread draining it, the slave
side of a pty from ``os.openpty()``, a socket bound in ``tmp_path``."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
import threading
import tty
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import old_store, run_command, wait_for

from sampler.commands import export, plot
from sampler.store import schema

HEADER = b"run_id,name,step,wall_time,value"
ROW = b"1,train/loss,7,3.5,0.25"
PNG = b"\x89PNG\r\n\x1a\n"
HANDLERS = {"export": export.main, "plot": plot.main}


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A run store of one run with one ``train/loss`` point."""
    return old_store(tmp_path / "runs.sqlite", schema.SCHEMA_VERSION)


def drain(fd: int, into: bytearray) -> threading.Thread:
    """A thread appending what ``fd`` gives to ``into`` until end of file (or an error: a pty's
    master reads EIO once its slave is closed)."""

    def run() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(fd, 65536):
                into.extend(chunk)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def fifo(path: Path) -> Iterator[bytearray]:
    """A FIFO at ``path`` whose reader drains it into the bytearray yielded, complete once the
    block ends. The test holds a write end during the block, so that the reader sees the end
    of what the command wrote, not an end of file before the command opens the FIFO."""
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(reader, True)
    held = os.open(path, os.O_WRONLY)
    got = bytearray()
    thread = drain(reader, got)
    try:
        yield got
    finally:
        os.close(held)
        thread.join(timeout=30)
        os.close(reader)
    assert not thread.is_alive()


@contextlib.contextmanager
def pty_slave() -> Iterator[tuple[str, bytearray]]:
    """The path of a new pty's slave (raw: bytes pass unchanged) and what its master reads."""
    master, slave = os.openpty()
    tty.setraw(slave)
    got = bytearray()
    thread = drain(master, got)
    try:
        yield os.ttyname(slave), got
    finally:
        os.close(slave)
        thread.join(timeout=30)
        os.close(master)


def ends_as_written(command: str, got: bytes) -> bool:
    if command == "export":
        return got.endswith(ROW + b"\r\n")
    return got.endswith(b"IEND\xaeB`\x82")


@pytest.mark.parametrize("command", ["export", "plot"])
def test_a_fifo_at_the_output_is_written_into_not_renamed_over(
    store: Path, tmp_path: Path, command: str
) -> None:
    if command == "plot":
        pytest.importorskip("matplotlib")
    out = tmp_path / "out.fifo"
    with fifo(out) as got:
        status, printed = run_command(command, str(store), "-o", str(out), handler=HANDLERS[command])
    assert status == 0 and stat.S_ISFIFO(os.lstat(out).st_mode)
    assert bytes(got).startswith(HEADER if command == "export" else PNG) and ends_as_written(command, got)
    assert printed == ("" if command == "export" else f"{out}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.fifo", "runs.sqlite"]  # no temporary left


@pytest.mark.parametrize("command", ["export", "plot"])
def test_a_terminal_at_the_output_is_written_into_not_renamed_over(
    store: Path, tmp_path: Path, command: str
) -> None:
    if command == "plot":
        pytest.importorskip("matplotlib")
    with pty_slave() as (name, got):
        before = os.lstat(name)
        status, _ = run_command(command, str(store), "-o", name, handler=HANDLERS[command])
        assert status == 0
        wait_for(lambda: ends_as_written(command, got), what=f"{command} through the pty")
        after = os.lstat(name)
        assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (
            before.st_ino,
            before.st_rdev,
        )
    assert bytes(got).startswith(HEADER if command == "export" else PNG)
    assert not [p for p in Path(name).parent.iterdir() if p.name.startswith(f".{Path(name).name}.")]


@pytest.mark.parametrize("command", ["export", "plot"])
def test_a_socket_at_the_output_is_an_error_not_renamed_over(
    store: Path, tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(out))
        status, printed = run_command(command, str(store), "-o", str(out), handler=HANDLERS[command])
    err = capsys.readouterr().err
    assert status == 2 and printed == "" and err.count("\n") == 1 and f"cannot write {out}" in err
    assert stat.S_ISSOCK(os.lstat(out).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.sock", "runs.sqlite"]


def test_export_to_dash_writes_standard_output(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    status, printed = run_command("export", str(store), "-o", "-", handler=export.main)
    assert status == 0 and printed.encode() == HEADER + b"\r\n" + ROW + b"\r\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.sqlite"]


@pytest.mark.parametrize("name", ["-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
@pytest.mark.parametrize("command", ["export", "plot"])
def test_dash_writes_standard_output_in_a_real_process(
    store: Path, tmp_path: Path, command: str, name: str
) -> None:
    """``-o -`` and the names a shell user gives standard output (links, which an output is
    otherwise never written through) write into the pipe."""
    if command == "plot":
        pytest.importorskip("matplotlib")
    done = subprocess.run(
        [sys.executable, "-m", "sampler", command, str(store), "-o", name],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(HEADER if command == "export" else PNG)  # the PNG alone: no path printed
    assert ends_as_written(command, done.stdout)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.sqlite"]


@pytest.mark.parametrize("command", [["export", "-o", "-"], ["plot", "-o", "/dev/stdout"], ["runs"]])
def test_a_closed_standard_output_is_one_line_and_status_2(
    store: Path, tmp_path: Path, command: list[str]
) -> None:
    """``... >&-``: Python gives the command no standard output at all; it said so with a
    traceback ('NoneType' object has no attribute 'buffer')."""
    done = subprocess.run(
        [sys.executable, "-m", "sampler", command[0], str(store), *command[1:]],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert done.returncode == 2 and done.stderr == (
        "error: standard output is closed; give it somewhere to go (> FILE)\n"
    ), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.sqlite"]


def link_to(out: Path, target: Path | str) -> Path:
    out.symlink_to(target)
    return out


@pytest.mark.parametrize("target", ["a file", "a missing file", "a fifo"])
@pytest.mark.parametrize("command", ["export", "plot"])
def test_a_symlink_at_the_output_is_refused_and_left_alone(
    store: Path, tmp_path: Path, command: str, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pointed = elsewhere / "target"
    if target == "a file":
        pointed.write_bytes(b"precious\n")
    elif target == "a fifo":
        os.mkfifo(pointed)  # opened by no one: a command writing through the link would block
    out = link_to(tmp_path / "out", pointed)
    status, printed = run_command(command, str(store), "-o", str(out), handler=HANDLERS[command])
    err = capsys.readouterr().err
    assert status == 2 and printed == "" and err.count("\n") == 1 and "Traceback" not in err
    assert f"cannot write {out}: it is a symbolic link (to {pointed})" in err and "-o -" in err
    assert out.is_symlink() and os.readlink(out) == str(pointed)
    assert sorted(p.name for p in elsewhere.iterdir()) == ([] if target == "a missing file" else ["target"])
    if target == "a file":
        assert pointed.read_bytes() == b"precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out", "runs.sqlite"]


def test_demo_refuses_standard_output_for_its_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's report is on standard output: `demo -o -` is refused before any training, with
    the way out, and writes no file named `-`."""
    from sampler.commands import demo

    monkeypatch.chdir(tmp_path)
    status, printed = run_command(
        "demo", "--store", str(tmp_path / "runs.sqlite"), "-o", "-", handler=demo.main
    )
    assert status == 2 and printed == ""
    assert "plot STORE -o -" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["export", "plot"])
@pytest.mark.parametrize("mode", [0o600, 0o664, 0o640])
def test_an_output_written_again_keeps_its_mode(store: Path, tmp_path: Path, command: str, mode: int) -> None:
    """A user who made an export private (chmod 600), or shared it with their group (664), still
    has it so after writing it again: the file that replaces it takes its permission bits, not
    the umask's default."""
    out = tmp_path / f"out.{'png' if command == 'plot' else 'csv'}"
    out.write_bytes(b"old")
    os.chmod(out, mode)
    status, _ = run_command(command, str(store), "-o", str(out), handler=HANDLERS[command])
    assert status == 0 and out.read_bytes() != b"old"
    assert stat.S_IMODE(os.lstat(out).st_mode) == mode
