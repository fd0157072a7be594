"""What the process_tree collector costs the sampling child, against a naive tree monitor.

    .venv/bin/python -m bench.tree_cost [--quick]

For a parent with 0, 8 and 64 workers (real processes: the parent touches PARENT_MB and then
forks the workers, which each touch WORKER_MB of their own, as a backend forks DataLoader
workers), measures the CPU time (``time.process_time``: user and kernel, of this process,
which samples as the child does) of

- ``sample()`` with a PSS pass (every process's smaps_rollup read) and without one (the
  children scan and each process's CPU times and RSS), and ``sample_tracked()``;
- a naive tick: a fresh ``children(recursive=True)`` and psutil's ``memory_full_info()``
  (PSS) of every process, what a monitor that rescans everything at each reading does.

Then the share of one core each takes at 1 record/s with 10 tracked readings/s: the
collector, whose PSS passes are held to ``PSS_CPU_SHARE`` of a core, and the same with a
pass at every record, against the naive tick at the same rate (the default inner rate).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psutil

from sampler.collectors.tree import PSS_CPU_SHARE, ProcessTreeCollector
from sampler.settings import DEFAULT_INNER_RATE_HZ

PARENT_MB = 256
WORKER_MB = 16
WORKERS = (0, 8, 64)
RECORDS_PER_SECOND = 1
TRACKED_PER_SECOND = DEFAULT_INNER_RATE_HZ

PARENT = r"""
import os, signal, sys

def touch(mb):
    buf = bytearray(mb * 1024**2)
    buf[::4096] = b"\x01" * len(range(0, len(buf), 4096))  # one write per page: all resident
    return buf

parent_mb, workers, worker_mb = map(int, sys.argv[1:])
held = touch(parent_mb)
ready_r, ready_w = os.pipe()
for _ in range(workers):
    if os.fork() == 0:
        own = touch(worker_mb)
        os.write(ready_w, b"r")
        signal.pause()  # until the benchmark kills the session
        os._exit(0)
got = 0
while got < workers:
    got += len(os.read(ready_r, workers - got))
print("ready", flush=True)
sys.stdin.read()  # until the benchmark closes it
"""


@dataclass(frozen=True)
class Profile:
    passes: int
    scans: int
    tracked: int
    naive: int


QUICK = Profile(passes=2, scans=5, tracked=50, naive=2)
FULL = Profile(passes=8, scans=30, tracked=400, naive=8)


@contextlib.contextmanager
def parent_with(workers: int) -> Iterator[int]:
    """A parent, in a session of its own, with ``workers`` forked workers; yields its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(PARENT_MB), str(workers), str(WORKER_MB)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the parent died before its workers were ready")
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def cpu_ms(repeats: int, call: Callable[[], object]) -> float:
    """CPU milliseconds of this process per call, over ``repeats`` calls."""
    began = time.process_time()
    for _ in range(repeats):
        call()
    return (time.process_time() - began) / repeats * 1e3


def naive_tick(root: psutil.Process) -> float:
    """The tree's PSS (bytes), read afresh from every process."""
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_full_info().pss
    return total


@dataclass(frozen=True)
class Row:
    workers: int
    sample_pass_ms: float
    sample_ms: float
    tracked_ms: float
    naive_ms: float

    @property
    def pass_ms(self) -> float:
        return max(0.0, self.sample_pass_ms - self.sample_ms)

    def core_percent(self, budgeted: bool) -> float:
        """% of one core at RECORDS_PER_SECOND records and TRACKED_PER_SECOND tracked readings."""
        pass_ms = RECORDS_PER_SECOND * self.pass_ms
        if budgeted:
            pass_ms = min(pass_ms, PSS_CPU_SHARE * 1e3)
        per_second = RECORDS_PER_SECOND * self.sample_ms + pass_ms + TRACKED_PER_SECOND * self.tracked_ms
        return per_second / 10

    @property
    def pass_every_seconds(self) -> float:
        """How often the budget lets a PSS pass run (at most once per record)."""
        return max(1 / RECORDS_PER_SECOND, self.pass_ms / 1e3 / PSS_CPU_SHARE)

    @property
    def naive_core_percent(self) -> float:
        return TRACKED_PER_SECOND * self.naive_ms / 10


def measure(workers: int, profile: Profile) -> Row:
    with parent_with(workers) as pid:
        every = ProcessTreeCollector(pid, pss_cpu_share=math.inf)  # a pass at every sample()
        never = ProcessTreeCollector(pid, pss_cpu_share=1e-12)  # the pass at start, no more
        count = int(never.sample()[0])
        if count != workers + 1:
            raise RuntimeError(f"expected {workers + 1} processes in the tree, found {count}")
        root = psutil.Process(pid)
        return Row(
            workers=workers,
            sample_pass_ms=cpu_ms(profile.passes, every.sample),
            sample_ms=cpu_ms(profile.scans, never.sample),
            tracked_ms=cpu_ms(profile.tracked, never.sample_tracked),
            naive_ms=cpu_ms(profile.naive, lambda: naive_tick(root)),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (about 10 s)")
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    began = time.monotonic()
    rows = [measure(n, profile) for n in WORKERS]
    print(
        f"# process_tree collector cost\n\n{os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"psutil {psutil.__version__}, {len(psutil.pids())} processes on the machine "
        f"(the children scan reads each one's parent)\n"
        f"parent touched {PARENT_MB} MB then forked the workers, each touched {WORKER_MB} MB; "
        f"CPU ms per call (user + kernel); % of one core at {RECORDS_PER_SECOND} record/s and "
        f"{TRACKED_PER_SECOND:g} tracked readings/s; PSS passes held to {PSS_CPU_SHARE:.1%} of a core\n"
    )
    print(
        "| workers | sample() with PSS pass | sample() | sample_tracked() | PSS pass every (s) "
        "| core %, budgeted | core %, pass every record | naive tick "
        f"| naive core % at {TRACKED_PER_SECOND:g} Hz | naive / budgeted |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ours = row.core_percent(budgeted=True)
        print(
            f"| {row.workers} | {row.sample_pass_ms:.2f} | {row.sample_ms:.2f} | {row.tracked_ms:.3f} "
            f"| {row.pass_every_seconds:.1f} | {ours:.2f} | {row.core_percent(budgeted=False):.2f} "
            f"| {row.naive_ms:.2f} | {row.naive_core_percent:.1f} | {row.naive_core_percent / ours:.0f}x |"
        )
    print(f"\n({time.monotonic() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
