"""The postmortem names how the backend died when it can tell: the OOM killer of its memory
cgroup (the cgroup's OOM kill count rose while the child watched), the signal that ended it
or its exit status (the kernel tells a non-parent through a pidfd, Linux 6.15+), else that
the cause could not be learned.

The deaths are real: a backend in a real memory cgroup allocating until the OOM killer takes
it, a real SIGKILL, a real ``os._exit(3)``; the pidfd ioctl is asked about real processes.
Only the edge cases of reading cgroup files (an unreadable high-water mark, a count missing)
use a fake cgroup tree, through the root-path parameters.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import fake_driver
import psutil
import pytest
from cgroups import cgroup_skip_reason, memory_cgroup
from conftest import gone, run_command, wait_for
from test_container import PID, layout
from test_postmortem import Backend, child_side, files, parse, write_postmortem

from sampler.child import exitinfo, postmortem_text, postmortem_write, snapshot
from sampler.collectors.container import MemoryCgroup
from sampler.collectors.container import memory_cgroup as find_memory_cgroup
from sampler.commands import postmortem as command
from sampler.postmortems import files as postmortem_files
from sampler.postmortems.files import CgroupAtDeath, Exit
from sampler.postmortems.reading import cause_of_death

MiB = 1024**2
USED = "resource/container/memory_used_mb"
LIMIT = "resource/container/memory_limit_mb"


def needs_cgroups() -> None:
    reason = cgroup_skip_reason()
    if reason is not None:
        pytest.skip(reason)


def exit_info_skip_reason() -> str | None:
    """None where the kernel keeps the exit status for a pidfd (Linux 6.15+), else why not. Told
    by the version, not by asking: a broken ioctl must fail these tests, not skip them."""
    release = os.uname().release
    version = tuple(int(part) for part in re.findall(r"\d+", release)[:2])
    return (
        None if version >= (6, 15) else f"Linux {release} gives no exit status through a pidfd (6.15+ does)"
    )


def needs_exit_info() -> None:
    reason = exit_info_skip_reason()
    if reason is not None:
        pytest.skip(reason)


def ended(backend: Backend) -> str:
    """Reap the backend as its parent would at once (the kernel has its exit status only then);
    its stderr once its child has closed that too."""
    backend.proc.wait(timeout=60)
    _, err = backend.proc.communicate(timeout=30)
    child = backend.child
    wait_for(lambda: gone(child), timeout=10, what="the child to exit after its backend")
    return err


def shown(*place: str) -> list[str]:
    """``python -m sampler postmortem PLACE --show latest``, line by line."""
    status, out = run_command("postmortem", *place, "--show", "latest", handler=command.main)
    assert status == 0, out
    return out.splitlines()


HOG = "hog = []\nwhile True:\n    hog.append(b'x' * (8 << 20))\n    time.sleep(0.05)"
"""A backend's last lines: allocate 160 MiB a second, written, until something stops it."""


def test_the_oom_killer_of_the_backend_s_cgroup_is_named(tmp_path: Path, backends: list[Backend]) -> None:
    needs_cgroups()
    directory = tmp_path / "postmortems"
    limit_mb = 300
    with memory_cgroup(limit_mb * MiB) as group:
        backend = Backend(tmp_path, f"postmortem_dir={str(directory)!r}", then=HOG)
        backends.append(backend)
        group.add(backend.pid)  # before its monitor starts: the child is born in the cgroup too
        child_rss = psutil.Process(backend.ready()).memory_info().rss
        err = ended(backend)
        assert backend.proc.returncode == -signal.SIGKILL, err
        assert files(directory), f"no postmortem: the OOM killer took the child? {err}"
    [path] = files(directory)
    header, _ = parse(path.read_text())
    cgroup = CgroupAtDeath.from_json(header["memory_cgroup"])
    assert (
        cgroup is not None and cgroup.directory == group.path and cgroup.name.endswith(Path(group.path).name)
    )
    # The cgroup is new: one OOM kill in all, the backend's (it ended by SIGKILL, which nobody else
    # sent), and the child that wrote this was there before it (a replacement would count from 1).
    kills = f"{cgroup.oom_kills_at_start} -> {cgroup.oom_kills_at_death}"
    print(f"OOM kills {kills}; the child's RSS {child_rss / MiB:.0f} MiB")
    assert (cgroup.oom_kills_at_start, cgroup.oom_kills_at_death) == (0, 1)
    assert (
        Exit.from_json(header["exit"]) == Exit(signal=signal.SIGKILL) or exit_info_skip_reason() is not None
    )
    assert cgroup.memory_from == postmortem_files.MEMORY_FROM_MARK
    assert cgroup.memory_limit_bytes == limit_mb * MiB
    assert (
        cgroup.memory_used_bytes is not None
        and 0.9 * limit_mb * MiB < cgroup.memory_used_bytes <= limit_mb * MiB
    )
    first, *rest = shown("--dir", str(directory))
    print(f"postmortem --show: {first}")
    detail = (
        f"memory cgroup {cgroup.name} (v{cgroup.version}, {group.path}): 1 OOM kill while the child watched"
    )
    assert detail + "; memory from its high-water mark" in rest
    used = cgroup.memory_used_bytes / MiB
    assert first == (
        f"killed by the OOM killer of cgroup {cgroup.name} at step {header['last_logged_step']}, "
        f"memory {used:.1f} of {limit_mb:.1f} MiB"
    )


