"""Two runs of this suite on one machine, and other users' files: what a test run makes outside
its own ``tmp_path`` (the whole-machine lock, tmux's socket) is its own, and a name another user
took first is never followed nor trusted."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import conftest
import fake_driver
import pytest
from test_top import Tmux, needs_tmux

NOBODY = 65534


@pytest.fixture
def lock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The whole-machine lock's name, moved into this test's own directory."""
    path = tmp_path / "shared" / conftest.WHOLE_MACHINE_LOCK.name
    path.parent.mkdir()
    monkeypatch.setattr(conftest, "WHOLE_MACHINE_LOCK", path)
    return path


def holds_the_machine(seconds: float = 10) -> bool:
    """``machine_to_itself`` is taken and given back within ``seconds``."""
    entered: list[bool] = []

    def take() -> None:
        with conftest.machine_to_itself():
            entered.append(True)

    taker = threading.Thread(target=take, daemon=True)  # a FIFO's open would block it for good
    taker.start()
    taker.join(seconds)
    return entered == [True] and not taker.is_alive()


def test_the_whole_machine_lock_never_follows_a_link_planted_at_its_name(lock: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "made-through-the-link"
    target.parent.mkdir()
    lock.symlink_to(target)
    with pytest.warns(UserWarning, match="not a lock file"):
        assert holds_the_machine()
    assert not target.exists()  # nothing made (or opened) where the link points


@pytest.mark.parametrize("odd", ["fifo", "directory", "another user's file", "open to others"])
def test_an_odd_file_at_the_lock_s_name_neither_breaks_nor_blocks_the_tests(lock: Path, odd: str) -> None:
    if odd == "fifo":
        os.mkfifo(lock)
    elif odd == "directory":
        lock.mkdir()
    else:
        lock.write_bytes(b"")
        if odd == "open to others":  # any user could open it and hold the lock for good
            lock.chmod(0o644)
        else:
            if os.geteuid() != 0:
                pytest.skip("needs root to give a file to another user")
            os.chown(lock, NOBODY, NOBODY)
    with pytest.warns(UserWarning, match="not a lock file") as said:
        assert holds_the_machine()
        assert holds_the_machine()  # said once
    assert len(said) == 1 and str(lock) in str(said[0].message)


def test_the_lock_it_falls_back_to_still_excludes(lock: Path) -> None:
    lock.mkdir()
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with conftest.machine_to_itself():
            taken.set()
            release.wait(30)

    with pytest.warns(UserWarning):
        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert taken.wait(10)
            assert not holds_the_machine(seconds=0.5)  # waits for the holder
        finally:
            release.set()
            holder.join(10)
        assert holds_the_machine()


def test_a_lock_file_left_by_an_earlier_run_is_taken_again(lock: Path) -> None:
    lock.write_bytes(b"")
    lock.chmod(0o600)
    assert holds_the_machine()
    assert holds_the_machine()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")
def test_a_fake_driver_build_another_user_left_is_never_loaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its builds are cached under the shared temporary directory, where another user can make
    the name first: the library found there would be loaded into every test process."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = fake_driver.build() / fake_driver.SONAME
    while path != tmp_path:  # as if user nobody had made all of it first
        os.chown(path, NOBODY, NOBODY)
        path = path.parent
    with pytest.raises(RuntimeError, match=f"uid {NOBODY}"):
        fake_driver.build()


@needs_tmux
def test_tmux_keeps_its_socket_in_the_test_s_directory_and_removes_it(tmp_path: Path) -> None:
    """Not in tmux's own directory (``/tmp/tmux-UID``), which every run on the machine shares
    and where ``kill-server`` leaves the socket behind."""
    tmux = Tmux(["true"], tmp_path)
    try:
        socket = Path(tmux.tmux("display-message", "-p", "#{socket_path}").strip())
    finally:
        tmux.kill()
    assert socket.parent == tmp_path, socket
    assert not socket.exists()
