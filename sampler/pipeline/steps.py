"""The x axis: which step each sample is logged at (SPEC 3).

In ``model_age`` mode a sample lands at the watched model's age, and a sample
whose step equals the last logged one is dropped, so a paused run leaves the
curve waiting instead of stacking points. In ``seconds`` mode it lands at the
whole seconds elapsed since the monitor started, and the model is never asked.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

from sampler.pipeline import weightslab as wl_adapter

AgeSource = Callable[[], object]

_watched: object | None = None


def watch_model(model: object | None) -> None:
    """Make ``model`` the one whose age stamps the samples.

    ``model`` has a ``get_age()`` method or is a zero-argument callable
    returning the age; ``None`` clears it.
    """
    global _watched
    if model is not None and not callable(getattr(model, "get_age", None)) and not callable(model):
        raise TypeError(
            f"watch_model() needs an object with get_age() or a callable, got {type(model).__name__}"
        )
    _watched = model  # one assignment: atomic, and nothing a fork could inherit half-done


def watched_model_age() -> object:
    """The raw age of the watched model (``watch_model``), else of WeightsLab's
    ledger model if the backend imported WeightsLab, else None. May raise:
    callers guard it."""
    model = _watched
    if model is None:
        return wl_adapter.ledger_model_age()
    get_age = getattr(model, "get_age", None)
    return get_age() if callable(get_age) else model()  # type: ignore[operator]


def as_step(age: object) -> int | None:
    """A non-negative integer step from an age (int, numpy/torch integer,
    integral float), or None if it is not one."""
    if isinstance(age, bool) or age is None:
        return None
    try:
        step = operator.index(age)  # type: ignore[arg-type]
    except TypeError:
        if not isinstance(age, float) or not math.isfinite(age) or not age.is_integer():
            return None
        step = int(age)
    return step if step >= 0 else None


class StepStamper:
    """Turns a sample's timestamp into the step it is logged at, or None to drop it."""

    def __init__(self, step_source: str, age_source: AgeSource | None, start_ns: int) -> None:
        self.step_source = step_source
        self.age_source = age_source or watched_model_age
        self.start_ns = start_ns
        self.last_step: int | None = None

    def stamp(self, timestamp_ns: int) -> int | None:
        if self.step_source == "seconds":
            return max(0, round((timestamp_ns - self.start_ns) / 1e9))
        try:
            step = as_step(self.age_source())
        except BaseException:  # user code: whatever it raises costs this sample's step, not the monitor
            step = None
        if step is None:
            step = 0  # no model yet, or its age cannot be read
        if step == self.last_step:
            return None
        self.last_step = step
        return step
