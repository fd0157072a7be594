"""What a run's records cost, side by side from one run (issue 27): store bytes per hour of a rank,
the analysis views' time and memory on long runs, and the monitor's CPU against an in-thread psutil
monitor.

    python -m bench.record_costs [--quick] [--json FILE]

In this order, in one process: ``bench.analysis_memory`` (its defaults: explain on 27 h, the
launch views on 8 ranks of 24 h; quick: 0.2 h and 2 ranks of 0.1 h), first, while this process is
small: a view's peak memory is its interpreter's ``ru_maxrss``, which starts from the size of the
process that forked it; ``bench.monitor_cpu`` (3 interleaved rounds of 15 s; quick: one of 3 s);
``bench.store_density`` (its defaults: a real monitor's records written as an hour in both layouts
at 0, 1 and 8 GPUs; quick: 36 records at 0 and 1 GPU). About 5 minutes on 2 cores; quick, under
a minute. Each benchmark's own table is printed, then one table of the numbers issue 27 asks for,
with the machine, its load before and after, and whether an NVIDIA GPU was present.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from bench import analysis_memory, monitor_cpu, store_density
from sampler.settings import DEFAULT_INNER_RATE_HZ

QUICK = {
    "monitor": (1, 3.0),
    "store": ["--seconds", "1", "--hours", "0.01", "--gpus", "0,1"],
    "analysis": ["--hours", "0.2", "--launch-hours", "0.1", "--ranks", "2"],
}
DEFAULT = {"monitor": (3, 15.0), "store": [], "analysis": []}
"""Per benchmark: monitor_cpu's (rounds, seconds), the others' arguments."""


def machine() -> str:
    """The machine, the day and its load now, in one line."""
    gpu = "an NVIDIA GPU present" if Path("/dev/nvidia0").exists() else "no NVIDIA GPU"
    memory = psutil.virtual_memory().total / 2**30
    system = f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    return (
        f"{os.cpu_count()} CPUs ({platform.machine()}), {memory:.0f} GiB, {system},"
        f" psutil {psutil.__version__}, {gpu}, {time.strftime('%d %B %Y')}"
    )


def load() -> str:
    """The load averages over 1, 5 and 15 minutes."""
    return " / ".join(f"{n:.1f}" for n in os.getloadavg())


def captured(run: Callable[[], int]) -> tuple[int, str]:
    """``run()``'s status and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = run()
    return status, out.getvalue()


def run_json(main: Callable[[list[str]], int], argv: list[str], where: Path) -> tuple[int, str, Any]:
    """A benchmark's ``main(argv)`` writing its numbers to a file: status, output, numbers."""
    path = where / "numbers.json"
    status, output = captured(lambda: main([*argv, "--json", str(path)]))
    return status, output, json.loads(path.read_text()) if status == 0 else None


def summary(
    monitor: list[dict[str, float]], store: list[dict[str, Any]], analysis: dict[str, Any]
) -> list[str]:
    """One table of every number issue 27 asks for."""
    lines = ["| what | measured | against | goal |", "|---|---|---|---|"]
    for cell in store:
        v3, v6 = cell["v3 points"]["mib_per_hour"], cell["v6 records"]["mib_per_hour"]
        readings = f"{cell['readings_per_record']:.0f} readings a record"
        lines.append(
            f"| store, {cell['gpus']} GPUs ({readings}) | {v6:.2f} MiB/h per rank"
            f" | {v3:.2f} MiB/h as points (schema 3): {cell['ratio']:.3f}x | - |"
        )
    for what, result in analysis.items():
        seconds, megabytes = analysis_memory.GOALS[what]
        goal = f"<= {megabytes:.0f} MB" + ("" if seconds is None else f", <= {seconds:g} s")
        lines.append(
            f"| {what} | {result['seconds']:.2f} s wall, {result['cpu_seconds']:.2f} s CPU,"
            f" {result['peak_mb']:.0f} MB peak | - | {goal} |"
        )
    total = statistics.median(r["monitor"] for r in monitor)
    child = statistics.median(r["monitor child"] for r in monitor)
    baseline = statistics.median(r["psutil"] for r in monitor)
    ratio = statistics.median(r["monitor"] / r["psutil"] for r in monitor if r["psutil"] > 0)
    lines.append(
        "| monitoring CPU, cpu/memory/disk/network/process at 1 s"
        f" | {total:.3f} ms/s ({child:.3f} in the child)"
        f" | in-thread psutil monitor {baseline:.3f} ms/s: {ratio:.2f}x | <= 1x |"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.record_costs", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, about a minute")
    parser.add_argument("--json", help="also write every number here")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else DEFAULT
    print(f"{machine()}\nload average (1 / 5 / 15 min) at the start: {load()}\n")
    with tempfile.TemporaryDirectory() as tmp:
        status, output, analysis = run_json(analysis_memory.main, sizes["analysis"], Path(tmp))
        print(f"## Analysis time and memory (bench.analysis_memory)\n\n{output}")
        if status:
            return status
        rounds, seconds = sizes["monitor"]
        monitor = monitor_cpu.rounds_of(rounds, seconds, DEFAULT_INNER_RATE_HZ)
        table = monitor_cpu.report(monitor, seconds, DEFAULT_INNER_RATE_HZ)
        print(f"## Monitoring CPU (bench.monitor_cpu)\n\n{table}\n")
        status, output, store = run_json(store_density.main, sizes["store"], Path(tmp))
        print(f"## Store density (bench.store_density)\n\n{output}")
        if status:
            return status
    print(f"## Issue 27, side by side\n\nload average at the end: {load()}\n")
    print("\n".join(summary(monitor, store, analysis)))
    if args.json:
        numbers = {"machine": machine(), "monitor": monitor, "store": store, "analysis": analysis}
        Path(args.json).write_text(json.dumps(numbers, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
