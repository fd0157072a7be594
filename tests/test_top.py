"""Issue 8: ``python -m sampler top``, the live terminal view of a run.

The rendering on synthetic data; ``--once`` and the store watcher against
stores written by a real monitor; and the live view itself in a real terminal
(tmux) against a backend process writing the store."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import fake_driver
import pytest
from conftest import FAST, WAIT_SECONDS, backend_script, parse_command, wait_for

import sampler
from sampler.commands import top as top_command
from sampler.store.reader import Run, StoreReader
from sampler.store.writer import RunInfo, RunWriter
from sampler.views import formatting, top, watch
from sampler.views.top import Line
from sampler.views.watch import View

NOW = 1_700_000_000.0


def make_run(**overrides: object) -> Run:
    fields: dict[str, object] = {
        "id": 3,
        "started_at": NOW - 125,
        "ended_at": None,
        "updated_at": NOW - 0.5,
        "host": "trainer-7",
        "pid": 4242,
        "command": ["python", "train.py"],
        "config": {"interval_seconds": 1.0},
        "version": "0.1.0",
        "stats": {"restarts": 0, "records_lost": 0, "quarantined": []},
    }
    fields.update(overrides)
    return Run(**fields)  # type: ignore[arg-type]


def series(*values: float, end: float = NOW - 0.5) -> deque[tuple[float, float]]:
    """Points one second apart, the last at ``end``."""
    return deque((end - (len(values) - 1 - i), v) for i, v in enumerate(values))


def text_of(lines: list[Line]) -> str:
    return top.frame_text(lines)


def labelled(line: str, label: str) -> bool:
    """Whether ``line``'s label (its text up to two spaces) is ``label``."""
    return line.strip().split("  ")[0] == label


def row(text: str, label: str) -> str:
    """The line of ``text`` whose label is ``label``."""
    found = [line for line in text.splitlines() if labelled(line, label)]
    assert len(found) == 1, f"{label!r} in:\n{text}"
    return found[0]


# --- rendering, on synthetic data ----------------------------------------------------------------


def test_sparkline_scales_recent_values_between_their_min_and_max() -> None:
    assert formatting.sparkline([0, 1, 2, 3, 4, 5, 6, 7], 8) == "▁▂▃▄▅▆▇█"
    assert formatting.sparkline([10, 20, 30, 40], 2) == "▁█"  # only the last `width`, scaled on their own
    assert formatting.sparkline([5, 5, 5], 10) == "▁▁▁"  # flat, and no padding
    assert formatting.sparkline([0, math.nan, 1], 3) == "▁ █"
    assert formatting.sparkline([1, 2], 0) == "" and formatting.sparkline([], 5) == ""


def test_values_carry_the_unit_their_name_says() -> None:
    cases = {
        ("resource/cpu/utilization_percent", 12.34): "12.3%",
        ("resource/process/memory_in_use_mb", 1234.0): "1234 MiB",
        ("resource/disk/utilization_gb", 23.12): "23.1 GiB",
        ("resource/gpu/0/memory_allocated_bytes", 12 * 1024**3): "12.0 GiB",
        ("resource/gpu/0/sm_clock_mhz", 1980.0): "1980 MHz",
        ("resource/gpu/0/temperature_celsius", 45.0): "45°C",
        ("resource/gpu/0/power_watts", 312.5): "312 W",
        ("resource/process/cpu_threads_in_use", 3.0): "3",
        ("train/loss", 0.012345678): "0.01235",
    }
    for (name, value), shown in cases.items():
        assert formatting.format_value(name, value) == shown, name
    assert formatting.format_value("resource/network/bytes_sent", 2048.0, rate=True) == "2.0 KiB/s"
    assert formatting.format_value("resource/disk/read_mb", 1.5, rate=True) == "1.5 MiB/s"
    assert top.rates([(0.0, 100.0), (2.0, 300.0), (3.0, 50.0), (4.0, 60.0)]) == [(2.0, 100.0), (4.0, 10.0)]


