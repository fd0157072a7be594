"""The manual's Lightning and Hugging Face snippets, as written, in a real ``Trainer`` each: a tiny
model built in code (nothing downloaded) trained two epochs on CPU, read back from the logger the
snippet configured (Lightning's CSV file, TensorBoard's event file through its own reader)."""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST, wait_for
from test_exporters import documented_snippet

import sampler
from sampler.integrations.hand_over import HandOver, rank_names
from sampler.settings.placement import Placement
from sampler.store import reader

MONITOR = {"WL_RESOURCE_MONITOR_INTERVAL_SECONDS": "1", "WL_RESOURCE_MONITOR_CATEGORIES": "cpu,process"}

COUNT_MONITORS = """\
import sampler
STARTED = []  # every monitor started in this process: there must be one
_start = sampler.ResourceMonitor.start
def _count(self, *args, **kwargs):
    if not self.running:
        STARTED.append(self)
    return _start(self, *args, **kwargs)
sampler.ResourceMonitor.start = _count
"""

SLOW_STEPS = 0.15
"""Seconds each training step sleeps: 2 epochs of 16 steps last about 5 s, some 5 samples at 1 s."""


def train(tmp_path: Path, prelude: str, after: str, end: str) -> subprocess.CompletedProcess[str]:
    """The manual's snippet after ``after``, as written, between ``prelude`` and ``end``."""
    return run_script(tmp_path, prelude + documented_snippet(after) + end)


def run_script(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``body`` as a script in ``tmp_path``, counting the monitors it starts, with ``MONITOR`` and
    ``env`` in its environment; it must succeed."""
    script = tmp_path / "train.py"
    script.write_text(COUNT_MONITORS + body)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, **MONITOR, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


LIGHTNING_MODEL = f"""\
import time
import torch
import lightning.pytorch as pl

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        time.sleep({SLOW_STEPS})
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

model = Tiny()
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
train_loader = torch.utils.data.DataLoader(data, batch_size=4)
"""


FAILING_FIT = """\
print('monitors', len(STARTED), 'global_step', trainer.global_step)

class Failing(Tiny):
    def training_step(self, batch, batch_idx):
        raise RuntimeError("the loss went NaN")

failing = ResourceMonitorCallback()
trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[failing], enable_checkpointing=False)
try:
    trainer.fit(Failing(), train_loader)
except RuntimeError:
    print("after the failed fit: running", failing.monitor.running)
"""


def test_the_documented_lightning_snippet_logs_resources_into_the_csv_logger(tmp_path: Path) -> None:
    """The snippet as written; then, in the same process, a fit that raises stops its monitor (no
    teardown hook runs then). Neither stop comes after Lightning put back the signal handlers it
    found, which would take the monitor's stall handler (said as 'another handler took')."""
    pytest.importorskip("lightning")
    done = train(tmp_path, LIGHTNING_MODEL, "**Lightning**", FAILING_FIT)
    assert "monitors 1 global_step 32" in done.stdout, done.stdout
    assert "after the failed fit: running False" in done.stdout, done.stdout
    assert "another handler took" not in done.stderr, done.stderr[-4000:]
    [metrics] = (tmp_path / "logs").glob("lightning_logs/version_*/metrics.csv")
    with metrics.open(newline="") as file:
        rows = list(csv.DictReader(file))
    cpu = [row for row in rows if row["resource/cpu/utilization_percent"]]
    steps = [int(row["step"]) for row in cpu]
    assert len(steps) >= 2 and steps == sorted(set(steps)), steps  # no step twice
    assert 0 < steps[-1] <= 32
    # Each sample is one row, holding every signal it logged: the process's beside the host's.
    assert all(row["resource/process/memory_in_use_mb"] for row in cpu)


LIGHTNING_RANKS = """\
import dataclasses, json, os, psutil
from ringbuf import NAME_PREFIX
from sampler.integrations.lightning import ResourceMonitorCallback

def memory_files():
    \"\"\"The monitor's anonymous segments and stack file this process holds (no /dev/shm names).\"\"\"
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("/memfd:" + NAME_PREFIX, "/memfd:wl-resource-monitor")):
            held.add(target)
    return held

class Probe(pl.Callback):
    \"\"\"What the rank holds while it trains, and the steps it trains at.\"\"\"
    def __init__(self):
        self.steps, self.children, self.held = set(), set(), set()
    def on_train_batch_end(self, trainer, *args):
        self.steps.add(trainer.global_step)
        self.children.add(callback.monitor.child_pid)
        self.held |= memory_files()

callback, probe = ResourceMonitorCallback(store=os.environ["STORE"]), Probe()
trainer = pl.Trainer(
    accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=pl.loggers.CSVLogger("logs"),
    callbacks=[callback, probe], enable_checkpointing=False, enable_progress_bar=False,
)
trainer.fit(model, train_loader)
launched = {p.pid for p in getattr(trainer.strategy.launcher, "procs", [])}  # rank 0's: the other ranks
print("RANK " + json.dumps({
    "rank": trainer.global_rank,
    "pid": os.getpid(),
    "monitors": len(STARTED),
    "placement": dataclasses.asdict(callback.monitor.placement),
    "global_step": trainer.global_step,
    "steps": sorted(probe.steps),
    "children": sorted(pid for pid in probe.children if pid),
    "children_left": sorted(pid for pid in probe.children if pid and psutil.pid_exists(pid)),
    # Its own children: the other ranks' (their monitors' children) may still be leaving.
    "other_children": sorted({p.pid for p in psutil.Process().children()} - launched),
    "held": sorted(probe.held),
    "held_after": sorted(memory_files()),
}), flush=True)
"""


