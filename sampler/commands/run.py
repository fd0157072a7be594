"""Command line: ``python -m sampler run`` samples in the foreground and prints
each sample as a compact table until Ctrl-C or ``--duration``.

Settings come from the configuration (SPEC 4); flags beat it, and are read by
the same parsers (``sampler.settings.FIELDS``). A foreground run has no model, so
it steps by whole seconds unless ``--step-source`` says otherwise. When the
reader of stdout goes away (``python -m sampler run | head``), the run ends
quietly with exit status 141, as a Unix tool killed by SIGPIPE would. With
``--pid``, the run ends (status 0) when that process does, saying so.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import threading
import time
from typing import Any, TextIO

import psutil

from sampler import settings
from sampler.api.monitor import ResourceMonitor
from sampler.commands.common import DEFAULT_STORE, EXIT_BROKEN_PIPE, field_argument, seconds_argument, silence
from sampler.ipc.channel import open_pidfd
from sampler.pipeline.emit import Sample
from sampler.settings.placement import whole_number
from sampler.settings.table import settled
from sampler.util.quoting import bounded_repr
from sampler.views.rows import Rows

MAX_DURATION_SECONDS = 30 * 86400.0
"""``--duration``'s ceiling, 30 days: longer is a service, not a foreground run
(and past ~292 years ``threading.Event.wait`` raises OverflowError)."""
FOREGROUND_STEP_SOURCE = "seconds"
EXIT_POLL_SECONDS = 0.25
"""While ``run --pid`` waits for its process to end: how often it looks whether its output
closed, and, without pidfds, whether the process still runs."""


def _pid(text: str) -> int:
    pid = whole_number(text)
    if pid is None:
        raise argparse.ArgumentTypeError(f"{bounded_repr(text)}: not a process id")
    if not 0 < pid < 2**31 or not psutil.pid_exists(pid):  # a pid is a C int
        raise argparse.ArgumentTypeError(f"{pid}: no such process")
    return pid


class _Watched:
    """The process ``run --pid`` watches, known by a pidfd where the kernel has them, else by
    its pid and start time: a pid reused by another process is never taken for it."""

    def __init__(self, pid: int) -> None:
        self._pidfd: int | None = None
        self._process: psutil.Process | None = None
        """Without a pidfd, the process (psutil remembers its start time); None once it is gone."""
        try:
            self._pidfd = open_pidfd(pid)
            if self._pidfd is None:
                self._process = psutil.Process(pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass

    def ended(self, timeout: float) -> bool:
        """Whether the process has ended (a zombie has), waiting for that up to ``timeout`` s."""
        if self._pidfd is not None:
            return bool(select.select([self._pidfd], [], [], timeout)[0])
        time.sleep(timeout)
        if self._process is None:
            return True
        try:
            return not self._process.is_running() or self._process.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def _wait(closed: threading.Event, duration: float | None, watched: _Watched | None) -> bool:
    """Wait until ``closed`` is set (the output went away), ``duration`` s passed (None: no
    limit) or the ``watched`` process ended; True for the last."""
    if watched is None:
        closed.wait(duration)
        return False
    deadline = None if duration is None else time.monotonic() + duration
    while not closed.is_set():
        left = EXIT_POLL_SECONDS if deadline is None else min(EXIT_POLL_SECONDS, deadline - time.monotonic())
        if left <= 0:
            return False
        if watched.ended(left):
            return True
    return False


class _Printer:
    """The ``on_sample`` hook (it runs in the monitor thread): prints each
    sample; once ``out`` is a broken pipe it sets ``closed`` and prints no more."""

    def __init__(self, out: TextIO, closed: threading.Event) -> None:
        self.out = out
        self.closed = closed
        self.samples = 0
        self._rows = Rows()
        self._lock = threading.Lock()

    def __call__(self, sample: Sample) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            try:
                print("\n".join(self._rows.lines(sample.step, sample.values)), file=self.out, flush=True)
            except BrokenPipeError:
                self.closed.set()
                return
            self.samples += 1


def _effective(args: argparse.Namespace, resolution: settings.Resolution) -> dict[str, tuple[Any, str]]:
    """Each setting this run uses and where it came from: a flag beats the
    configuration, which beats this command's own defaults."""
    values, sources = resolution.values, resolution.sources
    chosen: dict[str, tuple[Any, str]] = {}
    given = vars(args)  # a flag not given is absent (SUPPRESS): one given as off/false sets None
    for field in settings.MONITOR_FIELDS:
        if field.key in given:
            chosen[field.key] = (given[field.key], field.flag or "")
        else:
            chosen[field.key] = (values[field.key], sources[field.key])
    if "step_source" not in given and sources["step_source"] == settings.DEFAULT_SOURCE:
        chosen["step_source"] = (FOREGROUND_STEP_SOURCE, "run's default (no model to age here)")
    if args.no_store:
        chosen["store"] = (None, "--no-store")
    elif chosen["store"][0] is None and "store" not in given:
        chosen["store"] = (os.path.abspath(DEFAULT_STORE), "run's default")
    pid = args.pid if args.pid is not None else os.getpid()
    chosen["pid"] = (pid, "--pid" if args.pid is not None else "this process")
    return chosen


