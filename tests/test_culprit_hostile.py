"""Hostile cases for the rank that holds the others back (``sampler.analysis.ranks``, ``explain
--launch``), the phase totals the backend publishes to the child (``sampler.ipc.status``) and the
shipped rule that turns them into seconds per step."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from conftest import run_command
from test_culprit import QUIET, SLOW_INPUT, T0, compare, phased, synchronous

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
