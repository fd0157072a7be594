"""The tools people already read (issue 8): a real monitor whose sink is
TensorBoard's ``SummaryWriter.add_scalar``, read back with TensorBoard's own
event reader. The manual's TensorBoard, MLflow and W&B snippets run as written (MLflow
against a local store, W&B offline, where the integrations extra is installed)."""

from __future__ import annotations

import itertools
import os
import posixpath
import re
import subprocess
import sys
import time
from pathlib import Path

import fake_driver
import numpy as np
import pytest
from conftest import FAST, run_monitor, wait_for

import sampler
from sampler.pipeline.emit import Sample

NON_GPU = ["cpu", "memory", "disk", "network", "process"]


def test_tensorboard_add_scalar_is_a_sink_and_tensorboard_reads_back_every_value(tmp_path: Path) -> None:
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    writer = tensorboard.SummaryWriter(log_dir=str(tmp_path))
    samples: list[Sample] = []
    ages = itertools.count(1)
    with sampler.ResourceMonitor(
        categories=NON_GPU,
        sink=writer.add_scalar,  # add_scalar(tag, scalar_value, global_step): the sink's own signature
        age_source=lambda: 10 * next(ages),  # a model that trains 10 steps between samples
        on_sample=samples.append,  # what the sink was given, sample by sample
        **FAST,
    ) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 5, what="5 records")
    writer.close()
    stats = monitor.stats()
    assert stats["sink_errors"] == 0 and stats["records_logged"] == len(samples) >= 5

    accumulator = event_accumulator.EventAccumulator(
        str(tmp_path),
        size_guidance={event_accumulator.SCALARS: 0},  # 0: keep every event
    )
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    expected: dict[str, list[tuple[int, float]]] = {}
    for sample in samples:
        for name, value in sample.values.items():
            expected.setdefault(name, []).append((sample.step, value))
    assert tags == set(expected), "TensorBoard holds exactly the resource/... tags the monitor logged"
    assert {
        "resource/cpu/utilization_percent",
        "resource/memory/system_utilization_percent",
        "resource/disk/read_mb",
        "resource/network/bytes_received",
        "resource/process/memory_in_use_mb",
    } <= tags
    assert all(tag.startswith("resource/") for tag in tags)
    for tag, points in expected.items():
        events = accumulator.Scalars(tag)
        # TensorBoard keeps scalars as float32: compare with the logged value rounded the same way.
        assert [(e.step, e.value) for e in events] == [(s, float(np.float32(v))) for s, v in points], tag
    steps = [sample.step for sample in samples]
    assert steps == sorted(set(steps)) and steps[0] == 10 and all(s % 10 == 0 for s in steps)


def test_subscribing_add_scalar_puts_the_loss_beside_the_resources_in_tensorboard(tmp_path: Path) -> None:
    """The other way in: the default sink (the pipeline) with ``writer.add_scalar``
    subscribed, so the training loop's own signals land in the same event file,
    on the same step axis as the resource curves."""
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    writer = tensorboard.SummaryWriter(log_dir=str(tmp_path))
    unsubscribe = sampler.signals.subscribe(writer.add_scalar)
    age = [0]
    try:
        with sampler.ResourceMonitor(categories=["cpu", "process"], age_source=lambda: age[0], **FAST) as mon:
            deadline = time.monotonic() + 15
            for step in itertools.count(1):  # train until 3 samples were logged along the way
                age[0] = step
                sampler.signals.log_signal("train/loss", 1.0 / step, step)
                time.sleep(0.01)
                if mon.stats()["records_logged"] >= 3 or time.monotonic() > deadline:
                    break
    finally:
        unsubscribe()
        writer.close()
    accumulator = event_accumulator.EventAccumulator(
        str(tmp_path), size_guidance={event_accumulator.SCALARS: 0}
    )
    accumulator.Reload()
    loss = accumulator.Scalars("train/loss")
    cpu = accumulator.Scalars("resource/cpu/utilization_percent")
    assert len(cpu) >= 3 and all(0 <= e.step <= step for e in cpu)  # the model's age: the loss's x axis
    assert [e.step for e in loss] == list(range(1, step + 1))
    assert [e.value for e in loss] == [float(np.float32(1.0 / s)) for s in range(1, step + 1)]


MLFLOW_KEY = re.compile(r"^[/\w.\- ]*$")
"""MLflow's rule for metric keys (``_VALID_PARAM_AND_METRIC_NAMES`` in mlflow/utils/validation.py):
alphanumerics, underscores, dashes, periods, spaces and slashes; the key must also be its own
``posixpath.normpath`` and at most 250 characters (``MAX_ENTITY_KEY_LENGTH``)."""


def test_every_signal_name_is_a_valid_mlflow_key_and_a_two_level_wandb_section(
    nvml: fake_driver.Driver,
) -> None:
    """Check the names against MLflow's and W&B's documented rules.
    W&B groups ``a/b/c`` under the section ``a/b`` (one level of nesting), so every resource
    signal lands in a section per category (``resource/cpu``) or per GPU (``resource/gpu/0``)."""
    nvml.configure(devices=[{}, {}])
    sink, _ = run_monitor(categories=[*NON_GPU, "gpu"])
    names = sink.names()
    assert {"resource/gpu/1/power_watts", "resource/process/cpu_threads_in_use"} <= names
    for name in names:
        assert MLFLOW_KEY.match(name) and posixpath.normpath(name) == name and len(name) <= 250, name
    sections = {name.rsplit("/", 1)[0] for name in names} - {"resource/progress"}  # from the 2nd record
    assert sections == {f"resource/{c}" for c in NON_GPU} | {"resource/gpu/0", "resource/gpu/1"}