def _describe(chosen: dict[str, tuple[Any, str]]) -> str:
    """The effective settings, one line each with where it came from."""

    def shown(key: str, value: Any) -> str:
        if key == "categories":
            return str(settings.CATEGORIES.show(value))
        return "none" if value is None else str(value)

    rows = [(key, shown(key, value), source) for key, (value, source) in chosen.items()]
    key_width = max(len(key) for key, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    lines = [f"  {key:<{key_width}}  {value:<{value_width}}  {source}" for key, value, source in rows]
    return "settings (and where each comes from):\n" + "\n".join(lines)


def add_parser(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="sample in the foreground, print every sample and record it in the run store",
        description=__doc__.split("\n\n")[0],
    )
    for field in settings.FIELDS:
        if field.flag is not None and field is not settings.STORE:
            default = f" (default here: {FOREGROUND_STEP_SOURCE})" if field is settings.STEP_SOURCE else ""
            run.add_argument(
                field.flag,
                dest=field.key,
                type=field_argument(field, field.flag),
                default=argparse.SUPPRESS,
                metavar=field.key.upper(),
                help=f"{field.help}{default}",
            )
    store = run.add_mutually_exclusive_group()
    store.add_argument(
        "--store",
        dest="store",
        type=field_argument(settings.STORE, "--store"),
        default=argparse.SUPPRESS,
        metavar="PATH",
        help=f"the run store to record into (default here: ./{DEFAULT_STORE})",
    )
    store.add_argument("--no-store", action="store_true", help="record nothing, only print")
    run.add_argument(
        "--pid",
        type=_pid,
        help="monitor this process (a trainer started elsewhere), not this one, until it ends",
    )
    run.add_argument(
        "--duration",
        type=seconds_argument(MAX_DURATION_SECONDS, "(30 days); omit it to run until Ctrl-C"),
        metavar="SECONDS",
        help=f"stop after this many seconds, at most {MAX_DURATION_SECONDS:.0f} (default: until Ctrl-C)",
    )
    run.add_argument("--nvml-module", default="pynvml", help="NVML binding to import (default pynvml)")
    run.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    """``python -m sampler run``; returns the exit status (0, or 141 when ``out`` closed)."""
    watched = _Watched(args.pid) if args.pid is not None else None
    try:
        return _run(args, watched)
    finally:
        if watched is not None:
            watched.close()


def _run(args: argparse.Namespace, watched: _Watched | None) -> int:
    out: TextIO = args.out
    resolution = settings.resolve_config()
    chosen = _effective(args, resolution)
    if not resolution.values["enabled"]:
        print("note: monitoring is disabled by configuration; running anyway as asked", file=sys.stderr)
    print(_describe(chosen), file=sys.stderr, flush=True)
    closed = threading.Event()
    printer = _Printer(out, closed)
    values = {key: value for key, (value, _) in chosen.items() if key != "pid"}
    monitor = ResourceMonitor(
        _resolved=(
            settled({**values, "nvml_module": args.nvml_module}),
            {key: source for key, (_, source) in chosen.items()},
        ),
        pid=args.pid,
        sink=lambda name, value, step: None,
        on_sample=printer,
    )
    every = f"every {monitor.interval_seconds:g} s, step by {monitor.step_source}"
    if monitor.prometheus_port is not None:
        every += f", metrics at http://{monitor.prometheus_address}:{monitor.prometheus_port}/metrics"
    try:
        print(f"sampling {every}; Ctrl-C stops", file=out, flush=True)
        ended = False
        try:
            with monitor:
                ended = _wait(closed, args.duration, watched)  # None: until Ctrl-C or a closed pipe
        except KeyboardInterrupt:
            pass
        if not closed.is_set():
            if ended:
                print(f"process {args.pid} ended", file=out, flush=True)
            stats = monitor.stats()
            summary = (
                f"{printer.samples} samples, {stats['records_lost']} lost, {stats['sink_errors']} sink errors"
            )
            print(summary, file=out, flush=True)
            return 0
    except BrokenPipeError:
        pass
    silence(out)
    return EXIT_BROKEN_PIPE
