"""Command line: ``python -m sampler run`` samples in the foreground and prints
each sample as a compact table until Ctrl-C or ``--duration``.

Settings come from the configuration (SPEC 4); flags beat it, and are read by
the same parsers (``sampler.config.FIELDS``). A foreground run has no model, so
it steps by whole seconds unless ``--step-source`` says otherwise. When the
reader of stdout goes away (``python -m sampler run | head``), the run ends
quietly with exit status 141, as a Unix tool killed by SIGPIPE would.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from sampler import config
from sampler.backend.emit import Sample
from sampler.backend.monitor import ResourceMonitor
from sampler.quoting import bounded_repr

MAX_DURATION_SECONDS = 30 * 86400.0
"""``--duration``'s ceiling, 30 days: longer is a service, not a foreground run
(and past ~292 years ``threading.Event.wait`` raises OverflowError)."""
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a tool whose output pipe closed."""
FOREGROUND_STEP_SOURCE = "seconds"


def _duration(text: str) -> float:
    try:
        seconds = config.parse_seconds(text)
    except config.Invalid as exc:
        raise argparse.ArgumentTypeError(f"{bounded_repr(text)}: {exc}") from None
    if seconds > MAX_DURATION_SECONDS:
        limit = f"at most {MAX_DURATION_SECONDS:.0f} seconds (30 days)"
        raise argparse.ArgumentTypeError(f"{bounded_repr(text)}: {limit}; omit it to run until Ctrl-C")
    return seconds


def _field_type(field: config.Field, flag: str) -> Callable[[str], Any]:
    """The argparse ``type`` of a field's ``flag``: the field's text parser; a
    value it cannot use, even in part, is an argparse error."""

    def parse(text: str) -> Any:
        try:
            return field.from_text(text, functools.partial(config.warn, flag, text))
        except config.Invalid as exc:
            raise argparse.ArgumentTypeError(f"{bounded_repr(text)}: {exc}") from None

    return parse


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
    """The ``on_sample`` hook (it runs in the monitor thread): prints each
    sample; once ``out`` is a broken pipe it sets ``closed`` and prints no more."""

    def __init__(self, out: TextIO, closed: threading.Event) -> None:
        self.out = out
        self.closed = closed
        self.samples = 0
        self._lock = threading.Lock()

    def __call__(self, sample: Sample) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            try:
                print(format_sample(sample.step, sample.values), file=self.out, flush=True)
            except BrokenPipeError:
                self.closed.set()
                return
            self.samples += 1


def _silence(out: TextIO) -> None:
    """Point ``out``'s descriptor at /dev/null, so that the interpreter's final
    flush of what is still buffered for the broken pipe cannot fail
    ("Exception ignored ... BrokenPipeError")."""
    try:
        fd = out.fileno()
    except (OSError, ValueError):  # not backed by a descriptor (io.UnsupportedOperation is both)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sampler", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="sample in the foreground and print every sample")
    for field in config.FIELDS:
        if field.flag is not None:
            default = f" (default here: {FOREGROUND_STEP_SOURCE})" if field is config.STEP_SOURCE else ""
            run.add_argument(
                field.flag,
                dest=field.key,
                type=_field_type(field, field.flag),
                metavar=field.key.upper(),
                help=f"{field.help}{default}",
            )
    run.add_argument(
        "--duration",
        type=_duration,
        metavar="SECONDS",
        help=f"stop after this many seconds, at most {MAX_DURATION_SECONDS:.0f} (default: until Ctrl-C)",
    )
    run.add_argument("--nvml-module", default="pynvml", help="NVML binding to import (default pynvml)")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``python -m sampler``; returns the exit status (0, or 141 when ``out`` closed)."""
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    cfg = config.load_resource_monitoring_config()
    if not cfg["enabled"]:
        print("note: monitoring is disabled by configuration; running anyway as asked", file=sys.stderr)
    closed = threading.Event()
    printer = _Printer(out, closed)
    monitor = ResourceMonitor(
        interval_seconds=args.interval_seconds or cfg["interval_seconds"],
        categories=args.categories if args.categories is not None else cfg["categories"],
        disk_path=args.disk_path or cfg["disk_path"],
        step_source=args.step_source or FOREGROUND_STEP_SOURCE,
        sink=lambda name, value, step: None,
        nvml_module=args.nvml_module,
        on_sample=printer,
    )
    enabled = ", ".join(monitor.categories) or "none"
    every = f"every {monitor.interval_seconds:g} s, step by {monitor.step_source}"
    try:
        print(f"sampling {enabled} {every}; Ctrl-C stops", file=out, flush=True)
        try:
            with monitor:
                closed.wait(args.duration)  # None: until Ctrl-C or a closed pipe
        except KeyboardInterrupt:
            pass
        if not closed.is_set():
            stats = monitor.stats()
            summary = (
                f"{printer.samples} samples, {stats['records_lost']} lost, {stats['sink_errors']} sink errors"
            )
            print(summary, file=out, flush=True)
            return 0
    except BrokenPipeError:
        pass
    _silence(out)
    return EXIT_BROKEN_PIPE
