"""Schema version 6: a resource record is one row of ``records``, each reading a whole number of its
unit's resolution. Real stores, written by the real writer (two at once where ranks share one),
read by the real reader, the views and plain SQL; older stores migrated by the real migrations."""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import old_store
from hypothesis import given, settings
from hypothesis import strategies as st

from sampler import catalogue
from sampler.analysis import timeline
from sampler.store import schema
from sampler.store.reader import StoreReader
from sampler.store.writer import RunInfo, RunWriter, encoded, resolution

CPU = "resource/cpu/utilization_percent"
SWAP = "resource/memory/swap_used_mb"
LOSS = "train/loss"


def writer_of(store: Path, **config: object) -> RunWriter:
    return RunWriter(
        str(store), RunInfo(os.getpid(), ["train.py"], {"interval_seconds": 1.0, **config}, time.time())
    )


def rows(store: Path, query: str, *args: object) -> list[tuple[object, ...]]:
    db = sqlite3.connect(store)
    try:
        return db.execute(query, args).fetchall()
    finally:
        db.close()


@settings(max_examples=300, deadline=None)
@given(unit=st.sampled_from(catalogue.UNITS), whole=st.integers(-(2**50), 2**50))
def test_a_value_no_finer_than_its_units_resolution_reads_back_exactly(unit: str, whole: int) -> None:
    """``whole`` steps of the unit's resolution, stored and decoded by the SQL the views use."""
    scale = catalogue.RESOLUTION[unit]
    value = whole / scale
    stored = encoded(value, scale)
    assert stored == whole and type(stored) is int
    db = sqlite3.connect(":memory:")
    db.execute(f"CREATE TABLE t ({schema.quoted(CPU)})")
    db.execute("INSERT INTO t VALUES (?)", (stored,))
    ((read,),) = db.execute(f"SELECT {schema.decoded(CPU, scale)} FROM t")
    db.close()
    assert read == value


def test_every_unit_has_a_resolution_and_each_signal_is_stored_at_its_own() -> None:
    assert set(catalogue.RESOLUTION) == set(catalogue.UNITS)
    assert resolution(CPU) == 1000 and resolution(SWAP) == 1024
    assert resolution("resource/gpu/3/power_watts") == 1000