def test_a_plain_sigkill_is_named_and_no_oom_kill_is_claimed(tmp_path: Path, backends: list[Backend]) -> None:
    needs_cgroups()
    needs_exit_info()
    directory = tmp_path / "postmortems"
    with memory_cgroup(1024 * MiB) as group:
        backend = Backend(tmp_path, f"postmortem_dir={str(directory)!r}")
        backends.append(backend)
        group.add(backend.pid)
        backend.ready()
        backend.proc.send_signal(signal.SIGKILL)
        ended(backend)
    [path] = files(directory)
    header, records = parse(path.read_text())
    cgroup = CgroupAtDeath.from_json(header["memory_cgroup"])
    assert cgroup is not None and cgroup.directory == group.path and cgroup.oom_kills == 0
    assert Exit.from_json(header["exit"]) == Exit(signal=signal.SIGKILL)
    assert header["peaks"] == {f: v for f, v in records[-1]["values"].items() if f.endswith("_peak")}
    first = shown("--dir", str(directory))[0]
    print(f"postmortem --show: {first}")
    assert first == f"ended by SIGKILL at step {header['last_logged_step']} (no OOM kill in its cgroup)"


def test_an_exit_status_is_named(tmp_path: Path, backends: list[Backend]) -> None:
    """A backend that leaves with os._exit(3), its monitor never stopped; the postmortem goes
    into a store, the header in a row's body."""
    needs_exit_info()
    store = tmp_path / "runs.sqlite"
    backend = Backend(tmp_path, f"store={str(store)!r}", then="os._exit(3)")
    backends.append(backend)
    backend.ready()
    ended(backend)
    assert backend.proc.returncode == 3
    first = shown("--store", str(store))[0]
    print(f"postmortem --show: {first}")
    assert first.startswith("exited with status 3 at step ") and "OOM" not in first


# The pidfd's exit status, asked of real short-lived processes.


@pytest.fixture
def process() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A process that waits for a line on stdin, then exits with the status it reads; with a
    pidfd of it. Killed and reaped after the test."""
    code = "import os, sys; os._exit(int(sys.stdin.readline()))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    pidfd = os.pidfd_open(proc.pid)
    try:
        yield proc, pidfd
    finally:
        os.close(pidfd)
        proc.kill()
        proc.wait(timeout=30)
        if proc.stdin is not None:
            proc.stdin.close()


def exits(proc: subprocess.Popen[bytes], status: int) -> None:
    """Let ``proc`` exit with ``status``; returns once it is a zombie, not yet reaped."""
    assert proc.stdin is not None
    proc.stdin.write(f"{status}\n".encode())
    proc.stdin.close()
    wait_for(lambda: gone(proc.pid), timeout=30, what="the process to exit")


def test_the_exit_status_comes_once_the_parent_has_reaped(
    process: tuple[subprocess.Popen[bytes], int],
) -> None:
    needs_exit_info()
    proc, pidfd = process
    assert exitinfo.read(pidfd) is None  # it runs
    exits(proc, 7)
    assert exitinfo.read(pidfd) is None  # a zombie: nothing until its parent reaps it
    unreaped = exitinfo.wait(pidfd, 0.1)
    assert unreaped.status is None and unreaped.signal is None
    assert unreaped.unknown is not None and "its parent had not reaped it" in unreaped.unknown
    assert proc.wait(timeout=30) == 7
    assert exitinfo.read(pidfd) == exitinfo.wait(pidfd, 0) == Exit(status=7)


def test_the_signal_that_ended_a_process_is_read(process: tuple[subprocess.Popen[bytes], int]) -> None:
    needs_exit_info()
    proc, pidfd = process
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    found = exitinfo.read(pidfd)
    print(f"PIDFD_GET_INFO {exitinfo.PIDFD_GET_INFO:#x} on {os.uname().release}: {found}")
    assert found == Exit(signal=signal.SIGTERM)


def test_no_pidfd_info_is_an_unknown_exit() -> None:
    """Where the kernel has no PIDFD_GET_INFO it answers ENOTTY, as it does here for a
    descriptor that is not a pidfd; without a pidfd nothing is asked."""
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(OSError) as raised:
            exitinfo.read(read_end)
        assert raised.value.errno == errno.ENOTTY
        unknown = exitinfo.wait(read_end, 5.0)  # an answer, not the timeout
    finally:
        os.close(read_end)
        os.close(write_end)
    assert unknown == Exit(
        unknown="the kernel tells no exit status to a non-parent (ENOTTY; Linux 6.15+ does)"
    )
    assert (
        exitinfo.wait(None, 5.0).unknown
        == "the child had no pidfd of the backend (Linux before 5.3, or refused)"
    )


# The memory cgroup: a real one, then the edge cases of its files in a fake tree.


ALLOCATOR = """
import sys
chunks = []
for line in sys.stdin:
    chunks.append(b"\\x01" * (int(line) << 20))  # written, so every page is charged
    print("ok", flush=True)
