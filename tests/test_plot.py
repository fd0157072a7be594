"""Issue 8: ``python -m sampler plot``, asserting on what was drawn: the panels,
their units, the lines in them and their values, from stores written by a real
monitor (and, where a counter must be controlled, by the store's own writer)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import fake_driver
import numpy as np
import pynvml
import pytest
from conftest import FAST, run_command, wait_for
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text

import sampler
from sampler import catalogue
from sampler.collectors.gpu import THROTTLE_FIELDS
from sampler.collectors.gpu_gpm import GPM_METRICS
from sampler.commands import plot as command
from sampler.store.reader import Run, Series, StoreReader
from sampler.store.writer import RunInfo, RunWriter
from sampler.views import plot
from sampler.views.lines import points as prepared
from sampler.views.panels import BINARY_UNITS, LOOP, PHASES_KEY, matches
from sampler.views.panels import panels as chosen

REPO = Path(__file__).resolve().parent.parent
TEMPERATURES = (41.0, 67.0)
"""GPU 0 and GPU 1, as the fake NVML reports them."""
LOSS_SCALES = (2.0, 1.0)
"""Run 1's and run 2's loss at step 0."""
STEP_PER_ITERATION = 10
"""The model age moves 10 per training step: steps and seconds differ by far."""
THROTTLED = {getattr(pynvml, name): 0.25e9 for _, name in THROTTLE_FIELDS}
GPM = {getattr(pynvml, name): 40.0 for _, name in GPM_METRICS}
"""Every GPM metric at 40 (percent, or MiB/s)."""
"""Every clocks event reason the driver times holds the clocks down a quarter of the time
(nanoseconds per second), so the fake GPUs report every GPU reading."""
GPU_PANELS = sum(1 for s in catalogue.SIGNALS.values() if s.category == "gpu" and s.kind != catalogue.RATE)
"""One panel per GPU reading; peaks and means are drawn in their reading's panel, and a
counter's rate is drawn from the counter."""


def train(store: Path, loss_scale: float) -> None:
    """A training loop with a real monitor (every category but container and pressure, which
    depend on the machine's cgroup limits and kernel; two fake GPUs) and the store on."""
    age = [0]
    categories = [c for c in sampler.DEFAULT_CATEGORIES if c not in ("container", "pressure")]
    options: dict[str, Any] = {**FAST, "categories": categories}
    with sampler.ResourceMonitor(store=store, age_source=lambda: age[0], **options) as mon:
        i = 0
        while i < 20 or mon.stats()["records_logged"] < 6:
            i += 1
            age[0] = i * STEP_PER_ITERATION
            sampler.signals.log_signal("train/loss", loss_scale * math.exp(-i / 10), age[0])
            if i % 5 == 0:
                sampler.signals.log_signal("train/accuracy", 1 - math.exp(-i / 10), age[0])
            time.sleep(0.03)
        wait_for(lambda: mon.stats()["store_points_written"] > 0)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two runs of a real monitor in one store."""
    path = tmp_path_factory.mktemp("plot") / "runs.sqlite"
    devices = [
        {"temp": TEMPERATURES[0], "fields": THROTTLED, "gpm": GPM},
        {"temp": TEMPERATURES[1], "util": 40, "fields": THROTTLED, "gpm": GPM},
    ]
    with pytest.MonkeyPatch.context() as patch:
        fake_driver.Driver(tmp_path_factory.mktemp("nvml"), patch).configure(devices=devices)
        for scale in LOSS_SCALES:
            train(path, scale)
    yield path


@dataclass
class Counter:
    """A store whose counters and steps a test controls, written by the store's own writer."""

    path: Path
    walls: list[float]
    """The wall time of each sample."""


READ_MB_PER_S = 3.0
SENT_MB_PER_S = 2.0
REBOOT_AT = 6
"""The sample where the counters start again from (almost) zero."""
RESTART_AT = 10
"""The sample where the model restarts at age 0."""


