"""Issue 7: the README's integration inside a real PyTorch training script whose
DataLoader forks persistent workers, as its users run it (CPU build of torch)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import backend_script, gone, wait_for

TRAIN = """
import json
import torch
from torch.utils.data import DataLoader, TensorDataset

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 1)
        self.age = 0
    def get_age(self):
        return self.age

torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
model = Model()
optimizer = torch.optim.SGD(model.net.parameters(), lr=0.01)
sampler.watch_model(model)

def loader():
    return DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True)

def train(batches, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model.net(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model.age += 1
            sampler.signals.log_signal("train/loss", loss.item(), model.age)
            if time.monotonic() >= deadline:
                break
"""


def test_every_run_logs_resources_beside_the_loss(tmp_path: Path) -> None:
    """Start the monitor, then at once a DataLoader with persistent forked
    workers, five runs in a row (one in five used to log nothing at all)."""
    script = tmp_path / "train.py"
    script.write_text(
        backend_script(TRAIN)
        + """
runs = []
for run in range(5):
    seen = []
    off = sampler.signals.subscribe(lambda name, value, step: seen.append((name, step)))
    sampler.start_resource_monitor_from_config()
    batches = loader()  # the workers fork while the monitor starts its child
    train(batches, 2)
    until = time.monotonic() + 60  # two records, however late a loaded machine starts the child
    while sampler.get_resource_monitor().stats()["records_logged"] < 2 and time.monotonic() < until:
        train(batches, 0.5)
    stats = sampler.get_resource_monitor().stats()
    sampler.stop_resource_monitor()
    del batches
    off()
    resource = [(n, s) for n, s in seen if n == "resource/cpu/utilization_percent"]
    runs.append({"records": stats["records_logged"], "resource_steps": [s for _, s in resource],
                 "losses": sum(1 for n, _ in seen if n == "train/loss"), "waiting_for": stats["waiting_for"]})
print(json.dumps(runs))
"""
    )
    env = dict(
        os.environ,
        WL_RESOURCE_MONITOR_INTERVAL_SECONDS="1",
        WL_RESOURCE_MONITOR_CATEGORIES="cpu,memory,process",
        WL_RESOURCE_MONITOR_CONFIG_PATH=str(tmp_path),
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    for run in runs:
        assert run["records"] >= 2 and run["losses"] > 10, runs
        # Stamped at the model's age: steps the loss curve also has, increasing.
        steps = run["resource_steps"]
        assert steps == sorted(steps) and steps[-1] > 0, runs
    assert "Traceback" not in done.stderr, done.stderr


def test_the_child_leaves_when_the_trainer_is_killed_while_its_workers_live(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        backend_script(TRAIN)
        + """
mon = sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: None, interval_seconds=60).start()
batches = loader()
train(batches, 0.5)
while mon.stats()["records_read"] < 1:
    time.sleep(0.01)
import psutil
workers = [p.pid for p in psutil.Process().children() if p.pid != mon.child_pid]
print(mon.child_pid, *workers, flush=True)
train(batches, 120)
"""
    )
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    workers: list[int] = []
    try:
        assert trainer.stdout is not None
        child, *workers = map(int, trainer.stdout.readline().split())
        assert len(workers) == 2
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
        killed_at = time.monotonic()
        # Within about a second on an idle machine (printed below); the bound is for a loaded one.
        wait_for(lambda: gone(child), timeout=10.0, what="the child to leave after the trainer died")
        print(f"child gone {time.monotonic() - killed_at:.3f} s after the trainer was killed")
        assert not all(gone(w) for w in workers)  # DataLoader workers were still alive
    finally:
        trainer.kill()
        trainer.wait()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
