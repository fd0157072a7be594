"""Issue 3: a child that crashes or hangs costs a gap in the curves, never the backend."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import fake_driver
import psutil
import pytest
from conftest import FAST, Recorder, free_ports, scrape, wait_for

import sampler
from ringbuf import segment
from sampler.store.reader import StoreReader
from sampler.supervision import reader, spawn

CPU = "resource/cpu/utilization_percent"
GPU_TEMP = "resource/gpu/0/temperature_celsius"
QUICK_RESTARTS = {"_restart_backoff": (0.05, 0.2)}
TESTS_DIR = str(Path(__file__).resolve().parent)


def fake_nvml(monkeypatch: pytest.MonkeyPatch, **config: object) -> None:
    """The Python stand-in for the binding, for what the C driver cannot do: hang with the GIL held."""
    monkeypatch.setenv("FAKE_NVML", json.dumps({"devices": [{}], **config}))


def driver(nvml: fake_driver.Driver, **config: object) -> None:
    nvml.configure(**{"devices": [{}], **config})


def count(sink: Recorder, name: str) -> int:
    return len(sink.values(name))


def test_a_killed_child_is_replaced() -> None:
    sink = Recorder()
    with sampler.ResourceMonitor(categories=["cpu"], sink=sink, step_source="seconds", **FAST) as monitor:
        first = wait_for(lambda: monitor.child_pid, what="the first child")
        wait_for(lambda: count(sink, CPU) >= 2)
        os.kill(first, signal.SIGKILL)
        killed_at = time.monotonic()
        second = wait_for(lambda: monitor.child_pid not in (None, first) and monitor.child_pid)
        print(f"new child {time.monotonic() - killed_at:.2f} s after the kill (the first backoff: 1 s)")
        before = count(sink, CPU)
        wait_for(lambda: count(sink, CPU) >= before + 2, what="samples from the new child")
        stats = monitor.stats()
    assert second != first
    assert stats["restarts"] == 1 and stats["restarts_by_cause"]["crash"] == 1
    (death,) = stats["deaths"]
    assert death["exit_code"] == -signal.SIGKILL and death["cause"] == "crash"
    assert stats["quarantined"] == []


def test_a_segfaulting_nvml_init_quarantines_gpu_after_three_crashes(
    nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash in no device's call (NVML's initialisation) is the whole category's."""
    driver(nvml, segfault={"nvmlInitWithFlags": True})
    sink = Recorder()
    options = {**FAST, **QUICK_RESTARTS}
    with sampler.ResourceMonitor(
        categories=["cpu", "gpu"], sink=sink, step_source="seconds", **options
    ) as monitor:
        wait_for(lambda: monitor.stats()["quarantined"] == ["gpu"], what="gpu quarantined")
        before = count(sink, CPU)
        wait_for(lambda: count(sink, CPU) >= before + 3, what="cpu signals after the quarantine")
        stats = monitor.stats()
    assert len(stats["deaths"]) == 3
    assert all(d["category"] == "gpu" and d["exit_code"] == -signal.SIGSEGV for d in stats["deaths"])
    assert stats["restarts_by_cause"]["crash"] == 3
    assert GPU_TEMP not in sink.names()
    warnings = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert len(warnings) == 1 and "gpu" in warnings[0] and "Re-enable" in warnings[0]


def test_a_hanging_call_is_killed_at_its_deadline_and_quarantined(nvml: fake_driver.Driver) -> None:
    driver(nvml, hang={"nvmlDeviceGetMemoryInfo": [0]})
    sink = Recorder()
    with sampler.ResourceMonitor(
        categories=["cpu", "gpu"],
        sink=sink,
        step_source="seconds",
        hang_deadline_seconds=0.5,
        **FAST,
        **QUICK_RESTARTS,
    ) as monitor:
        first = wait_for(lambda: monitor.child_pid, what="the first child")
        wait_for(lambda: monitor.stats()["deaths"], what="the hang to be detected")
        (death,) = monitor.stats()["deaths"]
        assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
        wait_for(lambda: monitor.stats()["gpus_quarantined"] == ["0"], what="GPU 0 quarantined")
        before = count(sink, CPU)
        wait_for(lambda: count(sink, CPU) >= before + 3, what="cpu signals after the quarantine")
        stats = monitor.stats()
    assert death["cause"] == "hang" and death["category"] == "gpu" and death["exit_code"] == -signal.SIGKILL
    assert death["lifetime_seconds"] >= 0.5  # not before its deadline
    assert stats["restarts_by_cause"]["hang"] == 3
    assert stats["quarantined"] == []


