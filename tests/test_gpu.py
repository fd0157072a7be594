"""GPU collection through an NVML module imitating pynvml (no GPU on this machine)."""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from signal import SIGKILL

import fake_driver
import fake_nvml
import psutil
import pynvml
import pytest
from conftest import FAST, Recorder, backend_script, free_ports, run_monitor, scrape, wait_for

import sampler
from sampler import catalogue
from sampler.collectors import gpu as gpu_module
from sampler.collectors import gpu_errors
from sampler.collectors import gpu_gpm as gpm_module
from sampler.collectors import nvml as nvml_module
from sampler.collectors.gpu import GpuCollector
from sampler.store.reader import StoreReader

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
SPEC_GPU = (
    "memory_clock_mhz",
    "sm_clock_mhz",
    "memory_allocated_bytes",
    "memory_allocated_percent",
    "temperature_celsius",
)
TWO_DEVICES = [
    {
        "mem_clock": 2619,
        "sm_clock": 1980,
        "used": 20 * GIB,
        "total": 80 * GIB,
        "temp": 41,
        "power_mw": 250_000,
    },
    {"mem_clock": 1593, "sm_clock": 1410, "used": 60 * GIB, "total": 80 * GIB, "temp": 67, "util": 12},
]
SW_POWER_CAP = fake_nvml.nvmlClocksEventReasonSwPowerCap
HW_SLOWDOWN = fake_nvml.nvmlClocksEventReasonHwSlowdown
HW_THERMAL = fake_nvml.nvmlClocksEventReasonHwThermalSlowdown
HW_POWER_BRAKE = fake_nvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
UUID_A1 = "GPU-aaaa1111-0000-4000-8000-000000000000"
UUID_A2 = "GPU-aaaa2222-0000-4000-8000-000000000000"
GPU_SUFFIXES = tuple(s.suffix for s in catalogue.record_layout("gpu", catalogue.sampled("gpu")))
"""Every signal of a GPU's record, after ``gpu/<i>/``."""
UUID_B = "GPU-bbbb3333-0000-4000-8000-000000000000"
MIG_C = "MIG-cccc4444-0000-4000-8000-000000000000"
MIG_D = "MIG-dddd5555-0000-4000-8000-000000000000"
THREE_NAMED = [{"uuid": UUID_A1}, {"uuid": UUID_A2, "mig": [MIG_C, MIG_D]}, {"uuid": UUID_B}]
"""Device 1 is a GPU split into two MIG devices; two UUIDs share the prefix ``GPU-aaaa``."""
READ_CALLS_PER_SAMPLE = 11
"""NVML calls ``sample()`` makes on a healthy device with no process on it."""
OPENING_CALLS = 5
"""NVML calls on each device as the collector opens: its handle, its MIG mode, its UUID, whether it
has GPM, and its XID events registered."""
COUNTING_THROTTLE = {getattr(pynvml, field): 2.5e8 for _, field in gpu_module.THROTTLE_FIELDS}
"""A device's fields: each reason held the clocks down a quarter of the time (ns per s)."""


Opener = Callable[..., GpuCollector | None]


@pytest.fixture
def opened(nvml: fake_driver.Driver) -> Iterator[Opener]:
    """Open a collector in this process through the real binding, choosing ``choose``
    for ``pid``, as a child after others that read ``read_before`` and left ``stopped_before``
    stopped, on the fake driver configured by the other keyword arguments; closed at the end
    of the test."""
    fake_driver.load()
    collectors: list[GpuCollector] = []

    def open_(
        choose: str | tuple[str, ...] = "all",
        pid: int = 0,
        read_before: tuple[str, ...] = (),
        stopped_before: tuple[str, ...] = (),
        **config: object,
    ) -> GpuCollector | None:
        nvml.configure(**config)
        gpu = GpuCollector.open("pynvml", choose, pid, None, read_before, stopped_before)
        if gpu is not None:
            collectors.append(gpu)
        return gpu

    yield open_
    for gpu in collectors:
        gpu.close()


