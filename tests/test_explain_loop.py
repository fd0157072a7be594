"""``explain`` on real torch training loops (CPU) whose loop sleeps, whose DataLoader is slowed,
or whose forward pass does more work, for a stretch: each named as such.

Each backend is a real training script: a small model, a DataLoader with a worker process, the
monitor writing to a run store. It slows itself for one phase and writes down when (wall time).
Without phase timings (the model watched by a step counter, no hooks) the training process's CPU
tells the loop was idle, and its workers' CPU that it waited for its input; with them (the module
itself watched) the step's phases tell where the time went, and more work in the forward pass,
which no machine signal tells from the loop's usual work, is compute.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import backend_script, run_command

from sampler import catalogue
from sampler.analysis import stretches
from sampler.analysis.explain import explain
from sampler.commands import explain as explain_command
from sampler.store.reader import StoreReader

pytest.importorskip("torch")

LOOP = """
import json, os, time
import torch
from torch.utils.data import DataLoader, IterableDataset

STORE, TIMES, SLOWED, PHASED, SLOW_FLAG = {store!r}, {times!r}, {slowed!r}, {phased!r}, {flag!r}
torch.set_num_threads(1)
torch.manual_seed(0)

class Batches(IterableDataset):
    # Endless batches; while the flag file exists each takes 30 ms of the worker's CPU to make.
    def __iter__(self):
        while True:
            if os.path.exists(SLOW_FLAG):
                until = time.perf_counter() + 0.03
                while time.perf_counter() < until:
                    pass
            yield torch.randn(32, 64), torch.randn(32, 1)

class Steps:
    age = 0
    def get_age(self):
        return self.age

class Net(torch.nn.Module):
    # While ``heavy`` is set, each forward pass does 20 more 256x256 layers' work.
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        self.wide, self.extra = torch.randn(64, 256) / 8, torch.randn(256, 256) / 16
        self.heavy = False
    def forward(self, x):
        if self.heavy:  # work whose result is not needed: the forward pass takes longer
            h = x @ self.wide
            for _ in range(20):
                h = torch.tanh(h @ self.extra)
        return self.layers(x)

model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
steps = Steps()
sampler.watch_model(model if PHASED else steps)  # the module: its steps' phases are timed
monitor = sampler.ResourceMonitor(
    store=STORE, interval_seconds=0.1, _min_interval_seconds=0.05,
    categories=["cpu", "memory", "process", "process_tree", "pressure"],
).start()
batches = iter(DataLoader(Batches(), batch_size=None, num_workers=1, prefetch_factor=2))
while monitor.stats()["records_read"] < 3:
    time.sleep(0.01)

def train(seconds, sleep=0.0):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        x, y = next(batches)
        for _ in range(4):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps.age += 1
        if sleep:
            time.sleep(sleep)

times = []
for kind, seconds in [("quiet", 3.0), (SLOWED, 3.0), ("quiet", 2.0)]:
    start = time.time()
    if kind == "compute":
        model.heavy = True
        train(seconds)
        model.heavy = False
    elif kind == "input":
        open(SLOW_FLAG, "w").close()
        train(seconds)
        os.unlink(SLOW_FLAG)
    elif kind == "sleep-input":  # the loop sleeps, then waits for its input: one stretch
        train(seconds * 0.4, sleep=0.03)
        open(SLOW_FLAG, "w").close()
        train(seconds * 0.6)
        os.unlink(SLOW_FLAG)
    else:
        train(seconds, sleep=0.03 if kind == "sleep" else 0.0)
    times.append((kind, start, time.time()))
monitor.stop()
with open(TIMES, "w") as f:
    json.dump(times, f)
"""

INPUT_SHARE = catalogue.name_of(catalogue.PHASE_SHARES[0])


def run_loop(tmp_path: Path, slowed: str, phased: bool) -> tuple[float, float]:
    """Run the loop slowed by ``slowed`` (``sleep``: the loop sleeps 30 ms each batch; ``input``:
    each batch takes its worker 30 ms; ``compute``: each forward pass does 20 layers more;
    ``sleep-input``: the first 40 % sleeps, the rest waits for its input); returns when the slowed
    phase began and ended."""
    store, times = tmp_path / "runs.sqlite", tmp_path / "times.json"
    script = tmp_path / "train.py"
    body = LOOP.format(
        store=str(store), times=str(times), slowed=slowed, phased=phased, flag=str(tmp_path / "slow")
    )
    script.write_text(backend_script(body))
    backend = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True)
    try:
        _, err = backend.communicate(timeout=120)
    finally:
        backend.kill()
        backend.wait()
    assert backend.returncode == 0, err
    ((_, start, end),) = [item for item in json.loads(times.read_text()) if item[0] == slowed]
    return start, end


def causes_during(tmp_path: Path, start: float, end: float, phased: bool) -> tuple[list[Any], str]:
    """The slow stretches overlapping [start, end], and what ``explain`` prints."""
    with StoreReader(str(tmp_path / "runs.sqlite")) as reader:
        run = reader.run()
        assert (INPUT_SHARE in reader.names(run.id)) == phased  # the module watched: its phases timed
        explanation = explain(reader, run)
    status, printed = run_command("explain", str(tmp_path / "runs.sqlite"), handler=explain_command.main)
    assert status == 0
    print(printed)
    status, as_json = run_command(
        "explain", str(tmp_path / "runs.sqlite"), "--json", handler=explain_command.main
    )
    assert status == 0
    reasons = [reason for item in json.loads(as_json)["stretches"] for reason in item["reasons"]]
    assert reasons and all(  # today's fields, and the share of the stretch each cause held
        set(reason) == {"cause", "text", "evidence", "strength", "share"} and 0 < reason["share"] <= 1
        for reason in reasons
    )
    found = [
        e
        for e in explanation.stretches
        if e.stretch.kind == stretches.SLOW and e.stretch.start_wall < end and e.stretch.end_wall > start
    ]
    return found, printed


EXPECTED = {
    ("sleep", False): {"process_idle"},
    ("sleep", True): {"loop_idle"},
    ("input", False): {"input_bound"},
    ("input", True): {"input_bound"},
    ("compute", True): {"compute_bound"},
}
"""What a stretch of each slowdown is named, without and with the step's phases timed."""


