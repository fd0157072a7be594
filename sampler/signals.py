"""The signal pipeline that losses, metrics and resource signals share.

``log_signal(name, value, step)`` hands a value to every subscriber and, when
the backend runs WeightsLab with a logger registered, to WeightsLab's own logger.
"""

from __future__ import annotations

import operator
import os
import threading
from collections.abc import Callable

from sampler.pipeline import weightslab as wl_adapter
from sampler.util.ratelimit import RateLimitedWarning

Subscriber = Callable[[str, float, int], object]

RESOURCE_PREFIX = "resource/"
"""The monitor's own signals; every other name is the training's."""

_lock = threading.Lock()
_subscribers: tuple[Subscriber, ...] = ()
_failures = RateLimitedWarning()
_training_step: int | None = None
"""The highest step a signal other than a resource signal was logged at: the
training's own step axis, which a plain script's loss curve uses."""


def _after_fork_in_child() -> None:
    # A fork while another thread held the lock would leave the copy's lock held for good.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def subscribe(fn: Subscriber) -> Callable[[], None]:
    """Call ``fn(name, value, step)`` for every signal; returns the unsubscribe callable."""
    global _subscribers
    with _lock:
        _subscribers = (*_subscribers, fn)

    def unsubscribe() -> None:
        global _subscribers
        with _lock:
            _subscribers = tuple(s for s in _subscribers if s is not fn)

    return unsubscribe


def has_subscribers() -> bool:
    """Whether anything listens to the pipeline (besides WeightsLab's logger)."""
    return bool(_subscribers)


def log_signal(name: str, value: float, step: int) -> None:
    """Deliver one signal value at ``step``. A subscriber that raises is reported
    (rate-limited) and does not keep the value from the others."""
    if not name.startswith(RESOURCE_PREFIX):
        _note_step(step)
    for fn in _subscribers:
        try:
            fn(name, value, step)
        except Exception as exc:
            _failures.warn("resource monitor: signal subscriber %r raised %r", fn, exc)
    try:
        wl_adapter.forward_signal(name, value, step)
    except Exception as exc:
        _failures.warn("resource monitor: forwarding %s to WeightsLab raised %r", name, exc)


def _note_step(step: object) -> None:
    global _training_step
    try:
        value = operator.index(step)  # type: ignore[arg-type]
    except TypeError:  # a float step, or none at all: not an axis to follow
        return
    if value >= 0 and (_training_step is None or value > _training_step):
        _training_step = value  # one assignment; a lost race only delays the highest by one call


def training_step() -> int | None:
    """The highest step a non-resource signal was logged at in this process, or None."""
    return _training_step
