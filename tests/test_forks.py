"""Issue 7: a backend that forks (DataLoader workers, multiprocessing, os.fork)
can neither blind, stop nor keep alive its monitor.

Each case runs in a backend process of its own, so the forks stay out of the
test runner. The scripts print one JSON line of results.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import backend_script, gone, wait_for

import sampler

FAST = "interval_seconds=0.1, _min_interval_seconds=0.05"


def run_backend(tmp_path: Path, body: str, timeout: float = 60, prelude: str = "") -> dict[str, Any]:
    script = tmp_path / "backend.py"
    script.write_text(backend_script(prelude) + textwrap.dedent(body))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


# Forked workers that hold every descriptor the backend had when they forked,
# for as long as a persistent DataLoader worker would.
FORK_STORM = """
import json
workers = []
def fork_storm(n, hold):
    parent = os.getpid()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            deadline = time.monotonic() + hold
            while os.getppid() == parent and time.monotonic() < deadline:
                time.sleep(0.1)
            os._exit(0)
        workers.append(pid)
def reap():
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
"""


def test_a_fork_storm_during_start_cannot_blind_the_monitor(tmp_path: Path) -> None:
    """The monitor thread spawns its child while the main thread forks as fast
    as it can; every worker lives on. Records must flow within seconds."""
    result = run_backend(
        tmp_path,
        f"""
        got = []
        rounds = []
        for attempt in range(5):
            mon = sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: got.append(a),
                                          step_source="seconds", {FAST})
            before = len(got)
            mon.start()
            fork_storm(40, hold=30)
            deadline = time.monotonic() + 10
            while len(got) < before + 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            rounds.append(len(got) - before)
            mon.stop()
        reap()
        print(json.dumps({{"rounds": rounds}}))
        """,
        timeout=120,
        prelude=FORK_STORM,
    )
    assert all(n >= 3 for n in result["rounds"]), result


def test_a_fork_storm_during_a_restart_cannot_blind_the_monitor(tmp_path: Path) -> None:
    result = run_backend(
        tmp_path,
        f"""
        import json
        got = []
        mon = sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: got.append(a),
                                      step_source="seconds", _restart_backoff=(0.05, 0.2), {FAST}).start()
        while len(got) < 2:
            time.sleep(0.01)
        first = mon.child_pid
        os.kill(first, signal.SIGKILL)
        storm_until = time.monotonic() + 3
        while mon.child_pid in (None, first) and time.monotonic() < storm_until:
            fork_storm(5, hold=30)  # the restart happens during the storm
        deadline = time.monotonic() + 60  # a child's start: tens of seconds on a loaded machine
        def restarted():
            return mon.child_pid not in (None, first) and mon.stats()["records_read"] >= 5
        while not restarted() and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = mon.stats()
        mon.stop()
        reap()
        print(json.dumps({{"restarts": stats["restarts"], "records": stats["records_read"],
                          "deaths": [d["cause"] for d in stats["deaths"]]}}))
        """,
        timeout=120,
        prelude=FORK_STORM,
    )
    assert result["restarts"] == 1 and result["deaths"] == ["crash"], result
    assert result["records"] >= 5, result


def test_a_worker_forked_while_the_child_starts_cannot_hide_its_death(tmp_path: Path) -> None:
    """A fork that lands in the one window where the child's end of the channel
    exists in the backend (forced here: right after the spawn) keeps a copy of
    it, so EOF never comes. The child's death must still be seen at once, as a
    crash, not minutes later as a hang."""
    result = run_backend(
        tmp_path,
        f"""
        import json
        real_spawn = os.posix_spawn
        holders = []
        def spawn_then_fork(*args, **kwargs):
            pid = real_spawn(*args, **kwargs)
            holder = os.fork()
            if holder == 0:
                time.sleep(60)
                os._exit(0)
            holders.append(holder)
            return pid
        os.posix_spawn = spawn_then_fork
        got = []
        mon = sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: got.append(a),
                                      step_source="seconds", hang_deadline_seconds=30,
                                      _restart_backoff=(0.05, 0.2), {FAST}).start()
        while len(got) < 2:
            time.sleep(0.01)
        first = mon.child_pid
        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        while mon.stats()["restarts"] < 1 and time.monotonic() < killed + 20:
            time.sleep(0.01)
        seen_after = time.monotonic() - killed
        stats = mon.stats()
        mon.stop()
        for pid in holders:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        print(json.dumps({{"seen_after": seen_after, "deaths": [d["cause"] for d in stats["deaths"]],
                          "holders": len(holders)}}))
        """,
    )
    # Seen as a crash within the 20 s waited: a death seen only by its missed deadline is a hang (30 s).
    assert result["holders"] >= 2 and result["deaths"] == ["crash"], result


@pytest.mark.parametrize("how", ["os._exit", "sys.exit", "stop_resource_monitor", "stop", "exception"])
def test_whatever_an_os_fork_child_does_the_parent_keeps_logging(tmp_path: Path, how: str) -> None:
    """The forked copy inherits the monitor, its atexit hook and its
    descriptors; stopping or exiting there must not touch the parent's."""
    action = {
        "os._exit": "os._exit(0)",  # as multiprocessing workers leave
        "sys.exit": "sys.exit(0)",  # interpreter exit runs the inherited atexit hooks
        "stop_resource_monitor": "sampler.stop_resource_monitor()",
        "stop": "mon.stop(); mon.stop()",
        "exception": "raise RuntimeError('worker failed')",
    }[how]
    result = run_backend(
        tmp_path,
        f"""
        import json, subprocess
        got = []
        sampler.signals.subscribe(lambda *a: got.append(a))
        os.environ["WL_RESOURCE_MONITOR_STEP_SOURCE"] = "seconds"
        os.environ["WL_RESOURCE_MONITOR_CATEGORIES"] = "cpu"
        os.environ["WL_RESOURCE_MONITOR_INTERVAL_SECONDS"] = "1"
        os.environ["WL_RESOURCE_MONITOR_CONFIG_PATH"] = os.getcwd()
        mon = sampler.start_resource_monitor_from_config()
        while not got:
            time.sleep(0.01)
        pid = os.fork()
        if pid == 0:
            inert = [mon.running, mon.child_pid, sampler.get_resource_monitor() is None]
            with open("child.json", "w") as f:
                json.dump(inert, f)
            {action}
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        before = len(got)
        deadline = time.monotonic() + 30  # two more records (1 s apart), however loaded the machine
        while len(got) < before + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        after = len(got)
        running = mon.running
        sampler.stop_resource_monitor()  # must not raise
        with open("child.json") as f:
            inert = json.load(f)
        print(json.dumps({{"before": before, "after": after, "running": running, "inert": inert}}))
        """,
    )
    assert result["running"] and result["after"] >= result["before"] + 2, result
    assert result["inert"] == [False, None, True], result
    assert "BrokenPipeError" not in result["stderr"]


