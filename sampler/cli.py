"""Command line: ``python -m sampler run`` samples in the foreground and prints
each sample as a compact table until Ctrl-C or ``--duration``.

Settings come from the configuration (SPEC 4); flags beat it. A foreground run
has no model, so it steps by whole seconds unless ``--step-source`` says otherwise.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from typing import TextIO

from sampler import config
from sampler.emit import Sample
from sampler.monitor import ResourceMonitor


def _categories(raw: str) -> list[str]:
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    unknown = sorted(set(names) - set(config.DEFAULT_CATEGORIES))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown categories {', '.join(unknown)}; known: {', '.join(config.DEFAULT_CATEGORIES)}"
        )
    return names


def _interval(raw: str) -> float:
    try:
        return config.parse_interval(raw, "--interval")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{raw!r}: {exc}") from None


def _format_value(value: float) -> str:
    return f"{value:.0f}" if value.is_integer() else f"{value:.2f}"


def format_sample(step: int, sample: dict[str, float]) -> str:
    """One block per sample: a line per category (per device for gpu)."""
    rows: dict[str, list[str]] = {}
    for name, value in sample.items():
        parts = name.split("/")  # resource/<category>[/<device>]/<signal>
        group = "/".join(parts[1:-1])
        rows.setdefault(group, []).append(f"{parts[-1]} {_format_value(value)}")
    width = max((len(group) for group in rows), default=0)
    lines = [f"step {step}"] + [f"  {group:<{width}}  {'  '.join(cells)}" for group, cells in rows.items()]
    return "\n".join(lines)


class _Printer:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.samples = 0
        self._lock = threading.Lock()

    def __call__(self, sample: Sample) -> None:
        with self._lock:
            print(format_sample(sample.step, sample.values), file=self.out, flush=True)
            self.samples += 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sampler", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="sample in the foreground and print every sample")
    run.add_argument("--interval", type=_interval, help="seconds between samples (floor 1)")
    run.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    run.add_argument("--categories", type=_categories, help="comma-separated, e.g. cpu,memory,gpu")
    run.add_argument("--disk-path", help="filesystem the disk usage signals report")
    run.add_argument("--step-source", choices=config.STEP_SOURCES, default="seconds")
    run.add_argument("--nvml-module", default="pynvml", help="NVML binding to import (default pynvml)")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    cfg = config.load_resource_monitoring_config()
    if not cfg["enabled"]:
        print("note: monitoring is disabled by configuration; running anyway as asked", file=sys.stderr)
    categories = args.categories if args.categories is not None else cfg["categories"]
    printer = _Printer(out)
    monitor = ResourceMonitor(
        interval_seconds=args.interval or cfg["interval_seconds"],
        categories=categories,
        disk_path=args.disk_path or cfg["disk_path"],
        step_source=args.step_source,
        sink=lambda name, value, step: None,
        nvml_module=args.nvml_module,
        on_sample=printer,
    )
    enabled = ", ".join(monitor.categories) or "none"
    every = f"every {monitor.interval_seconds:g} s, step by {monitor.step_source}"
    print(f"sampling {enabled} {every}; Ctrl-C stops", file=out, flush=True)
    try:
        with monitor:
            threading.Event().wait(args.duration)  # None: until Ctrl-C
    except KeyboardInterrupt:
        pass
    stats = monitor.stats()
    print(
        f"{printer.samples} samples, {stats['records_lost']} lost, {stats['sink_errors']} sink errors",
        file=out,
        flush=True,
    )
    return 0