def test_signals_are_grouped_training_first_then_categories_in_order() -> None:
    points = {
        "resource/process/memory_in_use_mb": series(100, 150, 120),
        "resource/cpu/utilization_percent": series(10, 90, 50),
        "train/loss": series(2.0, 1.0, 0.5),
        "eval/accuracy": series(0.5, 0.7),
        "resource/network/bytes_received": series(0, 1024, 3072),  # a counter: shown as a rate
        "resource/memory/system_utilization_percent": series(40, 41),
        "steps_per_second": series(3, 4),
        "resource/progress/steps_per_second": series(7, 8),
    }
    view = View(store="s.sqlite", run=make_run(), points=points, last_step=77, newest=NOW - 0.5)
    lines = top.render(view, NOW, width=120)
    text = text_of(lines)
    groups = [line.text for line in lines if line.style == "heading" and " " not in line.text]
    # The loop's throughput beside its signals, then its process, then the host's.
    assert groups == ["eval", "train", "training", "progress", "process", "cpu", "memory", "network"], text
    loss = row(text, "loss").split()
    assert loss[1:4] == ["0.5", "0.5", "2"] and loss[4] == "█▃▁"  # now, min, max, recent
    assert row(text, "utilization").split()[1:4] == ["50.0%", "10.0%", "90.0%"]
    received = row(text, "received /s")
    assert "2.0 KiB/s" in received and "1.0 KiB/s" in received
    assert row(text, "steps_per_second").split()[1] == "4"
    assert "run 3 | trainer-7 | pid 4242 | running | 2m05s | step 77" in text


def test_cpu_seconds_have_no_row_beside_the_cpu_percent_that_is_their_rate() -> None:
    points = {
        "resource/process/cpu_utilization_percent": series(150, 250),
        "resource/process/cpu_seconds": series(10.0, 12.5),
        "resource/process_tree/cpu_seconds": series(20.0, 23.0),  # its CPU % not logged: shown as a rate
    }
    view = View(store="s.sqlite", run=make_run(), points=points, newest=NOW - 0.5)
    text = text_of(top.render(view, NOW, width=120))
    assert row(text, "CPU").split()[1] == "250.0%"
    assert row(text, "CPU time /s").split()[3:5] == ["3", "s/s"]  # the tree's alone, one second apart


def test_a_row_per_gpu_with_its_signals_side_by_side() -> None:
    def gpu(i: int, util: float, temp: float) -> dict[str, deque[tuple[float, float]]]:
        prefix = f"resource/gpu/{i}/"
        return {
            prefix + "utilization_percent": series(util - 10, util),
            prefix + "memory_allocated_bytes": series(12 * 1024**3),
            prefix + "memory_allocated_percent": series(15),
            prefix + "temperature_celsius": series(temp),
            prefix + "power_watts": series(300),
            prefix + "fan_rpm": series(1200),  # one the table does not know: no column (the store has it)
        }

    points = {
        **gpu(10, 50, 70),
        **gpu(2, 87, 45),
        "train/loss": series(1.0),
        "resource/cpu/utilization_percent": series(10),
        "resource/pressure/cpu_some_percent": series(1),
    }
    view = View(store="s.sqlite", run=make_run(), points=points, last_step=1, newest=NOW - 0.5)
    lines = top.render(view, NOW, width=120)
    text = text_of(lines)
    groups = [line.text.split()[0] for line in lines if line.style == "heading" and line.text.strip()]
    assert groups[1:] == ["train", "gpu", "cpu", "pressure"], text  # GPUs first of the resources
    header = row(text, "gpu").split()
    assert header[:6] == ["gpu", "util", "memory", "mem", "%", "temp"] and "fan_rpm" not in header
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("gpu/")]
    assert [r[0] for r in rows] == ["gpu/2", "gpu/10"]  # by device index, not as text
    assert rows[0][1:7] == ["87.0%", "12.0", "GiB", "15.0%", "45°C", "300"] and "1200" not in rows[0]
    assert rows[1][1] == "50.0%" and rows[1][-1] == "▁█"  # utilization's sparkline
    assert not any("temperature_celsius" in line for line in text.splitlines())  # not a row of its own


