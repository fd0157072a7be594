"""NVIDIA GPUs through an NVML binding (``pynvml`` or a module that imitates it).

Only ever imported by the sampling child (or the in-thread fallback): an NVML
call that segfaults or hangs must never do so inside the backend. The calls and
their fallbacks are ``sampler.collectors.nvml``'s; here is what is read of them.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psutil

from sampler import catalogue
from sampler.catalogue import Signal
from sampler.collectors.base import MISSING, Collector, Readings, attempt
from sampler.collectors.gpu_devices import choose, mig_devices, nvml_errors, owned, uuid_of
from sampler.collectors.gpu_errors import NO_DRIVER, GpuHealth, error_name
from sampler.collectors.gpu_events import XidWatch
from sampler.collectors.gpu_gpm import GpmPair
from sampler.collectors.nvml import (
    LOST_CODES,
    NO_SAMPLES_YET,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_UNKNOWN,
    Calls,
    CallState,
    Stopped,
    call,
    quarantined,
    value,
)
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

_REASON_FIELDS = {
    "sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "hw_power_brake": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
    "sw_thermal": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
}
THROTTLED_FIELDS = tuple(
    (catalogue.THROTTLED[part], _REASON_FIELDS[part]) for part, _, _ in catalogue.THROTTLE_REASONS
)
"""Each cumulative throttle duration and the binding's name for its NVML field (a count of
nanoseconds). The names, not their numbers: NVML renumbered these fields between releases,
and the binding's numbers are those of the driver it was made for."""
THROTTLE_FIELDS = tuple((signal.suffix, name) for signal, name in THROTTLED_FIELDS)
"""The same by each signal's suffix (``throttled_sw_power_cap_seconds``)."""
ENERGY_FIELD = "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
"""The field holding ``nvmlDeviceGetTotalEnergyConsumption``'s counter (mJ), read in the same call."""
BUFFERED = {
    catalogue.GPU_SM_CLOCK: ("NVML_PROCESSOR_CLK_SAMPLES", 1.0),
    catalogue.GPU_UTILIZATION: ("NVML_GPU_UTILIZATION_SAMPLES", 1.0),
    catalogue.GPU_POWER: ("NVML_TOTAL_POWER_SAMPLES", 0.001),
}
"""Tracked signals the driver samples on its own (``nvmlDeviceGetSamples``): the binding's
name of the sampling type and the scale to the signal's unit (mW to W). The highest of its
samples since the previous record is that window's exact high, however brief."""

# NVML's clocks event (formerly "throttle") reason bits, nvml.h's
# nvmlClocksEventReason* (same values under the older nvmlClocksThrottleReason* names).
REASON_SW_POWER_CAP = 0x04
REASON_HW_SLOWDOWN = 0x08
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
THROTTLE_POWER = REASON_SW_POWER_CAP | REASON_HW_POWER_BRAKE
THROTTLE_THERMAL = REASON_SW_THERMAL | REASON_HW_THERMAL
NS_PER_S = 1e9
MJ_PER_J = 1000.0

FOREIGN_SAMPLES = 3
"""Samples in a row in which NVML listed a GPU process this pid namespace has no such pid
for, and none of the backend's, before the backend's GPU memory is declared unattributable:
NVML lists host pids, which a backend in a container with its own pid namespace never sees
(one sample could be a process that just exited)."""
MAX_LOST_BACKOFF_SAMPLES = 64
"""A lost device (``LOST_CODES``) is probed again after 1, 2, 4 ... samples, at most this
many; after any other error, at every sample."""


def _samples_of(signal: Signal) -> str:
    """The reading of ``signal``'s driver samples (``Calls``)."""
    return f"samples of {signal.suffix}"


SAMPLE_CALLS = {_samples_of(signal): ("nvmlDeviceGetSamples",) for signal in BUFFERED}
"""A reading per buffered signal: a sampling type a device does not support is given up alone."""


