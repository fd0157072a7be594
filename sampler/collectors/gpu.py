"""NVIDIA GPUs through an NVML binding (``pynvml`` or a module that imitates it).

Only ever imported by the sampling child (or the in-thread fallback): an NVML
call that segfaults or hangs must never do so inside the backend.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psutil

from sampler import catalogue
from sampler.collectors.base import MISSING, Collector, Rates, attempt
from sampler.collectors.gpu_devices import choose, mig_devices, nvml_errors, owned, uuid_of
from sampler.collectors.gpu_errors import GpuHealth, error_name
from sampler.collectors.gpu_events import XidWatch
from sampler.collectors.gpu_gpm import GPM_METRICS, GpmPair
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

_REASON_FIELDS = {
    "sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "hw_power_brake": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
    "sw_thermal": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
}
THROTTLE_FIELDS = tuple(
    (f"throttled_{part}_seconds", _REASON_FIELDS[part]) for part, _, _ in catalogue.THROTTLE_REASONS
)
"""Each cumulative throttle duration's suffix and the binding's name for its NVML field (a
count of nanoseconds). The names, not their numbers: NVML renumbered these fields between
releases, and the binding's numbers are those of the driver it was made for."""
ENERGY_FIELD = "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
"""The field holding ``nvmlDeviceGetTotalEnergyConsumption``'s counter (mJ), read in the same call."""

# Per-device signal suffixes, in record order. The first five are SPEC 2's, the
# next two extras users of GPU dashboards expect, then the training-specific ones.
GPU_SIGNALS = (
    "memory_clock_mhz",
    "sm_clock_mhz",
    "memory_allocated_bytes",
    "memory_allocated_percent",
    "temperature_celsius",
    "utilization_percent",
    "power_watts",
    "process_memory_bytes",
    "tree_memory_bytes",
    "clock_throttle_reasons",
    "throttle_power",
    "throttle_thermal",
    "throttle_hw_slowdown",
    "power_limit_watts",
    *(suffix for suffix, _ in THROTTLE_FIELDS),
    *(suffix + catalogue.RATE_SUFFIX for suffix, _ in THROTTLE_FIELDS),
    "energy_joules",
    "energy_joules" + catalogue.RATE_SUFFIX,
    "xid_critical",
    *(suffix for suffix, _ in GPM_METRICS),
)
TRACKED_SIGNALS = tuple(s for s in GPU_SIGNALS if catalogue.SIGNALS[catalogue.GPU_KEY_PREFIX + s].peak)
"""Per-device suffixes with a peak (``sample_tracked`` and ``marks`` give them in this order):
memory, utilization and the backend's memory are read between records, at the inner rate;
the clock's and power's peaks come from the driver's sample buffer alone (``BUFFERED``)."""
BUFFERED = {
    "sm_clock_mhz": ("NVML_PROCESSOR_CLK_SAMPLES", 1.0),
    "utilization_percent": ("NVML_GPU_UTILIZATION_SAMPLES", 1.0),
    "power_watts": ("NVML_TOTAL_POWER_SAMPLES", 0.001),
}
"""Tracked suffixes the driver samples on its own (``nvmlDeviceGetSamples``): the binding's
name of the sampling type and the scale to the signal's unit (mW to W). The highest of its
samples since the previous record is that window's exact high, however brief."""
AVERAGED_SIGNALS = tuple(s for s in GPU_SIGNALS if catalogue.SIGNALS[catalogue.GPU_KEY_PREFIX + s].mean)
"""Per-device tracked suffixes whose mean between records is published too."""

# NVML's clocks event (formerly "throttle") reason bits, nvml.h's
# nvmlClocksEventReason* (same values under the older nvmlClocksThrottleReason* names).
REASON_SW_POWER_CAP = 0x04
REASON_HW_SLOWDOWN = 0x08
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
THROTTLE_POWER = REASON_SW_POWER_CAP | REASON_HW_POWER_BRAKE
THROTTLE_THERMAL = REASON_SW_THERMAL | REASON_HW_THERMAL

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
NS_PER_S = 1e9
MJ_PER_J = 1000.0
_FIELD_VALUE_TYPES = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
"""``nvmlValue_t``'s member for each ``NVML_VALUE_TYPE_*`` (nvml.h's order)."""
LOST_CODES = frozenset({NVML_ERROR_NOT_FOUND, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED})
"""Codes that mean the device itself is gone: off the bus, or needing a reset. A device whose
readings stopped with one is probed with backoff (``MAX_LOST_BACKOFF_SAMPLES``); after any
other, at every sample."""