def test_health_line_says_what_is_wrong_with_the_monitor() -> None:
    ok = top.health_line({"restarts": 0, "records_lost": 0, "quarantined": [], "error": None})
    assert ok.style == "" and ok.text.startswith("health: ok")
    bad = top.health_line(
        {
            "restarts": 2,
            "deaths": [{"cause": "hang", "category": "disk"}, {"cause": "crash", "category": "gpu"}],
            "records_lost": 5,
            "quarantined": ["gpu"],
            "gpus_quarantined": ["1", "3-mig0"],
            "store_error": "cannot write it: disk I/O error",
            "waiting_for": "the sink to return (called 3 s ago)",
        }
    )
    assert bad.style == "alert"
    for part in (
        "2 restarts (last: crash in gpu)",
        "5 records lost",
        "quarantined: gpu",
        "GPUs quarantined: 1, 3-mig0",
        "store error: cannot write it: disk I/O error",
        "waiting for the sink to return",
    ):
        assert part in bad.text
    assert top.health_line(None).text == "health: not reported yet"


def test_no_sample_for_n_seconds_when_the_backend_went_quiet() -> None:
    run = make_run(config={"interval_seconds": 2.0})
    fresh = View(store="s", run=run, points={"train/loss": series(1.0)}, newest=NOW - 5.0, pid_alive=True)
    assert top.stale_line(fresh, NOW) is None  # under 3 intervals
    hung = View(store="s", run=run, points={"train/loss": series(1.0)}, newest=NOW - 42.4, pid_alive=True)
    line = top.stale_line(hung, NOW)
    assert line is not None and line.style == "alert"
    assert line.text.startswith("!! no sample for 42 s") and "still runs" in line.text
    gone = View(store="s", run=run, newest=NOW - 42.4, pid_alive=False)
    gone_text = text_of(top.render(gone, NOW))
    assert "pid 4242) is gone" in gone_text and "| lost |" in gone_text
    assert "| running |" in text_of(top.render(hung, NOW))
    stopped = View(store="s", run=run, newest=NOW - 42.4, pid_alive=True, pid_suspended=True)
    line = top.stale_line(stopped, NOW)
    assert line is not None and "(pid 4242) is stopped (SIGSTOP, Ctrl-Z" in line.text
    ended = View(store="s", run=make_run(ended_at=NOW - 60), newest=NOW - 60)
    assert "no sample" not in text_of(top.render(ended, NOW))
    nothing_yet = View(store="s", run=make_run(started_at=NOW - 30))  # no point at all: since the start
    assert "no sample for 30 s" in text_of(top.render(nothing_yet, NOW))


def test_a_terminal_too_small_truncates_and_says_what_is_hidden() -> None:
    points = {f"resource/cpu/s{i}_percent": series(i, i + 1) for i in range(30)}
    view = View(store="s", run=make_run(), points=points, newest=NOW)
    for width, height in ((20, 5), (1, 1), (200, 3)):
        lines = top.render(view, NOW, width=width, height=height)
        assert len(lines) == height and all(len(line.text) <= width for line in lines)
        assert lines[-1].text.startswith("…") and lines[-1].style == "alert"
    cut = top.render(view, NOW, width=120, height=5)  # the header alone fills it
    assert cut[-1].text == f"… {len(top.render(view, NOW, width=120)) - 4} more rows: enlarge the terminal"


def test_the_process_rows_come_first_and_the_rows_scroll_under_a_header_that_stays() -> None:
    """At 80x24 the training process's rows are on the first screen, the columns' explanation
    reads whole, and every other row is reached by scrolling."""
    points = {
        f"resource/{category}/s{i}_percent": series(i, i + 1)
        for category in ("cpu", "disk", "network")
        for i in range(8)
    }
    points |= {"resource/process/memory_in_use_mb": series(100, 120), "train/loss": series(2.0, 1.0)}
    points |= {"resource/process_tree/processes": series(3, 4)}
    view = View(store="s", run=make_run(), points=points, newest=NOW)
    whole = top.render(view, NOW, width=80)
    first, offset = top.frame(view, NOW, width=80, height=24)
    assert offset == 0 and len(first) == 24 and all(len(line.text) <= 80 for line in first)
    text = text_of(first)
    assert "min and max: over the last" in text and "…" not in text.splitlines()[3], text
    assert row(text, "memory (RSS)") and row(text, "processes") and "loss" in text, text
    header, rows, room = first[:5], whole[5:], 24 - 5 - 1
    while True:  # a row at a time, as the down arrow does, to the end
        lines, used = top.frame(view, NOW, width=80, height=24, offset=offset)
        assert lines[:5] == header and used == offset and lines[5:-1] == rows[offset : offset + room]
        if lines[-1].text.endswith(f", 0 below): {top.SCROLL_KEYS}"):
            break
        offset += 1
    assert offset + room == len(rows)
    past, used = top.frame(view, NOW, width=80, height=24, offset=10**9)
    assert used == offset and past == lines  # kept within the rows
    waiting = top.render(View(store="x.sqlite", waiting="waiting for a run in x.sqlite"), NOW, width=10)
    assert [line.text for line in waiting] == ["wl-resour…", "waiting f…"]


