"""Hostile cases for the rank that holds the others back (``sampler.analysis.ranks``, ``explain
--launch``), the phase totals the backend publishes to the child (``sampler.ipc.status``) and the
shipped rule that turns them into seconds per step."""

from __future__ import annotations

from pathlib import Path

from conftest import run_command
from test_culprit import CPU, QUIET, SLOW_INPUT, T0, WAITING, compare, phased, synchronous, write

from sampler.commands import explain as explain_command
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
