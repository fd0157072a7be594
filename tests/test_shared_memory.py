"""Issue 7: shared memory that another local user cannot squat, guess or leak.

The monitor's ring and status block are anonymous: no name exists for another
user to read off a command line and create first. Where anonymous memory is
unavailable, segments get a fresh unguessable name opened with O_EXCL and
unlinked at once; a name someone else holds is skipped, never opened.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import FAST, Recorder, shm_segments, wait_for

import sampler
from ringbuf import NAME_PREFIX, Ring, segment
from sampler.ipc.status import ChildStatus
from sampler.supervision import spawn

ATTACKER_UID = 65534
BACKEND_UID = 65533
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two other users")


def as_user(uid: int, work: Callable[[], Any]) -> Any:
    """Run ``work`` in a forked copy of this process that has dropped to ``uid``;
    returns what it returns (JSON), or raises what it raised, as text."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                out = {"result": work()}
            except BaseException as exc:
                out = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(write_end, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    out = json.loads(data)
    if "error" in out:
        raise AssertionError(f"as uid {uid}: {out['error']}")
    return out["result"]


@pytest.fixture
def squatted() -> Iterator[str]:
    """A segment name another user created first, as a squatter would."""
    name = segment.new_name()

    def squat() -> None:
        segment.Segment.create(64, name).close()

    as_user(ATTACKER_UID, squat)
    yield name
    segment.unlink(name)


def test_a_running_monitor_names_no_segment_anywhere() -> None:
    before = shm_segments()
    with sampler.ResourceMonitor(categories=["cpu", "process"], sink=Recorder(), **FAST) as mon:
        wait_for(lambda: mon.stats()["records_read"] >= 2)
        child = psutil.Process(mon.child_pid)
        during = shm_segments()
        cmdline = " ".join(child.cmdline())
        maps = Path(f"/proc/{child.pid}/maps").read_text()
    assert during == before  # nothing in /dev/shm to squat or leak
    assert NAME_PREFIX not in cmdline  # and nothing named on a command line
    assert maps.count(f"/memfd:{NAME_PREFIX}") >= 2  # ring and status block, anonymous


@needs_root
@pytest.mark.parametrize("backend_uid", [0, BACKEND_UID], ids=["root-backend", "non-root-backend"])
def test_a_squatted_name_gets_a_fresh_one_and_nothing_raises(
    monkeypatch: pytest.MonkeyPatch, squatted: str, backend_uid: int
) -> None:
    """Without memfd, a backend whose first name is squatted by another user
    takes a fresh one; a non-root backend meets PermissionError on that name,
    which must not escape either."""
    names = iter([squatted, squatted])
    monkeypatch.setattr(segment, "new_name", lambda: next(names, None) or NAME_PREFIX + os.urandom(8).hex())
    monkeypatch.setattr(segment, "_memfd", lambda size: None)

    def backend() -> dict[str, Any]:
        status, fd = ChildStatus.create()
        os.close(fd)
        status.close()
        ring, ring_fd = Ring.create_anonymous(["x"], 4)
        ring.write([1.0])
        reader = Ring.from_fd(ring_fd)
        os.close(ring_fd)
        got = reader.read(0).values.tolist()
        reader.close()
        ring.close()
        named = Ring.create(["x"], 4)
        fresh = named.name
        named.close()
        named.unlink()
        return {"got": got, "fresh": fresh, "unlinked_theirs": segment.unlink(squatted)}

    out = as_user(backend_uid, backend) if backend_uid else backend()
    assert out["got"] == [[1.0]] and out["fresh"] != squatted
    assert out["unlinked_theirs"] is (backend_uid == 0)  # only root may remove another user's name
    if backend_uid:
        assert os.stat(f"/dev/shm/{squatted}").st_uid == ATTACKER_UID  # untouched


def test_the_child_gets_its_channel_and_nothing_else() -> None:
    """A descriptor the backend leaves inheritable (as C libraries do) must not
    stay open in the child, where it would keep a user's pipe from closing."""
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    users_pipe = f"pipe:[{os.fstat(write_end).st_ino}]"
    try:
        with sampler.ResourceMonitor(categories=["cpu"], sink=Recorder(), **FAST) as mon:
            wait_for(lambda: mon.stats()["records_read"] >= 1)
            child = psutil.Process(mon.child_pid)
            fds = sorted(int(fd) for fd in os.listdir(f"/proc/{child.pid}/fd"))
            targets = {fd: os.readlink(f"/proc/{child.pid}/fd/{fd}") for fd in fds}
            assert spawn.is_sampling_child(child.cmdline())
    finally:
        os.close(read_end)
        os.close(write_end)
    assert targets[0].startswith("socket:"), targets
    assert users_pipe not in targets.values(), targets
