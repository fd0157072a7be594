"""The process_tree category: a real backend process and real workers it forks, read through
/proc as the sampling child reads them."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import FAST, Recorder, backend_script, wait_for

import sampler
from sampler import catalogue
from sampler.catalogue import MIB
from sampler.collectors.tree import (
    SAMPLING_CHILD_PROGRAM,
    ProcessTreeCollector,
    read_stat,
    runs_a_sampling_child,
)
from sampler.supervision import spawn

ALWAYS = math.inf
"""``pss_cpu_share`` that makes every ``sample()`` a PSS pass."""
NEVER = 1e-12
"""``pss_cpu_share`` that leaves the first pass (at construction) the only one."""

BACKEND = r"""
import os, sys, time

held = []  # buffers touched: resident for good
workers = {}  # pid -> (commands to it, its replies)


def touch(mb):
    buf = bytearray(mb * 1024**2)
    buf[::4096] = b"\x01" * len(range(0, len(buf), 4096))  # one write per page: all resident
    held.append(buf)


def fork(depth):
    cmd_r, cmd_w = os.pipe()
    ack_r, ack_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(cmd_w)
        os.close(ack_r)
        workers.clear()
        try:
            if depth > 1:
                fork(depth - 1)
            replies = os.fdopen(ack_w, "w")
            replies.write("ready\n")  # with all its own workers
            replies.flush()
            serve(os.fdopen(cmd_r), replies)
        finally:
            os._exit(0)
    os.close(cmd_r)
    os.close(ack_w)
    workers[pid] = (os.fdopen(cmd_w, "w"), os.fdopen(ack_r))
    workers[pid][1].readline()
    return pid


def act(words):
    command, args = words[0], words[1:]
    if command == "to":  # to PID COMMAND...: forwarded to a worker of this process
        commands, replies = workers[int(args[0])]
        commands.write(" ".join(args[1:]) + "\n")
        commands.flush()
        return replies.readline().strip()
    if command == "touch":  # touch MB
        touch(int(args[0]))
    elif command == "free":  # every buffer touched, inherited ones included
        held.clear()
    elif command == "spin":  # spin SECONDS of CPU
        end = time.process_time() + float(args[0])
        while time.process_time() < end:
            pass
    elif command == "fork":  # fork DEPTH: a worker (with a worker of its own, ..., DEPTH deep)
        return str(fork(int(args[0])))
    elif command == "kill":  # kill PID REAP
        pid = int(args[0])
        os.kill(pid, 9)
        if args[1] == "1":
            os.waitpid(pid, 0)
    elif command == "reap":  # reap PID: wait for a worker killed without reaping it
        os.waitpid(int(args[0]), 0)
    return "ok"


def serve(commands, replies):
    for line in commands:
        words = line.split()
        replies.write(act(words) + "\n")
        replies.flush()
        if words[0] == "busy":
            while True:
                pass


serve(sys.stdin, sys.stdout)
"""


class Backend:
    """A backend process, in a session of its own, that forks workers and makes them (or itself)
    touch memory and burn CPU on command."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BACKEND],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.ask("touch", 0)  # answered once it has started and serves

    def ask(self, *words: object, worker: int | None = None) -> str:
        """Have the backend (or its ``worker``) run one command; its reply."""
        line = " ".join(map(str, words if worker is None else ("to", worker, *words)))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        assert reply, f"the backend died on {line!r}"
        return reply

    def fork(self, depth: int = 1) -> int:
        return int(self.ask("fork", depth))

    def close(self) -> None:
        """The backend and every process it started, whatever state they are in."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def backend() -> Iterator[Backend]:
    started = Backend()
    try:
        yield started
    finally:
        started.close()


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def rss_mb(procs: list[psutil.Process]) -> float:
    return sum(p.memory_info().rss for p in procs) / MIB


def pss_mb(procs: list[psutil.Process]) -> float:
    return sum(p.memory_full_info().pss for p in procs) / MIB


def cpu_seconds(collector: ProcessTreeCollector) -> float:
    """The tree's CPU time a record gives."""
    return dict(zip(collector.names, collector.sample(), strict=True))[catalogue.TREE_CPU_SECONDS.name]


def with_reaped(times: psutil._common.pcputimes) -> float:
    """User + system CPU time of a process and of the children it waited for."""
    return times.user + times.system + times.children_user + times.children_system


def test_names_and_what_is_tracked() -> None:
    collector = ProcessTreeCollector(os.getpid())
    assert collector.names == (
        "resource/process_tree/process_count",
        "resource/process_tree/cpu_utilization_percent",
        "resource/process_tree/memory_in_use_mb",
        "resource/process_tree/cpu_seconds",
    )
    assert collector.tracked == collector.names[1:3]
    assert collector.averaged == collector.tracked