@pytest.fixture
def counters(tmp_path: Path) -> Counter:
    """12 samples 1 s apart: ``resource/disk/read_mb`` (MiB since boot) grows 3 MiB/s,
    ``resource/network/bytes_sent`` 2 MiB/s, both from near 50 GiB, and both
    fall back at sample 6 (a reboot); ``train/loss`` at steps 0, 10, .., 90,
    then 0, 10 again (the model restarted); ``resource/network/bytes_received``
    has one sample only (no rate to draw)."""
    path = tmp_path / "counters.sqlite"
    writer = RunWriter(str(path), RunInfo(pid=1, command=["train"], config={}, started_at=time.time() - 30))
    base = time.monotonic_ns() - 20 * 10**9
    read, sent = 50 * 1024.0, 50 * 1024.0**3
    for i in range(12):
        if i == REBOOT_AT:
            read, sent = 1.0, 1024.0**2
        values = {
            "resource/disk/read_mb": read,
            "resource/network/bytes_sent": sent,
            "train/loss": 1.0 / (1 + i),
        }
        if i == 0:
            values["resource/network/bytes_received"] = 5e9
        step = (i if i < RESTART_AT else i - RESTART_AT) * 10
        writer.record(values, step, base + i * 10**9, None)
        read += READ_MB_PER_S
        sent += SENT_MB_PER_S * 1024.0**2
    writer.close({})
    with StoreReader(str(path)) as reader:
        walls = reader.series(1, "resource/disk/read_mb").wall_times
    return Counter(path, sorted(walls))


def panels(fig: Figure) -> dict[str, Axes]:
    """The figure's panels by their key (the Axes gid), in drawing order."""
    return {gid: ax for ax in fig.axes if (gid := ax.get_gid())}


def lines(ax: Axes) -> dict[str, Line2D]:
    return {str(line.get_gid()): line for line in ax.get_lines()}


def ys(line: Line2D) -> list[float]:
    return [float(y) for y in cast("list[float]", line.get_ydata())]


def xs(line: Line2D) -> list[float]:
    return [float(x) for x in cast("list[float]", line.get_xdata())]


def finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def draw(store: Path, run_ids: list[int | None], **kwargs: str | None) -> tuple[Figure, list[Run]]:
    with StoreReader(str(store)) as reader:
        runs = [reader.run(run_id) for run_id in run_ids]
        return plot.figure(reader, runs, **kwargs), runs  # type: ignore[arg-type]


# --------------------------------------------------------------------------- what is drawn


def test_one_run_training_on_top_then_a_panel_per_quantity_by_category(store: Path) -> None:
    fig, (run,) = draw(store, [None], pattern="*")  # every signal, the steady ones too
    assert run.id == 2  # the newest by default
    shown = panels(fig)
    keys = list(shown)
    assert keys[:2] == ["train/accuracy", "train/loss"]  # the run's own signals first
    categories = [key.split("/")[1] for key in keys[2:]]
    assert all(key.startswith("resource/") for key in keys[2:])
    # Grouped: each category's panels together, in the documented order, the loop's throughput
    # beside its own signals.
    expected = ["progress", "cpu", "memory", "network", "disk", "process", "process_tree", "gpu"]
    assert list(dict.fromkeys(categories)) == expected
    assert categories == sorted(categories, key=expected.index)
    # One panel per quantity, its unit on the y axis.
    units = {key: ax.get_ylabel() for key, ax in shown.items()}
    assert units["resource/cpu/utilization_percent"] == "%"
    # This machine's sizes and rates, each in the unit its values read in (360 B/s, 1.2 GiB/s
    # while another suite reads the disk): any of the binary units.
    assert units["resource/process/memory_in_use_mb"] in BINARY_UNITS
    assert units["resource/disk/utilization_gb"] in BINARY_UNITS
    rates = {unit + "/s" for unit in BINARY_UNITS}
    assert {units["resource/disk/read_mb"], units["resource/network/bytes_sent"]} <= rates
    assert units["resource/gpu/*/temperature_celsius"] == "°C"
    assert units["resource/gpu/*/power_watts"] == "W"
    assert units["resource/gpu/*/sm_clock_mhz"] == "MHz"
    assert units["resource/gpu/*/memory_allocated_bytes"] == "GiB"
    assert units["resource/process/cpu_threads_in_use"] == "threads"
    assert units["train/loss"] == "loss"
    assert all(ax.get_title(loc="left") for ax in shown.values())
    assert shown["resource/gpu/*/temperature_celsius"].get_title(loc="left") == "GPU temperature"
    # The step axis the loss and the resources share, labelled under each column.
    x_labels = {ax.get_xlabel() for ax in shown.values()} - {""}
    assert x_labels == {"step (model age)"}
    loss = lines(shown["train/loss"])["run2"]
    assert xs(loss)[:3] == [10.0, 20.0, 30.0] and ys(loss)[0] == pytest.approx(
        LOSS_SCALES[1] * math.exp(-0.1)
    )
    assert "runs.sqlite: run 2 · " in fig.get_suptitle()


