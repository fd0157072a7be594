"""Where the sampling child's CPU goes, phase by phase.

    python -m bench.child_breakdown [--quick] [--seconds S] [--profile]

Runs the child's own loop (``sampler.child.main.Child``, with its collectors, peaks, ring and
status block) in this process's main thread, describing this process, with the categories cpu,
memory, disk, network and process, a 1 s interval and the default inner rate, for ``seconds``.
Each phase is timed on the thread's CPU clock: each collector's ``sample()`` (once per record),
``sample_tracked()`` (at the inner rate) and ``marks()``; the peaks and means; the ring write;
the status block's writes; the rest of the thread's CPU is the loop itself and its wake-ups
(the interpreter leaving its wait, the schedule, the wake-up byte to the reader).

Then each collector's reads are timed again called back to back (warm caches): what a call
costs in the loop beyond that is paid in cold caches and pages after each sleep.

``--profile`` runs the loop under cProfile instead and prints the functions with the most
time of their own.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import socket
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from sampler.child.main import Child
from sampler.collectors import Sources
from sampler.ipc.channel import ChildParams
from sampler.ipc.status import ChildStatus
from sampler.settings import resolve_settings

CATEGORIES = ("cpu", "memory", "disk", "network", "process")
INTERVAL = 1.0
WARM_CALLS = 50
"""Back-to-back calls per reading for its warm cost."""


class Clock:
    """Thread CPU time (ns) spent in each wrapped call, by label; a wrapped call made inside
    another counts for its own label only."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self._nested = [0]
        """Per call in progress, the time its own wrapped calls took."""

    def wrap(self, owner: object, method: str, label: str) -> None:
        """Time ``owner.method`` under ``label`` from now on."""
        inner: Callable[..., Any] = getattr(owner, method)
        ns, calls, nested, clock = self.ns, self.calls, self._nested, time.thread_time_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            nested.append(0)
            start = clock()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = clock() - start
                ns[label] += spent - nested.pop()
                nested[-1] += spent
                calls[label] += 1

        setattr(owner, method, timed)


def make_child() -> tuple[Child, list[object]]:
    """A child describing this process, and what must stay open while it runs."""
    settings, _ = resolve_settings({"interval_seconds": INTERVAL, "categories": CATEGORIES})
    sources = Sources(disk_path=settings.disk_path, pid=os.getpid(), nvml_module=settings.nvml_module)
    params = ChildParams(CATEGORIES, settings, sources, backend_pid=os.getpid(), capacity=64)
    ours, theirs = socket.socketpair()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    status, status_fd = ChildStatus.create()
    os.close(status_fd)
    return Child(params, theirs, wake_w, status), [ours, theirs, wake_r, wake_w, status]


def drain(fd: int, stop: threading.Event) -> None:
    """Read the wake-up bytes, as the backend's reader would."""
    while not stop.is_set():
        try:
            os.read(fd, 4096)
        except OSError:
            return


def run_loop(child: Child, seconds: float) -> None:
    """Run the child's loop until ``seconds`` have passed."""
    threading.Timer(seconds, child.stop.set).start()
    child.run()


def instrument(child: Child, clock: Clock) -> None:
    """Time every phase of the child's loop, once its collectors exist (``Child.run`` builds them)."""
    build = child.run

    def run() -> int:
        original = child._loop

        def loop(ring: Any, peaks: Any) -> int:
            for collector in child.collectors:
                for method in ("sample", "marks", *(("sample_tracked",) if collector.tracked else ())):
                    clock.wrap(collector, method, f"{collector.category}.{method}")
            for method in ("add", "include", "close"):
                clock.wrap(peaks, method, "peaks and means")
            clock.wrap(ring, "write", "ring write")
            for method in ("enter", "count_sample", "logged"):
                clock.wrap(child.status, method, "status block")
            return original(ring, peaks)

        child._loop = loop  # type: ignore[method-assign]
        return build()

    child.run = run  # type: ignore[method-assign]


def warm_costs(child: Child) -> dict[str, float]:
    """Each reading's CPU per call (ms) when called back to back."""
    costs = {}
    for collector in child.collectors:
        for method in ("sample", "sample_tracked") if collector.tracked else ("sample",):
            call = getattr(type(collector), method).__get__(collector)  # not the timed wrapper
            call()
            start = time.thread_time_ns()
            for _ in range(WARM_CALLS):
                call()
            costs[f"{collector.category}.{method}"] = (time.thread_time_ns() - start) / 1e6 / WARM_CALLS
    return costs


def breakdown(seconds: float) -> str:
    child, held = make_child()
    clock = Clock()
    instrument(child, clock)
    stop_drain = threading.Event()
    threading.Thread(target=drain, args=(held[2], stop_drain), daemon=True).start()
    start_cpu, start_wall = time.thread_time_ns(), time.monotonic()
    run_loop(child, seconds)
    total_ns, wall = time.thread_time_ns() - start_cpu, time.monotonic() - start_wall
    records = child.status.read().samples
    warm = warm_costs(child)
    child.close()
    stop_drain.set()
    per_second = 1e6 * wall
    lines = [
        f"The child's loop for {wall:.0f} s ({records} records), {INTERVAL:g} s interval, "
        f"categories {','.join(CATEGORIES)}, default inner rate; thread CPU",
        "",
        "| phase | calls/s | ms/call in the loop | ms/call warm | cold share | CPU ms/s | % of the child |",
        "|---|---|---|---|---|---|---|",
    ]
    rest = total_ns
    for label in sorted(clock.ns, key=lambda k: -clock.ns[k]):
        ns, calls = clock.ns[label], clock.calls[label]
        rest -= ns
        loop_ms = ns / 1e6 / calls
        hot = warm.get(label)
        hot_cells = ["-", "-"] if hot is None else [f"{hot:.3f}", f"{max(0.0, 1 - hot / loop_ms):.0%}"]
        lines.append(
            f"| {label} | {calls / wall:.1f} | {loop_ms:.3f} | {' | '.join(hot_cells)} "
            f"| {ns / per_second:.3f} | {ns / total_ns:.0%} |"
        )
    lines.append(
        f"| loop and wake-ups (the rest) | - | - | - | - | {rest / per_second:.3f} | {rest / total_ns:.0%} |"
    )
    lines.append(f"| all | - | - | - | - | {total_ns / per_second:.3f} | 100% |")
    return "\n".join(lines)


def profile(seconds: float) -> str:
    child, held = make_child()
    stop_drain = threading.Event()
    threading.Thread(target=drain, args=(held[2], stop_drain), daemon=True).start()
    profiler = cProfile.Profile(time.thread_time)  # CPU, not the sleeps
    profiler.runcall(run_loop, child, seconds)
    child.close()
    stop_drain.set()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.child_breakdown", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds")
    parser.add_argument("--seconds", type=float, help="how long the loop runs (default 60)")
    parser.add_argument("--profile", action="store_true", help="cProfile the loop instead")
    args = parser.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 60.0)
    print(profile(seconds) if args.profile else breakdown(seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
