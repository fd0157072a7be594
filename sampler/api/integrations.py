"""Integrations with frameworks that would start a resource monitor of their own.

WeightsLab's ``grpc_serve()`` starts its own monitor; ``replace_weightslab_monitor``
has it start this one instead, so each curve is logged once. (Reading
WeightsLab's model age and forwarding signals to its logger is the pipeline's
job: ``sampler.pipeline.weightslab``.)
"""

from __future__ import annotations

import importlib

from sampler.api import monitor as ours
from sampler.pipeline.weightslab import THEIR_MONITOR

_MONITORING = "weightslab.monitoring"
_SINGLETON_FUNCTIONS = ("start_resource_monitor_from_config", "get_resource_monitor", "stop_resource_monitor")


def replace_weightslab_monitor() -> None:
    """Make WeightsLab start this monitor where it would start its own.

    Call once before ``grpc_serve()``: it stops WeightsLab's monitor if one is
    running and points ``start_resource_monitor_from_config``,
    ``get_resource_monitor`` and ``stop_resource_monitor`` of
    ``weightslab.monitoring`` (and its ``resource_monitor`` module) at this
    project's, so each curve is logged once. Calling it again changes nothing.
    Raises ImportError when WeightsLab's monitoring module cannot be imported.
    """
    try:
        theirs = importlib.import_module(THEIR_MONITOR)
        package = importlib.import_module(_MONITORING)
    except ImportError as exc:
        raise ImportError(
            f"sampler.replace_weightslab_monitor() needs WeightsLab with {THEIR_MONITOR}, "
            f"which cannot be imported: {exc}"
        ) from exc
    their_stop = getattr(theirs, "stop_resource_monitor", None)
    # After a first call this is ours: calling it would stop the monitor just installed.
    if callable(their_stop) and their_stop is not ours.stop_resource_monitor:
        their_stop()
    for module in (theirs, package):
        for name in _SINGLETON_FUNCTIONS:
            setattr(module, name, getattr(ours, name))
