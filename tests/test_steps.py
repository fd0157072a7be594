"""SPEC 3: the x axis each sample is logged at."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FAST, Recorder, wait_for

import sampler
from sampler.pipeline.steps import StepStamper, as_step, watch_model, watched_model_age

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
