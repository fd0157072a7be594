"""``explain`` on real runs: a training loop made slow by real causes, each stretch named by its own.

Each backend is a real training-like script (a fixed amount of Python work per step, its step
watched by the monitor, a run store) whose main thread is pinned to one core after the monitor
started. It injects its causes itself and writes down when each began and ended (wall time), so
the test can match what ``explain`` found against what really happened.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cgroups import cgroup_skip_reason, memory_cgroup, swap_file, swap_skip_reason
from conftest import backend_script, run_command

from sampler.analysis import evidence, stretches
from sampler.analysis.explain import Explanation, explain
from sampler.commands import explain as explain_command
from sampler.commands import plot as plot_command
from sampler.settings.placement import Placement
from sampler.store.reader import StoreReader
from sampler.store.writer import RunInfo, RunWriter
from sampler.views import plot

WORKLOAD = """
import json, os, subprocess, time
STORE, PHASES_FILE, PLAN, SWAP_MB = {store!r}, {phases!r}, {plan!r}, {swap_mb!r}

class Model:
    age = 0
    def get_age(self):
        return self.age

model = Model()
sampler.watch_model(model)
monitor = sampler.ResourceMonitor(
    store=STORE, interval_seconds=0.1, _min_interval_seconds=0.05, step_source="model_age",
    categories=["cpu", "memory", "process", "process_tree", "container", "pressure"],
).start()
while monitor.stats()["records_read"] < 3:
    time.sleep(0.01)
core = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {{core}})  # this thread only: the monitor's stays free

def step(extra=None):
    total = 0
    for i in range(20000):
        total += i
    if extra is not None:
        extra()
    model.age += 1

def train(seconds, extra=None):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        step(extra)

CHECKPOINT = os.urandom(4 << 20)

def fsync_write():
    with open(os.path.join(os.path.dirname(STORE), "checkpoint.bin"), "wb") as f:
        f.write(CHECKPOINT)
        f.flush()
        os.fsync(f.fileno())

def read_cyclically(path, chunk=4 << 20):
    offset = [0]
    size = os.path.getsize(path)
    def read():
        with open(path, "rb") as f:
            f.seek(offset[0])
            f.read(chunk)
        offset[0] = (offset[0] + chunk) % size
    return read

phases = []
for kind, seconds in PLAN:
    start = time.time()
    if kind == "quiet":
        train(seconds)
    elif kind == "cpu":  # four busy processes on the training's core
        spin = "import os; os.sched_setaffinity(0, {{%d}})\\nwhile 1: pass" % core
        busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(4)]
        try:
            train(seconds)
        finally:
            for p in busy:
                p.kill()
                p.wait()
    elif kind == "pause":  # an evaluation: time passes, the step stands still
        time.sleep(seconds)
    elif kind == "fsync":  # every step writes a checkpoint and waits for the disk
        train(seconds, fsync_write)
    elif kind == "thrash":  # every step reads data that no longer fits the memory cgroup's page cache
        train(seconds, read_cyclically(os.path.join(os.path.dirname(STORE), "data.bin")))
    elif kind == "swap":  # the step's data outgrew the memory cgroup: each step pages some back in
        held = bytearray(SWAP_MB << 20)
        held[::4096] = b"\x01" * len(range(0, len(held), 4096))  # every page written: swapped, not zero
        start = time.time()  # the phase begins once the data is in: filling it is a pause of its own
        chunk = [0]
        def touch_next():
            first = chunk[0]
            held[first : first + (1 << 20) : 4096] = b"\x02" * 256
            chunk[0] = (first + (1 << 20)) % len(held)
        train(seconds, touch_next)
        del held
    phases.append((kind, start, time.time()))
train(0.5)
monitor.stop()
with open(PHASES_FILE, "w") as f:
    json.dump(phases, f)
