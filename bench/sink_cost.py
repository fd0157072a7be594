"""What a sink called once per signal costs the training, against the batched form.

    python -m bench.sink_cost [--rounds 3] [--seconds 20] [--interval 1] [--workload torch]

One training loop, its loss logged to MLflow every step through ``sampler.signals``: a small
CNN trained on random images with torch on one thread (``torch``, which releases the GIL in
its kernels), or pure Python holding the GIL, about ``--step-ms`` a step when alone
(``python``). Side by side in alternating rounds, each cell in a fresh interpreter with its
own MLflow file store and run store:

- ``off``: no monitor;
- ``monitor``: the monitor with its run store, the resource signals going nowhere else (a sink
  that does nothing): what the monitor costs here without MLflow;
- ``per-signal``: the monitor with the default sink, so every resource signal goes to the
  MLflow subscriber, one ``mlflow.log_metric`` each (the manual's recipe of old);
- ``batched``: the monitor with a sink that does nothing and
  ``on_sample=lambda s: mlflow.log_metrics(s.values, ...)``, one request per sample.

Prints steps/s per mode over ``--seconds`` after a warm-up (``--warmup`` seconds, and the
child's first sample) and its ratio to ``off`` (paired round by round), the samples read and logged
against those expected over the whole cell, the callbacks' seconds per sample (``stats()["callbacks"]``),
whether the slow-callback warning came, how long ``stop()`` took and whether it said the
thread was busy, and the run's status in the run store once the backend has exited.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sampler  # noqa: E402  (after the path set-up above)
from sampler.store.reader import StoreReader  # noqa: E402

MODES = ("off", "monitor", "per-signal", "batched")


def work(iterations: int) -> float:
    """A step of pure Python: the GIL is held throughout."""
    total = 0
    for i in range(iterations):
        total += i % 7
    return float(total % 10)


def torch_step() -> Callable[[], float]:
    """A training step of a small CNN on random 32x32 images, batch 32, one thread: its loss."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 10),
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> float:
        x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss.item())

    return step


def calibrate(step_ms: float) -> int:
    """Iterations of ``work`` that take about ``step_ms`` here, alone."""
    iterations = 100_000
    began = time.perf_counter()
    work(iterations)
    return max(1, int(iterations * step_ms / 1e3 / (time.perf_counter() - began)))


class Said(logging.Handler):
    """Keeps what the monitor says."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def warmed_up(monitor: sampler.ResourceMonitor | None, seconds: float, warmup: float) -> bool:
    """After ``warmup`` s, once the monitor's child has started and sent a sample (at most a minute)."""
    return seconds >= warmup and (monitor is None or seconds > 60 or monitor.stats()["records_read"] > 0)


def cell(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One cell, in this interpreter: train for ``args.seconds``; what it measured."""
    seconds, interval, directory = args.seconds, args.interval, Path(args.dir)
    step = torch_step() if args.workload == "torch" else functools.partial(work, args.iterations)
    os.environ["MLFLOW_TRACKING_URI"] = (directory / "mlruns").as_uri()
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    import mlflow

    said = Said()
    logging.getLogger("sampler").addHandler(said)
    run_id = mlflow.start_run().info.run_id
    sampler.signals.subscribe(
        lambda name, value, step: mlflow.log_metric(name, value, step=step, run_id=run_id)
    )
    store = str(directory / "runs.sqlite")
    monitor = None
    if mode == "monitor":
        monitor = sampler.ResourceMonitor(
            interval_seconds=interval, store=store, sink=lambda name, value, step: None
        )
    elif mode == "per-signal":
        monitor = sampler.ResourceMonitor(interval_seconds=interval, store=store)
    elif mode == "batched":
        monitor = sampler.ResourceMonitor(
            interval_seconds=interval,
            store=store,
            sink=lambda name, value, step: None,
            on_sample=lambda s: mlflow.log_metrics(s.values, step=s.step, run_id=run_id),
        )
    if monitor is not None:
        monitor.start()
    steps, began = 0, time.perf_counter()
    timed_from: tuple[int, float] | None = None  # (steps, time) when the timed window began
    while timed_from is None or time.perf_counter() - timed_from[1] < seconds:
        loss = step()
        steps += 1
        sampler.signals.log_signal("train/loss", loss, steps)
        if timed_from is None and warmed_up(monitor, time.perf_counter() - began, args.warmup):
            timed_from = steps, time.perf_counter()
    elapsed = time.perf_counter() - timed_from[1]
    out: dict[str, Any] = {"mode": mode, "steps_per_second": (steps - timed_from[0]) / elapsed}
    if monitor is not None:
        stopping = time.perf_counter()
        monitor.stop()
        out["stop_seconds"] = time.perf_counter() - stopping
        stats = monitor.stats()
        out["expected_samples"] = (time.perf_counter() - began) / interval
        for key in ("records_read", "records_logged", "records_lost", "records_unsent_at_stop"):
            out[key] = stats[key]
        out["callback_seconds_per_sample"] = {
            name: timed["seconds_total"] / timed["records"] for name, timed in stats["callbacks"].items()
        }
        out["slow_warning"] = any("callbacks in the monitor thread took" in m for m in said.messages)
        out["busy_at_stop"] = any("thread is busy" in m for m in said.messages)
    mlflow.end_run()
    return out


def run_cell(mode: str, args: argparse.Namespace, iterations: int) -> dict[str, Any]:
    """One cell in a fresh interpreter, with its run's status read once it has exited."""
    with tempfile.TemporaryDirectory(prefix="sink-cost-") as directory:
        command = [sys.executable, "-m", "bench.sink_cost", "--cell", mode, "--dir", directory]
        command += ["--seconds", str(args.seconds), "--interval", str(args.interval)]
        command += [
            "--workload",
            args.workload,
            "--iterations",
            str(iterations),
            "--warmup",
            str(args.warmup),
        ]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.seconds + 300)
        if done.returncode != 0:
            raise SystemExit(f"cell {mode} failed:\n{done.stderr}")
        out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        if mode != "off":
            with StoreReader(str(Path(directory) / "runs.sqlite")) as reader:
                out["status"] = [run.status for run in reader.runs()]
        return out


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}..{max(values):.2f})"


