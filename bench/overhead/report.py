"""The Markdown report and the optional PNG chart."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import psutil

from bench.overhead.plan import FLOOR, FLOOR_SIGNALS, INTERVALS, STRESS, TRAINING, CellKey, interval_label
from bench.overhead.summary import FloorCell, Summary
from bench.overhead.targets import accounted_loss_cost


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fmt_spread(entry: dict[str, Any], digits: int = 2) -> str:
    if entry.get("median") is None:
        return "-"
    low, high = entry["spread"]
    return f"{entry['median']:.{digits}f} ({low:.{digits}f}..{high:.{digits}f})"


def _fmt_percent(entry: dict[str, Any]) -> str:
    if entry.get("median_percent") is None:
        return "-"
    low, high = entry["spread_percent"]
    return f"{entry['median_percent']:+.2f} ({low:+.2f}..{high:+.2f})"


def markdown(summary: Summary, machine: str, command: str) -> str:
    lines = [f"# Monitoring overhead\n\n{machine}  \n`{command}`\n"]
    lines += _throughput_markdown(summary)
    lines += _per_sample_markdown(summary)
    lines += floor_markdown(summary.floor)
    lines += loss_markdown(summary.loss)
    if summary.scaling:
        lines.append(f"\n## Scaling at the {STRESS:g} s stress interval (idle backend)\n")
        lines.append("| categories | fake GPUs | mode | backend CPU ms/sample | child CPU ms/sample |")
        lines.append("|---|---|---|---|---|")
        for row in summary.scaling:
            lines.append(
                f"| {row['categories']} | {row['devices'] or '-'} | {row['mode']} "
                f"| {_fmt(row['backend_cpu_ms_per_sample'], 3)} | {_fmt(row['child_cpu_ms_per_sample'], 3)} |"
            )
    lines.append("\n## Targets\n")
    lines.append("| target | measured | met |")
    lines.append("|---|---|---|")
    for t in summary.targets:
        met = "yes" if t["met"] else "not measured" if t["measured"] is None else "**MISSED**"
        lines.append(f"| {t['target']} | {t['measured'] or '-'} | {met} |")
    return "\n".join(lines) + "\n"


def _throughput_markdown(summary: Summary) -> list[str]:
    training = [(key, cell) for key, cell in summary.cells.items() if key.workload != "idle"]
    if not training:
        return []
    lines = ["## Training throughput: median (min..max over rounds)\n"]
    lines.append("| workload | interval | mode | steps/s | slowdown vs off % | step p50 | p99 | max (ms) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for key, cell in training:
        lines.append(
            f"| {key.workload} | {interval_label(key.interval)} | {key.mode} "
            f"| {_fmt_spread(cell['steps_per_second'], 0)} | {_fmt_percent(summary.slowdowns.get(key, {}))} "
            f"| {_fmt(cell['step_ms_p50']['median'], 3)} | {_fmt(cell['step_ms_p99']['median'], 3)} "
            f"| {_fmt(cell['step_ms_max']['median'], 3)} |"
        )
    return lines


def _per_sample_markdown(summary: Summary) -> list[str]:
    lines = ["\n## Cost per sample and latency\n"]
    lines.append(
        "| interval | mode | backend CPU ms/sample (idle) | monitor thread CPU ms/sample (GIL load) "
        "| child CPU ms/sample | child RSS MB | sample-to-sink p50/p99 ms (GIL load) "
        "| start() ms | first sample ms |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for interval in INTERVALS:
        for mode in ("thread", "process"):
            idle = summary.cells.get(CellKey("idle", interval, mode), {})
            gil = summary.cells.get(CellKey("gil", interval, mode), {})
            if not idle:
                continue
            latency = gil.get("sample_to_sink_ms", {})
            lines.append(
                f"| {interval:g} s | {mode} | {_fmt_spread(idle['backend_cpu_ms_per_sample'], 3)} "
                f"| {_fmt(gil.get('monitor_thread_cpu_ms_per_sample', {}).get('median'), 3)} "
                f"| {_fmt(idle['child_cpu_ms_per_sample']['median'], 3)} "
                f"| {_fmt(idle['child_rss_mb']['median'], 1)} "
                f"| {_fmt(latency.get('p50'))} / {_fmt(latency.get('p99'))} "
                f"| {_fmt(idle['start_ms']['median'])} | {_fmt(idle['first_sample_ms']['median'], 0)} |"
            )
    return lines


def _ratio(entry: dict[str, Any]) -> str:
    if entry.get("median") is None:
        return "-"
    low, high = entry["spread"]
    return f"{entry['median']:.2f}x ({low:.2f}..{high:.2f})"


def floor_markdown(floor: dict[float, FloorCell]) -> list[str]:
    if not floor:
        return []
    lines = ["\n## The floor: backend CPU per sample against a bare woken thread (idle backend)\n"]
    lines.append(
        f"The floor is a daemon thread woken through a pipe by another process once per sample, making "
        f"{FLOOR_SIGNALS} calls to the same no-op sink and nothing else: what any in-process monitor thread "
        "costs at least. Multiples are paired round by round: median (min..max).\n"
    )
    lines.append(
        "| interval | floor ms/sample | isolated ms/sample | x floor | isolated + store ms/sample | x floor "
        "| thread alone: isolated / + store x floor thread | sink calls/sample: monitor / floor |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for interval, cell in floor.items():
        lines.append(
            f"| {interval_label(interval)} | {_fmt_spread(cell.cost_ms['floor'], 3)} "
            f"| {_fmt_spread(cell.cost_ms['process'], 3)} | {_ratio(cell.x_floor['process'])} "
            f"| {_fmt_spread(cell.cost_ms['store'], 3)} | {_ratio(cell.x_floor['store'])} "
            f"| {_fmt(cell.thread_x_floor['process']['median'])}x "
            f"/ {_fmt(cell.thread_x_floor['store']['median'])}x "
            f"| {_fmt(cell.signals_per_sample, 1)} / {FLOOR_SIGNALS} |"
        )
    return lines


def loss_markdown(loss: dict[str, Any]) -> list[str]:
    if not loss:
        return []
    lines = [f"\n## Logging the loss every step (GIL-bound loop, {FLOOR:g} s interval)\n"]
    lines.append(
        "The loop calls `sampler.signals.log_signal('train/loss', loss, step)` after every step. `off`: no "
        "log_signal, no monitor; `process`: the isolated monitor, no log_signal; `log`: both, no store; "
        "`log+store`: both, with the run store on (every loss queued, written by the monitor thread).\n"
    )
    lines.append("| mode | steps/s | one log_signal call (us) |")
    lines.append("|---|---|---|")
    for mode, steps in loss["steps_per_second"].items():
        if mode == "thread":
            continue
        lines.append(f"| {mode} | {_fmt(steps, 0)} | {_fmt(loss['log_call_us'].get(mode), 2)} |")
    lines.append("\n| comparison (paired round by round) | slowdown % median (min..max) |")
    lines.append("|---|---|")
    for what, entry in loss["slowdown"].items():
        lines.append(f"| {what} | {_fmt_percent(entry)} |")
    noise = loss.get("off_vs_off_spread_percent")
    accounted = accounted_loss_cost(loss)
    noise_text = "-" if noise is None else f"{noise[0]:+.2f}..{noise[1]:+.2f}"
    lines.append(
        f"\nOff against off, round to round: {noise_text}%. "
        f"Accounted cost, an upper bound (one log_signal call per step, plus the monitor thread's "
        f"{_fmt(loss['monitor_thread_cpu_ms_per_sample'], 3)} ms of CPU per sample, with the store): "
        f"{'-' if accounted is None else f'{accounted:+.3f}'}%. "
        f"Points the store wrote per run: {_fmt(loss['store_points'], 0)} (every loss of the run, the "
        "20,000 timing calls, the resource readings)."
    )
    return lines


def plot(summary: Summary, path: str) -> bool:
    """A PNG of slowdowns and per-sample CPU; False when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels: list[str] = []
    thread: list[float] = []
    process: list[float] = []
    for workload in TRAINING:
        for interval in INTERVALS:
            labels.append(f"{workload}\n{interval:g} s")
            for mode, bucket in (("thread", thread), ("process", process)):
                entry = summary.slowdowns.get(CellKey(workload, interval, mode), {})
                bucket.append(entry.get("median_percent") or 0.0)
    x = np.arange(len(labels))
    left.bar(x - 0.2, thread, 0.4, label="in-thread")
    left.bar(x + 0.2, process, 0.4, label="isolated")
    left.set_xticks(x, labels)
    left.set_ylabel("training slowdown vs off (%)")
    left.axhline(0, color="black", linewidth=0.5)
    left.legend()
    rows = [r for r in summary.scaling if r["devices"]]
    for mode in ("thread", "process"):
        pts = [(r["devices"], r["backend_cpu_ms_per_sample"] or 0.0) for r in rows if r["mode"] == mode]
        right.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"backend, {mode}")
    child = [(r["devices"], r["child_cpu_ms_per_sample"] or 0.0) for r in rows if r["mode"] == "process"]
    right.plot(
        [p[0] for p in child], [p[1] for p in child], marker="s", linestyle="--", label="child, process"
    )
    right.set_xscale("log")
    right.set_xlabel("fake GPUs")
    right.set_ylabel("CPU ms per sample")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def machine_line() -> str:
    return (
        f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 1024**3:.0f} GiB, "
        f"Python {sys.version.split()[0]}, {sys.platform}, NVML: fake (no NVIDIA GPU)"
    )