@pytest.fixture
def descendant() -> Iterator[subprocess.Popen[bytes]]:
    """A real child process of this one (a DataLoader worker, say)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def readings(gpu: GpuCollector) -> dict[str, float]:
    return dict(zip(gpu.names, gpu.sample(), strict=True))


def tracked(gpu: GpuCollector) -> dict[str, float]:
    return dict(zip(gpu.tracked, gpu.sample_tracked(), strict=True))


def device_indices(gpu: GpuCollector | None) -> list[int]:
    """The GPUs sampled, by NVML index (a MIG device's parent counts)."""
    return [] if gpu is None else sorted({int(name.split("/")[2].split("-")[0]) for name in gpu.names})


calls = fake_driver.calls
device_calls = fake_driver.device_calls


# --- through a real monitor --------------------------------------------------------------------


def test_two_devices_give_two_full_sets_with_units(nvml: fake_driver.Driver) -> None:
    nvml.configure(devices=TWO_DEVICES)
    sink, _ = run_monitor(categories=["gpu", "cpu"])
    for i in (0, 1):
        assert {f"resource/gpu/{i}/{s}" for s in SPEC_GPU} <= sink.names()
    last = {name: value for name, value, _ in sink.calls}
    assert last["resource/gpu/0/memory_clock_mhz"] == 2619
    assert last["resource/gpu/0/sm_clock_mhz"] == 1980
    assert last["resource/gpu/0/memory_allocated_bytes"] == 20 * GIB
    assert last["resource/gpu/0/memory_allocated_percent"] == pytest.approx(25.0)
    assert last["resource/gpu/0/temperature_celsius"] == 41
    assert last["resource/gpu/0/power_watts"] == pytest.approx(250.0)
    assert last["resource/gpu/1/memory_allocated_percent"] == pytest.approx(75.0)
    assert last["resource/gpu/1/temperature_celsius"] == 67
    assert last["resource/gpu/1/utilization_percent"] == 12
    assert "resource/gpu/2/temperature_celsius" not in sink.names()
    assert "resource/cpu/utilization_percent" in sink.names()


@pytest.mark.parametrize(
    "setup",
    [
        {"nvml_module": "pynvml", "config": {"devices": TWO_DEVICES, "init_error": 9}},
        {"nvml_module": "no_such_nvml_binding", "config": {}},
        {"nvml_module": "pynvml", "config": {"devices": []}},
        {"nvml_module": "pynvml", "config": {}},  # the real binding, and no NVIDIA driver here
    ],
    ids=["init-fails", "module-missing", "no-devices", "real-pynvml-no-driver"],
)
def test_no_nvml_means_no_gpu_signals_and_nothing_else_changes(nvml: fake_driver.Driver, setup: dict) -> None:
    if setup["config"]:
        nvml.configure(**setup["config"])
    sink, stats = run_monitor(categories=["gpu", "cpu", "memory"], nvml_module=setup["nvml_module"])
    assert not {name for name in sink.names() if name.startswith("resource/gpu/")}
    assert {"resource/cpu/utilization_percent", "resource/memory/system_utilization_percent"} <= sink.names()
    assert stats["sink_errors"] == 0


def test_a_failing_call_skips_only_that_reading(nvml: fake_driver.Driver) -> None:
    nvml.configure(devices=TWO_DEVICES, fail={"nvmlDeviceGetTemperatureV": [1]})
    sink, stats = run_monitor(records=3, categories=["gpu"])
    assert "resource/gpu/1/temperature_celsius" not in sink.names()
    assert "resource/gpu/0/temperature_celsius" in sink.names()
    assert {f"resource/gpu/1/{s}" for s in SPEC_GPU if s != "temperature_celsius"} <= sink.names()
    assert stats["records_lost"] == 0


def test_new_signals_and_their_peaks_arrive_through_a_real_monitor(
    nvml: fake_driver.Driver, descendant: subprocess.Popen[bytes]
) -> None:
    me = os.getpid()
    nvml.configure(
        devices=[
            {
                "used": 30 * GIB,
                "util": 64,
                "throttle": SW_POWER_CAP | HW_THERMAL,
                "power_limit_mw": 450_000,
                "compute": [{"pid": me, "used": 3 * GIB}, {"pid": descendant.pid, "used": GIB}],
            },
            {"throttle": HW_SLOWDOWN},
        ],
    )
    sink, stats = run_monitor(categories=["gpu"])
    last = {name: value for name, value, _ in sink.calls}
    assert last["resource/gpu/0/process_memory_bytes"] == 3 * GIB  # the backend: this process
    assert last["resource/gpu/0/tree_memory_bytes"] == 4 * GIB
    assert last["resource/gpu/1/process_memory_bytes"] == 0
    assert last["resource/gpu/0/clock_throttle_reasons"] == 0x44
    assert last["resource/gpu/0/throttle_power"] == 1
    assert last["resource/gpu/0/throttle_thermal"] == 1
    assert last["resource/gpu/0/throttle_hw_slowdown"] == 0
    assert last["resource/gpu/1/throttle_hw_slowdown"] == 1
    assert last["resource/gpu/0/power_limit_watts"] == 450
    assert last["resource/gpu/0/memory_allocated_bytes_peak"] == 30 * GIB
    assert last["resource/gpu/0/process_memory_bytes_peak"] == 3 * GIB
    assert last["resource/gpu/0/utilization_percent_mean"] == 64
    assert "resource/gpu/0/temperature_celsius_peak" not in sink.names()
    assert stats["restarts"] == 0


def test_a_device_lost_mid_run_stops_alone_and_the_child_lives_on(nvml: fake_driver.Driver) -> None:
    nvml.configure(devices=[{}, {"lost_after": 40}])  # a record costs at least 13 calls on it
    sink, stats = run_monitor(records=8, categories=["gpu"])
    assert len(sink.values("resource/gpu/0/temperature_celsius")) >= 8
    assert 1 <= len(sink.values("resource/gpu/1/temperature_celsius")) <= 3
    assert stats["restarts"] == 0 and stats["quarantined"] == []


def test_visible_devices_reach_the_child_through_its_environment(
    monkeypatch: pytest.MonkeyPatch, nvml: fake_driver.Driver
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", UUID_B)
    nvml.configure(devices=THREE_NAMED)
    sink, _ = run_monitor(categories=["gpu"], gpu_devices="visible")
    assert sink.gpus() == {"2"}


def test_listed_devices_reach_the_child(nvml: fake_driver.Driver) -> None:
    nvml.configure(devices=THREE_NAMED)
    sink, _ = run_monitor(categories=["gpu"], gpu_devices=[MIG_D, "0"])
    assert sink.gpus() == {"0", "1", "1-mig1"}  # MIG_D: the GPU it is part of, and itself


def test_energy_per_step_and_the_runs_energy_through_a_real_monitor(
    nvml: fake_driver.Driver, tmp_path: Path
) -> None:
    """GPU 0 draws 250 W and counts its energy; GPU 1 has no counter: nothing of energy
    for it, never an estimate. Each logged record's joules per step are the counter's
    change over the steps since the previous logged record; the store's total is the
    counter's change over the run."""
    nvml.configure(devices=[{"power_mw": 250_000, "energy_mj": 7_000_000}, {"energy": 0}])
    store = tmp_path / "runs.db"
    steps = itertools.count(1, 3)
    sink = Recorder()
    with sampler.ResourceMonitor(
        sink=sink, categories=["gpu"], age_source=lambda: next(steps), store=str(store), **FAST
    ) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 6, what="six records")
    energy = "resource/gpu/0/energy_joules"
    counted = list(zip(sink.steps(energy), sink.values(energy), strict=True))
    assert counted[0][1] >= 7_000  # the driver's count since it loaded (7 kJ then), in joules
    per_step = dict(zip(sink.steps(energy + "_per_step"), sink.values(energy + "_per_step"), strict=True))
    assert len(per_step) == len(counted) - 1
    for (before_step, before), (step, now) in itertools.pairwise(counted):
        assert per_step[step] == pytest.approx((now - before) / (step - before_step))
    assert statistics.median(sink.values(energy + "_per_second")) == pytest.approx(250, rel=0.2)
    assert not {name for name in sink.names() if "gpu/1/energy" in name}
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
        assert reader.energy_joules(run.id) == pytest.approx(counted[-1][1] - counted[0][1])


def test_a_throttle_burst_between_samples_is_counted_not_missed(opened: Opener) -> None:
    """The power brake held the clocks a quarter of the time, never while a sample looked
    (the bitmask reads 0): the driver's duration counts it."""
    brake = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
    gpu = opened(devices=[{"fields": {brake: 2.5e8}}, {}])
    assert gpu is not None
    first = readings(gpu)
    began = time.monotonic()
    wait_for(lambda: time.monotonic() - began >= 0.2, what="0.2 s to pass")
    values = readings(gpu)
    name = "resource/gpu/0/throttled_hw_power_brake_seconds"
    assert values[name] - first[name] == pytest.approx(0.25 * 0.2, rel=0.5)
    assert values[name + "_per_second"] == pytest.approx(0.25, abs=0.03)
    assert values["resource/gpu/0/throttle_power"] == 0
    assert math.isnan(first[name + "_per_second"])  # no rate before a second sample
    for reason in ("sw_power_cap", "sw_thermal", "hw_thermal"):  # not counted by this driver
        assert math.isnan(values[f"resource/gpu/0/throttled_{reason}_seconds"])
    assert all(math.isnan(values[f"resource/gpu/1/{suffix}"]) for suffix, _ in gpu_module.THROTTLE_FIELDS)
    assert values["resource/gpu/1/energy_joules"] > 0


def test_peaks_between_records_come_from_the_drivers_own_samples(nvml: fake_driver.Driver) -> None:
    """A 50 ms burst to 100 % and 690 W, at 1.9 GHz, that only the driver's sample buffer saw
    (its instant readings stay at 40 %, 300 W and 1.4 GHz): the record after it carries the burst
    as its peaks."""
    device = {"util": 40, "power_mw": 300_000, "sm_clock": 1400}
    nvml.configure(devices=[device, {}])
    sink = Recorder()
    with sampler.ResourceMonitor(sink=sink, categories=["gpu"], step_source="seconds", **FAST) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 2, what="two records")  # the child samples
        start_us = time.time_ns() // 1000 + 200_000
        burst = (start_us, start_us + 50_000)
        spikes = [(pynvml.NVML_GPU_UTILIZATION_SAMPLES, 100, *burst)]
        spikes += [(pynvml.NVML_TOTAL_POWER_SAMPLES, 690_000, *burst)]
        spikes += [(pynvml.NVML_PROCESSOR_CLK_SAMPLES, 1900, *burst)]
        nvml.configure(devices=[{**device, "spikes": spikes}, {}])
        logged = monitor.stats()["records_logged"]
        after = burst[1] + 300_000
        wait_for(
            lambda: time.time_ns() // 1000 > after and monitor.stats()["records_logged"] >= logged + 4,
            what="records after the burst",
        )
        stats = monitor.stats()
    prefix = "resource/gpu/0/"
    assert set(sink.values(prefix + "utilization_percent")) == {40}
    assert max(sink.values(prefix + "utilization_percent_peak")) == 100
    assert max(sink.values(prefix + "power_watts_peak")) == pytest.approx(690)
    assert max(sink.values(prefix + "sm_clock_mhz_peak")) == 1900
    assert set(sink.values(prefix + "power_watts")) == {300}
    assert max(sink.values("resource/gpu/1/utilization_percent_peak")) == fake_nvml.DEFAULT_DEVICE["util"]
    assert stats["restarts"] == 0


IN_A_CONTAINER = """
import json
from conftest import FAST, Recorder, wait_for
name = "resource/gpu/0/process_memory_bytes"
sink = Recorder()
with sampler.ResourceMonitor(sink=sink, categories=["gpu"], step_source="seconds", **FAST) as monitor:
    wait_for(lambda: len(sink.values(name)) >= 2, what="two records")
    open(sys.argv[2], "w").close()
    wait_for(lambda: os.path.exists(sys.argv[1]), what="the driver to list this backend's host pid")
    logged, before = monitor.stats()["records_logged"], len(sink.values(name))
    wait_for(lambda: monitor.stats()["records_logged"] >= logged + 8, what="eight records more")
values = sink.values(name)
print(json.dumps({"pid": os.getpid(), "before": values[:before], "after": values[before:]}))
"""