FOREIGN_SAMPLES = 3
"""Samples in a row in which NVML listed a GPU process this pid namespace has no such pid
for, and none of the backend's, before the backend's GPU memory is declared unattributable:
NVML lists host pids, which a backend in a container with its own pid namespace never sees
(one sample could be a process that just exited)."""
MAX_LOST_BACKOFF_SAMPLES = 64
"""A lost device is probed again after 1, 2, 4 ... samples, at most this many."""

# Each reading, with the binding's functions that make it, preferred first: a
# driver too old for the newer name raises FUNCTION_NOT_FOUND (pynvml's
# unversioned process lists raise NVMLLibraryMismatchError) or, for a versioned
# struct, ARGUMENT_VERSION_MISMATCH, and the next one is used. nvmlDeviceGetTemperature
# is gone from CUDA 14's NVML; nvmlDeviceGetTemperatureV replaces it.
_CALLS: dict[str, tuple[str, ...]] = {
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
    **{f"samples of {suffix}": ("nvmlDeviceGetSamples",) for suffix in BUFFERED},
}
NO_SAMPLES_YET = frozenset({NVML_ERROR_NOT_FOUND})
"""What nvmlDeviceGetSamples answers when the driver took no sample since the time asked:
nothing is lost."""


class _Stopped(Exception):
    """A reading found the device gone, or still failing; the rest of its readings are skipped."""


@dataclass
class _Device:
    label: str
    """Its NVML index, or ``<index>-mig<slot>`` for a MIG device (``catalogue.DEVICE_LABEL``)."""
    handle: Any
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
    backoff: int = 0
    """Samples skipped after the latest failed probe of a lost device."""
    skip: int = 0
    """Samples still skipped before the next probe."""
    gpm: GpmPair | None = None
    """Its GPM samples, where it has GPM."""
    seen_us: dict[str, int] = field(default_factory=dict)
    """Per buffered suffix, the newest driver sample taken into a peak (CPU time, µs)."""
    rates: Rates = field(default_factory=lambda: Rates(len(THROTTLE_FIELDS) + 1))
    """The throttle durations' shares of the time between samples, and the mean power."""


