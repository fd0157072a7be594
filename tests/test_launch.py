"""A multi-rank launch in the run store: ``runs`` groups its ranks, ``plot --launch`` draws their
spread and throughput, ``explain`` names the rank that fell behind.

Three real backends are started as torchrun would start them on one host (``RANK`` and
``LOCAL_RANK`` 0..2, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` 3, one ``TORCHELASTIC_RUN_ID``),
each a separate process with its own monitor, all writing one store; rank 1 sleeps ten times
longer per step. The failure paths and the evidence use stores written by the store's own writer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ENV_VARS, FAST, backend_script, machine_to_itself, run_command, torchrun
from test_plot import finite, lines, panels, ys

from sampler.analysis import ranks
from sampler.commands import explain as explain_command
from sampler.commands import plot as plot_command
from sampler.commands import runs as runs_command
from sampler.settings.placement import Placement
from sampler.store.reader import StoreReader
from sampler.store.writer import RunInfo, RunWriter
from sampler.views import launch_plot

RANKS = 3
SLOW_RANK = 1
SLEEPS = {0: 0.004, 1: 0.04, 2: 0.004}
"""Seconds each rank sleeps per step: rank 1 makes a tenth of the others' steps or fewer."""
RECORDS = 20
"""Records each rank logs before it stops (4 s at 0.2 s, on an idle machine)."""
CPU = "resource/process/cpu_utilization_percent"
HOST_CPU = "resource/cpu/utilization_percent"


def rank_script(store: Path) -> str:
    """A backend: its step advances in a loop (sleeping ``SLEEP`` per step) until it logged
    ``RECORDS`` records."""
    return backend_script(
        f"""
        step = [0]
        sampler.watch_model(lambda: step[0])
        mon = sampler.ResourceMonitor(
            store={str(store)!r}, postmortem_dir=None, categories=["cpu", "memory", "process"],
            interval_seconds=0.2, _min_interval_seconds={FAST["_min_interval_seconds"]},
        )
        mon.start()
        sleep = float(os.environ["TEST_SLEEP"])
        while mon.stats()["records_logged"] < {RECORDS}:
            step[0] += 1
            time.sleep(sleep)
        mon.stop()
        """
    )


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """(store, launch id) of three ranks that ran side by side, rank 1 slow."""
    store = tmp_path_factory.mktemp("launch") / "runs.sqlite"
    launch_id = f"itest-{uuid.uuid4().hex[:8]}"
    script = rank_script(store)
    started: list[subprocess.Popen[bytes]] = []
    # Ranks are judged against each other: not beside a test that pins busy loops to a core.
    with machine_to_itself():
        try:
            for rank in range(RANKS):
                env = {
                    **{k: v for k, v in os.environ.items() if k not in ENV_VARS},
                    **torchrun(rank, rank, RANKS, RANKS, TORCHELASTIC_RUN_ID=launch_id),
                    "TEST_SLEEP": str(SLEEPS[rank]),
                }
                started.append(subprocess.Popen([sys.executable, "-c", script], env=env, cwd=store.parent))
            for backend in started:
                assert backend.wait(timeout=90) == 0
        finally:  # whatever happened: kill (by pid) and reap what still runs
            for backend in started:
                if backend.poll() is None:
                    backend.kill()
                backend.wait()
    yield store, launch_id


def test_runs_lists_the_ranks_of_a_launch_together(launch: tuple[Path, str]) -> None:
    store, launch_id = launch
    status, printed = run_command("runs", str(store), handler=runs_command.main)
    print(printed)
    assert status == 0
    header, title, *rows = printed.splitlines()
    assert header.split()[0] == "id"
    assert title == f"launch {launch_id}: 3 of 3 ranks"
    assert [row.split()[6] for row in rows] == ["0/3", "1/3", "2/3"]  # host rank R/W, by rank
    assert all(row.startswith("  ") for row in rows)


