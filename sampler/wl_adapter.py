"""WeightsLab integration: its model ledger for the age, its logger for signals.

Used only when the ``weightslab`` package is importable. Every call into it is
guarded: a WeightsLab that is half set up (no model registered yet, no logger)
costs a skipped value, never an exception in the monitor.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from types import ModuleType

log = logging.getLogger("sampler")


class _Lazy:
    """Imports one WeightsLab module on first use; remembers a failure."""

    def __init__(self, module: str) -> None:
        self.module = module
        self._loaded: ModuleType | None = None
        self._tried = False

    def get(self) -> ModuleType | None:
        if not self._tried:
            self._tried = True
            try:
                if importlib.util.find_spec("weightslab") is not None:
                    self._loaded = importlib.import_module(self.module)
            except Exception as exc:
                log.warning(
                    "resource monitor: weightslab is installed but %s failed to import: %s", self.module, exc
                )
        return self._loaded


_src = _Lazy("weightslab.src")
_ledgers = _Lazy("weightslab.backend.ledgers")


def forward_signal(name: str, value: float, step: int) -> None:
    """Log one signal through WeightsLab's own pipeline, if WeightsLab is here.

    ``per_sample=False``: with the default, WeightsLab holds a value back until
    a different step is logged, and a resource signal would lag one sample.
    """
    src = _src.get()
    if src is not None:
        src._log_signal(value, None, name, step=step, per_sample=False)


def ledger_model_age() -> object:
    """``get_model().get_age()`` from WeightsLab's ledger; None without WeightsLab.

    Raises whatever the ledger raises; before a model is registered its
    placeholder raises on attribute access.
    """
    ledgers = _ledgers.get()
    if ledgers is None:
        return None
    return ledgers.get_model().get_age()