class GpuCollector(Collector):
    """Readings of the chosen NVIDIA devices, named by NVML index ``i`` (a MIG device of a GPU
    in MIG mode by ``<i>-mig<slot>``, with the readings NVML gives a MIG device: its memory and
    its processes'; the GPU itself keeps its clocks, power, temperature and counters):

    - ``memory_clock_mhz``, ``sm_clock_mhz``; ``memory_allocated_bytes`` and
      ``_percent`` (all processes); ``temperature_celsius``;
      ``utilization_percent``; ``power_watts`` and ``power_limit_watts`` (the
      enforced limit);
    - ``process_memory_bytes``: what the backend (``pid``) holds on the device,
      ``tree_memory_bytes``: the backend's and its descendants' (DataLoader
      workers, ...), both from NVML's running-process lists: 0 without a context
      there, NaN when the driver cannot tell (MIG, some containers);
    - ``clock_throttle_reasons``: NVML's clocks event reasons bitmask as a
      number (``nvmlClocksEventReason*``: 0x4 software power cap, 0x8 hardware
      slowdown, 0x20 software thermal, 0x40 hardware thermal, 0x80 power brake,
      0x1 idle, ...), and read from it, 1 or 0: ``throttle_power`` (software power
      cap or hardware power brake), ``throttle_thermal`` (software or hardware
      thermal slowdown), ``throttle_hw_slowdown``;
    - ``throttled_<reason>_seconds`` (``sw_power_cap``, ``hw_power_brake``,
      ``sw_thermal``, ``hw_thermal``): the time that reason held the clocks
      down, counted by the driver since it loaded (field values), and each one's
      ``_per_second``, its share of the time between samples;
    - ``energy_joules``: the driver's total energy counter (J since it loaded), and
      its ``_per_second``, the mean power (W) between samples;
    - ``xid_critical``: the latest critical XID error since the previous sample (0:
      none), from NVML's events, waited for in a thread of the child's (``XidWatch``);
    - on GPUs with GPM (Hopper and later), activity since the previous sample
      (``GpmPair``): ``sm_activity_percent``, ``sm_occupancy_percent``,
      ``tensor_activity_percent``, ``dram_bandwidth_percent`` and PCIe and NVLink
      ``..._tx``/``_rx_mb_per_second`` (MiB/s).

    ``memory_allocated_bytes``, ``utilization_percent`` and
    ``process_memory_bytes`` are tracked between records (utilization also
    averaged); the peaks of utilization, ``power_watts`` and ``sm_clock_mhz``
    also come from the driver's own samples since the previous record, where it
    keeps them (``marks``). A reading the device does not support is NaN and not asked
    again. A device whose every reading fails with an NVML error reads NaN while the others
    keep flowing, said and counted by ``health`` (``gpu_errors``), and is probed with one call a
    sample, or, when it is lost (off the bus), after 1, 2, 4 ... up to
    ``MAX_LOST_BACKOFF_SAMPLES`` samples.
    """

    category = "gpu"

    def __init__(
        self,
        nvml: ModuleType,
        handles: dict[str, Any],
        pid: int = 0,
        health: GpuHealth | None = None,
        initialised: bool = True,
    ) -> None:
        """``handles``: device label -> NVML handle, in sampling order; None for a device an
        earlier child read that this one could not open yet (``health`` said so), opened with
        backoff. ``health``: what earlier children left, and what this one found as it opened
        (a fresh one by default). ``initialised``: nvmlInit succeeded (else it is tried again
        before such a device is)."""
        self._nvml = nvml
        self._errors = nvml_errors(nvml)
        self._initialised = initialised
        self._init_failed: int | None = None
        """The error nvmlInit, tried again, met in the current ``sample()``."""
        self._devices = [_Device(label, handle) for label, handle in handles.items()]
        self.uuids: dict[str, str] = {}
        """Device label -> its UUID ("" where NVML does not tell), read as each device opens."""
        self.health = health if health is not None else GpuHealth(nvml)
        self._mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        self._functions = {
            reading: [getattr(nvml, name) for name in names if hasattr(nvml, name)]
            for reading, names in _CALLS.items()
        }
        self.names = _per_device(handles, GPU_SIGNALS)
        self.tracked = _per_device(handles, TRACKED_SIGNALS)
        self.averaged = _per_device(handles, AVERAGED_SIGNALS)
        self._sampling = {
            suffix: (kind, scale)
            for suffix, (name, scale) in BUFFERED.items()
            if isinstance(kind := getattr(nvml, name, None), int)
        }
        """Buffered suffix -> (the binding's sampling type, scale), for the types it knows."""
        ids = {name: getattr(nvml, name, None) for name in (ENERGY_FIELD, *(n for _, n in THROTTLE_FIELDS))}
        self._energy_id = ids[ENERGY_FIELD]
        self._throttle_ids = [ids[name] for _, name in THROTTLE_FIELDS]
        self._field_ids = [i for i in ids.values() if isinstance(i, int)]
        """The fields asked for in one nvmlDeviceGetFieldValues call: those the binding knows."""
        for dev in self._devices:
            if dev.handle is None:
                dev.stopped = NVML_ERROR_UNKNOWN  # until a probe opens it: its readings are not asked
            else:
                self._attach(dev, None if dev.label.isdigit() else handles.get(dev.label.split("-", 1)[0]))
        gpus = {label: handle for label, handle in handles.items() if label.isdigit() and handle is not None}
        self._xids = XidWatch.open(nvml, gpus, self._errors) if gpus else None
        self._xid_latest: dict[str, int] | None = None
        """The latest critical XID of each watched device in the window the current ``sample()`` closes."""
        self._process = attempt(functools.partial(psutil.Process, pid)) if pid > 0 else None
        self._own = None if self._process is None else frozenset({self._process.pid})
        self._tree: frozenset[int] | None = None
        self._foreign = 0
        """Samples in a row whose process lists held only pids from another pid namespace."""
        self._attributable = True
        """No device's process list in the latest ``sample()`` was from another pid namespace."""

    @classmethod
    def open(
        cls,
        module_name: str,
        devices: str | tuple[str, ...] = "all",
        pid: int = 0,
        share: tuple[int, int] | None = None,
        read_before: tuple[str, ...] = (),
        stopped_before: tuple[str, ...] = (),
    ) -> GpuCollector | None:
        """Import the binding, initialise NVML and choose the devices: ``all``,
        ``visible`` (``CUDA_VISIBLE_DEVICES``, read as CUDA reads it) or those
        listed (NVML indices or GPU/MIG UUIDs); ``pid`` is the process whose own
        and whose tree's GPU memory is read (0: none). ``share`` (local rank,
        local world size): keep only this rank's part of them (``owned``). None
        when NVML is unavailable (no driver, no GPU, no ``pynvml``: gpu is then
        a no-op) or no device is chosen. ``read_before`` and ``stopped_before``:
        the devices earlier children read, and those of them stopped
        (``Sources``): one of them this child cannot open is said to have stopped
        reading, and then a collector of no devices keeps them counted."""
        try:
            nvml = importlib.import_module(module_name)
        except Exception as exc:
            log.debug("resource monitor: no NVML via %r: %s", module_name, exc)
            return None
        health = GpuHealth(nvml, read_before, stopped_before)
        try:
            nvml.nvmlInit()
        except Exception as exc:
            if not read_before:
                log.debug("resource monitor: no NVML via %r: %s", module_name, exc)
                return None
            code = getattr(exc, "value", None)
            if not isinstance(code, int):
                code = None
            cause = bounded_repr(exc) if code is None else error_name(nvml, code)
            health.unopened(read_before, f"nvmlInit failed with {cause}", code)
            return cls(nvml, dict.fromkeys(read_before), pid, health, initialised=False)
        handles: dict[int, Any] = {}
        errors = nvml_errors(nvml)
        counted = attempt(functools.partial(_outcome, nvml.nvmlDeviceGetCount, (), errors))
        count, code = counted or (0, None)
        refused: dict[int | None, tuple[str, int]] = {}
        """Device index (None: every one) -> the call that failed to open it, and its NVML error."""
        if code is not None:
            refused[None] = ("nvmlDeviceGetCount", code)
        for index in range(count or 0):
            outcome = attempt(functools.partial(_outcome, nvml.nvmlDeviceGetHandleByIndex, (index,), errors))
            handle, code = outcome or (None, None)
            if handle is not None:
                handles[index] = handle
            elif code is not None:
                refused[index] = ("nvmlDeviceGetHandleByIndex", code)
        chosen, only = choose(nvml, handles, devices, errors) if handles else ([], {})
        if share is not None:
            # A launcher that gives each rank its own device makes it the only one visible.
            one_each = devices == "visible" and "CUDA_VISIBLE_DEVICES" in os.environ and len(chosen) == 1
            chosen = owned(chosen, *share, one_each=one_each)
        chosen = sorted(chosen)
        labelled: dict[str, Any] = {}
        for index in chosen:
            labelled[str(index)] = handles[index]
            for slot, mig in mig_devices(nvml, handles[index], errors).items():
                if index not in only or slot in only[index]:
                    labelled[f"{index}-mig{slot}"] = mig
        unopened: dict[tuple[str, int] | None, list[str]] = {}
        for label in read_before:
            if label not in labelled:
                index = int(label.split("-", 1)[0])
                unopened.setdefault(refused.get(index) or refused.get(None), []).append(label)
                labelled[label] = None
        for failed, labels in unopened.items():
            if failed is None:
                health.unopened(labels, "NVML no longer lists it", None)
            else:
                call, code = failed
                health.unopened(labels, f"{call} failed with {error_name(nvml, code)}", code)
        if not labelled:
            attempt(nvml.nvmlShutdown, errors)
            return None
        return cls(
            nvml, dict(sorted(labelled.items(), key=lambda kv: catalogue.device_order(kv[0]))), pid, health
        )

    def sample(self) -> list[float]:
        self._tree = self._scan_tree()
        self._xid_latest = None if self._xids is None else self._xids.take()
        self._attributable = True
        values: list[float] = []
        verdicts: dict[str, int | None] = {}
        self._init_failed = None
        for dev in self._devices:
            if dev.skip:  # a lost device between probes
                dev.skip -= 1
                values += [MISSING] * len(GPU_SIGNALS)
                continue
            dev.read, dev.failed = False, None
            try:
                if dev.handle is None:
                    self._open_late(dev)
                values += self._readings(dev)
            except _Stopped:
                values += [MISSING] * len(GPU_SIGNALS)
            verdicts[dev.label] = self._judge(dev)
        self.health.judge(verdicts)
        self._check_pid_namespace()
        return values

    def _judge(self, dev: _Device) -> int | None:
        """The NVML error that failed every reading of ``dev`` in this sample (None: some
        answered, or none failed: all unsupported); a lost device's next probe is scheduled."""
        dev.stopped = None if dev.read else dev.failed
        if dev.stopped in LOST_CODES or dev.handle is None:
            dev.backoff = min(max(1, 2 * dev.backoff), MAX_LOST_BACKOFF_SAMPLES)
            dev.skip = dev.backoff
        else:
            dev.backoff = 0
        return dev.stopped

    def _open_late(self, dev: _Device) -> None:
        """Open a device an earlier child read that this one could not open yet (NVML
        initialised first, where it was not); raises ``_Stopped`` when it still cannot."""
        nvml, errors = self._nvml, self._errors
        if not self._initialised:
            if self._init_failed is None:  # once a sample, whichever device is due first
                outcome = attempt(functools.partial(_outcome, nvml.nvmlInit, (), errors))
                self._init_failed = NVML_ERROR_UNKNOWN if outcome is None else outcome[1]
                self._initialised = self._init_failed is None
            if not self._initialised:
                dev.failed = self._init_failed
                raise _Stopped
        index, _, slot = dev.label.partition("-mig")
        outcome = attempt(functools.partial(_outcome, nvml.nvmlDeviceGetHandleByIndex, (int(index),), errors))
        gpu, code = outcome or (None, NVML_ERROR_UNKNOWN)
        handle = gpu
        if slot and gpu is not None:
            handle = mig_devices(nvml, gpu, errors).get(int(slot))
        if handle is None:
            dev.failed = NVML_ERROR_NOT_FOUND if code is None else code
            raise _Stopped
        dev.handle = handle
        self._attach(dev, gpu if slot else None)

    def _attach(self, dev: _Device, gpu: Any) -> None:
        """Start on a device just opened (``gpu``: a MIG device's GPU): its UUID, the start of
        its driver-sample peaks (now, not before), its GPM samples."""
        self.uuids[dev.label] = uuid = uuid_of(self._nvml, dev.handle, self._errors) or ""
        self.health.add(dev.label, uuid)
        dev.seen_us = dict.fromkeys(self._sampling, time.time_ns() // 1000)
        dev.gpm = GpmPair.open(self._nvml, dev.handle, self._errors, gpu)

    def _check_pid_namespace(self) -> None:
        """Whether NVML's pids are this namespace's: a sample whose lists hold none of the
        backend's pids and some this namespace has not got attributes nothing (the
        backend's GPU memory is absent, not 0); after ``FOREIGN_SAMPLES`` such samples in a
        row that is said once, and holds from then on."""
        self._foreign = 0 if self._attributable else self._foreign + 1
        if self._foreign >= FOREIGN_SAMPLES:
            self._own = self._tree = None
            log.warning(
                "resource monitor: NVML lists GPU processes by pids this pid namespace has not got (the "
                "backend runs in a container with a pid namespace of its own, and NVML reports the host's "
                "pids), so the GPU memory the backend and its tree hold cannot be attributed: "
                "process_memory_bytes and tree_memory_bytes are left absent"
            )

    def _foreign_pids(self, listed: list[Any]) -> bool:
        """``listed`` holds none of the backend's tree and a pid this namespace has not got."""
        tree = self._tree
        if tree is None or not listed:
            return False
        pids = {process.pid for process in listed}
        return not pids & tree and any(not os.path.exists(f"/proc/{pid}") for pid in pids)

    def sample_tracked(self) -> list[float]:
        values: list[float] = []
        for dev in self._devices:
            try:
                if dev.stopped is not None:  # probed by sample() only
                    raise _Stopped
                memory = self._read(dev, "memory")
                utilization = self._read(dev, "utilization")
                compute = self._read(dev, "compute")
            except _Stopped:
                values += [MISSING] * len(TRACKED_SIGNALS)
                continue
            polled = {
                "memory_allocated_bytes": MISSING if memory is None else float(memory.used),
                "utilization_percent": MISSING if utilization is None else float(utilization.gpu),
                "process_memory_bytes": _held(
                    compute, None if self._foreign_pids(compute or []) else self._own
                ),
            }
            values += [polled.get(suffix, MISSING) for suffix in TRACKED_SIGNALS]
        return values

    def marks(self) -> list[float]:
        """The highest of the driver's own samples (``nvmlDeviceGetSamples``) since the
        previous record, for the tracked readings it samples (``BUFFERED``); NaN elsewhere,
        for a device not reading, or with no sample since."""
        values: list[float] = []
        for dev in self._devices:
            highs = {} if dev.stopped is not None else self._buffered_highs(dev)
            values += [highs.get(suffix, MISSING) for suffix in TRACKED_SIGNALS]
        return values

    def _buffered_highs(self, dev: _Device) -> dict[str, float]:
        highs: dict[str, float] = {}
        for suffix, (kind, scale) in self._sampling.items():
            try:
                found = self._read(
                    dev, f"samples of {suffix}", kind, dev.seen_us[suffix], none=NO_SAMPLES_YET
                )
            except _Stopped:
                return highs
            if not found:
                continue
            value_type, samples = found
            numbers = [n for s in samples if (n := _value(s.sampleValue, value_type)) is not None]
            if not numbers:  # none, or of a type nvml.h has not
                continue
            highs[suffix] = max(numbers) * scale
            dev.seen_us[suffix] = max(int(s.timeStamp) for s in samples)
        return highs

    def _readings(self, dev: _Device) -> list[float]:
        nvml = self._nvml
        memory = self._read(dev, "memory")  # first: a device not reading costs one call, not ten
        mem_clock = self._read(dev, "mem_clock", nvml.NVML_CLOCK_MEM)
        sm_clock = self._read(dev, "sm_clock", nvml.NVML_CLOCK_SM)
        temperature = self._read(dev, "temperature", nvml.NVML_TEMPERATURE_GPU)
        utilization = self._read(dev, "utilization")
        power_mw = self._read(dev, "power")
        processes = self._processes(dev)
        reasons = self._read(dev, "throttle")
        limit_mw = self._read(dev, "power_limit")
        energy, throttled = self._counters(dev)
        rates = dev.rates.update([*throttled, energy], time.monotonic())
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
            _held(processes, self._own if self._attributable else None),
            _held(processes, self._tree if self._attributable else None),
            _number(reasons),
            _flag(reasons, THROTTLE_POWER),
            _flag(reasons, THROTTLE_THERMAL),
            _flag(reasons, REASON_HW_SLOWDOWN),
            MISSING if limit_mw is None else limit_mw / 1000.0,
            *throttled,
            *rates[:-1],
            energy,
            rates[-1],
            self._xid(dev),
            *(dev.gpm.read() if dev.gpm is not None else [MISSING] * len(GPM_METRICS)),
        ]

    def _xid(self, dev: _Device) -> float:
        """The latest critical XID since the previous sample, 0 without one; NaN where the
        driver cannot deliver them."""
        watch, latest = self._xids, self._xid_latest
        if watch is None or latest is None or dev.label not in watch.watched or not watch.watching:
            return MISSING
        return float(latest.get(dev.label, 0))

    def _counters(self, dev: _Device) -> tuple[float, list[float]]:
        """The energy counter (J) and the throttle durations (s), from one
        nvmlDeviceGetFieldValues call; energy from nvmlDeviceGetTotalEnergyConsumption
        where field values do not give it. NaN where the driver has no such counter."""
        found: dict[int, float] = {}
        values = self._read(dev, "fields", self._field_ids) if self._field_ids else None
        for value in values or ():
            number = _value(value.value, value.valueType) if value.nvmlReturn == 0 else None
            if number is not None:
                found[value.fieldId] = number
        energy_mj = found.get(self._energy_id) if self._energy_id is not None else None
        if energy_mj is None:
            energy_mj = self._read(dev, "energy")
        throttled = [found[i] / NS_PER_S if i in found else MISSING for i in self._throttle_ids]
        return (MISSING if energy_mj is None else energy_mj / MJ_PER_J), throttled

    def _processes(self, dev: _Device) -> list[Any] | None:
        """Both running-process lists of ``dev`` in one, or None when they cannot
        say who holds what: the compute list (where training lives) failed, or
        the graphics list failed this time. A graphics list the device does not
        support (compute-only boards) holds nothing."""
        compute = self._read(dev, "compute")
        graphics = self._read(dev, "graphics")
        if compute is None or (graphics is None and "graphics" not in dev.unsupported):
            return None
        listed = [*compute, *(graphics or ())]
        if self._foreign_pids(listed):
            self._attributable = False
        return listed

    def _read(self, dev: _Device, reading: str, *args: Any, none: frozenset[int] = frozenset()) -> Any:
        """One reading of ``dev``, or None when it failed (or answered one of the codes
        ``none``, which mean there is nothing to read). Notes in ``dev`` whether it answered
        or the NVML error it met; raises ``_Stopped`` when the device is gone, or when it was
        not reading and still fails (the rest of this sample's readings are not asked)."""
        if reading in dev.unsupported:
            return None
        functions = self._functions[reading]
        while functions:
            outcome = attempt(
                functools.partial(_outcome, functions[0], (dev.handle, *args), self._errors, self._mismatch)
            )
            if outcome is None:  # not an NVML error: a bug, reported once by attempt()
                return None
            value, code = outcome
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
                raise _Stopped
            return None
        return None

    def _scan_tree(self) -> frozenset[int] | None:
        """The backend and its descendants now (processes come and go), None if unreadable
        (or unattributable: see ``_check_pid_namespace``)."""
        process = self._process
        if process is None or self._own is None:
            return None
        children = attempt(functools.partial(process.children, recursive=True))
        return None if children is None else frozenset([process.pid, *(c.pid for c in children)])

    def close(self) -> None:
        for dev in self._devices:
            if dev.gpm is not None:
                dev.gpm.close()
                dev.gpm = None
        if self._xids is not None:
            self._xids.close()
            self._xids = None
        self._devices = []
        if self._initialised:
            self._initialised = False
            attempt(self._nvml.nvmlShutdown, self._errors)


