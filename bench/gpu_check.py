"""One-command check of the gpu collector against the real NVML, on a machine with an NVIDIA GPU.

    PYTHONPATH=. python -m bench.gpu_check [--out DIR] [--calls 200] [--seconds 6] [--burst-seconds 5]

Needs nothing but Python, nvidia-ml-py, psutil, PyYAML and numpy (and PyTorch with CUDA for
the load). It reports, per device: the driver's facts (versions, persistence mode, MIG mode,
read only, GPM support); every signal of the gpu collector, built exactly as the sampling child
builds it, with its value and whether it is plausible; each NVML call the monitor makes, whether
it answers and its p50/p99 latency over ``--calls`` calls (NVML's own ``latencyUsec`` for the
field values); one GPM pair. Then, for device 0, a burst of matrix products (idle without
torch) during which the energy counter's rise is set against the power draw integrated over
the same time, and a real ``ResourceMonitor`` (1 s interval) runs: its gpu signals, peaks and
means must arrive and be plausible. With torch and CUDA, two training loops on the GPU check
``watch_model``'s step phases: a GPU-bound loop's steps must read mostly on the device
(``device_percent``), an input-bound one's mostly waiting for input. ``sample()`` and
``sample_tracked()`` are timed (CPU and wall ms per call). When torch with CUDA is here, 256 MiB
are held on the current device first, so ``process_memory_bytes`` has something to find.

With ``--out DIR`` the report is written there as ``gpu_check.json`` and ``gpu_check.md``.
Exit status: 0 when everything is plausible, 1 when something is not, 2 when there is no GPU
or NVML here. ``--nvml-module fake_nvml`` runs it against the tests' Python stand-in.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "tests"))  # last: only the fake NVML comes from there

import sampler  # noqa: E402  (after the path set-up above)
from bench import gpu_probe  # noqa: E402
from sampler import catalogue  # noqa: E402
from sampler.child.peaks import MEAN_SUFFIX, PEAK_SUFFIX  # noqa: E402
from sampler.collectors import Sources, build_collector  # noqa: E402
from sampler.collectors.gpu import REASON_HW_SLOWDOWN, THROTTLE_POWER, THROTTLE_THERMAL  # noqa: E402

NO_GPU = "no NVIDIA GPU here: nothing to check"
HELD_BYTES = 256 * 1024**2
"""What the check holds on the GPU through torch, when it can."""
REQUIRED = {
    "memory_clock_mhz",
    "sm_clock_mhz",
    "memory_allocated_bytes",
    "memory_allocated_percent",
    "temperature_celsius",
}
"""SPEC 2's readings: NaN for one of them is a failure. The others may be
unsupported on some boards (power), under MIG (utilization, process lists)."""
FLAGS = {
    "throttle_power": THROTTLE_POWER,
    "throttle_thermal": THROTTLE_THERMAL,
    "throttle_hw_slowdown": REASON_HW_SLOWDOWN,
}


UNIT_RANGES = {
    "%": (0.0, 100.0),
    "0/1": (0.0, 1.0),
    "s/s": (0.0, 1.05),
    "s": (0.0, math.inf),
    "J": (0.0, math.inf),
    "J/step": (0.0, math.inf),
    "MiB/s": (0.0, math.inf),
    "XID": (0.0, 2.0**32 - 1),
    "bitmask": (0.0, 2.0**64 - 1),
}
"""Where a reading of a unit is plausible when its signal has no range of its own."""


def plausible_range(suffix: str, row: dict[str, float], total_bytes: float) -> tuple[float, float]:
    """The inclusive range a device's ``suffix`` reading is plausible in, given
    the device's other readings ``row`` (NaN where unknown) and its memory size."""
    limit = row.get("power_limit_watts", math.nan)
    allocated = row.get("memory_allocated_bytes", math.nan)
    own = row.get("process_memory_bytes", math.nan)
    ranges = {
        "memory_clock_mhz": (1.0, 20_000.0),
        "sm_clock_mhz": (1.0, 5_000.0),
        "memory_allocated_bytes": (0.0, total_bytes),
        "temperature_celsius": (0.0, 110.0),
        "power_watts": (0.0, 3_000.0 if math.isnan(limit) else limit * 1.2),
        "power_limit_watts": (1.0, 3_000.0),
        "energy_joules_per_second": (0.0, 3_000.0 if math.isnan(limit) else limit * 1.2),
        "process_memory_bytes": (0.0, math.inf if math.isnan(allocated) else allocated),
        "tree_memory_bytes": (
            0.0 if math.isnan(own) else own,
            math.inf if math.isnan(allocated) else allocated,
        ),
    }
    if suffix in ranges:
        return ranges[suffix]
    return UNIT_RANGES[catalogue.SIGNALS[catalogue.GPU_KEY_PREFIX + suffix].unit]


