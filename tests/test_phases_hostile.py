"""The step-phase timer under hostile training: watch_model called from inside an optimizer step
(as a signal handler or another thread would), DataLoaders drawn inside DataLoaders, a module
run to make a batch, optimizers that wrap optimizers, and checkpointed forwards run again inside
the backward. Training must go on as without the monitor, and the shares stay within 0..100."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from conftest import WAIT_SECONDS
from test_phases import NAP, SHARE, SlowData, SlowForward, fast_data, train
from torch.optim import optimizer as torch_optimizer
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data import dataloader as torch_dataloader

from sampler import catalogue
from sampler.pipeline import phases, steps
from sampler.pipeline.phases import PhaseShares, StepPhases
from sampler.pipeline.steps import watch_model, watched_phases


@pytest.fixture
def shares() -> Callable[[], dict[str, float]]:
    """Each call: the phase signals of the steps since the previous call (the first call starts)."""
    deriver = PhaseShares()
    return lambda: dict(deriver.derive(watched_phases()))


def assert_sane(got: dict[str, float]) -> None:
    values = [got[SHARE[phase]] for phase, _, _ in catalogue.STEP_PHASES]
    assert all(0 <= v <= 100 for v in values) and sum(values) == pytest.approx(100), got


def trained_weights(
    hook: Callable[[Any, Any, Any], None], watch_inside: Callable[[], None]
) -> list[torch.Tensor]:
    """Weights after a few steps of a seeded loop in which a global optimizer hook of the user's,
    registered before the module is watched (so torch calls it before ours), runs ``hook``."""
    torch.manual_seed(0)
    model = SlowForward()
    handle = register_optimizer_step_pre_hook(hook)
    try:
        watch_model(model)
        watch_inside()
        train(model, fast_data())
    finally:
        handle.remove()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("then", ["unwatch", "rewatch", "watch_another"])
def test_watch_model_inside_an_optimizer_step_leaves_the_step_alone(then: str) -> None:
    """A signal handler (Ctrl-C's cleanup) runs between any two bytecodes, so inside a global
    optimizer hook of the user's too; there a watch that added or removed torch's hook entries
    raised "OrderedDict mutated during iteration" out of ``optimizer.step()``."""
    bare = trained_weights(lambda *a: None, lambda: watch_model(None))
    model_of: list[torch.nn.Module] = []

    def handler_now(optimizer: object, args: object, kwargs: object) -> None:
        timer = watched_phases()
        if timer is None:
            return
        if then == "unwatch":
            watch_model(None)
        elif then == "rewatch":
            watch_model(timer.module)
        else:
            model_of.append(SlowForward())
            watch_model(model_of[-1])

    watched = trained_weights(handler_now, lambda: None)
    assert all(torch.equal(a, b) for a, b in zip(watched, bare, strict=True))


def test_watch_model_from_another_thread_while_a_step_runs_its_hooks() -> None:
    """A user's global optimizer hook that does I/O lets another thread run mid-step; that
    thread re-watching and unwatching must not break the step."""
    inside, done = threading.Event(), threading.Event()
    model = SlowForward()

    def logging_hook(optimizer: object, args: object, kwargs: object) -> None:
        if not done.is_set():
            inside.set()
            assert done.wait(WAIT_SECONDS)

    def other_thread() -> None:
        assert inside.wait(WAIT_SECONDS)
        watch_model(model)
        watch_model(None)
        done.set()

    handle = register_optimizer_step_pre_hook(logging_hook)
    thread = threading.Thread(target=other_thread)
    try:
        watch_model(model)
        thread.start()
        assert train(model, fast_data()) == len(fast_data())
    finally:
        done.set()
        thread.join()
        handle.remove()


def test_after_unwatching_no_optimizer_hook_of_a_timer_is_left_in_torch() -> None:
    model = SlowForward()
    watch_model(model)
    timer = watched_phases()
    assert timer is not None
    watch_model(None)
    tables = (torch_optimizer._global_optimizer_pre_hooks, torch_optimizer._global_optimizer_post_hooks)
    assert not [
        hook for table in tables for hook in table.values() if getattr(hook, "__self__", None) is timer
    ]
    train(model, fast_data())
    assert timer.totals.steps == 0


class Drawn(IterableDataset[torch.Tensor]):
    """Batches drawn, in the main process, from a slow DataLoader of its own."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        for x, _ in DataLoader(SlowData(), batch_size=1):
            yield x[0]


def test_a_dataloader_drawn_inside_a_dataloader_counts_its_wait_once(
    shares: Callable[[], dict[str, float]],
) -> None:
    """Half of each step waits for the inner DataLoader, half is host work after the step: the
    inner wait counted again inside the outer's made other negative and input all of it."""
    model = SlowForward()
    watch_model(model)
    shares()
    data = DataLoader(Drawn(), batch_size=1)
    train(model, ((x, torch.zeros(1, 1)) for x in data), after_step=lambda: time.sleep(NAP))
    got = shares()
    assert_sane(got)
    assert got[SHARE["other"]] > 25 and got[SHARE["input"]] < 75, got


class MadeByTheModel(IterableDataset[torch.Tensor]):
    """Each batch made by running the watched module (in training mode) on noise."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(8):
            time.sleep(NAP)
            with torch.no_grad():
                self.model(torch.randn(1, 4))
            time.sleep(NAP)
            yield torch.randn(4)


def test_a_batch_made_by_the_watched_module_keeps_the_shares_in_range(
    shares: Callable[[], dict[str, float]],
) -> None:
    """The module's forward inside the DataLoader's ``__next__`` is a boundary within the wait."""
    model = SlowForward()
    watch_model(model)
    train(model, fast_data())
    shares()
    data = DataLoader(MadeByTheModel(model), batch_size=1)
    train(model, ((x, torch.zeros(1, 1)) for x in data))
    assert_sane(shares())


class Lookahead(torch.optim.Optimizer):
    """An optimizer whose step runs another's, then works ``NAP`` seconds of its own."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.inner = inner
        super().__init__(inner.param_groups, {})

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.inner.step()
        time.sleep(NAP)


def test_a_wrapping_optimizers_own_work_is_the_optimizers(shares: Callable[[], dict[str, float]]) -> None:
    """The inner optimizer's step ended the step, and the outer's own work read as input."""
    model = SlowForward()
    watch_model(model)
    timer = watched_phases()
    assert timer is not None
    optimizer = Lookahead(torch.optim.SGD(model.parameters(), lr=1e-3))
    shares()
    for x, y in fast_data():
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    got = shares()
    assert got[SHARE["optimizer"]] > 80, got
    assert timer.totals.steps == len(fast_data()) - 1


def test_an_optimizer_step_that_raised_leaves_the_next_steps_timed(
    shares: Callable[[], dict[str, float]],
) -> None:
    model = SlowForward()
    watch_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def refuse(optimizer: object, args: object, kwargs: object) -> None:
        raise ValueError("the user's hook refuses this step")

    model(torch.randn(2, 4)).sum().backward()
    handle = optimizer.register_step_post_hook(refuse)
    with pytest.raises(ValueError, match="refuses"):
        optimizer.step()
    handle.remove()
    shares()
    train(model, fast_data(), after_step=lambda: time.sleep(NAP / 4))
    got = shares()
    assert_sane(got)


def test_a_checkpointed_forward_run_again_in_the_backward_is_backward(
    shares: Callable[[], dict[str, float]],
) -> None:
    """``checkpoint(model, x)`` runs the forward again during the backward: that is backward's
    time, and no new training forward pass (the age)."""
    model = SlowForward(nap=NAP)
    watch_model(model)
    timer = watched_phases()
    assert timer is not None
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = list(fast_data())
    for reentrant in (True, False):
        before = timer.passes
        shares()
        for x, y in batches:
            out = torch.utils.checkpoint.checkpoint(model, x.requires_grad_(), use_reentrant=reentrant)
            ((out - y) ** 2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        got = shares()
        assert timer.passes - before == len(batches)
        assert got[SHARE["backward"]] > 30 and got[SHARE["forward"]] < 70, (reentrant, got)


def test_a_signal_handler_toggling_the_watch_all_through_training(
    shares: Callable[[], dict[str, float]],
) -> None:
    """SIGALRM every 0.3 ms: its handler unwatches and watches the module again, landing anywhere
    (inside our hooks, torch's hook loops, a DataLoader's ``__next__``, watch_model itself). The
    weights come out as unwatched, every share stays in range, and the last unwatch leaves
    torch's ``__next__`` and no module hook behind."""
    original = torch_dataloader._BaseDataLoaderIter.__next__
    toggles = [0]
    sane: list[dict[str, float]] = []

    def trained(toggle: bool) -> tuple[torch.nn.Module, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = SlowForward()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        watch_model(model)

        def on_alarm(signum: int, frame: object) -> None:
            toggles[0] += 1
            watch_model(None if toggles[0] % 2 else model)

        if toggle:
            signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)
        try:
            for _ in range(150):
                for x, y in fast_data():
                    ((model(x) - y) ** 2).mean().backward()
                    optimizer.step()
                    optimizer.zero_grad()
                got = shares()
                if got:
                    assert_sane(got)
                    sane.append(got)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        watch_model(None)
        return model, [p.detach().clone() for p in model.parameters()]

    previous = signal.getsignal(signal.SIGALRM)
    handle = register_optimizer_step_pre_hook(lambda *a: None)  # a library's, before ours
    try:
        _, bare = trained(toggle=False)
        model, toggled = trained(toggle=True)
    finally:
        signal.signal(signal.SIGALRM, previous)
        handle.remove()
    assert all(torch.equal(a, b) for a, b in zip(toggled, bare, strict=True))
    assert toggles[0] > 100 and sane
    assert torch_dataloader._BaseDataLoaderIter.__next__ is original
    assert not model._forward_pre_hooks and not model._forward_hooks


def assert_installed_as_watched(original_next: Callable[[Any], Any]) -> None:
    """torch's ``__next__`` and optimizer hooks match whichever module is watched."""
    timer = watched_phases()
    tables = (torch_optimizer._global_optimizer_pre_hooks, torch_optimizer._global_optimizer_post_hooks)
    owners = {getattr(hook, "__self__", None) for table in tables for hook in table.values()}
    timers = {owner for owner in owners if isinstance(owner, StepPhases)}
    installed = torch_dataloader._BaseDataLoaderIter.__next__
    if timer is None:
        assert installed is original_next and not timers
    else:
        assert installed is not original_next and timers == {timer}
        assert timer.module._forward_pre_hooks and phases._loader_timing.phases is timer


@pytest.mark.parametrize(
    ("outer", "inner"), [("other", None), (None, "one"), ("other", "third"), ("one", None)]
)
def test_a_handlers_watch_at_any_line_of_another_watch_leaves_them_consistent(
    outer: str | None, inner: str | None
) -> None:
    """A signal handler runs between any two lines: here its watch_model(``inner``) runs at each
    line, in turn, that watch_model(``outer``) runs in the monitor's code, with ``one`` watched
    before. After both, what is installed is the watched module's, and unwatching leaves nothing."""
    modules = {"one": SlowForward(), "other": SlowForward(), "third": SlowForward()}
    original_next = torch_dataloader._BaseDataLoaderIter.__next__
    files = {phases.__file__, steps.__file__}

    def watch_with_handler_at(line: int) -> int:
        """watch_model(outer) with the handler run at its ``line``-th line; returns lines run."""
        seen = [0]

        def trace(frame: Any, event: str, arg: object) -> Any:
            if frame.f_code.co_filename not in files:
                return None
            if event == "line":
                seen[0] += 1
                if seen[0] == line:
                    watch_model(modules[inner] if inner else None)
            return trace

        watch_model(modules["one"])
        sys.settrace(trace)
        try:
            watch_model(modules[outer] if outer else None)
        finally:
            sys.settrace(None)
        return seen[0]

    lines = watch_with_handler_at(0)
    assert lines > (2 if outer == "one" else 5)  # watching "one" again returns at once
    for line in range(1, lines + 1):
        watch_with_handler_at(line)
        assert_installed_as_watched(original_next), line
        watch_model(None)
        assert_installed_as_watched(original_next)
        assert not any(m._forward_pre_hooks or m._forward_hooks for m in modules.values())


def test_training_in_a_thread_after_a_forward_in_another_is_still_timed_and_aged(
    shares: Callable[[], dict[str, float]],
) -> None:
    """A shape check in the main thread (a module is in training mode when made), then the
    training in a worker thread (an app's): the first thread to run a forward held the timer, so
    the age stayed at 1 and no step was timed. The thread that steps an optimizer after its own
    forward becomes the training thread; every training forward counts in the age."""
    model = SlowForward()
    watch_model(model)
    timer = watched_phases()
    assert timer is not None
    model(torch.randn(1, 4))
    shares()
    steps: list[int] = []
    thread = threading.Thread(target=lambda: steps.append(train(model, DataLoader(SlowData(), batch_size=1))))
    thread.start()
    thread.join()
    assert steps == [len(SlowData())]
    assert timer.passes == 1 + len(SlowData())
    assert timer.totals.steps == len(SlowData()) - 1  # the first, begun before it was known, is not timed
    got = shares()
    assert_sane(got)
    assert got[SHARE["input"]] > 80, got


def test_more_accumulated_micro_batches_than_the_no_optimizer_threshold_keep_optimizer_steps(
    caplog: pytest.LogCaptureFixture, shares: Callable[[], dict[str, float]]
) -> None:
    """A large model fine-tuned with gradient accumulation (batch 1, accumulating more micro-batches
    than ``FORWARDS_WITHOUT_STEP``) runs that many forwards before its first optimizer step; a
    record that lands meanwhile took it for a loop without torch.optim for good: every forward
    ended a step and the optimizer's share read 0. The first optimizer step puts it right, said."""
    caplog.set_level(logging.WARNING, logger="sampler")
    model = SlowForward()
    watch_model(model)
    timer = watched_phases()
    assert timer is not None
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    shares()

    def slow_update(optimizer: object, args: object, kwargs: object) -> None:
        time.sleep(NAP)

    handle = optimizer.register_step_post_hook(slow_update)
    before = 0
    try:
        for step in range(3):
            for micro in range(phases.FORWARDS_WITHOUT_STEP + 8):
                model(torch.randn(1, 4)).sum().backward()
                if micro == phases.FORWARDS_WITHOUT_STEP:
                    shares()  # a record lands in the middle of the accumulation
            optimizer.step()
            optimizer.zero_grad()
            if step == 0:
                before = timer.totals.steps
    finally:
        handle.remove()
    got = shares()
    assert timer.totals.steps - before == 2, timer.totals
    assert got[SHARE["optimizer"]] > 20, got
    said = [r.getMessage() for r in caplog.records if "optimizer" in r.getMessage()]
    assert len(said) == 2 and "timed between optimizer steps again" in said[1], said


@pytest.mark.parametrize("how", ["eval_mode", "forward_method", "another_module"])
def test_steps_with_no_training_forward_of_the_watched_module_are_said_once(
    how: str, caplog: pytest.LogCaptureFixture, shares: Callable[[], dict[str, float]]
) -> None:
    """Training a module in evaluation mode (frozen batch norm), calling ``model.forward(x)`` or
    training another module than the one watched: the age stayed 0 and no phase came, unsaid."""
    caplog.set_level(logging.WARNING, logger="sampler")
    watched, trained = SlowForward(), SlowForward()
    watch_model(watched)
    shares()
    if how != "another_module":
        trained = watched
    if how == "eval_mode":
        trained.eval()
    optimizer = torch.optim.SGD(trained.parameters(), lr=1e-3)
    for _ in range(2):
        for x, y in fast_data():
            out = trained.forward(x) if how == "forward_method" else trained(x)
            ((out - y) ** 2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        assert shares() == {}
    said = [r.getMessage() for r in caplog.records if "no training forward pass" in r.getMessage()]
    assert len(said) == 1 and "SlowForward" in said[0], said
    assert ("evaluation mode" in said[0]) == (how == "eval_mode"), said
