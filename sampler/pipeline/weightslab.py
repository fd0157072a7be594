"""WeightsLab, read only: its model ledger for the age, its logger for signals,
and whether its own monitor runs beside this one (``sampler.api.integrations``
hands its ``grpc_serve()`` this monitor instead).

The monitor and the signal pipeline never import WeightsLab: importing
``weightslab.src`` costs seconds of CPU and has side effects (threads, log
files, a renamed main thread), so they only use the modules a WeightsLab
backend has already imported. Every call into it is guarded: a WeightsLab that
is half set up (no model registered yet, no logger) costs a skipped value,
never an exception in the monitor.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from sampler import signals

log = logging.getLogger("sampler")

_SRC = "weightslab.src"
_LEDGERS = "weightslab.backend.ledgers"
THEIR_MONITOR = "weightslab.monitoring.resource_monitor"
"""WeightsLab's own resource monitor module."""

_warn_lock = threading.Lock()
_warned_both_monitors = False


def _after_fork_in_child() -> None:
    # A fork while another thread held the lock would leave the copy's lock held for good.
    global _warn_lock
    _warn_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _logger_registered() -> bool:
    """Whether WeightsLab's ledger holds a logger; False on any failure.

    ``get_logger()`` hands out an unset placeholder until one is registered,
    and ``_log_signal`` drops the value then: the same check, made first, keeps
    the call from being made at all.
    """
    ledgers = sys.modules.get(_LEDGERS)
    try:
        return ledgers is not None and hasattr(ledgers.get_logger(), "add_scalars")
    except Exception:
        return False


def forwarding() -> bool:
    """Whether signals go to a WeightsLab logger in this backend now."""
    return _SRC in sys.modules and _logger_registered()


def forward_signal(name: str, value: float, step: int) -> None:
    """Log one signal through WeightsLab's own pipeline, if this backend runs
    WeightsLab (``weightslab.src`` imported) with a logger registered.

    ``per_sample=False``: with the default, WeightsLab holds a value back until
    a different step is logged, and a resource signal would lag one sample.
    Raises what WeightsLab's logger raises; the caller reports it.
    """
    src = sys.modules.get(_SRC)
    if src is None or not _logger_registered():
        return
    src._log_signal(value, None, name, step=step, per_sample=False)


def ledger_model_age() -> object:
    """``get_model().get_age()`` from WeightsLab's ledger; None unless the
    backend has already imported it.

    Raises whatever the ledger raises; before a model is registered its
    placeholder raises on attribute access.
    """
    ledgers = sys.modules.get(_LEDGERS)
    if ledgers is None:
        return None
    return ledgers.get_model().get_age()


def warn_if_weightslab_monitor_running() -> bool:
    """Whether WeightsLab's own monitor is running beside this one; the first
    time it is, log one warning for the process. Never raises, and costs one
    dictionary lookup while WeightsLab's monitoring is not imported."""
    global _warned_both_monitors
    theirs = sys.modules.get(THEIR_MONITOR)
    if theirs is None:
        return False
    try:
        running = getattr(theirs, "_singleton_instance", None) is not None
    except Exception:
        return False
    if not running:
        return False
    with _warn_lock:
        if _warned_both_monitors:
            return True
        _warned_both_monitors = True
    log.warning(
        "resource monitor: WeightsLab's own resource monitor is running too, so every resource/... "
        "curve is logged twice. Call sampler.replace_weightslab_monitor() before grpc_serve(), "
        "or stop WeightsLab's with weightslab.monitoring.stop_resource_monitor()."
    )
    return True


signals.forward_through(forward_signal, forwarding)
