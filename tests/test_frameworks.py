"""The manual's Lightning and Hugging Face snippets, as written, in a real ``Trainer`` each: a tiny
model built in code (nothing downloaded) trained two epochs on CPU, read back from the logger the
snippet configured (Lightning's CSV file, TensorBoard's event file through its own reader)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_exporters import documented_snippet

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
    script = tmp_path / "train.py"
    script.write_text(COUNT_MONITORS + prelude + documented_snippet(after) + end)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, **MONITOR},
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


def test_the_documented_lightning_snippet_logs_resources_into_the_csv_logger(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    end = "print('monitors', len(STARTED), 'global_step', trainer.global_step)\n"
    done = train(tmp_path, LIGHTNING_MODEL, "**Lightning**", end)
    assert "monitors 1 global_step 32" in done.stdout, done.stdout
    [metrics] = (tmp_path / "logs").glob("lightning_logs/version_*/metrics.csv")
    with metrics.open(newline="") as file:
        rows = list(csv.DictReader(file))
    cpu = [row for row in rows if row["resource/cpu/utilization_percent"]]
    steps = [int(row["step"]) for row in cpu]
    assert len(steps) >= 2 and steps == sorted(set(steps)), steps  # no step twice
    assert 0 < steps[-1] <= 32
    # Each sample is one row, holding every signal it logged: the process's beside the host's.
    assert all(row["resource/process/memory_in_use_mb"] for row in cpu)


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
    assert len(steps) >= 2 and steps == sorted(set(steps)) and 0 < steps[-1] <= 16, steps
    process = [e.step for e in accumulator.Scalars("train/resource/process/memory_in_use_mb")]
    assert process == steps
    assert "resource" not in done.stdout  # handed to the integrations, not printed