"""


def run_workload(
    tmp_path: Path, plan: list[tuple[str, float]], before_start: Any = None, swap_mb: int = 0
) -> list[Any]:
    """Run the workload with ``plan`` to its end; returns its phases: (kind, start, end) wall times.
    ``before_start(pid)`` runs on the backend's pid as soon as it exists (to move it into a cgroup);
    ``swap_mb``: what a ``swap`` phase holds and sweeps."""
    store, phases = tmp_path / "runs.sqlite", tmp_path / "phases.json"
    script = tmp_path / "train.py"
    script.write_text(
        backend_script(WORKLOAD.format(store=str(store), phases=str(phases), plan=plan, swap_mb=swap_mb))
    )
    backend = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True)
    try:
        if before_start is not None:
            before_start(backend.pid)
        _, err = backend.communicate(timeout=120)
    finally:
        backend.kill()
        backend.wait()
    assert backend.returncode == 0, err
    return [tuple(phase) for phase in json.loads(phases.read_text())]


def explained(tmp_path: Path) -> Explanation:
    with StoreReader(str(tmp_path / "runs.sqlite")) as reader:
        return explain(reader, reader.run())


def typical_cpu_wait(tmp_path: Path, phases: list[Any]) -> float:
    """The backend's CPU wait (%) in the run's quiet phases, median."""
    with StoreReader(str(tmp_path / "runs.sqlite")) as reader:
        wait = reader.series(reader.run().id, "resource/process/cpu_wait_percent")
    quiet = [(start, end) for kind, start, end in phases if kind == "quiet"]
    values = [
        v for w, v in zip(wait.wall_times, wait.values, strict=True) if any(a <= w <= b for a, b in quiet)
    ]
    return float(statistics.median(values))


def overlapping(explanation: Explanation, start: float, end: float) -> list[Any]:
    """The stretches that overlap the wall-time span [start, end]."""
    return [e for e in explanation.stretches if e.stretch.start_wall < end and e.stretch.end_wall > start]


OUTSIDE_LOAD = {"cpu_pressure", "io_pressure", "memory_pressure", "cpu_starved", "host_cpu_busy"}
"""What other processes on a shared machine show as, to a run that did nothing different."""


@pytest.mark.usefixtures("whole_machine")
def test_a_starved_stretch_a_pause_and_an_fsync_stall_are_each_named_by_their_cause(tmp_path: Path) -> None:
    plan = [
        ("quiet", 2.0),
        ("cpu", 2.5),
        ("quiet", 2.0),
        ("pause", 1.5),
        ("quiet", 2.0),
        ("fsync", 2.5),
        ("quiet", 1.5),
    ]
    phases = run_workload(tmp_path, plan)
    explanation = explained(tmp_path)
    print(explain_command.render(explanation))
    # Each cause is found where it was injected, and named: a loaded machine may cut a stretch in
    # two, never name it wrong.
    causes = {"cpu": {"cpu_starved", "cpu_pressure"}, "fsync": {"io_pressure"}}
    seen = set()
    for kind, start, end in phases:
        if kind == "quiet":
            continue
        found = overlapping(explanation, start, end)
        if not found and kind == "cpu":
            # Nor no stretch: where the backend waited for a CPU all along (a machine saturated by
            # other runs), the starved phase did not slow it below its typical pace.
            assert typical_cpu_wait(tmp_path, phases) >= 40, "nothing found for the cpu stretch"
            continue
        assert found, f"nothing found for the {kind} stretch"
        for item in found:
            seen.add(id(item))
            if kind == "pause":
                assert item.stretch.kind == stretches.PAUSE and item.stretch.still_seconds >= 1.0
            elif kind == "cpu" and not item.reasons:
                # No evidence is no wrong answer: on a machine whose every core is already busy the
                # backend waited for a CPU all along, and the starvation was not what changed.
                assert typical_cpu_wait(tmp_path, phases) >= 40, (kind, item)
            elif kind == "fsync" and not item.reasons:
                # Nor where a starved machine slowed the windows around the stall into one stretch
                # more than twice its length: the stall's I/O pressure no longer moves the stretch's
                # median (seen beside two busy loops: 2.5 s of it inside a 5.6 s stretch).
                seconds = item.stretch.end_wall - item.stretch.start_wall
                assert seconds > 2 * (end - start), (kind, item)
            else:  # named among the reasons: on a busy host a stalled step also waits for a CPU
                assert item.stretch.kind == stretches.SLOW and item.reasons, kind
                assert causes[kind] & {reason.cause for reason in item.reasons}, (kind, item.reasons)
    # Nothing else: a quiet stretch is reported only where other test workers slowed it, and is
    # then blamed on the contention they make.
    for item in explanation.stretches:
        if id(item) not in seen:
            causes = {reason.cause for reason in item.reasons}
            assert causes and causes <= OUTSIDE_LOAD, item
    # plot --explain shades the same stretches on every panel, with a legend for each kind.
    with StoreReader(str(tmp_path / "runs.sqlite")) as reader:
        fig = plot.figure(reader, [reader.run()], shade=[e.stretch for e in explanation.stretches])
    panels = [ax for ax in fig.axes if ax.get_gid()]
    for ax in panels:  # the slow stretches as spans, the pause (a few steps wide) as a line
        marked = [
            artist.get_gid()
            for artist in [*ax.patches, *ax.lines]
            if str(artist.get_gid()).startswith("explain/")
        ]
        assert sorted(marked) == sorted(f"explain/{e.stretch.kind}" for e in explanation.stretches), marked
    assert panels
    labels = {
        text.get_text()
        for legend in fig.legends + [ax.get_legend() for ax in fig.axes]
        if legend
        for text in legend.get_texts()
    }
    assert {"slow stretch (explain)", "step stood still (explain)"} <= labels
    status, printed = run_command(
        "plot",
        str(tmp_path / "runs.sqlite"),
        "--explain",
        "-o",
        str(tmp_path / "run.png"),
        handler=plot_command.main,
    )
    assert status == 0 and printed.strip() == str(tmp_path / "run.png")
    assert (tmp_path / "run.png").stat().st_size > 10_000


@pytest.mark.usefixtures("whole_machine")
def test_a_quiet_run_has_nothing_to_explain(tmp_path: Path) -> None:
    run_workload(tmp_path, [("quiet", 4.0)])
    explanation = explained(tmp_path)
    assert explanation.records >= 20 and explanation.typical > 0
    # The other test workers run beside it: a stretch they slowed is reported, and must then
    # be blamed on the contention they make, never on the workload's own signals.
    for found in explanation.stretches:
        causes = {reason.cause for reason in found.reasons}
        assert causes and causes <= OUTSIDE_LOAD, found
    if not explanation.stretches:
        status, out = run_command("explain", str(tmp_path / "runs.sqlite"), handler=explain_command.main)
        assert status == 0 and "No stretch ran well below that" in out


@pytest.mark.skipif(cgroup_skip_reason("memory") is not None, reason=str(cgroup_skip_reason("memory")))
@pytest.mark.usefixtures("whole_machine")
def test_reclaim_in_a_memory_cgroup_near_its_limit_is_named(tmp_path: Path) -> None:
    """The data each step reads no longer fits beside the backend and its child in the cgroup's
    limit: every read evicts what the next will need, and the backend reclaims as it reads."""
    data = tmp_path / "data.bin"
    with data.open("wb") as f:
        for _ in range(64):
            f.write(os.urandom(4 << 20))
        f.flush()
        os.fsync(f.fileno())
        # Out of the page cache: the backend's reads bring it back in, charged to its cgroup.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    with memory_cgroup(160 << 20) as cgroup:
        phases = run_workload(tmp_path, [("quiet", 2.5), ("thrash", 3.0), ("quiet", 2.0)], cgroup.add)
    explanation = explained(tmp_path)
    print(explain_command.render(explanation))
    (_, start, end) = phases[1]
    (item,) = overlapping(explanation, start, end)
    assert item.stretch.kind == stretches.SLOW
    causes = [reason.cause for reason in item.reasons]
    assert "container_memory" in causes or "memory_pressure" in causes, causes


@pytest.mark.usefixtures("whole_machine")
def test_a_backend_whose_memory_outgrew_its_cgroup_and_swaps_is_named(tmp_path: Path) -> None:
    """With swap on and a memory cgroup of 160 MiB, the backend holds 192 MiB and each step writes
    the next 1 MiB of it: pages come back from swap as others go out."""
    reason = swap_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with swap_file(512 << 20), memory_cgroup(160 << 20, swap_bytes=512 << 20) as cgroup:
        plan = [("quiet", 2.5), ("swap", 3.0), ("quiet", 2.0)]
        phases = run_workload(tmp_path, plan, cgroup.add, swap_mb=192)
    explanation = explained(tmp_path)
    print(explain_command.render(explanation))
    (_, start, end) = phases[1]
    items = overlapping(explanation, start, end)
    assert any(item.stretch.kind == stretches.SLOW for item in items), items
    causes = [reason.cause for item in items for reason in item.reasons]
    assert "swap" in causes, causes
    with StoreReader(str(tmp_path / "runs.sqlite")) as reader:
        names = set(reader.names(reader.run().id))
    assert {"resource/memory/swap_used_mb", "resource/memory/swapped_out_mb_per_second"} <= names


# --------------------------------------------------------------------------- the rules, on made-up records


def timeline(seconds_per_window: list[float], steps_per_window: list[int], **columns: list[float]) -> Any:
    """A timeline whose windows last and advance as given (the first record opens the first window)."""
    import numpy as np

    from sampler.analysis.timeline import Timeline

    walls = np.cumsum([1000.0, *seconds_per_window])
    steps = np.cumsum([0, *steps_per_window]).astype(np.int64)
    values = {name: np.array([np.nan, *column]) for name, column in columns.items()}
    return Timeline(steps, walls, values, interval=0.1)


def test_slow_windows_in_a_row_make_a_stretch_and_a_lone_one_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stretches, "MIN_SECONDS", 0.0)  # these windows are 0.1 s: see the end
    seconds = [0.1] * 30
    steps = [50] * 30
    steps[5] = 10  # one slow window alone: noise
    for i in range(12, 17):
        steps[i] = 20  # five in a row (40 % of typical)
    steps[14] = 40  # one near-normal window inside does not break them
    found = stretches.find(timeline(seconds, steps))
    assert found.typical == pytest.approx(500.0)
    (stretch,) = found.stretches
    assert (stretch.kind, stretch.first, stretch.last) == (stretches.SLOW, 13, 17)
    assert stretch.throughput == pytest.approx((20 * 4 + 40) / 0.5)
    assert not found.regular[13:18].any() and found.regular[1:5].all()
    monkeypatch.undo()  # half a second of slow windows is no stretch: a busy host's jitter can do that
    assert stretches.find(timeline(seconds, steps)).stretches == []


def test_one_long_window_with_almost_no_steps_is_a_pause_but_a_run_of_them_is_a_slowdown() -> None:
    seconds, steps = [0.1] * 20, [50] * 20
    seconds[8], steps[8] = 2.0, 50  # the step stood still ~1.9 s between two records
    found = stretches.find(timeline(seconds, steps))
    (pause,) = found.stretches
    assert pause.kind == stretches.PAUSE and pause.still_seconds == pytest.approx(1.9)
    # Steps slower than the interval: every window long, but each one moved: slow, not paused.
    seconds, steps = [0.1] * 20, [50] * 20
    for i in range(8, 13):
        seconds[i], steps[i] = 0.5, 1
    (slow,) = stretches.find(timeline(seconds, steps)).stretches
    assert slow.kind == stretches.SLOW and (slow.first, slow.last) == (9, 13)


def test_a_pause_between_slow_windows_is_a_pause_and_breaks_them_in_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stretches, "MIN_SECONDS", 0.0)  # these windows are 0.1 s
    seconds, steps = [0.1] * 30, [50] * 30
    for i in (*range(5, 9), *range(10, 14)):
        steps[i] = 10  # slow on both sides of the pause (a busy host around an evaluation)
    seconds[9], steps[9] = 2.0, 50
    found = stretches.find(timeline(seconds, steps))
    kinds = [(s.kind, s.first, s.last) for s in found.stretches]
    assert kinds == [(stretches.SLOW, 6, 9), (stretches.PAUSE, 10, 10), (stretches.SLOW, 11, 14)], kinds


def test_too_few_records_or_no_progress_find_nothing() -> None:
    assert stretches.find(timeline([], [])).stretches == []
    assert stretches.find(timeline([0.1] * 5, [0] * 5)).stretches == []


def reasons_with(**columns: list[float]) -> list[evidence.Reason]:
    """The reasons the rules give for windows 13-17 slow against columns of 30 windows."""
    seconds, steps = [0.25] * 30, [125] * 30
    for i in range(12, 17):
        steps[i] = 25
    records = timeline(seconds, steps, **columns)
    found = stretches.find(records)
    (stretch,) = found.stretches
    return evidence.reasons(records, found, stretch)


def reasons_for(**columns: list[float]) -> list[str]:
    """The causes of ``reasons_with``, strongest first."""
    return [reason.cause for reason in reasons_with(**columns)]


def during(inside: float, outside: float) -> list[float]:
    return [inside if 12 <= i < 17 else outside for i in range(30)]


def test_each_rule_fires_on_its_signals_and_is_ranked_by_how_far_past_its_threshold() -> None:
    assert reasons_for() == []  # nothing recorded: no evidence, no guess
    cpu = "resource/pressure/cpu_some_percent"
    assert reasons_for(**{cpu: during(60, 2)}) == ["cpu_pressure"]
    assert reasons_for(**{cpu: during(9, 2)}) == []  # up 7 points: below the threshold
    wait = "resource/process/cpu_wait_percent"
    assert reasons_for(**{wait: during(70, 5), cpu: during(60, 40)}) == ["cpu_starved", "cpu_pressure"]
    assert reasons_for(**{"resource/pressure/io_some_percent": during(70, 1)}) == ["io_pressure"]
    memory = {"resource/container/memory_used_percent": during(97, 60)}
    assert reasons_for(**memory) == ["container_memory"]
    tree = {
        "resource/process_tree/cpu_utilization_percent": during(390, 200),
        "resource/process/cpu_cores_allowed": during(4, 4),
    }
    assert reasons_for(**tree) == ["workers_saturated"]
    gil = {"resource/process/cpu_utilization_percent": during(100, 300)}
    assert reasons_for(**gil) == ["gil_bound"]
    gpu = {
        "resource/gpu/1/throttle_power": during(1, 0),
        "resource/gpu/1/utilization_percent": during(40, 95),
    }
    assert reasons_for(**gpu) == ["gpu_power_throttle", "gpu_waiting"]
    brake = "resource/gpu/1/throttled_hw_power_brake_seconds_per_second"
    counted = {**gpu, brake: during(0.45, 0.02)}  # the driver's count: the sampled bitmask is not asked
    assert reasons_for(**counted) == ["gpu_hw_power_brake_throttle", "gpu_waiting"]
    (text, _) = [r.text for r in reasons_with(**counted)]
    assert "power brake 45% of the time (typically 2%)" in text
    assert reasons_for(**{brake: during(0.15, 0.02)}) == []  # up 13 points: below the threshold
    collective = {  # NVML's utilization reads 100% while a kernel waits in a collective; GPM does not
        "resource/gpu/0/utilization_percent": during(100, 100),
        "resource/gpu/0/sm_activity_percent": during(12, 80),
    }
    (waiting,) = reasons_with(**collective)
    assert (
        waiting.cause == "gpu_waiting" and "its SMs were busy 12% of the time (typically 80%)" in waiting.text
    )
    power = "resource/gpu/0/energy_joules_per_second"  # the mean power the energy counter gives
    (waiting,) = reasons_with(**collective, **{power: during(180, 640)})
    assert "drawing 180 W (typically 640 W): it waited for work" in waiting.text
    assert [e.signal for e in waiting.evidence] == ["resource/gpu/0/sm_activity_percent", power]
    both = {cpu: during(60, 2), "resource/cpu/utilization_percent": during(95, 60)}
    assert reasons_for(**both) == ["cpu_pressure", "host_cpu_busy"]  # 5.8 past its threshold, then 2.3
    swap_in = "resource/memory/swapped_in_mb_per_second"
    assert reasons_for(**{swap_in: during(40, 0)}) == ["swap"]
    assert reasons_for(**{swap_in: during(0.5, 0)}) == []  # half a MiB/s: below the threshold
    assert reasons_for(**{swap_in: during(12, 8)}) == []  # a run that always swaps: not what changed
    swapping = {swap_in: during(40, 0), "resource/memory/swapped_out_mb_per_second": during(30, 0)}
    (text,) = [r.text for r in reasons_with(**swapping)]
    assert "40.0 MiB/s back from swap" in text and "wrote 30.0 MiB/s out" in text


def test_pressure_prefers_the_cgroups_share_and_cites_every_task_stalled_at_once() -> None:
    io = {
        "resource/pressure/io_some_percent": during(90, 1),
        "resource/pressure/cgroup_io_some_percent": during(70, 1),
        "resource/pressure/cgroup_io_full_percent": during(40, 0),
    }
    (reason,) = reasons_with(**io)
    assert reason.cause == "io_pressure" and "every task at once 40%" in reason.text
    assert [e.signal for e in reason.evidence] == [
        "resource/pressure/cgroup_io_some_percent",
        "resource/pressure/cgroup_io_full_percent",
    ]
    memory = {
        "resource/pressure/memory_some_percent": during(50, 2),
        "resource/pressure/memory_full_percent": during(3, 1),  # up 2 points: not cited
    }
    (reason,) = reasons_with(**memory)
    assert [e.signal for e in reason.evidence] == ["resource/pressure/memory_some_percent"]


def test_a_run_slowed_for_most_of_its_time_keeps_its_unhindered_speed_as_typical() -> None:
    steps = [50] * 12 + [10] * 18  # 60 % of the windows at a fifth of the speed
    found = stretches.find(timeline([0.1] * 30, steps))
    assert found.typical == pytest.approx(500.0)
    (stretch,) = found.stretches
    assert (stretch.first, stretch.last) == (13, 30)


# ------------------------------------------------------------- rules a mutation review found unpinned


def test_two_stood_still_windows_side_by_side_are_one_slow_stretch_not_two_pauses() -> None:
    seconds, steps = [0.1] * 20, [50] * 20
    for i in (8, 9):  # two records a step apart, each after ~2 s standing still: 2 s steps, no evaluation
        seconds[i], steps[i] = 2.0, 1
    found = stretches.find(timeline(seconds, steps))
    kinds = [(s.kind, s.first, s.last) for s in found.stretches]
    assert kinds == [(stretches.SLOW, 9, 10)], kinds
    assert not found.regular[9:11].any()


def test_pressure_must_rise_to_half_again_its_typical_to_be_named() -> None:
    cpu = "resource/pressure/cpu_some_percent"
    assert reasons_for(**{cpu: during(80, 55)}) == []  # up 25 points, but under 1.5x on a busy host
    assert reasons_for(**{cpu: during(83, 55)}) == ["cpu_pressure"]  # 1.5x and more


def test_every_task_stalled_at_once_is_cited_from_half_the_threshold() -> None:
    memory = "resource/pressure/memory_some_percent"
    full = "resource/pressure/memory_full_percent"
    (reason,) = reasons_with(**{memory: during(50, 2), full: during(4, 1)})  # up 3 of the 5 points
    assert "every task at once 4%" in reason.text
    assert [e.signal for e in reason.evidence] == [memory, full]
    (reason,) = reasons_with(**{memory: during(50, 2), full: during(3, 1)})  # up 2: under half
    assert "every task at once" not in reason.text and len(reason.evidence) == 1


def test_a_stretchs_evidence_includes_its_last_record() -> None:
    cpu = "resource/pressure/cpu_some_percent"
    column = during(0, 2)
    column[12:17] = [50, 50, 60, 70, 70]  # the stretch's records: the median of all five is 60
    (reason,) = reasons_with(**{cpu: column})
    assert reason.evidence[0].stretch == 60 and "60% of the time" in reason.text


# ------------------------------------------------------------- what the loop was doing

OWN_CPU = "resource/process/cpu_utilization_percent"
TREE_CPU = "resource/process_tree/cpu_utilization_percent"
CPU_WAIT = "resource/process/cpu_wait_percent"
STEP_SECONDS = "resource/progress/step_seconds"
TREE_COUNT = "resource/process_tree/process_count"


def phases(**shares: tuple[float, float]) -> dict[str, list[float]]:
    """Phase shares (in the stretch, typically) as columns; the phases not given take none."""
    return {
        f"resource/progress/{phase}_percent": during(*shares.get(phase, (0.0, 0.0)))
        for phase in ("input", "forward", "backward", "optimizer", "other")
    }


def epoch_pauses(input_shares: list[float]) -> list[list[evidence.Reason]]:
    """The pause reasons of a loop waiting for its input 85 % of the time, with DataLoader workers,
    that stood still 1.5 s at the start of each of its epochs (every 1,125 steps), the loop
    waiting for its input ``input_shares`` of each pause's window."""
    seconds, steps, inputs = [0.25] * 40, [125] * 40, [85.0] * 40
    for pause, share in zip((10, 20, 30), input_shares, strict=True):
        seconds[pause], steps[pause], inputs[pause] = 1.5, 0, share
    records = timeline(
        seconds,
        steps,
        **{"resource/progress/input_percent": inputs, OWN_CPU: [20.0] * 40, TREE_CPU: [80.0] * 40},
        **{TREE_COUNT: [3.0] * 40},
    )
    found = stretches.find(records)
    pauses = [s for s in found.stretches if s.kind == stretches.PAUSE]
    assert [p.start_step for p in pauses] == [1250, 2375, 3500]
    return evidence.pause_reasons(pauses, evidence.Baseline(records, found.regular))