"""


def test_a_real_oom_kill_is_counted_in_the_cgroup_of_its_victim() -> None:
    needs_cgroups()
    with memory_cgroup(64 * MiB) as group:
        proc = subprocess.Popen(
            [sys.executable, "-c", ALLOCATOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            group.add(proc.pid)
            found = find_memory_cgroup(proc.pid)
            assert found is not None and str(found.directory) == group.path and found.oom_kills() == 0
            assert proc.stdin is not None and proc.stdout is not None
            for _ in range(16):  # 128 MiB, twice the limit
                proc.stdin.write("8\n")
                proc.stdin.flush()
                if proc.stdout.readline() != "ok\n":
                    break
            assert proc.wait(timeout=60) == -signal.SIGKILL
            assert found.oom_kills() == 1
            mark = found.memory_bytes()
            assert mark is not None and 0.9 * 64 * MiB < mark[0] <= 64 * MiB and mark[1] == 64 * MiB
        finally:
            proc.kill()
            proc.communicate(timeout=30)


def fake_tree(tmp_path: Path, proc_cgroup: str, tree: dict[str, str]) -> MemoryCgroup | None:
    """``memory_cgroup(PID)`` with ``proc_cgroup`` as /proc/<PID>/cgroup and ``tree`` (path:
    text) as the cgroup filesystem."""
    return find_memory_cgroup(PID, **layout(tmp_path, proc_cgroup, tree))


V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 1\noom_kill {kills}\noom_group_kill 0"


def test_without_a_high_water_mark_the_last_record_tells_the_memory(tmp_path: Path) -> None:
    """cgroup v2 before Linux 5.19 has no memory.peak: the last record's container memory (its
    peak) and limit stand in."""
    events = tmp_path / "cgroup/job/memory.events"
    cgroup = fake_tree(
        tmp_path,
        "0::/job\n",
        {
            "cgroup.controllers": "memory",
            "job/memory.max": str(300 * MiB),
            "job/memory.events": V2_EVENTS.format(kills=2),
        },
    )
    assert cgroup is not None and cgroup.v2 and cgroup.name == "/job" and cgroup.memory_bytes() is None
    witness = snapshot.Witness(None, cgroup)
    events.write_text(V2_EVENTS.format(kills=3))  # the backend's OOM kill
    with child_side([USED, USED + "_peak", LIMIT], 3, tmp_path, None) as (params, ring, status):
        ring.write([250.0, 291.5, 300.0])
        ring.write([float("nan"), float("nan"), 300.0])  # the reading of the backend torn down
        snap = witness.learn(snapshot.take(params, ring, status, 100.0))
    assert snap.memory_cgroup == CgroupAtDeath(
        name="/job", directory=str(tmp_path / "cgroup/job"), version=2, oom_kills_at_start=2,
        oom_kills_at_death=3, memory_used_bytes=291.5 * MiB, memory_limit_bytes=300 * MiB,
        memory_from=postmortem_files.MEMORY_FROM_RECORD,
    )  # fmt: skip
    assert params.postmortem is not None
    header, _ = parse("\n".join(postmortem_text.lines(snap, params.postmortem, 101.0)))
    assert header["peaks"] == {}  # the last record's peak read nothing: left out
    assert (
        cause_of_death(header)
        == "killed by the OOM killer of cgroup /job at step 3, memory 291.5 of 300.0 MiB"
    )


def test_a_cgroup_whose_kills_cannot_be_counted_claims_nothing(tmp_path: Path) -> None:
    """cgroup v1 before Linux 4.13 has no oom_kill line: no cgroup in the postmortem."""
    cgroup = fake_tree(
        tmp_path,
        "4:memory:/job\n",
        {
            "memory/job/memory.oom_control": "oom_kill_disable 0\nunder_oom 0",
            "memory/job/memory.limit_in_bytes": "1",
        },
    )
    assert cgroup is not None and not cgroup.v2
    witness = snapshot.Witness(None, cgroup)
    with child_side([USED], 3, tmp_path, None) as (params, ring, status):
        snap = witness.learn(snapshot.take(params, ring, status, 100.0))
    assert snap.memory_cgroup is None and snap.exit is not None and snap.exit.unknown is not None
    assert params.postmortem is not None and postmortem_write.write(snap, params.postmortem) is not None
    first, *rest = shown("--dir", str(tmp_path))
    assert first == "vanished at step 3; the cause could not be learned"
    assert f"its exit status could not be learned: {snap.exit.unknown}" in rest
    assert not [line for line in rest if line.startswith("memory cgroup")]


def test_where_no_cgroup_counts_oom_kills_there_is_none(tmp_path: Path) -> None:
    """A process in the v2 root cgroup (no memory.events there) on a v2-only host."""
    assert fake_tree(tmp_path, "0::/\n", {"cgroup.controllers": "memory", "memory.stat": ""}) is None


# The sentence, from headers as files may hold them.


def header(**fields: Any) -> dict[str, Any]:
    base = {"format": postmortem_files.FORMAT, "version": 2, "backend_pid": 1, "host": "h",
            "vanished_at": 1.0, "fields": [], "records": 0, "last_logged_step": 1200, "exit": None,
            "memory_cgroup": None}  # fmt: skip
    return {**base, **fields}


def cgroup_json(
    at_start: int, at_death: int | None, used: float | None = None, limit: float | None = None
) -> Any:
    """A header's ``memory_cgroup`` of cgroup /x."""
    source = None if used is None else postmortem_files.MEMORY_FROM_MARK
    return asdict(CgroupAtDeath("/x", "/sys/fs/cgroup/memory/x", 1, at_start, at_death, used, limit, source))


