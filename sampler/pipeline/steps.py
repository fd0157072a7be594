"""The x axis: which step each sample is logged at (SPEC 3).

In ``model_age`` mode a sample lands at the watched model's age, and a sample
whose step equals the last logged one is dropped, so a paused run leaves the
curve waiting instead of stacking points. The age comes, in order, from the
model given to ``watch_model``, WeightsLab's ledger model when WeightsLab runs,
and else the highest step the training logged a signal of its own at through
``sampler.signals.log_signal`` (the step its loss curve uses). In ``seconds``
mode a sample lands at the whole seconds elapsed since the monitor started, and
the model is never asked.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable

from sampler import signals
from sampler.pipeline import weightslab as wl_adapter
from sampler.pipeline.phases import StepPhases, cuda_events
from sampler.pipeline.phases import settle as settle_phases
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

AgeSource = Callable[[], object]

UNSTAMPED_WARNING_AFTER = 3
"""Samples dropped at step 0 with no step from any source before the monitor says so (once)."""

_watched: object | None = None


def _is_torch_module(model: object) -> bool:
    torch = sys.modules.get("torch")  # a module exists only where torch was imported
    nn = getattr(torch, "nn", None)
    return nn is not None and isinstance(model, nn.Module)


def _takes_no_arguments(fn: Callable[..., object]) -> bool:
    try:
        inspect.signature(fn).bind()
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): trust the caller
        return True
    return True


def watch_model(model: object | None) -> None:
    """Make ``model`` the one whose age stamps the samples; ``None`` clears it.

    An object with ``get_age()`` is asked for it; a ``torch.nn.Module`` without
    one counts its training-mode forward passes (the monitor never calls a
    module), and its steps' phases are timed (``phases``; watching it again changes
    nothing); a callable that takes no arguments is called; anything else is a
    ``TypeError``.
    """
    global _watched
    current = _watched
    if isinstance(current, StepPhases) and current.module is model:
        return  # watched already: its age and its steps' phases go on, not from 0
    if model is None or callable(getattr(model, "get_age", None)):
        watched = model
    elif _is_torch_module(model):
        watched = StepPhases(model, cuda_events())
    elif callable(model) and _takes_no_arguments(model):
        watched = model
    else:
        raise TypeError(
            "watch_model() needs an object with get_age(), a torch.nn.Module or a callable taking no "
            f"arguments, got {type(model).__name__}"
        )
    previous, _watched = _watched, watched  # one assignment: atomic, nothing a fork could inherit half-done
    if isinstance(previous, StepPhases):
        previous.release()
    settle_phases(watched_phases)  # a signal handler's watch_model() may have run in between


def watched_phases() -> StepPhases | None:
    """The phase timer of the watched module, if a ``torch.nn.Module`` is watched."""
    watched = _watched
    return watched if isinstance(watched, StepPhases) else None


def watched_model_age() -> object:
    """The raw age of the watched model (``watch_model``), else of WeightsLab's
    ledger model if the backend imported WeightsLab, else the highest step the
    training logged a signal at, else None. May raise: callers guard it."""
    model = _watched
    if model is None:
        age = wl_adapter.ledger_model_age()
        return signals.training_step() if age is None else age
    get_age = getattr(model, "get_age", None)
    return get_age() if callable(get_age) else model()  # type: ignore[operator]


def as_step(age: object) -> int | None:
    """A non-negative step from an age (``signals.valid_step``), or None if it is not one."""
    step = signals.valid_step(age)
    return step if step is not None and step >= 0 else None


class StepStamper:
    """Turns a sample's timestamp into the step it is logged at, or None to drop it."""

    def __init__(self, step_source: str, age_source: AgeSource | None, start_ns: int) -> None:
        self.step_source = step_source
        self.age_source = age_source or watched_model_age
        self.start_ns = start_ns
        self.last_step: int | None = None
        self._unstamped = 0
        """Samples in a row that no source gave a step."""
        self._warned = False
        self._refused = False
        """An age that is no step was said."""

    def stamp(self, timestamp_ns: int) -> int | None:
        if self.step_source == "seconds":
            return max(0, round((timestamp_ns - self.start_ns) / 1e9))
        try:
            age = self.age_source()
        except BaseException:  # user code: whatever it raises costs this sample's step, not the monitor
            age = None
        step = as_step(age)
        if step is None and age is not None and not self._refused:
            self._refused = True
            log.warning(
                "resource monitor: the watched model's age %s is not a step (a whole number from 0 to "
                "2**63 - 1); samples land as if it had none",
                bounded_repr(age),
            )
        if step is None:
            step = 0  # no model yet, or its age cannot be read
            self._unstamped += 1
            if self._unstamped >= UNSTAMPED_WARNING_AFTER and self.last_step == 0 and not self._warned:
                self._warned = True
                log.warning(
                    "resource monitor: %d samples in a row had no step to land at, so all but the first "
                    "were dropped at step 0: no model was given to sampler.watch_model(), WeightsLab has "
                    "none, and no training signal was logged with a step through "
                    "sampler.signals.log_signal(). Give one of these, an age_source=, or "
                    "step_source='seconds'.",
                    self._unstamped,
                )
        else:
            self._unstamped = 0
        if step == self.last_step:
            return None
        self.last_step = step
        return step