@pytest.mark.parametrize("how", ["hang", "segfault"])
def test_a_gpu_that_brings_the_child_down_is_quarantined_and_the_others_keep_reading(
    nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """Issue 26: the device quarantined, not the gpu category; the endpoint names it."""
    driver(nvml, devices=[{}, {}], **{how: {"nvmlDeviceGetPowerUsage": [1]}})
    sink = Recorder()
    port = free_ports()
    with sampler.ResourceMonitor(
        categories=["cpu", "gpu"],
        sink=sink,
        step_source="seconds",
        hang_deadline_seconds=0.5,
        prometheus_port=port,
        **FAST,
        **QUICK_RESTARTS,
    ) as monitor:
        wait_for(lambda: monitor.stats()["gpus_quarantined"] == ["1"], what="GPU 1 quarantined")
        before = count(sink, GPU_TEMP)
        wait_for(lambda: count(sink, GPU_TEMP) >= before + 3, what="GPU 0 read after the quarantine")
        stats = monitor.stats()
        parser = pytest.importorskip("prometheus_client.parser")
        quarantined = [
            sample.labels.get("gpu")
            for family in parser.text_string_to_metric_families(scrape(port))
            for sample in family.samples
            if sample.name == "wl_resource_monitor_gpu_quarantined" and sample.value == 1
        ]
        assert quarantined == ["1"]
    assert stats["quarantined"] == []
    assert len(stats["deaths"]) == 3
    warnings = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "GPU 1" in warnings[0] and "nvmlDeviceGetPowerUsage" in warnings[0] and "Re-enable" in warnings[0]


def test_a_hang_is_said_with_its_device_and_its_nvml_call(
    nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26: the line about a hung child names the GPU and the NVML call it hung in."""
    driver(nvml, devices=[{}, {}], hang={"nvmlDeviceGetPowerUsage": [1]})
    with sampler.ResourceMonitor(
        categories=["cpu", "gpu"],
        sink=Recorder(),
        step_source="seconds",
        hang_deadline_seconds=0.5,
        **FAST,
        **QUICK_RESTARTS,
    ) as monitor:
        wait_for(lambda: monitor.stats()["deaths"], what="the hang to be detected")
        (death, *_) = monitor.stats()["deaths"]
    assert death["call"] == "nvmlDeviceGetPowerUsage on GPU 1"
    (said, *_) = [r.getMessage() for r in caplog.records if "hung" in r.getMessage()]
    assert "in nvmlDeviceGetPowerUsage on GPU 1" in said, said


@pytest.mark.parametrize("holding_gil", [False, True], ids=["gil-free", "gil-held"])
def test_stop_during_a_hang_is_bounded(
    monkeypatch: pytest.MonkeyPatch, nvml: fake_driver.Driver, tmp_path: Path, holding_gil: bool
) -> None:
    """A hang in the driver (the C library, which the binding calls with the GIL released) lets
    the child's watchdog run and ends on STOP; one that holds the GIL (a binding's own Python
    stuck, the watchdog stuck too: only the Python fake can) only by the kill that follows."""
    hung = tmp_path / "hung"
    hang = {"hang": {"nvmlDeviceGetClockInfo": True}, "hang_marker": str(hung)}
    if holding_gil:
        fake_nvml(monkeypatch, **hang, hang_holding_gil=True)
    else:
        driver(nvml, **hang)
    monitor = sampler.ResourceMonitor(
        categories=["gpu"],
        sink=Recorder(),
        nvml_module="fake_nvml" if holding_gil else "pynvml",
        hang_deadline_seconds=60,
        **FAST,
    ).start()
    child = wait_for(lambda: monitor.child_pid, what="the child")
    wait_for(hung.exists, what="the child inside the call that never returns")
    began = time.monotonic()
    monitor.stop()
    took = time.monotonic() - began
    print(f"stop() took {took:.2f} s")
    assert took < 30  # bounded (about a second), not waiting for the 60 s deadline however loaded the machine
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_an_nvml_error_skips_one_reading_and_restarts_nothing(nvml: fake_driver.Driver) -> None:
    driver(nvml, devices=[{}, {}], fail={"nvmlDeviceGetTemperatureV": [0]})
    sink = Recorder()
    with sampler.ResourceMonitor(categories=["gpu"], sink=sink, step_source="seconds", **FAST) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 4)
        stats = monitor.stats()
    assert GPU_TEMP not in sink.names()
    assert "resource/gpu/0/sm_clock_mhz" in sink.names()
    assert "resource/gpu/1/temperature_celsius" in sink.names()
    assert stats["restarts"] == 0 and stats["deaths"] == []


def test_steps_do_not_repeat_across_a_restart() -> None:
    sink = Recorder()
    with sampler.ResourceMonitor(categories=["cpu"], sink=sink, age_source=lambda: 5, **FAST) as monitor:
        first = wait_for(lambda: monitor.child_pid)
        wait_for(lambda: monitor.stats()["records_dropped"] >= 2)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: monitor.stats()["restarts"] == 1)
        dropped = monitor.stats()["records_dropped"]
        wait_for(lambda: monitor.stats()["records_dropped"] >= dropped + 2, what="samples from the new child")
    assert sink.steps(CPU) == [5]


def test_a_slow_sink_never_slows_the_child_and_losses_are_counted() -> None:
    """The sink takes 0.5 s a record, the child makes one every 0.05 s: while the child makes
    40, the sink takes a handful. A child that waited for the sink would make them at its pace;
    a loaded machine slows the child, not the sink's sleep, so it would take a fivefold
    slowdown to bring the two paces within a factor two."""

    def slow(name: str, value: float, step: int) -> None:
        if name == "resource/cpu/utilization_percent":  # once per record, whatever else it carries
            time.sleep(0.5)

    options = {"interval_seconds": 0.05, "_min_interval_seconds": 0.01, "_ring_capacity": 4}
    with sampler.ResourceMonitor(categories=["cpu"], sink=slow, step_source="seconds", **options) as monitor:
        wait_for(lambda: monitor.stats()["records_read"] >= 1)
        start = monitor.stats()

        def made(now: dict[str, Any]) -> int:
            """Records the child made from ``start`` to ``now``: read, or lost to the full ring."""
            return now["records_read"] + now["records_lost"] - start["records_read"] - start["records_lost"]

        stats = wait_for(
            lambda: made(now := monitor.stats()) >= 40 and now,
            timeout=60,
            what="40 records made behind the slow sink",
        )
    assert stats["records_lost"] > 0
    # The sink really was the bottleneck, and the child kept its own pace.
    assert stats["records_logged"] - start["records_logged"] <= 0.5 * made(stats)


def test_self_report() -> None:
    with sampler.ResourceMonitor(categories=["cpu", "process"], sink=Recorder(), **FAST) as monitor:
        wait_for(lambda: monitor.stats()["records_read"] >= 3)
        stats = monitor.stats()
    assert stats["isolation"] == "process"
    assert 0 < stats["child_cpu_seconds_per_sample"] < 0.5
    assert 0 <= stats["seconds_since_last_record"] < 5
    assert stats["restarts_by_cause"] == {"crash": 0, "hang": 0, "start": 0}


def test_thread_isolation_samples_in_the_monitor_thread() -> None:
    sink = Recorder()
    with sampler.ResourceMonitor(
        categories=["cpu", "process"], sink=sink, isolation="thread", step_source="seconds", **FAST
    ) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 2)
        assert monitor.child_pid is None
        assert not [p for p in psutil.Process().children() if spawn.is_sampling_child(p.cmdline())]
        stats = monitor.stats()
    assert stats["isolation"] == "thread"
    assert {CPU, "resource/process/memory_in_use_mb"} <= sink.names()


def fallback_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "sampling in the backend thread" in r.getMessage()]


def test_no_shared_memory_in_the_backend_falls_back_to_thread(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(size: int) -> tuple[segment.Segment, int]:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segment.Segment, "create_anonymous", staticmethod(full))
    sink = Recorder()
    with sampler.ResourceMonitor(categories=["cpu"], sink=sink, step_source="seconds", **FAST) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 2)
        stats = monitor.stats()
    assert stats["isolation"] == "thread"
    (warning,) = fallback_warnings(caplog)
    assert "No space left" in warning


def test_no_subprocesses_falls_back_to_thread(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(spawn.os, "posix_spawn", forbidden)
    sink = Recorder()
    with sampler.ResourceMonitor(categories=["cpu"], sink=sink, step_source="seconds", **FAST) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 2)
    (warning,) = fallback_warnings(caplog)
    assert "cannot start the sampling child" in warning


def test_children_that_never_start_fall_back_to_thread(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    broken_python = tmp_path / "python"
    broken_python.write_text("#!/bin/sh\nexit 1\n")
    broken_python.chmod(0o755)
    monkeypatch.setattr(spawn.sys, "executable", str(broken_python))
    sink = Recorder()
    with sampler.ResourceMonitor(
        categories=["cpu"], sink=sink, step_source="seconds", **FAST, **QUICK_RESTARTS
    ) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 2)
        stats = monitor.stats()
    assert stats["isolation"] == "thread"
    assert [d["cause"] for d in stats["deaths"]] == ["start"] * 3
    assert len(fallback_warnings(caplog)) == 1


def test_a_child_that_cannot_create_its_ring_falls_back_to_thread(tmp_path: Path) -> None:
    """A file-size limit the status block fits under and the ring does not, as
    a memory limit would: the child says so in its status block and exits, and
    the backend samples in-thread instead of restarting it forever."""
    script = tmp_path / "backend.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import resource, sys, time
            sys.path.insert(0, {TESTS_DIR!r})
            import sampler
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # inherited by the child
            got = []
            with sampler.ResourceMonitor(categories=["cpu", "memory"], sink=lambda *a: got.append(a),
                                         step_source="seconds", interval_seconds=0.1,
                                         _min_interval_seconds=0.05) as mon:
                deadline = time.monotonic() + 20
                while len(got) < 4 and time.monotonic() < deadline:
                    time.sleep(0.02)
                stats = mon.stats()
                print(stats["isolation"], len(got), stats["child_exit_code"])
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    isolation, samples, code = done.stdout.split()
    assert isolation == "thread" and int(samples) >= 4 and code == "3"
    # The child's own line (through its log pipe, with the error) and the backend's fallback.
    assert "the sampling child cannot create its ring: [Errno 27]" in done.stderr
    assert "cannot create its ring in shared memory; sampling in the backend thread" in done.stderr


def test_what_a_silent_child_was_waited_for_is_cleared_by_its_first_record(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A child slow to start (here: the silence said at once, before it could sample) that
    then samples: from its first record, the monitor's health is ok again, in stats() and in
    the store that top reads (records a second apart: the first one's stats stand a while)."""
    monkeypatch.setattr(reader, "NO_RECORD_MIN_SECONDS", 0.0)
    monkeypatch.setattr(reader, "NO_RECORD_INTERVALS", 0)
    store = tmp_path / "runs.sqlite"
    options = {**FAST, "interval_seconds": 1.0}
    with sampler.ResourceMonitor(
        categories=["cpu"], sink=Recorder(), store=store, step_source="seconds", **options
    ) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 1, what="a record")
        assert "no sample 0 s after the sampling child started" in caplog.text
        assert monitor.stats()["waiting_for"] is None

        def stored() -> dict[str, Any] | None:
            """The run's stats in the store once they count a record."""
            with StoreReader(str(store)) as store_reader:
                stats = store_reader.run().stats
            return stats if stats is not None and stats["records_read"] >= 1 else None

        first = wait_for(stored, what="the stats of the first record in the store")
        assert first["waiting_for"] is None, first