GiB = 1024**3


@pytest.mark.parametrize(
    ("fields", "sentence"),
    [
        ({"exit": {"status": None, "signal": 9, "core_dumped": False, "unknown": None},
          "memory_cgroup": cgroup_json(0, 1, 61.8 * GiB, 64 * GiB)},
         "killed by the OOM killer of cgroup /x at step 1200, memory 61.8 of 64.0 GiB"),
        ({"exit": {"status": None, "signal": None, "core_dumped": False, "unknown": "ENOTTY"},
          "memory_cgroup": cgroup_json(4, 6, 900 * MiB)},
         "killed by the OOM killer of cgroup /x at step 1200, memory 900.0 MiB"),
        ({"exit": {"status": None, "signal": 9, "core_dumped": False, "unknown": None},
          "memory_cgroup": cgroup_json(0, 0)},
         "ended by SIGKILL at step 1200 (no OOM kill in its cgroup)"),
        ({"exit": {"status": None, "signal": 11, "core_dumped": True, "unknown": None}},
         "ended by SIGSEGV (core dumped) at step 1200"),
        ({"exit": {"status": None, "signal": 6, "core_dumped": False, "unknown": None},
          "memory_cgroup": cgroup_json(0, 1)},
         "ended by SIGABRT at step 1200 (the OOM killer of cgroup /x took 1 process of it meanwhile)"),
        ({"exit": {"status": 1, "signal": None, "core_dumped": False, "unknown": None},
          "memory_cgroup": cgroup_json(0, 2)},
         "exited with status 1 at step 1200 (the OOM killer of cgroup /x took 2 processes of it meanwhile)"),
        ({"exit": {"status": 3, "signal": None, "core_dumped": False, "unknown": None},
          "memory_cgroup": cgroup_json(0, 0)},
         "exited with status 3 at step 1200"),
        ({"exit": {"status": None, "signal": None, "core_dumped": False, "unknown": "not reaped"},
          "memory_cgroup": cgroup_json(0, 0)},
         "vanished at step 1200; the cause could not be learned (no OOM kill in its cgroup)"),
        ({"memory_cgroup": cgroup_json(5, 3), "last_logged_step": None},  # the count went back: a new cgroup
         "vanished before any step was logged; the cause could not be learned"),
        ({"exit": {"signal": "9"}, "memory_cgroup": {"name": 7}},  # planted: read as nothing
         "vanished at step 1200; the cause could not be learned"),
        ({"exit": {"status": True, "signal": None, "core_dumped": False, "unknown": None}},
         "vanished at step 1200; the cause could not be learned"),
        ({"exit": {"status": None, "signal": 99, "core_dumped": False, "unknown": None}},
         "ended by signal 99 at step 1200"),
        ({"exit": {"status": None, "signal": 11, "core_dumped": False, "unknown": None},
          "gpu_xids": [{"gpu": 2, "xid": 48, "record": 3}, {"gpu": 5, "xid": 79, "record": 41}],
          "last_logged_record": 40},
         "ended by SIGSEGV at step 1200, after XID 79 on GPU 5 at step 1200"),
        ({"exit": {"status": 1, "signal": None, "core_dumped": False, "unknown": None},
          "gpu_xids": [{"gpu": 0, "xid": 13, "record": 12}], "last_logged_record": 40},
         "exited with status 1 at step 1200, after XID 13 on GPU 0 at or before step 1200"),
        ({"gpu_xids": [{"gpu": 0, "xid": 43, "record": 0}], "last_logged_step": None},
         "vanished before any step was logged; the cause could not be learned, after XID 43 on GPU 0 "
         "before any step was logged"),
        ({"gpu_xids": [{"gpu": True, "xid": "79", "record": 1}], "last_logged_record": 0},  # planted
         "vanished at step 1200; the cause could not be learned"),
        ({"gpu_xids": {"gpu": 1}}, "vanished at step 1200; the cause could not be learned"),
    ],
)  # fmt: skip
def test_the_sentence(fields: dict[str, Any], sentence: str) -> None:
    assert cause_of_death(header(**fields)) == sentence