@pytest.mark.parametrize("exit_how", ["return", "sys.exit(3)", "raise"])
def test_multiprocessing_fork_workers_leave_the_parents_monitor_alone(tmp_path: Path, exit_how: str) -> None:
    result = run_backend(
        tmp_path,
        f"""
        import json, multiprocessing as mp
        def work(n):
            if {exit_how!r} == "sys.exit(3)":
                sys.exit(3)
            if {exit_how!r} == "raise":
                raise ValueError("worker failed")
            mon.stop()  # a worker tidying up what it inherited
            return n

        if __name__ == "__main__":
            got = []
            mon = sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: got.append(a),
                                          step_source="seconds", {FAST}).start()
            while not got:
                time.sleep(0.01)
            ctx = mp.get_context("fork")
            procs = [ctx.Process(target=work, args=(i,)) for i in range(4)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            before = len(got)
            deadline = time.monotonic() + 30  # four more records (0.1 s apart), however loaded the machine
            while len(got) < before + 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            after = len(got)
            print(json.dumps({{"before": before, "after": after, "running": mon.running,
                              "codes": [p.exitcode for p in procs]}}))
            mon.stop()
        """,
    )
    assert result["running"] and result["after"] >= result["before"] + 4, result


def test_starting_a_monitor_in_a_forked_copy_starts_a_fresh_one(tmp_path: Path) -> None:
    result = run_backend(
        tmp_path,
        """
        import json
        os.environ["WL_RESOURCE_MONITOR_CONFIG_PATH"] = os.getcwd()
        os.environ["WL_RESOURCE_MONITOR_CATEGORIES"] = "cpu"
        os.environ["WL_RESOURCE_MONITOR_INTERVAL_SECONDS"] = "1"
        parent = sampler.start_resource_monitor_from_config()
        while parent.child_pid is None:
            time.sleep(0.01)
        pid = os.fork()
        if pid == 0:
            mine = sampler.start_resource_monitor_from_config()
            deadline = time.monotonic() + 60  # a child's start: tens of seconds on a loaded machine
            while mine.stats()["records_read"] < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            report = {"fresh": mine is not parent, "records": mine.stats()["records_read"],
                      "child_pid": mine.child_pid}
            sampler.stop_resource_monitor()
            with open("fork.json", "w") as f:
                json.dump(report, f)
            os._exit(0)
        os.waitpid(pid, 0)
        with open("fork.json") as f:
            report = json.load(f)
        report["parent_child_pid"] = parent.child_pid
        report["parent_running"] = parent.running
        sampler.stop_resource_monitor()
        print(json.dumps(report))
        """,
    )
    assert result["fresh"] and result["records"] >= 1 and result["parent_running"], result
    assert result["child_pid"] not in (None, result["parent_child_pid"]), result


