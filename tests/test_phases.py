"""The phases of a training step (``watch_model(module)``): real torch loops, each with one
phase made long on purpose, read through the hooks and the shares each logged record gets."""

from __future__ import annotations

import copy
import io
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import FAST, Recorder, wait_for
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data import dataloader as torch_dataloader

import sampler
from sampler import catalogue
from sampler.pipeline import phases
from sampler.pipeline.phases import PhaseShares, StepPhases
from sampler.pipeline.steps import watch_model, watched_phases

SHARE = {phase: f"{catalogue.PREFIX}progress/{phase}_percent" for phase, _, _ in catalogue.STEP_PHASES}
STEP_SECONDS = catalogue.STEP_SECONDS.name
DEVICE = catalogue.DEVICE_SHARE.name
NAP = 0.02
"""Seconds one phase is made to take per step, far above the rest of a tiny model's step."""


class SlowData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each item takes ``NAP`` seconds to make."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(NAP)
        return torch.randn(4), torch.randn(1)


class SlowForward(torch.nn.Module):
    def __init__(self, nap: float = 0.0) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.nap = nap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.nap)
        return self.linear(x)


def fast_data() -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=2)


def train(
    model: torch.nn.Module,
    batches: Any,
    *,
    accumulate: int = 1,
    after_step: Callable[[], object] = lambda: None,
) -> int:
    """One pass over ``batches``; an optimizer step every ``accumulate`` batches. Returns steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    steps = 0
    for i, (x, y) in enumerate(batches, 1):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        if i % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            after_step()
    return steps


@pytest.fixture
def shares() -> Callable[[], dict[str, float]]:
    """Each call: the phase signals of the steps since the previous call (the first call starts)."""
    deriver = PhaseShares()
    return lambda: dict(deriver.derive(watched_phases()))


def test_a_slow_dataloader_reads_as_input(shares: Callable[[], dict[str, float]]) -> None:
    model = SlowForward()
    watch_model(model)
    shares()
    train(model, DataLoader(SlowData(), batch_size=1))
    got = shares()
    assert got[SHARE["input"]] > 80, got
    assert sum(got[SHARE[p]] for p, _, _ in catalogue.STEP_PHASES) == pytest.approx(100)
    assert got[STEP_SECONDS] >= NAP
    assert DEVICE not in got  # no CUDA here


def test_a_slow_forward_reads_as_forward(shares: Callable[[], dict[str, float]]) -> None:
    model = SlowForward(nap=NAP)
    watch_model(model)
    shares()
    train(model, fast_data())
    got = shares()
    assert got[SHARE["forward"]] > 80, got


def test_without_a_dataloader_the_gap_before_the_forward_is_input(
    shares: Callable[[], dict[str, float]],
) -> None:
    model = SlowForward()
    watch_model(model)
    shares()

    def batches() -> Any:
        for _ in range(8):
            time.sleep(NAP)  # a hand-made loader
            yield torch.randn(2, 4), torch.randn(2, 1)

    train(model, batches())
    assert shares()[SHARE["input"]] > 80


def test_host_work_after_the_step_reads_as_other_once_a_dataloader_is_seen(
    shares: Callable[[], dict[str, float]],
) -> None:
    model = SlowForward()
    watch_model(model)
    shares()
    train(model, fast_data(), after_step=lambda: time.sleep(NAP))
    got = shares()
    assert got[SHARE["other"]] > 80, got
    assert got[SHARE["input"]] < 20, got


def test_the_step_time_is_the_time_between_optimizer_steps(shares: Callable[[], dict[str, float]]) -> None:
    model = SlowForward(nap=NAP)
    watch_model(model)
    ends: list[float] = []
    train(model, fast_data(), after_step=lambda: ends.append(time.perf_counter()))
    shares()  # the first call only starts: the steps from here on count
    ends.clear()
    steps = train(model, fast_data(), after_step=lambda: ends.append(time.perf_counter()))
    got = shares()
    # The same interval measured twice: from the first step's end (the previous pass's last) to the last.
    assert got[STEP_SECONDS] * (steps - 1) == pytest.approx(ends[-1] - ends[0], rel=0.25, abs=NAP)


def test_accumulated_batches_make_one_step_per_optimizer_step() -> None:
    model = SlowForward()
    watch_model(model)
    timer = watched_phases()
    assert timer is not None
    steps = train(model, fast_data(), accumulate=4)
    assert steps == 2
    assert timer.passes == 8  # the age still counts forward passes
    assert timer.totals.steps == steps - 1  # the first step began before any hook saw it


def test_evaluation_forwards_neither_count_nor_end_a_step() -> None:
    model = SlowForward()
    watch_model(model)
    timer = watched_phases()
    assert timer is not None
    train(model, fast_data())
    before = (timer.passes, timer.totals.steps)
    model.eval()
    with torch.no_grad():
        for x, _ in fast_data():
            model(x)
    assert (timer.passes, timer.totals.steps) == before


def test_an_optimizer_in_another_thread_leaves_the_steps_alone() -> None:
    model = SlowForward()
    watch_model(model)
    timer = watched_phases()
    assert timer is not None
    train(model, fast_data())
    model(torch.randn(2, 4))  # a step under way: an optimizer step would end it
    before = timer.totals

    def elsewhere() -> None:
        other = torch.nn.Linear(2, 1)
        other(torch.randn(1, 2)).sum().backward()
        torch.optim.SGD(other.parameters(), lr=0.1).step()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert timer.totals == before


def test_two_optimizers_stepping_in_one_iteration_make_one_step() -> None:
    """A GAN's loop: the discriminator's and the generator's optimizer each step once per batch."""
    generator, critic = SlowForward(), torch.nn.Linear(1, 1)
    watch_model(generator)
    timer = watched_phases()
    assert timer is not None
    g_opt = torch.optim.SGD(generator.parameters(), lr=1e-3)
    c_opt = torch.optim.SGD(critic.parameters(), lr=1e-3)
    for x, _ in fast_data():
        fake = generator(x)
        critic(fake.detach()).mean().backward()
        c_opt.step()
        (-critic(fake).mean()).backward()
        g_opt.step()
    assert timer.totals.steps == len(fast_data()) - 1


