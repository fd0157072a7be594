"""A Hugging Face ``TrainerCallback`` that samples resources while ``Trainer.train`` runs and hands
them to the ``report_to`` integrations (TensorBoard, MLflow, W&B, ...) at ``state.global_step``.

Needs the ``transformers`` package (``pip install 'wl-resource-monitor[transformers]'``).
"""

from __future__ import annotations

import copy
import logging
import sys
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
from transformers.trainer_callback import CallbackHandler

from sampler.integrations.hand_over import HandOver

_REPORTERS = tuple(INTEGRATION_TO_CALLBACK.values())
log = logging.getLogger("sampler")


def _calling_handler() -> CallbackHandler | None:
    """The ``CallbackHandler`` whose ``call_event`` is calling this callback's event, if any: a
    ``TrainerCallback`` is given no reference to the trainer or to the other callbacks."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, CallbackHandler):
            return candidate
        frame = frame.f_back
    return None


class ResourceMonitorCallback(TrainerCallback):
    """``Trainer(..., callbacks=[ResourceMonitorCallback()])``: resources wherever ``report_to`` goes.

    Starts a monitor when training begins (``on_train_begin``), stamped at ``state.global_step``,
    and stops it when the training loop is over (``on_epoch_end`` after the last step, or after a
    callback such as ``EarlyStoppingCallback`` stopped it): a last sample is taken then, and handed
    over with any still waiting. After each step, in the
    training thread, each waiting sample goes to the trainer's ``report_to`` integration callbacks
    in one ``on_log`` call each, at the sample's step; it is not printed, nor kept in
    ``state.log_history``. The integrations name it as they name the loss (TensorBoard's
    ``train/resource/cpu/...``). ``options`` are ``ResourceMonitor``'s settings.
    """

    def __init__(self, **options: Any) -> None:
        self._hand_over = HandOver("Hugging Face", options)
        self._reporters: list[Any] = []
        self._state: TrainerState | None = None

    @property
    def monitor(self) -> Any:
        """This callback's ``ResourceMonitor`` (None before training, or when none was started)."""
        return self._hand_over.monitor

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        handler = _calling_handler()
        callbacks = handler.callbacks if handler is not None else []
        self._reporters = [c for c in callbacks if isinstance(c, _REPORTERS)]
        self._state = state
        monitor = self._hand_over.start(self._step)
        if monitor is None or self._reporters:
            return
        if handler is None:
            why = "no Trainer calling it (called directly, or a transformers that calls callbacks otherwise)"
        else:
            why = f"no report_to integration among the Trainer's callbacks (report_to={args.report_to!r})"
        store = monitor.settings.store
        log.warning(
            "resource monitor: the Hugging Face callback found %s: its samples go %s",
            why,
            f"to the run store {store} only" if store else "nowhere (set report_to, or a store)",
        )

    def _step(self) -> int:
        return 0 if self._state is None else self._state.global_step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._state = state
        self._hand(args, state, control, kwargs)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # The Trainer ends each epoch, the last too, here, after its last step's evaluation and
        # save (an epoch-end evaluation comes next, at the same step, where the step axis keeps no
        # further sample). The integrations close at on_train_end, before this callback's turn
        # (the Trainer puts them first): the last sample goes to them now, the loop being over.
        self._state = state
        if control.should_training_stop or state.global_step >= state.max_steps:
            self._hand_over.stop()
        self._hand(args, state, control, kwargs)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._hand_over.stop()  # a training whose loop never ran (resumed at its end)

    def _hand(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, kwargs: Any
    ) -> None:
        self._hand_over.hand_over([self._reporter(r, args, state, control, kwargs) for r in self._reporters])

    @staticmethod
    def _reporter(
        callback: Any, args: TrainingArguments, state: TrainerState, control: TrainerControl, kwargs: Any
    ) -> Any:
        def log(values: dict[str, float], step: int) -> None:
            at = copy.copy(state)
            at.global_step = step
            callback.on_log(args, at, control, logs=dict(values), **kwargs)

        return log