def test_an_input_bound_loops_pause_on_the_epochs_period_is_named_with_the_others() -> None:
    """Beside two busy loops a real loop waited for its input 85 % of the time: its first epoch's
    pause (94 %) did not stand out by 10 points and read as an evaluation or a checkpoint, while
    the next two (97 %) were named. Being on their period, it is one of them."""
    said = epoch_pauses([94.0, 97.0, 97.0])
    assert [[r.cause for r in reasons] for reasons in said] == [["input_pause"]] * 3
    assert "(every 1,125 steps, 3 times)" in said[0][0].text
    # A pause not spent mostly waiting for its input is not one of them.
    first, *_ = epoch_pauses([40.0, 97.0, 97.0])
    assert first == []


def test_a_process_whose_cpu_fell_while_it_did_not_wait_for_a_cpu_was_idle() -> None:
    (idle,) = reasons_with(**{OWN_CPU: during(25, 95), CPU_WAIT: during(3, 2)})
    assert idle.cause == "process_idle" and "its CPU 25% (typically 95%)" in idle.text
    assert [e.signal for e in idle.evidence] == [OWN_CPU]
    # Starved, not idle: it waited for a CPU (its own wait, or the CPU pressure where not recorded).
    assert reasons_for(**{OWN_CPU: during(25, 95), CPU_WAIT: during(70, 5)}) == ["cpu_starved"]
    pressure = "resource/pressure/cpu_some_percent"
    assert reasons_for(**{OWN_CPU: during(25, 95), pressure: during(60, 2)}) == ["cpu_pressure"]
    assert reasons_for(**{OWN_CPU: during(60, 95)}) == []  # fell by a third: not idle
    assert reasons_for(**{OWN_CPU: during(5, 15)}) == []  # never a busy loop to fall from
    # Its workers quiet beside it: said, and no input named.
    (idle,) = reasons_with(**{OWN_CPU: during(20, 79), TREE_CPU: during(30, 100)})
    assert idle.cause == "process_idle" and "DataLoader workers used 10% CPU (typically 21%)" in idle.text


