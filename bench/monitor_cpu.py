"""Monitoring CPU per second: this monitor against an in-thread psutil monitor and the floor.

    python -m bench.monitor_cpu [--quick] [--rounds N] [--seconds S] [--inner-rate HZ]

In the same run, in interleaved rounds (the order rotates each round, so drift in the
machine's speed hits all three alike), with the backend otherwise idle and a 1 s interval:

- ``monitor``: this monitor, isolated, with the categories cpu, memory, disk, network and
  process and the default settings (the inner rate too, unless ``--inner-rate``): the CPU of
  the threads it starts in the backend (the monitor thread) and of its sampling child (every
  thread of it);
- ``psutil``: an in-thread monitor of the same five categories as a training backend would
  write one with psutil: a daemon thread that each interval reads ``cpu_percent``,
  ``virtual_memory``, ``disk_usage`` and ``disk_io_counters``, ``net_io_counters``, and the
  backend's CPU %, memory and thread count through one ``psutil.Process``;
- ``floor``: a daemon thread woken every interval that does nothing.

CPU time is the kernel's per-task count in nanoseconds (``/proc/<pid>/task/<tid>/schedstat``),
taken once the first reading is behind each of them. It prints milliseconds of CPU per second
of wall time, median (min..max) over rounds, and each as a multiple of the psutil monitor and
of the floor, paired round by round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence

import psutil

import sampler
from bench.overhead import noop_sink
from sampler.settings import DEFAULT_DISK_PATH, DEFAULT_INNER_RATE_HZ

CATEGORIES = ("cpu", "memory", "disk", "network", "process")
INTERVAL = 1.0
PARTS = ("monitor", "psutil", "floor")
"""What is measured each round, in the first round's order."""
ROWS = ("monitor backend", "monitor child", "monitor", "psutil", "floor")
"""The rows printed: the monitor's two processes, its total, the psutil monitor and the floor."""


def task_cpu_ns(pid: int, tid: int) -> int:
    """CPU time one task (thread) has used, ns; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
            return int(f.read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return 0


def tasks(pid: int) -> set[int]:
    """The thread ids of process ``pid`` now."""
    return {int(tid) for tid in os.listdir(f"/proc/{pid}/task")}


def cpu_ns(pid: int, tids: set[int]) -> int:
    return sum(task_cpu_ns(pid, tid) for tid in tids)


def measure_monitor(seconds: float, inner_rate_hz: float) -> dict[str, float]:
    """This monitor: ms of CPU per second in the backend's new threads and in the child."""
    own = os.getpid()
    before = tasks(own)
    monitor = sampler.ResourceMonitor(
        interval_seconds=INTERVAL,
        categories=CATEGORIES,
        inner_rate_hz=inner_rate_hz,
        sink=noop_sink,
        step_source="seconds",
        postmortem_dir=None,
    )
    with monitor:
        deadline = time.monotonic() + 60
        while monitor.stats()["records_read"] < 2:  # past the child's start and its first record
            if time.monotonic() > deadline:
                raise RuntimeError("no record within 60 s")
            time.sleep(0.05)
        child = monitor.child_pid
        assert child is not None
        started, child_tasks = tasks(own) - before, tasks(child)
        backend0, child0, wall0 = cpu_ns(own, started), cpu_ns(child, child_tasks), time.monotonic()
        time.sleep(seconds)
        backend1, child1, wall1 = cpu_ns(own, started), cpu_ns(child, child_tasks), time.monotonic()
    wall = wall1 - wall0
    return {
        "monitor backend": (backend1 - backend0) / 1e6 / wall,
        "monitor child": (child1 - child0) / 1e6 / wall,
    }


class Sampled(threading.Thread):
    """A daemon thread that calls ``read`` once at its start and then every ``INTERVAL``."""

    def __init__(self, read: Callable[[], object]) -> None:
        super().__init__(daemon=True, name="bench-sampled")
        self.read = read
        self.stop = threading.Event()
        self.primed = threading.Event()

    def run(self) -> None:
        self.read()
        self.primed.set()
        while not self.stop.wait(INTERVAL):
            self.read()


