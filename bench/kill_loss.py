"""What a SIGKILL of the backend loses of the signals logged through the pipeline, and
what ``log_signal`` costs per call with the run store on.

    python bench/kill_loss.py [--trials 5] [--rate 1000] [--intervals 15 1] [--quick]

Each trial runs a real backend (a monitor with a store, sampling every interval) that
logs ``train/loss`` ``--rate`` times a second and prints each step once logged; once
the store holds some of it, the backend is SIGKILLed at a random moment up to one
interval and a second later. Points lost: logged (printed) but not in the store; the
seconds are those of logging they span. The per-call cost is CPU time in the calling
thread, with a monitor (store on, 15 s interval) writing in the background.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sampler  # noqa: E402  (after the path set-up above)

BACKEND = """
import sys, time
sys.path.insert(0, {root!r})
import sampler  # noqa: E402  (after the path set-up above)
sampler.ResourceMonitor(categories=["cpu"], store={store!r}, interval_seconds={interval},
                        step_source="seconds").start()
began, step = time.monotonic(), 0
while True:
    sampler.signals.log_signal("train/loss", 1.0, step)
    print(step, time.time(), flush=True)
    step += 1
    time.sleep(max(0.0, began + step / {rate} - time.monotonic()))
"""


def stored_steps(store: str) -> list[int]:
    """The ``train/loss`` steps in the store now (none before it exists)."""
    try:
        db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    except sqlite3.Error:
        return []
    try:
        return [row[0] for row in db.execute("SELECT step FROM signals WHERE name = 'train/loss'")]
    except sqlite3.Error:
        return []
    finally:
        db.close()


def trial(interval: float, rate: float, kill_after: float) -> tuple[int, float]:
    """One backend killed ``kill_after`` s after its store first held the loss:
    (points lost, seconds of logging they span)."""
    with tempfile.TemporaryDirectory(prefix="bench-kill-") as tmp:
        store = os.path.join(tmp, "runs.sqlite")
        script = Path(tmp, "train.py")
        script.write_text(
            textwrap.dedent(BACKEND.format(root=str(ROOT), store=store, interval=interval, rate=rate))
        )
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=tmp,
        )
        logged: dict[int, float] = {}

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                fields = line.split()
                if line.endswith("\n") and len(fields) == 2:  # not a line the kill cut short
                    logged[int(fields[0])] = float(fields[1])

        reader = threading.Thread(target=read)
        reader.start()
        try:
            deadline = time.monotonic() + 60
            while not stored_steps(store):
                if time.monotonic() > deadline:
                    raise RuntimeError("the store never held the loss")
                time.sleep(0.05)
            time.sleep(kill_after)
            children = psutil.Process(proc.pid).children()
        finally:
            proc.kill()
            proc.wait()
            reader.join()
        psutil.wait_procs(children, timeout=30)  # the sampling child leaves a postmortem in the store
        steps = stored_steps(store)
    last, kept = max(logged), max(steps)
    return last - kept, logged[last] - logged[kept]


def log_signal_cost(calls: int, rounds: int) -> float:
    """Median CPU per ``log_signal`` call (us) in rounds of ``calls``, with a store on
    and its monitor (15 s interval) writing each round's points before the next."""
    with tempfile.TemporaryDirectory(prefix="bench-kill-") as tmp:
        store = os.path.join(tmp, "runs.sqlite")
        monitor = sampler.ResourceMonitor(categories=["cpu"], store=store, interval_seconds=15)
        log_signal = sampler.signals.log_signal
        costs = []
        with monitor:
            for _ in range(rounds):
                began = time.thread_time()
                for step in range(calls):
                    log_signal("train/loss", 0.5, step)
                costs.append((time.thread_time() - began) * 1e6 / calls)
                time.sleep(1.5)  # the points reach the store meanwhile (with a flush timer, at least)
    return statistics.median(costs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5, help="backends killed per interval")
    parser.add_argument("--rate", type=float, default=1000.0, help="losses logged per second")
    parser.add_argument("--intervals", type=float, nargs="+", default=[15.0, 1.0], help="seconds")
    parser.add_argument("--quick", action="store_true", help="one trial per interval, killed within 2 s")
    args = parser.parse_args()
    rng = random.Random(1)
    trials = 1 if args.quick else args.trials
    print("| interval | trials | points lost: median | max | seconds lost: median | max |")
    print("|---|---|---|---|---|---|")
    for interval in args.intervals:
        spread = 2.0 if args.quick else interval + 1.0
        results = [trial(interval, args.rate, rng.uniform(0, spread)) for _ in range(trials)]
        points, seconds = [p for p, _ in results], [s for _, s in results]
        print(
            f"| {interval:g} s | {trials} | {statistics.median(points):.0f} | {max(points)} | "
            f"{statistics.median(seconds):.2f} | {max(seconds):.2f} |"
        )
    calls, rounds = (20_000, 2) if args.quick else (20_000, 9)
    cost = log_signal_cost(calls, rounds)
    print(f"\nlog_signal with the store on: {cost:.3f} us per call (median of {rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
