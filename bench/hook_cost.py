"""What ``watch_model(module)`` costs a training step: the hooks that count the model's age and
time the step's phases (the module's forward pre-hook and hook, torch's global optimizer step
hooks, the DataLoader iterator's timed ``__next__``), measured side by side against the same
loop unwatched and beside one module hook that does nothing (torch's own cost of calling a
module's hooks, which the forward counter alone paid before the phases were timed), in rounds
that take turns going first.

``python -m bench.hook_cost [--rounds 7] [--steps 5000] [--quick]``: a step of a tiny model
(``Linear(4, 4)``, one thread) drawn from a ``DataLoader`` with no workers, forward, loss,
backward and an SGD step; prints the median time per step of each, the difference from the
unwatched step (the cost per step, µs) and that cost as a share of the step. The tiny step
is a worst case: any real step is longer and the same hooks a smaller share of it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from sampler.pipeline.steps import watch_model


def per_step_seconds(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader, steps: int
) -> float:
    """Mean seconds per training step over ``steps`` steps (the loader cycled as needed)."""
    done = 0
    start = time.perf_counter()
    while done < steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = ((module(x) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
    return (time.perf_counter() - start) / steps


UNWATCHED = "unwatched"
EMPTY_HOOK = "one empty forward pre-hook"
WATCHED = "watched"
WAYS = (UNWATCHED, EMPTY_HOOK, WATCHED)
"""How the step runs: the hooks' cost, and torch's own cost of calling any module hook at all."""


def _nothing(module: object, inputs: object) -> None:
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 300 steps (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 3, 300
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randn(1024, 4), torch.randn(1024, 4)), batch_size=1)
    per_step_seconds(module, optimizer, loader, args.steps)  # warm up
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    try:
        for round_ in range(args.rounds):
            for way in WAYS[round_ % len(WAYS) :] + WAYS[: round_ % len(WAYS)]:  # each goes first in turn
                watch_model(module if way == WATCHED else None)
                handle = module.register_forward_pre_hook(_nothing) if way == EMPTY_HOOK else None
                times[way].append(per_step_seconds(module, optimizer, loader, args.steps))
                if handle is not None:
                    handle.remove()
    finally:
        watch_model(None)
    bare = statistics.median(times[UNWATCHED])
    print(f"training step, {UNWATCHED}: {bare * 1e6:.2f} µs (median of {args.rounds} rounds of {args.steps})")
    for way in (EMPTY_HOOK, WATCHED):
        cost = statistics.median([w - b for b, w in zip(times[UNWATCHED], times[way], strict=True)])
        took = statistics.median(times[way])
        print(
            f"training step, {way}: {took * 1e6:.2f} µs, {cost * 1e6:+.3f} µs per step "
            f"(median of the rounds' differences), {100 * cost / bare:.2f} % of this tiny step"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
