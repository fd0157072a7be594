"""What the sampling child costs per record with a large backend and DataLoader-like workers.

    python -m bench.child_cost [--quick]

This process becomes the backend: it touches BACKEND_MB of memory, forks WORKERS workers that
each touch WORKER_MB of their own (as a DataLoader's workers inherit a trainer's memory), then
runs the isolated monitor with every category at the 1 s interval and the default inner rate.
It prints

- the child's CPU per record, from the kernel's count for the whole child (every thread) over
  the measured records, and the share of one core that is;
- per category, what each reading costs as the child makes it (CPU of this process, user and
  kernel, per call, against the same tree): ``sample()`` once per record, ``sample_tracked()``
  at the inner rate, ``marks()`` once per record, and for the process tree its PSS pass, held to
  ``PSS_CPU_SHARE`` of a core; their sum per record beside the measured total.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil

import sampler
from bench.overhead import noop_sink
from bench.tree_cost import cpu_ms
from sampler.catalogue import DEFAULT_CATEGORIES
from sampler.collectors import Sources, build_collector
from sampler.collectors.tree import PSS_CPU_SHARE, ProcessTreeCollector
from sampler.settings import DEFAULT_INNER_RATE_HZ as INNER_RATE_HZ

INTERVAL = 1.0


@dataclass(frozen=True)
class Profile:
    backend_mb: int
    workers: int
    worker_mb: int
    seconds: float
    """How long the monitor is measured."""
    calls: int
    """Calls per reading timed per category."""


FULL = Profile(backend_mb=1536, workers=8, worker_mb=64, seconds=120.0, calls=20)
"""Two minutes: PSS passes, a tenth of a second each in this tree, come every 10 to 40 s, so a
short window's count of them, not the monitor, would decide the figure."""
QUICK = Profile(backend_mb=128, workers=2, worker_mb=16, seconds=4.0, calls=3)


def touch(mb: int) -> bytearray:
    """``mb`` MiB, every page written: resident."""
    buf = bytearray(mb * 1024**2)
    buf[::4096] = b"\x01" * len(range(0, len(buf), 4096))
    return buf


@contextlib.contextmanager
def workers(count: int, mb: int) -> Iterator[list[int]]:
    """``count`` forked workers, each touching ``mb`` MiB of its own, then waiting to be killed."""
    ready_r, ready_w = os.pipe()
    pids = []
    try:
        for _ in range(count):
            pid = os.fork()
            if pid == 0:  # the worker: no thread runs yet in this process (the monitor starts later)
                own = touch(mb)
                os.write(ready_w, b"r")
                while own:
                    signal.pause()
                os._exit(0)
            pids.append(pid)
        got = 0
        while got < count:
            got += len(os.read(ready_r, count - got))
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(ready_w)


@dataclass(frozen=True)
class Row:
    category: str
    sample_ms: float
    tracked_ms: float
    tracked: int
    """Tracked readings."""
    marks_ms: float
    pass_ms: float = 0.0
    """A full PSS pass (process tree only)."""

    @property
    def per_record_ms(self) -> float:
        pss = min(self.pass_ms, PSS_CPU_SHARE * INTERVAL * 1e3)
        inner = INNER_RATE_HZ * INTERVAL if self.tracked else 0.0  # the record's own tracked read included
        return self.sample_ms + self.marks_ms + inner * self.tracked_ms + pss


def categories(calls: int) -> list[Row]:
    """Each category's readings as the child makes them, against this process's tree."""
    sources = Sources(disk_path=os.getcwd(), pid=os.getpid(), nvml_module="pynvml")
    rows = []
    for category in DEFAULT_CATEGORIES:
        collector = build_collector(category, sources)
        if collector is None:
            continue  # none here: no GPU, no cgroup limit, no PSI
        try:
            if isinstance(collector, ProcessTreeCollector):
                every = ProcessTreeCollector(os.getpid(), pss_cpu_share=math.inf)
                pass_ms = max(0.0, cpu_ms(max(2, calls // 4), every.sample) - cpu_ms(calls, collector.sample))
            else:
                pass_ms = 0.0
            rows.append(
                Row(
                    category,
                    cpu_ms(calls, collector.sample),
                    cpu_ms(calls * 5, collector.sample_tracked),
                    len(collector.tracked),
                    cpu_ms(calls, collector.marks),
                    pass_ms,
                )
            )
        finally:
            collector.close()
    return rows


def measure_child(seconds: float) -> dict[str, float]:
    """The isolated monitor with every category: child CPU per record (ms) and share of a core (%)."""
    monitor = sampler.ResourceMonitor(
        interval_seconds=INTERVAL,
        categories=list(DEFAULT_CATEGORIES),
        sink=noop_sink,
        step_source="seconds",
        postmortem_dir=None,
    )
    with monitor:
        deadline = time.monotonic() + 60
        while monitor.stats()["records_read"] < 2:  # the first record's start-up is not the steady state
            if time.monotonic() > deadline:
                raise RuntimeError("no second record within 60 s")
            time.sleep(0.02)
        child = psutil.Process(monitor.child_pid)
        records0, times0, wall0 = monitor.stats()["records_read"], child.cpu_times(), time.monotonic()
        time.sleep(seconds)
        records1, times1, wall1 = monitor.stats()["records_read"], child.cpu_times(), time.monotonic()
    cpu = (times1.user + times1.system) - (times0.user + times0.system)
    records = max(records1 - records0, 1)
    return {
        "records": records,
        "child_ms_per_record": cpu / records * 1e3,
        "core_percent": 100 * cpu / (wall1 - wall0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.child_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small backend, a few seconds")
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    held = touch(profile.backend_mb)
    with workers(profile.workers, profile.worker_mb):
        child = measure_child(profile.seconds)
        rows = categories(profile.calls)
    del held
    print(
        f"# The sampling child's cost per record\n\n"
        f"Backend: {profile.backend_mb} MiB touched, then {profile.workers} forked workers touching "
        f"{profile.worker_mb} MiB each; every category, {INTERVAL:g} s interval, inner rate "
        f"{INNER_RATE_HZ:g} Hz, {child['records']:.0f} records measured; {os.cpu_count()} CPUs.\n"
    )
    print("| | child CPU per record | child, % of one core |")
    print("|---|---|---|")
    print(f"| measured | {child['child_ms_per_record']:.2f} ms | {child['core_percent']:.2f} % |\n")
    print(
        f"Per category, CPU ms per call against the same tree; per record: sample() + marks() + "
        f"{INNER_RATE_HZ * INTERVAL:g} tracked reads, and for the tree its PSS pass within "
        f"{PSS_CPU_SHARE:.1%} of a core:\n"
    )
    print("| category | sample() | sample_tracked() (readings) | marks() | PSS pass | per record |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        pss = f"{row.pass_ms:.1f}" if row.pass_ms else "-"
        print(
            f"| {row.category} | {row.sample_ms:.3f} | {row.tracked_ms:.3f} ({row.tracked}) "
            f"| {row.marks_ms:.3f} | {pss} | {row.per_record_ms:.2f} |"
        )
    print(f"| all | | | | | {sum(row.per_record_ms for row in rows):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
