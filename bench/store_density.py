"""How many bytes a run store takes per hour of one rank: schema version 3's layout (one row of
``points`` per reading) against today's (one row of ``records`` per record), side by side.

    python -m bench.store_density [--seconds 10] [--hours 1] [--gpus 0,1,8] [--json FILE]

One real workload: a real ``ResourceMonitor`` at the default categories, sampling every 0.1 s
for ``--seconds`` into a store of its own, its records read back. Those records, cycled in
order and re-stamped one second apart (what 1 s sampling writes; the readings are the real
ones), make ``--hours`` of one rank's records, each hour 3,600 records; they are written

- ``v3 points``: into a store of schema version 3, one row of ``points`` per reading (with the
  index ``points_by_signal``), a transaction per record, as writers did before version 6;
- ``v6 records``: by today's writer (``RunWriter``), a transaction per second of records.

The bytes are the store's pages in use (``page_count - freelist_count``, after a checkpoint)
less those of the same store holding the run's row alone; per hour per rank is that over the
hours written. With ``--gpus``, each record also holds synthetic readings of that many GPUs
(every GPU signal of the catalogue, values of realistic size and precision), since the
machine measured here may have none.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sampler  # noqa: E402  (after the path set-up above)
from sampler import catalogue  # noqa: E402
from sampler.store import schema  # noqa: E402
from sampler.store.reader import StoreReader  # noqa: E402
from sampler.store.writer import RunInfo, RunWriter  # noqa: E402

MIB = 1024**2
RECORDS_PER_HOUR = 3600
"""At 1 s sampling."""


FIRST_RECORD_SECONDS = 120.0
"""How long the real monitor may take to log its first record."""


def real_records(seconds: float, where: Path) -> list[dict[str, float]]:
    """A real monitor's records at the default categories, sampled every 0.1 s for ``seconds``
    from its first record (which a loaded machine may take many seconds to start)."""
    store = where / "sampled.sqlite"
    steps = itertools.count()  # a step a sample: a training loop faster than the sampling
    with sampler.ResourceMonitor(
        store=store, interval_seconds=0.1, _min_interval_seconds=0.05, age_source=lambda: next(steps)
    ) as monitor:
        deadline = time.monotonic() + FIRST_RECORD_SECONDS
        while monitor.stats()["records_logged"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(seconds)
    with StoreReader(str(store)) as reader:
        run = reader.run()
        records = reader.records(run.id)
    names = list(records.values)
    return [
        {
            name: float(records.values[name][i])
            for name in names
            if records.values[name][i] == records.values[name][i]
        }
        for i in range(len(records))
    ]


def gpu_readings(gpus: int, second: int, rng: random.Random) -> dict[str, float]:
    """Synthetic readings of every GPU signal of the catalogue for ``gpus`` GPUs: whole
    percentages, clocks and degrees as NVML gives them, watts and joules to the milliwatt,
    bytes whole, bandwidths and seconds as rates give them (any float)."""
    values: dict[str, float] = {}
    for device in range(gpus):
        for signal in catalogue.SIGNALS.values():
            if signal.category != "gpu":
                continue
            name = catalogue.PREFIX + signal.key.replace(catalogue.DEVICE, str(device))
            unit = signal.unit
            if unit == "%":
                value = float(rng.randint(0, 100))
            elif unit == "bytes":
                value = float(rng.randint(1, 80) * 2**30 + rng.randint(0, 2**20) * 4096)
            elif unit in ("W", "J/step"):
                value = rng.randint(50_000, 700_000) / 1000
            elif unit == "J":
                value = second * 400.0 + rng.randint(0, 999) / 1000
            elif unit == "MHz":
                value = float(rng.choice((1410, 1755, 1980, 2619)))
            elif unit == "°C":
                value = float(rng.randint(30, 85))
            elif unit in ("s", "s/s", "MiB/s"):
                value = rng.random() * (10_000 if unit == "MiB/s" else 1)
            else:  # 0/1, bitmask, XID
                value = float(rng.choice((0, 0, 0, 1, 4)))
            values[name] = value
            for variant in signal.variants:
                values[f"{name}_{variant}"] = value
    return values


Workload = list[tuple[float, dict[str, float]]]
"""(seconds from the start, readings) per record."""


def workload(records: list[dict[str, float]], hours: float, gpus: int) -> Workload:
    """``hours`` of records at 1 s: ``records`` cycled, each with ``gpus`` GPUs' readings, each
    taken up to 10 ms late (as a sampler wakes)."""
    rng = random.Random(gpus)
    count = round(hours * RECORDS_PER_HOUR)
    return [
        (i + rng.random() / 100, {**records[i % len(records)], **gpu_readings(gpus, i, rng)})
        for i in range(count)
    ]


def used_bytes(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        ((pages,),) = db.execute("PRAGMA page_count")
        ((free,),) = db.execute("PRAGMA freelist_count")
        ((size,),) = db.execute("PRAGMA page_size")
        return (pages - free) * size
    finally:
        db.close()


def write_v3(path: Path, records: Workload) -> tuple[int, int]:
    """``records`` as schema version 3 held them: (bytes of the run's row alone, bytes with its points)."""
    db = sqlite3.connect(path, isolation_level=None)
    for version in range(3):
        schema._MIGRATIONS[version](db)
    db.execute("PRAGMA user_version = 3")
    db.execute("PRAGMA journal_mode = WAL")
    started = time.time()
    db.execute(
        "INSERT INTO runs (started_at, updated_at, host, pid, command, config, version)"
        " VALUES (?, ?, 'h', 1, '[\"train.py\"]', '{}', 'bench')",
        (started, started),
    )
    empty = used_bytes(path)
    ids: dict[str, int] = {}
    for step, (at, values) in enumerate(records):
        db.execute("BEGIN IMMEDIATE")
        for name in values.keys() - ids.keys():
            ids[name] = int(db.execute("INSERT INTO signal_names (name) VALUES (?)", (name,)).lastrowid or 0)
        wall = started + at
        db.executemany(
            "INSERT INTO points VALUES (1, ?, ?, ?, ?)",
            [(ids[name], step, wall, value) for name, value in values.items()],
        )
        db.execute("COMMIT")
    db.close()
    return empty, used_bytes(path)


def write_v6(path: Path, records: Workload) -> tuple[int, int]:
    """``records`` written by today's writer: (bytes of the run's row alone, bytes with its records)."""
    started_ns = time.monotonic_ns()
    writer = RunWriter(str(path), RunInfo(1, ["train.py"], {}, time.time(), started_ns=started_ns))
    writer.flush()
    writer.record(None, 0, started_ns, {})
    empty = used_bytes(path)
    for step, (at, values) in enumerate(records):
        writer.record(values, step, started_ns + round(at * 1e9), None)
        writer.flush()  # a transaction a record, as at 1 s
    writer.close({})
    if writer.error is not None:
        raise RuntimeError(writer.error)
    return empty, used_bytes(path)


def measure(records: list[dict[str, float]], hours: float, gpus: int, where: Path) -> dict[str, Any]:
    rows = workload(records, hours, gpus)
    readings = sum(len(values) for _, values in rows)
    cell: dict[str, Any] = {"gpus": gpus, "records": len(rows), "readings_per_record": readings / len(rows)}
    for layout, write in (("v3 points", write_v3), ("v6 records", write_v6)):
        path = where / f"{layout.replace(' ', '_')}_{gpus}.sqlite"
        empty, full = write(path, rows)
        used = full - empty
        cell[layout] = {
            "bytes_per_reading": used / readings,
            "bytes_per_record": used / len(rows),
            "mib_per_hour": used / hours / MIB,
        }
    cell["ratio"] = cell["v6 records"]["mib_per_hour"] / cell["v3 points"]["mib_per_hour"]
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="the real monitor's run (s)")
    parser.add_argument("--hours", type=float, default=1.0, help="hours of 1 s records written per layout")
    parser.add_argument("--gpus", default="0,1,8", help="synthetic GPUs per record, comma-separated")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        records = real_records(args.seconds, where)
        if not records:
            print("error: the monitor recorded nothing", file=sys.stderr)
            return 1
        names = {name for values in records for name in values}
        print(
            f"a real monitor at the default categories on {os.uname().nodename}: {len(records)} records"
            f" in {args.seconds:g} s at 0.1 s, {len(names)} signals; written as {args.hours:g} h at 1 s"
            f" ({round(args.hours * RECORDS_PER_HOUR)} records, cycled)\n"
        )
        cells = [measure(records, args.hours, int(gpus), where) for gpus in args.gpus.split(",")]
    print("| GPUs | readings/record | layout | bytes/reading | bytes/record | MiB/hour/rank |")
    print("|---:|---:|---|---:|---:|---:|")
    for cell in cells:
        for layout in ("v3 points", "v6 records"):
            numbers = cell[layout]
            per_reading, per_record = numbers["bytes_per_reading"], numbers["bytes_per_record"]
            print(
                f"| {cell['gpus']} | {cell['readings_per_record']:.0f} | {layout} | {per_reading:.1f}"
                f" | {per_record:.0f} | {numbers['mib_per_hour']:.2f} |"
            )
    print()
    for cell in cells:
        print(f"{cell['gpus']} GPUs: v6 / v3 = {cell['ratio']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(cells, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