def test_an_idle_process_beside_busy_workers_waited_for_its_input() -> None:
    (reason,) = reasons_with(**{OWN_CPU: during(20, 79), TREE_CPU: during(220, 100)})
    assert reason.cause == "input_bound"
    said = "its CPU 20% (typically 79%) while its DataLoader workers used 200% CPU (typically 21%)"
    assert said in reason.text
    assert [e.signal for e in reason.evidence] == [OWN_CPU, TREE_CPU]


def test_the_phase_whose_time_grew_names_what_the_loop_was_doing() -> None:
    # Steps 4x longer, the time gone to waiting for the next batch.
    waiting = phases(input=(70, 5), forward=(12, 40), backward=(12, 45), optimizer=(4, 8), other=(2, 2))
    (reason,) = reasons_with(
        **waiting, **{STEP_SECONDS: during(0.2, 0.05), OWN_CPU: during(30, 95), TREE_CPU: during(60, 120)}
    )
    assert reason.cause == "input_bound"
    assert reason.text.startswith(
        "input-bound: the loop waited for its next batch 70% of each of 125 steps ("
    )
    assert "140 ms a step against 2.5 ms" in reason.text
    assert (
        "its DataLoader workers used 30% CPU (typically 25%): they were not busier, so they were held up"
        in reason.text
    )
    cited = [e.signal for e in reason.evidence]
    assert cited == ["resource/progress/input_percent", STEP_SECONDS, OWN_CPU, TREE_CPU]
    step = {STEP_SECONDS: during(0.2, 0.05)}
    (reason,) = reasons_with(**waiting, **step, **{OWN_CPU: during(30, 95), TREE_CPU: during(230, 120)})
    assert "its DataLoader workers used 200% CPU (typically 25%): making the batches held it" in reason.text
    # No workers (none in the tree, or none recorded): the wait before the forward pass was the
    # loop's own, a sleep if its CPU fell, else loading in the loop.
    alone = {OWN_CPU: during(30, 95), TREE_CPU: during(33, 97), TREE_COUNT: during(1, 1)}  # sampled apart
    assert reasons_for(**waiting, **step, **alone) == ["loop_idle"]
    assert reasons_for(**waiting, **step, **{OWN_CPU: during(30, 95)}) == ["loop_idle"]
    (reason,) = reasons_with(**waiting, **step, **{OWN_CPU: during(97, 95)})
    assert reason.cause == "input_bound" and reason.text.endswith("it makes its batches itself")
    # A sleep in the loop: the time went outside the phases, the process idle.
    sleeping = phases(input=(1, 5), forward=(10, 40), backward=(10, 45), optimizer=(2, 8), other=(77, 2))
    cpu = {STEP_SECONDS: during(0.2, 0.05), OWN_CPU: during(25, 95)}
    assert reasons_for(**sleeping, **cpu) == ["loop_idle"]
    busy = {STEP_SECONDS: during(0.2, 0.05), OWN_CPU: during(95, 95)}
    assert reasons_for(**sleeping, **busy) == ["host_work"]
    # Extra work in the forward pass, the process busy.
    computing = phases(input=(2, 5), forward=(70, 40), backward=(22, 45), optimizer=(4, 8), other=(2, 2))
    busy = {STEP_SECONDS: during(0.2, 0.1), OWN_CPU: during(99, 97)}
    (reason,) = reasons_with(**computing, **busy)
    assert reason.cause == "compute_bound"
    assert reason.text.startswith("compute-bound: the forward pass took 70% of each of 125 steps")
    # The same forward with the process's CPU idle waited there (for a device, or a lock).
    assert reasons_for(**computing, **{**busy, OWN_CPU: during(20, 97)}) == ["phase_wait"]
    # A phase that grew too little to hold the step's growth names nothing, and the CPU rule speaks.
    flat = phases(input=(5, 5), forward=(40, 40), backward=(45, 45), optimizer=(8, 8), other=(2, 2))
    assert reasons_for(**flat, **cpu) == ["process_idle"]


