"""``python -m sampler demo``: a small real training job, monitored and recorded.

A NumPy MLP learns to tell three interleaved spirals apart (no GPU, no torch).
Its model age is its step; its loss and accuracy go through the signal
pipeline, the monitor samples the machine beside them, and the run store keeps
both. At the end it draws loss and resource curves on one step axis and says
how to look further.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from sampler import signals
from sampler.api.monitor import ResourceMonitor
from sampler.commands.common import DEFAULT_STORE, EXIT_USAGE, output_argument, seconds_argument, this_python
from sampler.pipeline.steps import watch_model
from sampler.store.reader import StoreReader

Array = npt.NDArray[np.float64]
_SECONDS = seconds_argument(86400, "(a day)")
CLASSES = 3


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "demo", help="train a small NumPy model for a minute with the monitor on", description=__doc__
    )
    parser.add_argument("--duration", type=_SECONDS, default=60.0, help="seconds of training (default 60)")
    parser.add_argument(
        "--store", default=DEFAULT_STORE, help=f"run store to record into (default ./{DEFAULT_STORE})"
    )
    parser.add_argument(
        "-o", "--output", type=output_argument, help="the plot to write (default: demo-run<ID>.png)"
    )
    parser.add_argument("--interval", type=_SECONDS, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--nvml-module", default="pynvml", help=argparse.SUPPRESS)
    parser.set_defaults(handler=main)


class Spirals:
    """Three interleaved spirals in the plane, with a little noise."""

    def __init__(self, points_per_class: int, rng: np.random.Generator) -> None:
        radius = np.tile(np.linspace(0.05, 1.0, points_per_class), CLASSES)
        labels = np.repeat(np.arange(CLASSES), points_per_class)
        angle = labels * 2 * math.pi / CLASSES + radius * 3 * math.pi + rng.normal(0, 0.5, radius.size)
        self.x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
        self.y = labels

    def batch(self, size: int, rng: np.random.Generator) -> tuple[Array, npt.NDArray[np.int64]]:
        index = rng.integers(0, len(self.y), size)
        return self.x[index], self.y[index]


class MLP:
    """2 -> 64 -> 64 -> 3, ReLU, softmax cross-entropy, SGD with momentum.
    ``age`` (steps trained) is what stamps the resource samples."""

    def __init__(self, rng: np.random.Generator, hidden: int = 256) -> None:
        sizes = [2, hidden, hidden, CLASSES]
        self.weights = [rng.normal(0, math.sqrt(2 / n), (n, m)) for n, m in itertools.pairwise(sizes)]
        self.biases = [np.zeros(m) for m in sizes[1:]]
        self.velocity = [np.zeros_like(p) for p in self.weights + self.biases]
        self.age = 0

    def get_age(self) -> int:
        return self.age

    def forward(self, x: Array) -> tuple[list[Array], Array]:
        activations = [x]
        for w, b in zip(self.weights[:-1], self.biases[:-1], strict=True):
            activations.append(np.maximum(activations[-1] @ w + b, 0.0))
        logits = activations[-1] @ self.weights[-1] + self.biases[-1]
        return activations, logits

    def step(self, x: Array, y: npt.NDArray[np.int64], lr: float = 0.005, momentum: float = 0.9) -> float:
        """One SGD step on a batch; returns its loss."""
        activations, logits = self.forward(x)
        shifted = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
        loss = float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())
        grad = probs
        grad[np.arange(len(y)), y] -= 1.0
        grad /= len(y)
        grads_w, grads_b = [], []
        for layer in range(len(self.weights) - 1, -1, -1):
            grads_w.append(activations[layer].T @ grad)
            grads_b.append(grad.sum(axis=0))
            if layer:
                grad = (grad @ self.weights[layer].T) * (activations[layer] > 0)
        grads = grads_w[::-1] + grads_b[::-1]
        for param, velocity, g in zip(self.weights + self.biases, self.velocity, grads, strict=True):
            velocity *= momentum
            velocity -= lr * g
            param += velocity
        self.age += 1
        return loss

    def accuracy(self, x: Array, y: npt.NDArray[np.int64]) -> float:
        return float((self.forward(x)[1].argmax(axis=1) == y).mean())


def main(args: argparse.Namespace) -> int:
    out: TextIO = args.out
    if args.output == "-":  # its report goes to standard output: a PNG there would be mixed into it
        print(
            "error: the demo prints its report on standard output, so its plot cannot go there: name a "
            "file with -o, or run `python -m sampler plot STORE -o -` on the store it leaves",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        from tqdm import tqdm

        from sampler.views.plot import render
    except ImportError as exc:
        extra = "pip install 'wl-resource-monitor[plot]'"
        print(f"error: the demo needs the plot extra ({exc.name} is missing): {extra}", file=sys.stderr)
        return EXIT_USAGE
    rng = np.random.default_rng(0)
    data, held_out = Spirals(2000, rng), Spirals(300, rng)
    model = MLP(rng)
    watch_model(model)
    store = str(Path(args.store).resolve())
    monitor = ResourceMonitor(interval_seconds=args.interval, store=store, nvml_module=args.nvml_module)
    every = f"monitoring every {args.interval:g} s into {store}"
    print(f"training a NumPy MLP for {args.duration:g} s; {every}", file=out)
    accuracy = 0.0
    try:
        total = round(args.duration)
        with monitor, tqdm(total=total, unit="s", dynamic_ncols=True) as bar:
            began = time.monotonic()
            while (elapsed := time.monotonic() - began) < args.duration:
                loss = model.step(*data.batch(256, rng))
                signals.log_signal("train/loss", loss, model.age)
                if model.age % 100 == 0:
                    accuracy = model.accuracy(held_out.x, held_out.y)
                    signals.log_signal("train/accuracy", accuracy, model.age)
                    bar.set_postfix(
                        step=model.age, loss=f"{loss:.3f}", accuracy=f"{accuracy:.2f}", refresh=False
                    )
                bar.update(min(round(elapsed), total) - bar.n)
    except KeyboardInterrupt:
        print("interrupted; plotting what was recorded", file=out)
    finally:
        watch_model(None)
    with StoreReader(store) as reader:
        run = reader.run()
        output = Path(args.output or f"demo-run{run.id}.png")
        render(reader, [run], output=output)
    stats = monitor.stats()
    python = this_python()
    print(
        f"\n{model.age} steps, held-out accuracy {accuracy:.2f}; {stats['records_logged']} resource samples "
        f"recorded as run {run.id}\nplot: {output.resolve()}\n\nlook further:\n"
        f"  {python} -m sampler runs {args.store}\n"
        f"  {python} -m sampler plot {args.store} --run {run.id} --x seconds\n"
        f"  {python} -m sampler explain {args.store} --run {run.id}\n"
        f"  {python} -m sampler export {args.store} --run {run.id} --wide > run{run.id}.csv\n"
        f"  {python} -m sampler top {args.store}     (live, while a run writes the store)",
        file=out,
    )
    return 0
