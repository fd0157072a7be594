"""SPEC 3: the x axis each sample is logged at."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from conftest import FAST, Recorder, wait_for

import sampler
from sampler.pipeline.steps import StepStamper, as_step, watch_model, watched_model_age
from sampler.store.reader import StoreReader

CPU = "resource/cpu/utilization_percent"


class Model:
    def __init__(self) -> None:
        self.age = 0

    def get_age(self) -> int:
        return self.age


def test_model_age_steps_follow_restart_and_deduplicate() -> None:
    model = Model()
    stamper = StepStamper("model_age", model.get_age, start_ns=0)
    seen = []
    for age in (0, 0, 5, 5, 5, 9, 0, 0, 3):
        model.age = age
        seen.append(stamper.stamp(0))
    assert seen == [0, None, 5, None, None, 9, 0, None, 3]


@pytest.mark.parametrize(
    "source",
    [
        lambda: None,
        lambda: 1 / 0,
        lambda: "seven",
        lambda: -3,
        lambda: 2.5,
        lambda: float("nan"),
        lambda: True,
    ],
    ids=["none", "raises", "string", "negative", "fraction", "nan", "bool"],
)
def test_no_usable_age_lands_once_at_zero(source) -> None:
    stamper = StepStamper("model_age", source, start_ns=0)
    assert [stamper.stamp(0) for _ in range(4)] == [0, None, None, None]


def test_integer_like_ages_are_accepted() -> None:
    assert as_step(np.int64(12)) == 12
    assert as_step(7.0) == 7
    assert as_step(0) == 0


def test_seconds_mode_rounds_elapsed_time_and_never_asks_the_model() -> None:
    def forbidden() -> int:
        raise AssertionError("the model must not be consulted in seconds mode")

    stamper = StepStamper("seconds", forbidden, start_ns=10_000_000_000)
    stamps = [stamper.stamp(10_000_000_000 + int(s * 1e9)) for s in (0.2, 0.6, 1.4, 1.4, 2.5001, 3.0)]
    assert stamps == [0, 1, 1, 1, 3, 3]


def test_watch_model_accepts_get_age_objects_and_callables() -> None:
    model = Model()
    model.age = 4
    watch_model(model)
    assert watched_model_age() == 4
    watch_model(lambda: 11)
    assert watched_model_age() == 11
    watch_model(None)
    assert watched_model_age() is None
    with pytest.raises(TypeError):
        watch_model(42)


def test_live_monitor_logs_at_the_watched_models_age() -> None:
    """End to end: the age moves, pauses, restarts at 0; one point per step."""
    model = Model()
    sink = Recorder()
    with sampler.ResourceMonitor(sink=sink, categories=["cpu"], **FAST) as monitor:

        def logged() -> int:
            return int(monitor.stats()["records_logged"])

        wait_for(lambda: logged() >= 1, what="the first sample before any model")
        watch_model(model)
        for age in (3, 8, 0, 2):
            model.age = age
            wait_for(lambda a=age: a in sink.steps(CPU) and sink.steps(CPU)[-1] == a, what=f"step {age}")
            dropped = monitor.stats()["records_dropped"]
            wait_for(
                lambda d=dropped: monitor.stats()["records_dropped"] >= d + 2, what="paused samples dropped"
            )
    assert sink.steps(CPU) == [0, 3, 8, 0, 2]


def test_watched_model_failing_lands_at_zero_once() -> None:
    sink = Recorder()

    def broken() -> int:
        raise RuntimeError("ledger not ready")

    with sampler.ResourceMonitor(sink=sink, categories=["cpu"], age_source=broken, **FAST) as monitor:
        wait_for(lambda: monitor.stats()["records_dropped"] >= 3)
    assert sink.steps(CPU) == [0]


def test_a_torch_module_is_never_called_and_counts_its_training_forward_passes() -> None:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.calls = 0

        def forward(self, x: object = None) -> object:  # callable with no input: it must not be
            self.calls += 1
            return self.layer(torch.zeros(1, 2) if x is None else x)

    net = Net()
    watch_model(net)
    assert watched_model_age() == 0 and net.calls == 0
    for _ in range(3):
        net(torch.zeros(4, 2))
    net.eval()
    net(torch.zeros(4, 2))  # an evaluation pass is no training step
    assert watched_model_age() == 3 and net.calls == 4
    watch_model(None)
    net.train()
    net(torch.zeros(4, 2))
    assert not net._forward_pre_hooks  # clearing the watch takes the hook off


def test_a_callable_that_needs_arguments_is_refused() -> None:
    with pytest.raises(TypeError, match="taking no arguments"):
        watch_model(lambda batch: 0)


def test_without_a_model_the_samples_follow_the_step_the_training_logs_at() -> None:
    stamper = StepStamper("model_age", None, start_ns=0)
    assert stamper.stamp(0) == 0
    sampler.signals.log_signal("train/loss", 0.5, 41)
    sampler.signals.log_signal("resource/cpu/utilization_percent", 3.0, 900)  # the monitor's own: ignored
    assert stamper.stamp(0) == 41
    sampler.signals.log_signal("train/loss", 0.4, 40)  # the highest step counts, not the latest
    assert stamper.stamp(0) is None
    sampler.signals.log_signal("train/loss", 0.3, 42)
    assert stamper.stamp(0) == 42


def test_samples_with_no_step_from_any_source_are_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    stamper = StepStamper("model_age", None, start_ns=0)
    for _ in range(10):
        stamper.stamp(0)
    said = [r.getMessage() for r in caplog.records if "no step to land at" in r.getMessage()]
    assert len(said) == 1 and "watch_model" in said[0] and "log_signal" in said[0]


def test_the_readme_example_lands_its_samples_at_the_loss_steps(tmp_path: Path) -> None:
    """The README's first example, as written but for a fast interval: no watch_model."""
    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(store=str(store), categories=["cpu"], **FAST) as mon:
        step, deadline = 0, time.monotonic() + 60
        while mon.stats()["records_logged"] < 4 and time.monotonic() < deadline:
            sampler.signals.log_signal("train/loss", 1.0 / (step + 1), step)
            step += 1
            time.sleep(0.001)
    assert mon.stats()["records_logged"] >= 4
    with StoreReader(str(store)) as reader:
        steps = reader.series(reader.run().id, CPU).steps
        losses = reader.series(reader.run().id, "train/loss").steps
    assert len(set(steps)) == len(steps) >= 4 and max(steps) > 0
    assert set(steps) <= set(losses)  # every resource point sits at a step the loss curve has