def test_counts_the_backend_and_every_live_descendant(backend: Backend) -> None:
    collector = ProcessTreeCollector(backend.pid)
    assert collector.sample()[0] == 1
    backend.fork()
    backend.fork()
    backend.fork(depth=3)  # a worker, its worker and that one's
    assert collector.sample()[0] == 1 + 2 + 3


def test_a_worker_that_touches_150_mb_counts_in_memory(backend: Backend) -> None:
    collector = ProcessTreeCollector(backend.pid, pss_cpu_share=ALWAYS)
    before = collector.sample()[2]
    worker = backend.fork()
    backend.ask("touch", 150, worker=worker)
    after = collector.sample()[2]
    assert after - before == pytest.approx(150, abs=15)
    assert after == pytest.approx(pss_mb(tree(backend.pid)), abs=5)


def test_memory_touched_between_records_shows_in_the_tracked_reading(backend: Backend) -> None:
    worker = backend.fork()
    collector = ProcessTreeCollector(backend.pid, pss_cpu_share=ALWAYS)
    recorded = collector.sample()[2]
    assert collector.sample_tracked()[1] == pytest.approx(recorded, abs=2)
    backend.ask("touch", 150, worker=worker)
    assert collector.sample_tracked()[1] - recorded == pytest.approx(150, abs=10)
    backend.ask("touch", 100)
    assert collector.sample_tracked()[1] - recorded == pytest.approx(250, abs=15)
    assert collector.sample()[2] - recorded == pytest.approx(250, abs=15)


def test_pages_a_parent_shares_with_its_forked_workers_count_once(backend: Backend) -> None:
    backend.ask("touch", 200)
    for _ in range(4):
        backend.fork()
    collector = ProcessTreeCollector(backend.pid, pss_cpu_share=ALWAYS)
    memory = collector.sample()[2]
    procs = tree(backend.pid)
    assert rss_mb(procs) > 5 * 200  # what summing RSS would say: a copy per process
    assert 200 < memory < 200 + 60  # one copy, and five interpreters' own pages
    assert collector.sample_tracked()[1] == pytest.approx(memory, abs=5)


def test_between_passes_forked_workers_count_only_their_growth_and_exits_keep_shared_pages(
    backend: Backend,
) -> None:
    backend.ask("touch", 200)
    collector = ProcessTreeCollector(backend.pid, pss_cpu_share=NEVER)  # the pass at start, no more
    alone = collector.sample()[2]
    workers = [backend.fork() for _ in range(3)]
    assert collector.sample()[2] == pytest.approx(alone, abs=10)  # not 3 more copies of 200 MB
    backend.ask("touch", 100, worker=workers[0])
    assert collector.sample()[2] - alone == pytest.approx(100, abs=15)
    for worker in workers:
        collector.sample()
        backend.ask("kill", worker, 1)
    assert collector.sample()[2] == pytest.approx(alone, abs=10)


def test_a_worker_freeing_its_inherited_pages_between_passes_takes_nothing_off(backend: Backend) -> None:
    backend.ask("touch", 200)
    collector = ProcessTreeCollector(backend.pid, pss_cpu_share=NEVER)
    alone = collector.sample()[2]
    worker = backend.fork()
    collector.sample()  # found with the 200 MB it inherited resident
    backend.ask("free", worker=worker)  # its RSS falls by 200 MB, which the backend still holds
    assert collector.sample_tracked()[1] == pytest.approx(alone, abs=10)
    assert collector.sample()[2] == pytest.approx(alone, abs=10)


def test_an_exited_workers_shared_pages_stay_counted_in_the_tracked_reading(backend: Backend) -> None:
    backend.ask("touch", 200)
    worker = backend.fork()
    collector = ProcessTreeCollector(backend.pid, pss_cpu_share=NEVER)
    both = collector.sample_tracked()[1]
    backend.ask("kill", worker, 1)
    # each held half of the 200 MB: the backend's PSS, read before, is now short of the worker's half
    assert collector.sample_tracked()[1] == pytest.approx(both, abs=10)


def test_cpu_rises_with_a_busy_worker_in_both_readings(backend: Backend) -> None:
    worker = backend.fork()
    collector = ProcessTreeCollector(backend.pid)
    backend.ask("busy", worker=worker)
    wait_for(lambda: collector.sample()[1] > 50, what="a busy worker in the record's CPU %")
    wait_for(lambda: collector.sample_tracked()[0] > 50, what="a busy worker in the tracked CPU %")


