"""What the Prometheus endpoint costs: the sampling child per scrape, the backend nothing.

The child serves ``/metrics`` from a thread of its own, so a scrape should cost
the child some CPU and the backend none. Both run the isolated monitor at a 1 s
interval, in alternating rounds, and report medians over the rounds:

1. One monitor with the endpoint on, scraped at 20/s (a full GET of /metrics
   from this process) in one round and not at all in the next: the child's CPU
   per scrape in ms (its extra CPU over the round, from psutil, per scrape), the
   body's size in bytes and a scrape's latency in ms.
2. A fresh monitor per round, the endpoint off in one round and on in the next,
   scraped at 1/s (Prometheus' default is every 15 s) by a separate process, so
   that this process's CPU is the monitor's alone: the monitor thread's CPU per
   record (its own thread clock) and the whole backend process's, in ms, each
   also as a ratio to the endpoint off in the same pair of rounds.

    python -m bench.prometheus_cost [--quick]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence

import psutil

import sampler
from bench.inner_rate import CATEGORIES, INTERVAL, thread_cpu_ns
from bench.overhead import noop_sink

ADDRESS = "127.0.0.1"
FAST_SCRAPE_HZ = 20.0
SLOW_SCRAPE_HZ = 1.0
MONITOR_THREAD = "WL-ResourceMonitor"
SAMPLE_LINE = b"\nwl_resource_"
"""A sample line (not ``# HELP``/``# TYPE``) of one of the monitor's metrics."""

# The separate scraper of part 2: a GET at a fixed rate until SIGTERM, then
# "<scrapes with samples> <failed>" on stdout. Stdlib only, so it starts fast.
SCRAPER = r"""
import signal, sys, time, urllib.request

def stop(signum, frame):
    raise SystemExit(0)

signal.signal(signal.SIGTERM, stop)
url, rate, marker = sys.argv[1], float(sys.argv[2]), sys.argv[3].encode()
done = failed = 0
try:
    start = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                ok = marker in response.read()
        except OSError:
            ok = False
        done, failed = done + ok, failed + (not ok)
        time.sleep(max(0.0, start + (done + failed) / rate - time.monotonic()))
finally:
    print(done, failed, flush=True)
"""


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((ADDRESS, 0))
        return int(sock.getsockname()[1])


def start_monitor(endpoint: bool) -> tuple[sampler.ResourceMonitor, str | None]:
    """A started isolated monitor with its first record read, and its /metrics URL if ``endpoint``."""
    monitor = sampler.ResourceMonitor(
        interval_seconds=INTERVAL,
        categories=CATEGORIES,
        sink=noop_sink,
        step_source="seconds",
        postmortem_dir=None,
        prometheus_port=free_port() if endpoint else None,
        prometheus_address=ADDRESS,
    )
    monitor.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            stats = monitor.stats()
            # The URL appears once the child reports serving; the first record means a scrape has samples.
            if stats["records_read"] >= 1 and (not endpoint or stats["prometheus_endpoint"] is not None):
                return monitor, stats["prometheus_endpoint"]
            if stats["prometheus_error"] is not None:
                raise RuntimeError(f"endpoint not served: {stats['prometheus_error']}")
            if time.monotonic() > deadline:
                raise RuntimeError("no first record (or no endpoint) within 30 s")
            time.sleep(0.02)
    except BaseException:
        monitor.stop()
        raise


def scrape(url: str) -> tuple[int, float]:
    """One full GET of /metrics: (body bytes, latency in s)."""
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read()
    latency = time.perf_counter() - began
    if SAMPLE_LINE not in body:
        raise RuntimeError(f"no wl_resource_ samples in the {len(body)}-byte body of {url}")
    return len(body), latency


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def scrape_cost(rounds: int, seconds: float) -> dict[str, list[float]]:
    """Part 1, one monitor: per pair of rounds, the child's CPU per scrape (ms) and its share
    of a core (%) scraped and idle; per scrape, body bytes and latency (ms)."""
    out: dict[str, list[float]] = {
        "cpu_ms_per_scrape": [], "scraped_percent": [], "idle_percent": [], "scrapes": [],
        "bytes": [], "latency_ms": [],
    }  # fmt: skip
    monitor, url = start_monitor(endpoint=True)
    assert url is not None
    try:
        child = psutil.Process(monitor.child_pid)
        for round_no in range(rounds):
            # Which half goes first alternates, so a drift in the child's own cost cancels.
            rates: dict[bool, tuple[float, float]] = {}  # (child CPU s/s, scrapes/s)
            for scraped in (True, False) if round_no % 2 == 0 else (False, True):
                scrapes = 0
                cpu0, wall0 = cpu_seconds(child), time.monotonic()
                if scraped:
                    while (now := time.monotonic()) < wall0 + seconds:
                        time.sleep(max(0.0, wall0 + scrapes / FAST_SCRAPE_HZ - now))
                        size, latency = scrape(url)
                        out["bytes"].append(size)
                        out["latency_ms"].append(latency * 1e3)
                        scrapes += 1
                else:
                    time.sleep(seconds)
                cpu1, wall1 = cpu_seconds(child), time.monotonic()
                rates[scraped] = ((cpu1 - cpu0) / (wall1 - wall0), scrapes / (wall1 - wall0))
            (scraped_rate, scrape_hz), (idle_rate, _) = rates[True], rates[False]
            # CPU rates (s per s), not totals: the two halves need not last exactly as long.
            out["cpu_ms_per_scrape"].append((scraped_rate - idle_rate) / scrape_hz * 1e3)
            out["scraped_percent"].append(100.0 * scraped_rate)
            out["idle_percent"].append(100.0 * idle_rate)
            out["scrapes"].append(scrape_hz * seconds)
            print(f"scrape cost: round {round_no + 1}/{rounds} done", file=sys.stderr, flush=True)
    finally:
        monitor.stop()
    return out


def stop_scraper(scraper: subprocess.Popen[str]) -> tuple[int, int]:
    """End the scraper (SIGTERM, else SIGKILL) and reap it: (scrapes with samples, failures)."""
    try:
        os.kill(scraper.pid, signal.SIGTERM)
        out, _ = scraper.communicate(timeout=10)
    finally:
        if scraper.poll() is None:
            os.kill(scraper.pid, signal.SIGKILL)
        scraper.wait()
    done, failed = (int(word) for word in out.split())
    return done, failed


def backend_cost(endpoint: bool, seconds: float) -> dict[str, float]:
    """Part 2, one round on a fresh monitor: per record, the monitor thread's and the backend
    process's CPU (ms); the scrapes made (at 1/s from another process when ``endpoint``)."""
    monitor, url = start_monitor(endpoint)
    try:
        scraper: subprocess.Popen[str] | None = None
        if url is not None:
            scraper = subprocess.Popen(
                [sys.executable, "-c", SCRAPER, url, str(SLOW_SCRAPE_HZ), SAMPLE_LINE.decode()],
                stdout=subprocess.PIPE,
                text=True,
            )
        try:
            records0 = monitor.stats()["records_read"]
            # The process clock, not psutil's cpu_times: that counts in 10 ms ticks, and the whole
            # process spends about that much in a round. The main thread only sleeps meanwhile.
            thread0, process0 = thread_cpu_ns(MONITOR_THREAD), time.process_time_ns()
            time.sleep(seconds)
            thread1, process1 = thread_cpu_ns(MONITOR_THREAD), time.process_time_ns()
            records = monitor.stats()["records_read"] - records0
        finally:
            done, failed = stop_scraper(scraper) if scraper is not None else (0, 0)
    finally:
        monitor.stop()
    if failed:
        raise RuntimeError(f"{failed} of {done + failed} scrapes of {url} failed or had no samples")
    return {
        "records": records,
        "scrapes": done,
        "thread_ms_per_record": (thread1 - thread0) / 1e6 / max(records, 1),
        "process_ms_per_record": (process1 - process0) / 1e6 / max(records, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prometheus_cost", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one short pair of rounds per part")
    args = parser.parse_args(argv)
    (rounds1, seconds1), (rounds2, seconds2) = ((1, 4.0), (1, 5.0)) if args.quick else ((4, 8.0), (5, 10.0))

    scraping = scrape_cost(rounds1, seconds1)
    backend: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for round_no in range(rounds2):
        for endpoint in (False, True) if round_no % 2 == 0 else (True, False):
            backend[endpoint].append(backend_cost(endpoint, seconds2))
        print(f"backend cost: round {round_no + 1}/{rounds2} done", file=sys.stderr, flush=True)

    print(
        f"Isolated monitor, {INTERVAL:g} s interval, categories {','.join(CATEGORIES)}; "
        f"{os.cpu_count()} CPUs; medians of alternating rounds"
    )
    print(
        f"\n## The child's CPU per scrape: {FAST_SCRAPE_HZ:g} scrapes/s from this process against none, "
        f"{rounds1} pair(s) of {seconds1:g} s rounds\n"
    )
    print("| scrape rate | scrapes/round | body bytes | scrape latency median ms | child % of a core scraped "
          "| child % of a core idle | child CPU ms/scrape |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    med = {key: statistics.median(values) for key, values in scraping.items()}
    print(
        f"| {FAST_SCRAPE_HZ:g}/s | {med['scrapes']:.0f} | {med['bytes']:.0f} | {med['latency_ms']:.2f} "
        f"| {med['scraped_percent']:.2f} | {med['idle_percent']:.2f} | {med['cpu_ms_per_scrape']:.3f} |"
    )
    print(
        f"\n## The backend per record, endpoint off against on (scraped at {SLOW_SCRAPE_HZ:g}/s by another "
        f"process): {rounds2} pair(s) of {seconds2:g} s rounds, a fresh monitor each\n"
    )
    # The pairs' range beside each median ratio: one pair's noise (a round holds few records) is
    # what a median ratio away from 1 must be judged against.
    print("| endpoint | scrapes/round | records/round | monitor thread CPU ms/record | x off | pairs' range "
          "| backend process CPU ms/record | x off | pairs' range |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for endpoint, label in ((False, "off"), (True, f"on, {SLOW_SCRAPE_HZ:g}/s")):
        runs = backend[endpoint]

        def median(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        def ratio(key: str, runs: list[dict[str, float]] = runs) -> str:
            pairs = zip(runs, backend[False], strict=True)
            ratios = [r[key] / b[key] for r, b in pairs if b[key]]
            return f"{statistics.median(ratios):.2f}x | {min(ratios):.2f} to {max(ratios):.2f}"

        print(
            f"| {label} | {median('scrapes'):.0f} | {median('records'):.0f} "
            f"| {median('thread_ms_per_record'):.3f} | {ratio('thread_ms_per_record')} "
            f"| {median('process_ms_per_record'):.3f} | {ratio('process_ms_per_record')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