def test_a_backend_in_its_own_pid_namespace_gets_no_gpu_memory_rather_than_zero(
    nvml: fake_driver.Driver, tmp_path: Path
) -> None:
    """A real pid namespace (``unshare --pid``, as a container has): the backend is pid 1 there,
    and the driver lists it by its pid outside, which that namespace has not got. Its GPU memory
    cannot be attributed: absent, said once, never 0."""
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    if probe.returncode:
        pytest.skip(f"cannot make a pid namespace here: {probe.stderr.decode().strip()}")
    nvml.configure(devices=[{}])
    listed, ready = tmp_path / "listed", tmp_path / "ready"
    script = tmp_path / "backend.py"
    script.write_text(backend_script(IN_A_CONTAINER))
    outside = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(script), str(listed), str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        backend = wait_for(
            lambda: psutil.Process(outside.pid).children(), what="the backend in its namespace"
        )[0]
        wait_for(ready.exists, what="the backend's first records")
        nvml.configure(devices=[{"compute": [{"pid": backend.pid, "used": 3 * GIB}]}])
        listed.touch()
        out, err = outside.communicate(timeout=120)
    finally:
        outside.kill()
        outside.wait()
    assert outside.returncode == 0, err
    result = json.loads(out.splitlines()[-1])
    assert result["pid"] == 1  # inside, the backend is its namespace's first process
    assert result["before"] and set(result["before"]) == {0}  # no process on the GPU yet: it holds 0
    assert len(result["after"]) <= 1 and set(result["after"]) <= {0}  # at most a record in flight
    assert err.count("cannot be attributed") == 1, err


# --- an NVML error that stops a device's readings ----------------------------------------------

STOPPED = "stopped reading"
RESUMED = "reading again"
TEMPERATURE = "resource/gpu/{}/temperature_celsius"


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """What the ``sampler`` logger said (the sampling child's lines included), a line each."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "sampler")


def said(err: str, words: str) -> list[str]:
    """The lines of ``err`` holding ``words``."""
    return [line for line in err.splitlines() if words in line]


def own_metrics(port: int) -> dict[str, float]:
    """The monitor's GPU error metrics on its endpoint now, by name."""
    parser = pytest.importorskip("prometheus_client.parser")
    wanted = ("wl_resource_monitor_gpus_not_reading", "wl_resource_monitor_gpu_errors_total")
    return {
        sample.name: sample.value
        for family in parser.text_string_to_metric_families(scrape(port))
        for sample in family.samples
        if sample.name in wanted
    }


@pytest.mark.parametrize(
    ("code", "name"), [(18, "NVML_ERROR_LIB_RM_VERSION_MISMATCH"), (999, "NVML_ERROR_UNKNOWN")]
)
def test_an_error_stopping_one_gpu_is_said_once_counted_and_its_recovery_said(
    nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture, code: int, name: str
) -> None:
    """Every call on GPU 1 fails mid-run (18: the driver was upgraded under the running job):
    GPU 0 reads on; GPU 1's stop is said once, naming the error and the device, counted in
    stats() and on the endpoint; when it answers again that is said once too."""
    zero, one = TEMPERATURE.format(0), TEMPERATURE.format(1)
    port = free_ports()
    nvml.configure(devices=[{}, {}])
    sink = Recorder()
    with sampler.ResourceMonitor(
        sink=sink, categories=["gpu"], step_source="seconds", prometheus_port=port, **FAST
    ) as monitor:
        wait_for(lambda: len(sink.values(one)) >= 2, what="GPU 1's readings")
        nvml.configure(devices=[{}, {"lost_after": 0, "lost_code": code}])
        wait_for(lambda: monitor.stats().get("gpus_not_reading") == 1, what="stats() to count GPU 1 stopped")
        read, flowing = len(sink.values(one)), len(sink.values(zero))
        wait_for(lambda: len(sink.values(zero)) >= flowing + 5, what="GPU 0's readings to go on")
        assert len(sink.values(one)) == read
        assert monitor.stats()["gpu_errors"] == 1
        assert own_metrics(port) == {
            "wl_resource_monitor_gpus_not_reading": 1,
            "wl_resource_monitor_gpu_errors_total": 1,
        }
        nvml.configure(devices=[{}, {}])
        wait_for(lambda: len(sink.values(one)) > read, what="GPU 1's readings to resume")
        wait_for(lambda: monitor.stats()["gpus_not_reading"] == 0, what="stats() to see it read again")
        assert monitor.stats()["gpu_errors"] == 1
    err = logged(caplog)
    (stopped,) = said(err, STOPPED)
    assert f"{name} ({code})" in stopped and "GPU 1" in stopped and fake_driver.default_uuid(1) in stopped
    (resumed,) = said(err, RESUMED)
    assert "GPU 1" in resumed
    assert "GPU 0" not in err


@pytest.mark.parametrize(
    ("code", "name"), [(18, "NVML_ERROR_LIB_RM_VERSION_MISMATCH"), (999, "NVML_ERROR_UNKNOWN")]
)
def test_nvml_failing_to_start_in_the_first_child_is_said_once_and_counted(
    nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture, code: int, name: str
) -> None:
    """Issue 26: nvmlInit failing with anything but "no driver" is said, naming the error, and
    counted; the other categories flow."""
    cpu = "resource/cpu/utilization_percent"
    nvml.configure(devices=[{}, {}], init_error=code)
    sink = Recorder()
    with sampler.ResourceMonitor(
        sink=sink, categories=["cpu", "gpu"], step_source="seconds", **FAST
    ) as monitor:
        wait_for(lambda: len(sink.values(cpu)) >= 3, what="the CPU's readings")
        wait_for(lambda: monitor.stats()["gpu_errors"] == 1, what="stats() to count the failure")
    assert not sink.gpus()
    (failed,) = said(logged(caplog), f"{name} ({code})")
    assert "nvmlInit" in failed


def test_no_driver_at_all_is_not_said(nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture) -> None:
    """A machine without NVIDIA's driver (DRIVER_NOT_LOADED) has nothing wrong to say."""
    nvml.configure(devices=[{}], init_error=9)
    sink, stats = run_monitor(categories=["cpu", "gpu"])
    assert stats["gpu_errors"] == 0 and not sink.gpus()
    assert "NVML" not in logged(caplog)