def test_the_child_leaves_a_sigkilled_backend_with_live_workers(tmp_path: Path) -> None:
    """Within a second on an idle machine; the bound is for a loaded one, and still far short of
    the workers' 60 s, which a child that waited for its channel's end would take."""
    script = tmp_path / "backend.py"
    script.write_text(
        backend_script(
            """
            mon = sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: None,
                                          interval_seconds=60).start()
            while mon.stats()["records_read"] < 1:
                time.sleep(0.01)
            workers = []
            for _ in range(4):
                pid = os.fork()
                if pid == 0:
                    time.sleep(60)  # a persistent worker, holding every inherited descriptor
                    os._exit(0)
                workers.append(pid)
            print(mon.child_pid, *workers, flush=True)
            time.sleep(120)
            """
        )
    )
    backend = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        assert backend.stdout is not None
        child, *workers = map(int, backend.stdout.readline().split())
        backend.send_signal(signal.SIGKILL)
        backend.wait(10)
        killed_at = time.monotonic()
        wait_for(lambda: gone(child), timeout=20, what="the child to leave after the backend died")
        print(f"child gone {time.monotonic() - killed_at:.3f} s after the backend was killed")
        assert not any(gone(w) for w in workers)  # the workers really were alive all along
    finally:
        backend.kill()
        backend.wait()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_fork_while_another_thread_holds_a_lock_leaves_the_copy_usable() -> None:
    """Locks are copied held when another thread holds them at the fork; the
    copy's own calls must not wait forever for a thread it does not have."""
    from sampler import signals
    from sampler.api import monitor

    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with signals._lock, monitor._singleton_lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    try:
        pid = os.fork()
        if pid == 0:
            signal.alarm(5)  # a deadlock ends the copy with SIGALRM instead of hanging the test
            off = sampler.signals.subscribe(lambda *a: None)
            off()
            sampler.stop_resource_monitor()
            os._exit(0 if sampler.get_resource_monitor() is None else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0
