"""The rank that holds the others back in synchronous training, from the phases of its steps,
and a rank's GPU compared with the other ranks' GPUs: on stores written by the store's own writer,
one record a second on one clock shared by the ranks."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_command

from sampler import catalogue
from sampler.analysis import ranks
from sampler.analysis.timeline import Timeline
from sampler.commands import explain as explain_command
from sampler.settings.placement import Placement
from sampler.store.reader import StoreReader
from sampler.store.writer import RunInfo, RunWriter

T0 = time.time() - 10_000
"""Every rank's clock starts here: the ranks' records fall at the same seconds."""
PHASES = [phase for phase, _, _ in catalogue.STEP_PHASES]
SHARES = {
    phase: catalogue.name_of(signal) for phase, signal in zip(PHASES, catalogue.PHASE_SHARES, strict=True)
}
STEP_SECONDS = catalogue.name_of(catalogue.STEP_SECONDS)
CPU = "resource/process/cpu_utilization_percent"
QUIET = {"input": 5.0, "forward": 30.0, "backward": 50.0, "optimizer": 10.0, "other": 5.0}
"""Every rank's phase shares while none holds the others back, %."""
WAITING = {"input": 2.0, "forward": 15.0, "backward": 75.0, "optimizer": 5.0, "other": 3.0}
"""A rank waiting for a slow peer: its backward (the collective) grew."""
SLOW_INPUT = {"input": 60.0, "forward": 15.0, "backward": 17.0, "optimizer": 5.0, "other": 3.0}
SLOW_COMPUTE = {"input": 2.0, "forward": 75.0, "backward": 15.0, "optimizer": 5.0, "other": 3.0}


def thermal(device: str) -> str:
    """The share of the time ``device``'s clocks were held by software thermal slowdown."""
    counter = catalogue.THROTTLED["sw_thermal"]
    return catalogue.name_of(catalogue.SIGNALS[counter.key + catalogue.RATE_SUFFIX], device)


def write(path: Path, rank: int, world: int, records: list[tuple[float, dict[str, float]]]) -> None:
    """Rank ``rank``'s run: one record a second from ``T0``, each (steps made in the second
    before it, its values)."""
    where = Placement(
        "node", rank=rank, local_rank=rank, world_size=world, local_world_size=world, run_id="job"
    )
    writer = RunWriter(str(path), RunInfo(100 + rank, ["train"], {"interval_seconds": 1.0}, T0, where, 0))
    step = 0.0
    for second, (rate, values) in enumerate(records, 1):
        step += rate
        writer.record(values, round(step), second * 10**9, None)
    writer.close({})


def phased(shares: dict[str, float], step_seconds: float, **others: float) -> tuple[float, dict[str, float]]:
    """A record of a rank in synchronous training: its phase shares, the step time shared by
    every rank, and ``others`` (signal name -> value)."""
    values = {SHARES[phase]: share for phase, share in shares.items()}
    return 1 / step_seconds, {**values, STEP_SECONDS: step_seconds, CPU: 90.0, **others}


def synchronous(path: Path, stretches: list[tuple[int, range, dict[str, float]]], gpus: bool = False) -> None:
    """Three ranks in step, 0.1 s per step, 40 s; over each (rank, seconds, its shares) that rank
    holds the others back (the step then takes 0.3 s, the others wait in backward). With
    ``gpus``, each rank samples its own GPU, whose index is its rank."""
    for rank in range(3):
        records = []
        for second in range(40):
            holder = next(((r, shares) for r, span, shares in stretches if second in span), None)
            extra = {thermal(str(rank)): 0.9 if holder and holder[0] == rank else 0.0} if gpus else {}
            if holder is None:
                records.append(phased(QUIET, 0.1, **extra))
            else:
                records.append(phased(holder[1] if holder[0] == rank else WAITING, 0.3, **extra))
        write(path, rank, 3, records)


def compare(path: Path) -> ranks.Comparison:
    with StoreReader(str(path)) as reader:
        return ranks.compare(ranks.gather(reader, reader.launch("job")))


