"""A Lightning ``Callback`` that samples resources while ``Trainer.fit`` runs and logs them into the
trainer's own loggers (CSV, TensorBoard, MLflow, W&B, ...) at ``trainer.global_step``.

Needs the ``lightning`` package (``pip install 'wl-resource-monitor[lightning]'``).
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl

from sampler.integrations.hand_over import HandOver
from sampler.settings import placement


def launcher_env(trainer: pl.Trainer) -> dict[str, str]:
    """This process's environment with the trainer's ranks: Lightning's own launcher (``devices=2``
    without torchrun) sets ``LOCAL_RANK`` and ``WORLD_SIZE`` but neither ``RANK`` nor
    ``LOCAL_WORLD_SIZE``, so every rank would read as rank 0."""
    return {
        **os.environ,
        placement.ENV_RANK: str(trainer.global_rank),
        placement.ENV_LOCAL_RANK: str(trainer.local_rank),
        placement.ENV_WORLD_SIZE: str(trainer.world_size),
        placement.ENV_LOCAL_WORLD_SIZE: str(trainer.num_devices),
    }


class ResourceMonitorCallback(pl.Callback):
    """``Trainer(callbacks=[ResourceMonitorCallback()])``: resources in the trainer's loggers.

    Each rank starts its own monitor when fitting starts (``setup``), placed at the trainer's rank,
    and stops it when training ends (``on_train_end``; ``on_exception`` when ``fit`` raises, which
    runs no ``teardown``): a last sample is taken then. Samples are stamped at
    ``trainer.global_step`` and handed, from the training thread after a batch, to each of
    ``trainer.loggers`` in one ``log_metrics(values, step=step)`` per sample. With several ranks
    the names carry the rank (``resource/rank0/cpu/...``); Lightning's loggers write on rank 0
    only, so the other ranks' samples are in the run store and on Prometheus alone. ``options`` are
    ``ResourceMonitor``'s settings (``interval_seconds``, ``categories``, ``store``, ...); the
    configuration gives the rest, the run store included.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self._hand_over = HandOver("Lightning", options)

    @property
    def monitor(self) -> Any:
        """This callback's ``ResourceMonitor`` (None before fitting, or when none was started)."""
        return self._hand_over.monitor

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._hand_over.start(lambda: trainer.global_step, launcher_env(trainer))

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self._log(trainer)

    # Stopped before Lightning's own teardown, which puts back every signal handler it saw when
    # training started: the monitor's stall handler is faulthandler's, set in C, so Lightning saw
    # the default there and would take the handler away from the running monitor.
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._stop(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a fit whose loop never ran (already done, no batches) has no on_train_end
            self._stop(trainer)

    def _stop(self, trainer: pl.Trainer) -> None:
        self._hand_over.stop()
        self._log(trainer)  # before Lightning finalizes its loggers

    def _log(self, trainer: pl.Trainer) -> None:
        self._hand_over.hand_over([logger.log_metrics for logger in trainer.loggers])