def test_nothing_overlaps_and_the_png_is_written(store: Path, tmp_path: Path) -> None:
    fig, _ = draw(store, [1, 2])
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # type: ignore[no-untyped-call]
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    boxes = [(ax.get_gid() or "legend", ax.get_tightbbox(renderer)) for ax in fig.axes]
    for i, (a, box_a) in enumerate(boxes):
        assert box_a is not None
        assert fig.bbox.x0 <= box_a.x0 and box_a.x1 <= fig.bbox.x1 + 1, f"{a} sticks out"
        assert fig.bbox.y0 <= box_a.y0 and box_a.y1 <= fig.bbox.y1 + 1, f"{a} sticks out"
        for b, box_b in boxes[i + 1 :]:
            assert box_b is not None and not box_a.overlaps(box_b), f"{a} overlaps {b}"
    with StoreReader(str(store)) as reader:
        path = plot.render(reader, [reader.run(1)], output=tmp_path / "one.png")
    width, height = png_size(path)
    assert 1500 <= width <= 2500 and 1000 <= height <= 4000  # taller with swap, GPM and throttle time


def test_one_line_per_gpu(store: Path) -> None:
    fig, _ = draw(store, [2], pattern="resource/gpu/*")  # asked for: the flat ones drawn too
    gpu = {key: ax for key, ax in panels(fig).items() if key.startswith("resource/gpu/")}
    assert len(gpu) == GPU_PANELS
    for ax in gpu.values():
        assert {gid.rsplit("/peak", 1)[0].rsplit("/mean", 1)[0] for gid in lines(ax)} == {
            "run2/gpu0",
            "run2/gpu1",
        }
    # A reading's peak and mean between steps are drawn in its own panel, beside it.
    assert set(lines(gpu["resource/gpu/*/utilization_percent"])) == {
        f"run2/gpu{i}{kind}" for i in (0, 1) for kind in ("", "/peak", "/mean")
    }
    temperature = lines(gpu["resource/gpu/*/temperature_celsius"])
    assert set(finite(ys(temperature["run2/gpu0"]))) == {TEMPERATURES[0]}
    assert set(finite(ys(temperature["run2/gpu1"]))) == {TEMPERATURES[1]}
    # Bytes are drawn in GiB: the fake GPU has 12 GiB allocated.
    allocated = lines(gpu["resource/gpu/*/memory_allocated_bytes"])
    assert set(finite(ys(allocated["run2/gpu0"]))) == {12.0}
    # The two devices are told apart by colour and by dash, and named in the key.
    a, b = temperature["run2/gpu0"], temperature["run2/gpu1"]
    assert a.get_color() != b.get_color() and a.get_linestyle() != b.get_linestyle()
    legend = [text.get_text() for ax in fig.axes if (lg := ax.get_legend()) for text in lg.get_texts()]
    assert legend == ["GPU 0", "GPU 1", "peak since the previous step", "mean since the previous step"]