def test_a_rank_that_waited_in_backward_with_its_cpu_idle_waited_in_the_collective() -> None:
    waiting = phases(input=(2, 5), forward=(12, 35), backward=(80, 45), optimizer=(4, 10), other=(2, 5))
    columns = {**waiting, STEP_SECONDS: during(0.3, 0.1), OWN_CPU: during(20, 95)}
    seconds, steps = [0.25] * 30, [125] * 30
    for i in range(12, 17):
        steps[i] = 25
    records = timeline(seconds, steps, **columns)
    found = stretches.find(records)
    (stretch,) = found.stretches
    (alone,) = evidence.reasons(records, found, stretch)
    assert (
        alone.cause == "phase_wait"
        and "the loop waited in the backward pass 80% of each of 125 steps" in alone.text
    )
    (rank,) = evidence.reasons(records, found, stretch, launched=True)
    assert rank.cause == "collective_wait" and "80% of each of 125 steps (typically 45%)" in rank.text
    assert "in the gradients' collective" in rank.text
    # The same backward with the CPU busy is compute.
    busy = {**columns, OWN_CPU: during(98, 95)}
    assert [r.cause for r in evidence.reasons(timeline(seconds, steps, **busy), found, stretch, True)] == [
        "compute_bound"
    ]


def test_a_cause_held_for_part_of_a_stretch_is_named_with_its_share() -> None:
    seconds, steps = [0.25] * 60, [125] * 60
    for i in range(20, 40):
        steps[i] = 25  # 20 slow windows: records 21-40
    pressure = [2.0] * 60
    for i in range(20, 28):
        pressure[i] = 70.0  # the first 8 of them under CPU pressure: 40 % of the stretch
    records = timeline(seconds, steps, **{"resource/pressure/cpu_some_percent": pressure})
    found = stretches.find(records)
    (stretch,) = found.stretches
    assert (stretch.first, stretch.last) == (21, 40)
    (reason,) = evidence.reasons(records, found, stretch)
    assert reason.cause == "cpu_pressure" and reason.share == pytest.approx(0.4)
    assert reason.text.endswith("70% of the time (typically 2%), for 40% of the stretch")
    assert reason.evidence[0].stretch == 70 and reason.strength == pytest.approx(6.8 * 0.4)
    for held, shares in ((4, [pytest.approx(0.2)]), (3, [])):  # 20 % of the stretch is named, 15 % not
        pressure[20:28] = [70.0] * held + [2.0] * (8 - held)
        records = timeline(seconds, steps, **{"resource/pressure/cpu_some_percent": pressure})
        assert [r.share for r in evidence.reasons(records, found, stretch)] == shares