def test_a_dataloader_drained_by_a_prefetching_thread_is_not_the_training_threads_input(
    shares: Callable[[], dict[str, float]],
) -> None:
    """The training thread waits on a queue a thread fills from a DataLoader: the other thread's
    time in the loader is not the training thread's input (its wait on the queue is host work,
    other, once the training thread has drawn from a DataLoader itself)."""
    model = SlowForward()
    watch_model(model)
    train(model, fast_data())  # the training thread is known, and has seen a DataLoader
    filled: queue.Queue[Any] = queue.Queue(maxsize=2)

    def prefetch() -> None:
        for batch in DataLoader(SlowData(), batch_size=1):
            filled.put(batch)
        filled.put(None)

    thread = threading.Thread(target=prefetch)
    shares()
    thread.start()
    train(model, iter(filled.get, None))
    thread.join()
    got = shares()
    assert got[SHARE["input"]] < 20 and got[SHARE["other"]] > 50, got


def test_a_loop_with_no_torch_optimizer_is_said_once_and_timed_per_forward(
    caplog: pytest.LogCaptureFixture, shares: Callable[[], dict[str, float]]
) -> None:
    model = SlowForward()
    watch_model(model)
    shares()
    caplog.set_level(logging.WARNING, logger="sampler")

    def manual_steps(count: int) -> None:
        for _ in range(count):
            loss = model(torch.randn(2, 4)).sum()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 1e-3 * p.grad  # type: ignore[operator]
                    p.grad = None

    manual_steps(phases.FORWARDS_WITHOUT_STEP)
    assert shares() == {}
    manual_steps(10)
    got = shares()
    assert SHARE["forward"] in got and got[SHARE["optimizer"]] == 0
    shares()
    said = [r.getMessage() for r in caplog.records if "no torch.optim" in r.getMessage()]
    assert len(said) == 1


def test_unwatching_takes_every_hook_off() -> None:
    model = SlowForward()
    original = torch_dataloader._BaseDataLoaderIter.__next__
    watch_model(model)
    assert torch_dataloader._BaseDataLoaderIter.__next__ is not original
    timer = watched_phases()
    assert timer is not None
    watch_model(None)
    assert torch_dataloader._BaseDataLoaderIter.__next__ is original
    assert not model._forward_pre_hooks and not model._forward_hooks
    train(model, fast_data())
    assert timer.passes == 0 and timer.totals.steps == 0


def test_a_wrapper_put_over_ours_is_left_in_place_and_ours_does_nothing() -> None:
    model = SlowForward()
    watch_model(model)
    timer = watched_phases()
    assert timer is not None
    ours = torch_dataloader._BaseDataLoaderIter.__next__
    seen: list[int] = []

    def theirs(iterator: Any) -> Any:
        seen.append(1)
        return ours(iterator)

    torch_dataloader._BaseDataLoaderIter.__next__ = theirs  # type: ignore[method-assign]
    try:
        watch_model(None)
        assert torch_dataloader._BaseDataLoaderIter.__next__ is theirs
        assert next(iter(fast_data()))[0].shape == (2, 4)
        assert seen and timer.loader_ns == 0
    finally:
        torch_dataloader._BaseDataLoaderIter.__next__ = phases._loader_timing._original  # type: ignore[method-assign]


