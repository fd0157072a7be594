"""Smoke test of the overhead benchmark: it runs end to end and reports every
mode. Nothing here judges the numbers; the benchmark itself does that."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import overhead
from sampler.collectors.host import SWAP_NAMES

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.usefixtures("whole_machine")  # it loads the machine to measure it
def test_quick_benchmark_produces_every_number(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    smallest = ["--quick", "--rounds", "1", "--seconds", "0.3", "--devices", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "bench", *smallest, "--json", str(out), "--plot", str(tmp_path / "bench.png")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert {
        "machine",
        "command",
        "profile",
        "cells",
        "slowdowns",
        "floor",
        "loss_logging",
        "scaling",
        "targets",
    } <= set(report)
    cells = report["cells"]
    for workload in ("gil", "numpy", "latency"):
        for interval in ("1s", "0.01s"):
            for mode in ("off", "thread", "process"):
                cell = cells[f"{workload}@{interval}/{mode}"]
                assert cell["steps_per_second"]["median"] > 0
                assert cell["step_ms_p99"]["median"] is not None
            for mode in ("thread", "process"):
                assert cells[f"{workload}@{interval}/{mode}"]["start_ms"]["median"] is not None
                assert report["slowdowns"][f"{workload}@{interval}/{mode}"]["median_percent"] is not None
    for mode in ("thread", "process"):
        idle = cells[f"idle@0.01s/{mode}"]
        assert idle["samples"] > 0
        assert idle["backend_cpu_ms_per_sample"]["median"] is not None
        assert idle["sample_to_sink_ms"]["p99"] is None  # no hook: the idle backend runs as users run it
        assert cells[f"gil@0.01s/{mode}"]["sample_to_sink_ms"]["p99"] is not None
    assert cells["idle@0.01s/process"]["child_cpu_ms_per_sample"]["median"] is not None
    assert {(row["mode"], row["devices"]) for row in report["scaling"]} >= {("thread", 1), ("process", 1)}
    assert all(row["backend_cpu_ms_per_sample"] is not None for row in report["scaling"])
    one_gpu = [row for row in report["scaling"] if row["devices"] == 1 and row["samples"]]
    assert one_gpu and all(row["signals_per_sample"] >= 15 for row in one_gpu)  # the fake driver answered
    # The floor and the run store, against the isolated monitor in the same rounds (idle backend).
    floor = report["floor"]["0.01s"]
    for mode in ("floor", "process", "store"):
        assert floor[f"{mode}_ms"]["median"] > 0 and floor[f"{mode}_samples"] > 0
    assert floor["process_x_floor"]["median"] > 0 and floor["store_x_floor"]["median"] > 0
    # The floor's sink calls, counted on this machine; a test elsewhere may turn swap on meanwhile.
    assert 0 < floor["process_signals_per_sample"] <= overhead.FLOOR_SIGNALS + len(SWAP_NAMES)
    # The loop that logs its loss every step: with the isolated monitor, without and with the store.
    for mode in ("log", "log+store"):
        assert cells[f"gil@1s/{mode}"]["steps_per_second"]["median"] > 0
        assert report["slowdowns"][f"gil@1s/{mode}"]["median_percent"] is not None
    loss = report["loss_logging"]
    assert all(loss["log_call_us"][mode] > 0 for mode in ("log", "log+store"))
    steps = cells["gil@1s/log+store"]["steps_per_second"]["median"] * 0.3
    assert loss["store_points"] >= 20_000 + 0.5 * steps  # every loss and timing call reached the store
    assert all(v["median_percent"] is not None for v in loss["slowdown"].values())
    assert len(report["targets"]) == 10 and all("met" in t for t in report["targets"])
    assert (
        "## Targets" in done.stdout and "## The floor" in done.stdout and "## Logging the loss" in done.stdout
    )
    if importlib.util.find_spec("matplotlib") is not None:  # the optional "plot" extra
        assert (tmp_path / "bench.png").stat().st_size > 0


def quick(module: str) -> subprocess.CompletedProcess[str]:
    """``python -m <module> --quick``, which must succeed."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--quick"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.usefixtures("whole_machine")  # it loads the machine to measure it
def test_inner_rate_benchmark_prints_each_rate_against_1_hz() -> None:
    done = quick("bench.inner_rate")
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| ")]
    rows = [row for row in rows if row[1].strip().endswith(" Hz")]
    assert [row[1].strip() for row in rows] == ["1 Hz", "5 Hz", "10 Hz", "50 Hz"]
    assert all(float(row[2]) > 0 and float(row[4]) > 0 for row in rows)  # backend and child CPU per record


