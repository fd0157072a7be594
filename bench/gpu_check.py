"""One-command check of the gpu collector against the real NVML, on a machine with an NVIDIA GPU.

    python -m bench.gpu_check [--nvml-module pynvml] [--calls 100] [--seconds 4]

Builds the gpu collector exactly as the sampling child does, prints every
signal of every device with its value and whether it is plausible, times
``sample()`` and ``sample_tracked()`` (CPU and wall ms per call), then runs a
real ``ResourceMonitor`` (1 s interval) for a few seconds and checks that the
gpu signals, their peaks and means, arrive through the pipeline. When torch
with CUDA is importable it first holds 256 MiB on the current CUDA device, so
``process_memory_bytes`` has something to find.

Exit status: 0 when everything is plausible, 1 when something is not, 2 when
there is no GPU or NVML here. ``--nvml-module fake_nvml`` runs it against the
tests' stand-in (``FAKE_NVML`` configures it).
"""

from __future__ import annotations

import argparse
import importlib
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


def plausible_range(suffix: str, row: dict[str, float], total_bytes: float) -> tuple[float, float]:
    """The inclusive range a device's ``suffix`` reading is plausible in, given
    the device's other readings ``row`` and its memory size."""
    limit = row["power_limit_watts"]
    ranges = {
        "memory_clock_mhz": (1.0, 20_000.0),
        "sm_clock_mhz": (1.0, 5_000.0),
        "memory_allocated_bytes": (0.0, total_bytes),
        "memory_allocated_percent": (0.0, 100.0),
        "temperature_celsius": (0.0, 110.0),
        "utilization_percent": (0.0, 100.0),
        "power_watts": (0.0, 3_000.0 if math.isnan(limit) else limit * 1.2),
        "process_memory_bytes": (0.0, row["memory_allocated_bytes"]),
        "tree_memory_bytes": (row["process_memory_bytes"], row["memory_allocated_bytes"]),
        "clock_throttle_reasons": (0.0, 2.0**64 - 1),
        "power_limit_watts": (1.0, 3_000.0),
        "energy_joules": (0.0, math.inf),
        "xid_critical": (0.0, 2.0**32 - 1),
    }
    if suffix.endswith("_seconds"):  # a throttle duration: the driver's count since it loaded
        return (0.0, math.inf)
    if suffix.endswith("_seconds_per_second"):  # its share of the time between samples
        return (0.0, 1.05)
    return ranges.get(suffix, (0.0, 1.0))


def problem(suffix: str, value: float, row: dict[str, float], total_bytes: float) -> str | None:
    """Why ``value`` is implausible for ``suffix``, or None when it is plausible."""
    if math.isnan(value):
        return "missing" if suffix in REQUIRED else None
    low, high = plausible_range(suffix, row, total_bytes)
    if not low <= value <= high:
        return f"outside [{low:g}, {high:g}]"
    reasons = row["clock_throttle_reasons"]
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


def check_pipeline(nvml_module: str, expected: set[str], seconds: float) -> list[str]:
    """Run a real monitor for up to ``seconds``; the expected names that never arrived."""
    arrived: set[str] = set()
    lock = threading.Lock()

    def sink(name: str, value: float, step: int) -> None:
        with lock:
            arrived.add(name)

    deadline = time.monotonic() + seconds
    with sampler.ResourceMonitor(
        interval_seconds=1.0, categories=["gpu"], nvml_module=nvml_module, step_source="seconds", sink=sink
    ):
        while time.monotonic() < deadline:
            with lock:
                if expected <= arrived:
                    break
            time.sleep(0.1)
    return sorted(expected - arrived)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvml-module", default="pynvml", help="NVML binding (default: pynvml)")
    parser.add_argument("--calls", type=int, default=100, help="calls timed per method (default: 100)")
    parser.add_argument("--seconds", type=float, default=4.0, help="longest monitor run (default: 4)")
    args = parser.parse_args(argv)

    held = hold_gpu_memory()
    sources = Sources(disk_path=os.sep, pid=os.getpid(), nvml_module=args.nvml_module)
    gpu = build_collector("gpu", sources)
    if gpu is None:
        print(f"{NO_GPU} (NVML through {args.nvml_module!r} is unavailable or reports no device)")
        return 2
    failures = 0
    try:
        nvml = importlib.import_module(args.nvml_module)
        values = dict(zip(gpu.names, gpu.sample(), strict=True))
        devices = sorted({int(name.split("/")[2]) for name in gpu.names})
        for index in devices:
            prefix = f"resource/gpu/{index}/"
            row = {name[len(prefix) :]: v for name, v in values.items() if name.startswith(prefix)}
            try:
                total = float(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(index)).total)
            except Exception as exc:  # any failure of the binding: fall back to the percent check alone
                print(f"GPU {index}: cannot read its memory size ({exc!r}); bytes are not bounded")
                total = math.inf
            print(f"GPU {index} ({total / 1024**3:.1f} GiB)")
            for suffix, value in row.items():
                why = problem(suffix, value, row, total)
                failures += why is not None
                verdict = "n/a (not supported here)" if math.isnan(value) and why is None else why or "ok"
                print(f"  {suffix:<26} {value:>20,.2f}  {verdict}")
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
        for method in (gpu.sample, gpu.sample_tracked):
            cpu_ms, wall_ms = per_call_ms(method, args.calls)
            name = method.__name__
            print(f"{name}(): {cpu_ms:.3f} ms CPU, {wall_ms:.3f} ms wall per call ({args.calls} calls)")
        tracked = gpu.sample_tracked()
    finally:
        gpu.close()
    expected = {name for name, value in values.items() if not math.isnan(value)}
    expected |= {n + PEAK_SUFFIX for n, v in zip(gpu.tracked, tracked, strict=True) if not math.isnan(v)}
    expected |= {n + MEAN_SUFFIX for n in gpu.averaged if n + PEAK_SUFFIX in expected}
    missing = check_pipeline(args.nvml_module, expected, args.seconds)
    failures += len(missing)
    print(f"through a real monitor: {len(expected) - len(missing)} of {len(expected)} gpu signals arrived")
    for name in missing:
        print(f"  never arrived: {name}")
    print("all plausible" if not failures else f"{failures} problem(s)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