def test_no_record_for_a_few_intervals_is_said_once_and_shown_in_stats(
    monkeypatch: pytest.MonkeyPatch, nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture
) -> None:
    """A child stuck in NVML's initialisation, with a hang deadline too long to
    catch it soon: the monitor must not stay silent meanwhile. It speaks once, at a fixed
    silence; a child still importing then (a loaded machine starts it slowly) says nothing
    of the stuck collector, and a longer silence is tried."""
    driver(nvml, hang={"nvmlInitWithFlags": True})
    for silence in (5.0, 20.0):
        monkeypatch.setattr(reader, "NO_RECORD_MIN_SECONDS", silence)
        caplog.clear()
        with sampler.ResourceMonitor(
            categories=["cpu", "gpu"], sink=Recorder(), hang_deadline_seconds=60, **FAST
        ) as monitor:
            waiting = wait_for(
                lambda: monitor.stats()["waiting_for"],
                timeout=silence + 15,
                what="stats to say what it waits for",
            )
            time.sleep(0.5)
            stats = monitor.stats()
        if "importing" not in waiting:
            break
    assert f"pid {stats['child_pid']}" in waiting and "gpu collector" in waiting
    assert stats["records_read"] == 0 and stats["deaths"] == []
    warnings = [r.getMessage() for r in caplog.records if "no sample" in r.getMessage()]
    assert len(warnings) == 1 and "gpu collector" in warnings[0], warnings