@pytest.mark.usefixtures("whole_machine")  # it loads the machine to measure it
def test_child_cost_benchmark_prints_the_childs_cost_and_each_categorys() -> None:
    done = quick("bench.child_cost")
    rows = {
        row[1].strip(): [cell.strip() for cell in row[2:-1]]
        for row in (line.split("|") for line in done.stdout.splitlines() if line.startswith("| "))
    }
    child_ms, core_percent = rows["measured"]
    assert float(child_ms.removesuffix(" ms")) > 0 and float(core_percent.removesuffix(" %")) > 0
    assert {"cpu", "memory", "disk", "network", "process", "process_tree"} <= set(rows)
    assert float(rows["process_tree"][3]) > 0  # its PSS pass
    per_record = [float(rows[c][-1]) for c in rows if c not in ("", "measured", "all", "category")]
    assert float(rows["all"][-1]) == pytest.approx(sum(per_record), abs=0.01 * len(per_record))


@pytest.mark.usefixtures("whole_machine")  # it loads the machine to measure it
def test_tree_cost_benchmark_covers_0_8_and_64_workers() -> None:
    done = quick("bench.tree_cost")
    firsts = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")]
    assert {"0", "8", "64"} <= set(firsts)


@pytest.mark.usefixtures("whole_machine")  # it loads the machine to measure it
@pytest.mark.skipif(importlib.util.find_spec("prometheus_client") is None, reason="the prometheus extra")
def test_prometheus_cost_benchmark_prints_the_scrape_and_backend_costs() -> None:
    done = quick("bench.prometheus_cost")
    rows = {  # a range "a to b" of ratios counts as its two numbers
        row[1].strip(): [part for cell in row[2:-1] for part in cell.strip().removesuffix("x").split(" to ")]
        for row in (line.split("|") for line in done.stdout.splitlines() if line.startswith("| "))
    }
    assert {"20/s", "off", "on, 1/s"} <= set(rows)
    for label, numbers in (("20/s", 6), ("off", 10), ("on, 1/s", 10)):
        assert len(rows[label]) == numbers
        assert all(float(cell) == float(cell) for cell in rows[label])  # numbers, none nan
    scrapes, size, latency = (float(cell) for cell in rows["20/s"][:3])
    assert scrapes > 0 and size > 0 and latency > 0
    assert float(rows["on, 1/s"][0]) > 0  # the other process scraped
    assert all(float(rows[label][2]) > 0 and float(rows[label][6]) > 0 for label in ("off", "on, 1/s"))


@pytest.mark.usefixtures("whole_machine")  # it loads the machine to measure it
def test_monitor_cpu_benchmark_prints_each_part_and_its_ratios() -> None:
    done = quick("bench.monitor_cpu")
    rows = {
        row[1].strip(): [cell.strip().split(" ")[0] for cell in row[2:-1]]
        for row in (line.split("|") for line in done.stdout.splitlines() if line.startswith("| "))
    }
    parts = ("monitor backend", "monitor child", "monitor", "psutil", "floor")
    assert all(float(rows[part][0]) > 0 for part in parts)  # CPU ms/s of each, as the kernel counted it
    backend, child, total = (float(rows[part][0]) for part in parts[:3])
    assert total == pytest.approx(backend + child, abs=0.002)
    assert float(rows["psutil"][1]) == 1.0 and float(rows["floor"][2]) == 1.0  # each against itself
    assert "Goal, monitor total <= in-thread psutil monitor" in done.stdout


def test_child_breakdown_times_every_phase_of_the_childs_loop() -> None:
    done = quick("bench.child_breakdown")
    rows = {
        row[1].strip(): [cell.strip() for cell in row[2:-1]]
        for row in (line.split("|") for line in done.stdout.splitlines() if line.startswith("| "))
    }
    for collector in ("cpu", "memory", "disk", "network", "process"):
        assert float(rows[f"{collector}.sample"][1]) > 0  # ms per call in the loop
    for tracked in ("cpu", "memory", "process"):
        assert float(rows[f"{tracked}.sample_tracked"][0]) > 1  # read between records: above 1/s
    for phase in ("ring write", "status block", "peaks and means", "loop and wake-ups (the rest)"):
        assert float(rows[phase][4]) > 0  # CPU ms/s
    phases = [float(cells[4]) for name, cells in rows.items() if name not in ("phase", "all")]
    assert float(rows["all"][4]) == pytest.approx(sum(phases), abs=0.001 * len(phases) + 0.001)


def test_hook_cost_benchmark_prints_the_hooks_cost_per_step() -> None:
    done = quick("bench.hook_cost")
    said = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    assert float(said["training step, unwatched"].split()[0]) > 0
    for way in ("one empty forward pre-hook", "watched"):
        assert float(said[f"training step, {way}"].split()[0]) > 0
        assert (
            "µs per step" in said[f"training step, {way}"]
            and "% of this tiny step" in said[f"training step, {way}"]
        )


def test_stall_capture_benchmark_prints_what_a_capture_costs_each_side() -> None:
    done = quick("bench.stall_capture")
    said = {line.split("median")[0].strip(): line for line in done.stdout.splitlines() if "median" in line}
    assert set(said) == {"child CPU", "handler CPU (backend)", "wall"}
    assert "the memory file holds 0 B after them" in done.stdout  # emptied after each dump
    assert all(float(line.split("median")[1].split()[0]) > 0 for line in said.values())