def documented_snippet(after: str) -> str:
    """The first ```python block of the manual's usage page (docs/usage.md, where the README's
    exporters moved) after the text ``after``, as written."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "usage.md").read_text(encoding="utf-8")
    block = text[text.index(after) :].split("```python\n", 1)[1].split("```", 1)[0]
    return "\n".join(line.removeprefix("  ") for line in block.splitlines()) + "\n"


KEEP_THE_MONITOR = """\
import sampler
STARTED = []  # the monitor the snippet starts, whatever it keeps of it: the loop asks its stats
_start = sampler.ResourceMonitor.start
def _keep(self, *args, **kwargs):
    STARTED.append(self)
    return _start(self, *args, **kwargs)
sampler.ResourceMonitor.start = _keep
"""


def train_with_snippet(
    tmp_path: Path, after: str, step_body: str, end: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the manual's snippet after ``after``, as written, then training whose every step runs
    ``step_body`` (indented lines; ``step`` is the step) until the monitor logged three samples (at
    most 60 s: a loaded machine starts the child late), then ``end``; with the monitor at its 1 s
    floor sampling cpu only."""
    loop = (
        "import time\n"
        "step, deadline = 0, time.monotonic() + 60\n"
        "while (not STARTED or STARTED[0].stats()['records_logged'] < 3) and time.monotonic() < deadline:\n"
        f"{step_body}"
        "    step += 1\n"
        f"{end}"
    )
    script = tmp_path / "train.py"
    script.write_text(KEEP_THE_MONITOR + documented_snippet(after) + loop)
    monitor = {"WL_RESOURCE_MONITOR_INTERVAL_SECONDS": "1", "WL_RESOURCE_MONITOR_CATEGORIES": "cpu"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, **monitor, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done


LOG_THE_LOSS = "    sampler.signals.log_signal('train/loss', 1.0 / (step + 1), step)\n    time.sleep(0.003)\n"


def test_the_documented_tensorboard_snippet_runs_as_written(tmp_path: Path) -> None:
    """The manual's snippet, verbatim, then a training loop that logs its loss: the
    event file holds the loss and the resource curves, on the loss's steps."""
    pytest.importorskip("torch.utils.tensorboard")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    train_with_snippet(tmp_path, "**TensorBoard**", LOG_THE_LOSS, "writer.close()\n")
    [log_dir] = (tmp_path / "runs").iterdir()  # SummaryWriter()'s default: runs/<date>_<host>
    scalars = {event_accumulator.SCALARS: 0}
    accumulator = event_accumulator.EventAccumulator(str(log_dir), size_guidance=scalars)
    accumulator.Reload()
    loss_steps = {e.step for e in accumulator.Scalars("train/loss")}
    cpu_steps = [e.step for e in accumulator.Scalars("resource/cpu/utilization_percent")]
    assert len(cpu_steps) >= 2 and set(cpu_steps) <= loss_steps and max(cpu_steps) > 0


def test_the_documented_mlflow_snippet_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a local MLflow store, read back with MLflow's own client: the resource
    curve sits at steps the loss curve has."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = {"MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true"}
    end = "mlflow.end_run()\nprint(run.info.run_id)\n"
    done = train_with_snippet(tmp_path, "**MLflow**", LOG_THE_LOSS, end, store)
    run_id = done.stdout.split()[-1]
    for name, value in store.items():
        monkeypatch.setenv(name, value)
    client = MlflowClient()
    cpu = [m.step for m in client.get_metric_history(run_id, "resource/cpu/utilization_percent")]
    loss = {m.step for m in client.get_metric_history(run_id, "train/loss")}
    # The script's stderr says whether a subscriber call raised (the pipeline warns of it once):
    # a loss MLflow lost once, beside two busy loops, left no other trace.
    assert len(cpu) >= 2 and set(cpu) <= loss and max(cpu) > 0, (sorted(set(cpu) - loss), done.stderr)


def test_the_documented_wandb_snippet_never_pushes_the_training_s_rows_out(tmp_path: Path) -> None:
    """W&B offline: a training that logs two rows per step (loss, then accuracy after a
    moment) with ``step=``; the resource rows must not advance W&B's step in between,
    which W&B reports as "less than the current step ... this data will be ignored"."""
    pytest.importorskip("wandb")
    two_rows = (
        "    if step == 0:\n"  # counts the rows log_resources() hands W&B
        "        ROWS, _log = [], run.log\n"
        "        run.log = lambda row, **kw: (ROWS.append(row), _log(row, **kw))[1]\n"
        "    run.log({'train/loss': 1 / (step + 1)}, step=step)\n"
        "    log_resources()\n"
        "    sampler.signals.log_signal('train/loss', 1 / (step + 1), step)\n"
        "    time.sleep(0.05)\n"
        "    run.log({'train/accuracy': 0.5}, step=step)\n"
    )
    end = (
        "run.finish()\n"
        "print('finished at step', step, 'resource rows', sum('resource/step' in r for r in ROWS))\n"
    )
    offline = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
    done = train_with_snippet(tmp_path, "**Weights & Biases**", two_rows, end, offline)
    assert "finished at step" in done.stdout
    output = done.stdout + done.stderr
    assert "less than the current step" not in output and "will be ignored" not in output
    assert int(done.stdout.split("resource rows")[1]) >= 2, done.stdout  # handed over from the loop