def test_no_value_is_cut_and_a_narrow_terminal_drops_whole_columns() -> None:
    """Throughput's cells ("12.35 steps/s") are wider than a cell was, a GPU has more columns than
    80 characters hold, and a cluster's host name pushes the title's step to the edge: each value
    shows whole at every width, in a wider column, a second GPU table or a second title line."""
    gpu = "resource/gpu/0/"
    readings = {
        "utilization_percent": 87,
        "utilization_percent_peak": 99,
        "memory_allocated_bytes": 12 * 1024**3,
        "memory_allocated_bytes_peak": 13 * 1024**3,
        "memory_allocated_percent": 15,
        "process_memory_bytes": 1024**3,
        "tree_memory_bytes": 2 * 1024**3,
        "temperature_celsius": 45,
        "power_watts": 312,
        "power_limit_watts": 700,
        "sm_clock_mhz": 1980,
        "memory_clock_mhz": 2619,
    }
    values = {gpu + signal: value for signal, value in readings.items()}
    points = {name: series(value) for name, value in values.items()}
    points |= {
        "resource/progress/steps_per_second": series(9.5, 12.345, 11.25),
        "resource/process/memory_in_use_mb": series(100, 120),
        "train/loss": series(2.0, 1.0),
    }
    host = "ip-172-31-22-118.eu-west-1.compute.internal"
    run = make_run(host=host, rank=3, world_size=8, pid=1234567)
    view = View(store="s", run=run, points=points, last_step=12345678, newest=NOW)
    throughput = ["11.25 steps/s", "9.50 steps/s", "12.35 steps/s"]
    gpu_values = [top.format_value(name, value) for name, value in values.items()]
    for width in (120, 80, 50, 40):
        lines = top.render(view, NOW, width=width)
        text = text_of(lines)
        assert all(len(line.text) <= width for line in lines), text
        parts = {part for line in text.splitlines() for part in line.split(" | ")}
        named = host if len(host) <= width else host[: width - 1] + "…"  # text is cut, the numbers are not
        assert {named, "rank 3/8", "pid 1234567", "step 12345678"} <= parts, text
        body = text.split("min and max: over the last", 1)[1].splitlines()[1:]
        assert not any("…" in line for line in body), text
        columns = body[0].split()
        assert columns[0] == "now" and ("min" in columns) == ("max" in columns) == (width >= 80), text
        shown = re.findall(r"\S+ steps/s", row(text, "steps /s"))
        assert shown == throughput[: len(columns) - ("recent" in columns)], text
        gpu_rows = " ".join(line for line in body if line.strip().startswith("gpu/0"))
        assert all(value in gpu_rows for value in gpu_values), text


# --- against stores written by a real monitor ----------------------------------------------------


def once(store: Path | str, **options: object) -> tuple[int, str]:
    out = io.StringIO()
    args = argparse.Namespace(store=str(store), run_id=None, interval=None, once=True, out=out)
    for key, value in options.items():
        setattr(args, key, value)
    status = top_command.main(args)
    return status, out.getvalue()


