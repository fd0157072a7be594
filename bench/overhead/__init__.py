"""What monitoring costs a training job: off, in-thread and isolated, side by side.

    python -m bench [--quick] [--json PATH] [--plot PATH]
    python -m bench.overhead --floor-only --intervals 1 --rounds 5 --seconds 30

Runs the same training-like workloads with monitoring off, in-thread
(``isolation="thread"``) and isolated (``isolation="process"``), interleaved
round by round (off, thread, process, off, ...) so drift in the machine's speed
hits all three alike, at the 1 s interval floor and at a stress interval below
it that makes small per-sample costs visible. In the same rounds it measures
the floor (a bare daemon thread woken through a pipe by another process once
per sample, making the same 27 sink calls and nothing else) against the
isolated monitor with and without the run store, and a GIL-bound training loop
that logs its loss every step through the pipeline (``log_signal``), with the
isolated monitor and with the store on. Then it measures how the cost grows
with the number of GPUs (the tests' fake NVIDIA driver with 1, 8 and 64 devices) and with all
categories on versus one. Prints a Markdown report, checks the targets, and
optionally writes the numbers as JSON and a PNG chart (matplotlib).
``--floor-only`` keeps the idle backend against the floor alone, for long rounds.

Modules, one job each: ``plan`` (what is measured), ``workloads``, ``floor``,
``measure`` (one run, and the rounds), ``summary`` (medians and paired ratios
under typed keys), ``targets``, ``report`` (Markdown and chart), ``cli``.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the package, and the fake driver for GPU scaling

from bench.overhead.cli import main  # noqa: E402  (after the path set-up above)
from bench.overhead.plan import FLOOR_SIGNALS  # noqa: E402
from bench.overhead.workloads import noop_sink  # noqa: E402

__all__ = ["FLOOR_SIGNALS", "main", "noop_sink"]