@pytest.mark.parametrize(
    ("slowed", "phased"), list(EXPECTED), ids=[f"{s}-{'phased' if p else 'unphased'}" for s, p in EXPECTED]
)
@pytest.mark.usefixtures("whole_machine")
def test_a_sleeping_loop_a_slowed_dataloader_and_a_heavier_forward_are_each_named(
    tmp_path: Path, slowed: str, phased: bool
) -> None:
    start, end = run_loop(tmp_path, slowed, phased)
    found, printed = causes_during(tmp_path, start, end, phased)
    assert found, f"no slow stretch found for the {slowed} phase:\n{printed}"
    named = {reason.cause for item in found for reason in item.reasons}
    assert EXPECTED[slowed, phased] & named, printed
    # The first-named cause of the stretch that overlaps the phase most is it.
    main = max(found, key=lambda e: min(end, e.stretch.end_wall) - max(start, e.stretch.start_wall))
    assert main.reasons and main.reasons[0].cause in EXPECTED[slowed, phased], printed


@pytest.mark.usefixtures("whole_machine")
def test_a_loop_that_slept_then_waited_for_its_input_is_named_both_ways_with_their_shares(
    tmp_path: Path,
) -> None:
    start, end = run_loop(tmp_path, "sleep-input", False)
    found, printed = causes_during(tmp_path, start, end, False)
    shares = {reason.cause: reason.share for item in found for reason in item.reasons}
    if "input_bound" not in shares and {"cpu_starved", "cpu_pressure"} & set(shares):
        pytest.skip(
            f"other work on the machine held the DataLoader's workers back, hiding their rise: {printed}"
        )
    assert {"input_bound", "process_idle"} <= set(shares), printed
    assert min(shares["input_bound"], shares["process_idle"]) < 1, printed  # one held for part of it


EPOCHS = """
import time
import torch
from torch.utils.data import DataLoader, Dataset

STORE, PERSISTENT = {store!r}, {persistent!r}
torch.set_num_threads(1)

class Batches(Dataset):
    def __len__(self):
        return 300
    def __getitem__(self, i):
        return torch.randn(16, 64), torch.randn(16, 1)

def slow_start(worker_id):  # a worker's own start-up: imports, opening its files, an index
    time.sleep(1.5)

model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
sampler.watch_model(model)
monitor = sampler.ResourceMonitor(
    store=STORE, interval_seconds=0.1, _min_interval_seconds=0.05,
    categories=["cpu", "memory", "process", "process_tree", "pressure"],
).start()
loader = DataLoader(
    Batches(), batch_size=None, num_workers=2, worker_init_fn=slow_start,
    persistent_workers=PERSISTENT, prefetch_factor=4,
)
for epoch in range(4):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
monitor.stop()
"""


@pytest.mark.parametrize("persistent", [False, True], ids=["workers-each-epoch", "persistent-workers"])
@pytest.mark.usefixtures("whole_machine")
def test_dataloader_workers_started_again_at_each_epoch_are_named(tmp_path: Path, persistent: bool) -> None:
    """Four short epochs whose two DataLoader workers take 1.5 s to start: without
    ``persistent_workers`` each epoch after the first begins with the loop waiting for them, which
    read as "an evaluation or a checkpoint"; with it, only the run's start-up waits."""
    store, script = tmp_path / "runs.sqlite", tmp_path / "train.py"
    script.write_text(backend_script(EPOCHS.format(store=str(store), persistent=persistent)))
    backend = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True)
    try:
        _, err = backend.communicate(timeout=120)
    finally:
        backend.kill()
        backend.wait()
    assert backend.returncode == 0, err
    with StoreReader(str(store)) as reader:
        explanation = explain(reader, reader.run())
    status, printed = run_command("explain", str(store), handler=explain_command.main)
    assert status == 0
    print(printed)
    named = [
        reason for item in explanation.stretches for reason in item.reasons if reason.cause == "input_pause"
    ]
    if persistent:  # the workers' one start is the run's start-up (or, logged late, one input pause)
        assert len(named) <= 1 and "started again at each epoch" not in printed, printed
        return
    assert len(named) >= 2, printed  # three epochs began again; one may merge into a slow stretch
    assert "the DataLoader's workers started again at each epoch" in printed, printed
    assert "persistent_workers=True keeps them" in printed and "not an evaluation or a checkpoint" in printed
    assert "(an evaluation or a checkpoint, not a slowdown)" not in printed, printed