def test_a_forward_that_raises_leaves_the_next_steps_timed(shares: Callable[[], dict[str, float]]) -> None:
    model = SlowForward()
    watch_model(model)
    train(model, fast_data())
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 5))  # wrong width: no forward hook after the pre-hook
    shares()
    train(model, fast_data())
    got = shares()
    assert sum(got[SHARE[p]] for p, _, _ in catalogue.STEP_PHASES) == pytest.approx(100)


def test_copies_of_the_watched_module_carry_inert_hooks() -> None:
    """An EMA's ``deepcopy`` and ``torch.save`` of the whole module copy its hooks: the copies'
    neither count nor time, and save without the timer's state."""
    model = SlowForward()
    watch_model(model)
    timer = watched_phases()
    assert timer is not None
    ema = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (ema, loaded):
        other(torch.randn(2, 4))
    assert timer.passes == 0
    model(torch.randn(2, 4))
    assert timer.passes == 1


class FakeEvent:
    """A CUDA event as the device would give it (this machine has no CUDA): done after
    ``ready_after`` queries, ``elapsed`` ms after the start it is measured from."""

    def __init__(self, log: list[FakeEvent], ready_after: int, elapsed: float, fail: str = "") -> None:
        self.queries = 0
        self.ready_after, self.elapsed, self.fail = ready_after, elapsed, fail
        log.append(self)

    def record(self) -> None:
        if self.fail == "record":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def query(self) -> bool:
        self.queries += 1
        return self.queries > self.ready_after

    def elapsed_time(self, end: FakeEvent) -> float:
        if self.fail == "elapsed":
            raise RuntimeError("CUDA error: device-side assert triggered")
        return self.elapsed


def test_the_gpus_time_is_read_once_the_device_is_done_without_waiting(
    shares: Callable[[], dict[str, float]],
) -> None:
    made: list[FakeEvent] = []
    model = SlowForward(nap=NAP)
    timer = StepPhases(model, lambda module: FakeEvent(made, ready_after=1, elapsed=NAP * 1e3 / 2))
    deriver = PhaseShares()
    try:
        deriver.derive(timer)
        train(model, fast_data())
        assert len(made) == 2  # one step timed: the next waits until this one is read
        assert DEVICE not in dict(deriver.derive(timer))  # not done at the first query
        got = dict(deriver.derive(timer))  # done now, though no step ended since
        assert got == {} or DEVICE in got
        train(model, fast_data())
        got = dict(deriver.derive(timer))
        assert 10 < got[DEVICE] <= 50, got  # half the forward's nap, of a step a little longer
        assert len(made) == 4
    finally:
        timer.release()


@pytest.mark.parametrize("fail", ["record", "elapsed"])
def test_a_cuda_error_stops_the_device_timing_once_and_never_the_steps(
    fail: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    made: list[FakeEvent] = []
    model = SlowForward()
    timer = StepPhases(model, lambda module: FakeEvent(made, ready_after=0, elapsed=1.0, fail=fail))
    deriver = PhaseShares()
    try:
        deriver.derive(timer)
        for _ in range(3):
            train(model, fast_data())
            got = dict(deriver.derive(timer))
            assert SHARE["input"] in got and DEVICE not in got
    finally:
        timer.release()
    said = [r.getMessage() for r in caplog.records if "on the GPU failed" in r.getMessage()]
    assert len(said) == 1 and "CUDA error" in said[0]


def test_a_module_off_the_gpu_is_never_timed_on_it() -> None:
    asked: list[object] = []
    model = SlowForward()
    timer = StepPhases(model, lambda module: asked.append(module))  # the maker's None: not on a GPU
    try:
        train(model, fast_data())
        train(model, fast_data())
    finally:
        timer.release()
    assert asked == [model]


def test_a_live_monitor_logs_the_phases_beside_the_throughput() -> None:
    sink = Recorder()
    model = SlowForward()
    watch_model(model)
    data = DataLoader(SlowData(), batch_size=1)
    with sampler.ResourceMonitor(sink=sink, categories=["cpu"], **FAST):

        def logged() -> list[float]:
            return [value for name, value, _ in sink.calls if name == SHARE["input"]]

        def training() -> bool:
            train(model, data)
            return len(logged()) >= 2

        wait_for(training, what="two records with the input's share")
    assert all(value > 50 for value in logged())


def test_watching_the_same_module_again_keeps_its_age_and_its_timer() -> None:
    """A notebook's cell run twice, or a callback's setup called per epoch: the step axis goes on."""
    model = SlowForward()
    watch_model(model)
    timer = watched_phases()
    train(model, fast_data())
    watch_model(model)
    assert watched_phases() is timer and timer is not None
    assert timer.passes == len(fast_data())
    assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1
    train(model, fast_data())
    assert timer.passes == 2 * len(fast_data())