@pytest.mark.parametrize("world", [1, 2])
def test_explain_says_the_collective_only_for_a_rank_of_a_launch(tmp_path: Path, world: int) -> None:
    """The same records from a run alone and from rank 0 of two: the backward's wait with the
    process idle is the collective's only where there are peers to wait for."""
    where = Placement("node", 0, 0, world, world, "job" if world > 1 else "")
    path = tmp_path / "runs.sqlite"
    writer = RunWriter(
        str(path), RunInfo(100, ["train"], {"interval_seconds": 0.25}, time.time() - 20, where)
    )
    columns = {
        **phases(input=(2, 5), forward=(12, 35), backward=(80, 45), optimizer=(4, 10), other=(2, 5)),
        STEP_SECONDS: during(0.04, 0.002),
        OWN_CPU: during(20, 95),
    }
    base, step = time.monotonic_ns() - 10 * 10**9, 0
    writer.record({OWN_CPU: 95.0}, step, base, None)
    for i in range(30):
        step += 25 if 12 <= i < 17 else 125
        writer.record(
            {name: column[i] for name, column in columns.items()}, step, base + (i + 1) * 250_000_000, None
        )
    writer.close({})
    with StoreReader(str(path)) as reader:
        (item,) = explain(reader, reader.run()).stretches
    assert [reason.cause for reason in item.reasons] == ["collective_wait" if world > 1 else "phase_wait"]


