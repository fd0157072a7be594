"""What ``bench/gpu_check.py`` asks NVML itself, beside the collector: the driver's facts, each
call the monitor makes timed over many calls, one GPM pair, and the energy counter's change over
a burst of work against power integrated over the same time. Every probe degrades to a value
that says why it could not be had ("not supported", "not in the binding"), never an exception.
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sampler.collectors.gpu import BUFFERED, ENERGY_FIELD, THROTTLE_FIELDS
from sampler.collectors.gpu_devices import nvml_errors
from sampler.collectors.gpu_gpm import GPM_METRICS, GpmPair

POWER_POLL_SECONDS = 0.02
"""How often the energy check reads the power draw to integrate it."""


def outcome(nvml: ModuleType, call: Callable[[], object]) -> tuple[str, object]:
    """("ok", its value), or (why it failed, None): NVML's words for its error code."""
    try:
        return "ok", call()
    except nvml_errors(nvml) as exc:
        return f"{type(exc).__name__}: {exc}", None


def ask(nvml: ModuleType, name: str, *args: object) -> tuple[str, object]:
    """``outcome`` of ``nvml.<name>(*args)``, or ("not in the binding", None)."""
    function = getattr(nvml, name, None)
    if function is None:
        return "not in the binding", None
    return outcome(nvml, functools.partial(function, *args))


def _text(value: object) -> object:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


Facts = tuple[tuple[str, str, Callable[[Any], object]], ...]
"""(key, NVML call, what its answer says) of each fact asked."""

DRIVER_FACTS: Facts = (
    ("driver_version", "nvmlSystemGetDriverVersion", _text),
    ("nvml_version", "nvmlSystemGetNVMLVersion", _text),
    ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion", _text),
    ("devices", "nvmlDeviceGetCount", _text),
)
DEVICE_FACTS: Facts = (
    ("name", "nvmlDeviceGetName", _text),
    ("uuid", "nvmlDeviceGetUUID", _text),
    ("persistence_mode", "nvmlDeviceGetPersistenceMode", _text),
    ("mig_mode", "nvmlDeviceGetMigMode", lambda mode: {"current": mode[0], "pending": mode[1]}),
    ("gpm", "nvmlGpmQueryDeviceSupport", lambda support: bool(support.isSupportedDevice)),
)


def _facts(nvml: ModuleType, asked: Facts, *args: object) -> dict[str, object]:
    """Each fact's value, or the outcome of its call where that was not ``ok``."""
    facts: dict[str, object] = {}
    for key, name, read in asked:
        status, value = ask(nvml, name, *args)
        facts[key] = read(value) if status == "ok" else status
    return facts


def driver_facts(nvml: ModuleType) -> dict[str, object]:
    """The driver's and NVML's versions, the CUDA version the driver supports, and the device count."""
    return _facts(nvml, DRIVER_FACTS)


def device_facts(nvml: ModuleType, handle: Any) -> dict[str, object]:
    """Name, UUID, persistence mode, MIG mode (current and pending, read only) and GPM support."""
    return _facts(nvml, DEVICE_FACTS, handle)


def monitored_calls(nvml: ModuleType, handle: Any) -> list[tuple[str, Callable[[], object]]]:
    """Each NVML call the gpu collector makes on a device, ready to call."""
    field_ids = [
        i for i in (getattr(nvml, n, None) for n in (ENERGY_FIELD, *(f for _, f in THROTTLE_FIELDS))) if i
    ]
    now_us = time.time_ns() // 1000
    calls: list[tuple[str, tuple[object, ...]]] = [
        ("nvmlDeviceGetMemoryInfo", ()),
        ("nvmlDeviceGetClockInfo", (getattr(nvml, "NVML_CLOCK_MEM", 2),)),
        ("nvmlDeviceGetClockInfo", (getattr(nvml, "NVML_CLOCK_SM", 1),)),
        ("nvmlDeviceGetTemperatureV", (getattr(nvml, "NVML_TEMPERATURE_GPU", 0),)),
        ("nvmlDeviceGetTemperature", (getattr(nvml, "NVML_TEMPERATURE_GPU", 0),)),
        ("nvmlDeviceGetUtilizationRates", ()),
        ("nvmlDeviceGetPowerUsage", ()),
        ("nvmlDeviceGetEnforcedPowerLimit", ()),
        ("nvmlDeviceGetCurrentClocksEventReasons", ()),
        ("nvmlDeviceGetComputeRunningProcesses", ()),
        ("nvmlDeviceGetGraphicsRunningProcesses", ()),
        ("nvmlDeviceGetFieldValues", (field_ids,)),
        ("nvmlDeviceGetTotalEnergyConsumption", ()),
        *(
            ("nvmlDeviceGetSamples", (getattr(nvml, kind, -1), now_us - 1_000_000))
            for kind, _ in BUFFERED.values()
        ),
    ]
    ready = []
    for name, args in calls:
        function = getattr(nvml, name, None)
        label = name if not args or name == "nvmlDeviceGetFieldValues" else f"{name}{args[:1]}"
        ready.append((label, functools.partial(function, handle, *args) if function else None))
    return ready  # type: ignore[return-value]


