"""Issue 29's collective hang in a real launch: ``torchrun --nproc-per-node 2`` of a data-parallel
script (``ddp_stall.py``: gloo on the CPU, ``DistributedDataParallel``) where rank 1 sleeps
instead of its backward at one step. Each rank's sampling child must record the stall: rank 0's
stacks show its backward waiting in DDP's all-reduce, rank 1's show where it is instead; both
close when the steps move again, and ``stalls`` shows them."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ENV_VARS, run_command
from test_stalls import main_thread_frames

from sampler.commands import stalls as stalls_command
from sampler.supervision.stacks import STACK_SIGNAL

pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.skipif(
    STACK_SIGNAL is None or not sys.platform.startswith("linux"), reason="the dump handler needs Linux"
)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "ddp_stall.py"
STALL_SECONDS = 3.0
"""The ranks' stall timeout: a step takes a few tens of ms."""
HANG_SECONDS = 12.0
"""How long rank 1 stays out of the all-reduce: past the timeout, two intervals and the capture."""


def torchrun(where: Path) -> tuple[Path, str]:
    """Run the launch in ``where`` to its end: (its store, what it printed)."""
    store = where / "runs.sqlite"
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv += [str(SCRIPT), str(store), str(STALL_SECONDS), str(HANG_SECONDS)]
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
        printed, _ = launcher.communicate(timeout=150)
    finally:  # whatever happened: the launcher's session (it and its ranks), by its id
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert launcher.returncode == 0, printed
    return store, printed


def frames(row: sqlite3.Row) -> list[str]:
    """The main thread's frames in a stall row, innermost first (none without stacks)."""
    return main_thread_frames(row["stacks"]) if row["stacks"] and "[main thread]" in row["stacks"] else []


@pytest.mark.timeout(200)  # one launch of two ranks (about 30 s on an idle 2-core machine), bounded at 150 s
def test_a_rank_that_skips_the_all_reduce_is_seen_there_and_the_rank_waiting_in_it_is_seen_waiting(
    tmp_path: Path,
) -> None:
    store, printed = torchrun(tmp_path)
    db = sqlite3.connect(store)
    db.row_factory = sqlite3.Row
    try:
        rows = db.execute(
            "SELECT r.rank, s.* FROM stalls s JOIN runs r ON r.id = s.run_id ORDER BY s.id"
        ).fetchall()
    finally:
        db.close()
    by_rank: dict[int, list[sqlite3.Row]] = {}
    for row in rows:
        by_rank.setdefault(row["rank"], []).append(row)
    assert set(by_rank) == {0, 1}, printed
    waiting = [r for r in by_rank[0] if any(f.endswith("in backward") for f in frames(r))]
    assert len(waiting) == 1, [r["stacks"] for r in by_rank[0]]
    rank0 = waiting[0]
    assert frames(rank0)[0].endswith("in _engine_run_backward"), frames(rank0)  # waiting on DDP's reducer
    assert any(frame.endswith("in train_step") for frame in frames(rank0)), frames(rank0)
    (rank1,) = [r for r in by_rank[1] if frames(r)[:1] and frames(r)[0].endswith("in skip_the_all_reduce")]
    assert rank0["step"] == rank1["step"]  # both stand at the step rank 1 never finished
    assert rank0["duration"] is not None and rank1["duration"] is not None  # closed when it moved
    status, out = run_command("stalls", str(store), handler=stalls_command.main)
    assert status == 0 and "in skip_the_all_reduce" in out and "in backward" in out
    print(out)
