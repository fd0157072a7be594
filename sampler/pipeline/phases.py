"""The phases of each training step of a watched ``torch.nn.Module``, from hooks.

``watch_model(module)`` puts a forward pre-hook and a forward hook on the module, registers
torch's global optimizer step hooks (every ``torch.optim.Optimizer``, no user code), and
times the wait inside the DataLoader iterator's ``__next__``. A step runs from the end of one
optimizer step to the end of the next, and each boundary hands the time since the previous
one to the phase it ends (``catalogue.STEP_PHASES``):

- input: inside the DataLoader's ``__next__``; with no DataLoader iterated since the monitor
  watched the module, the whole gap from the optimizer step's end to the next training forward;
- forward: the module's training-mode forward passes (pre-hook to hook);
- backward: a forward's end to the next forward or the optimizer step (loss, backward and,
  in data-parallel training, the wait for the gradients' collective; a checkpointed forward
  run again inside the backward too);
- optimizer: the optimizer's step (the outermost one's, where an optimizer wraps another);
- other: the rest of the gap between the optimizer step and the next forward once a DataLoader
  has been seen (host work, ``loss.item()``, evaluation).

On a GPU the host clock between hooks includes waiting for the device, so the device's own
time is read from a pair of CUDA events around one step per logged record, queried later by
the monitor thread without synchronizing.

The hooks time the training thread (the first to run a training forward, or a later one that
steps an optimizer after a training forward of its own) and write only plain attributes; the
monitor thread reads ``totals``, from a tuple replaced whole at each step's end, so it never sees
half a step. torch's optimizer hooks are registered once and then only pointed at the watched
timer or idled (``_OptimizerHooks``), so watching from a signal handler or another thread never
changes a hook table a step is iterating.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from sampler import catalogue

log = logging.getLogger("sampler")

INPUT, FORWARD, BACKWARD, OPTIMIZER, OTHER = range(len(catalogue.STEP_PHASES))
_GAP = -1
"""Between an optimizer step's end and the next training forward: input, or input and other."""

FORWARDS_WITHOUT_STEP = 64
"""Training forwards with no optimizer step seen before steps are taken to end at each forward
(a loop that updates its weights without ``torch.optim``), said once."""

STEPS_WITHOUT_FORWARD = 3
"""Optimizer steps with no training forward of the watched module before the monitor says so."""

_now = time.perf_counter_ns
_ident = threading.get_ident


class PhaseTotals(NamedTuple):
    """What the hooks counted since the module was watched, up to the last step's end."""

    steps: int
    """Steps timed (the first step, which began before the module was watched, is not)."""
    ns: tuple[int, ...]
    """Nanoseconds in each phase, ``catalogue.STEP_PHASES`` order, over those steps."""
    device_ns: int
    """GPU time of the steps timed with CUDA events (0 without CUDA)."""
    device_host_ns: int
    """The host time of those same steps."""


_ZERO = PhaseTotals(0, (0,) * len(catalogue.STEP_PHASES), 0, 0)