def test_once_prints_a_frame_of_a_run_a_real_monitor_is_writing(
    tmp_path: Path, nvml: fake_driver.Driver
) -> None:
    nvml.configure(devices=[{}, {"util": 12}])
    store = tmp_path / "runs.sqlite"
    age = [0]
    with sampler.ResourceMonitor(
        store=store,
        categories=["cpu", "process", "gpu"],
        age_source=lambda: age[0],
        **FAST,
    ) as mon:
        step = 0
        # Until enough is in the store: samples at a step that no longer moves would be dropped.
        while step < 30 or mon.stats()["store_points_written"] <= 60:
            step += 1
            age[0] = step
            if step <= 30:
                sampler.signals.log_signal("train/loss", 1.0 / step, step)
            time.sleep(0.02)
            assert step < 1500, "not 60 points in the store in 30 s"
        status, text = once(store)
        status_run, text_run = once(store, run_id=1)
    # The same run's header, but for its age, which a loaded machine may have moved a second meanwhile.
    headers = [re.sub(r"\| [0-9hms]+ \|", "| |", t.splitlines()[0]) for t in (text, text_run)]
    assert status == 0 and status_run == 0 and headers[0] == headers[1]
    assert re.match(r"run 1 \| \S+ \| pid \d+ \| running \| \d+s \| step \d+ \| every 0.1 s", text)
    assert "health: ok" in text and "no sample for" not in text, text
    loss = row(text, "loss").split()
    assert 0 < float(loss[1]) < 1 and loss[3] == "1"  # now, and the window's max: the first loss
    assert row(text, "train") and row(text, "cpu") and row(text, "process")
    assert row(text, "utilization").split()[1].endswith("%")
    assert row(text, "memory (RSS)").split()[3] == "MiB"
    gpus = [line.split() for line in text.splitlines() if line.strip().startswith("gpu/")]
    assert [g[0] for g in gpus[:2]] == ["gpu/0", "gpu/1"] and [g[1] for g in gpus[:2]] == ["87.0%", "12.0%"]
    assert [g[0] for g in gpus] == ["gpu/0", "gpu/1"] * (len(gpus) // 2)  # what 120 columns do not hold below
    assert text.index("loss") < text.index("gpu/0") < text.index("\ncpu")
    status, text = once(store)  # the monitor stopped: the run ended, nothing is stale
    assert status == 0 and "| ended |" in text and "no sample" not in text


def test_once_without_a_run_says_it_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nothing.sqlite"
    args = parse_command("top", str(missing), "--once")
    args.out = io.StringIO()
    assert args.handler(args) == 2
    assert f"waiting for a run in {missing}" in args.out.getvalue()
    empty = tmp_path / "empty.sqlite"
    RunWriter(str(empty), run_info()).close({})  # a store with one run, run 1
    status, text = once(empty, run_id=2)
    assert status == 2 and f"waiting for run 2 in {empty}" in text
    assert once(empty)[0] == 0
    # Something with a store's name that is no file: said (not "no store there yet"), never opened
    # (a FIFO's open would wait for a writer), and still waited on: it may be moved aside.
    monkeypatch.chdir(tmp_path)  # short names: the line fits in the width, wherever tmp is
    os.mkdir("dir.sqlite")
    os.mkfifo("fifo.sqlite")
    for name, what in (("dir.sqlite", "a directory"), ("fifo.sqlite", "a FIFO")):
        status, text = once(name)
        assert status == 2 and f"(cannot read it: {what}, not a run store)" in text, text
    assert parse_command("top").store == "resource_monitor.sqlite"
    assert parse_command("top", "--interval", "0.5").interval == 0.5
    with pytest.raises(SystemExit):
        parse_command("top", "--interval", "-1")


def run_info() -> RunInfo:
    return RunInfo(
        pid=os.getpid(), command=["train.py"], config={"interval_seconds": 0.1}, started_at=time.time()
    )


def write(writer: RunWriter, step: int, loss: float, stats: dict[str, object] | None = None) -> None:
    writer.log("train/loss", loss, step)
    writer.record({"resource/cpu/utilization_percent": float(step)}, step, time.monotonic_ns(), stats)
    writer.flush()  # as if the samples were the writer's interval apart


def test_the_watch_reads_only_what_is_new_and_follows_a_newer_run(tmp_path: Path) -> None:
    store = str(tmp_path / "runs.sqlite")
    first = RunWriter(store, run_info())
    for step in range(20):
        write(first, step, 100.0 - step, {"restarts": 0} if step == 0 else None)
    newest = watch.StoreWatch(store, window=5)
    pinned = watch.StoreWatch(store, run_id=1, window=5)
    view = newest.poll()
    assert view.run is not None and view.run.id == 1 and view.last_step == 19
    assert [v for _, v in view.points["train/loss"]] == [85.0, 84.0, 83.0, 82.0, 81.0]  # latest 5
    for step in range(20, 23):
        write(first, step, 100.0 - step, {"restarts": 1, "quarantined": ["gpu"]} if step == 22 else None)
    view = newest.poll()
    assert [v for _, v in view.points["train/loss"]] == [82.0, 81.0, 80.0, 79.0, 78.0]
    assert (
        view.last_step == 22
        and view.run is not None
        and view.run.stats
        == {
            "restarts": 1,
            "quarantined": ["gpu"],
        }
    )
    assert "1 restart" in text_of(top.render(view, time.time())) and "quarantined: gpu" in text_of(
        top.render(view, time.time())
    )
    second = RunWriter(store, run_info())
    write(second, 0, 7.0)
    view = newest.poll()
    assert view.run is not None and view.run.id == 2 and [v for _, v in view.points["train/loss"]] == [7.0]
    assert view.last_step == 0
    view = pinned.poll()
    assert view.run is not None and view.run.id == 1 and len(view.points["train/loss"]) == 5
    with StoreReader(store) as reader:
        assert reader.series(1, "train/loss").values[-5:] == [v for _, v in view.points["train/loss"]]
        # Each refresh costs what is new, not what the run wrote so far: no scan, no sort.
        follow = str(reader.db.execute("EXPLAIN QUERY PLAN " + watch.FOLLOW_SQL, (0, 1)).fetchall())
        latest = str(reader.db.execute("EXPLAIN QUERY PLAN " + watch.LATEST_SQL, (1, 1, 5)).fetchall())
    assert "INTEGER PRIMARY KEY (rowid>?)" in follow and "B-TREE" not in follow, follow
    assert "points_by_signal (run_id=? AND name_id=?)" in latest and "B-TREE" not in latest, latest
    first.close({})
    second.close({})
    newest.close()
    pinned.close()


# --- the live view in a real terminal ------------------------------------------------------------

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

BACKEND = """
import json, math
age = [0]
mon = sampler.ResourceMonitor(store=sys.argv[1], age_source=lambda: age[0],
                              interval_seconds=0.1, _min_interval_seconds=0.05).start()
step = 0
while True:
    step += 1
    age[0] = step
    sampler.signals.log_signal("train/loss", 2.0 * math.exp(-step / 100) + 0.01 * math.sin(step), step)
    time.sleep(0.05)
"""


def top_command_line(store: Path) -> list[str]:
    return [sys.executable, "-m", "sampler", "top", str(store)]


MODES_END = "end-of-modes"
"""What the shell prints after ``stty -a``."""


class Tmux:
    """A tmux server of its own (its socket in ``cwd``, not in tmux's directory that every
    run on the machine shares), one detached 120x40 window running ``command`` in a shell
    that reports how it exited and the terminal's modes afterwards."""

    def __init__(self, command: list[str], cwd: Path, columns: int = 120, rows: int = 40) -> None:
        self.socket = cwd / "tmux.socket"
        # The shell outlives the Ctrl-C it shares with top (a no-op trap: top still gets SIGINT).
        shell = f'trap : INT; {shlex.join(command)}; echo "top exited with $?"; stty -a; echo {MODES_END}'
        shell += "; sleep 60"
        conf = cwd / "tmux.conf"  # none of the user's; a fixed size, whatever clients come and go
        conf.write_text(f"set -g default-size {columns}x{rows}\n")
        size = ["-x", str(columns), "-y", str(rows)]
        self.tmux("-f", str(conf), "new-session", "-d", *size, "-s", "top", "-c", str(cwd), shell)

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, timeout=10, check=True
        )
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def wait_screen(self, *needles: str, timeout: float = WAIT_SECONDS) -> str:
        """The screen once it shows every one of ``needles``."""
        last = [""]

        def shows() -> str | None:
            last[0] = self.screen()
            return last[0] if all(n in last[0] for n in needles) else None

        try:
            return str(wait_for(shows, timeout=timeout, what=f"{needles} on screen"))
        except AssertionError:
            raise AssertionError(f"{needles} not on screen:\n{last[0]}") from None

    def kill(self) -> None:
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], capture_output=True, timeout=10)
        self.socket.unlink(missing_ok=True)  # the server leaves it behind


