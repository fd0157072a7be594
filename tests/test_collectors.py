"""Collectors skip a reading that fails for a legitimate reason silently, and
report one that fails because of a bug, once."""

from __future__ import annotations

import errno

import fake_driver
import fake_nvml
import psutil
import pytest

from sampler.collectors import base
from sampler.collectors.gpu import GpuCollector


def test_a_legitimate_failure_is_skipped_silently(caplog: pytest.LogCaptureFixture) -> None:
    def gone() -> float:
        raise psutil.NoSuchProcess(12345)

    def denied() -> float:
        raise PermissionError(errno.EACCES, "denied")

    assert base.attempt(gone) is None and base.attempt(denied) is None
    assert caplog.records == []


def test_a_bug_is_skipped_and_reported_once_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    def buggy() -> float:
        return {}["missing"]  # type: ignore[no-any-return]

    assert [base.attempt(buggy) for _ in range(5)] == [None] * 5
    (record,) = caplog.records
    assert "buggy" in record.getMessage() and "KeyError" in record.getMessage()
    assert record.exc_info is not None


def test_nvml_errors_are_legitimate_for_the_gpu_collector(nvml: fake_driver.Driver, caplog) -> None:
    # The collector reads the temperature with nvmlDeviceGetTemperatureV, or the older call.
    nvml.configure(devices=[{}], fail={"nvmlDeviceGetTemperatureV": True, "nvmlDeviceGetTemperature": True})
    fake_driver.load()
    gpu = GpuCollector.open("pynvml")
    assert gpu is not None
    try:
        values = dict(zip(gpu.names, gpu.sample(), strict=True))
    finally:
        gpu.close()
    assert values["resource/gpu/0/temperature_celsius"] != values["resource/gpu/0/temperature_celsius"]  # NaN
    assert values["resource/gpu/0/sm_clock_mhz"] == fake_nvml.DEFAULT_DEVICE["sm_clock"]
    assert caplog.records == []