def call_latencies(nvml: ModuleType, handle: Any, calls: int) -> list[dict[str, object]]:
    """Per monitored call: whether it answers, and its p50 and p99 wall time (µs) over ``calls``
    calls; for field values also NVML's own ``latencyUsec`` of each field."""
    rows: list[dict[str, object]] = []
    for label, call in monitored_calls(nvml, handle):
        if call is None:
            rows.append({"call": label, "outcome": "not in the binding"})
            continue
        status, value = outcome(nvml, call)
        row: dict[str, object] = {"call": label, "outcome": status}
        if status == "ok":
            times = []
            for _ in range(calls):
                began = time.perf_counter_ns()
                call()
                times.append((time.perf_counter_ns() - began) / 1000)
            times.sort()
            row["p50_us"] = round(statistics.median(times), 1)
            row["p99_us"] = round(times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)], 1)
            if label == "nvmlDeviceGetFieldValues":
                row["nvml_latency_us"] = {int(v.fieldId): int(v.latencyUsec) for v in value}  # type: ignore[attr-defined]
        rows.append(row)
    return rows


def gpm_pair(nvml: ModuleType, handle: Any, seconds: float = 0.5) -> dict[str, object]:
    """One GPM pair ``seconds`` apart, as the collector reads it: metric -> value, or why not."""
    pair = GpmPair.open(nvml, handle, nvml_errors(nvml))
    if pair is None:
        return {"supported": False}
    try:
        time.sleep(seconds)
        values = pair.read()
    finally:
        pair.close()
    return {"supported": True, **{suffix: v for (suffix, _), v in zip(GPM_METRICS, values, strict=True)}}


def energy_against_power(
    nvml: ModuleType, handle: Any, seconds: float, work: Callable[[threading.Event], None] | None
) -> dict[str, object]:
    """The energy counter's rise over ``seconds`` against the power draw integrated over the
    same time (trapezoids every ``POWER_POLL_SECONDS``), while ``work`` runs (until the event is
    set) or idle. Their ratio is near 1 where both are right."""
    status, start_mj = ask(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle)
    if status != "ok":
        return {"outcome": status}
    done = threading.Event()
    worker = None if work is None else threading.Thread(target=work, args=(done,), daemon=True)
    if worker is not None:
        worker.start()
    integral_j, samples = 0.0, []
    began = last_at = time.perf_counter()
    _, last_mw = ask(nvml, "nvmlDeviceGetPowerUsage", handle)
    try:
        while time.perf_counter() - began < seconds:
            time.sleep(POWER_POLL_SECONDS)
            _, power_mw = ask(nvml, "nvmlDeviceGetPowerUsage", handle)
            at = time.perf_counter()
            if isinstance(power_mw, int) and isinstance(last_mw, int):
                integral_j += (power_mw + last_mw) / 2000 * (at - last_at)
                samples.append(power_mw / 1000)
            last_mw, last_at = power_mw, at
        _, end_mj = ask(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle)
    finally:
        done.set()
        if worker is not None:
            worker.join(timeout=30)
    elapsed = last_at - began
    if not isinstance(end_mj, int) or not isinstance(start_mj, int):
        return {"outcome": "the counter stopped answering"}
    energy_j = (end_mj - start_mj) / 1000
    return {
        "outcome": "ok",
        "under_load": work is not None,
        "seconds": round(elapsed, 3),
        "energy_counter_j": round(energy_j, 3),
        "power_integral_j": round(integral_j, 3),
        "ratio": round(energy_j / integral_j, 4) if integral_j > 0 else None,
        "mean_power_w": round(statistics.fmean(samples), 2) if samples else None,
    }


def matmul_burst(device: int) -> Callable[[threading.Event], None] | None:
    """Matrix products on CUDA device ``device`` until told to stop, where torch with CUDA is here."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def work(done: threading.Event) -> None:
        with torch.cuda.device(device):
            a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
            b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
            while not done.is_set():
                for _ in range(8):
                    a = (a @ b).clamp_(-1, 1)
                torch.cuda.synchronize()

    return work


PHASE_STEPS = 40
"""Training steps timed per loop of ``step_phases``."""


def step_phases() -> dict[str, dict[str, float]] | None:
    """Where torch with CUDA is here: the phase signals ``watch_model`` gives two loops of a model
    on the GPU, one GPU-bound (a ``loss.item()`` after each step waits for its matrix products) and
    one input-bound (each batch takes 20 ms to make, the model is small), each over ``PHASE_STEPS``
    steps; else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from sampler.pipeline.phases import PhaseShares
    from sampler.pipeline.steps import watch_model, watched_phases

    class Slow(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self, nap: float, width: int) -> None:
            self.nap, self.width = nap, width

        def __len__(self) -> int:
            return PHASE_STEPS + 1

        def __getitem__(self, index: int) -> Any:
            time.sleep(self.nap)
            return torch.randn(self.width)

    found: dict[str, dict[str, float]] = {}
    for loop, nap, width, depth in (("gpu-bound", 0.0, 8192, 8), ("input-bound", 0.02, 64, 1)):
        model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(depth))).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
        watch_model(model)
        shares = PhaseShares()
        shares.derive(watched_phases())
        got: dict[str, float] = {}
        try:
            for x in torch.utils.data.DataLoader(Slow(nap, width), batch_size=1):
                loss = model(x.cuda()).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                loss.item()  # the host waits for the device here, in "other"
                got.update(shares.derive(watched_phases()))  # the device's time, read when done
        finally:
            watch_model(None)
        found[loop] = {name.rpartition("/")[2]: round(value, 3) for name, value in got.items()}
    return found
