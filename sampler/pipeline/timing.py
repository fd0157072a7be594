"""The time user code takes in the monitor thread: the model's age (``age_source``, or the
watched model's ``get_age``), the sink, the signal pipeline's receivers (its subscribers and
WeightsLab's logger, with the default sink) and the ``on_sample`` hook.

Each is timed per sample and kept by its qualified name in ``stats()["callbacks"]``.
Callbacks that take more than ``SLOW_SHARE`` of the interval in most of the last
``SLOW_RECORDS`` samples share the interpreter with the training and fall behind
the child; that is said once, naming the slowest and the way out: a call per signal
is the slow way (one request to a tracking server each), one call per sample
(``on_sample``) the batched one.
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
from collections import deque
from collections.abc import Callable

from sampler.pipeline import weightslab as wl_adapter
from sampler.pipeline.stats import CallbackTime, MonitorStats
from sampler.util.quoting import printable

log = logging.getLogger("sampler")

SLOW_SHARE = 0.1
"""Callbacks taking more than this share of the interval are said to be slow."""
SLOW_RECORDS = 3
"""In most of this many samples in a row (their median), so that one call stretched (by a
suspended process, a paused VM) is not, and a sink that takes seconds a sample is named
after a few."""
MAX_NAME = 200
"""Characters of a callback's name kept at most."""
BATCHED = (
    "log each sample in one call: an on_sample hook gets all its readings, and a sink that does nothing "
    "keeps them from going one by one, e.g. ResourceMonitor(sink=lambda name, value, step: None, "
    "on_sample=lambda s: mlflow.log_metrics(s.values, step=s.step, run_id=run_id)) (see 'Other tools' "
    "in the manual's usage page)"
)
"""The batched alternative to a callback called once per signal."""

Callback = Callable[..., object]


def qualified_name(fn: object) -> str:
    """``module.qualname`` of a function or method, or of a callable object's class (a
    ``functools.partial``'s function); a lambda, which has no name, with its file and line.
    Printable and bounded, whatever the object: never raises."""
    try:
        while isinstance(fn, functools.partial):
            fn = fn.func
        target = fn if hasattr(fn, "__qualname__") else type(fn)
        name = f"{getattr(target, '__module__', None) or '?'}.{target.__qualname__}"
        if "<lambda>" in name:
            code = target.__code__  # type: ignore[attr-defined]
            name += f" ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
    except Exception:
        name = f"?.{type(fn).__qualname__}"
    name = printable(name)
    return name if len(name) <= MAX_NAME else name[: MAX_NAME - 3] + "..."


class CallbackTimes:
    """Times of one monitor's callbacks: the emitter appends each call's (or each run of
    calls') seconds to ``spent`` (``signals.log_batch`` the pipeline's receivers'), then
    calls ``end_sample``, which adds them to ``stats.callbacks`` and judges the latest samples.

    No callable is kept from one sample to the next (a subscriber once removed is not held
    alive), and none is used as a key (a callable object may be unhashable)."""

    def __init__(
        self,
        stats: MonitorStats,
        interval_seconds: float | None,
        sink: Callback,
        on_sample: Callback | None,
        age_source: Callback | None = None,
    ) -> None:
        self.stats = stats
        self.spent: list[tuple[Callback, float]] = []
        """This sample's calls so far: (callable, seconds)."""
        self.interval = interval_seconds
        """None: no interval to judge against (never slow)."""
        self._sink, self._sink_name = sink, qualified_name(sink)
        self._on_sample = on_sample
        self._hook_name = None if on_sample is None else qualified_name(on_sample)
        self._age_source = age_source
        self._age_name = None if age_source is None else qualified_name(age_source)
        self._kinds: dict[str, str] = {}
        """What each name is: the sink, the on_sample hook, the age source, WeightsLab's logger or a
        subscriber."""
        self._latest: deque[float] = deque(maxlen=SLOW_RECORDS)
        """Seconds all callbacks took in each of the latest samples."""
        self._warned = False

    def end_sample(self, signals: int) -> None:
        """Add this sample's times (``signals`` logged) to ``stats.callbacks``, and say once
        when the latest samples' callbacks took too much of the interval."""
        spent = self.spent
        if not spent:
            return
        by_name: dict[str, float] = {}
        for fn, seconds in spent:
            name = self._name(fn)
            by_name[name] = by_name.get(name, 0.0) + seconds
        spent.clear()
        callbacks = self.stats.callbacks
        for name, seconds in by_name.items():
            timed = callbacks.get(name)
            if timed is None:  # a new dict: snapshot() may be copying the old one
                timed = CallbackTime()
                callbacks = self.stats.callbacks = {**callbacks, name: timed}
            timed.add(seconds)
        latest = self._latest
        latest.append(sum(by_name.values()))
        if (
            not self._warned
            and self.interval is not None
            and len(latest) == SLOW_RECORDS
            and statistics.median(latest) > SLOW_SHARE * self.interval
        ):
            self._warned = True
            self._warn(statistics.median(latest), signals)

    def _name(self, fn: Callback) -> str:
        """``fn``'s name, its kind noted the first time."""
        if fn is self._sink:
            name, kind = self._sink_name, "sink"
        elif fn is self._on_sample and self._hook_name is not None:
            name, kind = self._hook_name, "on_sample"
        elif fn is self._age_source and self._age_name is not None:
            name, kind = self._age_name, "age_source"
        else:
            name = qualified_name(fn)
            kind = "weightslab" if fn is wl_adapter.forward_signal else "subscriber"
        self._kinds.setdefault(name, kind)
        return name

    def _warn(self, per_sample: float, signals: int) -> None:
        """Say that the callbacks take ``per_sample`` seconds, naming the slowest so far."""
        assert self.interval is not None
        callbacks = self.stats.callbacks
        name = max(self._kinds, key=lambda n: callbacks[n].seconds_total)
        kind = self._kinds[name]
        if kind == "on_sample":
            what = f"the on_sample hook {name}"
            way_out = "make it cheaper, or sample less often (interval_seconds)"
        elif kind == "age_source":
            what = f"the model's age, {name}, asked once per sample for its step"
            way_out = "make it cheap (a counter the training keeps), or sample less often (interval_seconds)"
        elif kind == "weightslab":
            what = "WeightsLab's logger (weightslab.src._log_signal), called once per signal"
            way_out = "sample less often (interval_seconds)"
        else:
            what = f"the {'sink' if kind == 'sink' else 'signal subscriber'} {name}, called once per signal"
            what += f" ({signals} a sample)"
            way_out = BATCHED
        timed = callbacks[name]
        log.warning(
            "resource monitor: the callbacks in the monitor thread took %.3g s per sample (median of the "
            "last %d), %.0f %% of the %g s interval: they share the interpreter with the training, and "
            "past 100 %% samples are lost. The slowest is %s: %.3g s per sample. To fix it, %s. "
            "stats()['callbacks'] has the time of each.",
            per_sample,
            SLOW_RECORDS,
            100 * per_sample / self.interval,
            self.interval,
            what,
            timed.seconds_total / timed.records,
            way_out,
        )