@dataclass
class _Device(CallState):
    backoff: int = 0
    """Samples skipped after the latest failed probe of a lost device."""
    skip: int = 0
    """Samples still skipped before the next probe."""
    gpm: GpmPair | None = None
    """Its GPM samples, where it has GPM."""
    seen_us: dict[Signal, int] = field(default_factory=dict)
    """Per buffered signal, the newest driver sample taken into a peak (CPU time, µs)."""


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
        self._devices = [_Device(handle, label=label) for label, handle in handles.items()]
        self.devices = tuple(handles)
        self.uuids: dict[str, str] = {}
        """Device label -> its UUID ("" where NVML does not tell), read as each device opens."""
        self.health = health if health is not None else GpuHealth(nvml)
        self._calls = Calls(nvml, self._errors, SAMPLE_CALLS)
        self._sampling = {
            signal: (kind, scale)
            for signal, (name, scale) in BUFFERED.items()
            if isinstance(kind := getattr(nvml, name, None), int)
        }
        """Buffered signal -> (the binding's sampling type, scale), for the types it knows."""
        ids = {name: getattr(nvml, name, None) for name in (ENERGY_FIELD, *(n for _, n in THROTTLED_FIELDS))}
        self._energy_id = ids[ENERGY_FIELD]
        self._throttle_ids = [(signal, ids[name]) for signal, name in THROTTLED_FIELDS]
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
        left_out: tuple[str, ...] = (),
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
        reading, and then a collector of no devices keeps them counted. ``left_out``: the
        quarantined devices (``Sources.gpus_quarantined``), never opened."""
        try:
            nvml = importlib.import_module(module_name)
        except Exception as exc:
            log.debug("resource monitor: no NVML via %r: %s", module_name, exc)
            return None
        health = GpuHealth(nvml, read_before, stopped_before)
        expected = tuple(label for label in read_before if not quarantined(label, left_out))
        try:
            nvml.nvmlInit()
        except Exception as exc:
            code = getattr(exc, "value", None)
            if not isinstance(code, int):
                code = None
            if not expected and code in NO_DRIVER:
                log.debug("resource monitor: no NVML via %r: %s", module_name, exc)
                return None
            cause = f"nvmlInit failed with {bounded_repr(exc) if code is None else error_name(nvml, code)}"
            if expected:
                health.unopened(expected, cause, code)
            else:
                health.refused("NVIDIA's NVML", cause, code)
            return cls(nvml, dict.fromkeys(expected), pid, health, initialised=False)
        handles: dict[int, Any] = {}
        errors = nvml_errors(nvml)
        counted = attempt(functools.partial(call, nvml.nvmlDeviceGetCount, (), errors))
        count, code = counted or (0, None)
        refused: dict[int | None, tuple[str, int]] = {}
        """Device index (None: every one) -> the call that failed to open it, and its NVML error."""
        if code is not None:
            refused[None] = ("nvmlDeviceGetCount", code)
        for index in range(count or 0):
            outcome = attempt(
                functools.partial(call, nvml.nvmlDeviceGetHandleByIndex, (index,), errors, None, str(index))
            )
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
        labelled = {label: handle for label, handle in labelled.items() if not quarantined(label, left_out)}
        unopened: dict[tuple[str, int] | None, list[str]] = {}
        for label in expected:
            if label not in labelled:
                index = int(label.split("-", 1)[0])
                unopened.setdefault(refused.get(index) or refused.get(None), []).append(label)
                labelled[label] = None
        for failed, labels in unopened.items():
            if failed is None:
                health.unopened(labels, "NVML no longer lists it", None)
            else:
                function, code = failed
                health.unopened(labels, f"{function} failed with {error_name(nvml, code)}", code)
        for at, (function, code) in refused.items():  # those no child read: not said above
            gpu = (str(at),)
            known = expected if at is None else [x for x in (*expected, *left_out) if quarantined(x, gpu)]
            if not known:
                what = "any GPU" if at is None else f"GPU {at}"
                health.refused(what, f"{function} failed with {error_name(nvml, code)}", code)
        if not labelled and not health.stops:
            attempt(nvml.nvmlShutdown, errors)
            return None
        return cls(
            nvml, dict(sorted(labelled.items(), key=lambda kv: catalogue.device_order(kv[0]))), pid, health
        )

    def read_devices(self) -> list[Readings]:
        if not self._devices:  # none could be opened (said as it opened)
            return []
        self._tree = self._scan_tree()
        self._xid_latest = None if self._xids is None else self._xids.take()
        self._attributable = True
        values: list[Readings] = []
        verdicts: dict[str, int | None] = {}
        self._init_failed = None
        for dev in self._devices:
            if dev.skip:  # a lost device between probes
                dev.skip -= 1
                values.append({})
                continue
            dev.read, dev.failed = False, None
            try:
                if dev.handle is None:
                    self._open_late(dev)
                values.append(self._readings(dev))
            except Stopped:
                values.append({})
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
        initialised first, where it was not); raises ``Stopped`` when it still cannot."""
        nvml, errors = self._nvml, self._errors
        if not self._initialised:
            if self._init_failed is None:  # once a sample, whichever device is due first
                outcome = attempt(functools.partial(call, nvml.nvmlInit, (), errors))
                self._init_failed = NVML_ERROR_UNKNOWN if outcome is None else outcome[1]
                self._initialised = self._init_failed is None
            if not self._initialised:
                dev.failed = self._init_failed
                raise Stopped
        index, _, slot = dev.label.partition("-mig")
        outcome = attempt(
            functools.partial(call, nvml.nvmlDeviceGetHandleByIndex, (int(index),), errors, None, index)
        )
        gpu, code = outcome or (None, NVML_ERROR_UNKNOWN)
        handle = gpu
        if slot and gpu is not None:
            handle = mig_devices(nvml, gpu, errors).get(int(slot))
        if handle is None:
            dev.failed = NVML_ERROR_NOT_FOUND if code is None else code
            raise Stopped
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

    def read_tracked(self) -> list[Readings]:
        values: list[Readings] = []
        for dev in self._devices:
            try:
                if dev.stopped is not None:  # probed by sample() only
                    raise Stopped
                memory = self._read(dev, "memory")
                utilization = self._read(dev, "utilization")
                compute = self._read(dev, "compute")
            except Stopped:
                values.append({})
                continue
            values.append(
                {
                    catalogue.GPU_MEMORY_USED: MISSING if memory is None else float(memory.used),
                    catalogue.GPU_UTILIZATION: MISSING if utilization is None else float(utilization.gpu),
                    catalogue.GPU_PROCESS_MEMORY: _held(
                        compute, None if self._foreign_pids(compute or []) else self._own
                    ),
                }
            )
        return values

    def read_marks(self) -> list[Readings]:
        """The highest of the driver's own samples (``nvmlDeviceGetSamples``) since the
        previous record, for the tracked readings it samples (``BUFFERED``); none elsewhere,
        for a device not reading, or with no sample since."""
        return [{} if dev.stopped is not None else self._buffered_highs(dev) for dev in self._devices]

    def _buffered_highs(self, dev: _Device) -> Readings:
        highs: Readings = {}
        for signal, (kind, scale) in self._sampling.items():
            try:
                found = self._read(dev, _samples_of(signal), kind, dev.seen_us[signal], none=NO_SAMPLES_YET)
            except Stopped:
                return highs
            if not found:
                continue
            value_type, samples = found
            numbers = [n for s in samples if (n := value(s.sampleValue, value_type)) is not None]
            if not numbers:  # none, or of a type nvml.h has not
                continue
            highs[signal] = max(numbers) * scale
            dev.seen_us[signal] = max(int(s.timeStamp) for s in samples)
        return highs

    def _readings(self, dev: _Device) -> Readings:
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
        readings: Readings = {
            catalogue.GPU_MEMORY_CLOCK: _number(mem_clock),
            catalogue.GPU_SM_CLOCK: _number(sm_clock),
            catalogue.GPU_MEMORY_USED: MISSING if memory is None else float(memory.used),
            catalogue.GPU_MEMORY_PERCENT: (
                100.0 * memory.used / memory.total if memory is not None and memory.total else MISSING
            ),
            catalogue.GPU_TEMPERATURE: _number(temperature),
            catalogue.GPU_UTILIZATION: MISSING if utilization is None else float(utilization.gpu),
            catalogue.GPU_POWER: MISSING if power_mw is None else power_mw / 1000.0,
            catalogue.GPU_PROCESS_MEMORY: _held(processes, self._own if self._attributable else None),
            catalogue.GPU_TREE_MEMORY: _held(processes, self._tree if self._attributable else None),
            catalogue.GPU_THROTTLE_REASONS: _number(reasons),
            catalogue.GPU_THROTTLE_POWER: _flag(reasons, THROTTLE_POWER),
            catalogue.GPU_THROTTLE_THERMAL: _flag(reasons, THROTTLE_THERMAL),
            catalogue.GPU_THROTTLE_HW_SLOWDOWN: _flag(reasons, REASON_HW_SLOWDOWN),
            catalogue.GPU_POWER_LIMIT: MISSING if limit_mw is None else limit_mw / 1000.0,
            **self._counters(dev),
            catalogue.GPU_XID: self._xid(dev),
        }
        if dev.gpm is not None:
            readings.update(dev.gpm.readings())
        return readings

    def _xid(self, dev: _Device) -> float:
        """The latest critical XID since the previous sample, 0 without one; NaN where the
        driver cannot deliver them."""
        watch, latest = self._xids, self._xid_latest
        if watch is None or latest is None or dev.label not in watch.watched or not watch.watching:
            return MISSING
        return float(latest.get(dev.label, 0))

    def _counters(self, dev: _Device) -> Readings:
        """The throttle durations (s) and the energy counter (J), from one
        nvmlDeviceGetFieldValues call; energy from nvmlDeviceGetTotalEnergyConsumption
        where field values do not give it. Left out where the driver has no such counter."""
        found: dict[int, float] = {}
        values = self._read(dev, "fields", self._field_ids) if self._field_ids else None
        for field_value in values or ():
            number = value(field_value.value, field_value.valueType) if field_value.nvmlReturn == 0 else None
            if number is not None:
                found[field_value.fieldId] = number
        readings = {signal: found[i] / NS_PER_S for signal, i in self._throttle_ids if i in found}
        energy_mj = found.get(self._energy_id) if self._energy_id is not None else None
        if energy_mj is None:
            energy_mj = self._read(dev, "energy")
        if energy_mj is not None:
            readings[catalogue.GPU_ENERGY] = energy_mj / MJ_PER_J
        return readings

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
        return self._calls.read(dev, reading, *args, none=none)

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


def _flag(reasons: object, bits: int) -> float:
    if reasons is None:
        return MISSING
    return 1.0 if int(reasons) & bits else 0.0  # type: ignore[call-overload]


def _number(value: object) -> float:
    return MISSING if value is None else float(value)  # type: ignore[arg-type]
