"""GPU performance monitoring (GPM: Hopper and later): what the SMs, the tensor cores, DRAM,
PCIe and NVLink did between two samples the child keeps across records, so nothing waits
between them. Only ever imported where the gpu collector is.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from sampler import catalogue
from sampler.collectors.base import MISSING, Readings, attempt

GPM = (
    (catalogue.GPU_SM_ACTIVITY, "NVML_GPM_METRIC_SM_UTIL"),
    (catalogue.GPU_SM_OCCUPANCY, "NVML_GPM_METRIC_SM_OCCUPANCY"),
    (catalogue.GPU_TENSOR_ACTIVITY, "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    (catalogue.GPU_DRAM_BANDWIDTH, "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    (catalogue.GPU_PCIE_SENT, "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),
    (catalogue.GPU_PCIE_RECEIVED, "NVML_GPM_METRIC_PCIE_RX_PER_SEC"),
    (catalogue.GPU_NVLINK_SENT, "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC"),
    (catalogue.GPU_NVLINK_RECEIVED, "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC"),
)
"""Each GPM signal and the binding's name of its metric (percent, or MiB/s)."""
GPM_METRICS = tuple((signal.suffix, name) for signal, name in GPM)
"""The same by each signal's suffix (``sm_activity_percent``)."""
GPM_API = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlGpmSampleFree",
    "c_nvmlGpmMetricsGet_t",
)


class GpmPair:
    """The previous GPM sample of one device and a spare: each ``read`` takes a new sample
    into the spare, gets the metrics between the two, and keeps the new one as the previous.
    A MIG device's samples are its GPU instance's, taken through its GPU."""

    def __init__(
        self,
        nvml: ModuleType,
        take: functools.partial[Any],
        samples: list[Any],
        errors: tuple[type[BaseException], ...],
    ) -> None:
        self._nvml = nvml
        self._take_into = take
        """The call that takes a sample into the one it is then given."""
        self._errors = errors
        self._previous, self._spare = samples
        self._has_previous = self._take(self._previous)
        self._ids = [getattr(nvml, name, None) for _, name in GPM]

    @classmethod
    def open(
        cls, nvml: ModuleType, handle: Any, errors: tuple[type[BaseException], ...], gpu: Any = None
    ) -> GpmPair | None:
        """The pair of device ``handle``, or of the MIG device ``handle`` of GPU ``gpu``; None
        where the binding has no GPM or the GPU does not support it (nor, for a MIG device,
        per-instance samples)."""
        if not all(hasattr(nvml, name) for name in GPM_API):
            return None
        support = attempt(functools.partial(nvml.nvmlGpmQueryDeviceSupport, gpu or handle), errors)
        if support is None or not support.isSupportedDevice:
            return None
        if gpu is None:
            take = functools.partial(nvml.nvmlGpmSampleGet, handle)
        else:
            instance = attempt(functools.partial(nvml.nvmlDeviceGetGpuInstanceId, handle), errors)
            if instance is None or not hasattr(nvml, "nvmlGpmMigSampleGet"):
                return None
            take = functools.partial(nvml.nvmlGpmMigSampleGet, gpu, instance)
        samples = [attempt(nvml.nvmlGpmSampleAlloc, errors) for _ in range(2)]
        if any(sample is None for sample in samples):
            for sample in samples:
                if sample is not None:
                    attempt(functools.partial(nvml.nvmlGpmSampleFree, sample), errors)
            return None
        return cls(nvml, take, samples, errors)

    def read(self) -> list[float]:
        """Each ``GPM`` metric's value since the previous read, in ``GPM`` order (``readings``
        keys them); NaN for the first read, for a metric the device or the binding has not
        got, and when a call fails."""
        if not self._take(self._spare):
            self._has_previous = False
            return [MISSING] * len(GPM)
        had, self._has_previous = self._has_previous, True
        older, newer = self._previous, self._spare
        self._previous, self._spare = newer, older
        if not had:
            return [MISSING] * len(GPM)
        wanted = [(k, i) for k, i in enumerate(self._ids) if isinstance(i, int)]
        nvml = self._nvml
        get = nvml.c_nvmlGpmMetricsGet_t()
        get.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
        get.numMetrics = len(wanted)
        get.sample1, get.sample2 = older, newer
        for slot, (_, metric) in enumerate(wanted):
            get.metrics[slot].metricId = metric
        got = attempt(functools.partial(nvml.nvmlGpmMetricsGet, get), self._errors)
        values = [MISSING] * len(GPM)
        if got is not None:
            for slot, (k, _) in enumerate(wanted):
                metric = got.metrics[slot]
                if metric.nvmlReturn == 0:
                    values[k] = float(metric.value)
        return values

    def readings(self) -> Readings:
        """``read()`` keyed by signal."""
        return {signal: value for (signal, _), value in zip(GPM, self.read(), strict=True)}

    def _take(self, sample: Any) -> bool:
        """Take a sample into ``sample``; False when the call failed."""
        return attempt(functools.partial(self._take_into, sample), self._errors) is not None

    def close(self) -> None:
        for sample in (self._previous, self._spare):
            attempt(functools.partial(self._nvml.nvmlGpmSampleFree, sample), self._errors)