def test_each_rank_of_a_ddp_fit_has_one_monitor_and_rank_0_logs_its_own(tmp_path: Path) -> None:
    """Lightning's own launcher starts the second rank (it sets ``LOCAL_RANK`` and ``WORLD_SIZE``,
    no ``RANK``): each rank has one monitor, placed at the trainer's rank, gone with its child and
    memory files after ``fit``; the CSV logger, rank 0's alone, has rank 0's samples, named with
    its rank, at its global steps, and the run store holds both ranks as one launch."""
    pytest.importorskip("lightning")
    store = tmp_path / "runs.sqlite"
    done = run_script(tmp_path, LIGHTNING_MODEL + LIGHTNING_RANKS, STORE=str(store))
    ranks = {rank["rank"]: rank for rank in map(json.loads, re.findall(r"^RANK (.*)$", done.stdout, re.M))}
    assert sorted(ranks) == [0, 1], done.stdout
    assert "another handler took" not in done.stderr, done.stderr[-4000:]
    for number, rank in ranks.items():
        assert rank["monitors"] == 1 and rank["global_step"] == 16, rank
        where = rank["placement"]
        assert (where["rank"], where["local_rank"], where["world_size"], where["local_world_size"]) == (
            number,
            number,
            2,
            2,
        ), where
        assert rank["children"] and not rank["children_left"] and not rank["other_children"], rank
        assert rank["held"] and not rank["held_after"], rank

    [metrics] = (tmp_path / "logs").glob("lightning_logs/version_*/metrics.csv")
    with metrics.open(newline="") as file:
        rows = list(csv.DictReader(file))
    columns = [name for name in rows[0] if name.startswith("resource/")]
    assert columns and all(name.startswith("resource/rank0/") for name in columns), columns
    sampled = [row for row in rows if row["resource/rank0/process/memory_in_use_mb"]]
    steps = [int(row["step"]) for row in sampled]
    assert steps == sorted(set(steps)), steps  # no step twice
    assert set(steps) <= {0, *ranks[0]["steps"]} and steps[-1] == 16, steps  # the last at stop
    assert all(row["resource/rank0/cpu/utilization_percent"] for row in sampled)  # host-wide: rank 0's

    store_reader = reader.StoreReader(str(store))
    try:
        [launch] = reader.launches(store_reader.runs())
        assert isinstance(launch, reader.Launch) and launch.held == "2 of 2 ranks", launch
        assert [(run.rank, run.pid) for run in launch.runs] == [(0, ranks[0]["pid"]), (1, ranks[1]["pid"])]
        other = store_reader.series(launch.runs[1].id, "resource/process/memory_in_use_mb")
        assert list(other.steps)[-1] == 16, other.steps  # rank 1's samples: in the store
    finally:
        store_reader.close()


HF_MODEL = f"""\
import time
import torch
from transformers import PretrainedConfig, PreTrainedModel

class TinyConfig(PretrainedConfig):
    model_type = "tiny"

class Tiny(PreTrainedModel):
    config_class = TinyConfig
    def __init__(self, config):
        super().__init__(config)
        self.layer = torch.nn.Linear(4, 1)
        self.post_init()
    def forward(self, x, labels=None):
        time.sleep({SLOW_STEPS})
        out = self.layer(x)
        return {{"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}}

class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = torch.randn(64, 4), torch.randn(64, 1)
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return {{"x": self.x[i], "labels": self.y[i]}}

model = Tiny(TinyConfig())
train_dataset = Data()
"""