def start_backend(nvml: fake_driver.Driver, tmp_path: Path, store: Path) -> subprocess.Popen[bytes]:
    script = tmp_path / "backend.py"
    script.write_text(backend_script(BACKEND))
    nvml.configure(devices=[{}, {"util": 12}])
    return subprocess.Popen([sys.executable, str(script), str(store)], env={**os.environ}, cwd=tmp_path)


def stop(backend: subprocess.Popen[bytes]) -> None:
    if backend.poll() is None:
        backend.kill()
    backend.wait(timeout=10)


def line_with(screen: str, label: str) -> str:
    return next((line for line in screen.splitlines() if labelled(line, label)), "")


def assert_exited_cleanly(tmux: Tmux) -> None:
    screen = tmux.wait_screen("top exited with", MODES_END)  # all of stty -a's lines, not the first alone
    assert "top exited with 0" in screen, screen
    modes = set(screen.split())
    assert {"icanon", "echo", "icrnl", "opost"} <= modes, screen  # cooked mode again, not curses' cbreak
    assert "run 1 |" not in screen  # the alternate screen was left: the shell's own screen is back


@needs_tmux
def test_top_in_a_terminal_follows_a_live_backend_and_quits_on_q(
    tmp_path: Path, nvml: fake_driver.Driver
) -> None:
    store = tmp_path / "runs.sqlite"
    backend = start_backend(nvml, tmp_path, store)
    tmux: Tmux | None = None
    try:
        wait_for(lambda: store.exists() and once(store)[0] == 0, what="the backend's run in the store")
        tmux = Tmux(top_command_line(store), tmp_path)
        first = tmux.wait_screen(
            "run 1 |", "| running |", "loss", "utilization", "gpu/1", "health: ok", "memory (RSS)"
        )
        assert "no sample for" not in first
        first_step = re.search(r"step (\d+)", first)
        assert first_step, first

        def moved_on() -> str | None:
            """The screen once its step went further and the loss's value and sparkline moved."""
            screen = tmux.screen()
            step = re.search(r"step (\d+)", screen)
            if step is None or int(step[1]) <= int(first_step[1]):
                return None
            return screen if line_with(screen, "loss") not in ("", line_with(first, "loss")) else None

        second = wait_for(moved_on, what="top following the run")
        assert line_with(first, "memory (RSS)") and line_with(second, "memory (RSS)"), second
        assert all(len(line) <= 120 for line in second.splitlines())

        stop(backend)  # SIGKILL: no end time is written, the store just goes quiet
        stale = tmux.wait_screen("no sample for", "is gone", timeout=10)
        assert "| lost |" in stale

        tmux.tmux("resize-window", "-t", "top", "-x", "30", "-y", "6")  # too small: cut, not a crash
        small = tmux.wait_screen("more rows")
        assert len(small.splitlines()) <= 6 and all(len(line) <= 30 for line in small.splitlines())
        tmux.tmux("resize-window", "-t", "top", "-x", "120", "-y", "40")
        tmux.wait_screen("run 1 |", "loss")

        tmux.tmux("send-keys", "-t", "top", "q")
        assert_exited_cleanly(tmux)
    finally:
        if tmux is not None:
            tmux.kill()
        stop(backend)