def test_a_critical_xid_before_the_death_is_named(
    tmp_path: Path, backends: list[Backend], nvml: fake_driver.Driver
) -> None:
    """GPU 1 of two reports XID 79 (fell off the bus) half a second after the backend's monitor is
    ready; the backend is killed once a record carried it, and its postmortem names it."""
    directory = tmp_path / "postmortems"
    xid_at = time.time_ns() // 1000 + 1_000_000  # a second from now
    nvml.configure(devices=[{}, {"xids": [(79, xid_at)]}])
    backend = Backend(tmp_path, f"postmortem_dir={str(directory)!r}", categories=("cpu", "gpu"))
    backends.append(backend)
    backend.ready()
    wait_for(lambda: time.time_ns() // 1000 > xid_at + 500_000, what="the XID and a record after it")
    backend.proc.send_signal(signal.SIGKILL)
    err = ended(backend)
    [path] = files(directory)
    header, records = parse(path.read_text())
    (xid,) = header["gpu_xids"]
    assert (xid["gpu"], xid["xid"]) == (1, 79)
    assert records[xid["record"] - records[0]["record"]]["values"]["resource/gpu/1/xid_critical"] == 79
    assert all(r["values"].get("resource/gpu/0/xid_critical") == 0 for r in records)
    assert "GPU 1 reported critical XID 79" in err
    first = shown("--dir", str(directory))[0]
    print(f"postmortem --show: {first}")
    assert re.search(f"after XID 79 on GPU 1 at (or before )?step {header['last_logged_step']}$", first)


def test_an_older_postmortem_still_shows_and_says_it_recorded_no_cause(tmp_path: Path) -> None:
    write_postmortem(tmp_path, 1_700_000_000.0, 4242)  # a version 1 header: no exit, no memory_cgroup
    lines = shown("--dir", str(tmp_path))
    assert lines[0] == "vanished before any step was logged; the cause was not recorded (an older postmortem)"
    assert lines[1].startswith("postmortem 1: ") and "12.5" in lines[-1]