def test_two_runs_overlaid_one_colour_per_run(store: Path) -> None:
    fig, runs = draw(store, [1, 2], pattern="*")  # this machine's CPU may have kept one value
    shown = panels(fig)
    loss = lines(shown["train/loss"])
    assert set(loss) == {"run1", "run2"}
    assert loss["run1"].get_color() != loss["run2"].get_color()
    assert ys(loss["run1"])[0] == pytest.approx(LOSS_SCALES[0] * math.exp(-0.1))
    assert ys(loss["run2"])[0] == pytest.approx(LOSS_SCALES[1] * math.exp(-0.1))
    cpu = lines(shown["resource/cpu/utilization_percent"])
    assert cpu["run1"].get_color() == loss["run1"].get_color()
    assert cpu["run2"].get_color() == loss["run2"].get_color()
    gpu = lines(shown["resource/gpu/*/temperature_celsius"])
    assert set(gpu) == {"run1/gpu0", "run1/gpu1", "run2/gpu0", "run2/gpu1"}
    assert gpu["run1/gpu1"].get_color() == loss["run1"].get_color()  # colour: the run; dash: the device
    assert gpu["run1/gpu0"].get_linestyle() != gpu["run1/gpu1"].get_linestyle()
    legend = [text.get_text() for ax in fig.axes if (lg := ax.get_legend()) for text in lg.get_texts()]
    assert legend[:2] == [plot.describe(run) for run in runs]
    assert legend[0].startswith("run 1 · ") and time.strftime("%Y-%m-%d", time.localtime()) in legend[0]
    assert legend[2:] == ["GPU 0", "GPU 1", "peak since the previous step", "mean since the previous step"]
    assert "runs 1, 2" in fig.get_suptitle()


def test_x_in_seconds_since_the_run_started(store: Path) -> None:
    by_step, _ = draw(store, [2], pattern="*")  # a CPU at 100 % all run is drawn all the same
    by_seconds, (run,) = draw(store, [2], x="seconds", pattern="*")
    with StoreReader(str(store)) as reader:
        cpu = reader.series(run.id, "resource/cpu/utilization_percent")
    step_line = lines(panels(by_step)["resource/cpu/utilization_percent"])["run2"]
    seconds_line = lines(panels(by_seconds)["resource/cpu/utilization_percent"])["run2"]
    assert xs(step_line) == [float(s) for s in cpu.steps]
    assert xs(seconds_line) == pytest.approx([w - run.started_at for w in cpu.wall_times])
    assert max(xs(seconds_line)) <= run.duration + 1 < max(xs(step_line))  # ages ran 10 per iteration
    assert ys(seconds_line) == ys(step_line)
    x_labels = {ax.get_xlabel() for ax in panels(by_seconds).values()} - {""}
    assert x_labels == {"seconds since the run started"}


def test_counters_are_drawn_as_rates_and_a_counter_that_went_back_is_a_gap(counters: Counter) -> None:
    fig, _ = draw(counters.path, [None], pattern="resource/")  # its steady rates asked for: drawn
    shown = panels(fig)
    read = ys(lines(shown["resource/disk/read_mb"])["run1"])
    sent = ys(lines(shown["resource/network/bytes_sent"])["run1"])
    for rates, per_second in ((read, READ_MB_PER_S), (sent, SENT_MB_PER_S)):
        # 12 readings: no rate for the first, a gap where the counter fell back.
        assert len(finite(rates)) == 10 and math.isnan(rates[REBOOT_AT - 1])
        assert all(rate >= 0 for rate in finite(rates))
        assert finite(rates) == pytest.approx([per_second] * 10, rel=0.01)  # not ~51,200 (the count)
    assert shown["resource/disk/read_mb"].get_ylim()[0] == 0
    # One reading of a counter is no rate: no panel.
    assert "resource/network/bytes_received" not in shown


