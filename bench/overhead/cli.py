"""``python -m bench`` and ``python -m bench.overhead``: run the rounds, print the report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from bench.overhead.measure import run_matrix, run_scaling
from bench.overhead.plan import FULL, INTERVALS, QUICK
from bench.overhead.report import machine_line, markdown, plot
from bench.overhead.summary import summarize
from bench.overhead.targets import targets

DESCRIPTION = "What monitoring costs a training job: off, in-thread and isolated, side by side."


def _intervals(text: str) -> tuple[float, ...]:
    chosen = tuple(float(part) for part in text.split(","))
    if not set(chosen) <= set(INTERVALS):
        raise argparse.ArgumentTypeError(f"intervals are among {', '.join(f'{i:g}' for i in INTERVALS)}")
    return tuple(i for i in INTERVALS if i in chosen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=DESCRIPTION)
    parser.add_argument("--quick", action="store_true", help="CI smoke size: under 2 minutes")
    parser.add_argument("--rounds", type=int, help="override the profile's rounds")
    parser.add_argument("--seconds", type=float, help="override the length of each measured run")
    parser.add_argument("--devices", help="comma-separated fake GPU counts for scaling (default 1,8,64)")
    parser.add_argument(
        "--floor-only",
        action="store_true",
        help="only the idle backend against the floor (floor, isolated, isolated with the store), no scaling",
    )
    parser.add_argument(
        "--intervals", type=_intervals, help="comma-separated sampling intervals in s (default 1,0.01)"
    )
    parser.add_argument("--json", help="write the numbers here")
    parser.add_argument("--plot", help="write a PNG chart here (needs matplotlib)")
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    if args.rounds or args.seconds or args.devices:
        profile = replace(
            profile,
            rounds=args.rounds or profile.rounds,
            seconds=args.seconds or profile.seconds,
            scaling_seconds=args.seconds or profile.scaling_seconds,
            devices=tuple(int(d) for d in args.devices.split(",")) if args.devices else profile.devices,
        )
    profile = replace(profile, floor_only=args.floor_only, intervals=args.intervals or profile.intervals)
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    began = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - began:6.1f} s] {message}", file=sys.stderr, flush=True)

    summary = summarize(run_matrix(profile, log), run_scaling(profile, log))
    summary.targets = targets(summary)
    report = {
        "machine": machine_line(),
        "command": command.strip(),
        "profile": asdict(profile),
        "wall_seconds": round(time.monotonic() - began, 1),
        **summary.to_json(),
    }
    print(markdown(summary, report["machine"], report["command"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if args.plot and not plot(summary, args.plot):
        print("matplotlib is not installed (pip install '.[plot]'); no chart written", file=sys.stderr)
    for target in summary.targets:
        if not target["met"] and target["measured"] is not None:
            print(f"target missed: {target['target']}", file=sys.stderr)
    return 0
