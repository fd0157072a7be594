"""What monitoring costs a training job: off, in-thread and isolated, side by side.

    python -m bench [--quick] [--json PATH] [--plot PATH]

Runs the same training-like workloads with monitoring off, in-thread
(``isolation="thread"``) and isolated (``isolation="process"``), interleaved
round by round (off, thread, process, off, ...) so drift in the machine's speed
hits all three alike, at the 1 s interval floor and at a stress interval below
it that makes small per-sample costs visible. Then it measures how the cost
grows with the number of GPUs (a fake NVML with 1, 8 and 64 devices) and with
all categories on versus one. Prints a Markdown report, checks the targets,
and optionally writes the numbers as JSON and a PNG chart (matplotlib).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the package, and the fake NVML for GPU scaling

import sampler  # noqa: E402  (after the path set-up above)

MODES = ("off", "thread", "process")
WORKLOADS = ("idle", "gil", "numpy", "latency")
NON_GPU = ("cpu", "memory", "disk", "network", "process")
FLOOR = 1.0
STRESS = 0.01
"""The stress interval: 100 samples/s, below the floor only benchmarks may use, so that
per-sample costs rise above the run-to-run noise of a shared machine."""


@dataclass(frozen=True)
class Profile:
    rounds: int
    seconds: float
    """Length of one measured run."""
    scaling_seconds: float
    devices: tuple[int, ...] = (1, 8, 64)


QUICK = Profile(rounds=2, seconds=1.2, scaling_seconds=1.0)
FULL = Profile(rounds=5, seconds=5.0, scaling_seconds=3.0)


# --- workloads: each runs for ``seconds`` and returns per-step durations (s) ---------------------


def _run_steps(step: Callable[[], object], seconds: float) -> list[float]:
    durations = []
    clock = time.perf_counter
    end = clock() + seconds
    while True:
        began = clock()
        if began >= end:
            return durations
        step()
        durations.append(clock() - began)


def gil_step() -> int:
    """~1 ms of pure Python (on this machine): the GIL is held throughout."""
    total = 0
    for i in range(30_000):
        total += i % 7
    return total


_A = np.random.default_rng(0).random((192, 192))


def numpy_step() -> float:
    """~0.15 ms of matrix work that releases the GIL inside BLAS."""
    return float((_A @ _A).sum())


def latency_step() -> int:
    """~50 us of pure Python: short steps whose tail shows monitoring stalls."""
    total = 0
    for i in range(2_500):
        total += i
    return total


STEPS: dict[str, Callable[[], object]] = {"gil": gil_step, "numpy": numpy_step, "latency": latency_step}


def run_workload(workload: str, seconds: float) -> list[float]:
    if workload == "idle":
        time.sleep(seconds)
        return []
    return _run_steps(STEPS[workload], seconds)


# --- one measured run ------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class Run:
    workload: str
    mode: str
    interval: float
    categories: tuple[str, ...]
    devices: int = 0
    seconds: float = 0.0
    steps: int = 0
    steps_per_second: float | None = None
    step_ms_p50: float | None = None
    step_ms_p99: float | None = None
    step_ms_max: float | None = None
    samples: int = 0
    backend_cpu_ms_per_sample: float | None = None
    """Backend process CPU clock per sample (idle runs: monitoring alone)."""
    monitor_thread_cpu_ms_per_sample: float | None = None
    """CPU of the WL-ResourceMonitor thread alone, per sample (any workload)."""
    child_cpu_ms_per_sample: float | None = None
    child_rss_mb: float | None = None
    latency_ms: list[float] = field(default_factory=list)
    """Sample-to-sink latency of every sample (not in the JSON summary)."""
    start_ms: float | None = None
    first_sample_ms: float | None = None


def measure(
    workload: str,
    mode: str,
    interval: float,
    seconds: float,
    categories: tuple[str, ...] = NON_GPU,
    devices: int = 0,
) -> Run:
    run = Run(workload, mode, interval, categories, devices)
    latencies: list[float] = []
    first = threading.Event()

    def on_sample(sample: sampler.Sample) -> None:
        latencies.append((time.monotonic_ns() - sample.timestamp_ns) / 1e6)
        first.set()

    monitor = None
    if mode != "off":
        monitor = sampler.ResourceMonitor(
            interval_seconds=interval,
            categories=categories,
            sink=lambda name, value, step: None,
            step_source="seconds",
            nvml_module="fake_nvml" if devices else "pynvml",
            isolation=mode,
            on_sample=on_sample,
            _min_interval_seconds=min(interval, FLOOR),
        )
        began = time.perf_counter()
        monitor.start()
        run.start_ms = (time.perf_counter() - began) * 1e3
        if not first.wait(60):
            monitor.stop()
            raise RuntimeError(f"no sample within 60 s ({mode}, {workload})")
        run.first_sample_ms = (time.perf_counter() - began) * 1e3
    try:
        latencies.clear()
        thread_clock = _monitor_thread_clock()
        thread_cpu0 = time.clock_gettime(thread_clock) if thread_clock is not None else None
        child_pid = monitor.child_pid if monitor is not None else None
        cpu0, wall0 = time.process_time(), time.perf_counter()
        durations = run_workload(workload, seconds)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        samples = len(latencies)
        run.latency_ms = list(latencies)
        if thread_clock is not None and thread_cpu0 is not None and samples:
            run.monitor_thread_cpu_ms_per_sample = (
                (time.clock_gettime(thread_clock) - thread_cpu0) * 1e3 / samples
            )
        if monitor is not None and child_pid is not None:
            # The child's own precise clock (psutil's per-process times tick at 10 ms).
            per_sample = monitor.stats()["child_cpu_seconds_per_sample"]
            run.child_cpu_ms_per_sample = None if per_sample is None else per_sample * 1e3
            with contextlib.suppress(psutil.Error):
                run.child_rss_mb = psutil.Process(child_pid).memory_info().rss / 1024**2
    finally:
        if monitor is not None:
            monitor.stop()
    run.seconds = wall1 - wall0
    run.samples = samples
    if workload == "idle" and samples:
        run.backend_cpu_ms_per_sample = (cpu1 - cpu0) * 1e3 / samples
    if durations:
        ms = [d * 1e3 for d in durations]
        run.steps = len(durations)
        run.steps_per_second = len(durations) / run.seconds
        run.step_ms_p50, run.step_ms_p99, run.step_ms_max = _percentile(ms, 50), _percentile(ms, 99), max(ms)
    return run


def _monitor_thread_clock() -> int | None:
    for thread in threading.enumerate():
        if thread.name == "WL-ResourceMonitor" and thread.ident is not None:
            return time.pthread_getcpuclockid(thread.ident)
    return None


# --- the whole benchmark ---------------------------------------------------------------------------


def run_matrix(profile: Profile, log: Callable[[str], None]) -> list[Run]:
    runs = []
    for round_no in range(profile.rounds):
        for workload in WORKLOADS:
            for interval in (FLOOR, STRESS):
                for mode in MODES:
                    if workload == "idle" and mode == "off":
                        continue  # nothing to measure
                    runs.append(measure(workload, mode, interval, profile.seconds))
        log(f"round {round_no + 1}/{profile.rounds} done")
    return runs


def run_scaling(profile: Profile, log: Callable[[str], None]) -> list[Run]:
    runs = []
    for devices in profile.devices:
        os.environ["FAKE_NVML"] = json.dumps({"devices": [{}] * devices})
        for mode in ("thread", "process"):
            runs.append(measure("idle", mode, STRESS, profile.scaling_seconds, ("gpu",), devices))
    os.environ.pop("FAKE_NVML", None)
    for categories in (NON_GPU, ("cpu",)):
        for mode in ("thread", "process"):
            runs.append(measure("idle", mode, STRESS, profile.scaling_seconds, categories))
    log("scaling done")
    return runs


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _spread(values: list[float | None]) -> tuple[float, float] | None:
    present = [v for v in values if v is not None]
    return (min(present), max(present)) if present else None


def summarize(matrix: list[Run], scaling: list[Run]) -> dict[str, Any]:
    """Medians with their min..max spread per (workload, interval, mode), paired
    slowdowns against off (round by round), latencies, and the targets."""
    cells: dict[str, dict[str, Any]] = {}
    for workload in WORKLOADS:
        for interval in (FLOOR, STRESS):
            for mode in MODES:
                runs = [r for r in matrix if (r.workload, r.interval, r.mode) == (workload, interval, mode)]
                if not runs:
                    continue
                cell: dict[str, Any] = {"rounds": len(runs)}
                for key in (
                    "steps_per_second",
                    "step_ms_p50",
                    "step_ms_p99",
                    "step_ms_max",
                    "backend_cpu_ms_per_sample",
                    "monitor_thread_cpu_ms_per_sample",
                    "child_cpu_ms_per_sample",
                    "child_rss_mb",
                    "start_ms",
                    "first_sample_ms",
                ):
                    values = [getattr(r, key) for r in runs]
                    cell[key] = {"median": _median(values), "spread": _spread(values)}
                latencies = [x for r in runs for x in r.latency_ms]
                cell["sample_to_sink_ms"] = {
                    "p50": _percentile(latencies, 50),
                    "p99": _percentile(latencies, 99),
                }
                cell["samples"] = sum(r.samples for r in runs)
                cells[f"{workload}@{interval:g}s/{mode}"] = cell
    slowdowns: dict[str, Any] = {}
    for workload in ("gil", "numpy", "latency"):
        for interval in (FLOOR, STRESS):
            off = [r for r in matrix if (r.workload, r.interval, r.mode) == (workload, interval, "off")]
            for mode in ("thread", "process"):
                on = [r for r in matrix if (r.workload, r.interval, r.mode) == (workload, interval, mode)]
                paired = [
                    100.0 * (1 - b.steps_per_second / a.steps_per_second)
                    for a, b in zip(off, on, strict=True)
                    if a.steps_per_second and b.steps_per_second
                ]
                slowdowns[f"{workload}@{interval:g}s/{mode}"] = {
                    "median_percent": _median(list(paired)),
                    "spread_percent": _spread(list(paired)),
                }
            noise = [
                100.0 * (1 - b.steps_per_second / a.steps_per_second)
                for a, b in itertools.pairwise(off)
                if a.steps_per_second and b.steps_per_second
            ]
            slowdowns[f"{workload}@{interval:g}s/off-vs-off"] = {"spread_percent": _spread(list(noise))}
    scale = [
        {
            "categories": ",".join(r.categories),
            "devices": r.devices,
            "mode": r.mode,
            "samples": r.samples,
            "backend_cpu_ms_per_sample": r.backend_cpu_ms_per_sample,
            "child_cpu_ms_per_sample": r.child_cpu_ms_per_sample,
        }
        for r in scaling
    ]
    return {"cells": cells, "slowdowns": slowdowns, "scaling": scale, "targets": targets(cells, slowdowns)}


def targets(cells: dict[str, Any], slowdowns: dict[str, Any]) -> list[dict[str, Any]]:
    def cell(key: str, metric: str, stat: str = "median") -> Any:
        return cells.get(key, {}).get(metric, {}).get(stat)

    out = []
    thread_cpu = cell(f"idle@{STRESS:g}s/thread", "backend_cpu_ms_per_sample")
    process_cpu = cell(f"idle@{STRESS:g}s/process", "backend_cpu_ms_per_sample")
    ratio = process_cpu / thread_cpu if process_cpu is not None and thread_cpu else None
    out.append(
        {
            "target": "backend CPU per sample, isolated <= 1/20 of in-thread (all non-GPU categories)",
            "measured": None
            if ratio is None
            else f"{process_cpu:.3f} ms vs {thread_cpu:.3f} ms = 1/{1 / ratio:.0f}",
            "met": ratio is not None and ratio <= 1 / 20,
        }
    )
    floor = slowdowns.get(f"gil@{FLOOR:g}s/process", {})
    noise = slowdowns.get(f"gil@{FLOOR:g}s/off-vs-off", {}).get("spread_percent")
    median = floor.get("median_percent")
    bound = max(abs(noise[0]), abs(noise[1]), 1.0) if noise else 1.0
    out.append(
        {
            "target": "steps/s at the 1 s floor, isolated vs off: within noise (GIL-bound workload)",
            "measured": None
            if median is None
            else f"{median:+.2f}% slower (off-vs-off noise +-{bound:.2f}%)",
            "met": median is not None and abs(median) <= bound,
        }
    )
    stress_p = slowdowns.get(f"gil@{STRESS:g}s/process", {}).get("median_percent")
    stress_t = slowdowns.get(f"gil@{STRESS:g}s/thread", {}).get("median_percent")
    out.append(
        {
            "target": "at the stress interval, isolated slowdown <= 1/5 of in-thread slowdown (GIL-bound)",
            "measured": None
            if stress_p is None or stress_t is None
            else f"{stress_p:+.2f}% vs {stress_t:+.2f}%",
            "met": stress_p is not None and stress_t is not None and stress_p <= max(stress_t, 0) / 5,
        }
    )
    off_p99 = cells.get(f"latency@{FLOOR:g}s/off", {}).get("step_ms_p99", {})
    iso_p99 = cell(f"latency@{FLOOR:g}s/process", "step_ms_p99")
    spread = off_p99.get("spread")
    within = spread is not None and iso_p99 is not None and iso_p99 <= spread[1] * 1.1
    out.append(
        {
            "target": "p99 step time, latency workload at the 1 s floor: isolated indistinguishable from off",
            "measured": None
            if iso_p99 is None or spread is None
            else f"{iso_p99:.3f} ms vs off {spread[0]:.3f}..{spread[1]:.3f} ms",
            "met": within,
        }
    )
    lat = cells.get(f"gil@{STRESS:g}s/process", {}).get("sample_to_sink_ms", {}).get("p99")
    out.append(
        {
            "target": "sample-to-sink latency p99 < 20 ms with the GIL-bound load (isolated)",
            "measured": None if lat is None else f"{lat:.2f} ms",
            "met": lat is not None and lat < 20,
        }
    )
    return out


# --- output ----------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fmt_spread(entry: dict[str, Any], digits: int = 2) -> str:
    if entry.get("median") is None:
        return "-"
    low, high = entry["spread"]
    return f"{entry['median']:.{digits}f} ({low:.{digits}f}..{high:.{digits}f})"


def markdown(summary: dict[str, Any], machine: str, command: str) -> str:
    lines = [f"# Monitoring overhead\n\n{machine}  \n`{command}`\n"]
    lines.append("## Training throughput: median (min..max over rounds)\n")
    lines.append("| workload | interval | mode | steps/s | slowdown vs off % | step p50 | p99 | max (ms) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for key, cell in summary["cells"].items():
        workload, rest = key.split("@")
        interval, mode = rest.split("/")
        if workload == "idle":
            continue
        slow = summary["slowdowns"].get(key, {})
        slow_text = "-"
        if slow.get("median_percent") is not None:
            low, high = slow["spread_percent"]
            slow_text = f"{slow['median_percent']:+.2f} ({low:+.2f}..{high:+.2f})"
        lines.append(
            f"| {workload} | {interval} | {mode} | {_fmt_spread(cell['steps_per_second'], 0)} | {slow_text} "
            f"| {_fmt(cell['step_ms_p50']['median'], 3)} | {_fmt(cell['step_ms_p99']['median'], 3)} "
            f"| {_fmt(cell['step_ms_max']['median'], 3)} |"
        )
    lines.append("\n## Cost per sample and latency\n")
    lines.append(
        "| interval | mode | backend CPU ms/sample (idle) | monitor thread CPU ms/sample (GIL load) "
        "| child CPU ms/sample | child RSS MB | sample-to-sink p50/p99 ms idle | ... under GIL load "
        "| start() ms | first sample ms |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for interval in (FLOOR, STRESS):
        for mode in ("thread", "process"):
            idle = summary["cells"].get(f"idle@{interval:g}s/{mode}", {})
            gil = summary["cells"].get(f"gil@{interval:g}s/{mode}", {})
            if not idle:
                continue
            li, lg = idle["sample_to_sink_ms"], gil.get("sample_to_sink_ms", {})
            lines.append(
                f"| {interval:g} s | {mode} | {_fmt_spread(idle['backend_cpu_ms_per_sample'], 3)} "
                f"| {_fmt(gil.get('monitor_thread_cpu_ms_per_sample', {}).get('median'), 3)} "
                f"| {_fmt(idle['child_cpu_ms_per_sample']['median'], 3)} "
                f"| {_fmt(idle['child_rss_mb']['median'], 1)} "
                f"| {_fmt(li['p50'])} / {_fmt(li['p99'])} | {_fmt(lg.get('p50'))} / {_fmt(lg.get('p99'))} "
                f"| {_fmt(idle['start_ms']['median'])} | {_fmt(idle['first_sample_ms']['median'], 0)} |"
            )
    lines.append(f"\n## Scaling at the {STRESS:g} s stress interval (idle backend)\n")
    lines.append("| categories | fake GPUs | mode | backend CPU ms/sample | child CPU ms/sample |")
    lines.append("|---|---|---|---|---|")
    for row in summary["scaling"]:
        lines.append(
            f"| {row['categories']} | {row['devices'] or '-'} | {row['mode']} "
            f"| {_fmt(row['backend_cpu_ms_per_sample'], 3)} | {_fmt(row['child_cpu_ms_per_sample'], 3)} |"
        )
    lines.append("\n## Targets\n")
    lines.append("| target | measured | met |")
    lines.append("|---|---|---|")
    for t in summary["targets"]:
        lines.append(f"| {t['target']} | {t['measured'] or '-'} | {'yes' if t['met'] else '**MISSED**'} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: str) -> bool:
    """A PNG of slowdowns and per-sample CPU; False when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels, thread, process = [], [], []
    for workload in ("gil", "numpy", "latency"):
        for interval in (FLOOR, STRESS):
            labels.append(f"{workload}\n{interval:g} s")
            for mode, bucket in (("thread", thread), ("process", process)):
                bucket.append(
                    summary["slowdowns"][f"{workload}@{interval:g}s/{mode}"]["median_percent"] or 0.0
                )
    x = np.arange(len(labels))
    left.bar(x - 0.2, thread, 0.4, label="in-thread")
    left.bar(x + 0.2, process, 0.4, label="isolated")
    left.set_xticks(x, labels)
    left.set_ylabel("training slowdown vs off (%)")
    left.axhline(0, color="black", linewidth=0.5)
    left.legend()
    rows = [r for r in summary["scaling"] if r["devices"]]
    for mode in ("thread", "process"):
        pts = [(r["devices"], r["backend_cpu_ms_per_sample"] or 0.0) for r in rows if r["mode"] == mode]
        right.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"backend, {mode}")
    child = [(r["devices"], r["child_cpu_ms_per_sample"] or 0.0) for r in rows if r["mode"] == "process"]
    right.plot(
        [p[0] for p in child], [p[1] for p in child], marker="s", linestyle="--", label="child, process"
    )
    right.set_xscale("log")
    right.set_xlabel("fake GPUs")
    right.set_ylabel("CPU ms per sample")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def machine_line() -> str:
    return (
        f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 1024**3:.0f} GiB, "
        f"Python {sys.version.split()[0]}, {sys.platform}, NVML: fake (no NVIDIA GPU)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke size: under 2 minutes")
    parser.add_argument("--rounds", type=int, help="override the profile's rounds")
    parser.add_argument("--seconds", type=float, help="override the length of each measured run")
    parser.add_argument("--devices", help="comma-separated fake GPU counts for scaling (default 1,8,64)")
    parser.add_argument("--json", help="write the numbers here")
    parser.add_argument("--plot", help="write a PNG chart here (needs matplotlib)")
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    if args.rounds or args.seconds or args.devices:
        profile = Profile(
            rounds=args.rounds or profile.rounds,
            seconds=args.seconds or profile.seconds,
            scaling_seconds=args.seconds or profile.scaling_seconds,
            devices=tuple(int(d) for d in args.devices.split(",")) if args.devices else profile.devices,
        )
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    began = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - began:6.1f} s] {message}", file=sys.stderr, flush=True)

    matrix = run_matrix(profile, log)
    scaling = run_scaling(profile, log)
    summary = summarize(matrix, scaling)
    report = {
        "machine": machine_line(),
        "command": command.strip(),
        "profile": asdict(profile),
        "wall_seconds": round(time.monotonic() - began, 1),
        **summary,
    }
    print(markdown(summary, report["machine"], report["command"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if args.plot and not plot(summary, args.plot):
        print("matplotlib is not installed (pip install '.[plot]'); no chart written", file=sys.stderr)
    missed = [t["target"] for t in summary["targets"] if not t["met"]]
    for target in missed:
        print(f"target missed: {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