def test_the_documented_transformers_snippet_hands_resources_to_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    end = "print('monitors', len(STARTED), 'global_step', trainer.state.global_step)\n"
    # 8 per device (the default): 8 steps an epoch.
    done = train(tmp_path, HF_MODEL, "**Hugging Face Transformers**", end)
    assert "monitors 1 global_step 16" in done.stdout, done.stdout
    [run] = {path.parent for path in (tmp_path / "out").rglob("events.out.tfevents.*")}
    accumulator = event_accumulator.EventAccumulator(str(run), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    steps = [e.step for e in accumulator.Scalars("train/resource/cpu/utilization_percent")]
    assert len(steps) >= 2 and steps == sorted(set(steps)) and steps[-1] == 16, steps  # the last at stop
    process = [e.step for e in accumulator.Scalars("train/resource/process/memory_in_use_mb")]
    assert process == steps
    assert "resource" not in done.stdout  # handed to the integrations, not printed


EARLY_STOP = """\
from transformers import EarlyStoppingCallback, Trainer, TrainingArguments
from sampler.integrations.transformers import ResourceMonitorCallback

args = TrainingArguments(
    output_dir="out", num_train_epochs=2, report_to=["tensorboard"], eval_strategy="steps", eval_steps=3,
    metric_for_best_model="loss", save_strategy="no",
)
trainer = Trainer(
    model=model,
    args=args,
    train_dataset=train_dataset,
    eval_dataset=torch.utils.data.Subset(train_dataset, range(8)),
    # No evaluation improves by a billion: the second, at step 6, stops the training.
    callbacks=[ResourceMonitorCallback(), EarlyStoppingCallback(early_stopping_threshold=1e9)],
)
trainer.train()
print("global_step", trainer.state.global_step, "of", trainer.state.max_steps)
"""


def test_a_training_stopped_early_hands_tensorboard_its_last_sample_at_its_last_step(tmp_path: Path) -> None:
    """EarlyStoppingCallback ends the training at step 6 of 16: the sample taken at stop, and any
    still waiting, reach TensorBoard before it closes, at step 6."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    done = run_script(tmp_path, HF_MODEL + EARLY_STOP)
    assert "global_step 6 of 16" in done.stdout, done.stdout
    assert "resource monitor" not in done.stderr, done.stderr[-4000:]  # nothing to say
    [run] = {path.parent for path in (tmp_path / "out").rglob("events.out.tfevents.*")}
    accumulator = event_accumulator.EventAccumulator(str(run), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    tag = "train/resource/cpu/utilization_percent"
    steps = [e.step for e in accumulator.Scalars(tag)] if tag in accumulator.Tags()["scalars"] else []
    assert steps and steps == sorted(set(steps)) and steps[-1] == 6, steps


def test_a_logger_that_raises_leaves_the_others_their_samples_and_the_monitor_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The hand-over both callbacks share, with a real monitor: one receiver raising at every
    sample is said once, and the other gets every sample, once, in step order."""
    steps = itertools.count(1)
    hand_over = HandOver("Test", {"categories": ["cpu"], **FAST})
    got: list[tuple[int, dict[str, float]]] = []

    def broken(values: dict[str, float], step: int) -> None:
        raise RuntimeError("tracking server down")

    monitor = hand_over.start(lambda: next(steps))
    assert monitor is not None
    try:
        wait_for(lambda: monitor.stats()["records_logged"] >= 3, what="3 samples")
        hand_over.hand_over([broken, lambda values, step: got.append((step, values))])
        hand_over.stop()
        hand_over.hand_over([broken, lambda values, step: got.append((step, values))])
    finally:
        hand_over.stop()
    logged = [step for step, _ in got]
    assert len(logged) == monitor.stats()["records_logged"] >= 3 and logged == sorted(set(logged))
    assert all("resource/cpu/utilization_percent" in values for _, values in got)
    raised = [r for r in caplog.records if "tracking server down" in r.getMessage()]
    assert len(raised) == 1 and monitor.stats()["sink_errors"] == 0


def test_no_second_monitor_beside_the_process_wide_one(caplog: pytest.LogCaptureFixture) -> None:
    first = sampler.start_resource_monitor_from_config()
    try:
        assert first is not None
        assert HandOver("Test", {"categories": ["cpu"]}).start(lambda: 0) is None
        assert any("starts no monitor of its own" in r.getMessage() for r in caplog.records)
    finally:
        sampler.stop_resource_monitor()


def test_several_ranks_name_their_rank() -> None:
    values = {"resource/cpu/utilization_percent": 5.0}
    assert rank_names(values, Placement("h", rank=1, world_size=2)) == {
        "resource/rank1/cpu/utilization_percent": 5.0
    }
    assert rank_names(values, Placement("h")) == values


def test_a_trainer_with_no_report_to_integration_is_told_where_its_samples_go(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """report_to="none", or a handler the callback cannot find: the samples reach no logger, which
    is said once, naming the store they still go to."""
    pytest.importorskip("transformers")
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import CallbackHandler

    from sampler.integrations.transformers import ResourceMonitorCallback

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none")
    store = str(tmp_path / "runs.sqlite")
    for through_a_trainer in (True, False):
        caplog.clear()
        callback = ResourceMonitorCallback(categories=["cpu"], store=store, **FAST)
        state, control = TrainerState(), TrainerControl()
        try:
            if through_a_trainer:
                CallbackHandler([callback], None, None, None, None).on_train_begin(args, state, control)
            else:
                callback.on_train_begin(args, state, control)
        finally:
            callback.on_train_end(args, state, control)
        said = [r.getMessage() for r in caplog.records if "Hugging Face callback found" in r.getMessage()]
        expected = "no report_to integration" if through_a_trainer else "no Trainer calling it"
        assert len(said) == 1 and expected in said[0] and f"to the run store {store} only" in said[0], said
