"""What the analysis views cost on long runs: wall time and peak memory of ``explain`` on one
rank's 27 hours (with a slow stretch every 2 hours, and again with one every ``--every`` seconds:
hundreds of stretches), and of ``explain --launch`` and ``plot --launch`` on an 8-rank launch of
24 hours.

    python -m bench.analysis_memory [--hours 27] [--launch-hours 24] [--ranks 8] [--json FILE]

The stores are synthesized in the layout of schema version 6 with bulk SQL (a recursive query
per run): one record a second, each with a reading of every signal of the default categories
but gpu (the catalogue's, with their ``_peak`` and ``_mean``), of realistic size and resolution
(percentages to 0.001, MiB to the KiB, counters that only grow), and 10 steps a second but for a
200 s stretch every 2 hours (or every ``--every`` s, the last 60 s of each) at a fifth of that,
so that ``explain`` has stretches to explain.
Each command then runs in a fresh interpreter (``python -m sampler ...``); its wall time, its CPU
time (what the wall time would be on a machine to itself) and its peak resident memory
(``wait4``'s ``ru_maxrss``) are printed beside the goals: explain within 2 s and 200 MB (within 5 s with
hundreds of stretches), each launch view within 400 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sampler import catalogue  # noqa: E402  (after the path set-up above)
from sampler.store import schema  # noqa: E402
from sampler.store.writer import resolution  # noqa: E402

MB = 1e6
GOALS = {
    "explain": (2.0, 200.0),
    "explain, many stretches": (5.0, 200.0),
    "explain --launch": (None, 400.0),
    "plot --launch": (None, 400.0),
}
"""Command -> (seconds, MB) at most; None: no goal."""
SQL_BY_UNIT = {
    "%": "abs(random()) % 100001",
    "MiB": "(abs(random()) % 65536) * 1024 + x",
    "GiB": "(abs(random()) % 1024) * 1048576",
    "bytes": "abs(random()) % 1000000000",
    "MiB/s": "abs(random()) % 1048576",
    "bytes/s": "abs(random()) % 100000000",
    "s": "x * 700000 + abs(random()) % 1000",
    "s/s": "abs(random()) % 1000000",
    "cores": "abs(random()) % 16001",
    "threads": "40 + abs(random()) % 4",
    "processes": "5 + abs(random()) % 3",
    "steps/s": "abs(random()) % 20000000",
}
"""Unit -> SQL of a stored reading (whole steps of its resolution) at record ``x``."""


def signals() -> list[tuple[str, str]]:
    """(name, unit) of every signal of the default categories but gpu, with its variants."""
    found = []
    for signal in catalogue.SIGNALS.values():
        if signal.category in catalogue.DEFAULT_CATEGORIES and signal.category != "gpu":
            for suffix in ("", *(f"_{variant}" for variant in signal.variants)):
                found.append((signal.name + suffix, signal.unit))
    return found


def step_sql(every: int = 7200, slow: int = 200) -> str:
    """SQL of the step at record ``x``: 10 a second, 2 a second in the last ``slow`` s of each
    ``every`` s."""
    return f"10 * x - 8 * ((x / {every}) * {slow} + max(0, x % {every} - {every - slow}))"


def synthesize(
    path: Path, hours: float, ranks: int, launch_id: str | None, every: int = 7200, slow: int = 200
) -> None:
    """A store of ``ranks`` runs (one launch when ``launch_id``), each ``hours`` of records at 1 s,
    slowed for ``slow`` s of each ``every`` s."""
    db = schema.connect(str(path))
    named = signals()
    db.execute("BEGIN IMMEDIATE")
    for name, _ in named:
        schema.add_column(db, name, resolution(name))
    schema.make_views(db)
    db.execute("COMMIT")
    started = time.time() - hours * 3600 - 60
    count = round(hours * 3600)
    columns = "".join(f", {schema.quoted(name)}" for name, _ in named)
    values = "".join(f", {SQL_BY_UNIT.get(unit, 'abs(random()) % 2')}" for _, unit in named)
    for rank in range(ranks):
        db.execute("BEGIN IMMEDIATE")
        ended = started + count
        run_id = db.execute(
            "INSERT INTO runs (started_at, updated_at, ended_at, elapsed, host, pid, command, config,"
            " version, rank, local_rank, world_size, local_world_size, launch_id)"
            " VALUES (?, ?, ?, ?, 'node', ?, ?, ?, 'bench', ?, ?, ?, ?, ?)",
            (
                *(
                    started,
                    ended,
                    ended,
                    float(count),
                    1000 + rank,
                    '["train.py"]',
                    '{"interval_seconds": 1.0}',
                ),
                *(rank, rank, ranks, ranks, launch_id),
            ),
        ).lastrowid
        db.execute(
            f"WITH RECURSIVE n(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM n WHERE x < ?)"
            f" INSERT INTO records (run_id, seq, step, wall_ms{columns})"
            f" SELECT ?, x, {step_sql(every, slow)}, ? + x * 1000 + abs(random()) % 10{values} FROM n",
            (count - 1, run_id, round(started * 1000)),
        )
        db.execute("COMMIT")
    db.close()


def measure(argv: list[str]) -> dict[str, Any]:
    """Run ``python -m sampler *argv`` in a fresh interpreter: its wall time and CPU time (s; on a
    machine others load, CPU time is what the wall time would be alone), peak RSS (MB), status."""
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "sampler", *argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - began
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.stderr is not None
    error = process.stderr.read().decode(errors="replace")
    process.stderr.close()
    return {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_mb": usage.ru_maxrss * 1024 / MB,
        "status": process.returncode,
        "error": error[-2000:] if process.returncode else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=27.0, help="the single run's records (h at 1 s)")
    parser.add_argument("--launch-hours", type=float, default=24.0, help="each rank's records (h at 1 s)")
    parser.add_argument("--ranks", type=int, default=8, help="ranks of the launch")
    parser.add_argument(
        "--every", type=int, default=200, help="the many-stretch run's slow minute comes every this many s"
    )
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        single, launch = where / "single.sqlite", where / "launch.sqlite"
        many = where / "many.sqlite"
        began = time.perf_counter()
        synthesize(single, args.hours, 1, None)
        synthesize(many, args.hours, 1, None, args.every, 60)
        synthesize(launch, args.launch_hours, args.ranks, "bench-launch")
        made = time.perf_counter() - began
        sizes = single.stat().st_size / MB, launch.stat().st_size / MB
        print(
            f"synthesized in {made:.1f} s: one rank, {args.hours:g} h at 1 s ({sizes[0]:.0f} MB),"
            f" and again slowed every {args.every} s;"
            f" {args.ranks} ranks of {args.launch_hours:g} h ({sizes[1]:.0f} MB);"
            f" {len(signals())} signals a record\n"
        )
        commands = {
            "explain": ["explain", str(single)],
            "explain, many stretches": ["explain", str(many)],
            "explain --launch": ["explain", str(launch), "--launch", "bench-launch"],
            "plot --launch": [
                "plot",
                str(launch),
                "--launch",
                "bench-launch",
                "-o",
                str(where / "launch.png"),
            ],
        }
        for what, command in commands.items():
            results[what] = measure(command)
    print("| command | wall s | CPU s | goal s | peak MB | goal MB | status |")
    print("|---|---:|---:|---:|---:|---:|---|")
    failed = False
    for what, result in results.items():
        seconds, megabytes = GOALS[what]
        print(
            f"| {what} | {result['seconds']:.2f} | {result['cpu_seconds']:.2f}"
            f" | {'-' if seconds is None else seconds} |"
            f" {result['peak_mb']:.0f} | {megabytes:.0f} | {result['status']} |"
        )
        if result["status"]:
            failed = True
            print(result["error"], file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
