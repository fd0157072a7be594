"""A stand-in for ``pynvml`` on machines without an NVIDIA GPU.

It imitates the calls the monitor makes, with pynvml's types, constants and
failure style (``NVMLError`` carrying an NVML return code). Its behaviour comes
from the ``FAKE_NVML`` environment variable, a JSON object, so the sampling
child (a separate interpreter that inherits the environment) sees what the
test set up:

- ``devices``: list of per-device dicts with any of ``mem_clock`` (MHz),
  ``sm_clock`` (MHz), ``used`` and ``total`` (bytes), ``temp`` (deg C),
  ``util`` (%), ``power_mw`` (mW); missing keys get plausible defaults.
- ``init_error``: NVML return code ``nvmlInit`` fails with (e.g. 9, driver not loaded).
- ``fail``: {function name: [device indices] or true} calls that raise
  NVMLError (NVML_ERROR_NOT_SUPPORTED) for those devices (true: always).
- ``segfault``: {function name: [device indices] or true} calls that crash
  the process with a real SIGSEGV, as a driver does when a GPU falls off the bus.
- ``hang``: {function name: [device indices] or true} calls that never return.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from dataclasses import dataclass
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}

DEFAULT_DEVICE = {
    "mem_clock": 2619,
    "sm_clock": 1980,
    "used": 12 * 1024**3,
    "total": 80 * 1024**3,
    "temp": 45,
    "util": 87,
    "power_mw": 312_500,
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return nvmlErrorString(self.value)


def nvmlErrorString(result: int) -> str:
    return _MESSAGES.get(result, "Unknown Error")


@dataclass
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass
class c_nvmlUtilization_t:
    gpu: int
    memory: int


@dataclass(frozen=True)
class _Handle:
    index: int


_state: dict[str, Any] = {"initialized": False, "config": {}}


def _config() -> dict[str, Any]:
    """The configuration read at ``nvmlInit`` (parsed once, so per-call cost stays
    that of a dict lookup, even with many devices)."""
    return _state["config"]  # type: ignore[no-any-return]


def _targets(cfg: dict[str, Any], mode: str, function: str, index: int | None) -> bool:
    targets = cfg.get(mode, {}).get(function, [])
    return targets is True or (index is not None and index in targets)


def _misbehave(cfg: dict[str, Any], function: str, index: int | None = None) -> None:
    if _targets(cfg, "segfault", function, index):
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    if _targets(cfg, "hang", function, index):
        threading.Event().wait()  # forever, like a call stuck in the driver
    if _targets(cfg, "fail", function, index):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def _device(handle: _Handle, function: str) -> dict[str, Any]:
    if not _state["initialized"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    cfg = _config()
    _misbehave(cfg, function, handle.index)
    return {**DEFAULT_DEVICE, **cfg.get("devices", [])[handle.index]}


def nvmlInit() -> None:
    cfg = _state["config"] = json.loads(os.environ.get("FAKE_NVML", "{}"))
    _misbehave(cfg, "nvmlInit")
    code = cfg.get("init_error")
    if code:
        raise NVMLError(code)
    _state["initialized"] = True


def nvmlShutdown() -> None:
    if not _state["initialized"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _state["initialized"] = False


def nvmlDeviceGetCount() -> int:
    if not _state["initialized"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return len(_config().get("devices", []))


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    handle = _Handle(index)
    _device(handle, "nvmlDeviceGetHandleByIndex")
    return handle


def nvmlDeviceGetClockInfo(handle: _Handle, clock_type: int) -> int:
    dev = _device(handle, "nvmlDeviceGetClockInfo")
    if clock_type == NVML_CLOCK_MEM:
        return int(dev["mem_clock"])
    if clock_type in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS):
        return int(dev["sm_clock"])
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> c_nvmlMemory_t:
    dev = _device(handle, "nvmlDeviceGetMemoryInfo")
    return c_nvmlMemory_t(total=dev["total"], free=dev["total"] - dev["used"], used=dev["used"])


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    dev = _device(handle, "nvmlDeviceGetTemperature")
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(dev["temp"])


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> c_nvmlUtilization_t:
    dev = _device(handle, "nvmlDeviceGetUtilizationRates")
    return c_nvmlUtilization_t(gpu=dev["util"], memory=0)


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    return int(_device(handle, "nvmlDeviceGetPowerUsage")["power_mw"])