def test_each_panel_is_in_the_unit_its_values_read_in_and_a_flat_one_is_drawn_from_0(tmp_path: Path) -> None:
    """A CPU-only run's network moved 360 B/s: drawn in B/s, not at 0.00035 MiB/s; 23,000 MiB
    free is 22.5 GiB; a thread count that stayed 3 is a line at 3 over whole ticks from 0, not
    in 2.85-3.15."""
    path = tmp_path / "units.sqlite"
    writer = RunWriter(str(path), RunInfo(pid=1, command=["train"], config={}, started_at=time.time() - 30))
    base = time.monotonic_ns() - 20 * 10**9
    for i in range(10):
        values = {
            "resource/network/bytes_sent": 1e6 + 360.0 * i,
            "resource/disk/read_mb": 100.0 + 3.0 * i,
            "resource/process/cpu_threads_in_use": 3.0,
            "resource/process/memory_available_mb": 23000.0 + i,
        }
        writer.record(values, i, base + i * 10**9, None)
    writer.close({})
    fig, _ = draw(path, [None], pattern="resource/")  # asked for: the steady ones drawn too
    FigureCanvasAgg(fig).draw()
    shown = panels(fig)
    sent, read = shown["resource/network/bytes_sent"], shown["resource/disk/read_mb"]
    assert sent.get_ylabel() == "B/s" and finite(ys(lines(sent)["run1"])) == pytest.approx([360.0] * 9)
    assert read.get_ylabel() == "MiB/s" and finite(ys(lines(read)["run1"])) == pytest.approx([3.0] * 9)
    free = shown["resource/process/memory_available_mb"]
    assert free.get_ylabel() == "GiB" and ys(lines(free)["run1"])[0] == pytest.approx(23000 / 1024)
    threads = shown["resource/process/cpu_threads_in_use"]
    low, high = threads.get_ylim()
    assert low == 0 and 3 < high < 5
    ticks = [t for t in threads.get_yticks() if low <= t <= high]
    assert ticks and all(t == round(t) for t in ticks), ticks


def steady_store(path: Path, runs: list[dict[str, float]], moving: bool = True) -> Path:
    """One run per item of ``runs``, 10 samples each: the item's signals keep the one value it
    gives them, and (``moving``) the loss and the process CPU move."""
    for held in runs:
        writer = RunWriter(
            str(path), RunInfo(pid=1, command=["train"], config={}, started_at=time.time() - 30)
        )
        base = time.monotonic_ns() - 20 * 10**9
        for i in range(10):
            values = {"train/loss": 1.0 / (i + 1), "resource/process/cpu_utilization_percent": 50.0 + i}
            writer.record({**(values if moving else {}), **held}, i, base + i * 10**9, None)
        writer.close({})
    return path


def unchanged_line(fig: Figure) -> str | None:
    said = [text.get_text() for text in fig.findobj(Text) if text.get_gid() == plot.UNCHANGED]
    assert len(said) <= 1
    return said[0] if said else None