def test_runs_puts_a_launchs_ranks_in_rank_order_where_its_first_run_was(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    RunWriter(str(path), RunInfo(5, ["alone"], {}, time.time())).close({})
    write_rank(path, 1, 2, "job", [100.0] * 3)
    write_rank(path, 0, 2, "job", [100.0] * 3)
    RunWriter(str(path), RunInfo(6, ["alone"], {}, time.time())).close({})
    status, printed = run_command("runs", str(path), handler=runs_command.main)
    assert status == 0
    rows = printed.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["1", "launch", "3", "2", "4"]
    assert rows[1] == "launch job: 2 of 2 ranks"
    assert ["rank 0/2" in rows[2], "rank 1/2" in rows[3], "rank" in rows[0] + rows[4]] == [True, True, False]


def test_plot_launch_draws_each_signals_spread_and_each_ranks_throughput(
    launch: tuple[Path, str], tmp_path: Path
) -> None:
    store, launch_id = launch
    with StoreReader(str(store)) as reader:
        gathered = ranks.gather(reader, reader.launch(launch_id[:10]))
        fig = launch_plot.figure(reader, gathered)
    drawn = panels(fig)
    assert next(iter(drawn)) == launch_plot.THROUGHPUT
    throughput = lines(drawn[launch_plot.THROUGHPUT])
    assert set(throughput) == {"rank0", "rank1", "rank2", "median"}
    typical = {gid: sorted(finite(ys(line)))[len(finite(ys(line))) // 2] for gid, line in throughput.items()}
    assert typical["rank1"] < 0.6 * min(typical["rank0"], typical["rank2"]), typical
    # A per-rank signal: the band holds every rank, the median between the lowest and the highest.
    spread = lines(drawn[CPU])
    assert {"min", "median", "max"} <= set(spread)
    assert [c.get_gid() for c in drawn[CPU].collections] == ["spread"]
    low, middle, high = (ys(spread[gid]) for gid in ("min", "median", "max"))
    pairs = [(lo, mid, hi) for lo, mid, hi in zip(low, middle, high, strict=True) if hi == hi]
    assert pairs and all(lo <= mid <= hi for lo, mid, hi in pairs)
    # A host-wide signal comes from local rank 0 alone: its panel says so.
    assert drawn[HOST_CPU].get_title(loc="left").endswith("(1 of 3 ranks)")
    assert "ranks)" not in drawn[CPU].get_title(loc="left")
    with StoreReader(str(store)) as reader:
        only = panels(launch_plot.figure(reader, gathered, pattern="cpu_wait"))
    assert list(only) == [launch_plot.THROUGHPUT, "resource/process/cpu_wait_percent"]
    status, printed = run_command("plot", str(store), "--launch", launch_id[:10], handler=plot_command.main)
    written = Path(printed.strip())
    assert status == 0 and written.name == f"runs-launch{launch_id}.png"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and written.stat().st_size > 10_000


def test_explain_names_the_slow_rank_and_no_other(launch: tuple[Path, str]) -> None:
    store, launch_id = launch
    status, printed = run_command("explain", str(store), handler=explain_command.main)
    print(printed)
    assert status == 0
    assert printed.startswith("run 3 (")  # the newest run's own explanation comes first, as before
    lagged = [line for line in printed.splitlines() if " lagged over steps " in line]
    assert lagged and all(line.startswith(f"rank {SLOW_RANK} (run ") for line in lagged), lagged
    status, printed = run_command(
        "explain", str(store), "--launch", launch_id, "--json", handler=explain_command.main
    )
    found = json.loads(printed)
    assert status == 0 and set(found) == {"launch"}
    lags = found["launch"]["lags"]
    assert lags and {lag["rank"] for lag in lags} == {SLOW_RANK}
    for lag in lags:
        assert lag["steps_per_second"] < 0.6 * lag["median_steps_per_second"]
        assert lag["share_behind"] > 0.4 and lag["last_step"] > lag["first_step"] and lag["seconds"] >= 1.0


def write_rank(
    path: Path, rank: int, world: int, launch_id: str, rates: list[float], wait: float = 0.0
) -> None:
    """A rank's run written by the store's own writer: one record a second at ``rates`` (steps/s
    over the second before each), its main thread waiting ``wait`` % of the time for a CPU."""
    where = Placement(
        "node", rank=rank, local_rank=rank, world_size=world, local_world_size=world, run_id=launch_id
    )
    writer = RunWriter(
        str(path), RunInfo(100 + rank, ["train"], {"interval_seconds": 1.0}, time.time() - 30, where)
    )
    base = time.monotonic_ns() - 25 * 10**9
    step = 0.0
    for i, rate in enumerate(rates):
        step += rate
        writer.record(
            {"resource/process/cpu_wait_percent": wait, CPU: 50.0}, int(step), base + i * 10**9, None
        )
    writer.close({})


def test_a_lagging_rank_is_explained_by_its_signals_against_the_other_ranks(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    write_rank(path, 0, 3, "job", [100.0] * 20)
    write_rank(path, 1, 3, "job", [100.0] * 8 + [20.0] * 6 + [100.0] * 6, wait=0.0)
    write_rank(path, 2, 3, "job", [100.0] * 20)
    with StoreReader(str(path)) as reader:
        comparison = ranks.compare(ranks.gather(reader, reader.launch("job")))
    assert [lag.rank.run.rank for lag in comparison.lags] == [1]
    (lag,) = comparison.lags
    assert 790 <= lag.start_step <= 810 and 910 <= lag.end_step <= 930, lag
    assert lag.throughput == pytest.approx(20, rel=0.2) and lag.median == pytest.approx(100, rel=0.1)
    assert not lag.reasons
    path2 = tmp_path / "starved.sqlite"
    write_rank(path2, 0, 2, "job", [100.0] * 10)
    write_rank(path2, 1, 2, "job", [30.0] * 10, wait=80.0)
    with StoreReader(str(path2)) as reader:
        (lag,) = ranks.compare(ranks.gather(reader, reader.launch("job"))).lags
    assert [reason.cause for reason in lag.reasons] == ["cpu_starved"]
    assert "waited for a CPU 80% of the time (typically 0%)" in lag.reasons[0].text


def test_unknown_one_rank_and_silent_launches_are_refused_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runs.sqlite"
    write_rank(path, 0, 2, "alpha-1", [100.0] * 5)
    write_rank(path, 1, 2, "alpha-1", [100.0] * 5)
    write_rank(path, 0, 2, "alpha-2", [100.0] * 5)  # its rank 1 never wrote
    where = Placement("node", rank=0, local_rank=0, world_size=2, local_world_size=2, run_id="beta")
    RunWriter(str(path), RunInfo(7, ["train"], {}, time.time(), where)).close({})  # no points
    write_rank(path, 1, 2, "beta", [100.0] * 5)
    for command in (plot_command.main, explain_command.main):
        name = "plot" if command is plot_command.main else "explain"
        for launch_id, why in (
            ("gamma", "no launch starts with 'gamma'; its multi-rank launches: alpha-1 (2 of 2 ranks);"
             " alpha-2 (1 of 2 ranks); beta (2 of 2 ranks)"),
            ("alpha", "several launches start with 'alpha'"),
            ("alpha-2", "launch alpha-2 has 1 of 2 ranks in"),
        ):  # fmt: skip
            status, printed = run_command(name, str(path), "--launch", launch_id, handler=command)
            assert (status, printed) == (2, ""), launch_id
            assert why in capsys.readouterr().err, (name, launch_id)
    status, _ = run_command("plot", str(path), "--launch", "beta", handler=plot_command.main)
    assert status == 2 and "only 1 of its runs recorded two samples or more" in capsys.readouterr().err
    status, printed = run_command("explain", str(path), "--launch", "beta", handler=explain_command.main)
    assert status == 0 and printed == (
        "launch beta (2 of 2 ranks): fewer than two of its ranks have records to compare.\n"
        "  run 4 (rank 0) has no records to compare.\n"
    )
    # A rank of a launch whose other ranks are not in the store is explained as a run alone.
    status, printed = run_command("explain", str(path), "--run", "3", handler=explain_command.main)
    assert status == 0 and "launch" not in printed