@needs_tmux
def test_top_at_80x24_shows_the_process_first_and_scrolls_with_the_keys(
    tmp_path: Path, nvml: fake_driver.Driver
) -> None:
    store = tmp_path / "runs.sqlite"
    backend = start_backend(nvml, tmp_path, store)
    tmux: Tmux | None = None
    try:
        wait_for(lambda: store.exists() and once(store)[0] == 0, what="the backend's run in the store")
        tmux = Tmux(top_command_line(store), tmp_path, columns=80, rows=24)
        # The loop's throughput and its process first, before the host's rows.
        first = tmux.wait_screen("run 1 |", "loss", "steps /s", "memory (RSS)", "gpu/0", "(0 above, ")
        assert "min and max: over the last 120 points" in first, first
        assert all(len(line) <= 80 for line in first.splitlines())
        throughput = re.findall(r"\S+ steps/s", line_with(first, "steps /s"))
        assert len(throughput) == 3 and all(re.fullmatch(r"\d+(\.\d+)? steps/s", t) for t in throughput), (
            first
        )

        def at_the_end() -> str | None:
            """The screen after End once it is at the end (rows that arrive later, the
            pressure's, push it below the end End went to: End again)."""
            tmux.tmux("send-keys", "-t", "top", "End")
            screen = tmux.screen()
            return screen if ", 0 below)" in screen else None

        last = wait_for(at_the_end, what="the end of the rows")
        assert "memory (RSS)" not in last and "steps /s" not in last and "run 1 |" in last, last
        rows = [line for screen in (first, last) for line in screen.splitlines()[5:-1]]  # below the header
        assert not any("…" in line for line in rows), f"{first}\n{last}"  # every value whole at 80 columns
        tmux.tmux("send-keys", "-t", "top", "Home")
        tmux.wait_screen("(0 above, ", "memory (RSS)")
        tmux.tmux("send-keys", "-t", "top", "Down")
        tmux.wait_screen("(1 above, ")
        tmux.tmux("send-keys", "-t", "top", "q")
        assert_exited_cleanly(tmux)
    finally:
        if tmux is not None:
            tmux.kill()
        stop(backend)