def test_tracked_reads_do_not_shorten_the_records_cpu_window(backend: Backend) -> None:
    began = time.monotonic()
    collector = ProcessTreeCollector(backend.pid)
    collector.sample()
    backend.ask("spin", 0.3)  # 0.3 s of CPU, however long the machine takes to give it
    busy = collector.sample_tracked()[0]
    time.sleep(time.monotonic() - began)  # an idle half as long as the busy one, however long that took
    idle = collector.sample_tracked()[0]
    recorded = collector.sample()[1]
    window = time.monotonic() - began  # at least the record's window
    assert recorded >= 0.9 * 100 * 0.3 / window
    assert idle < busy


def test_a_worker_born_between_records_counts_its_cpu_from_birth(backend: Backend) -> None:
    collector = ProcessTreeCollector(backend.pid)
    began = time.monotonic()
    collector.sample()
    worker = backend.fork()
    backend.ask("spin", 0.3, worker=worker)
    recorded = collector.sample()[1]
    assert recorded >= 0.9 * 100 * 0.3 / (time.monotonic() - began)


def test_a_reused_pid_is_a_new_process(backend: Backend) -> None:
    last_pid = Path("/proc/sys/kernel/ns_last_pid")  # the pid before the next one the kernel gives
    old = backend.fork()
    backend.ask("spin", 0.5, worker=old)
    began = time.monotonic()
    collector = ProcessTreeCollector(backend.pid)  # knows the old worker, 0.5 s of CPU used
    backend.ask("kill", old, 1)
    for _ in range(20):
        try:
            last_pid.write_text(str(old - 1))
        except OSError:
            pytest.skip("needs to write /proc/sys/kernel/ns_last_pid (root)")
        new = backend.fork()
        if new == old:
            break
        backend.ask("kill", new, 1)  # another process took the pid first
    else:
        pytest.skip("could not have the pid given again")
    backend.ask("spin", 0.3, worker=new)
    assert collector.sample_tracked()[0] >= 0  # the old worker's handle now reads the new one
    recorded = collector.sample()[1]
    # counted from its birth, not from the 0.5 s its namesake had used
    assert recorded >= 0.9 * 100 * 0.3 / (time.monotonic() - began)


def test_a_worker_that_exits_between_scans_is_dropped_not_nan(backend: Backend) -> None:
    stays, goes = backend.fork(), backend.fork()
    backend.ask("touch", 100, worker=goes)
    collector = ProcessTreeCollector(backend.pid, pss_cpu_share=ALWAYS)
    count, _, memory, _ = collector.sample()
    assert count == 3
    backend.ask("kill", goes, 1)
    tracked = collector.sample_tracked()
    assert not any(math.isnan(v) for v in tracked)
    assert memory - tracked[1] == pytest.approx(100, abs=15)
    count, cpu, memory, _ = collector.sample()
    assert count == 2 and not math.isnan(cpu)
    assert memory == pytest.approx(pss_mb(tree(backend.pid)), abs=5)
    assert stays in {p.pid for p in tree(backend.pid)}


def test_a_dead_worker_not_yet_reaped_is_not_counted(backend: Backend) -> None:
    worker = backend.fork()
    collector = ProcessTreeCollector(backend.pid)
    assert collector.sample()[0] == 2
    backend.ask("kill", worker, 0)  # a zombie until the backend waits for it
    wait_for(lambda: psutil.Process(worker).status() == psutil.STATUS_ZOMBIE, what="a zombie")
    assert not any(math.isnan(v) for v in collector.sample_tracked())
    assert collector.sample()[0] == 1


def test_cpu_time_keeps_an_exited_workers_time_as_a_zombie_then_in_its_reaper_once(
    backend: Backend,
) -> None:
    collector = ProcessTreeCollector(backend.pid)
    worker = backend.fork()
    backend.ask("spin", 0.5, worker=worker)
    spun = cpu_seconds(collector)
    backend.ask("kill", worker, 0)  # a zombie until the backend waits for it
    wait_for(lambda: psutil.Process(worker).status() == psutil.STATUS_ZOMBIE, what="a zombie")
    times = psutil.Process(worker).cpu_times()
    worked = times.user + times.system
    assert worked >= 0.45
    dead = cpu_seconds(collector)
    backend.ask("reap", worker)
    before = with_reaped(psutil.Process(backend.pid).cpu_times())
    reaped = cpu_seconds(collector)
    after = with_reaped(psutil.Process(backend.pid).cpu_times())
    assert spun <= dead <= reaped
    assert reaped - spun < 0.25  # the worker's time counted once, not again in its reaper's
    assert before - 1e-6 <= reaped <= after + 1e-6  # the backend alone now: its own and its reaped
    assert cpu_seconds(ProcessTreeCollector(backend.pid)) >= worked  # read anew: in the reaper's times