def psutil_reader(disk_path: str) -> Callable[[], object]:
    """One reading of the five categories, as a training backend's own thread would make it."""
    process = psutil.Process()
    psutil.cpu_percent(interval=None)
    process.cpu_percent(interval=None)

    def read() -> object:
        return (
            psutil.cpu_percent(interval=None),
            psutil.virtual_memory().percent,
            psutil.disk_usage(disk_path).percent,
            psutil.disk_io_counters(),
            psutil.net_io_counters(),
            process.cpu_percent(interval=None),
            process.memory_info().rss,
            process.memory_percent(),
            process.num_threads(),
        )

    return read


def measure_thread(read: Callable[[], object], seconds: float) -> float:
    """ms of CPU per second of a ``Sampled`` thread calling ``read``."""
    thread = Sampled(read)
    thread.start()
    try:
        thread.primed.wait()
        time.sleep(INTERVAL / 2)  # between two readings: the window holds whole ones
        tid = thread.native_id
        assert tid is not None
        cpu0, wall0 = task_cpu_ns(os.getpid(), tid), time.monotonic()
        time.sleep(seconds)
        cpu1, wall1 = task_cpu_ns(os.getpid(), tid), time.monotonic()
    finally:
        thread.stop.set()
        thread.join()
    return (cpu1 - cpu0) / 1e6 / (wall1 - wall0)


def measure(part: str, seconds: float, inner_rate_hz: float) -> dict[str, float]:
    if part == "monitor":
        result = measure_monitor(seconds, inner_rate_hz)
        result["monitor"] = result["monitor backend"] + result["monitor child"]
        return result
    if part == "psutil":
        return {"psutil": measure_thread(psutil_reader(DEFAULT_DISK_PATH), seconds)}
    return {"floor": measure_thread(lambda: None, seconds)}


def rounds_of(count: int, seconds: float, inner_rate_hz: float) -> list[dict[str, float]]:
    """``count`` rounds of every part, the order rotated each round."""
    results = []
    for round_no in range(count):
        shift = round_no % len(PARTS)
        result: dict[str, float] = {}
        for part in PARTS[shift:] + PARTS[:shift]:
            result |= measure(part, seconds, inner_rate_hz)
        results.append(result)
        print(f"round {round_no + 1}/{count} done", file=sys.stderr, flush=True)
    return results


def spread(values: list[float], digits: int) -> str:
    """``median (min..max)``."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def report(results: list[dict[str, float]], seconds: float, inner_rate_hz: float) -> str:
    lines = [
        f"{len(results)} interleaved rounds of {seconds:g} s, {INTERVAL:g} s interval, categories "
        f"{','.join(CATEGORIES)}, inner rate {inner_rate_hz:g} Hz, idle backend; median (min..max) "
        "over rounds",
        "",
        "| what | CPU ms/s | x psutil | x floor |",
        "|---|---|---|---|",
    ]
    for row in ROWS:
        cells = [spread([r[row] for r in results], 3)]
        for base in ("psutil", "floor"):
            ratios = [r[row] / r[base] for r in results if r[base] > 0]
            cells.append(spread(ratios, 2) if ratios else "-")
        lines.append(f"| {row} | {' | '.join(cells)} |")
    total = statistics.median(r["monitor"] for r in results)
    baseline = statistics.median(r["psutil"] for r in results)
    verdict = "met" if total <= baseline else "MISSED"
    goal = f"Goal, monitor total <= in-thread psutil monitor: {total:.3f} vs {baseline:.3f} ms/s, {verdict}"
    lines += ["", goal]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.monitor_cpu", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one short round (seconds)")
    parser.add_argument("--rounds", type=int, help="rounds (default 5, quick 1)")
    parser.add_argument("--seconds", type=float, help="seconds each part is measured per round (default 30)")
    parser.add_argument(
        "--inner-rate",
        type=float,
        default=DEFAULT_INNER_RATE_HZ,
        help=f"the monitor's inner rate, Hz (default {DEFAULT_INNER_RATE_HZ:g}, the monitor's default)",
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    seconds = args.seconds or (3.0 if args.quick else 30.0)
    print(report(rounds_of(rounds, seconds, args.inner_rate), seconds, args.inner_rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