class StepPhases:
    """The watched module's age (its training-mode forward passes) and its steps' phases.

    ``events(module)`` makes a CUDA event with timing enabled (``torch.cuda.Event``), or returns
    None where the module's parameters are not on a GPU (then no step is timed on the device);
    ``events`` None: no device timing (no CUDA)."""

    eval_passes = 0
    """Evaluation-mode forwards (a class default: a copy's inert timer counts its own)."""
    unseen_steps = 0
    """Optimizer steps before any training forward: the module trained is not this one, or not
    through its hooks."""

    def __init__(self, module: Any, events: Callable[[Any], Any] | None = None) -> None:
        self.passes = 0
        self._published: tuple[int, tuple[int, ...]] = (0, _ZERO.ns)
        """(steps, ns per phase) at the last step's end: one tuple, replaced whole."""
        self.by_forward = False
        """No optimizer hook is available or fires: a step ends at each training forward."""
        self.module = module
        """The watched module."""
        self._thread: int | None = None
        self._mark = _now()
        self._phase = _GAP
        self.loader_ns = 0
        """Waited in a DataLoader's ``__next__`` since the last boundary (its wrapper adds it)."""
        self.loader_seen = False
        self._forwarded = False
        """A training forward ran since the last step's end."""
        self._timing = False
        """The first step's end has passed: steps are timed from it on."""
        self._steps = 0
        self._cum = [0] * len(catalogue.STEP_PHASES)
        self._step_start = self._mark
        self._events = events
        self._inflight: Any = None
        """The CUDA start event of the step under way, when it is timed on the device."""
        self.device_done: tuple[Any, Any, int] | None = None
        """(start, end, host ns) of the last step timed on the device, until the monitor reads it."""
        self._device = (0, 0)
        """(device ns, host ns) of the steps timed on the GPU so far: the monitor thread's."""
        self._stepping: object | None = None
        """The optimizer whose step is under way: the outermost, a wrapping optimizer's (Lookahead's,
        ``ZeroRedundancyOptimizer``'s) whose step runs its inner one's; one whose step raised (no
        post-hook) is taken over by the next step begun outside the optimizer phase."""
        self._in_loader = False
        """Inside a timed DataLoader ``__next__``: a DataLoader drawn from inside it is not timed again."""
        self._foreign: int | None = None
        """The thread that last ran a training forward other than the training thread's."""
        torch_c = getattr(sys.modules.get("torch"), "_C", None)
        self._graph_task: Callable[[], int] | None = getattr(torch_c, "_current_graph_task_id", None)
        """-1 outside a backward pass: a forward inside one is a checkpoint's recomputation."""
        self._handles = [
            module.register_forward_pre_hook(self._forward_pre),
            module.register_forward_hook(self._forward_post),
        ]
        if not _optimizer_hooks.point(self):
            self.by_forward = True
            log.warning(
                "resource monitor: this torch has no global optimizer hooks (torch 2.0 or later has them): "
                "each training step is timed from one forward pass to the next, the optimizer's step "
                "counted as backward"
            )
        _loader_timing.attach(self)

    def get_age(self) -> int:
        return self.passes

    def __reduce__(self) -> tuple[Callable[[], StepPhases], tuple[()]]:
        """A copy of the watched module (``copy.deepcopy`` for an EMA, ``torch.save`` of the whole
        module) carries its hooks: they get an inert timer, which neither times nor counts, and
        pickles without the CUDA event maker or the handles."""
        return _inert, ()

    @property
    def totals(self) -> PhaseTotals:
        """What the hooks counted up to the last step's end (in the monitor thread)."""
        steps, ns = self._published
        return PhaseTotals(steps, ns, *self._device)

    def release(self) -> None:
        """Take the module's hooks off, idle torch's optimizer hooks (``_OptimizerHooks``), and stop
        timing the DataLoader."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        _optimizer_hooks.idle(self)
        _loader_timing.detach(self)

    def _to(self, phase: int) -> None:
        """A boundary: the time since the previous one goes to the phase it ends (the DataLoader's
        wait in it to input), and ``phase`` begins."""
        now = _now()
        elapsed = now - self._mark
        self._mark = now
        cum = self._cum
        loader = self.loader_ns
        if loader:
            self.loader_ns = 0
            if loader > elapsed:  # a boundary inside __next__ (the module run to make a batch)
                loader = elapsed
            cum[INPUT] += loader
            elapsed -= loader
        current = self._phase
        if current == _GAP:
            current = OTHER if self.loader_seen else INPUT
        cum[current] += elapsed
        self._phase = phase

    def _end_step(self) -> None:
        """The step ends at the boundary just passed: publish it (the first is not timed)."""
        self._forwarded = False
        if not self._timing:
            self._timing = True
            self._cum = list(self._published[1])
        else:
            self._steps += 1
            if self._inflight is not None:
                self._device_end()
            self._published = (self._steps, tuple(self._cum))
        self._step_start = self._mark

    def _forward_pre(self, module: Any, inputs: object) -> None:
        if not module.training:
            self.eval_passes += 1
            return
        if self._graph_task is not None and self._graph_task() != -1:
            return  # torch.utils.checkpoint runs the forward again inside the backward: backward's time
        thread = self._thread
        if thread is None:
            self._thread = _ident()
        elif thread != _ident():  # another thread's: its age, and its own optimizer step adopts it
            self.passes += 1
            self._foreign = _ident()
            return
        self.passes += 1
        if self.by_forward and self._forwarded:
            self._to(_GAP)
            self._end_step()
        self._to(FORWARD)
        self._forwarded = True
        if self._events is not None and self._inflight is None and self.device_done is None and self._timing:
            self._device_start()

    def _forward_post(self, module: Any, inputs: object, output: object) -> None:
        if module.training and self._phase == FORWARD and self._thread == _ident():
            self._to(BACKWARD)

    def _optimizer_pre(self, optimizer: object, args: object, kwargs: object) -> None:
        if self._thread != _ident():
            if self._foreign != _ident() or self._stepping is not None:
                if self._thread is None:
                    self.unseen_steps += 1
                return
            self._adopt()
        if self.by_forward:  # the monitor took a long gradient accumulation for a loop without one
            self.by_forward = False
        stepping = self._stepping
        if stepping is None or self._phase != OPTIMIZER or stepping is optimizer:
            self._stepping = optimizer  # else an inner optimizer's step inside the outer one's
            self._to(OPTIMIZER)

    def _optimizer_post(self, optimizer: object, args: object, kwargs: object) -> None:
        if self._thread != _ident() or self.by_forward or optimizer is not self._stepping:
            return  # another thread's, or an inner optimizer's step inside the outer one's
        self._stepping = None
        self._to(_GAP)
        if self._forwarded:  # a second optimizer of the same step (a GAN's) ends no new step
            self._end_step()

    def _adopt(self) -> None:
        """The training thread is this one: it stepped an optimizer after a training forward of its
        own (the first thread to run one only checked the output, or training moved to a thread).
        Its step under way began unseen, so it is not timed; the totals go on from those published."""
        self._thread, self._foreign = _ident(), None
        self._timing, self._forwarded, self._inflight = False, True, None
        self._phase, self._mark, self.loader_ns = BACKWARD, _now(), 0

    def no_optimizer_seen(self) -> bool:
        """In the monitor thread: whether ``FORWARDS_WITHOUT_STEP`` training forwards ran and no
        optimizer step ended one; from then on steps end at each training forward."""
        if self.by_forward or self._timing or self.passes < FORWARDS_WITHOUT_STEP:
            return False
        self.by_forward = True
        return True

    def _device_start(self) -> None:
        assert self._events is not None
        try:
            start = self._events(self.module)
            if start is None:
                self._events = None
                return
            start.record()
        except Exception as exc:  # a CUDA error costs the device timing, never the step
            self._device_failed(exc)
            return
        self._inflight = start

    def _device_end(self) -> None:
        start, self._inflight = self._inflight, None
        assert self._events is not None
        try:
            end = self._events(self.module)
            end.record()
        except Exception as exc:
            self._device_failed(exc)
            return
        self.device_done = (start, end, self._mark - self._step_start)

    def _device_failed(self, exc: BaseException) -> None:
        self._events = None
        self._inflight = None
        log.warning("resource monitor: timing the steps on the GPU failed (%s); it is not timed again", exc)

    def read_device(self) -> None:
        """In the monitor thread: fold in the step timed on the device if the GPU has finished it
        (a query, never a synchronization)."""
        done = self.device_done
        if done is None:
            return
        start, end, host_ns = done
        try:
            if not end.query():
                return
            device_ns = round(start.elapsed_time(end) * 1e6)  # elapsed_time is in ms
        except Exception as exc:
            self._device_failed(exc)
            self.device_done = None
            return
        device, host = self._device
        self._device = (device + device_ns, host + host_ns)
        self.device_done = None  # only now may the training thread time another step


def _inert() -> StepPhases:
    """A timer whose hooks return at once: it reads as inside a backward pass, in no phase."""
    phases = StepPhases.__new__(StepPhases)
    phases._graph_task, phases._phase = _inside_backward, _GAP
    return phases


def _inside_backward() -> int:
    return 0


def cuda_events() -> Callable[[Any], Any] | None:
    """Where torch has CUDA, a maker of timing CUDA events for a module (None for a module whose
    first parameter is not on a GPU); else None."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_available():
            return None
    except Exception:
        return None

    def event(module: Any) -> Any:
        parameter = next(iter(module.parameters()), None)
        return cuda.Event(enable_timing=True) if parameter is not None and parameter.is_cuda else None

    return event


