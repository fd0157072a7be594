"""A stand-in for ``pynvml`` on machines without an NVIDIA GPU.

It imitates the calls the monitor makes, with pynvml's types, constants and
failure style (``NVMLError`` carrying an NVML return code). Its behaviour comes
from the ``FAKE_NVML`` environment variable, a JSON object, so the sampling
child (a separate interpreter that inherits the environment) sees what the
test set up:

- ``devices``: list of per-device dicts with any of ``mem_clock`` (MHz),
  ``sm_clock`` (MHz), ``used`` and ``total`` (bytes), ``temp`` (deg C),
  ``util`` (%), ``power_mw`` (mW), ``power_limit_mw`` (mW), ``throttle`` (the
  clocks event reasons bitmask, ``nvmlClocksEventReason*`` below), ``uuid``,
  ``compute`` and ``graphics`` (running processes: lists of
  ``{"pid": int, "used": bytes or null}``, null when the driver cannot tell),
  ``mig`` (UUIDs of its MIG devices; absent: not MIG-capable) and
  ``lost_after`` (the device falls off the bus after that many calls on it:
  every later call raises ``lost_code``, default NVML_ERROR_GPU_IS_LOST);
  missing keys get plausible defaults.
- ``init_error``: NVML return code ``nvmlInit`` fails with (e.g. 9, driver not loaded).
- ``fail``: {function name: [device indices] or true} calls that raise
  NVMLError (NVML_ERROR_NOT_SUPPORTED, or the code ``fail_code`` gives that
  function) for those devices (true: always).
- ``missing``: function names the driver lacks: NVML_ERROR_FUNCTION_NOT_FOUND,
  as pynvml raises it; an unversioned process-list call whose ``_v3`` is
  missing raises ``NVMLLibraryMismatchError``, as pynvml's does.
- ``segfault``: {function name: [device indices] or true} calls that crash
  the process with a real SIGSEGV, as a driver does when a GPU falls off the bus.
- ``hang``: {function name: [device indices] or true} calls that never return;
  ``hang_marker``: a file such a call creates as it starts hanging; ``hang_holding_gil``: true
  to hang in C code that never releases the GIL, so no other thread of the child runs either.

``calls`` counts the calls made on each (function, device index), for tests
that check what is not called.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0

# pynvml's values (NVML's nvml.h); the Throttle names are the older spelling of the same bits.
nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSyncBoost = 0x0000000000000010
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x0000000000000080
nvmlClocksEventReasonDisplayClockSetting = 0x0000000000000100
nvmlClocksEventReasonNone = 0x0000000000000000
nvmlClocksThrottleReasonGpuIdle = nvmlClocksEventReasonGpuIdle
nvmlClocksThrottleReasonApplicationsClocksSetting = nvmlClocksEventReasonApplicationsClocksSetting
nvmlClocksThrottleReasonSwPowerCap = nvmlClocksEventReasonSwPowerCap
nvmlClocksThrottleReasonHwSlowdown = nvmlClocksEventReasonHwSlowdown
nvmlClocksThrottleReasonSyncBoost = nvmlClocksEventReasonSyncBoost
nvmlClocksThrottleReasonSwThermalSlowdown = nvmlClocksEventReasonSwThermalSlowdown
nvmlClocksThrottleReasonHwThermalSlowdown = nvmlClocksEventReasonHwThermalSlowdown
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = nvmlClocksEventReasonHwPowerBrakeSlowdown
nvmlClocksThrottleReasonDisplayClockSetting = nvmlClocksEventReasonDisplayClockSetting
nvmlClocksThrottleReasonNone = nvmlClocksEventReasonNone

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
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
    "power_limit_mw": 700_000,
    "throttle": nvmlClocksEventReasonNone,
    "compute": [],
    "graphics": [],
}
MAX_MIG_DEVICES = 7
"""MIG device slots of a MIG-capable GPU (an A100's or H100's)."""


def default_uuid(index: int) -> str:
    """The UUID of device ``index`` when its config names none."""
    return f"GPU-{index:08x}-fake-4e56-8d3a-000000000000"


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return nvmlErrorString(self.value)


class NVMLLibraryMismatchError(Exception):
    """pynvml's: an unversioned call whose versioned function the driver lacks."""


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