def test_a_signal_that_kept_one_value_is_named_under_the_figure_not_drawn(tmp_path: Path) -> None:
    """Issue 30's first hour: a CPU-only run drew a row of flat lines (the CPUs allowed, a network
    that never moved). Each is said in one line instead, with its value and unit; the loop's
    signals, what a pattern asks for, and what differs between runs are still drawn."""
    held = {"resource/process/cpu_cores_allowed": 2.0, "resource/process/cpu_threads_in_use": 4.0,
            "resource/progress/steps_per_second": 7.0}  # fmt: skip
    path = steady_store(tmp_path / "steady.sqlite", [held])
    fig, _ = draw(path, [None])
    shown = panels(fig)
    assert set(shown) == {"train/loss", "resource/process/cpu_utilization_percent",
                          "resource/progress/steps_per_second"}  # fmt: skip
    said = unchanged_line(fig)
    assert said is not None and said.replace("\n", " ") == (
        "the same throughout, not drawn: process threads: 4 threads; process CPUs allowed: 2 cores"
    )
    # Asked for by a pattern: drawn, flat.
    asked, _ = draw(path, [None], pattern="resource/process/*")
    assert set(panels(asked)) == {
        f"resource/process/{name}"
        for name in ("cpu_utilization_percent", "cpu_threads_in_use", "cpu_cores_allowed")
    }
    assert unchanged_line(asked) is None
    # Two runs: one value in both is said once; a value that differs between them is drawn.
    both = steady_store(tmp_path / "both.sqlite", [held, {**held, "resource/process/cpu_cores_allowed": 8.0}])
    overlaid, _ = draw(both, [1, 2])
    assert "resource/process/cpu_cores_allowed" in panels(overlaid)
    said = unchanged_line(overlaid)
    assert said is not None and said.replace("\n", " ") == (
        "the same in every run, throughout, not drawn: process threads: 4 threads"
    )
    # Nothing but steady signals: drawn all the same.
    alone = steady_store(
        tmp_path / "alone.sqlite", [{"resource/process/cpu_cores_allowed": 2.0}], moving=False
    )
    fig, _ = draw(alone, [None])
    assert set(panels(fig)) == {"resource/process/cpu_cores_allowed"} and unchanged_line(fig) is None


def test_the_line_naming_the_steady_signals_fits_the_figure(store: Path) -> None:
    """Two fake GPUs read the same power, clocks and memory all run: a long line, wrapped within
    the figure's width (its first version ran off both edges)."""
    fig, _ = draw(store, [2])
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # type: ignore[no-untyped-call]
    (said,) = [text for text in fig.findobj(Text) if text.get_gid() == plot.UNCHANGED]
    assert "GPU power limit" in said.get_text() and said.get_text().count("\n") >= 1
    box = said.get_window_extent(canvas.get_renderer())  # type: ignore[no-untyped-call]
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0, (box, fig.bbox)
    lowest = min(ax.get_tightbbox(canvas.get_renderer()).y0 for ax in fig.axes)  # type: ignore[no-untyped-call]
    assert box.y1 <= lowest, "the line overlaps the panels"


def test_the_loops_throughput_shares_the_training_row_and_resources_start_the_next() -> None:
    categories = ["training", "training", "progress", "cpu", "memory", "disk", "disk"]
    cells = plot.layout(categories)
    assert cells[:3] == [(0, 0), (0, 1), (0, 2)]
    assert cells[3:] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert LOOP == ("training", "progress")


def test_a_model_that_restarted_leaves_a_gap_not_a_line_back(counters: Counter) -> None:
    fig, _ = draw(counters.path, [None])
    loss = lines(panels(fig)["train/loss"])["run1"]
    points = list(zip(xs(loss), ys(loss), strict=True))
    drawn = [(x, y) for x, y in points if math.isfinite(y)]
    assert len(drawn) == 12
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if math.isfinite(y0) and math.isfinite(y1):
            assert x1 >= x0, "a segment drawn backwards along the step axis"
    assert sum(math.isnan(y) for _, y in points) == 1


def test_a_lines_points_are_in_time_order_scaled_and_broken_where_the_step_went_back() -> None:
    run = cast(Run, SimpleNamespace(started_at=0.5))
    (gauge,) = chosen([catalogue.name_of(catalogue.CPU_UTILIZATION)])
    read = Series(gauge.key, [20, 0, 10, 0], [2.0, 0.0, 1.0, 3.0], [30.0, 10.0, 20.0, math.nan])
    by_step = prepared(read, run, "step", gauge)
    assert np.array_equal(by_step, [[0, 10, 20, 0, 0], [10, 20, 30, math.nan, math.nan]], equal_nan=True)
    by_seconds = prepared(read, run, "seconds", gauge)
    assert np.array_equal(by_seconds, [[-0.5, 0.5, 1.5, 2.5], [10, 20, 30, math.nan]], equal_nan=True)
    # A counter in bytes, drawn as MiB/s: the reading at the same instant as the one before is
    # left out, the first has no rate, and the step that went back breaks the line.
    (counter,) = chosen([catalogue.name_of(catalogue.NETWORK_SENT)])
    mib = float(catalogue.MIB)
    sent = Series(counter.key, [0, 1, 2, 0, 1], [0.0, 1.0, 1.0, 2.0, 3.0], [v * mib for v in (0, 1, 5, 3, 5)])
    assert np.array_equal(
        prepared(sent, run, "step", counter), [[1, 0, 0, 1], [1, math.nan, 2, 2]], equal_nan=True
    )