def _outcome(
    function: Callable[..., Any],
    args: Sequence[Any],
    errors: tuple[type[BaseException], ...],
    mismatch: type[BaseException] | None = None,
) -> tuple[Any, int | None]:
    """``function(*args)`` and None, or None and the NVML error code it failed with (a
    ``mismatch``, the binding's NVMLLibraryMismatchError: FUNCTION_NOT_FOUND)."""
    try:
        return function(*args), None
    except errors as exc:
        if mismatch is not None and isinstance(exc, mismatch):
            return None, NVML_ERROR_FUNCTION_NOT_FOUND
        code = getattr(exc, "value", None)
        return None, code if isinstance(code, int) else NVML_ERROR_UNKNOWN


def _per_device(handles: Iterable[str], suffixes: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"resource/gpu/{i}/{suffix}" for i in handles for suffix in suffixes)


def _held(processes: list[Any] | None, pids: frozenset[int] | None) -> float:
    """Bytes that ``pids`` hold according to a device's process ``processes``;
    NaN when either is unknown or the driver cannot tell one's memory. A process
    listed more than once (a compute and a graphics context) holds one
    allocation: its largest figure counts."""
    if processes is None or pids is None:
        return MISSING
    held: dict[int, int] = {}
    for process in processes:
        if process.pid in pids:
            used = process.usedGpuMemory
            if used is None:
                return MISSING
            held[process.pid] = max(used, held.get(process.pid, 0))
    return float(sum(held.values()))


def _value(union: Any, value_type: int) -> float | None:
    """An ``nvmlValue_t`` read as its ``NVML_VALUE_TYPE_*`` says; None for a type nvml.h has not."""
    if not 0 <= value_type < len(_FIELD_VALUE_TYPES):
        return None
    return float(getattr(union, _FIELD_VALUE_TYPES[value_type]))


def _flag(reasons: object, bits: int) -> float:
    if reasons is None:
        return MISSING
    return 1.0 if int(reasons) & bits else 0.0  # type: ignore[call-overload]


def _number(value: object) -> float:
    return MISSING if value is None else float(value)  # type: ignore[arg-type]