def test_cpu_time_never_falls_when_a_member_leaves_the_tree_with_its_time(backend: Backend) -> None:
    collector = ProcessTreeCollector(backend.pid)
    middle = backend.fork()
    orphan = int(backend.ask("fork", 1, worker=middle))
    backend.ask("to", orphan, "spin", 0.4, worker=middle)
    held = cpu_seconds(collector)
    backend.ask("kill", middle, 1)  # reaped by the backend; its worker is orphaned, reparented outside
    wait_for(lambda: orphan not in {p.pid for p in tree(backend.pid)}, what="the orphan out of the tree")
    assert held - cpu_seconds(ProcessTreeCollector(backend.pid)) >= 0.3  # the orphan took its time along
    readings = [cpu_seconds(collector) for _ in range(3)]
    assert held <= readings[0] <= readings[1] <= readings[2]
    assert readings[-1] - held < 0.25


def test_readings_are_nan_once_the_backend_is_gone(backend: Backend) -> None:
    backend.fork()  # a worker that outlives it
    collector = ProcessTreeCollector(backend.pid)
    collector.sample()
    backend.proc.kill()
    wait_for(lambda: psutil.Process(backend.pid).status() == psutil.STATUS_ZOMBIE, what="a zombie")
    assert all(math.isnan(v) for v in collector.sample())
    assert all(math.isnan(v) for v in collector.sample_tracked())
    with pytest.raises(psutil.NoSuchProcess):
        ProcessTreeCollector(backend.pid)  # a zombie: gone
    backend.proc.wait()
    assert all(math.isnan(v) for v in collector.sample())
    assert all(math.isnan(v) for v in collector.sample_tracked())
    with pytest.raises(psutil.NoSuchProcess):
        ProcessTreeCollector(backend.pid)


def test_a_process_without_readable_pss_counts_its_rss(backend: Backend, tmp_path: Path) -> None:
    backend.ask("touch", 200)
    missing, malformed = backend.fork(), backend.fork()
    (tmp_path / str(backend.pid)).mkdir()
    (tmp_path / str(backend.pid) / "smaps_rollup").symlink_to(f"/proc/{backend.pid}/smaps_rollup")
    (tmp_path / str(malformed)).mkdir()
    (tmp_path / str(malformed) / "smaps_rollup").write_text("Pss: lots\n")
    collector = ProcessTreeCollector(backend.pid, procfs=str(tmp_path), pss_cpu_share=ALWAYS)
    memory = collector.sample()[2]
    root, *workers = tree(backend.pid)
    assert {p.pid for p in workers} == {missing, malformed}
    assert memory == pytest.approx(pss_mb([root]) + rss_mb(workers), abs=5)
    assert memory > 2 * 200  # the shared pages count in full in each worker's RSS


def test_no_smaps_rollup_anywhere_gives_the_rss_sum(backend: Backend, tmp_path: Path) -> None:
    backend.ask("touch", 100)
    backend.fork()
    collector = ProcessTreeCollector(backend.pid, procfs=str(tmp_path), pss_cpu_share=ALWAYS)
    assert collector.sample()[2] == pytest.approx(rss_mb(tree(backend.pid)), abs=5)


def test_pss_is_read_again_when_the_last_reads_cost_allows(backend: Backend, tmp_path: Path) -> None:
    rollup = tmp_path / str(backend.pid) / "smaps_rollup"
    rollup.parent.mkdir()
    rollup.write_text("Pss: 10240 kB\n")
    frugal = ProcessTreeCollector(backend.pid, procfs=str(tmp_path), pss_cpu_share=NEVER)
    cheap = ProcessTreeCollector(backend.pid, procfs=str(tmp_path))  # a read of microseconds
    rollup.write_text("Pss: 20480 kB\n")
    assert frugal.sample()[2] == pytest.approx(10, abs=2)  # the reading at start, RSS unchanged since
    # Read again once the time since allows for what the last read cost (microseconds of CPU).
    wait_for(lambda: cheap.sample()[2] == 20, what="PSS read again")


