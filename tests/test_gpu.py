"""GPU collection through an NVML module imitating pynvml (no GPU on this machine)."""

from __future__ import annotations

import json

import pytest
from conftest import run_monitor

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


def fake(monkeypatch: pytest.MonkeyPatch, **config: object) -> None:
    monkeypatch.setenv("FAKE_NVML", json.dumps(config))


def test_two_devices_give_two_full_sets_with_units(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, devices=TWO_DEVICES)
    sink, _ = run_monitor(categories=["gpu", "cpu"], nvml_module="fake_nvml")
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
        {"nvml_module": "fake_nvml", "config": {"devices": TWO_DEVICES, "init_error": 9}},
        {"nvml_module": "no_such_nvml_binding", "config": {}},
        {"nvml_module": "fake_nvml", "config": {"devices": []}},
        {"nvml_module": "pynvml", "config": {}},  # the real binding, and no NVIDIA driver here
    ],
    ids=["init-fails", "module-missing", "no-devices", "real-pynvml-no-driver"],
)
def test_no_nvml_means_no_gpu_signals_and_nothing_else_changes(
    monkeypatch: pytest.MonkeyPatch, setup: dict
) -> None:
    fake(monkeypatch, **setup["config"])
    sink, stats = run_monitor(categories=["gpu", "cpu", "memory"], nvml_module=setup["nvml_module"])
    assert sink.names() == {"resource/cpu/utilization_percent", "resource/memory/system_utilization_percent"}
    assert stats["sink_errors"] == 0


def test_a_failing_call_skips_only_that_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, devices=TWO_DEVICES, fail={"nvmlDeviceGetTemperature": [1]})
    sink, stats = run_monitor(records=3, categories=["gpu"], nvml_module="fake_nvml")
    assert "resource/gpu/1/temperature_celsius" not in sink.names()
    assert "resource/gpu/0/temperature_celsius" in sink.names()
    assert {f"resource/gpu/1/{s}" for s in SPEC_GPU if s != "temperature_celsius"} <= sink.names()
    assert stats["records_lost"] == 0