def test_top_into_a_file_says_it_needs_a_terminal_in_one_line(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(categories=["cpu"], store=str(store), step_source="seconds", **FAST) as mon:
        wait_for(lambda: mon.stats()["records_logged"] >= 1, what="a sample")
    with open(tmp_path / "frame.txt", "w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "sampler", "top", str(store)],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "--once" in done.stderr


@needs_tmux
def test_top_in_a_terminal_waits_for_a_run_picks_it_up_and_quits_on_ctrl_c(
    tmp_path: Path, nvml: fake_driver.Driver
) -> None:
    store = tmp_path / "later.sqlite"
    tmux = Tmux(top_command_line(store), tmp_path)
    backend: subprocess.Popen[bytes] | None = None
    try:
        tmux.wait_screen(f"waiting for a run in {store}")
        backend = start_backend(nvml, tmp_path, store)
        tmux.wait_screen("run 1 |", "loss", "gpu/0")
        tmux.tmux("send-keys", "-t", "top", "C-c")
        assert_exited_cleanly(tmux)
    finally:
        tmux.kill()
        if backend is not None:
            stop(backend)


# --- text from the store reaches the terminal escaped ----------------------------------------------

HOSTILE_HOST = "node\x1b[2J\x1b]0;owned\x07-7\u202egpj.exe\n\x9b31m"
"""A host name planted in a shared store: clear the screen, retitle the terminal, reverse the text
(bidi override), a line break, a C1 CSI."""
HOSTILE_COMMAND = ["python", "\x1b[31mtrain.py", "--tag=a\x7fb\u200fc", "\x85"]


def terminal_unsafe(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on rather than show (line breaks aside)."""
    return [c for c in text if c != "\n" and not c.isprintable()]


def test_once_shows_the_stores_host_command_and_names_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = Path("runs.sqlite")  # a short path: the command line after it fits in the width, wherever tmp is
    writer = RunWriter(str(store), run_info())
    writer.log("train/\x1b[8mloss", 0.5, 1)
    write(writer, 1, 1.0)
    writer.close(
        {"restarts": 1, "deaths": [{"cause": "\x1b[5mkilled", "category": "gpu"}], "error": "boom\x1b[0m\r"}
    )
    db = sqlite3.connect(store)
    db.execute("UPDATE runs SET host = ?, command = ?", (HOSTILE_HOST, json.dumps(HOSTILE_COMMAND)))
    db.commit()
    db.close()
    status, text = once(store)
    assert status == 0 and terminal_unsafe(text) == [], text
    title, command = text.splitlines()[:2]
    assert "node\\x1b[2J\\x1b]0;owned\\x07-7\\u202egpj.exe\\n\\x9b31m | pid" in title
    assert ": python \\x1b[31mtrain.py --tag=a\\x7fb\\u200fc" in command
    assert "\\x1b[8mloss" in text and "\\x1b[5mkilled" in text and "boom\\x1b[0m\\r" in text