def report(rounds: list[dict[str, dict[str, Any]]], args: argparse.Namespace) -> None:
    workload = "a small CNN (torch)" if args.workload == "torch" else f"about {args.step_ms:g} ms of Python"
    print(
        f"{len(rounds)} rounds of {args.seconds:g} s a cell, {args.interval:g} s interval, a step of "
        f"{workload}; the loss logged to MLflow every step in every mode"
    )
    print("| mode | steps/s median (min..max) | x off, paired | samples read / logged / expected "
          "| callbacks s per sample | slow warning | stop() s | busy at stop | run status |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        cells = [r[mode] for r in rounds]
        rates = [c["steps_per_second"] for c in cells]
        ratios = [
            c["steps_per_second"] / r["off"]["steps_per_second"] for c, r in zip(cells, rounds, strict=True)
        ]
        if mode == "off":
            print(f"| off | {spread(rates)} | 1 | - | - | - | - | - | - |")
            continue
        samples = ", ".join(
            f"{c['records_read']}/{c['records_logged']}/{c['expected_samples']:.0f}" for c in cells
        )
        spent = ", ".join(f"{sum(c['callback_seconds_per_sample'].values()):.3f}" for c in cells)
        stops = ", ".join(f"{c['stop_seconds']:.2f}" for c in cells)
        statuses = ", ".join("/".join(c["status"]) for c in cells)
        warned = sum(c["slow_warning"] for c in cells)
        busy = sum(c["busy_at_stop"] for c in cells)
        print(
            f"| {mode} | {spread(rates)} | {spread(ratios)} | {samples} | {spent} | {warned}/{len(cells)} "
            f"| {stops} | {busy}/{len(cells)} | {statuses} |"
        )
    pairs = [r["batched"]["steps_per_second"] / r["per-signal"]["steps_per_second"] for r in rounds]
    print(f"\nbatched / per-signal steps/s, paired by round: {spread(pairs)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="training time per cell")
    parser.add_argument("--interval", type=float, default=1.0, help="the monitor's interval, s")
    parser.add_argument("--workload", choices=("torch", "python"), default="torch")
    parser.add_argument(
        "--warmup", type=float, default=3.0, help="untimed training first, s: imports, first calls"
    )
    parser.add_argument("--step-ms", type=float, default=40.0, help="a python step's length alone, ms")
    parser.add_argument("--json", help="also write every cell's numbers here")
    parser.add_argument("--cell", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell is not None:
        print(json.dumps(cell(args.cell, args)))
        return 0
    iterations = calibrate(args.step_ms)
    rounds = []
    for index in range(args.rounds):
        order = MODES[index % len(MODES) :] + MODES[: index % len(MODES)]  # each mode first in turn
        rounds.append({mode: run_cell(mode, args, iterations) for mode in order})
        print(
            f"round {index + 1}: " + ", ".join(f"{m} {rounds[-1][m]['steps_per_second']:.1f}" for m in MODES)
        )
    report(rounds, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
