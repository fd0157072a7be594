"""Issue 28's culprit rank in a real launch: ``torchrun --nproc-per-node 3`` of a synchronous
data-parallel script (``ddp_culprit.py``: gloo on the CPU, ``DistributedDataParallel``, a
DataLoader with a worker per rank, ``watch_model``, every rank's monitor writing one store and
serving its endpoint). Rank 1's dataset is slowed for ``STRETCH`` s, then rank 2's forward does
extra work for as long: ``explain --launch`` must name rank 1 and its input for the first
stretch, rank 2 and its compute for the second, and no one else; a quiet launch, no one. Where
Prometheus is installed, a real server scrapes the ranks with the printed rules (their windows
and ``for:`` shortened in the file, as a site would) and ``WlRankHoldingBack`` must fire for
rank 1 (input), then rank 2 (compute), and for no one in the quiet launch.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ENV_VARS, free_ports, machine_to_itself, run_command
from prometheus_server import PrometheusServer, skip_reason

from sampler import commands
from sampler.analysis import ranks
from sampler.commands import explain as explain_command
from sampler.store.reader import Launch, StoreReader, launches

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "ddp_culprit.py"
WARM, STRETCH, GAP, TAIL = 5.0, 15.0, 6.0, 4.0
"""Seconds of the slowed launch: quiet, rank 1's input slow, quiet, rank 2's compute slow, quiet."""
QUIET = 12.0
"""Seconds of the quiet launch."""
EDGE = 2.5
"""Seconds a culprit may reach past its stretch's edges: the records on either side (0.5 s
apart) are interpolated across, and a step under way at the edge is part slow."""
WINDOW, FOR = "4s", "2s"
"""The phases' rate window and ``WlRankHoldingBack``'s ``for:``, shortened for seconds-long stretches."""
ALERT = "WlRankHoldingBack"


def site_rules(tmp_path: Path) -> Path:
    out = io.StringIO()
    assert commands.main(["prometheus", "rules"], out=out) == 0
    rules = yaml.safe_load(out.getvalue())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("record") == "rank:wl_resource_step_phase_seconds:per_step":
                rule["expr"] = rule["expr"].replace("[2m]", f"[{WINDOW}]")
            if rule.get("alert") == ALERT:
                rule["for"] = FOR
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


def torchrun(where: Path, sd_dir: Path, plan: str) -> tuple[Path, dict[str, Any], str]:
    """Run the script's launch in ``where``: (its store, its schedule, its launch id)."""
    where.mkdir()
    store, schedule = where / "runs.sqlite", where / "schedule.json"
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
    argv += [str(SCRIPT), str(store), str(schedule), str(free_ports(3)), str(sd_dir), plan]
    launcher = subprocess.Popen(
        argv,
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        printed, _ = launcher.communicate(timeout=200)
    finally:  # whatever happened: the launcher's session (it, its ranks and their workers), by its id
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert launcher.returncode == 0, printed
    with StoreReader(str(store)) as reader:
        (launch,) = [item for item in launches(reader.runs()) if isinstance(item, Launch)]
    return store, json.loads(schedule.read_text()), launch.id


def explained(store: Path, launch_id: str) -> ranks.Comparison:
    status, printed = run_command("explain", str(store), "--launch", launch_id, handler=explain_command.main)
    print(printed)
    assert status == 0
    with StoreReader(str(store)) as reader:
        return ranks.compare(ranks.gather(reader, reader.launch(launch_id)))


def alerted(server: PrometheusServer | None, launch_id: str) -> dict[tuple[str, str], tuple[float, float]]:
    """(rank, phase) -> (first, last) time ``WlRankHoldingBack`` was firing for it in the launch."""
    if server is None:
        return {}
    firing = f'ALERTS{{alertname="{ALERT}",alertstate="firing",run_id="{launch_id}"}}'
    times: dict[tuple[str, str], list[float]] = {}
    for bound in ("min", "max"):
        for item in server.query(f"{bound}_over_time(timestamp({firing})[15m:500ms])"):
            key = (item["metric"]["rank"], item["metric"]["phase"])
            times.setdefault(key, []).append(float(item["value"][1]))
    return {key: (first, last) for key, (first, last) in times.items()}


@pytest.mark.timeout(
    480
)  # two launches of three ranks (75 s on an idle 2-core machine), each bounded at 200 s
def test_explain_and_the_rule_name_rank_1_for_its_input_then_rank_2_for_its_compute_and_no_one_when_quiet(
    tmp_path: Path,
) -> None:
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    server = None
    if skip_reason() is None:
        server = PrometheusServer(tmp_path / "prometheus", sd_dir, rule_files=(site_rules(tmp_path),)).start()
    try:
        with machine_to_itself():  # ranks judged against each other: not beside busy loops pinned to a core
            store, schedule, launch_id = torchrun(
                tmp_path / "slowed", sd_dir, f"slow:{WARM}:{STRETCH}:{GAP}:{TAIL}"
            )
            comparison = explained(store, launch_id)
            fired = alerted(server, launch_id)
            quiet_store, _, quiet_id = torchrun(tmp_path / "quiet", sd_dir, f"quiet:{QUIET}")
            quiet = explained(quiet_store, quiet_id)
            quiet_fired = alerted(server, quiet_id)
    finally:
        if server is not None:
            server.stop()
    assert comparison.lags == []  # in step: no rank's throughput fell behind
    expected = {(1, ranks.INPUT): schedule["input"], (2, ranks.FORWARD): schedule["compute"]}
    found = [(c.rank.run.rank, c.phase, c.start_wall, c.end_wall) for c in comparison.culprits]
    print(
        "culprits:",
        [(r, p, round(s - schedule["start"], 1), round(e - schedule["start"], 1)) for r, p, s, e in found],
    )
    assert {(rank, phase) for rank, phase, _, _ in found} == set(expected), found
    for (rank, phase), (start, end) in expected.items():
        spans = [(s, e) for r, p, s, e in found if (r, p) == (rank, phase)]
        assert all(start - EDGE <= s and e <= end + EDGE for s, e in spans), (rank, phase, spans)
        assert sum(e - s for s, e in spans) >= 0.6 * (end - start), (rank, phase, spans)
    assert quiet.timed and quiet.culprits == []
    # Nothing else said of a real launch whose ranks all timed their steps and stopped together:
    # no rank untimed or stuck, and no hold in short spells in the quiet one.
    assert comparison.untimed == quiet.untimed == [] and comparison.stops == quiet.stops == []
    assert quiet.fleeting == [], [(r.run.rank, s) for r, s in quiet.fleeting]
    if server is None:
        return
    print(
        "alerts:",
        {
            k: (round(a - schedule["start"], 1), round(b - schedule["start"], 1))
            for k, (a, b) in fired.items()
        },
    )
    assert set(fired) == {("1", "input"), ("2", "compute")}, fired
    assert fired[("1", "input")][1] < fired[("2", "compute")][0]  # rank 1 first, then rank 2
    for key, stretch in ((("1", "input"), schedule["input"]), (("2", "compute"), schedule["compute"])):
        first, last = fired[key]
        assert stretch[0] < first and last < stretch[1] + 2 * EDGE + 4, (key, first, last, stretch)
    assert quiet_fired == {}