def test_a_device_that_cannot_be_opened_in_the_first_child_is_said_once_and_counted(
    nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26: GPU 1's handle failing as the first child starts is said, naming the call, the
    error and the device, and counted; GPU 0 reads."""
    nvml.configure(
        devices=[{}, {}],
        fail={"nvmlDeviceGetHandleByIndex_v2": [1]},
        fail_code={"nvmlDeviceGetHandleByIndex_v2": 999},
    )
    sink = Recorder()
    with sampler.ResourceMonitor(sink=sink, categories=["gpu"], step_source="seconds", **FAST) as monitor:
        wait_for(lambda: len(sink.values(TEMPERATURE.format(0))) >= 3, what="GPU 0's readings")
        wait_for(lambda: monitor.stats()["gpu_errors"] == 1, what="stats() to count GPU 1")
    assert sink.gpus() == {"0"}
    (failed,) = said(logged(caplog), "NVML_ERROR_UNKNOWN (999)")
    assert "GPU 1" in failed and "nvmlDeviceGetHandleByIndex" in failed


def test_nvml_listing_no_device_in_the_first_child_is_said_once_and_counted(
    opened: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    """nvmlDeviceGetCount failing as the first child starts: no GPU is read, which is said with
    the call and the error, and counted."""
    gpu = opened(devices=[{}], fail={"nvmlDeviceGetCount_v2": True}, fail_code={"nvmlDeviceGetCount_v2": 999})
    assert gpu is not None and gpu.devices == () and gpu.sample() == []
    assert gpu.health.stops == 1
    (failed,) = said(logged(caplog), "NVML_ERROR_UNKNOWN (999)")
    assert "nvmlDeviceGetCount" in failed and "any GPU" in failed


def test_nvml_failing_to_start_in_a_restarted_child_is_said_counted_and_so_is_its_return(
    nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture
) -> None:
    """A restarted child whose nvmlInit fails (the driver upgraded under the job) says which
    GPUs an earlier child read are read no more, once; the other categories flow; once NVML
    initialises again the child opens them and says they read again."""
    cpu, zero = "resource/cpu/utilization_percent", TEMPERATURE.format(0)
    nvml.configure(devices=[{}, {}])
    sink = Recorder()
    with sampler.ResourceMonitor(
        sink=sink, categories=["cpu", "gpu"], step_source="seconds", _restart_backoff=(0.05, 0.2), **FAST
    ) as monitor:
        wait_for(lambda: sink.gpus() == {"0", "1"}, what="both GPUs' readings")
        nvml.configure(devices=[{}, {}], init_error=18)
        os.kill(monitor.child_pid, SIGKILL)
        wait_for(lambda: monitor.stats().get("gpus_not_reading") == 2, what="stats() to count both GPUs")
        assert monitor.stats()["gpu_errors"] == 2
        flowed, read = len(sink.values(cpu)), len(sink.values(zero))
        wait_for(lambda: len(sink.values(cpu)) >= flowed + 3, what="the CPU's readings to go on")
        assert len(sink.values(zero)) == read
        nvml.configure(devices=[{}, {}])
        wait_for(lambda: len(sink.values(zero)) > read, what="the child to read the GPUs again")
        wait_for(lambda: monitor.stats()["gpus_not_reading"] == 0, what="stats() to see them read again")
        assert monitor.stats()["gpu_errors"] == 2 and monitor.stats()["restarts"] == 1
    err = logged(caplog)
    (failed,) = said(err, "NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)")
    assert "nvmlInit" in failed and "GPU 0" in failed and "GPU 1" in failed
    (resumed,) = said(err, RESUMED)
    assert "GPU 0" in resumed and "GPU 1" in resumed


def test_an_error_stopping_a_gpu_in_the_backend_thread_is_said_and_counted(
    nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture
) -> None:
    """Sampling in the backend thread (no child): the same words, the same counts."""
    one = TEMPERATURE.format(1)
    fake_driver.load()  # into this process, which samples
    nvml.configure(devices=[{}, {}])
    sink = Recorder()
    with sampler.ResourceMonitor(
        sink=sink, categories=["gpu"], step_source="seconds", isolation="thread", **FAST
    ) as monitor:
        wait_for(lambda: len(sink.values(one)) >= 2, what="GPU 1's readings")
        nvml.configure(devices=[{}, {"lost_after": 0, "lost_code": 999}])
        wait_for(lambda: monitor.stats().get("gpus_not_reading") == 1, what="stats() to count GPU 1 stopped")
        assert monitor.stats()["gpu_errors"] == 1
    (stopped,) = [r.getMessage() for r in caplog.records if STOPPED in r.getMessage()]
    assert "NVML_ERROR_UNKNOWN (999)" in stopped and "GPU 1" in stopped


# --- the collector, in this process ------------------------------------------------------------


def test_own_and_tree_memory_come_from_both_process_lists(
    opened: Opener, descendant: subprocess.Popen[bytes]
) -> None:
    me = os.getpid()
    gpu = opened(
        pid=me,
        devices=[
            {
                "compute": [
                    {"pid": me, "used": 3 * GIB},
                    {"pid": descendant.pid, "used": GIB},
                    {"pid": 1, "used": 5 * GIB},  # not ours
                ],
                "graphics": [
                    {"pid": me, "used": 3 * GIB}
                ],  # the same allocation, seen from a graphics context
            },
            {
                "compute": [{"pid": 1, "used": 5 * GIB}],
                "graphics": [{"pid": descendant.pid, "used": 2 * GIB}],
            },
        ],
    )
    assert gpu is not None
    values = readings(gpu)
    assert values["resource/gpu/0/process_memory_bytes"] == 3 * GIB
    assert values["resource/gpu/0/tree_memory_bytes"] == 4 * GIB
    assert values["resource/gpu/1/process_memory_bytes"] == 0  # no context there
    assert values["resource/gpu/1/tree_memory_bytes"] == 2 * GIB


def test_memory_the_driver_cannot_tell_is_nan_not_zero(
    opened: Opener, descendant: subprocess.Popen[bytes]
) -> None:
    me = os.getpid()
    gpu = opened(
        pid=me,
        devices=[
            {"compute": [{"pid": me, "used": None}]},
            {"compute": [{"pid": me, "used": GIB}, {"pid": descendant.pid, "used": None}]},
            {"compute": [{"pid": 1, "used": None}]},  # someone else's unknown: ours is still known
        ],
    )
    assert gpu is not None
    values = readings(gpu)
    assert math.isnan(values["resource/gpu/0/process_memory_bytes"])
    assert math.isnan(values["resource/gpu/0/tree_memory_bytes"])
    assert values["resource/gpu/1/process_memory_bytes"] == GIB
    assert math.isnan(values["resource/gpu/1/tree_memory_bytes"])
    assert values["resource/gpu/2/process_memory_bytes"] == 0
    assert math.isnan(tracked(gpu)["resource/gpu/0/process_memory_bytes"])


def test_without_a_process_its_memory_is_nan(opened: Opener) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for pid in (0, gone.pid):
        gpu = opened(pid=pid, devices=[{"compute": [{"pid": gone.pid, "used": GIB}]}])
        assert gpu is not None
        values = readings(gpu)
        assert math.isnan(values["resource/gpu/0/process_memory_bytes"])
        assert math.isnan(values["resource/gpu/0/tree_memory_bytes"])
        assert values["resource/gpu/0/temperature_celsius"] == fake_nvml.DEFAULT_DEVICE["temp"]


def test_the_tree_is_rescanned_by_each_sample_and_only_there(
    opened: Opener, nvml: fake_driver.Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = os.getpid()
    scans: list[int] = []
    children = psutil.Process.children

    def counted(self: psutil.Process, recursive: bool = False) -> list[psutil.Process]:
        scans.append(self.pid)
        return children(self, recursive=recursive)

    monkeypatch.setattr(psutil.Process, "children", counted)
    gpu = opened(pid=me, devices=[{"compute": [{"pid": me, "used": GIB}]}])
    assert gpu is not None
    assert readings(gpu)["resource/gpu/0/tree_memory_bytes"] == GIB
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        nvml.configure(devices=[{"compute": [{"pid": me, "used": GIB}, {"pid": later.pid, "used": GIB}]}])
        for _ in range(5):
            gpu.sample_tracked()
        assert scans == [me]
        assert readings(gpu)["resource/gpu/0/tree_memory_bytes"] == 2 * GIB  # a worker started since
        assert scans == [me, me]
    finally:
        later.kill()
        later.wait()


def test_no_driver_sample_since_the_last_record_is_no_peak_and_no_loss(opened: Opener) -> None:
    """The driver samples every 10 s: asked for those since the previous record it answers
    NOT_FOUND, which for nvmlDeviceGetSamples means none yet, not a device gone."""
    gpu = opened(devices=[{"sample_period_us": 10_000_000}])
    assert gpu is not None
    for _ in range(3):
        values = readings(gpu)
        marks = dict(zip(gpu.tracked, gpu.marks(), strict=True))
    assert all(math.isnan(v) for v in marks.values())
    assert values["resource/gpu/0/temperature_celsius"] == fake_nvml.DEFAULT_DEVICE["temp"]
    assert fake_driver.calls("nvmlDeviceGetSamples", 0) == 9  # asked each time: three kinds, three records


def test_xids_are_absent_where_they_cannot_be_waited_for(
    opened: Opener, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A binding without the event API, and a driver whose wait fails: the XID reading is
    absent, not 0 ("no error"), and the failure is said once."""
    gpu = opened(devices=[{}])
    assert gpu is not None and readings(gpu)["resource/gpu/0/xid_critical"] == 0
    gpu.close()  # its wait would fail below too
    with monkeypatch.context() as binding:
        binding.delattr(pynvml, "nvmlEventSetCreate")
        gpu = opened(devices=[{}])
        assert gpu is not None and math.isnan(readings(gpu)["resource/gpu/0/xid_critical"])
    gpu = opened(devices=[{}], fail={"nvmlEventSetWait_v2": True}, fail_code={"nvmlEventSetWait_v2": 999})
    assert gpu is not None
    wait_for(lambda: math.isnan(readings(gpu)["resource/gpu/0/xid_critical"]), what="the wait to fail")
    assert [r.getMessage() for r in caplog.records if "XID" in r.getMessage()] == [
        "resource monitor: waiting for GPU XID events failed (Unknown Error); XIDs are no longer watched"
    ]


GPM = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: 35.5,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 22.0,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 18.25,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 61.0,
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 1200.0,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 45000.0,
}
"""A Hopper's GPM metrics (PCIe received and NVLink sent are not among them)."""