def _idle(optimizer: object, args: object, kwargs: object) -> None:
    """torch's optimizer hook while no module is watched."""


class _OptimizerHooks:
    """torch's global optimizer step hooks, registered at the first watch and never removed: each
    watch and unwatch replaces the value of our entry in torch's hook tables in place (the watched
    timer's hook, or ``_idle``). A step iterates those tables live, so adding or removing an entry
    while a hook runs (``watch_model`` from a signal handler, or from another thread while a hook
    lets it run) would raise "OrderedDict mutated during iteration" out of the user's
    ``optimizer.step()``; replacing a value changes neither a table's size nor its order."""

    def __init__(self) -> None:
        self._slots: list[tuple[dict[int, Any], int]] = []
        """(torch's table, our key) for the pre-hooks and the post-hooks."""
        self._owner: StepPhases | None = None

    def point(self, phases: StepPhases | None) -> bool:
        """Make the hooks ``phases``'s (None: idle); False where this torch has no global optimizer
        hooks."""
        if phases is None:
            self._owner = None
            if self._slots:  # else never registered: nothing to idle
                self._set(_idle, _idle)
            return bool(self._slots)
        if not self._slots:
            optim = sys.modules.get("torch.optim.optimizer")
            pre = getattr(optim, "register_optimizer_step_pre_hook", None)
            post = getattr(optim, "register_optimizer_step_post_hook", None)
            if pre is None or post is None:
                return False
            for register in (pre, post):
                handle = register(_idle)
                self._slots.append((handle.hooks_dict_ref(), handle.id))
        self._owner = phases
        self._set(phases._optimizer_pre, phases._optimizer_post)
        return True

    def idle(self, phases: StepPhases) -> None:
        """Idle the hooks if ``phases`` still owns them (not once a newer watch took them)."""
        if self._owner is phases:
            self.point(None)

    def _set(self, *hooks: Callable[[object, object, object], None]) -> None:
        for (table, key), hook in zip(self._slots, hooks, strict=True):
            table[key] = hook