def test_a_record_is_one_row_its_readings_whole_numbers_and_both_views_read_them(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    writer = writer_of(store)
    readings = [
        {CPU: 12.345, SWAP: 2.5},
        {CPU: math.nan, SWAP: 1e300},  # NaN: NULL; beyond a double's whole numbers: the value as REAL
        {CPU: math.inf, SWAP: -0.25},
    ]
    for step, values in enumerate(readings):
        writer.log(LOSS, 0.5, step)
        writer.record(values, step, time.monotonic_ns(), None)
    writer.close({})
    assert writer.error is None and writer.points_written == 9
    run = writer.run_id
    assert rows(store, "PRAGMA user_version") == [(schema.SCHEMA_VERSION,)]
    stored = rows(
        store, f'SELECT seq, step, "{CPU}", "{SWAP}" FROM records WHERE run_id = ? ORDER BY seq', run
    )
    assert stored == [(0, 0, 12345, 2560), (1, 1, None, 1e300 * 1024), (2, 2, math.inf, -256)]
    assert [type(value) for *_, value in stored] == [int, float, int]
    assert rows(store, "SELECT COUNT(*) FROM points") == [(3,)]  # the loss alone
    decoded = rows(store, f'SELECT step, "{CPU}", "{SWAP}" FROM resource_records ORDER BY seq')
    assert decoded == [(0, 12.345, 2.5), (1, None, 1e300), (2, math.inf, -0.25)]
    signals = rows(store, "SELECT name, step, value FROM signals WHERE run_id = ? ORDER BY name, step", run)
    assert signals == [
        (CPU, 0, 12.345), (CPU, 2, math.inf), (SWAP, 0, 2.5), (SWAP, 1, 1e300), (SWAP, 2, -0.25),
        (LOSS, 0, 0.5), (LOSS, 1, 0.5), (LOSS, 2, 0.5),
    ]  # fmt: skip
    walls = rows(store, "SELECT wall_ms FROM records ORDER BY seq")
    assert rows(store, f"SELECT wall_time FROM signals WHERE name = '{SWAP}' ORDER BY step") == [
        (wall / 1000,) for (wall,) in walls
    ]
    with StoreReader(str(store)) as reader:
        records = reader.records(run)
        assert records.steps.tolist() == [0, 1, 2] and records.walls.tolist() == [w / 1000 for (w,) in walls]
        assert np.array_equal(records.values[CPU], [12.345, np.nan, np.inf], equal_nan=True)
        assert records.values[SWAP].tolist() == [2.5, 1e300, -0.25]
        assert reader.names(run) == [CPU, SWAP, LOSS]
        assert reader.counts(run) == (3, 2)
        assert reader.series(run, CPU).values == [12.345, math.inf]
        expected = [(CPU, 0, 12.345), (CPU, 2, math.inf), (SWAP, 0, 2.5), (SWAP, 1, 1e300), (SWAP, 2, -0.25)]
        assert sorted(reader.resource_points(run)) == sorted(
            (name, step, walls[step][0] / 1000, value) for name, step, value in expected
        )
        assert list(reader.records(run, [SWAP]).values) == [SWAP]


def resource_points_store(path: Path, version: int) -> Path:
    """A store of schema ``version`` whose run 1 logged its resources as points, as writers did
    before version 6: 4 records of two signals (the second without a CPU reading), and a loss."""
    old_store(path, version)
    db = sqlite3.connect(path, isolation_level=None)
    db.executemany("INSERT INTO signal_names (name) VALUES (?)", [(CPU,), (SWAP,)])
    points = [(1, 2, step, 100.0 + step / 3, 10.0 * step) for step in (0, 2, 3)]
    points += [(1, 3, step, 100.0 + step / 3, 1.0 + step) for step in range(4)]
    db.executemany("INSERT INTO points VALUES (?, ?, ?, ?, ?)", points)
    db.close()
    return path


@pytest.mark.parametrize("version", [3, 4, 5])
def test_an_older_store_is_read_as_it_is_and_the_same_once_migrated(tmp_path: Path, version: int) -> None:
    path = resource_points_store(tmp_path / "old.sqlite", version)

    def read() -> tuple[object, ...]:
        with StoreReader(str(path)) as reader:
            run = reader.run(1)
            records = reader.records(1)
            loaded = timeline.load(reader, run)
            assert np.array_equal(loaded.values[CPU], records.values[CPU], equal_nan=True)
            return (
                records.steps.tolist(),
                records.walls.tolist(),
                {name: column.tolist() for name, column in records.values.items()},
                reader.names(1),
                reader.counts(1),
                reader.series(1, CPU),
            )

    before = read()
    assert before[0] == [0, 1, 2, 3] and before[1] == [100.0 + step / 3 for step in range(4)]
    assert np.array_equal(before[2][CPU], [0.0, np.nan, 20.0, 30.0], equal_nan=True)  # type: ignore[index]
    assert before[2][SWAP] == [1.0, 2.0, 3.0, 4.0]  # type: ignore[index]
    assert before[3:5] == ([CPU, SWAP, LOSS], (4, 7))
    writer = writer_of(path)  # migrates it, and writes a run of version 6 beside the old one
    writer.record({CPU: 1.5}, 9, time.monotonic_ns(), None)
    writer.close({})
    assert rows(path, "PRAGMA user_version") == [(schema.SCHEMA_VERSION,)] and writer.run_id == 2
    after = read()
    assert repr(after) == repr(before)
    assert rows(path, "SELECT COUNT(*) FROM signals WHERE run_id = 1") == [(8,)]
    assert rows(path, "SELECT run_id, name, step, value FROM signals WHERE run_id = 2") == [(2, CPU, 9, 1.5)]


def test_ranks_writing_one_store_add_their_own_columns_and_see_each_others(tmp_path: Path) -> None:
    """Two writers (two connections, as two ranks' are) each logging its own GPU's signals,
    in turns: each adds the columns it needs while the other's go on being written."""
    store = tmp_path / "runs.sqlite"
    ranks = [writer_of(store), writer_of(store)]
    for step in range(6):
        for rank, writer in enumerate(ranks):
            values = {f"resource/gpu/{rank}/power_watts": step + rank / 8, CPU: float(step)}
            if step >= 3:  # a signal both log, which the first to log it adds
                values[f"resource/gpu/{rank}/memory_used_mb"] = 1024.0 + step
                values["resource/memory/system_utilization_percent"] = 50.0
            writer.record(values, step, time.monotonic_ns(), None)
            writer.flush()
    for writer in ranks:
        writer.close({})
        assert writer.error is None
    with StoreReader(str(store)) as reader:
        for rank, writer in enumerate(ranks):
            assert writer.run_id is not None
            records = reader.records(writer.run_id)
            assert records.steps.tolist() == list(range(6))
            assert records.values[f"resource/gpu/{rank}/power_watts"].tolist() == [
                s + rank / 8 for s in range(6)
            ]
            assert f"resource/gpu/{1 - rank}/power_watts" not in records.values
            assert np.array_equal(
                records.values[f"resource/gpu/{rank}/memory_used_mb"],
                [np.nan] * 3 + [1027.0, 1028.0, 1029.0],
                equal_nan=True,
            )
    assert rows(store, "SELECT COUNT(*) FROM records") == [(12,)]
    assert rows(store, "SELECT COUNT(*) FROM signals") == [(2 * (6 + 6 + 3 + 3),)]


@pytest.mark.timeout(300)  # adding 2,000 columns takes seconds
def test_a_signal_past_sqlites_column_limit_is_stored_as_points_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    store = tmp_path / "runs.sqlite"
    names = [f"resource/made_up/signal_{i}" for i in range(2000)]  # SQLite's default limit: 2000 columns
    writer = writer_of(store)
    for step in range(2):
        writer.record({name: i + step for i, name in enumerate(names)}, step, time.monotonic_ns(), None)
        writer.flush()
    writer.close({})
    assert writer.error is None and writer.points_written == 2 * 2000
    ((columns,),) = rows(store, "SELECT COUNT(*) FROM record_columns")
    past = 2000 - columns
    assert 0 < past < 10  # the table's own 4 columns count
    assert rows(store, "SELECT COUNT(*) FROM points") == [(2 * past,)]
    [said] = [r.getMessage() for r in caplog.records if r.name == "sampler"]
    assert "takes no column for" in said and names[columns] in said
    with StoreReader(str(store)) as reader:
        records = reader.records(writer.run_id or 0)
        assert records.steps.tolist() == [0, 1] and len(records.values) == 2000
        assert all(records.values[name].tolist() == [i, i + 1] for i, name in enumerate(names))
    assert rows(store, "SELECT COUNT(*) FROM signals") == [(4000,)]


def test_a_pruned_runs_records_go_with_it(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    old, kept = writer_of(store), writer_of(store)
    for writer in (old, kept):
        for step in range(50):
            writer.record({CPU: 1.0, SWAP: 2.0}, step, time.monotonic_ns(), None)
        writer.close({})
    db = sqlite3.connect(store)
    db.execute("UPDATE runs SET updated_at = updated_at - 30 * 86400 WHERE id = ?", (old.run_id,))
    db.commit()
    db.close()
    done = subprocess.run(
        [sys.executable, "-m", "sampler", "runs", str(store), "--prune", "--older-than", "7d"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0 and "removed 1 run, 100 points" in done.stdout, done.stdout + done.stderr
    assert rows(store, "SELECT run_id, COUNT(*) FROM records GROUP BY run_id") == [(kept.run_id, 50)]


def test_the_manual_gives_every_units_resolution() -> None:
    """The schema's section of docs/commands.md has a row for each unit of the catalogue."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "commands.md").read_text()
    table = text[text.index("| unit | resolution |") :].split("\n\n")[0].splitlines()[2:]
    units = [unit for row in table for unit in row.split("|")[1].strip().split(", ")]
    assert sorted(units) == sorted(catalogue.UNITS)


def test_a_view_following_a_live_run_reads_only_the_records_written_since(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    writer = writer_of(store)
    for step in range(5):
        writer.record({CPU: float(step)}, step, time.monotonic_ns(), None)
    writer.flush()
    with StoreReader(str(store)) as reader:
        run = writer.run_id or 0
        latest, seq = reader.records_since(run, last=2)
        assert (latest.steps.tolist(), latest.values[CPU].tolist(), seq) == ([3, 4], [3.0, 4.0], 4)
        none, same = reader.records_since(run, seq)
        assert len(none) == 0 and same == 4
        writer.record({CPU: 5.0, SWAP: 1.0}, 5, time.monotonic_ns(), None)  # a column added meanwhile
        writer.flush()
        new, seq = reader.records_since(run, seq)
        assert (new.steps.tolist(), new.values[CPU].tolist(), new.values[SWAP].tolist(), seq) == (
            [5],
            [5.0],
            [1.0],
            5,
        )
    writer.close({})
    old = resource_points_store(tmp_path / "old.sqlite", 5)
    with StoreReader(str(old)) as reader:
        records, seq = reader.records_since(1)
        assert len(records) == 0 and seq == -1


def test_a_new_store_has_pages_that_hold_a_record_of_8_gpus(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    writer = writer_of(store)
    writer.record({CPU: 1.0}, 0, time.monotonic_ns(), None)
    writer.close({})
    assert rows(store, "PRAGMA page_size") == [(schema.PAGE_SIZE,)] and schema.PAGE_SIZE == 16384
    kept = resource_points_store(tmp_path / "old.sqlite", 5)  # an older store keeps its own
    writer_of(kept).close({})
    assert rows(kept, "PRAGMA page_size") == [(4096,)]
    assert rows(kept, "PRAGMA user_version") == [(schema.SCHEMA_VERSION,)]


def test_a_runs_gpu_energy_is_read_from_its_records(tmp_path: Path) -> None:
    """``runs`` shows each GPU's energy counter from its first record to its last, summed."""
    store = tmp_path / "runs.sqlite"
    writer = writer_of(store)
    for step in range(4):
        values = {f"resource/gpu/{gpu}/energy_joules": 1000.0 * gpu + 2.5 * step for gpu in range(2)}
        writer.record({**values, CPU: 1.0}, step, time.monotonic_ns(), None)
    writer.close({})
    with StoreReader(str(store)) as reader:
        assert reader.energy_joules(writer.run_id or 0) == 2 * 7.5
        assert reader.names(writer.run_id or 0) == [
            CPU,
            *(f"resource/gpu/{gpu}/energy_joules" for gpu in range(2)),
        ]
    quiet = resource_points_store(tmp_path / "old.sqlite", 5)
    with StoreReader(str(quiet)) as reader:
        assert reader.energy_joules(1) is None


@pytest.mark.parametrize("version", [1, 2])
def test_a_store_too_old_to_read_is_migrated_by_its_first_writer_and_its_runs_read(
    tmp_path: Path, version: int
) -> None:
    path = resource_points_store(tmp_path / "old.sqlite", version)
    writer_of(path).close({})
    assert rows(path, "PRAGMA user_version") == [(schema.SCHEMA_VERSION,)]
    with StoreReader(str(path)) as reader:
        records = reader.records(1)
        assert records.steps.tolist() == [0, 1, 2, 3] and records.values[SWAP].tolist() == [
            1.0,
            2.0,
            3.0,
            4.0,
        ]
        assert reader.names(1) == [CPU, SWAP, LOSS]


def test_the_stores_sql_is_what_sqlite_3_31_runs() -> None:
    """Ubuntu 20.04's Python links SQLite 3.31: nothing the store or its readers run may need a
    later one (IIF and the math functions are 3.32 on, RETURNING 3.35, ->> 3.38, unixepoch 3.38)."""
    import re

    later = re.compile(
        r"\bIIF\s*\(|\bRETURNING\b|->>|\bunixepoch\s*\(|(?<![.\w])(?:pow|sqrt|log10|ln)\s*\(", re.I
    )
    root = Path(__file__).resolve().parent.parent / "sampler"
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if later.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == []
