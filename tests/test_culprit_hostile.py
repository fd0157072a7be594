"""Hostile cases for the rank that holds the others back (``sampler.analysis.ranks``, ``explain
--launch``), the phase totals the backend publishes to the child (``sampler.ipc.status``) and the
shipped rule that turns them into seconds per step."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import run_command
from test_culprit import (
    CPU,
    QUIET,
    SLOW_INPUT,
    T0,
    WAITING,
    compare,
    phased,
    synchronous,
    write,
)

from sampler.catalogue import STEP_PHASES
from sampler.commands import explain as explain_command
from sampler.ipc.status import ChildStatus
from sampler.settings.placement import Placement
from sampler.store.writer import RunInfo, RunWriter


def explained(path: Path, *extra: str) -> str:
    status, printed = run_command(
        "explain", str(path), "--launch", "job", *extra, handler=explain_command.main
    )
    assert status == 0, printed
    return printed


def test_a_restarted_ranks_run_is_named_once(tmp_path: Path) -> None:
    """Rank 1's monitor ran twice in one process (a repeated rank): its label carries its run,
    and the text does not add it again."""
    path = tmp_path / "runs.sqlite"
    where = Placement("node", rank=1, local_rank=1, world_size=3, local_world_size=3, run_id="job")
    writer = RunWriter(str(path), RunInfo(101, ["train"], {"interval_seconds": 1.0}, T0, where, 0))
    for second in range(1, 4):
        writer.record(phased(QUIET, 0.1)[1], second * 10, second * 10**9, None)
    writer.close({})
    synchronous(path, [(1, range(8, 20), SLOW_INPUT)])
    (culprit,) = compare(path).culprits
    assert culprit.rank.repeated and culprit.rank.run.id == 3
    printed = explained(path)
    assert "rank 1 (run 3) held the others back in its input" in printed, printed
    assert "(run 3) (run 3)" not in printed


def test_a_rank_that_timed_no_step_in_the_window_has_no_seconds_per_step(tmp_path: Path) -> None:
    """Rank 1 stops (its phase counters stand still, or its step counter did not move while its
    seconds did): 0/0 and x/0 are no seconds per step, and the launch's median stays the others'."""
    import test_prometheus_rules as rules_test

    launch = rules_test.healthy()
    stop = rules_test.STOP
    for key, values in launch.series.items():
        counted = key.startswith(("wl_resource_steps_timed_total", "wl_resource_step_phase_seconds_total"))
        # its input's seconds go on with no step counted: a clock oddity, x/0
        if counted and 'rank="1"' in key and 'phase="input"' not in key:
            launch.series[key] = [*values[:stop], *[values[stop]] * (len(values) - stop)]
    one = rules_test.rank_labels(1)
    median = 'launch:wl_resource_step_phase_seconds:per_step_median{phase="backward"}'
    checks = [
        {
            "expr": rules_test._selector("rank:wl_resource_step_phase_seconds:per_step", one),
            "eval_time": "20m",
            "exp_samples": [],
        },
        {
            "expr": median,
            "eval_time": "20m",
            "exp_samples": [
                {
                    "labels": f'{median.split("{")[0]}{{phase="backward",run_id="{rules_test.LAUNCH}"}}',
                    "value": 0.5,
                }
            ],
        },
    ]
    rules_test.promtool_test(tmp_path, launch, checks, kind="promql_expr_test")


READER = """
import json, sys
from sampler.ipc.status import ChildStatus
status = ChildStatus.from_fd(int(sys.argv[1]))
print("ready", flush=True)
torn = whole = 0
seen = set()
for _ in range(int(sys.argv[2])):
    steps, spent = status.phases()
    if any(round(s * 1e9) != steps * (k + 1) * 10**6 for k, s in enumerate(spent)):
        torn += 1
    else:
        whole += 1
        seen.add(steps)
print(json.dumps({"torn": torn, "whole": whole, "distinct": len(seen)}), flush=True)
"""


def consistent(steps: int) -> list[float]:
    """Phase seconds that tell which update they came from: phase k holds steps * (k + 1) ms."""
    return [steps * (k + 1) * 1e-3 for k in range(len(STEP_PHASES))]


def test_a_reader_in_another_process_never_sees_the_phases_half_written() -> None:
    """The backend publishes the phase totals without pause while a child process reads them:
    every read has its step count and its seconds from one update."""
    status, fd = ChildStatus.create()
    child = subprocess.Popen(
        [sys.executable, "-c", READER, str(fd), "200000"], pass_fds=(fd,), stdout=subprocess.PIPE, text=True
    )
    os.close(fd)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        steps = 0
        while child.poll() is None and steps < 10**8:
            steps += 1
            status.publish_phases(steps, consistent(steps))
        found = json.loads(child.stdout.read())
    finally:
        child.kill()
        child.wait()
        status.close()
    print(found, "updates", steps)
    assert found["torn"] == 0, found
    assert found["distinct"] > 10, found  # the reads did overlap the updates


def test_phase_totals_that_are_not_finite_or_do_not_fit_keep_the_last_good_value() -> None:
    """A clock oddity upstream (NaN, inf, negative, past int64 in ns) neither raises in the
    monitor thread nor reaches the child: each such word keeps its last published value."""
    status, fd = ChildStatus.create()
    reader = ChildStatus.from_fd(fd)
    os.close(fd)
    try:
        status.publish_phases(4, consistent(4))
        status.publish_phases(5, [math.nan, math.inf, 1e300, -1.0, 0.5])
        steps, spent = reader.phases()
        assert steps == 5
        assert spent == (*consistent(4)[:4], 0.5)
        status.publish_phases(2**64, [-math.inf, 0.0, 9.3e9, 1.0, 0.5])  # 9.3e9 s: past 2**63 ns
        steps, spent = reader.phases()
        assert steps == 5 and spent == (consistent(4)[0], 0.0, consistent(4)[2], 1.0, 0.5)
    finally:
        reader.close()
        status.close()


def test_a_writer_that_died_mid_update_leaves_the_last_whole_copy() -> None:
    """The backend killed while it wrote the phases leaves the sequence word odd for good: a
    read gives up after a bounded number of tries and returns the last whole copy it read
    (none yet: zeros)."""
    status, fd = ChildStatus.create()
    reader = ChildStatus.from_fd(fd)
    try:
        status.publish_phases(7, consistent(7))
        assert reader.phases() == (7, tuple(consistent(7)))
        status._phases[0] += 1  # the sequence word, odd: a write under way that never ends
        status._phases[1] = 8
        assert reader.phases() == (7, tuple(consistent(7)))
        fresh = ChildStatus.from_fd(fd)
        assert fresh.phases() == (0, (0.0,) * len(STEP_PHASES))
        fresh.close()
    finally:
        os.close(fd)
        reader.close()
        status.close()


def test_a_rank_that_timed_no_phases_is_said_untimed(tmp_path: Path) -> None:
    """Rank 2 has no watch_model(module): it is named untimed, not passed over as quiet."""
    path = tmp_path / "runs.sqlite"
    for rank in range(3):
        records = []
        for second in range(40):
            slow = 8 <= second < 20
            if rank == 2:
                records.append((1 / 0.3 if slow else 10.0, {CPU: 90.0}))
            else:
                shares = (SLOW_INPUT if rank == 1 else WAITING) if slow else QUIET
                records.append(phased(shares, 0.3 if slow else 0.1))
        write(path, rank, 3, records)
    comparison = compare(path)
    assert [rank.run.rank for rank in comparison.untimed] == [2]
    assert [culprit.rank.run.rank for culprit in comparison.culprits] == [1]
    printed = explained(path)
    assert "Untimed: rank 2 (run 3) recorded no step phases" in printed, printed
    found = json.loads(explained(path, "--json"))["launch"]
    assert found["untimed_ranks"] == [{"rank": 2, "run": 3}]
    quiet = tmp_path / "quiet.sqlite"
    for rank in range(3):
        write(quiet, rank, 3, [phased(QUIET, 0.1) if rank != 2 else (10.0, {CPU: 90.0}) for _ in range(30)])
    printed = explained(quiet)
    assert "No timed rank held the others back" in printed and "Untimed: rank 2 (run 3)" in printed, printed


def test_a_hold_that_moves_between_ranks_is_said_fleeting_not_pinned_on_one(tmp_path: Path) -> None:
    """Each rank in turn holds the others back for 2 s (under the 3 intervals a culprit needs)
    over 30 s: no rank is named, and the seconds held are said, with each rank's share."""
    path = tmp_path / "runs.sqlite"
    synchronous(path, [(k % 3, range(5 + 2 * k, 7 + 2 * k), SLOW_INPUT) for k in range(15)])
    comparison = compare(path)
    assert comparison.culprits == []
    assert [rank.run.rank for rank, _ in comparison.fleeting] == [0, 1, 2]
    assert comparison.fleeting_seconds > 20, comparison.fleeting
    printed = explained(path)
    assert "Fleeting: for " in printed and "the hold moved between ranks" in printed, printed
    assert "No rank held the others back" not in printed
    assert json.loads(explained(path, "--json"))["launch"]["fleeting_seconds"] > 20
    # A rank named over its whole hold leaves nothing fleeting.
    named = tmp_path / "named.sqlite"
    synchronous(named, [(1, range(8, 20), SLOW_INPUT)])
    comparison = compare(named)
    assert [c.rank.run.rank for c in comparison.culprits] == [1] and comparison.fleeting == []


def write_steps(path: Path, rank: int, steps: list[tuple[float, int]], alive: float) -> None:
    """Rank ``rank`` of three: a record at each (second, step), phases quiet, its monitor
    writing on until ``alive`` s (the backend logs no record while the step stands still)."""
    where = Placement("node", rank=rank, local_rank=rank, world_size=3, local_world_size=3, run_id="job")
    started_ns = time.monotonic_ns() - round(alive * 1e9)  # its clock at close reads ``alive`` s
    writer = RunWriter(
        str(path), RunInfo(100 + rank, ["train"], {"interval_seconds": 1.0}, T0, where, started_ns)
    )
    for second, step in steps:
        writer.record(phased(QUIET, 0.1)[1], step, started_ns + round(second * 1e9), None)
    writer.close({})