_optimizer_hooks = _OptimizerHooks()


class _LoaderTiming:
    """Times the DataLoader iterator's ``__next__`` for the watched module's ``StepPhases``, by
    wrapping torch's ``_BaseDataLoaderIter.__next__`` while a module is watched."""

    def __init__(self) -> None:
        self.phases: StepPhases | None = None
        self._original: Callable[[Any], Any] | None = None
        """What ``__next__`` was at the first watch (torch's), which the wrapper calls."""
        timing = self

        def __next__(iterator: Any) -> Any:
            original, watched = timing._original, timing.phases
            assert original is not None
            if watched is None or watched._in_loader or watched._thread not in (None, _ident()):
                return original(iterator)  # not the training thread's, or a DataLoader inside one
            start = _now()
            try:
                watched._in_loader = True
                return original(iterator)
            finally:  # the wait goes to input at the next boundary
                watched._in_loader = False
                watched.loader_ns += _now() - start
                watched.loader_seen = True

        self._wrapper = __next__
        """Made once: a watch from a signal handler in the middle of another puts on the same one."""

    def attach(self, phases: StepPhases | None) -> None:
        """Time ``phases``'s DataLoader waits (None: none, torch's ``__next__`` back)."""
        self.phases = phases
        self._settle()

    def detach(self, phases: StepPhases) -> None:
        if self.phases is phases:
            self.attach(None)

    def _settle(self) -> None:
        """The wrapper on while a module is watched, torch's ``__next__`` back while none is. Checked
        again after each change, so a watch_model() of a signal handler that ran in between is not
        undone; another library's wrapper put over ours is left in place (ours does nothing under it
        while no module is watched)."""
        loader = sys.modules.get("torch.utils.data.dataloader")
        base = getattr(loader, "_BaseDataLoaderIter", None)
        if base is None:
            return
        wrapper = self._wrapper
        if self._original is None:
            current = base.__next__
            if current is wrapper:
                return
            self._original = current
            wrapper.__qualname__, wrapper.__doc__ = current.__qualname__, current.__doc__
        while True:
            want, unwanted = (
                (wrapper, self._original) if self.phases is not None else (self._original, wrapper)
            )
            if base.__next__ is not unwanted:
                return
            base.__next__ = want


