"""Soak: the monitor under a GIL-heavy training loop while its child is killed at random
and the backend forks workers, as DataLoaders do.

    python bench/soak.py [--duration 600] [--kill-every 20] [--fork-every 7] [--json PATH]

Runs the monitor at the 1 s floor with every category on and a model whose
age advances with the workload, SIGKILLs the sampling child at random moments
(uniform around ``--kill-every`` seconds), forks a worker every ``--fork-every``
seconds that lives 5 s holding every descriptor it inherited, and reports what
a week-long run would care about: backend RSS growth, restarts, records lost,
sample gaps, and any segment, mapping, descriptor or process left over after
``stop()``. Expected: all zero except restarts (and gaps of about the restart
backoff).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sampler
from ringbuf import NAME_PREFIX
from sampler.supervision.spawn import is_sampling_child


class Model:
    """Stands in for the watched model: its age is the training step."""

    def __init__(self) -> None:
        self.age = 0

    def get_age(self) -> int:
        return self.age


def gil_heavy_step(n: int = 20_000) -> int:
    """Pure-Python work that holds the GIL the whole time."""
    total = 0
    for i in range(n):
        total += (i * i) % 7
    return total


def segments() -> set[str]:
    return (
        {n for n in os.listdir("/dev/shm") if n.startswith(NAME_PREFIX)}
        if os.path.isdir("/dev/shm")
        else set()
    )


def sampling_children() -> list[int]:
    return [
        proc.info["pid"]
        for proc in psutil.process_iter(["pid", "cmdline"])
        if is_sampling_child(proc.info["cmdline"] or [])
    ]


def ring_mappings() -> int:
    """Shared-memory mappings of ours in this process (anonymous ones included)."""
    return Path("/proc/self/maps").read_text().count(NAME_PREFIX)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--kill-every", type=float, default=20.0, help="mean seconds between kills")
    parser.add_argument("--fork-every", type=float, default=7.0, help="seconds between forked workers")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    segments_before, children_before = segments(), set(sampling_children())
    maps_before, fds_before = ring_mappings(), open_fds()
    model = Model()
    sampler.watch_model(model)
    sample_times: list[float] = []
    monitor = sampler.ResourceMonitor(
        interval_seconds=1.0,
        sink=lambda n, v, s: None,
        on_sample=lambda sample: sample_times.append(time.monotonic()),
    )
    me = psutil.Process()
    stop_killing = threading.Event()
    kills = []

    def killer() -> None:
        rng = random.Random(1)
        while not stop_killing.wait(rng.uniform(0.5, 1.5) * args.kill_every):
            pid = monitor.child_pid
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                kills.append(time.monotonic())

    monitor.start()
    began = time.monotonic()
    warm_until = began + min(30.0, args.duration / 4)
    rss_start = None
    threading.Thread(target=killer, name="soak-killer", daemon=True).start()
    steps = 0
    workers: list[int] = []
    next_fork = began + args.fork_every
    while time.monotonic() - began < args.duration:
        gil_heavy_step()
        steps += 1
        model.age = steps
        if time.monotonic() >= next_fork:
            next_fork += args.fork_every
            # Reaped only here, not every step: a system call per step in a GIL-bound loop
            # starves every other thread of the GIL (see the README's known limits).
            workers = [pid for pid in workers if not os.waitpid(pid, os.WNOHANG)[0]]
            pid = os.fork()
            if pid == 0:  # a worker: holds every inherited descriptor, then leaves as Python does
                time.sleep(5)
                sys.exit(0)
            workers.append(pid)
        if rss_start is None and time.monotonic() >= warm_until:
            rss_start = me.memory_info().rss
    rss_end = me.memory_info().rss
    stop_killing.set()
    stats = monitor.stats()
    monitor.stop()
    for pid in workers:
        os.waitpid(pid, 0)
    time.sleep(0.5)
    gaps = [b - a for a, b in itertools.pairwise(sample_times)]
    result = {
        "duration_s": round(time.monotonic() - began, 1),
        "training_steps": steps,
        "kills": len(kills),
        "workers_forked": int((time.monotonic() - began) // args.fork_every),
        "restarts": stats["restarts"],
        "restarts_by_cause": stats["restarts_by_cause"],
        "samples_logged": stats["records_logged"],
        "samples_read": stats["records_read"],
        "samples_dropped_same_step": stats["records_dropped"],
        "records_lost": stats["records_lost"],
        "sink_errors": stats["sink_errors"],
        "max_gap_s": round(max(gaps), 2) if gaps else None,
        "backend_rss_growth_mb": round(((rss_end - (rss_start or rss_end)) / 1024**2), 2),
        "segments_left": sorted(segments() - segments_before),
        "mappings_left": ring_mappings() - maps_before,
        "fds_left": open_fds() - fds_before,
        "processes_left": sorted(set(sampling_children()) - children_before),
        "reader_thread_left": any(t.name == "WL-ResourceMonitor" for t in threading.enumerate()),
    }
    print("| measure | value |\n|---|---|")
    for key, value in result.items():
        print(f"| {key} | {value} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    clean = not (
        result["segments_left"]
        or result["mappings_left"]
        or result["fds_left"]
        or result["processes_left"]
        or result["reader_thread_left"]
    )
    return 0 if clean and result["records_lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
