"""The signal pipeline that losses, metrics and resource signals share.

``log_signal(name, value, step)`` hands a value to every subscriber and, when
the backend runs WeightsLab with a logger registered, to WeightsLab's own logger.
A step is an integer the run store can hold (``valid_step``); a value logged at
anything else is refused, said once per signal name.
"""

from __future__ import annotations

import logging
import math
import operator
import os
import threading
from collections.abc import Callable

from sampler.pipeline import weightslab as wl_adapter
from sampler.store.schema import STEPS
from sampler.util.quoting import bounded_repr
from sampler.util.ratelimit import RateLimitedWarning

log = logging.getLogger("sampler")

Subscriber = Callable[[str, float, int], object]

RESOURCE_PREFIX = "resource/"
"""The monitor's own signals; every other name is the training's."""

_lock = threading.Lock()
_subscribers: tuple[Subscriber, ...] = ()
_failures = RateLimitedWarning()
_training_step: int | None = None
"""The highest step a signal other than a resource signal was logged at: the
training's own step axis, which a plain script's loss curve uses."""
_refused: set[str] = set()
"""The names a value was refused for (a step that is none), each said once."""
_LOW, _HIGH = STEPS.start, STEPS.stop
"""``STEPS`` as bounds: two comparisons take a third of the time ``in`` a range does."""


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


def valid_step(raw: object) -> int | None:
    """``raw`` as a step: an integer (numpy's and torch's too) or a whole float, within the
    run store's ``STEPS`` (64 bits); None for anything else (2**64 - 1, NaN, 2.5, a bool)."""
    if isinstance(raw, bool):
        return None
    try:
        step = operator.index(raw)  # type: ignore[arg-type]
    except TypeError:
        if not isinstance(raw, float) or not math.isfinite(raw) or not raw.is_integer():
            return None
        step = int(raw)
    return step if step in STEPS else None


def log_signal(name: str, value: float, step: int) -> None:
    """Deliver one signal value at ``step``, as an ``int`` (``valid_step``; a value at
    what is no step is refused, said once per name). A subscriber that raises is
    reported (rate-limited) and does not keep the value from the others."""
    if type(step) is not int or not _LOW <= step < _HIGH:  # a plain int in range costs no call
        checked = valid_step(step)
        if checked is None:
            _refuse(name, step)
            return
        step = checked
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


def _refuse(name: str, step: object) -> None:
    with _lock:
        said = name in _refused
        _refused.add(name)
    if not said:
        log.warning(
            "resource monitor: %s was logged at step %s, which is not a step (an integer from -2**63 "
            "to 2**63 - 1, or a whole float); its values at such steps are refused",
            bounded_repr(name),
            bounded_repr(step),
        )


def _note_step(step: int) -> None:
    global _training_step
    if step >= 0 and (_training_step is None or step > _training_step):
        _training_step = step  # one assignment; a lost race only delays the highest by one call


def training_step() -> int | None:
    """The highest step a non-resource signal was logged at in this process, or None."""
    return _training_step
