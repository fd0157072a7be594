"""What ``watch_model(module)`` costs a forward pass: the forward pre-hook that
counts training-mode passes, measured side by side against the same module
unwatched, in alternating rounds.

``python -m bench.hook_cost [--rounds 7] [--calls 20000]``: prints the median
time per forward pass of a small module with and without the hook, and the
difference (the hook's cost per pass, in µs).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sampler.pipeline.steps import watch_model


def per_call_seconds(module: torch.nn.Module, x: torch.Tensor, calls: int) -> float:
    """Mean seconds per forward pass over ``calls`` passes."""
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(calls):
            module(x)
        return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    module = torch.nn.Linear(4, 4)
    x = torch.zeros(1, 4)
    per_call_seconds(module, x, args.calls)  # warm up
    bare: list[float] = []
    hooked: list[float] = []
    for _ in range(args.rounds):
        watch_model(None)
        bare.append(per_call_seconds(module, x, args.calls))
        watch_model(module)
        hooked.append(per_call_seconds(module, x, args.calls))
    watch_model(None)
    b, h = statistics.median(bare), statistics.median(hooked)
    print(f"forward pass, unwatched: {b * 1e6:.2f} µs (median of {args.rounds} rounds of {args.calls})")
    print(f"forward pass, watched:   {h * 1e6:.2f} µs")
    print(f"the hook's cost:         {(h - b) * 1e6:+.3f} µs per pass ({h / b:.3f}\N{MULTIPLICATION SIGN})")
    pairs = [hh - bb for bb, hh in zip(bare, hooked, strict=True)]
    print(f"per round: {', '.join(f'{p * 1e6:+.3f}' for p in pairs)} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
