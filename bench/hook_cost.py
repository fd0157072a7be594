"""What ``watch_model(module)`` costs a training step: the hooks that count the model's age and
time the step's phases (the module's forward pre-hook and hook, torch's global optimizer step
hooks, the DataLoader iterator's timed ``__next__``), measured side by side against the same
loop unwatched, in alternating rounds.

``python -m bench.hook_cost [--rounds 7] [--steps 5000] [--quick]``: a step of a tiny model
(``Linear(4, 4)``, one thread) drawn from a ``DataLoader`` with no workers, forward, loss,
backward and an SGD step; prints the median time per step with and without the hooks, their
difference (the hooks' cost per step, µs) and that cost as a share of the step. The tiny step
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
    bare: list[float] = []
    hooked: list[float] = []
    try:
        for _ in range(args.rounds):
            watch_model(None)
            bare.append(per_step_seconds(module, optimizer, loader, args.steps))
            watch_model(module)
            hooked.append(per_step_seconds(module, optimizer, loader, args.steps))
    finally:
        watch_model(None)
    b, h = statistics.median(bare), statistics.median(hooked)
    pairs = [hh - bb for bb, hh in zip(bare, hooked, strict=True)]
    cost = statistics.median(pairs)
    print(f"training step, unwatched: {b * 1e6:.2f} µs (median of {args.rounds} rounds of {args.steps})")
    print(f"training step, watched:   {h * 1e6:.2f} µs")
    print(
        f"the hooks' cost:          {cost * 1e6:+.3f} µs per step (median of the rounds' differences), "
        f"{100 * cost / b:.2f} % of this tiny step"
    )
    print(f"per round: {', '.join(f'{p * 1e6:+.3f}' for p in pairs)} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
