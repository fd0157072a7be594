"""A synchronous data-parallel training launch for ``test_culprit_launch.py``, run by
``torchrun --nproc-per-node 3``: gloo on the CPU, ``DistributedDataParallel``, a DataLoader with
one worker per rank, every rank's monitor writing one run store and serving its endpoint.

``python ddp_culprit.py STORE SCHEDULE PORT SD_DIR PLAN``: ``PLAN`` is ``quiet:SECONDS`` (every
rank trains alike), or ``slow:WARM:STRETCH:GAP:TAIL`` (after ``WARM`` s, rank 1's dataset is
slow for ``STRETCH`` s; ``GAP`` s later rank 2's forward does extra work for ``STRETCH`` s; then
``TAIL`` s more). Rank 0 writes the stretches' wall times to ``SCHEDULE`` (JSON) once they are
fixed, on a clock every rank shares (rank 0's, broadcast).
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import sampler

ITEM_SECONDS = 0.0125
"""Rank 1's dataset sleeps this long per item while slow: 0.1 s per batch of 8, its one worker
falling far behind the step."""
EXTRA_SECONDS = 0.1
"""Rank 2's forward computes this much longer per step while slow."""
HOST_SECONDS = 0.02
"""Every rank's host work per step (``other``), which paces the quiet step (a few ms of compute)."""


class Batches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random samples, each ``ITEM_SECONDS`` late between ``slow``'s two wall times."""

    def __init__(self) -> None:
        self.slow = (0.0, 0.0)

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slow[0] <= time.time() < self.slow[1]:
            time.sleep(ITEM_SECONDS)
        return torch.randn(32), torch.randn(1)


class Model(torch.nn.Module):
    """A small MLP whose forward computes ``EXTRA_SECONDS`` longer between ``busy``'s wall times."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        self.busy = (0.0, 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.busy[0] <= time.time() < self.busy[1]:
            until = time.perf_counter() + EXTRA_SECONDS
            work = torch.randn(64, 64)
            while time.perf_counter() < until:
                work = torch.tanh(work @ work)
        out: torch.Tensor = self.net(x)
        return out


def main() -> None:
    store, schedule_path, port, sd_dir, plan = sys.argv[1:6]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    kind, *numbers = plan.split(":")
    seconds = [float(n) for n in numbers]
    start = torch.tensor([time.time() + 1.0], dtype=torch.float64)  # once every rank is up
    dist.broadcast(start, 0)
    t0 = float(start[0])
    data, model = Batches(), Model()
    if kind == "quiet":
        (length,) = seconds
        stretches = {}
        end = t0 + length
    else:
        warm, stretch, gap, tail = seconds
        stretches = {"input": (t0 + warm, t0 + warm + stretch)}
        stretches["compute"] = (stretches["input"][1] + gap, stretches["input"][1] + gap + stretch)
        end = stretches["compute"][1] + tail
        if rank == 1:
            data.slow = stretches["input"]
        if rank == 2:
            model.busy = stretches["compute"]
    if rank == 0:
        with open(schedule_path, "w") as out:
            json.dump({"start": t0, "end": end, **stretches}, out)
    ddp = DistributedDataParallel(model)
    sampler.watch_model(ddp)
    monitor = sampler.ResourceMonitor(
        store=store,
        interval_seconds=0.5,
        postmortem_dir=None,
        prometheus_port=int(port),
        prometheus_sd_dir=sd_dir,
    )
    monitor.start()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=8, num_workers=1, persistent_workers=True)
    batches = iter(loader)
    while True:
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(HOST_SECONDS)
        done = torch.tensor([time.time() >= end], dtype=torch.int32)
        dist.all_reduce(done, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if done.item():
            break
    monitor.stop()
    del batches
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