def test_a_pattern_selects_signals(store: Path) -> None:
    assert matches("resource/gpu/1/power_watts", "resource/gpu/*")
    assert not matches("train/gpu_loss", "resource/gpu/*")  # a glob spans the whole name
    assert matches("train/loss", "loss") and not matches("train/loss", "Loss")  # substring
    assert matches("anything", None)
    gpu, _ = draw(store, [2], pattern="resource/gpu/*")
    assert len(panels(gpu)) == GPU_PANELS and all(key.startswith("resource/gpu/*/") for key in panels(gpu))
    loss, _ = draw(store, [2], pattern="loss")
    assert list(panels(loss)) == ["train/loss"]
    device, _ = draw(store, [2], pattern="gpu/1/temp")
    (only,) = panels(device).values()
    assert set(lines(only)) == {"run2/gpu1"}


def test_nothing_to_draw_is_a_value_error(store: Path) -> None:
    with pytest.raises(ValueError, match=r"no signal of run 2 matches 'nope\*'"):
        draw(store, [2], pattern="nope*")
    with pytest.raises(ValueError, match="x must be one of step, seconds"):
        draw(store, [2], x="hours")
    with StoreReader(str(store)) as reader, pytest.raises(ValueError, match="no run"):
        plot.figure(reader, [])