@dataclass
class nvmlProcessInfo:
    """One entry of a running-process list; ``usedGpuMemory`` is None when the driver cannot tell."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(frozen=True)
class _Handle:
    index: int
    mig: int | None = None
    """Slot of a MIG device on GPU ``index``; None for the GPU itself."""


_state: dict[str, Any] = {"initialized": False, "config": {}, "calls": Counter(), "device_calls": Counter()}


def _config() -> dict[str, Any]:
    """The configuration read at ``nvmlInit`` (parsed once, so per-call cost stays
    that of a dict lookup, even with many devices)."""
    return _state["config"]  # type: ignore[no-any-return]


def _targets(cfg: dict[str, Any], mode: str, function: str, index: int | None) -> bool:
    targets = cfg.get(mode, {}).get(function, [])
    return targets is True or (index is not None and index in targets)


def _misbehave(cfg: dict[str, Any], function: str, index: int | None = None) -> None:
    if function in cfg.get("missing", ()):
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    if _targets(cfg, "segfault", function, index):
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    if _targets(cfg, "hang", function, index):
        if "hang_marker" in cfg:
            open(cfg["hang_marker"], "a").close()
        if cfg.get("hang_holding_gil"):
            re.match(r"(a+)+$", "a" * 64 + "b")  # backtracks for ages inside the regex engine, GIL held
        threading.Event().wait()  # forever, like a call stuck in the driver
    if _targets(cfg, "fail", function, index):
        raise NVMLError(cfg.get("fail_code", {}).get(function, NVML_ERROR_NOT_SUPPORTED))


def _device(handle: _Handle, function: str) -> dict[str, Any]:
    if not _state["initialized"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    cfg = _config()
    _state["calls"][function, handle.index] += 1
    _state["device_calls"][handle.index] += 1
    dev = {**DEFAULT_DEVICE, "uuid": default_uuid(handle.index), **cfg.get("devices", [])[handle.index]}
    if "lost_after" in dev and _state["device_calls"][handle.index] > dev["lost_after"]:
        raise NVMLError(dev.get("lost_code", NVML_ERROR_GPU_IS_LOST))
    _misbehave(cfg, function, handle.index)
    return dev


def nvmlInit() -> None:
    cfg = _state["config"] = json.loads(os.environ.get("FAKE_NVML", "{}"))
    _state["calls"] = Counter()
    _state["device_calls"] = Counter()
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


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    dev = _device(handle, "nvmlDeviceGetUUID")
    return str(dev["uuid"] if handle.mig is None else dev["mig"][handle.mig])


def nvmlDeviceGetMaxMigDeviceCount(handle: _Handle) -> int:
    if "mig" not in _device(handle, "nvmlDeviceGetMaxMigDeviceCount"):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return MAX_MIG_DEVICES


def nvmlDeviceGetMigDeviceHandleByIndex(handle: _Handle, index: int) -> _Handle:
    dev = _device(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
    if "mig" not in dev:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not 0 <= index < len(dev["mig"]):
        raise NVMLError(NVML_ERROR_NOT_FOUND)  # an empty slot
    return _Handle(handle.index, index)


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


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    return int(_device(handle, "nvmlDeviceGetEnforcedPowerLimit")["power_limit_mw"])


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    return int(_device(handle, "nvmlDeviceGetCurrentClocksEventReasons")["throttle"])


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: _Handle) -> int:
    return int(_device(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")["throttle"])


def _processes(handle: _Handle, function: str, kind: str) -> list[nvmlProcessInfo]:
    dev = _device(handle, function)
    return [nvmlProcessInfo(p["pid"], p["used"]) for p in dev[kind]]


def _unversioned(handle: _Handle, function: str, kind: str) -> list[nvmlProcessInfo]:
    """pynvml's unversioned call runs ``_v3``, and says so when the driver lacks it."""
    processes = _processes(handle, function, kind)
    if function + "_v3" in _config().get("missing", ()):
        raise NVMLLibraryMismatchError(f"use a versioned function such as {function}_v2")
    return processes


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[nvmlProcessInfo]:
    return _unversioned(handle, "nvmlDeviceGetComputeRunningProcesses", "compute")


def nvmlDeviceGetComputeRunningProcesses_v2(handle: _Handle) -> list[nvmlProcessInfo]:
    return _processes(handle, "nvmlDeviceGetComputeRunningProcesses_v2", "compute")


def nvmlDeviceGetGraphicsRunningProcesses(handle: _Handle) -> list[nvmlProcessInfo]:
    return _unversioned(handle, "nvmlDeviceGetGraphicsRunningProcesses", "graphics")


def nvmlDeviceGetGraphicsRunningProcesses_v2(handle: _Handle) -> list[nvmlProcessInfo]:
    return _processes(handle, "nvmlDeviceGetGraphicsRunningProcesses_v2", "graphics")