def test_gpm_activity_comes_from_two_samples_kept_across_records(opened: Opener) -> None:
    gpu = opened(devices=[{"gpm": GPM, "util": 100}, {}])
    assert gpu is not None
    for _ in range(3):
        values = readings(gpu)
    expected = {
        "sm_activity_percent": 35.5,
        "sm_occupancy_percent": 22.0,
        "tensor_activity_percent": 18.25,
        "dram_bandwidth_percent": 61.0,
        "pcie_tx_mb_per_second": 1200.0,
        "nvlink_rx_mb_per_second": 45000.0,
    }
    for suffix, value in expected.items():
        assert values[f"resource/gpu/0/{suffix}"] == value
    for suffix in ("pcie_rx_mb_per_second", "nvlink_tx_mb_per_second"):  # this GPU has not got them
        assert math.isnan(values[f"resource/gpu/0/{suffix}"])
    assert all(math.isnan(values[f"resource/gpu/1/{suffix}"]) for suffix, _ in gpm_module.GPM_METRICS)
    assert calls("nvmlGpmMetricsGet", 0) == 3 and calls("nvmlGpmSampleGet", 0) == 4  # one at open
    assert calls("nvmlGpmSampleGet", 1) == 0  # no GPM on GPU 1: asked once whether it has, never after


def test_throttle_reasons_give_the_bitmask_and_three_flags(opened: Opener) -> None:
    masks = [
        SW_POWER_CAP | HW_THERMAL,
        HW_SLOWDOWN | HW_POWER_BRAKE,
        fake_nvml.nvmlClocksEventReasonSwThermalSlowdown,
        0,
    ]
    gpu = opened(devices=[{"throttle": mask} for mask in masks])
    assert gpu is not None
    values = readings(gpu)
    flags = [
        tuple(
            values[f"resource/gpu/{i}/{s}"]
            for s in ("throttle_power", "throttle_thermal", "throttle_hw_slowdown")
        )
        for i in range(4)
    ]
    assert [values[f"resource/gpu/{i}/clock_throttle_reasons"] for i in range(4)] == [0x44, 0x88, 0x20, 0]
    assert flags == [(1, 1, 0), (1, 0, 1), (0, 1, 0), (0, 0, 0)]


def test_the_reason_bits_are_nvmls() -> None:
    for ours, name in [
        (gpu_module.REASON_SW_POWER_CAP, "SwPowerCap"),
        (gpu_module.REASON_HW_SLOWDOWN, "HwSlowdown"),
        (gpu_module.REASON_SW_THERMAL, "SwThermalSlowdown"),
        (gpu_module.REASON_HW_THERMAL, "HwThermalSlowdown"),
        (gpu_module.REASON_HW_POWER_BRAKE, "HwPowerBrakeSlowdown"),
    ]:
        for module in (pynvml, fake_nvml):
            assert getattr(module, f"nvmlClocksEventReason{name}") == ours
            assert getattr(module, f"nvmlClocksThrottleReason{name}") == ours
    for code in ("NOT_SUPPORTED", "NOT_FOUND", "FUNCTION_NOT_FOUND", "GPU_IS_LOST"):
        assert getattr(nvml_module, f"NVML_ERROR_{code}") == getattr(pynvml, f"NVML_ERROR_{code}")
        assert getattr(fake_nvml, f"NVML_ERROR_{code}") == getattr(pynvml, f"NVML_ERROR_{code}")
    assert nvml_module.NVML_ERROR_RESET_REQUIRED == pynvml.NVML_ERROR_RESET_REQUIRED


def test_power_limit_is_in_watts(opened: Opener) -> None:
    gpu = opened(devices=[{"power_limit_mw": 450_000}, {}])
    assert gpu is not None
    values = readings(gpu)
    assert values["resource/gpu/0/power_limit_watts"] == 450.0
    assert values["resource/gpu/1/power_limit_watts"] == fake_nvml.DEFAULT_DEVICE["power_limit_mw"] / 1000


def test_tracked_readings_are_few_and_cheap(opened: Opener) -> None:
    me = os.getpid()
    gpu = opened(pid=me, devices=[{"used": 7 * GIB, "util": 55, "compute": [{"pid": me, "used": GIB}]}, {}])
    assert gpu is not None
    suffixes = ("sm_clock_mhz", "memory_allocated_bytes", "utilization_percent", "power_watts")
    assert gpu.tracked == tuple(
        f"resource/gpu/{i}/{s}" for i in (0, 1) for s in (*suffixes, "process_memory_bytes")
    )
    assert gpu.averaged == ("resource/gpu/0/utilization_percent", "resource/gpu/1/utilization_percent")
    assert set(gpu.tracked) <= set(gpu.names)
    gpu.sample()
    before = fake_driver.all_calls()
    polled = gpu.sample_tracked()[:5]
    assert polled[1:3] + polled[4:] == [7 * GIB, 55, GIB]
    assert math.isnan(polled[0]) and math.isnan(polled[3])  # peaks from the driver's buffer alone
    made = {key for key, count in fake_driver.all_calls().items() if count != before.get(key)}
    assert {function for function, _ in made} == {
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    }


@pytest.mark.parametrize(
    ("function", "signals"),
    [
        ("nvmlDeviceGetPowerUsage", ["power_watts"]),
        ("nvmlDeviceGetEnforcedPowerLimit", ["power_limit_watts"]),
        ("nvmlDeviceGetCurrentClocksEventReasons", ["clock_throttle_reasons", "throttle_power"]),
        ("nvmlDeviceGetComputeRunningProcesses_v3", ["process_memory_bytes", "tree_memory_bytes"]),
    ],
)
def test_a_reading_not_supported_is_nan_and_not_asked_again(
    opened: Opener, function: str, signals: list[str]
) -> None:
    gpu = opened(pid=os.getpid(), devices=[{}, {}], fail={function: [1]})
    assert gpu is not None
    for _ in range(5):
        values = readings(gpu)
        gpu.sample_tracked()
    for signal in signals:
        assert math.isnan(values[f"resource/gpu/1/{signal}"])
        assert not math.isnan(values[f"resource/gpu/0/{signal}"])
    assert calls(function, 1) == 1
    assert calls(function, 0) >= 5
    assert not math.isnan(values["resource/gpu/1/temperature_celsius"])


def test_a_device_without_graphics_lists_still_reads_compute_memory(opened: Opener) -> None:
    me = os.getpid()
    gpu = opened(
        pid=me,
        devices=[{"compute": [{"pid": me, "used": GIB}]}],
        fail={"nvmlDeviceGetGraphicsRunningProcesses_v3": True},
    )
    assert gpu is not None
    assert readings(gpu)["resource/gpu/0/process_memory_bytes"] == GIB
    assert readings(gpu)["resource/gpu/0/process_memory_bytes"] == GIB
    assert calls("nvmlDeviceGetGraphicsRunningProcesses_v3", 0) == 1


def test_a_reading_failing_this_time_is_nan_and_asked_again(opened: Opener) -> None:
    me = os.getpid()
    gpu = opened(
        pid=me,
        devices=[{"compute": [{"pid": me, "used": GIB}]}],
        fail={"nvmlDeviceGetGraphicsRunningProcesses_v3": True, "nvmlDeviceGetTemperatureV": True},
        fail_code={
            "nvmlDeviceGetGraphicsRunningProcesses_v3": fake_nvml.NVML_ERROR_UNKNOWN,
            "nvmlDeviceGetTemperatureV": fake_nvml.NVML_ERROR_UNKNOWN,
        },
    )
    assert gpu is not None
    for _ in range(3):
        values = readings(gpu)
    assert math.isnan(
        values["resource/gpu/0/process_memory_bytes"]
    )  # graphics unknown: who holds what is too
    assert math.isnan(values["resource/gpu/0/temperature_celsius"])
    assert calls("nvmlDeviceGetGraphicsRunningProcesses_v3", 0) == 3
    assert calls("nvmlDeviceGetTemperatureV", 0) == 3


