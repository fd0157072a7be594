"""Separate launches stay separate in the run store, whatever id their launcher gives them.

torchrun's static rendezvous (``--master-port``, as every multi-node launch has) sets
``TORCHELASTIC_RUN_ID=none`` and the same ``MASTER_ADDR:MASTER_PORT`` at every launch: the real
torchrun, launched twice with one port, must still give two launches of two ranks each.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ENV_VARS, FAST, backend_script, free_ports, run_command

from sampler.commands import explain as explain_command
from sampler.commands import runs as runs_command
from sampler.settings.placement import Placement
from sampler.store.reader import Launch, StoreReader, launches
from sampler.store.writer import RunInfo, RunWriter

CPU = "resource/process/cpu_utilization_percent"
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable))


AGENT_TIMEOUT = 240.0
"""Seconds a launch may take: torch's import and the agents' rendezvous are slow on a busy machine."""


def rank_script(store: Path) -> str:
    """A rank: a monitor that records into ``store`` until it logged a few records."""
    return backend_script(
        f"""
        mon = sampler.ResourceMonitor(
            store={str(store)!r}, postmortem_dir=None, categories=["cpu"], step_source="seconds",
            interval_seconds=0.2, _min_interval_seconds={FAST["_min_interval_seconds"]},
        )
        mon.start()
        while mon.stats()["records_logged"] < 3:
            time.sleep(0.05)
        mon.stop()
        """
    )


def launch(tmp_path: Path, port: int, nodes: int) -> None:
    """One torchrun launch of two ranks with the static rendezvous at ``port``: one agent
    running both (``nodes`` 1), or two agents of one rank each, as two hosts would run them."""
    script = tmp_path / "rank.py"
    script.write_text(rank_script(tmp_path / "runs.sqlite"))
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    common = [f"--nnodes={nodes}", f"--nproc-per-node={2 // nodes}", "--master-addr=127.0.0.1"]
    agents = [
        subprocess.Popen(
            [str(TORCHRUN), *common, f"--node-rank={node}", f"--master-port={port}", str(script)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(nodes)
    ]
    outputs: list[str] = []
    try:
        for agent in agents:
            outputs.append(agent.communicate(timeout=AGENT_TIMEOUT)[0])
    finally:  # whatever happened: stop (by pid: the agent stops its ranks) and reap what still runs
        for agent in agents[len(outputs) :]:
            agent.terminate()
            try:
                outputs.append(agent.communicate(timeout=60)[0])
            except subprocess.TimeoutExpired:
                agent.kill()
                outputs.append(agent.communicate()[0])
    assert [agent.returncode for agent in agents] == [0] * nodes, "\n".join(outputs)


def launch_lines(store: Path) -> list[str]:
    status, printed = run_command("runs", str(store), handler=runs_command.main)
    assert status == 0
    print(printed)
    return [line for line in printed.splitlines() if line.startswith("launch ")]


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("nodes", [1, 2])
def test_two_torchrun_launches_at_one_master_port_are_two_launches(tmp_path: Path, nodes: int) -> None:
    port = free_ports()
    for _ in range(2):
        launch(tmp_path, port, nodes)
    lines = launch_lines(tmp_path / "runs.sqlite")
    assert len(lines) == 2 and all(line.endswith(": 2 of 2 ranks") for line in lines), lines
    ids = [line.removeprefix("launch ").removesuffix(": 2 of 2 ranks") for line in lines]
    if nodes == 1:  # the agent tells its launches apart: so do their run_id labels
        assert (
            all(re.fullmatch(rf"127\.0\.0\.1:{port}-[0-9a-f]{{8}}", i) for i in ids) and len(set(ids)) == 2
        ), ids
    else:  # the address alone is shared: the reader tells them apart, by their first runs
        assert ids == [f"127.0.0.1:{port}@run1", f"127.0.0.1:{port}@run3"]


# --------------------------------------------------------------------------- the reader's rule


def write_rank(path: Path, rank: int, pid: int, launch_id: str = "job", world: int = 2) -> None:
    """A rank's run as the store's own writer records it: backend ``pid``, three records a
    second apart, 100 steps each."""
    where = Placement("node", rank, rank, world, world, launch_id)
    info = RunInfo(pid, ["train"], {"interval_seconds": 1.0}, time.time() - 10, where)
    writer = RunWriter(str(path), info)
    base = time.monotonic_ns() - 5 * 10**9
    for i in range(3):
        writer.record({CPU: 50.0}, 100 * (i + 1), base + i * 10**9, None)
    writer.close({})


def test_a_rank_back_in_another_process_begins_the_id_s_next_launch(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    write_rank(path, 0, 100)
    write_rank(path, 1, 101)
    write_rank(path, 0, 100)  # rank 0's process started its monitor again: the same launch
    write_rank(path, 1, 201)  # rank 1 in another process: the next launch, whose rank 0 ...
    write_rank(path, 0, 200)
    write_rank(path, 1, 301, launch_id="other")
    write_rank(path, 0, 301)  # ... and a third launch, of which the store holds one rank
    with StoreReader(str(path)) as reader:
        found = [item for item in launches(reader.runs()) if isinstance(item, Launch)]
        assert [(launch.id, launch.held, [run.id for run in launch.runs]) for launch in found] == [
            ("job@run1", "2 of 2 ranks, 3 runs", [1, 3, 2]),
            ("job@run4", "2 of 2 ranks", [5, 4]),
            ("other", "1 of 2 ranks", [6]),
            ("job@run7", "1 of 2 ranks", [7]),
        ]
        with pytest.raises(LookupError, match="several launches start with 'job'"):
            reader.launch("job")
        assert reader.launch("job@run4").runs == found[1].runs
    status, printed = run_command("runs", str(path), handler=runs_command.main)
    assert status == 0 and [line for line in printed.splitlines() if line.startswith("launch ")] == [
        "launch job@run1: 2 of 2 ranks, 3 runs",
        "launch job@run4: 2 of 2 ranks",
        "launch other: 1 of 2 ranks",
        "launch job@run7: 1 of 2 ranks",
    ]


def test_explain_compares_a_rank_with_its_own_launch_alone(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    for pids in ((100, 101), (200, 201)):
        for rank, pid in enumerate(pids):
            write_rank(path, rank, pid)
    status, printed = run_command("explain", str(path), "--json", handler=explain_command.main)
    assert status == 0
    compared = json.loads(printed)["launch"]
    assert compared["launch"] == "job@run3" and sorted(r["run"] for r in compared["ranks"]) == [3, 4]