def test_a_loop_that_slept_then_waited_for_its_input_is_named_both_ways() -> None:
    seconds, steps = [0.25] * 60, [125] * 60
    for i in range(20, 40):
        steps[i] = 25  # records 21-40 slow, the process idle all along
    own = [95.0 if not 20 <= i < 40 else 15.0 for i in range(60)]
    workers = [30.0 if not 28 <= i < 40 else 120.0 for i in range(60)]  # busy in its last 12 windows
    columns = {OWN_CPU: own, TREE_CPU: [a + b for a, b in zip(own, workers, strict=True)]}
    records = timeline(seconds, steps, **columns)
    found = stretches.find(records)
    (stretch,) = found.stretches
    reasons = evidence.reasons(records, found, stretch)
    assert [(r.cause, r.share) for r in reasons] == [
        ("input_bound", 1.0),
        ("process_idle", pytest.approx(0.4)),
    ]
    assert reasons[1].text.endswith(
        "its DataLoader workers used 30% CPU (typically 30%), for 40% of the stretch"
    )


def test_a_loop_whose_cpu_stayed_under_the_phases_share_waited_there() -> None:
    """A loop at low CPU throughout (typically 24%, input-bound already): its CPU need not fall
    20 points to show that it waited. Under half the grown phase's share of the time, it did not
    run in it; its workers, counted in the tree and using no CPU, were held up."""
    step = {STEP_SECONDS: during(0.04, 0.006)}
    waiting = phases(input=(93, 60), forward=(2, 10), backward=(3, 15), optimizer=(1, 5), other=(1, 10))
    counted = {OWN_CPU: during(6, 24), TREE_CPU: during(6, 24), TREE_COUNT: during(3, 3)}
    (reason,) = reasons_with(**waiting, **step, **counted)
    assert reason.cause == "input_bound"
    assert (
        "its DataLoader workers used 0% CPU (typically 0%): they were not busier, so they were held up"
        in (reason.text)
    )
    sleeping = phases(input=(10, 60), forward=(2, 10), backward=(5, 15), optimizer=(1, 5), other=(76, 10))
    (reason,) = reasons_with(**sleeping, **step, **{OWN_CPU: during(10, 24)})
    assert reason.cause == "loop_idle" and "its CPU 10% (typically 24%)" in reason.text
    # Its CPU at the share of the time it spent there: it ran in it.
    assert reasons_for(**sleeping, **step, **{OWN_CPU: during(70, 24)}) == ["host_work"]


# ------------------------------------------------------------- hostile runs (a second adversarial pass)


def write_run(
    path: Path, seconds: list[float], steps: list[int], world: int = 1, **columns: list[float]
) -> None:
    """A run store of one run whose records' windows last and advance as given (the first record
    opens the first window), each record with ``columns``' values (NaN: none logged)."""
    where = Placement("node", 0, 0, world, world, "job" if world > 1 else "")
    interval = min([window for window in seconds if window > 0], default=0.25)
    began = time.time() - sum(seconds) - 10
    writer = RunWriter(str(path), RunInfo(100, ["train"], {"interval_seconds": interval}, began, where))
    base, step, mono = time.monotonic_ns() - round((sum(seconds) + 5) * 1e9), 0, 0.0
    writer.record({name: column[0] for name, column in columns.items()}, 0, base, None)
    for i, (window, advance) in enumerate(zip(seconds, steps, strict=True)):
        step, mono = step + advance, mono + window
        values = {name: column[i + 1] for name, column in columns.items() if column[i + 1] == column[i + 1]}
        writer.record(values, step, base + round(mono * 1e9), None)
    writer.close({})


def test_a_run_with_many_stretches_reads_each_signals_baseline_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of stretches took minutes when every stretch took every signal's median over the
    whole run's regular records again: each is taken once, whatever the number of stretches."""
    count, period = 2000, 40
    seconds = [0.25] * count
    steps = [25 if i % period >= period - 6 else 125 for i in range(count)]  # 6 slow windows in 40
    columns = {
        OWN_CPU: [95.0] * (count + 1),
        TREE_CPU: [130.0] * (count + 1),
        "resource/pressure/cpu_some_percent": [float(i % 7) for i in range(count + 1)],
    }
    path = tmp_path / "runs.sqlite"
    write_run(path, seconds, steps, **columns)
    long_reads = []
    median = evidence._median

    def counted(values: Any) -> float | None:
        if len(values) > period:  # more records than a stretch holds: the baseline's
            long_reads.append(len(values))
        return median(values)

    monkeypatch.setattr(evidence, "_median", counted)
    with StoreReader(str(path)) as reader:
        found = explain(reader, reader.run())
    slow = [item for item in found.stretches if item.stretch.kind == stretches.SLOW]
    assert len(slow) == count // period
    # Each column read, and the workers' CPU derived from two of them: four baseline medians.
    assert len(long_reads) <= len(columns) + 1, len(long_reads)


CORES = "resource/process/cpu_cores_allowed"