def test_the_rank_slow_in_its_input_then_the_one_slow_in_its_compute_are_named(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    synchronous(path, [(1, range(8, 20), SLOW_INPUT), (2, range(26, 34), SLOW_COMPUTE)])
    comparison = compare(path)
    assert comparison.lags == []  # in step: no rank's throughput fell behind the others'
    assert comparison.timed
    assert [(c.rank.run.rank, c.phase) for c in comparison.culprits] == [(1, "input"), (2, "forward")]
    first, second = comparison.culprits
    # Its wall times: from the interval before its first record to its last (1 s around each edge).
    assert abs(first.start_wall - (T0 + 8)) <= 1.5 and abs(first.end_wall - (T0 + 20)) <= 1.5, first
    assert abs(second.start_wall - (T0 + 26)) <= 1.5 and abs(second.end_wall - (T0 + 34)) <= 1.5, second
    assert first.shares["input"] == pytest.approx(60, abs=12) and first.others["input"] == pytest.approx(
        2, abs=4
    )
    assert first.shares["backward"] == pytest.approx(17, abs=12)
    assert first.others["backward"] == pytest.approx(75, abs=10)
    assert first.others_typical_backward == pytest.approx(50, abs=1)
    assert second.shares["forward"] == pytest.approx(75, abs=15) and second.step_seconds > 0.2
    status, printed = run_command("explain", str(path), "--launch", "job", handler=explain_command.main)
    print(printed)
    held = [line for line in printed.splitlines() if "held the others back" in line]
    assert status == 0 and len(held) == 2
    assert held[0].startswith("rank 1 (run 2) held the others back in its input over steps ")
    assert held[1].startswith("rank 2 (run 3) held the others back in its compute (the forward pass) over")
    assert re.search(r"grew to 7[0-9]% \(typically 50%\)\.$", held[0]), held[0]
    machine = "  its machine then (the other ranks' in brackets): process CPU (100 % per core) 90% (90%)."
    assert printed.count(machine) == 2
    status, printed = run_command(
        "explain", str(path), "--launch", "job", "--json", handler=explain_command.main
    )
    found = json.loads(printed)["launch"]
    assert found["phases_timed"] is True
    assert [(c["rank"], c["phase"]) for c in found["culprits"]] == [(1, "input"), (2, "forward")]


def test_a_quiet_launch_names_no_rank_and_one_without_phases_says_nothing_of_them(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    synchronous(path, [])
    comparison = compare(path)
    assert comparison.timed and comparison.culprits == []
    status, printed = run_command("explain", str(path), "--launch", "job", handler=explain_command.main)
    assert status == 0 and "No rank held the others back: the ranks' step phases agree." in printed
    untimed = tmp_path / "untimed.sqlite"
    for rank in range(3):
        write(untimed, rank, 3, [(10.0, {CPU: 90.0})] * 20)
    comparison = compare(untimed)
    assert not comparison.timed and comparison.culprits == []
    status, printed = run_command("explain", str(untimed), "--launch", "job", handler=explain_command.main)
    assert status == 0 and "held the others back" not in printed and "phases" not in printed


def test_a_short_spell_or_one_that_does_not_hold_once_bridged_names_no_rank(tmp_path: Path) -> None:
    # Two seconds is under stretches.MIN_INTERVALS of rank 1's one-second interval.
    short = tmp_path / "short.sqlite"
    synchronous(short, [(1, range(10, 12), SLOW_INPUT)])
    assert compare(short).culprits == []
    # A rank longer in its input (by a quarter of the step) that waits in the collective as long
    # as the others (by 5 % of the step) does not hold them back.
    alike = tmp_path / "alike.sqlite"
    others = {"input": 5.0, "forward": 30.0, "backward": 40.0, "optimizer": 20.0, "other": 5.0}
    longer = {"input": 45.0, "forward": 15.0, "backward": 35.0, "optimizer": 3.0, "other": 2.0}
    for rank in range(3):
        records = [phased(longer if 10 <= s < 20 and rank == 1 else others, 0.1) for s in range(30)]
        write(alike, rank, 3, records)
    with StoreReader(str(alike)) as reader:
        assert ranks.culprits(ranks.gather(reader, reader.launch("job"))) == []


def test_a_ranks_gpu_is_compared_with_the_other_ranks_gpus_by_role(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    synchronous(path, [(1, range(8, 24), SLOW_COMPUTE)], gpus=True)
    (culprit,) = compare(path).culprits
    assert culprit.rank.run.rank == 1 and culprit.phase == "forward"
    (reason,) = [reason for reason in culprit.reasons if reason.cause == "gpu_sw_thermal_throttle"]
    assert reason.text.startswith("GPU 1's clocks were held down by software thermal slowdown 90%")
    assert "(typically 0%)" in reason.text  # the other ranks' GPUs 0 and 2 then
    assert [e.signal for e in reason.evidence] == [thermal("1")]
    assert [(r.signal, r.title, r.own, r.others) for r in culprit.machine] == [
        (CPU, catalogue.PROCESS_CPU.title, 90.0, 90.0)
    ]


def test_by_role_names_another_ranks_gpus_as_this_ranks_and_drops_its_extra_ones() -> None:
    one = np.array([1.0])
    line = Timeline(
        np.array([5]), np.array([T0]), {thermal("0"): one, thermal("3"): one * 2, CPU: one * 3}, 1.0
    )
    mapped = ranks.by_role(line, ["2"])
    assert set(mapped.values) == {thermal("2"), CPU}
    assert mapped.values[thermal("2")][0] == 1.0 and mapped.values[CPU][0] == 3.0


def test_a_lag_is_rechecked_once_the_intervals_between_are_bridged(tmp_path: Path) -> None:
    """A rank slow for one grid interval, fast for the next, slow for one more: bridged, the
    three intervals are not slow (and either slow one alone is too short to be a lag)."""
    path = tmp_path / "runs.sqlite"
    seconds = 2 * (ranks.MAX_GRID - 1)  # one grid interval is two of the records' seconds
    for rank in range(3):
        rates = [100.0] * seconds
        if rank == 1:
            at = 2 * 1000  # grid intervals 1001 (slow), 1002 (fast), 1003 (slow)
            rates[at : at + 6] = [10.0, 10.0, 1000.0, 1000.0, 10.0, 10.0]
        write(path, rank, 3, [(rate, {CPU: 50.0}) for rate in [100.0, *rates]])
    comparison = compare(path)
    assert comparison.lags == [], [
        (lag.rank.run.rank, lag.start_step, lag.throughput) for lag in comparison.lags
    ]


def test_plot_launch_shades_where_each_rank_held_the_others_back(tmp_path: Path) -> None:
    from test_plot import panels

    from sampler.views import launch_plot

    path = tmp_path / "runs.sqlite"
    synchronous(path, [(1, range(8, 20), SLOW_INPUT), (2, range(26, 34), SLOW_COMPUTE)])
    with StoreReader(str(path)) as reader:
        fig = launch_plot.figure(reader, ranks.gather(reader, reader.launch("job")))
    throughput = panels(fig)[launch_plot.THROUGHPUT]
    spans = {
        patch.get_gid(): patch for patch in throughput.patches if str(patch.get_gid()).startswith("culprit/")
    }
    assert list(spans) == ["culprit/rank1", "culprit/rank2"]
    assert spans["culprit/rank1"].get_label() == "rank 1 held the others back: input"
    assert spans["culprit/rank2"].get_label() == "rank 2 held the others back: compute"
    left = spans["culprit/rank1"].get_x()  # type: ignore[attr-defined]  # seconds since the launch's first record, at T0 + 1
    assert 6 <= left <= 9
    quiet = tmp_path / "quiet.sqlite"
    synchronous(quiet, [])
    with StoreReader(str(quiet)) as reader:
        fig = launch_plot.figure(reader, ranks.gather(reader, reader.launch("job")))
    assert not [
        p for p in panels(fig)[launch_plot.THROUGHPUT].patches if str(p.get_gid()).startswith("culprit")
    ]


def test_a_culprit_is_rechecked_once_the_intervals_between_are_bridged(tmp_path: Path) -> None:
    """Rank 1 holds the others back at one grid time and at the one after next; between, for a
    one-second step, it is the others that spend longer in their input: bridged, rank 1 spent
    less in input and forward than the median rank over the three (and either spell alone is
    too short to name)."""
    path = tmp_path / "runs.sqlite"
    at = 2 * 1000  # grid times fall on every other record: 1000, 1001 and 1002 here
    spells = [(0.3, SLOW_INPUT, WAITING)] * 2 + [(1.0, QUIET, SLOW_INPUT)] + [(0.3, SLOW_INPUT, WAITING)] * 2
    for rank in range(3):
        records = [phased(QUIET, 0.1) for _ in range(2 * ranks.MAX_GRID - 1)]
        for k, (step, its, theirs) in enumerate(spells):
            records[at + k] = phased(its if rank == 1 else theirs, step)
        write(path, rank, 3, records)
    assert compare(path).culprits == []