_loader_timing = _LoaderTiming()


def settle(watched: Callable[[], StepPhases | None]) -> None:
    """Point torch's optimizer hooks and the DataLoader's timing at the ``watched()`` timer (idle,
    and torch's ``__next__`` back, when there is none) until a pass ends with the same one watched:
    a signal handler's watch_model() run in the middle of another's leaves what it watched whole."""
    while True:
        current = watched()
        _optimizer_hooks.point(current)
        _loader_timing.attach(current)
        if watched() is current:
            return


class PhaseShares:
    """Each logged record's phase signals, from the watched module's totals at the previous one."""

    def __init__(self) -> None:
        self._phases: StepPhases | None = None
        self._last = _ZERO
        self._warned = False
        self._righted = False
        """An optimizer step came after the warning: said once too."""
        self._said_unseen = False

    def derive(self, phases: StepPhases | None) -> list[tuple[str, float]]:
        """(name, value) of the step time and each phase's share over the steps that ended since
        the previous call; nothing when none did (or a newly watched module's first call)."""
        if phases is None:
            self._phases = None
            return []
        if phases is not self._phases:
            self._phases, self._last = phases, phases.totals
            return []
        if phases.no_optimizer_seen() and not self._warned:
            self._warned = True
            log.warning(
                "resource monitor: %d training forward passes of the watched model and no torch.optim "
                "optimizer step: each step is timed from one forward pass to the next, the weights' "
                "update counted as backward",
                phases.passes,
            )
        if self._warned and not self._righted and not phases.by_forward:
            self._righted = True
            log.warning(
                "resource monitor: an optimizer step came after %d training forward passes (gradients "
                "accumulated that long): each step is timed between optimizer steps again",
                phases.passes,
            )
        if phases.unseen_steps >= STEPS_WITHOUT_FORWARD and not phases.passes and not self._said_unseen:
            self._said_unseen = True
            log.warning(
                "resource monitor: %d optimizer steps and no training forward pass of the watched %s, "
                "so its age stays 0 and no step is timed: %s",
                phases.unseen_steps,
                type(phases.module).__name__,
                "it ran only in evaluation mode (module.eval()); its training-mode forwards are counted"
                if phases.eval_passes
                else "the model trained is not the one given to sampler.watch_model() (a copy, or the "
                "module inside or around it), or it is called as model.forward(x), which runs no hooks, "
                "instead of model(x)",
            )
        phases.read_device()
        now, last = phases.totals, self._last
        steps = now.steps - last.steps
        spent = [a - b for a, b in zip(now.ns, last.ns, strict=True)]
        total = sum(spent)
        if steps <= 0 or total <= 0:  # the next record with a step gets what the device read meanwhile
            return []
        self._last = now
        derived = [(catalogue.STEP_SECONDS.name, total / steps / 1e9)]
        derived += [(s.name, 100.0 * ns / total) for s, ns in zip(catalogue.PHASE_SHARES, spent, strict=True)]
        host = now.device_host_ns - last.device_host_ns
        if host > 0:
            device = now.device_ns - last.device_ns
            derived.append((catalogue.DEVICE_SHARE.name, min(100.0, 100.0 * device / host)))
        return derived
