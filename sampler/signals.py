"""The signal pipeline that losses, metrics and resource signals share.

``log_signal(name, value, step)`` hands a value to every subscriber and, when
the backend runs WeightsLab with a logger registered, to WeightsLab's own logger
(through the forwarder ``sampler.pipeline.weightslab`` hands this module as it is
imported: the pipeline sits above the signals, never the other way round).
A step is an integer the run store can hold (``valid_step``); a value logged at
anything else is refused, said once per signal name.
"""

from __future__ import annotations

import logging
import math
import numbers
import operator
import os
import threading
import time
from collections.abc import Callable, Iterable

from sampler.catalogue import PREFIX
from sampler.store.schema import STEPS
from sampler.util.quoting import bounded_repr
from sampler.util.ratelimit import RateLimitedWarning

log = logging.getLogger("sampler")

Subscriber = Callable[[str, float, int], object]


def _never() -> bool:
    return False


def _nowhere(name: str, value: float, step: int) -> None:
    """No forwarder yet: nothing to forward to."""


_forward: Subscriber = _nowhere
"""Hands a signal to WeightsLab's logger (``forward_through``)."""
_forwarding: Callable[[], bool] = _never
"""Whether ``_forward`` reaches a logger now."""


_lock = threading.Lock()
_subscribers: tuple[Subscriber, ...] = ()
_failures: dict[int, RateLimitedWarning] = {}
"""Each subscriber's failures, by its id while it is subscribed: one broken subscriber's minute of
held-back lines must not hide another's first."""
_forward_failures = RateLimitedWarning()
_SUBSCRIBER_RAISED = "resource monitor: signal subscriber %r raised %r"
_FORWARDING_RAISED = "resource monitor: forwarding %s to WeightsLab raised %r"
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
        _failures[id(fn)] = RateLimitedWarning()

    def unsubscribe() -> None:
        global _subscribers
        with _lock:
            _subscribers = tuple(s for s in _subscribers if s is not fn)
            _failures.pop(id(fn), None)

    return unsubscribe


def forward_through(forward: Subscriber, forwarding: Callable[[], bool]) -> None:
    """Hand every signal to ``forward`` too, which reaches WeightsLab's logger while
    ``forwarding()`` (``sampler.pipeline.weightslab``'s, set as it is imported)."""
    global _forward, _forwarding
    _forward, _forwarding = forward, forwarding


def has_subscribers() -> bool:
    """Whether anything listens to the pipeline (besides WeightsLab's logger)."""
    return bool(_subscribers)


def valid_step(raw: object) -> int | None:
    """``raw`` as a step: an integer (numpy's and torch's too) or a whole real number (a
    float, numpy's, a fraction), within the run store's ``STEPS`` (64 bits); None for anything
    else (2**64 - 1, NaN, 2.5, a bool, text)."""
    if isinstance(raw, bool):
        return None
    try:
        step = operator.index(raw)  # type: ignore[arg-type]
    except TypeError:
        if not isinstance(raw, numbers.Real):
            return None
        try:
            whole = float(raw)
        except (OverflowError, ValueError):  # a fraction beyond the floats
            return None
        if not math.isfinite(whole) or not whole.is_integer():
            return None
        step = int(whole)
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
    if not name.startswith(PREFIX):  # the monitor's own signals; every other name is the training's
        _note_step(step)
    for fn in _subscribers:
        try:
            fn(name, value, step)
        except Exception as exc:
            _raised(fn, exc)
    try:
        _forward(name, value, step)
    except Exception as exc:
        _forward_failures.warn(_FORWARDING_RAISED, name, exc)


def _raised(fn: Subscriber, exc: BaseException) -> None:
    """Say that subscriber ``fn`` raised ``exc``, rate-limited per subscriber."""
    limiter = _failures.get(id(fn))
    if limiter is None:  # unsubscribed while it was called: nothing left to limit
        log.warning(_SUBSCRIBER_RAISED, fn, exc)
    else:
        limiter.warn(_SUBSCRIBER_RAISED, fn, exc)


def _refuse(name: str, step: object) -> None:
    with _lock:
        said = name in _refused
        _refused.add(name)
    if not said:
        log.warning(
            "resource monitor: %s was logged at step %s, which is not a step (a whole number from "
            "-2**63 to 2**63 - 1); its values at such steps are refused",
            bounded_repr(name),
            bounded_repr(step),
        )


def log_batch(
    readings: Iterable[tuple[str, float]],
    step: int,
    spent: list[tuple[Callable[..., object], float]],
    stopping: Callable[[], bool],
) -> bool:
    """What ``log_signal`` does for each of ``readings``, resource signals from the monitor
    thread (no step to note), one subscriber at a time, then WeightsLab's logger: appends
    (receiver, seconds it took) to ``spent`` (the forwarder for the logger). Once
    ``stopping()``, the rest is left undelivered and False returned. What a receiver raises,
    anything at all, is reported (rate-limited) as ``log_signal`` reports it."""
    forward = _forward
    receivers = [*_subscribers, forward] if _forwarding() else _subscribers
    if len(receivers) > 1:
        readings = tuple(readings)  # gone through once per receiver
    clock = time.perf_counter
    for fn in receivers:
        start = clock()
        try:
            for name, value in readings:
                if stopping():
                    return False
                try:
                    fn(name, value, step)
                except BaseException as exc:  # CancelledError too: nothing stops the monitor thread
                    if fn is forward:
                        _forward_failures.warn(_FORWARDING_RAISED, name, exc)
                    else:
                        _raised(fn, exc)
        finally:
            spent.append((fn, clock() - start))
    return True


def _note_step(step: int) -> None:
    global _training_step
    if step >= 0 and (_training_step is None or step > _training_step):
        _training_step = step  # one assignment; a lost race only delays the highest by one call


def training_step() -> int | None:
    """The highest step a non-resource signal was logged at in this process, or None."""
    return _training_step
