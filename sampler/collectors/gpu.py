"""NVIDIA GPUs through an NVML binding (``pynvml`` or a module that imitates it).

Only ever imported by the sampling child (or the in-thread fallback): an NVML
call that segfaults or hangs must never do so inside the backend.
"""

from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType
from typing import Any

from sampler.collectors.base import MISSING, Collector, attempt

log = logging.getLogger("sampler")

# Per-device signal suffixes, in record order. The first five are SPEC 2's; the
# last two are extras users of GPU dashboards expect.
GPU_SIGNALS = (
    "memory_clock_mhz",
    "sm_clock_mhz",
    "memory_allocated_bytes",
    "memory_allocated_percent",
    "temperature_celsius",
    "utilization_percent",
    "power_watts",
)


class GpuCollector(Collector):
    """Clocks (MHz), memory (bytes and %), temperature (deg C), utilization (%)
    and power (W) of every device NVML reports, named by NVML index."""

    category = "gpu"

    def __init__(self, nvml: ModuleType, handles: dict[int, Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self._errors = _nvml_errors(nvml)
        self.names = tuple(f"resource/gpu/{i}/{suffix}" for i in handles for suffix in GPU_SIGNALS)

    @classmethod
    def open(cls, module_name: str) -> GpuCollector | None:
        """Import the binding and initialise NVML; None when either fails or no
        device is found (no driver, no GPU, no ``pynvml``): gpu is then a no-op."""
        try:
            nvml = importlib.import_module(module_name)
            nvml.nvmlInit()
        except Exception as exc:
            log.debug("resource monitor: no NVML via %r: %s", module_name, exc)
            return None
        handles: dict[int, Any] = {}
        errors = _nvml_errors(nvml)
        count = attempt(nvml.nvmlDeviceGetCount, errors) or 0
        for index in range(count):
            handle = attempt(functools.partial(nvml.nvmlDeviceGetHandleByIndex, index), errors)
            if handle is not None:
                handles[index] = handle
        if not handles:
            attempt(nvml.nvmlShutdown, errors)
            return None
        return cls(nvml, handles)

    def sample(self) -> list[float]:
        values: list[float] = []
        for handle in self._handles.values():
            values += self._device(handle)
        return values

    def _device(self, handle: Any) -> list[float]:
        nvml, errors = self._nvml, self._errors
        mem_clock = attempt(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM), errors)
        sm_clock = attempt(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM), errors)
        memory = attempt(lambda: nvml.nvmlDeviceGetMemoryInfo(handle), errors)
        temperature = attempt(
            lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU), errors
        )
        utilization = attempt(lambda: nvml.nvmlDeviceGetUtilizationRates(handle), errors)
        power_mw = attempt(lambda: nvml.nvmlDeviceGetPowerUsage(handle), errors)
        used_percent = MISSING
        if memory is not None and memory.total:
            used_percent = 100.0 * memory.used / memory.total
        return [
            _number(mem_clock),
            _number(sm_clock),
            MISSING if memory is None else float(memory.used),
            used_percent,
            _number(temperature),
            MISSING if utilization is None else float(utilization.gpu),
            MISSING if power_mw is None else power_mw / 1000.0,
        ]

    def close(self) -> None:
        if self._handles:
            self._handles = {}
            attempt(self._nvml.nvmlShutdown, self._errors)


def _nvml_errors(nvml: ModuleType) -> tuple[type[BaseException], ...]:
    """What an NVML call may legitimately raise: the binding's ``NVMLError``
    (driver, device or support problems) and ``OSError``."""
    error = getattr(nvml, "NVMLError", None)
    if isinstance(error, type) and issubclass(error, BaseException):
        return (error, OSError)
    return (OSError,)


def _number(value: object) -> float:
    return MISSING if value is None else float(value)  # type: ignore[arg-type]
