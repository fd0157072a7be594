"""The process category describes the backend, not the sampling child."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import FAST, Recorder, wait_for

import sampler
from sampler.collectors import process
from sampler.collectors.process import ProcessCollector

RSS = "resource/process/memory_in_use_mb"
THREADS = "resource/process/cpu_threads_in_use"


def logged_records(monitor: sampler.ResourceMonitor) -> int:
    return int(monitor.stats()["records_logged"])


def test_memory_in_use_follows_a_300_mb_allocation_in_the_backend() -> None:
    sink = Recorder()
    with sampler.ResourceMonitor(sink=sink, categories=["process"], step_source="seconds", **FAST) as mon:
        wait_for(lambda: logged_records(mon) >= 2)
        before = sink.values(RSS)[-1]
        block = np.ones(300 * 1024**2 // 8)  # touched: really resident
        seen = logged_records(mon)
        wait_for(lambda: logged_records(mon) >= seen + 2)
        during = sink.values(RSS)[-1]
        del block
    assert during - before == pytest.approx(300, abs=60)
    own = psutil.Process().memory_info().rss / 1024**2
    assert during - 300 == pytest.approx(own, abs=60)  # the backend's RSS, not the ~35 MB child's


def test_thread_count_is_the_backends() -> None:
    sink = Recorder()
    release = threading.Event()
    extra = [threading.Thread(target=release.wait) for _ in range(7)]
    with sampler.ResourceMonitor(sink=sink, categories=["process"], step_source="seconds", **FAST) as mon:
        wait_for(lambda: logged_records(mon) >= 2)
        baseline = sink.values(THREADS)[-1]
        assert baseline == psutil.Process(os.getpid()).num_threads()
        for t in extra:
            t.start()
        seen = logged_records(mon)
        wait_for(lambda: logged_records(mon) >= seen + 2)
        with_extra = sink.values(THREADS)[-1]
        release.set()
        for t in extra:
            t.join()
    assert with_extra == baseline + 7


def test_cpus_allowed_follow_the_backends_affinity() -> None:
    name = "resource/process/cpu_cores_allowed"
    collector = ProcessCollector(os.getpid())
    before = os.sched_getaffinity(0)
    try:
        assert dict(zip(collector.names, collector.sample(), strict=True))[name] == len(before)
        os.sched_setaffinity(0, {min(before)})
        assert dict(zip(collector.names, collector.sample(), strict=True))[name] == 1
    finally:
        os.sched_setaffinity(0, before)


def test_cpu_seconds_are_the_backends_own_user_and_system_time() -> None:
    name = "resource/process/cpu_seconds"
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)  # a child's time, reaped: not the backend's
    until = time.process_time() + 0.2
    while time.process_time() < until:
        pass
    collector = ProcessCollector(os.getpid())
    before = psutil.Process().cpu_times()
    seconds = dict(zip(collector.names, collector.sample(), strict=True))[name]
    after = psutil.Process().cpu_times()
    assert before.children_user + before.children_system >= 0.1
    assert before.user + before.system <= seconds <= after.user + after.system
    assert seconds >= 0.2


@pytest.mark.usefixtures("whole_machine")
def test_cpu_wait_is_the_share_of_time_the_main_thread_waited_for_a_cpu() -> None:
    name = "resource/process/cpu_wait_percent"
    collector = ProcessCollector(os.getpid())
    assert 0 <= dict(zip(collector.names, collector.sample(), strict=True))[name] <= 100  # since it was built

    def waited_while_working(seconds: float) -> float:
        collector.sample()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            pass
        return dict(zip(collector.names, collector.sample(), strict=True))[name]

    before = os.sched_getaffinity(0)
    core = min(before)
    os.sched_setaffinity(0, {core})
    try:
        alone = waited_while_working(0.5)
        spin = f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile 1: pass"
        busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(4)]
        try:
            starved = waited_while_working(1.0)
        finally:
            for process in busy:
                process.kill()
                process.wait()
    finally:
        os.sched_setaffinity(0, before)
    # Sharing one core with four more spinning processes, it waits about four fifths of the time;
    # on a loaded machine it already waited some of it alone, and waits a good part of the rest.
    assert starved > max(60, alone + 0.3 * (100 - alone)), (alone, starved)


def test_a_cpu_list_is_counted_and_an_unreadable_status_skips_its_readings(tmp_path: Path) -> None:
    assert process._cpu_count(b"0-3,8,10-11") == 7 and process._cpu_count(b"5") == 1
    collector = ProcessCollector(os.getpid())
    status = tmp_path / "status"
    status.write_text("Cpus_allowed_list:\t0-x\nVmHWM:\t 1000 kB\n")
    collector._status = str(status)  # what a kernel writing something else would give
    values = dict(zip(collector.names, collector.sample(), strict=True))
    assert math.isnan(values["resource/process/cpu_cores_allowed"])
    assert all(math.isnan(mark) for mark in collector.marks())
    assert not math.isnan(values["resource/process/memory_in_use_mb"])  # the other readings flow