def test_cpu_figures_never_exceed_the_cpus_the_process_may_use() -> None:
    """Sampled apart, the tree's CPU read 190 % on one allowed CPU: explain said "used 1.9 of 1
    CPUs"."""
    (reason,) = reasons_with(**{TREE_CPU: during(190, 60), CORES: during(1, 1)})
    assert reason.cause == "workers_saturated"
    assert "kept 1.0 of the 1 CPU it may use busy (typically 0.6)" in reason.text, reason.text
    (reason,) = reasons_with(
        **{TREE_CPU: during(80, 20), "resource/container/cpu_quota_cores": during(0.5, 0.5)}
    )
    assert "kept 0.5 of the 0.5 CPUs it may use busy (typically 0.2)" in reason.text, reason.text


def test_the_gil_is_not_named_where_the_process_may_use_one_cpu() -> None:
    """At one full core on one allowed CPU, the GIL and the CPU limit read the same."""
    gil = {OWN_CPU: during(100, 40)}
    assert reasons_for(**gil, **{CORES: during(4, 4)}) == ["gil_bound"]
    assert reasons_for(**gil, **{CORES: during(1, 1)}) == []


def test_workers_cpu_is_never_negative_and_host_work_cites_the_loops_cpu() -> None:
    # The tree read below the process alone (sampled apart): its workers used no CPU, not -10 %.
    (idle,) = reasons_with(**{OWN_CPU: during(25, 95), TREE_CPU: during(15, 100)})
    assert idle.cause == "process_idle"
    assert "its DataLoader workers used 0% CPU (typically 5%)" in idle.text, idle.text
    # Host work rests on the loop staying busy: its CPU is the evidence, and is said.
    sleeping = phases(input=(1, 5), forward=(10, 40), backward=(10, 45), optimizer=(2, 8), other=(77, 2))
    (host,) = reasons_with(**sleeping, **{STEP_SECONDS: during(0.2, 0.05), OWN_CPU: during(96, 95)})
    assert host.cause == "host_work" and "its CPU 96% (typically 95%)" in host.text, host.text
    assert OWN_CPU in [e.signal for e in host.evidence]


def test_a_slow_optimizer_step_is_named_in_words_with_the_steps_it_covered() -> None:
    stepping = phases(input=(2, 5), forward=(15, 40), backward=(20, 45), optimizer=(60, 8), other=(3, 2))
    (reason,) = reasons_with(**stepping, **{STEP_SECONDS: during(0.2, 0.05), OWN_CPU: during(99, 97)})
    assert reason.cause == "compute_bound"
    assert reason.text.startswith("compute-bound: the optimizer's step took 60% of each of 125 steps"), (
        reason.text
    )


def test_no_sentence_names_the_training_loop_twice() -> None:
    waiting = phases(input=(70, 5), forward=(12, 40), backward=(12, 45), optimizer=(4, 8), other=(2, 2))
    step = {STEP_SECONDS: during(0.2, 0.05)}
    texts = [
        reason.text
        for cpu in (during(30, 95), during(97, 95))  # idle, then loading in the loop
        for reason in reasons_with(**waiting, **step, **{OWN_CPU: cpu})
    ]
    assert len(texts) == 2
    for text in texts:
        assert text.count("loop") == 1, text


@pytest.mark.parametrize("warm_up", ["stood_still", "slow", "stood_still_then_slow"])
def test_a_pause_or_a_slow_start_at_the_runs_beginning_is_its_start_up(tmp_path: Path, warm_up: str) -> None:
    """Imports, the model's build and the first batch before the steady pace read as the loop
    idle (or an evaluation): they are the run's start-up, with no cause."""
    seconds, steps = [0.25] * 30, [125] * 30
    if warm_up == "stood_still":
        seconds[0], steps[0] = 3.0, 2  # the first batch, 3 s after the monitor's first record
    elif warm_up == "slow":
        steps[:5] = [10] * 5
    else:  # the first batch, then slow steps while the rest warms up: one start-up
        seconds[0], steps[0] = 3.0, 2
        steps[1:6] = [10] * 5
    cpu = [5.0 if i <= 6 else 95.0 for i in range(31)]  # idle while it waited for its first batch
    path = tmp_path / "runs.sqlite"
    write_run(path, seconds, steps, **{OWN_CPU: cpu})
    with StoreReader(str(path)) as reader:
        (item,) = explain(reader, reader.run()).stretches
    assert item.stretch.kind == stretches.STARTUP and item.reasons == []
    status, printed = run_command("explain", str(path), handler=explain_command.main)
    assert status == 0 and "the run's start-up" in printed and "not a slowdown" in printed, printed
    assert "idle" not in printed and "evaluation" not in printed, printed
    status, printed = run_command(
        "plot", str(path), "--explain", "-o", str(tmp_path / "p.png"), handler=plot_command.main
    )
    assert status == 0, printed


def test_a_run_slow_from_its_start_for_longer_than_a_start_up_is_a_slowdown_with_causes(
    tmp_path: Path,
) -> None:
    """Slow for its first 20 minutes with its CPU idle: something held it, which the rules name."""
    seconds, steps = [60.0] * 60, [3000] * 60
    steps[:20] = [300] * 20
    cpu = [5.0 if i <= 20 else 95.0 for i in range(61)]
    path = tmp_path / "runs.sqlite"
    write_run(path, seconds, steps, **{OWN_CPU: cpu})
    with StoreReader(str(path)) as reader:
        (item,) = explain(reader, reader.run()).stretches
    assert item.stretch.kind == stretches.SLOW and item.reasons, item


def test_phase_shares_outside_0_to_100_are_read_as_their_bounds() -> None:
    """A store written by other hands held an input share of 250 %: explain said "250% of each step"."""
    odd = phases(input=(250, 5), forward=(-40, 40), backward=(8, 45), optimizer=(4, 8), other=(2, 2))
    (reason,) = reasons_with(**odd, **{STEP_SECONDS: during(0.2, 0.05), OWN_CPU: during(30, 95)})
    assert reason.cause == "loop_idle" and "100% of each of 125 steps (typically 5%)" in reason.text, (
        reason.text
    )
