"""What the inner rate costs: the backend's monitor thread and the sampling child.

The child reads the tracked signals between records (5 Hz by default) for their
peaks and means; the backend still wakes once per record and logs the same
fields whatever the inner rate. This runs the isolated monitor at a 1 s
interval with the inner rate at 1 Hz (no reads between records), 5 Hz, 10 Hz
and 50 Hz, in alternating rounds, and prints per record: the monitor thread's CPU
(its own thread clock), the child's CPU (its status block, which counts the
inner reads towards the record they precede) and the child's share of a core,
each also as a ratio to 1 Hz measured in the same rounds.

    python -m bench.inner_rate [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Sequence

import psutil

import sampler
from bench.overhead import noop_sink

RATES_HZ = (1.0, 5.0, 10.0, 50.0)
CATEGORIES = ("cpu", "memory", "disk", "network", "process", "process_tree")
INTERVAL = 1.0


def thread_cpu_ns(name: str) -> int:
    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
    raise RuntimeError(f"no {name} thread")


def measure(rate_hz: float, seconds: float) -> dict[str, float]:
    """One round: per-record backend thread CPU (ms), child CPU (ms), child core share (%)."""
    monitor = sampler.ResourceMonitor(
        interval_seconds=INTERVAL,
        categories=CATEGORIES,
        inner_rate_hz=rate_hz,
        sink=noop_sink,
        step_source="seconds",
        postmortem_dir=None,
    )
    with monitor:
        deadline = time.monotonic() + 30
        while monitor.stats()["records_read"] < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("no first record within 30 s")
            time.sleep(0.02)
        child = psutil.Process(monitor.child_pid)
        records0 = monitor.stats()["records_read"]
        thread0, child0, wall0 = thread_cpu_ns("WL-ResourceMonitor"), child.cpu_times(), time.monotonic()
        time.sleep(seconds)
        thread1, child1, wall1 = thread_cpu_ns("WL-ResourceMonitor"), child.cpu_times(), time.monotonic()
        stats = monitor.stats()
    records = stats["records_read"] - records0
    child_cpu = (child1.user + child1.system) - (child0.user + child0.system)
    return {
        "records": records,
        "backend_ms_per_record": (thread1 - thread0) / 1e6 / max(records, 1),
        "child_ms_per_record": (stats["child_cpu_seconds_per_sample"] or 0.0) * 1e3,
        "child_core_percent": 100.0 * child_cpu / (wall1 - wall0),
        "signals_per_record": stats["signals_logged"] / max(stats["records_logged"], 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inner_rate", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one short round per rate")
    args = parser.parse_args(argv)
    rounds, seconds = (1, 4.0) if args.quick else (3, 8.0)
    results: dict[float, list[dict[str, float]]] = {rate: [] for rate in RATES_HZ}
    for round_no in range(rounds):
        for rate in RATES_HZ:
            results[rate].append(measure(rate, seconds))
        print(f"round {round_no + 1}/{rounds} done", file=sys.stderr, flush=True)
    print(
        f"Isolated monitor, {INTERVAL:g} s interval, categories {','.join(CATEGORIES)}; medians of {rounds}"
    )
    print("| inner rate | backend thread CPU ms/record | x 1 Hz | child CPU ms/record | x 1 Hz "
          "| child % of a core | signals/record |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    base = results[RATES_HZ[0]]
    for rate in RATES_HZ:
        runs = results[rate]

        def median(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        def ratio(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] / b[key] for r, b in zip(runs, base, strict=True) if b[key])

        print(
            f"| {rate:g} Hz | {median('backend_ms_per_record'):.3f} | {ratio('backend_ms_per_record'):.2f}x "
            f"| {median('child_ms_per_record'):.2f} | {ratio('child_ms_per_record'):.2f}x "
            f"| {median('child_core_percent'):.2f} | {median('signals_per_record'):.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