def test_the_sampling_child_is_not_part_of_the_tree() -> None:
    """The child is the backend's child too; the tree it reports is the backend's without it."""
    sink = Recorder()
    with sampler.ResourceMonitor(
        **FAST, sink=sink, step_source="seconds", categories=["process_tree"], postmortem_dir=None
    ) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 2, what="two records")
        descendants = {p.pid for p in psutil.Process().children(recursive=True)}
        assert monitor.child_pid in descendants
        # Other long-lived children of this test process (a resource tracker, say) do count.
        others = len(descendants - {monitor.child_pid})
        wait_for(lambda: monitor.stats()["records_logged"] >= 4, what="two more records")
    assert sink.values(catalogue.TREE_PROCESSES.name)[-1] == 1 + others


def test_the_watched_backends_own_sampling_child_is_not_part_of_its_tree(tmp_path: Path) -> None:
    """``run --pid`` on a backend that runs a monitor of its own: that monitor's sampling child is
    the backend's child, and no more part of the training than this collector's own; a worker is."""
    script = tmp_path / "backend.py"
    script.write_text(
        backend_script("""
        import subprocess
        reads = [sys.executable, "-c", "import sys; sys.stdin.read()"]
        worker = subprocess.Popen(reads, stdin=subprocess.PIPE)
        monitor = sampler.ResourceMonitor(categories=["cpu"], step_source="seconds", postmortem_dir=None,
                                          interval_seconds=0.1, _min_interval_seconds=0.05).start()
        while monitor.child_pid is None:
            time.sleep(0.01)
        print(worker.pid, monitor.child_pid, flush=True)
        sys.stdin.read()
        monitor.stop()
        worker.stdin.close()
        worker.wait()
        """)
    )
    backend = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert backend.stdin is not None and backend.stdout is not None
    try:
        worker, child = map(int, backend.stdout.readline().split())
        assert spawn.is_sampling_child(psutil.Process(child).cmdline())
        assert {p.pid for p in psutil.Process(backend.pid).children(recursive=True)} == {worker, child}
        collector = ProcessTreeCollector(backend.pid)
        assert collector.sample()[0] == 2  # the backend and its worker
    finally:
        backend.stdin.close()
        backend.wait(timeout=30)
        backend.stdout.close()


def test_every_sampling_child_command_line_is_recognised() -> None:
    assert runs_a_sampling_child(spawn.child_argv())
    assert not runs_a_sampling_child([sys.executable, "-c", "print('hi')"])
    assert not runs_a_sampling_child([sys.executable, "train.py", "-c", SAMPLING_CHILD_PROGRAM])
    assert not runs_a_sampling_child([])


# --- the one-file reading of a process's CPU time and RSS ----------------------------------------


def test_read_stat_gives_what_psutil_reads_from_two_files_whatever_the_command_name(tmp_path: Path) -> None:
    odd = tmp_path / "x) (y z"  # the name shows in stat between parentheses, spaces and all
    odd.symlink_to(sys.executable)
    busy = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
        "print(1, flush=True)\ntime.sleep(60)"
    )
    proc = subprocess.Popen([str(odd), "-c", busy], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "1\n"  # 0.3 s of CPU spent, now idle
        reading = read_stat(Path(f"/proc/{proc.pid}/stat"))
        ps = psutil.Process(proc.pid)
        assert ps.name().startswith("x) (y z")
        times, rss = ps.cpu_times(), ps.memory_info().rss
        assert reading is not None and not reading.zombie
        assert reading.cpu_seconds == pytest.approx(times.user + times.system, abs=0.02)
        assert reading.cpu_seconds >= 0.29 and reading.reaped_cpu_seconds == 0
        assert reading.rss_bytes == pytest.approx(rss, abs=MIB)  # per-CPU RSS counters, summed approximately
    finally:
        proc.kill()
        proc.wait()


def test_read_stat_flags_a_zombie_and_is_none_for_a_process_gone_and_a_file_it_cannot_parse(
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_for(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE, what="a zombie")
        times = psutil.Process(proc.pid).cpu_times()
        zombie = read_stat(Path(f"/proc/{proc.pid}/stat"))  # exited, not reaped: its CPU times stay
        assert zombie is not None and zombie.zombie
        assert zombie.cpu_seconds == pytest.approx(times.user + times.system, abs=1e-9)
    finally:
        proc.wait()
    assert read_stat(Path(f"/proc/{proc.pid}/stat")) is None  # reaped: the file is gone
    garbled = tmp_path / "stat"
    garbled.write_bytes(b"123 (python) S 1 2 3 x y")
    assert read_stat(garbled) is None  # too few fields
    garbled.write_bytes(b"123 (python) S" + b" ?" * 30)
    assert read_stat(garbled) is None  # no numbers where the times and RSS are
