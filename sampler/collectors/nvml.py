"""NVML's calls, each with its fallbacks, and how their failures are sorted: apart from what the
gpu collector reads, so that a reading is one line there (``Calls.read``).

A driver too old for a newer call's name raises FUNCTION_NOT_FOUND (pynvml's unversioned
process lists raise NVMLLibraryMismatchError) or, for a versioned struct,
ARGUMENT_VERSION_MISMATCH, and the next, older call is used. A reading the device answers
NOT_SUPPORTED before it ever answered is not asked again. Only ever imported where the gpu
collector is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sampler.collectors.base import attempt

# NVML return codes (nvml.h), the ones a reading's failure is sorted by.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999
OLDER_CALL_CODES = {NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_ARGUMENT_VERSION_MISMATCH}
"""A newer call the driver lacks, or whose struct version it does not know: the next, older call is used."""
LOST_CODES = frozenset({NVML_ERROR_NOT_FOUND, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED})
"""Codes that mean the device itself is gone: off the bus, or needing a reset."""
NO_SAMPLES_YET = frozenset({NVML_ERROR_NOT_FOUND})
"""What nvmlDeviceGetSamples answers when the driver took no sample since the time asked:
nothing is lost."""
_FIELD_VALUE_TYPES = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
"""``nvmlValue_t``'s member for each ``NVML_VALUE_TYPE_*`` (nvml.h's order)."""

# Each reading, with the binding's functions that make it, preferred first.
# nvmlDeviceGetTemperature is gone from CUDA 14's NVML; nvmlDeviceGetTemperatureV replaces it.
CALLS: dict[str, tuple[str, ...]] = {
    "memory": ("nvmlDeviceGetMemoryInfo",),
    "mem_clock": ("nvmlDeviceGetClockInfo",),
    "sm_clock": ("nvmlDeviceGetClockInfo",),
    "temperature": ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"),
    "utilization": ("nvmlDeviceGetUtilizationRates",),
    "power": ("nvmlDeviceGetPowerUsage",),
    "power_limit": ("nvmlDeviceGetEnforcedPowerLimit",),
    "throttle": ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
    "compute": ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"),
    "graphics": ("nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    "fields": ("nvmlDeviceGetFieldValues",),
    "energy": ("nvmlDeviceGetTotalEnergyConsumption",),
}


_note: Callable[[bytes], None] | None = None
"""Where each NVML call is made known as it starts (``where``), and b"\\0" once it returns: the
sampling child puts it in its status block, so that a call that never returns is named
(``report_calls``)."""
_NONE = b"\0"


def report_calls(note: Callable[[bytes], None] | None) -> None:
    """Have every NVML call made through ``call`` told to ``note`` (None: to nothing)."""
    global _note
    _note = note


_ON_GPU = " on GPU "


@functools.cache
def where(function: str, device: str) -> bytes:
    """``<function> on GPU <device>`` (or ``<function>`` alone: no device), ASCII, ending with a NUL."""
    return (f"{function}{_ON_GPU}{device}" if device else function).encode("ascii", "replace") + _NONE


def device_of(call: str) -> str | None:
    """The device label a ``where`` names, None if it names none."""
    return call.partition(_ON_GPU)[2] or None


def quarantined(label: str, devices: Sequence[str]) -> bool:
    """Device ``label`` is one of ``devices``, or a MIG device of a GPU among them."""
    return label in devices or label.split("-", 1)[0] in devices


class Stopped(Exception):
    """A reading found the device gone, or still failing; the rest of its readings are skipped."""


@dataclass
class CallState:
    """What one device's calls answered."""

    handle: Any
    label: str = ""
    """Its NVML index, or ``<index>-mig<slot>`` for a MIG device (``catalogue.DEVICE_LABEL``)."""
    unsupported: set[str] = field(default_factory=set)
    """Readings the device answered NOT_SUPPORTED before they ever answered: never asked again."""
    answered: set[str] = field(default_factory=set)
    """Readings that answered once: NOT_SUPPORTED or FUNCTION_NOT_FOUND from one of them later is
    a failure like any other, not a reason to give it up or to fall back to an older call."""
    stopped: int | None = None
    """The NVML error that failed every reading of the latest sample, None while it reads."""
    read: bool = False
    """Some reading answered in the current sample."""
    failed: int | None = None
    """The first NVML error a reading met in the current sample."""


class Calls:
    """The binding's functions for each reading (``CALLS`` and ``more``), the ones a driver
    lacks dropped as they are found missing."""

    def __init__(
        self, nvml: ModuleType, errors: tuple[type[BaseException], ...], more: Mapping[str, tuple[str, ...]]
    ) -> None:
        self._errors = errors
        self._mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        self._functions = {
            reading: [getattr(nvml, name) for name in names if hasattr(nvml, name)]
            for reading, names in {**CALLS, **more}.items()
        }

    def read(self, dev: CallState, reading: str, *args: Any, none: frozenset[int] = frozenset()) -> Any:
        """One reading of ``dev``, or None when it failed (or answered one of the codes
        ``none``, which mean there is nothing to read). Notes in ``dev`` whether it answered
        or the NVML error it met; raises ``Stopped`` when the device is gone, or when it was
        not reading and still fails (the rest of this sample's readings are not asked)."""
        if reading in dev.unsupported:
            return None
        functions = self._functions[reading]
        while functions:
            result = attempt(
                functools.partial(
                    call, functions[0], (dev.handle, *args), self._errors, self._mismatch, dev.label
                )
            )
            if result is None:  # not an NVML error: a bug, reported once by attempt()
                return None
            value, code = result
            if code is None:
                dev.read = True
                dev.answered.add(reading)
                return value
            if code in none:
                return None
            if reading not in dev.answered:  # a call that never answered here: the driver's answer holds
                if code in OLDER_CALL_CODES:
                    functions.pop(0)
                    continue
                if code == NVML_ERROR_NOT_SUPPORTED:
                    dev.unsupported.add(reading)
                    return None
            if dev.failed is None:
                dev.failed = code
            if code in LOST_CODES or (dev.stopped is not None and not dev.read):
                raise Stopped
            return None
        return None


def call(
    function: Callable[..., Any],
    args: Sequence[Any],
    errors: tuple[type[BaseException], ...],
    mismatch: type[BaseException] | None = None,
    device: str = "",
) -> tuple[Any, int | None]:
    """``function(*args)`` and None, or None and the NVML error code it failed with (a
    ``mismatch``, the binding's NVMLLibraryMismatchError: FUNCTION_NOT_FOUND). ``device``:
    the label of the device it asks about, told to ``report_calls``'s note with the call."""
    note = _note
    if note is not None:
        note(where(getattr(function, "__name__", "an NVML call"), device))
    try:
        return function(*args), None
    except errors as exc:
        if mismatch is not None and isinstance(exc, mismatch):
            return None, NVML_ERROR_FUNCTION_NOT_FOUND
        code = getattr(exc, "value", None)
        return None, code if isinstance(code, int) else NVML_ERROR_UNKNOWN
    finally:
        if note is not None:
            note(_NONE)


def value(union: Any, value_type: int) -> float | None:
    """An ``nvmlValue_t`` read as its ``NVML_VALUE_TYPE_*`` says; None for a type nvml.h has not."""
    if not 0 <= value_type < len(_FIELD_VALUE_TYPES):
        return None
    return float(getattr(union, _FIELD_VALUE_TYPES[value_type]))