def test_import_sampler_never_imports_matplotlib() -> None:
    code = (
        "import sys, sampler, sampler.commands, sampler.commands.plot, sampler.views.plot\n"
        "print('matplotlib' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# --------------------------------------------------------------------------- the command


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def run(*argv: str) -> tuple[int, str]:
    """``plot *argv`` through the dispatcher's parser."""
    return run_command("plot", *argv, handler=command.main)


def test_plot_writes_the_newest_run_beside_the_working_directory(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    status, out = run(str(store))
    assert status == 0 and out == "runs-run2.png\n"
    assert png_size(tmp_path / "runs-run2.png")[0] > 1000
    status, out = run(str(store), "--run", "1", "--run", "2", "--signals", "loss", "--x", "seconds")
    assert status == 0 and out == "runs-run1-run2.png\n"
    small = png_size(tmp_path / "runs-run1-run2.png")
    assert small[1] < png_size(tmp_path / "runs-run2.png")[1]  # one panel, not thirty
    status, out = run(str(store), "--run", "1", "-o", str(tmp_path / "first.png"))
    assert status == 0 and out == f"{tmp_path / 'first.png'}\n" and (tmp_path / "first.png").is_file()


@pytest.mark.parametrize(
    "case, message",
    [
        ("no such store", "no run store at"),
        ("not a store", "is not a run store (file is not a database)"),
        ("no such run", "has no run 7"),
        ("nothing matches", "no signal of run 2 matches 'zzz'"),
        ("unwritable output", "cannot write"),
    ],
)
def test_errors_are_one_line_with_status_2(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    argv = {
        "no such store": [str(tmp_path / "missing.sqlite")],
        "not a store": [__file__],
        "no such run": [str(store), "--run", "1", "--run", "7"],
        "nothing matches": [str(store), "--signals", "zzz"],
        "unwritable output": [str(store), "-o", str(tmp_path / "no" / "such" / "dir.png")],
    }[case]
    status, out = run(*argv)
    err = capsys.readouterr().err
    assert status == 2 and out == ""
    assert err.startswith("python -m sampler plot: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_without_matplotlib_the_message_names_the_extra(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    status, _ = run(str(store), "-o", str(tmp_path / "x.png"))
    err = capsys.readouterr().err
    assert status == 2 and "pip install 'wl-resource-monitor[plot]'" in err and err.count("\n") == 1
    assert not (tmp_path / "x.png").exists()


def test_python_m_sampler_plot(store: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sampler", "plot", str(store), "--run", "1", "--signals", "resource/gpu/*"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "runs-run1.png\n" and png_size(tmp_path / "runs-run1.png")[0] > 1000
    missing = subprocess.run(
        [sys.executable, "-m", "sampler", "plot", str(tmp_path / "none.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert missing.returncode == 2 and "no run store at" in missing.stderr


def test_a_rank_of_a_multi_rank_job_is_named_in_its_legend() -> None:
    alone = Run(1, 0.0, 60.0, 60.0, "node-7", 42, [], {}, "0.1.0", None)
    rank = dataclasses.replace(alone, rank=3, local_rank=1, world_size=8, local_world_size=2)
    assert plot.describe(alone).endswith(" · node-7")
    assert plot.describe(rank).endswith(" · node-7 rank 3/8")


def test_a_spike_does_not_squash_a_training_curve() -> None:
    descent = [2.0 - 0.01 * i for i in range(150)]
    low, high = plot.robust_limits([100.0, *descent])
    assert high < 3 and low < min(descent)
    assert plot.robust_limits(descent) is None  # no spike: the full range
    assert plot.robust_limits([5.0, 1.0]) is None  # too few points to call one a spike


@pytest.fixture
def phased(tmp_path: Path) -> Path:
    """Two runs of 8 records, each with the step's phase shares (input 60, forward 10, backward
    20, optimizer 5, other 5) and the mean step time."""
    path = tmp_path / "phases.sqlite"
    shares = dict(zip(catalogue.PHASE_SHARES, (60.0, 10.0, 20.0, 5.0, 5.0), strict=True))
    for _ in range(2):
        writer = RunWriter(
            str(path), RunInfo(pid=1, command=["train"], config={}, started_at=time.time() - 9)
        )
        base = time.monotonic_ns() - 9 * 10**9
        for i in range(8):
            values = {signal.name: share for signal, share in shares.items()}
            values[catalogue.STEP_SECONDS.name] = 0.1
            writer.record(values, 10 * (i + 1), base + i * 10**9, None)
        writer.close({})
    return path


def test_the_steps_phases_are_stacked_in_one_panel_for_one_run(phased: Path) -> None:
    fig, _ = draw(phased, [1])
    shown = panels(fig)
    assert not {signal.name for signal in catalogue.PHASE_SHARES} & set(shown)
    stacked = shown[PHASES_KEY]
    areas = {str(area.get_gid()): area for area in stacked.collections}
    labels = [label for _, label, _ in catalogue.STEP_PHASES]
    assert list(areas) == [f"run1/{label}" for label in labels]
    assert stacked.get_ylim() == (0, 125) and max(stacked.get_yticks()) == 100  # the key above 100 %
    legend = stacked.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == labels
    assert catalogue.STEP_SECONDS.name in shown


def test_the_phases_of_two_runs_are_lines_coloured_by_phase_dashed_by_run(phased: Path) -> None:
    fig, _ = draw(phased, [1, 2])
    drawn = lines(panels(fig)[PHASES_KEY])
    labels = [label for _, label, _ in catalogue.STEP_PHASES]
    assert set(drawn) == {f"run{run}/{label}" for run in (1, 2) for label in labels}
    first, second = drawn[f"run1/{labels[0]}"], drawn[f"run2/{labels[0]}"]
    assert first.get_color() == second.get_color() and first.get_linestyle() != second.get_linestyle()
    assert ys(first) == [60.0] * 8
    legend = panels(fig)[PHASES_KEY].get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == labels
