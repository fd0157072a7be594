"""A data-parallel launch where rank 1 stops joining the all-reduce for a while, for
``test_stall_launch.py``, run by ``torchrun --nproc-per-node 2``: gloo on the CPU,
``DistributedDataParallel``, each rank's monitor watching stalls with a fixed timeout and writing
one run store.

``python ddp_stall.py STORE STALL_SECONDS HANG_SECONDS``: the ranks train in step until both
monitors have logged a few records; then, at one step, rank 1 runs its forward but sleeps
``HANG_SECONDS`` in ``skip_the_all_reduce`` instead of its backward, while rank 0's backward waits
in DDP's all-reduce for it; then both train until their monitors have logged a few more records
(the stalls close) and stop.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import sampler

RECORDS_AROUND = 4
"""Records each monitor logs before the hang (its child has seen the step move), and again after
it (its child has seen the step move again)."""
STEP_SECONDS = 0.03
"""Host work per step, which paces it."""


def skip_the_all_reduce(seconds: float) -> None:
    """Where rank 1 is instead of its backward (and so instead of DDP's all-reduce)."""
    time.sleep(seconds)


def train_step(ddp: torch.nn.Module, optimizer: torch.optim.Optimizer, hang: float) -> None:
    x, y = torch.randn(8, 32), torch.randn(8, 1)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    if hang:
        skip_the_all_reduce(hang)
    loss.backward()  # DDP's reducer all-reduces the gradients here and waits for every rank
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(STEP_SECONDS)


def train_until(
    ddp: torch.nn.Module, optimizer: torch.optim.Optimizer, monitor: sampler.ResourceMonitor, records: int
) -> None:
    """Train in step until every rank's monitor has logged ``records`` records."""
    while True:
        train_step(ddp, optimizer, 0.0)
        ready = torch.tensor([monitor.stats()["records_logged"] >= records], dtype=torch.int32)
        dist.all_reduce(ready, op=dist.ReduceOp.MIN)  # every rank leaves at the same step
        if ready.item():
            return


def main() -> None:
    store, stall_seconds, hang_seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
    sampler.watch_model(ddp)
    monitor = sampler.ResourceMonitor(
        store=store,
        categories=["cpu"],
        interval_seconds=0.5,
        _min_interval_seconds=0.5,
        postmortem_dir=None,
        stall_seconds=stall_seconds,
    )
    monitor.start()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    train_until(ddp, optimizer, monitor, RECORDS_AROUND)
    train_step(ddp, optimizer, hang_seconds if rank == 1 else 0.0)
    train_until(ddp, optimizer, monitor, monitor.stats()["records_logged"] + RECORDS_AROUND)
    monitor.stop()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