def problem(suffix: str, value: float, row: dict[str, float], total_bytes: float) -> str | None:
    """Why ``value`` is implausible for ``suffix``, or None when it is plausible."""
    if math.isnan(value):
        return "missing" if suffix in REQUIRED else None
    low, high = plausible_range(suffix, row, total_bytes)
    if not low <= value <= high:
        return f"outside [{low:g}, {high:g}]"
    reasons = row.get("clock_throttle_reasons", math.nan)
    if suffix == "clock_throttle_reasons" and value != int(value):
        return "not an integer bitmask"
    if suffix in FLAGS and not math.isnan(reasons) and value != bool(int(reasons) & FLAGS[suffix]):
        return f"disagrees with clock_throttle_reasons={int(reasons):#x}"
    return None


def per_call_ms(function: Callable[[], object], calls: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per call of ``function``, over ``calls`` calls."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        function()
    return (time.process_time() - cpu) * 1000 / calls, (time.perf_counter() - wall) * 1000 / calls


def hold_gpu_memory() -> Any:
    """A 256 MiB CUDA tensor when torch with CUDA is here, else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.empty(HELD_BYTES, dtype=torch.uint8, device="cuda")


def run_monitor(nvml_module: str, seconds: float, during: Callable[[], Any]) -> tuple[dict[str, float], Any]:
    """A real monitor (1 s interval) while ``during()`` runs and for up to ``seconds`` in all:
    the last value of each gpu signal logged, and what ``during`` returned."""
    last: dict[str, float] = {}
    lock = threading.Lock()

    def sink(name: str, value: float, step: int) -> None:
        if name.startswith("resource/gpu/"):
            with lock:
                last[name] = value

    began = time.monotonic()
    with sampler.ResourceMonitor(
        interval_seconds=1.0, categories=["gpu"], nvml_module=nvml_module, step_source="seconds", sink=sink
    ) as monitor:
        result = during()
        while time.monotonic() - began < seconds and monitor.stats()["records_logged"] < 3:
            time.sleep(0.1)
    with lock:
        return dict(last), result


def device_section(nvml: Any, index: int, values: dict[str, float], calls: int) -> tuple[dict[str, Any], int]:
    """One device's report (facts, signals, calls, GPM) and the problems found."""
    prefix = f"resource/gpu/{index}/"
    row = {name[len(prefix) :]: v for name, v in values.items() if name.startswith(prefix)}
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    try:
        total = float(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception as exc:  # any failure of the binding: fall back to the percent check alone
        print(f"GPU {index}: cannot read its memory size ({exc!r}); bytes are not bounded")
        total = math.inf
    print(f"GPU {index} ({total / 1024**3:.1f} GiB)")
    failures = 0
    signals: dict[str, Any] = {}
    for suffix, value in row.items():
        why = problem(suffix, value, row, total)
        failures += why is not None
        verdict = "n/a (not supported here)" if math.isnan(value) and why is None else why or "ok"
        print(f"  {suffix:<44} {value:>20,.2f}  {verdict}")
        signals[suffix] = {"value": None if math.isnan(value) else value, "verdict": verdict}
    facts = gpu_probe.device_facts(nvml, handle)
    print("  " + ", ".join(f"{k}: {v}" for k, v in facts.items()))
    latencies = gpu_probe.call_latencies(nvml, handle, calls)
    for call in latencies:
        timing = f"p50 {call['p50_us']} µs, p99 {call['p99_us']} µs" if "p50_us" in call else ""
        print(f"  {call['call']:<58} {call['outcome']:<12} {timing}")
    gpm = gpu_probe.gpm_pair(nvml, handle)
    print(f"  GPM: {gpm}")
    return {"facts": facts, "signals": signals, "calls": latencies, "gpm": gpm}, failures


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: the driver, each device's facts, calls and signals, the energy check."""
    out = ["# GPU check", "", f"Driver: {report['driver']}", ""]
    for index, device in report["devices"].items():
        out += [
            f"## GPU {index}",
            "",
            f"{device['facts']}",
            "",
            "| call | outcome | p50 µs | p99 µs |",
            "|---|---|---|---|",
        ]
        out += [
            f"| `{c['call']}` | {c['outcome']} | {c.get('p50_us', '')} | {c.get('p99_us', '')} |"
            for c in device["calls"]
        ]
        out += ["", "| signal | value | verdict |", "|---|---|---|"]
        out += [f"| {name} | {s['value']} | {s['verdict']} |" for name, s in device["signals"].items()]
        out += ["", f"GPM pair: {device['gpm']}", ""]
    out += [
        "## Energy against power",
        "",
        f"{report['energy']}",
        "",
        "## Monitor",
        "",
        f"{report['monitor']}",
        "",
    ]
    out += [
        f"Cost: {report['cost']}",
        "",
        "all plausible" if not report["problems"] else f"{report['problems']} problem(s)",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvml-module", default="pynvml", help="NVML binding (default: pynvml)")
    parser.add_argument(
        "--calls", type=int, default=200, help="calls timed per NVML call and method (default: 200)"
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="longest monitor run (default: 6)")
    parser.add_argument(
        "--burst-seconds", type=float, default=5.0, help="the energy check's burst (default: 5)"
    )
    parser.add_argument("--out", type=Path, help="directory to write gpu_check.json and gpu_check.md into")
    args = parser.parse_args(argv)

    held = hold_gpu_memory()
    sources = Sources(disk_path=os.sep, pid=os.getpid(), nvml_module=args.nvml_module)
    gpu = build_collector("gpu", sources)
    if gpu is None:
        print(f"{NO_GPU} (NVML through {args.nvml_module!r} is unavailable or reports no device)")
        return 2
    failures = 0
    nvml = importlib.import_module(args.nvml_module)
    nvml.nvmlInit()  # this check's own (NVML counts them): the probes outlive the collector
    report: dict[str, Any] = {"driver": gpu_probe.driver_facts(nvml), "devices": {}}
    print(f"driver: {report['driver']}")
    try:
        gpu.sample()  # the counters' rates and GPM need a sample before
        values = dict(zip(gpu.names, gpu.sample(), strict=True))
        devices = sorted({int(name.split("/")[2]) for name in gpu.names})
        for index in devices:
            report["devices"][index], problems = device_section(nvml, index, values, args.calls)
            failures += problems
        if held is not None:
            own = sum(
                v for n, v in values.items() if n.endswith("/process_memory_bytes") and not math.isnan(v)
            )
            ok = own >= HELD_BYTES
            failures += not ok
            verdict = "ok" if ok else "TOO LOW"
            print(f"process_memory_bytes over all GPUs: {own:,.0f} with {HELD_BYTES:,} held: {verdict}")
        else:
            print("torch with CUDA is not here: process_memory_bytes is checked for range only")
        report["cost"] = {}
        for method in (gpu.sample, gpu.sample_tracked):
            cpu_ms, wall_ms = per_call_ms(method, args.calls)
            name = method.__name__
            report["cost"][name] = {"cpu_ms": round(cpu_ms, 4), "wall_ms": round(wall_ms, 4)}
            print(f"{name}(): {cpu_ms:.3f} ms CPU, {wall_ms:.3f} ms wall per call ({args.calls} calls)")
        tracked = gpu.sample_tracked()
        handle = nvml.nvmlDeviceGetHandleByIndex(devices[0])
    finally:
        gpu.close()
    expected = {name for name, value in values.items() if not math.isnan(value)}
    expected |= {n + PEAK_SUFFIX for n, v in zip(gpu.tracked, tracked, strict=True) if not math.isnan(v)}
    expected |= {n + MEAN_SUFFIX for n in gpu.averaged if n + PEAK_SUFFIX in expected}
    work = gpu_probe.matmul_burst(0)
    burst = functools.partial(gpu_probe.energy_against_power, nvml, handle, args.burst_seconds, work)
    try:
        logged, report["energy"] = run_monitor(args.nvml_module, args.seconds, burst)
    finally:
        nvml.nvmlShutdown()
    load = "matrix products" if work else "idle"
    print(f"energy against power over {args.burst_seconds:g} s ({load}): {report['energy']}")
    missing = sorted(expected - set(logged))
    implausible = {}
    for name, value in logged.items():
        index, suffix = name.split("/")[2], name.split("/", 3)[3]
        base = suffix.removesuffix(PEAK_SUFFIX).removesuffix(MEAN_SUFFIX)
        row = {k.split("/", 3)[3]: v for k, v in logged.items() if k.split("/")[2] == index}
        why = problem(base, value, row if base == suffix else {}, math.inf)
        if why is not None:
            implausible[name] = f"{value:g}: {why}"
    failures += len(missing) + len(implausible)
    report["monitor"] = {
        "expected": len(expected),
        "arrived": len(expected) - len(missing),
        "missing": missing,
        "implausible": implausible,
    }
    print(f"through a real monitor: {len(expected) - len(missing)} of {len(expected)} gpu signals arrived")
    for name in missing:
        print(f"  never arrived: {name}")
    for name, why in implausible.items():
        print(f"  implausible in the monitor's run: {name} = {why}")
    report["step_phases"] = phases = gpu_probe.step_phases()
    if phases is None:
        print("torch with CUDA is not here: the step phases' GPU time is not checked")
    else:
        gpu_bound, input_bound = phases["gpu-bound"], phases["input-bound"]
        ok = (
            gpu_bound.get("device_percent", 0) >= 50
            and input_bound.get("input_percent", 0) >= 50
            and input_bound.get("device_percent", 100) < 50
        )
        failures += not ok
        print(f"step phases, a GPU-bound loop: {gpu_bound}")
        print(f"step phases, an input-bound loop: {input_bound}")
        verdict = "ok" if ok else "NOT AS EXPECTED"
        print(f"step phases: {verdict} (GPU-bound: device >= 50 %; input-bound: input >= 50 %, device < 50)")
    report["problems"] = failures
    print("all plausible" if not failures else f"{failures} problem(s)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (args.out / "gpu_check.md").write_text(markdown(report))
        print(f"report written to {args.out / 'gpu_check.json'} and {args.out / 'gpu_check.md'}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