def test_a_rank_stuck_while_the_others_wait_at_the_collective_is_said(tmp_path: Path) -> None:
    """At 20 s rank 2 stops at step 200 (its input hung); ranks 0 and 1 ran one forward further
    and wait for it in the collective: every record stops, every monitor lives on 30 s."""
    path = tmp_path / "runs.sqlite"
    for rank in range(3):
        last = 200 if rank == 2 else 201
        write_steps(path, rank, [(s, min(10 * s, last)) for s in range(1, 21)] + [(20.5, last)], alive=50)
    comparison = compare(path)
    assert [
        (s.rank.run.rank, s.step, s.others_step, s.end_wall, s.others_went_on) for s in comparison.stops
    ] == [(2, 200, 201, None, False)]
    printed = explained(path)
    assert "Stuck: rank 2 (run 3) stopped at step 200" in printed, printed
    assert "waiting for it at the collective" in printed
    assert json.loads(explained(path, "--json"))["launch"]["stops"][0]["rank"] == 2
    # Ranks that pause together at one step for 10 s (an evaluation) and end together: no one stuck.
    together = tmp_path / "together.sqlite"
    for rank in range(3):
        steps = [(s, 10 * s) for s in range(1, 21)] + [(s, 10 * s - 100) for s in range(31, 41)]
        write_steps(together, rank, steps, alive=40.2)
    assert compare(together).stops == []


def test_a_stuck_rank_that_comes_back_is_said_and_a_pause_of_its_own_is_not(tmp_path: Path) -> None:
    """Rank 2 hangs 15 s at step 200 in synchronous training, then all go on (the others' first
    records after it fall before its own); in a launch whose ranks step on their own, rank 2
    pausing 15 s for its own evaluation while the others go on is no stop."""
    path = tmp_path / "runs.sqlite"
    for rank in range(3):
        last = 200 if rank == 2 else 201
        resume = 35.9 if rank == 2 else 35.1
        steps = [(s, min(10 * s, last)) for s in range(1, 21)] + [(20.5, last)]
        steps += [(resume + k, 205 + 10 * k) for k in range(10)]
        write_steps(path, rank, steps, alive=46)
    (stop,) = compare(path).stops
    assert (stop.rank.run.rank, stop.step, stop.others_step, stop.others_went_on) == (2, 200, 201, False)
    assert stop.end_wall is not None and 14 < stop.end_wall - stop.start_wall < 16
    assert "Stuck: rank 2 (run 3) stopped at step 200" in explained(path)
    apart = tmp_path / "apart.sqlite"
    for rank in range(3):
        steps = [(s, 10 * s) for s in range(1, 41)]
        if rank == 2:
            steps = [(s, 10 * s) for s in range(1, 21)] + [(s, 10 * s - 150) for s in range(36, 41)]
        write_steps(apart, rank, steps, alive=40.2)
    assert compare(apart).stops == []


def test_a_rank_whose_monitor_went_silent_while_the_others_waited_is_said(tmp_path: Path) -> None:
    """Rank 2's process hung holding the interpreter (or died) at step 200: its monitor wrote
    nothing more and never ended its run, while ranks 0 and 1 waited at step 201 for 30 s."""
    path = tmp_path / "runs.sqlite"
    for rank in range(3):
        last = 200 if rank == 2 else 201
        steps = [(s, min(10 * s, last)) for s in range(1, 21)] + [(20.5, last)]
        if rank == 2:
            where = Placement("node", rank=2, local_rank=2, world_size=3, local_world_size=3, run_id="job")
            started_ns = time.monotonic_ns() - round(21 * 1e9)
            info = RunInfo(102, ["train"], {"interval_seconds": 1.0}, T0, where, started_ns)
            writer = RunWriter(str(path), info)
            for second, step in steps:
                writer.record(phased(QUIET, 0.1)[1], step, started_ns + round(second * 1e9), None)
            writer.flush()  # and no end: the process is gone or hung
            continue
        write_steps(path, rank, steps, alive=50)
    (stop,) = compare(path).stops
    assert (stop.rank.run.rank, stop.step, stop.others_step, stop.end_wall) == (2, 200, 201, None)
    assert stop.silent
    printed = explained(path)
    assert "Stuck: rank 2 (run 3) stopped at step 200" in printed and "wrote nothing more" in printed, printed


def test_plot_launch_names_the_untimed_rank_in_its_title(tmp_path: Path) -> None:
    from sampler.analysis import ranks
    from sampler.store.reader import StoreReader
    from sampler.views import launch_plot

    path = tmp_path / "runs.sqlite"
    for rank in range(3):
        write(path, rank, 3, [phased(QUIET, 0.1) if rank != 1 else (10.0, {CPU: 90.0}) for _ in range(30)])
    with StoreReader(str(path)) as reader:
        fig = launch_plot.figure(reader, ranks.gather(reader, reader.launch("job")))
    title = fig.get_suptitle()
    assert title.endswith(" · step phases untimed on rank 1"), title