@pytest.mark.parametrize("error", [OSError("ioctl failed"), KeyError("a bug in the binding")])
def test_a_reading_raising_something_else_is_nan_and_asked_again(
    opened: Opener, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    tries: list[object] = []

    def broken(handle: object) -> int:
        tries.append(handle)
        raise error

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", broken)
    gpu = opened(devices=[{}])
    assert gpu is not None
    for _ in range(3):
        values = readings(gpu)
    assert math.isnan(values["resource/gpu/0/power_watts"]) and len(tries) == 3
    assert values["resource/gpu/0/temperature_celsius"] == fake_nvml.DEFAULT_DEVICE["temp"]
    bugs = [r for r in caplog.records if "KeyError" in r.getMessage()]
    assert len(bugs) == (1 if isinstance(error, KeyError) else 0)  # a bug is reported, once


@pytest.mark.parametrize(
    ("missing", "used_instead"),
    [
        ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
        ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
        ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
        ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"),
        ("nvmlDeviceGetFieldValues", "nvmlDeviceGetTotalEnergyConsumption"),  # energy, no durations
    ],
)
def test_a_driver_older_than_the_binding_gets_the_older_call(
    nvml: fake_driver.Driver, missing: str, used_instead: str
) -> None:
    """A library built without ``missing`` (as an older driver lacks it), loaded by a
    fresh interpreter as a child would: the binding's call fails to resolve it once,
    and the older function serves every sample after."""
    me = os.getpid()
    processes = [{"pid": me, "used": GIB}]
    nvml.configure(
        devices=[
            {
                "throttle": HW_SLOWDOWN,
                "compute": processes,
                "graphics": processes,
                "fields": COUNTING_THROTTLE,
            }
        ]
        * 2,
        missing=[missing],
    )
    probe = f"""
import json, sys
sys.path.insert(0, {str(REPO / "tests")!r})
import fake_driver
from sampler.collectors.gpu import GpuCollector
gpu = GpuCollector.open("pynvml", "all", {me})
for _ in range(3):
    values = dict(zip(gpu.names, gpu.sample()))
print(json.dumps({{"values": values, "calls": [fake_driver.calls({used_instead!r}, i) for i in (0, 1)]}}))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    for i in (0, 1):
        values = seen["values"]
        assert values[f"resource/gpu/{i}/clock_throttle_reasons"] == HW_SLOWDOWN
        assert values[f"resource/gpu/{i}/process_memory_bytes"] == GIB
        assert values[f"resource/gpu/{i}/temperature_celsius"] == fake_nvml.DEFAULT_DEVICE["temp"]
        assert values[f"resource/gpu/{i}/energy_joules"] > 0
        durations = [values[f"resource/gpu/{i}/{suffix}"] for suffix, _ in gpu_module.THROTTLE_FIELDS]
        assert all(math.isnan(d) for d in durations) == (missing == "nvmlDeviceGetFieldValues")
    per_list = 2 if "Processes" in used_instead else 1  # a process list: its size, then its entries
    assert seen["calls"] == [3 * per_list, 3 * per_list]


def test_a_binding_without_the_newer_name_uses_the_older(
    opened: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
    gpu = opened(devices=[{"throttle": SW_POWER_CAP}])
    assert gpu is not None
    assert readings(gpu)["resource/gpu/0/throttle_power"] == 1


@pytest.mark.parametrize("code", [fake_nvml.NVML_ERROR_GPU_IS_LOST, fake_nvml.NVML_ERROR_NOT_FOUND])
def test_a_lost_device_is_nan_the_others_flow_and_it_is_probed_with_backoff(
    opened: Opener, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    healthy_samples = 2
    lost = {"lost_after": OPENING_CALLS + healthy_samples * READ_CALLS_PER_SAMPLE, "lost_code": code}
    gpu = opened(pid=os.getpid(), devices=[{}, lost, {}])
    assert gpu is not None
    for _ in range(healthy_samples):
        assert readings(gpu)["resource/gpu/1/temperature_celsius"] == fake_nvml.DEFAULT_DEVICE["temp"]
    at_loss = device_calls(1)
    for _ in range(100):
        values = readings(gpu)
        between = tracked(gpu)
        assert all(math.isnan(v) for name, v in values.items() if name.startswith("resource/gpu/1/"))
        assert values["resource/gpu/0/temperature_celsius"] == 45
        assert values["resource/gpu/2/temperature_celsius"] == 45
        polled = [name for name in between if not name.endswith(("power_watts", "sm_clock_mhz"))]
        assert all(math.isnan(between[name]) for name in polled if name.startswith("resource/gpu/1/"))
        assert not any(math.isnan(between[name]) for name in polled if not name.startswith("resource/gpu/1/"))
    # One call per probe (the first reading fails, the rest are skipped), at samples
    # 1, 3, 6, 11, 20, 37 and 70 as the backoff doubles: 7 calls where 1,300 would be made.
    assert device_calls(1) - at_loss == 7
    (warning,) = [r.getMessage() for r in caplog.records if STOPPED in r.getMessage()]
    assert "GPU 1" in warning and f"({code})" in warning


def test_a_flapping_gpu_is_said_at_most_once_a_minute_with_how_often_it_stopped(
    opened: Opener,
    nvml: fake_driver.Driver,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPU 1 fails and answers by turns, ten times: its first stop and its first recovery are
    said at once, the flaps after are held back and counted, and the next line, a minute on,
    says how many times it stopped meanwhile. Every stop is counted."""
    one = TEMPERATURE.format(1)
    gpu = opened(devices=[{}, {}])
    assert gpu is not None
    for _ in range(10):
        nvml.configure(devices=[{}, {"lost_after": 0, "lost_code": fake_nvml.NVML_ERROR_UNKNOWN}])
        assert math.isnan(readings(gpu)[one])
        nvml.configure(devices=[{}, {}])
        assert readings(gpu)[one] == fake_nvml.DEFAULT_DEVICE["temp"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and STOPPED in lines[0] and RESUMED in lines[1]
    assert gpu.health.stops == 10 and gpu.health.not_reading == 0
    monkeypatch.setattr(gpu_errors, "FLAP_SECONDS", 0.0)  # a minute later
    readings(gpu)
    (latest,) = [r.getMessage() for r in caplog.records][2:]
    assert "GPU 1" in latest and "9 times" in latest


def test_every_call_failing_on_every_gpu_says_each_once_and_costs_one_call_a_sample(
    opened: Opener, nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture
) -> None:
    """Every NVML call on every device fails (999): one line for them all, NaN everywhere, and
    each stopped device is probed with one call per sample, not asked for its tracked readings
    or the driver's samples between records."""
    gpu = opened(pid=os.getpid(), devices=[{}, {}, {}])
    assert gpu is not None
    readings(gpu)
    broken = {"lost_after": 0, "lost_code": fake_nvml.NVML_ERROR_UNKNOWN}
    nvml.configure(devices=[broken] * 3)
    readings(gpu)  # finds every reading failing
    found = [device_calls(i) for i in range(3)]
    for _ in range(20):
        values = readings(gpu)
        between = tracked(gpu)
        assert all(math.isnan(v) for v in gpu.marks())
    assert all(math.isnan(v) for v in values.values()) and all(math.isnan(v) for v in between.values())
    assert [device_calls(i) - found[i] for i in range(3)] == [20] * 3
    (line,) = [r.getMessage() for r in caplog.records]
    assert STOPPED in line and all(f"GPU {i}" in line for i in range(3))
    assert gpu.health.not_reading == 3 and gpu.health.stops == 3


@pytest.mark.parametrize(
    ("code", "name"), [(3, "NVML_ERROR_NOT_SUPPORTED"), (13, "NVML_ERROR_FUNCTION_NOT_FOUND")]
)
def test_readings_that_answered_are_not_given_up_when_every_call_fails_with_a_code_that_would(
    opened: Opener, nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture, code: int, name: str
) -> None:
    """Every call on GPU 0 answers NOT_SUPPORTED, or FUNCTION_NOT_FOUND, mid-run: readings that
    answered before are neither abandoned as unsupported nor moved to an older call for ever;
    the device's stop is said, and it reads again after."""
    zero = TEMPERATURE.format(0)
    gpu = opened(devices=[{}])
    assert gpu is not None
    readings(gpu)
    nvml.configure(devices=[{"lost_after": 0, "lost_code": code}])
    assert math.isnan(readings(gpu)[zero])
    nvml.configure(devices=[{}])
    assert readings(gpu)[zero] == fake_nvml.DEFAULT_DEVICE["temp"]
    assert calls("nvmlDeviceGetTemperatureV", 0) == 1  # not the older call
    (stopped, resumed) = [r.getMessage() for r in caplog.records]
    assert f"{name} ({code})" in stopped and RESUMED in resumed


def test_a_device_an_earlier_child_read_that_this_one_cannot_open_is_said_and_counted(
    opened: Opener, nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture
) -> None:
    """After a restart, GPU 1's handle fails (18): said once, naming it and the call; GPU 0 reads;
    the status block's mask names GPU 1 (position 1) for the next child. GPU 1 is tried again
    with backoff, and once it opens it reads, which is said."""
    refused = {
        "fail": {"nvmlDeviceGetHandleByIndex_v2": [1]},
        "fail_code": {"nvmlDeviceGetHandleByIndex_v2": 18},
    }
    gpu = opened(read_before=("0", "1"), devices=[{}, {}], **refused)
    assert gpu is not None and device_indices(gpu) == [0, 1]
    for _ in range(3):
        values = readings(gpu)
        assert all(math.isnan(values[f"resource/gpu/1/{suffix}"]) for suffix in GPU_SUFFIXES)
        assert values[TEMPERATURE.format(0)] == fake_nvml.DEFAULT_DEVICE["temp"]
    assert calls("nvmlDeviceGetHandleByIndex_v2", 1) == 3  # opening, then samples 1 and 3 (backoff)
    (line,) = [r.getMessage() for r in caplog.records]
    assert STOPPED in line and "GPU 1" in line and "GPU 0" not in line
    assert "nvmlDeviceGetHandleByIndex failed with NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)" in line
    assert gpu.health.words() == (1, 0b10, 1)
    nvml.configure(devices=[{}, {}])
    temperatures = [readings(gpu)[TEMPERATURE.format(1)] for _ in range(5)]
    assert temperatures[-1] == fake_nvml.DEFAULT_DEVICE["temp"]
    (resumed,) = [r.getMessage() for r in caplog.records][1:]
    assert f"GPU 1 ({fake_driver.default_uuid(1)}) is {RESUMED}" in resumed
    assert gpu.health.words() == (0, 0, 1)


def test_a_device_an_earlier_child_left_stopped_is_not_said_again_and_its_recovery_is(
    opened: Opener, nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture
) -> None:
    broken = {"lost_after": 0, "lost_code": 18}
    gpu = opened(read_before=("0", "1"), stopped_before=("1",), devices=[{}, {}], fail={})
    assert gpu is not None
    nvml.configure(devices=[{}, broken])  # still failing once opened: nothing new to say
    for _ in range(3):
        readings(gpu)
    assert caplog.records == [] and gpu.health.words() == (1, 0b10, 0)
    nvml.configure(devices=[{}, {}])
    assert readings(gpu)[TEMPERATURE.format(1)] == fake_nvml.DEFAULT_DEVICE["temp"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"GPU 1 ({fake_driver.default_uuid(1)}) is {RESUMED}" in line
    assert gpu.health.words() == (0, 0, 0)


def test_what_a_child_leaves_stopped_reaches_the_next_through_the_status_block_words(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A child told of ``0`` and ``1`` that also opened ``2-mig0`` and ``3``, with ``1`` and
    ``3`` stopped: its words, and its ring's fields, tell the next child just that. Past
    ``MASK_BITS`` devices a stop is counted but not carried."""
    health = gpu_errors.GpuHealth(pynvml, ("0", "1"), ())
    for label in ("0", "2-mig0", "3"):
        health.add(label, "")
    health.judge({"0": None, "1": 18, "2-mig0": None, "3": 999})
    not_reading, mask, stops = health.words()
    assert (not_reading, stops) == (2, 2)
    fields = [TEMPERATURE.format(label) for label in ("0", "1", "2-mig0", "3")] + [
        "resource/cpu/utilization_percent"
    ]
    assert gpu_errors.carry(("0", "1"), fields, mask) == (("0", "1", "2-mig0", "3"), ("1", "3"))
    assert gpu_errors.carry(("0", "1"), ["resource/cpu/utilization_percent"], 0) is None  # said nothing
    labels = tuple(str(i) for i in range(70))
    many = gpu_errors.GpuHealth(pynvml, labels, ())
    many.judge(dict.fromkeys(labels, 18))
    not_reading, mask, _ = many.words()
    assert not_reading == 70
    fields = [TEMPERATURE.format(label) for label in labels]
    assert gpu_errors.carry(labels, fields, mask) == (labels, labels[: gpu_errors.MASK_BITS])
    named = caplog.records[-1].getMessage()
    assert named.count("GPU ") == gpu_errors.NAMED and "GPU 7 and 62 more GPUs stopped reading" in named


def test_a_lost_device_that_answers_again_resumes(
    opened: Opener, nvml: fake_driver.Driver, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = opened(devices=[{"lost_after": OPENING_CALLS + READ_CALLS_PER_SAMPLE}])
    assert gpu is not None
    readings(gpu)
    assert math.isnan(readings(gpu)["resource/gpu/0/temperature_celsius"])
    nvml.configure(devices=[{}])  # back on the bus
    values = [readings(gpu)["resource/gpu/0/temperature_celsius"] for _ in range(3)]
    assert math.isnan(values[0]) and values[1:] == [45, 45]  # one sample skipped, then the probe answers
    assert tracked(gpu)["resource/gpu/0/memory_allocated_bytes"] == fake_nvml.DEFAULT_DEVICE["used"]
    assert any(
        f"GPU 0 ({fake_driver.default_uuid(0)}) is {RESUMED}" in r.getMessage() for r in caplog.records
    )


def test_a_device_back_from_lost_has_no_rate_at_its_first_sample_back(
    opened: Opener, nvml: fake_driver.Driver
) -> None:
    """A counter's rate needs a reading at the sample before (catalogue.rate): the first sample
    after a device stopped reading has none, not a mean over the outage; the next has one."""
    gpu = opened(devices=[{"lost_after": OPENING_CALLS + READ_CALLS_PER_SAMPLE}])
    assert gpu is not None
    energy = "resource/gpu/0/energy_joules"
    rate = energy + catalogue.RATE_SUFFIX
    assert readings(gpu)[energy] > 0
    assert math.isnan(readings(gpu)[energy])  # lost
    nvml.configure(devices=[{}])  # back on the bus
    skipped, probed, next_one = (readings(gpu) for _ in range(3))
    assert math.isnan(skipped[energy]) and probed[energy] > 0
    assert math.isnan(probed[rate]) and next_one[rate] >= 0


# --- choosing devices ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "chosen"),
    [
        ("all", [0, 1, 2]),
        (("1",), [1]),
        (("2", "0"), [0, 2]),
        ((UUID_B,), [2]),
        ((UUID_A2.upper(),), [1]),
        (("GPU-bbbb",), [2]),  # a prefix of exactly one UUID, as CUDA accepts
        ((MIG_D,), [1]),  # a MIG device: its parent GPU
        ((f"MIG-{UUID_A1}/1/0",), [0]),  # the legacy MIG form
        (("MIG-cccc", "1"), [1]),
    ],
)
def test_listed_devices_by_index_uuid_prefix_or_mig(
    opened: Opener, devices: str | tuple[str, ...], chosen: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    assert device_indices(opened(devices, devices=THREE_NAMED)) == chosen
    assert caplog.records == []


def test_a_gpu_in_mig_mode_reports_its_mig_devices_as_devices_of_their_own(opened: Opener) -> None:
    """GPU 1 is split into two MIG devices: each is sampled under ``1-mig<slot>`` with what NVML
    gives a MIG device (its memory, its processes'), the GPU keeps its physical readings; a MIG
    UUID chooses the GPU and that MIG device alone. Nothing of MIG is ever set."""
    me = os.getpid()
    devices = [
        *THREE_NAMED[:1],
        {**THREE_NAMED[1], "mig_compute": {1: [{"pid": me, "used": 2 * GIB}]}, "gpm": GPM},
    ]
    gpu = opened(pid=me, devices=devices)
    assert gpu is not None
    readings(gpu)
    values = readings(gpu)
    assert values["resource/gpu/1-mig1/sm_activity_percent"] == 35.5  # its GPU instance's GPM samples
    assert (
        calls("nvmlGpmMigSampleGet", 1) >= 4 and calls("nvmlGpmSampleGet", 1) >= 2
    )  # two instances, the GPU
    assert sorted({name.split("/")[2] for name in gpu.names}) == ["0", "1", "1-mig0", "1-mig1"]
    per_instance = fake_nvml.DEFAULT_DEVICE["total"] // 7  # the fake splits the GPU in sevenths
    assert values["resource/gpu/1-mig1/memory_allocated_bytes"] == fake_nvml.DEFAULT_DEVICE["used"] // 7
    assert values["resource/gpu/1-mig1/memory_allocated_percent"] == pytest.approx(
        100 * (fake_nvml.DEFAULT_DEVICE["used"] // 7) / per_instance
    )
    assert values["resource/gpu/1-mig1/process_memory_bytes"] == 2 * GIB
    assert values["resource/gpu/1-mig0/process_memory_bytes"] == 0
    for suffix in ("temperature_celsius", "power_watts", "sm_clock_mhz", "energy_joules", "xid_critical"):
        assert math.isnan(values[f"resource/gpu/1-mig0/{suffix}"]), suffix  # the GPU's, not the instance's
        assert not math.isnan(values[f"resource/gpu/1/{suffix}"]), suffix
    assert gpu.uuids["1-mig0"] == MIG_C and gpu.uuids["1"] == UUID_A2
    assert not [f for f, _ in fake_driver.all_calls() if "Set" in f]
    reading = catalogue.lookup("resource/gpu/1-mig1/memory_allocated_bytes_peak")
    assert reading is not None and (reading.device, reading.variant) == ("1-mig1", "peak")
    gpu.close()
    only = opened((MIG_C,), pid=me, devices=devices)
    assert only is not None and sorted({name.split("/")[2] for name in only.names}) == ["1", "1-mig0"]


def test_a_mig_device_past_the_first_invalid_visible_entry_is_not_sampled(
    opened: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA stops reading CUDA_VISIBLE_DEVICES at its first invalid entry: a MIG device named
    after it is not visible, so it is not sampled either."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{MIG_C},GPU-ffff,{MIG_D}")
    gpu = opened("visible", devices=THREE_NAMED)
    assert gpu is not None and sorted({name.split("/")[2] for name in gpu.names}) == ["1", "1-mig0"]


def test_unmatched_entries_get_one_warning_naming_them(
    opened: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = opened(("0", "7", "GPU-aaaa", "GPU-ffff", "MIG-eeee"), devices=THREE_NAMED)
    assert device_indices(gpu) == [0]
    (warning,) = caplog.records
    message = warning.getMessage()
    assert warning.name == "sampler" and warning.levelno == logging.WARNING
    for entry in ("'7'", "'GPU-aaaa'", "'GPU-ffff'", "'MIG-eeee'"):  # GPU-aaaa: a prefix of two
        assert entry in message
    assert "gpu_devices" in message and "indices 0-2" in message and "no GPU is sampled" not in message


def test_no_device_left_means_no_gpu_signals(opened: Opener, caplog: pytest.LogCaptureFixture) -> None:
    assert opened(("5",), devices=THREE_NAMED) is None
    (warning,) = caplog.records
    assert "'5'" in warning.getMessage() and "no GPU is sampled" in warning.getMessage()
    assert not fake_driver.initialized()  # NVML was shut down again


@pytest.mark.parametrize(
    ("visible", "chosen", "warned"),
    [
        (None, [0, 1, 2], None),
        ("", [], None),  # hides every GPU on purpose
        ("2,0", [0, 2], None),
        (" 1 ", [1], None),
        ("0,-1,2", [0], "'-1' matches no GPU"),  # CUDA ignores -1 and everything after it
        ("0,9", [0], "'9' matches no GPU"),
        (f"{UUID_B},GPU-aaaa1", [0, 2], None),
        ("MIG-dddd", [1], None),
        (f"MIG-{UUID_B}/0/0", [2], None),
        ("GPU-aaaa,1", [], "'GPU-aaaa' matches no GPU"),
        ("0," + "1" * 5000, [0], "'1111"),  # past int()'s 4,300 digits: no index, not a crash
        ("\u0661", [], "matches no GPU"),  # an Arabic-Indic one is no index either
    ],
)
def test_visible_reads_cuda_visible_devices_as_cuda_does(
    opened: Opener,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    visible: str | None,
    chosen: list[int],
    warned: str | None,
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert device_indices(opened("visible", devices=THREE_NAMED)) == chosen
    if warned is None:
        assert caplog.records == []
    else:
        (warning,) = caplog.records
        assert "CUDA_VISIBLE_DEVICES" in warning.getMessage() and warned in warning.getMessage()


def test_a_binding_that_returns_uuids_as_bytes(opened: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    as_text = pynvml.nvmlDeviceGetUUID
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda handle: as_text(handle).encode())
    assert device_indices(opened((UUID_B, MIG_C), devices=THREE_NAMED)) == [1, 2]


def test_a_binding_without_mig_calls_finds_no_mig_device(
    opened: Opener, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(pynvml, "nvmlDeviceGetMaxMigDeviceCount")
    assert device_indices(opened((MIG_C, "2"), devices=THREE_NAMED)) == [2]
    assert MIG_C in caplog.records[0].getMessage()


def test_a_uuid_that_cannot_be_read_matches_nothing(opened: Opener, caplog: pytest.LogCaptureFixture) -> None:
    gpu = opened((UUID_A1, "1"), devices=THREE_NAMED, fail={"nvmlDeviceGetUUID": [0]})
    assert device_indices(gpu) == [1]
    assert UUID_A1 in caplog.records[0].getMessage()


# --- bench/gpu_check.py -------------------------------------------------------------------------


def gpu_check(nvml: fake_driver.Driver, *args: str, **config: object) -> subprocess.CompletedProcess[str]:
    if config:
        nvml.configure(**config)
    return subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--calls", "5", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_gpu_check_passes_a_plausible_gpu_and_writes_its_report(
    nvml: fake_driver.Driver, tmp_path: Path
) -> None:
    devices = [{"fields": COUNTING_THROTTLE, "gpm": GPM, "power_mw": 250_000}, {"throttle": SW_POWER_CAP}]
    done = gpu_check(nvml, "--out", str(tmp_path), "--burst-seconds", "1", devices=devices)
    assert done.returncode == 0, done.stdout + done.stderr
    for line in (
        "GPU 0",
        "GPU 1",
        "temperature_celsius",
        "power_limit_watts",
        "sample():",
        "sample_tracked():",
    ):
        assert line in done.stdout
    (arrived,) = re.findall(r"through a real monitor: (\d+) of (\d+) gpu signals arrived", done.stdout)
    assert arrived[0] == arrived[1] and int(arrived[1]) >= 50  # two GPUs: readings, rates, peaks, means
    assert done.stdout.rstrip().endswith(
        f"report written to {tmp_path / 'gpu_check.json'} and {tmp_path / 'gpu_check.md'}"
    )
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["problems"] == 0 and report["driver"]["driver_version"] == "999.99.fake"
    first = report["devices"]["0"]
    calls = {row["call"]: row for row in first["calls"]}
    assert all(row["outcome"] == "ok" and row["p50_us"] <= row["p99_us"] for row in calls.values())
    assert set(calls["nvmlDeviceGetFieldValues"]["nvml_latency_us"].values()) == {3}  # the driver's own
    assert first["gpm"]["supported"] and first["gpm"]["sm_activity_percent"] == 35.5
    assert report["devices"]["1"]["gpm"] == {"supported": False}
    assert first["facts"]["persistence_mode"] == 1 and "Not Supported" in first["facts"]["mig_mode"]
    energy = report["energy"]  # the fake's counter is its power times the time: they must agree
    assert energy["under_load"] is False and energy["ratio"] == pytest.approx(1.0, abs=0.05)
    assert energy["mean_power_w"] == 250
    assert "## GPU 1" in (tmp_path / "gpu_check.md").read_text()


@pytest.mark.parametrize(
    ("device", "problem"),
    [
        ({"temp": 150}, "temperature_celsius"),
        ({"power_mw": 900_000}, "power_watts"),  # beyond 1.2 x the 700 W limit
        ({"used": 90 * GIB}, "memory_allocated_bytes"),
    ],
)
def test_gpu_check_fails_an_implausible_reading(nvml: fake_driver.Driver, device: dict, problem: str) -> None:
    done = gpu_check(nvml, devices=[device])
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if problem in line and "outside" in line)
    assert line.split()[0] == problem  # the device's table, before the monitor's run says it again


def test_gpu_check_fails_a_missing_spec_reading_and_accepts_an_unsupported_extra(
    nvml: fake_driver.Driver,
) -> None:
    unsupported = {"nvmlDeviceGetPowerUsage": True, "nvmlDeviceGetTemperatureV": True}
    done = gpu_check(nvml, devices=[{}], fail=unsupported)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "n/a (not supported here)" in next(
        line for line in done.stdout.splitlines() if "power_watts" in line
    )
    assert "missing" in next(line for line in done.stdout.splitlines() if "temperature_celsius" in line)


@pytest.mark.parametrize(
    ("module", "config"),
    [("pynvml", {}), ("pynvml", {"devices": []}), ("pynvml", {"devices": [{}], "init_error": 9})],
    ids=["real-pynvml-no-driver", "no-devices", "driver-not-loaded"],
)
def test_gpu_check_without_a_gpu_says_so_and_exits_2(
    nvml: fake_driver.Driver, module: str, config: dict
) -> None:
    done = gpu_check(nvml, "--nvml-module", module, **config)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no NVIDIA GPU here: nothing to check" in done.stdout
