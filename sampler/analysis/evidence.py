"""Why a stretch was slow: what was different from the run's typical at the same time.

Each rule reads a few signals over the stretch's records and over the run's regular records
(the baseline) and compares their medians; it gives a ``Reason`` only when the difference is
large, citing the signals and both values. Reasons are ranked by ``strength``: how far past its
threshold each rule's difference went (1 at the threshold), so a CPU pressure of 60 % ranks above
an every-core-busy of 92 %. A rule whose signals the run did not record says nothing.

A cause that held for part of a stretch moves no median over all of it: every rule is asked again
of each of the stretch's ``PART_CHUNKS`` parts (consecutive records), and a cause it did not give
of the whole that held in parts covering ``PART_SHARE`` of the stretch's time (and at least
``PART_RECORDS`` records) is given from those records alone, with the share it held (a loop that
slept, then waited for its input, is named both ways).

What the loop was doing: where the watched model's steps were timed (the ``progress`` phase
shares), the phase whose seconds per step grew most names it (input-bound, compute-bound,
waiting in a phase or, for a rank of a launch, in the collective, host work or idle outside the
phases); without them, the training process's own CPU falling far below its typical while it did
not wait for a CPU says it was idle or sleeping, and its DataLoader workers' CPU (the process
tree's less the backend's) rising then says it waited for its input.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from sampler import catalogue
from sampler.analysis.stretches import Findings, Stretch
from sampler.analysis.timeline import Floats, Timeline

Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Evidence:
    """One signal behind a reason: its median over the stretch and over the baseline."""

    signal: str
    stretch: float
    typical: float


@dataclass(frozen=True)
class Reason:
    """One cause a stretch's signals point to."""

    cause: str
    """A short id: ``cpu_pressure``, ``workers_saturated`` ..."""
    text: str
    """One sentence, with the values."""
    evidence: tuple[Evidence, ...]
    strength: float
    """How far past its threshold the difference went (1: just at it), times ``share``."""
    share: float = 1.0
    """The share of the stretch's time the cause held (1: all of it; the evidence's medians are
    over the records where it held)."""


@dataclass(frozen=True)
class _Compare:
    """Medians of one signal over a stretch and over the baseline."""

    name: str
    stretch: float
    typical: float

    @property
    def evidence(self) -> Evidence:
        return Evidence(self.name, self.stretch, self.typical)


def _median(values: Floats) -> float | None:
    """The median of the finite ``values``; None without any. Sorting is cheaper than
    ``np.median`` on the few records a stretch's part holds, and the rules ask thousands of times."""
    values = np.sort(values[np.isfinite(values)])
    count = len(values)
    if not count:
        return None
    return float((values[(count - 1) // 2] + values[count // 2]) / 2)


class Baseline:
    """The records stretches are judged against, with what every stretch reads of them computed
    once: each signal's median, the columns derived from others, each record's window. A run with
    hundreds of stretches reads its baseline once, not once a stretch (which took minutes)."""

    def __init__(self, timeline: Timeline, records: Mask) -> None:
        self.timeline, self.records = timeline, records
        self.weights = np.nan_to_num(np.clip(timeline.window_seconds(), 0, None))
        """Each record's window, s (0 for the first)."""
        self.steps = np.nan_to_num(np.clip(timeline.window_steps(), 0, None))
        """The steps each record's window made (0 for the first)."""
        self._medians: dict[str, float | None] = {}
        self._derived: dict[str, Floats | None] = {}
        self._shares: dict[str, float] = {}

    @functools.cached_property
    def gpus(self) -> list[str]:
        """The devices the run recorded, in order."""
        return _gpus(self.timeline)

    def median(self, key: str, column: Floats) -> float | None:
        """The median of ``column`` (known as ``key``) over the baseline."""
        if key not in self._medians:
            self._medians[key] = _median(column[self.records])
        return self._medians[key]

    def derived(self, key: str, make: Callable[[Timeline], Floats | None]) -> Floats | None:
        """The column ``make`` derives from the timeline's, made once."""
        if key not in self._derived:
            self._derived[key] = make(self.timeline)
        return self._derived[key]

    def share(self, name: str, column: Floats) -> float:
        """The share of the baseline's records where ``column`` (``name``) was set."""
        if name not in self._shares:
            self._shares[name] = _share(column, self.records)
        return self._shares[name]


Indices = npt.NDArray[np.intp]


class _Frame:
    """The records a rule judges (``inside``: their indices, in order) against the ``base``
    records; asking a rule of a stretch's part costs a pass over the part's records alone."""

    def __init__(self, base: Baseline, inside: Indices, launched: bool) -> None:
        self.base, self.inside, self.launched = base, inside, launched
        self.timeline = base.timeline

    def part(self, inside: Indices) -> _Frame:
        """The same judged against the same baseline, over the records ``inside`` only."""
        return _Frame(self.base, inside, self.launched)

    def compare(
        self, name: str, derive: Callable[[Timeline], Floats | None] | None = None
    ) -> _Compare | None:
        """``name``'s medians (or those of the column ``derive`` makes, cited as ``name``); None
        where either side has none."""
        if derive is None:
            column, key = self.timeline.column(name), name
        else:
            key = f"derived {name} {derive.__qualname__}"
            column = self.base.derived(key, derive)
        if column is None:
            return None
        typical = self.base.median(key, column)
        here = _median(column[self.inside])
        if typical is None or here is None:
            return None
        return _Compare(name, here, typical)

    def first(self, names: Iterable[str]) -> _Compare | None:
        """The first of ``names`` the run recorded, compared."""
        for name in names:
            found = self.compare(name)
            if found is not None:
                return found
        return None

    def steps(self) -> int:
        """The steps the judged records' windows made."""
        return round(float(self.base.steps[self.inside].sum()))

    def median(self, name: str) -> float | None:
        """``name``'s median over the judged records alone."""
        column = self.timeline.column(name)
        return None if column is None else _median(column[self.inside])


Rule = Callable[[_Frame], list[Reason]]


_FULL_PRESSURE = {
    catalogue.PRESSURE_MEMORY_SOME: catalogue.PRESSURE_MEMORY_FULL,
    catalogue.PRESSURE_IO_SOME: catalogue.PRESSURE_IO_FULL,
    catalogue.PRESSURE_CGROUP_MEMORY_SOME: catalogue.PRESSURE_CGROUP_MEMORY_FULL,
    catalogue.PRESSURE_CGROUP_IO_SOME: catalogue.PRESSURE_CGROUP_IO_FULL,
}
"""A share of time some task stalled -> the share every task did at once, where recorded."""


def _pressure(
    resource: str, cgroup: catalogue.Signal, system: catalogue.Signal, what: str, threshold: float
) -> Rule:
    """Stall time of ``resource`` (cpu, memory, io): the backend's ``cgroup``'s where recorded,
    else the ``system``'s; a reason when it rose by ``threshold`` points and by half (on a busy
    host the typical share is already high)."""
    names = {catalogue.name_of(signal): signal for signal in (cgroup, system)}

    def rule(frame: _Frame) -> list[Reason]:
        found = frame.first(names)
        if found is None or found.stretch - found.typical < threshold or found.stretch < 1.5 * found.typical:
            return []
        text = (
            f"{resource} pressure: {what} {found.stretch:.0f}% of the time (typically {found.typical:.0f}%)"
        )
        evidence = [found.evidence]
        every = _FULL_PRESSURE.get(names[found.name])
        full = None if every is None else frame.compare(catalogue.name_of(every))
        if full is not None and full.stretch - full.typical >= threshold / 2:
            text += f", every task at once {full.stretch:.0f}%"
            evidence.append(full.evidence)
        return [
            Reason(f"{resource}_pressure", text, tuple(evidence), (found.stretch - found.typical) / threshold)
        ]

    return rule


def _cpu_starved(frame: _Frame) -> list[Reason]:
    wait = frame.compare(catalogue.name_of(catalogue.PROCESS_CPU_WAIT))
    if wait is None or wait.stretch - wait.typical < 20:
        return []
    text = (
        f"the backend's main thread waited for a CPU {wait.stretch:.0f}% of the time (typically "
        f"{wait.typical:.0f}%): other work held its cores"
    )
    return [Reason("cpu_starved", text, (wait.evidence,), (wait.stretch - wait.typical) / 20)]


def _cores_allowed(frame: _Frame) -> float | None:
    """The CPUs the backend's tree could have: its affinity, capped by a container quota."""
    cores = frame.median(catalogue.name_of(catalogue.PROCESS_CORES))
    quota = frame.median(catalogue.name_of(catalogue.CONTAINER_CPU_QUOTA))
    limits = [c for c in (cores, quota) if c is not None and c > 0]
    return min(limits) if limits else None


def _cpus(cores: float) -> str:
    """``cores`` CPUs in words: ``1 CPU``, ``0.5 CPUs``, ``8 CPUs``."""
    return f"{cores:g} CPU" + ("" if cores == 1 else "s")


def _workers_saturated(frame: _Frame) -> list[Reason]:
    tree = frame.compare(catalogue.name_of(catalogue.TREE_CPU))
    cores = _cores_allowed(frame)
    if tree is None or cores is None:
        return []
    used, typical = tree.stretch / 100, tree.typical / 100
    if used < 0.9 * cores or used < 1.2 * typical:
        return []
    # Sampled apart, the tree's CPU can read above what it may use: no tree uses more than that.
    used, typical = min(used, cores), min(typical, cores)
    text = (
        f"the process tree kept {used:.1f} of the {_cpus(cores)} it may use busy (typically "
        f"{typical:.1f}): the backend and its workers are saturated"
    )
    return [Reason("workers_saturated", text, (tree.evidence,), 1 + (used / cores - 0.9) * 10)]


def _one_core(backend: _Compare) -> bool:
    """The backend ran at one full core where it typically did not: one Python thread's pace."""
    return 85 <= backend.stretch <= 115 and abs(backend.typical - 100) > 25


def _gil_bound(frame: _Frame) -> list[Reason]:
    backend = frame.compare(catalogue.name_of(catalogue.PROCESS_CPU))
    if backend is None or not _one_core(backend):
        return []
    cores = _cores_allowed(frame)
    if cores is not None and cores < 2:  # one core is all it may use: no telling the GIL from that
        return []
    text = (
        f"the backend itself ran at one full core ({backend.stretch:.0f}%, typically "
        f"{backend.typical:.0f}%): a step bound by one Python thread (the GIL)"
    )
    return [Reason("gil_bound", text, (backend.evidence,), abs(backend.typical - 100) / 25)]


def _all_cores_busy(frame: _Frame) -> list[Reason]:
    system = frame.compare(catalogue.name_of(catalogue.CPU_UTILIZATION))
    if system is None or system.stretch < 90 or system.stretch - system.typical < 15:
        return []
    text = f"every core of the host was busy ({system.stretch:.0f}% CPU, typically {system.typical:.0f}%)"
    return [Reason("host_cpu_busy", text, (system.evidence,), (system.stretch - system.typical) / 15)]


def _container_memory(frame: _Frame) -> list[Reason]:
    used = frame.compare(catalogue.name_of(catalogue.CONTAINER_MEMORY_PERCENT))
    if used is None or used.stretch < 90 or used.stretch - used.typical < 5:
        return []
    text = f"memory at {used.stretch:.0f}% of the container's limit (typically {used.typical:.0f}%)"
    return [Reason("container_memory", text, (used.evidence,), 1 + (used.stretch - 90) / 5)]


SWAP_IN_MIB_PER_SECOND = 1.0
"""Swap-ins that make a reason: this many MiB/s more than typical, and twice typical."""


def _swapping(frame: _Frame) -> list[Reason]:
    swap_in = frame.compare(catalogue.name_of(catalogue.SWAPPED_IN_RATE))
    if (
        swap_in is None
        or swap_in.stretch - swap_in.typical < SWAP_IN_MIB_PER_SECOND
        or swap_in.stretch < 2 * swap_in.typical
    ):
        return []
    text = (
        f"swapping: the machine read {swap_in.stretch:.1f} MiB/s back from swap (typically "
        f"{swap_in.typical:.1f}): memory the training needed had been pushed out"
    )
    evidence = [swap_in.evidence]
    swap_out = frame.compare(catalogue.name_of(catalogue.SWAPPED_OUT_RATE))
    if swap_out is not None and swap_out.stretch - swap_out.typical >= SWAP_IN_MIB_PER_SECOND:
        text += f", and wrote {swap_out.stretch:.1f} MiB/s out"
        evidence.append(swap_out.evidence)
    strength = 1 + np.log2((swap_in.stretch - swap_in.typical) / SWAP_IN_MIB_PER_SECOND)
    return [Reason("swap", text, tuple(evidence), float(strength))]


_GPU = re.compile(rf"^{re.escape(catalogue.GPU_NAME_PREFIX)}({catalogue.DEVICE_LABEL.pattern})/")
_THROTTLES = (
    (catalogue.GPU_THROTTLE_POWER, "power"),
    (catalogue.GPU_THROTTLE_THERMAL, "thermal"),
    (catalogue.GPU_THROTTLE_HW_SLOWDOWN, "hardware"),
)


def _gpus(timeline: Timeline) -> list[str]:
    return sorted(
        {m.group(1) for name in timeline.values if (m := _GPU.match(name))}, key=catalogue.device_order
    )


THROTTLED_SHARE = 0.2
"""A throttle reason that held the clocks down this share of the time more than typical makes a reason."""


def _gpu_throttled_time(frame: _Frame) -> list[Reason]:
    """The driver's own count of the time each reason held the clocks down: a burst
    between samples counts, which the sampled bitmask misses."""
    reasons = []
    for device in frame.base.gpus:
        for part, _, cause in catalogue.THROTTLE_REASONS:
            held = frame.compare(_throttle_share(device, part))
            if held is None or held.stretch - held.typical < THROTTLED_SHARE:
                continue
            text = (
                f"GPU {device}'s clocks were held down by {cause} {held.stretch:.0%} of the time "
                f"(typically {held.typical:.0%}), as the driver counts it"
            )
            strength = (held.stretch - held.typical) / THROTTLED_SHARE
            reasons.append(Reason(f"gpu_{part}_throttle", text, (held.evidence,), strength))
    return reasons


def _throttle_share(device: str, part: str) -> str:
    counter = catalogue.THROTTLED[part]
    return catalogue.name_of(catalogue.SIGNALS[counter.key + catalogue.RATE_SUFFIX], device)


def _gpu_throttled(frame: _Frame) -> list[Reason]:
    """The sampled bitmask's flags, for a device whose driver counts no throttle time."""
    reasons = []
    for device in frame.base.gpus:
        if any(
            frame.timeline.column(_throttle_share(device, part)) is not None
            for part, _, _ in catalogue.THROTTLE_REASONS
        ):
            continue
        for signal, why in _THROTTLES:
            name = catalogue.name_of(signal, device)
            column = frame.timeline.column(name)
            if column is None:
                continue
            share, typical = _share(column, frame.inside), frame.base.share(name, column)
            if share >= 0.5 and share - typical >= 0.3:
                text = (
                    f"GPU {device} was {why}-throttled in {share:.0%} of the stretch's samples "
                    f"(typically {typical:.0%})"
                )
                reasons.append(
                    Reason(f"gpu_{why}_throttle", text, (Evidence(name, share, typical),), share / 0.5)
                )
    return reasons


def _share(column: Floats, records: Mask | Indices) -> float:
    values = column[records]
    values = values[np.isfinite(values)]
    return float(np.mean(values > 0)) if len(values) else 0.0


def _gpu_idle(frame: _Frame) -> list[Reason]:
    """A GPU that waited for work: its SMs' activity (GPM) where recorded, which reads low
    while a kernel waits in a collective, else NVML's utilization, which reads 100% then."""
    reasons = []
    for device in frame.base.gpus:
        names = (
            catalogue.name_of(catalogue.GPU_SM_ACTIVITY, device),
            catalogue.name_of(catalogue.GPU_UTILIZATION, device),
        )
        util = frame.first(names)
        what = "its SMs were" if util is not None and util.name == names[0] else "it was"
        if util is not None and util.typical - util.stretch >= 20:
            text = (
                f"GPU {device}: {what} busy {util.stretch:.0f}% of the time (typically {util.typical:.0f}%)"
            )
            evidence = [util.evidence]
            power = frame.compare(catalogue.name_of(catalogue.GPU_ENERGY_RATE, device))
            if power is not None and power.stretch < power.typical:  # the energy counter agrees
                text += f", drawing {power.stretch:.0f} W (typically {power.typical:.0f} W)"
                evidence.append(power.evidence)
            strength = (util.typical - util.stretch) / 20 * 0.5
            reasons.append(Reason("gpu_waiting", text + ": it waited for work", tuple(evidence), strength))
    return reasons


IDLE_SHARE = 0.5
IDLE_POINTS = 20.0
"""The training process is idle when its CPU falls below this share of its typical and this many
points below it (a typical under these points is no busy loop to fall from)."""
STARVED_POINTS = 10.0
"""An idle-looking process whose wait for a CPU (or the CPU pressure) rose this many points was
starved, not idle."""
PHASE_POINTS = 10.0
"""A phase of the step names what the loop was doing when its share of the step rose this many
points and its seconds per step grew by half the step's growth or more."""
WORKERS_POINTS = 20.0
"""The DataLoader workers were busy when their CPU rose this many points and by half."""

_OWN_CPU = catalogue.name_of(catalogue.PROCESS_CPU)
_TREE_CPU = catalogue.name_of(catalogue.TREE_CPU)
_TREE_COUNT = catalogue.name_of(catalogue.TREE_PROCESSES)
_STEP = catalogue.name_of(catalogue.STEP_SECONDS)
_PHASES = tuple(
    (catalogue.name_of(signal), phase, label)
    for signal, (phase, label, _) in zip(catalogue.PHASE_SHARES, catalogue.STEP_PHASES, strict=True)
)
_CPU_PRESSURE = (
    catalogue.name_of(catalogue.PRESSURE_CGROUP_CPU_SOME),
    catalogue.name_of(catalogue.PRESSURE_CPU_SOME),
)


WAITING_SHARE = 0.5
"""A loop whose process used less CPU (100 % per core, every thread) than this share of the time
its steps spent in a phase did not run in it: it waited."""


def _idle(frame: _Frame) -> _Compare | None:
    """The training process's CPU where it fell far below its typical while the process did
    not wait for a CPU (its own wait, else the CPU pressure, did not rise) and did not run at one
    full core (``_gil_bound``): it slept or waited."""
    own = frame.compare(_OWN_CPU)
    if own is None or own.stretch > IDLE_SHARE * own.typical or own.typical - own.stretch < IDLE_POINTS:
        return None
    if _one_core(own):  # busy, at one thread's pace: the GIL, not idle
        return None
    wait = frame.compare(catalogue.name_of(catalogue.PROCESS_CPU_WAIT)) or frame.first(_CPU_PRESSURE)
    if wait is not None and wait.stretch - wait.typical >= STARVED_POINTS:
        return None
    return own


def _workers_cpu(timeline: Timeline) -> Floats | None:
    """The CPU of the backend's descendants: the tree's less the backend's own, %; never below 0
    (the two are sampled apart: the tree's can read below the backend's alone)."""
    tree, own = timeline.column(_TREE_CPU), timeline.column(_OWN_CPU)
    return None if tree is None or own is None else np.maximum(tree - own, 0)


def _workers(frame: _Frame) -> tuple[_Compare, _Compare] | None:
    """The CPU of the backend's descendants (its DataLoader workers: the tree's less the backend's
    own), and the tree's, where the tree had descendants (more than one process where counted)."""
    tree, own = frame.timeline.column(_TREE_CPU), frame.timeline.column(_OWN_CPU)
    count = frame.median(_TREE_COUNT)
    if tree is None or own is None or (count is not None and count < 2):
        return None
    workers, whole = frame.compare(_TREE_CPU, _workers_cpu), frame.compare(_TREE_CPU)
    if workers is None or whole is None or (count is None and max(workers.stretch, workers.typical) < 1):
        return None  # counted, workers that used no CPU are still there: held up (storage, a sleep)
    return workers, whole


def _workers_text(workers: _Compare) -> str:
    return f"its DataLoader workers used {workers.stretch:.0f}% CPU (typically {workers.typical:.0f}%)"


def _busy(workers: _Compare) -> bool:
    """The workers' CPU rose: they were making the batches the loop waited for."""
    return workers.stretch - workers.typical >= WORKERS_POINTS and workers.stretch >= 1.5 * workers.typical


def _phase_share(name: str) -> Callable[[Timeline], Floats | None]:
    """What makes a phase's share of the step (``name``) within 0-100 % (a store written by
    other hands can hold any number: 250 % of a step is no share)."""

    def share(timeline: Timeline) -> Floats | None:
        column = timeline.column(name)
        return None if column is None else np.clip(column, 0, 100)

    return share


def _phase_seconds(name: str) -> Callable[[Timeline], Floats | None]:
    """What makes the seconds per step a phase (its share ``name``) took."""

    def seconds(timeline: Timeline) -> Floats | None:
        share, step = _phase_share(name)(timeline), timeline.column(_STEP)
        return None if share is None or step is None else share * np.clip(step, 0, None) / 100

    return seconds


def _grown_phase(frame: _Frame) -> tuple[str, str, _Compare, _Compare, _Compare] | None:
    """(phase, label, its share of the step, its seconds per step, the step time) of the phase
    whose seconds per step grew most, where it holds the step's growth (``PHASE_POINTS``); None
    without phase timings."""
    step = frame.compare(_STEP)
    if step is None:
        return None
    best: tuple[float, str, str, _Compare, _Compare] | None = None
    for name, phase, label in _PHASES:
        share = frame.compare(name, _phase_share(name))
        seconds = frame.compare(name, _phase_seconds(name))
        if share is None or seconds is None:
            continue
        grew = seconds.stretch - seconds.typical
        if best is None or grew > best[0]:
            best = (grew, phase, label, share, seconds)
    if best is None:
        return None
    grew, phase, label, share, seconds = best
    if grew <= 0 or grew < 0.5 * (step.stretch - step.typical):
        return None
    return (phase, label, share, seconds, step) if share.stretch - share.typical >= PHASE_POINTS else None


_PHASE_WORDS = {
    "forward": "the forward pass",
    "backward": "the backward pass",
    "optimizer": "the optimizer's step",
}
"""A step's phase as a sentence names it (``catalogue.STEP_PHASES``' labels are a chart's)."""


def _loop(frame: _Frame) -> list[Reason]:
    """What the training loop was doing: the phase its steps' time went to where they were timed,
    else its own CPU fallen idle, with its DataLoader workers' CPU beside it."""
    own, idle, workers = frame.compare(_OWN_CPU), _idle(frame), _workers(frame)
    grown = _grown_phase(frame)
    if grown is not None:
        phase, label, share, seconds, step = grown
        # Its CPU (every thread's) well under the phase's share of the time: the loop was not
        # running in it, whatever its CPU was before.
        if idle is None and own is not None and own.stretch < WAITING_SHARE * share.stretch:
            idle = own
        evidence = [share.evidence, step.evidence]
        took = (
            f"{share.stretch:.0f}% of each of {frame.steps():,} steps (typically {share.typical:.0f}%), "
            f"{seconds.stretch * 1000:.3g} ms a step against {seconds.typical * 1000:.3g} ms"
        )
        cpu = "" if own is None else f"its CPU {own.stretch:.0f}% (typically {own.typical:.0f}%)"
        if own is not None:
            evidence.append(own.evidence)
        what = _PHASE_WORDS.get(phase, label)
        if phase == "input" and workers is not None:
            cause, text = "input_bound", f"input-bound: the loop waited for its next batch {took}"
            text += "; " + _workers_text(workers[0])
            if _busy(workers[0]):
                text += ": making the batches held it"
            else:
                text += ": they were not busier, so they were held up too (by storage, a lock, other work)"
            evidence.append(workers[1].evidence)
        elif phase == "input" and idle is not None:  # no workers: a sleep, or loading that waited
            cause = "loop_idle"
            text = (
                f"the loop slept or waited before its forward pass {took}, {cpu}, with no DataLoader "
                "workers: a sleep, or its own data loading waiting (for storage, the network)"
            )
        elif phase == "input":
            cause = "input_bound"
            text = (
                f"input-bound: the loop waited for its next batch {took}, {cpu}: with no DataLoader "
                "workers, it makes its batches itself"
            )
        elif phase == "other":
            if idle is not None:
                cause = "loop_idle"
                text = (
                    f"the loop slept or waited between its steps' phases {took}, {cpu}: a sleep, or a "
                    "wait outside the model and the DataLoader (a lock, a file, another process)"
                )
            else:
                cause = "host_work"
                text = f"host work outside the step's phases (logging, evaluation, syncing) took {took}"
                text += f", {cpu}: the loop was busy there" if cpu else ""
        elif idle is not None:  # in forward, backward or the optimizer, its CPU idle
            if phase == "backward" and frame.launched:
                cause, where = "collective_wait", "in the gradients' collective, for a slower rank"
            else:
                cause, where = "phase_wait", "there (for a device, or a lock)"
            text = f"the loop waited in {what} {took}, {cpu}: it waited {where}"
        else:
            cause, text = "compute_bound", f"compute-bound: {what} took {took}" + (f", {cpu}" if cpu else "")
        return [Reason(cause, text, tuple(evidence), (share.stretch - share.typical) / PHASE_POINTS)]
    if idle is None:
        return []
    strength = (idle.typical - idle.stretch) / IDLE_POINTS
    held = f"the training process was idle: its CPU {idle.stretch:.0f}% (typically {idle.typical:.0f}%)"
    if workers is not None and _busy(workers[0]):
        text = f"{held} while {_workers_text(workers[0])}: it waited for its input"
        return [Reason("input_bound", text, (idle.evidence, workers[1].evidence), strength)]
    text = (
        f"{held}, and it did not wait for a CPU: it slept or waited for something else "
        "(its input, I/O, a lock, another process)"
    )
    if workers is not None:
        text += f"; {_workers_text(workers[0])}"
    return [Reason("process_idle", text, (idle.evidence,), strength)]


INPUT_PAUSE_SHARE = 50.0
"""A pause whose window went this share and more to waiting for input (and ``PHASE_POINTS``
more than typically) was the loop waiting for its input, not an evaluation or a checkpoint."""


def pause_reasons(pauses: list[Stretch], baseline: Baseline) -> list[list[Reason]]:
    """Per pause, what it was where the step's phases tell: the loop waited for its input through
    it. Such pauses every so many steps, with DataLoader workers in the tree, are the workers
    started again at each epoch (``persistent_workers=False``), each epoch's first batch waiting
    for their start."""
    waited: list[tuple[Stretch, _Compare, bool] | None] = []  # pauses spent mostly waiting for input
    for pause in pauses:
        frame = _Frame(baseline, np.array([pause.last]), False)
        share = frame.compare(_PHASES[0][0], _phase_share(_PHASES[0][0]))
        mostly = share is not None and share.stretch >= INPUT_PAUSE_SHARE
        waited.append((pause, share, _workers(frame) is not None) if share is not None and mostly else None)
    # Named where its share also stood out from the typical.
    found = [item if item and item[1].stretch - item[1].typical >= PHASE_POINTS else None for item in waited]
    # Epochs of one length: the pauses came every so many steps (the records' steps within 10 %).
    gaps = np.diff([item[0].start_step for item in found if item is not None])
    every = float(np.median(gaps)) if len(gaps) else 0.0
    epochs = every > 0 and bool(np.all(np.abs(gaps - every) <= 0.1 * every))
    if epochs:
        # A pause on their period that also waited for its input is one more: in a loop bound by
        # its input all along, such a window's share cannot stand out from the typical.
        first = next(item[0].start_step for item in found if item is not None)
        for i, item in enumerate(waited):
            if item is not None and found[i] is None:
                periods = abs(item[0].start_step - first) / every
                if round(periods) >= 1 and abs(periods - round(periods)) <= 0.1:
                    found[i] = item
    count = sum(item is not None for item in found)
    reasons: list[list[Reason]] = []
    for item in found:
        if item is None:
            reasons.append([])
            continue
        pause, share, workers = item
        text = (
            f"the loop waited {pause.still_seconds:.1f} s for its input ({share.stretch:.0f}% of the "
            f"window, typically {share.typical:.0f}%), not an evaluation or a checkpoint"
        )
        if workers and epochs:
            text += (
                f": the DataLoader's workers started again at each epoch (every {every:,.0f} steps,"
                f" {count} times); persistent_workers=True keeps them"
            )
        elif workers:
            text += ": its DataLoader's workers were starting, or slow to make its first batch"
        strength = (share.stretch - share.typical) / PHASE_POINTS
        reasons.append([Reason("input_pause", text, (share.evidence,), strength)])
    return reasons


RULES: tuple[Rule, ...] = (
    _loop,
    _cpu_starved,
    _pressure(
        "cpu",
        catalogue.PRESSURE_CGROUP_CPU_SOME,
        catalogue.PRESSURE_CPU_SOME,
        "runnable tasks waited for a CPU",
        10.0,
    ),
    _pressure(
        "memory",
        catalogue.PRESSURE_CGROUP_MEMORY_SOME,
        catalogue.PRESSURE_MEMORY_SOME,
        "tasks stalled on memory (reclaim, swap-in, refaults)",
        5.0,
    ),
    _pressure(
        "io", catalogue.PRESSURE_CGROUP_IO_SOME, catalogue.PRESSURE_IO_SOME, "tasks waited for I/O", 5.0
    ),
    _workers_saturated,
    _gil_bound,
    _all_cores_busy,
    _container_memory,
    _swapping,
    _gpu_throttled_time,
    _gpu_throttled,
    _gpu_idle,
)
"""Every rule, each one cause."""


PART_CHUNKS = 20
"""A stretch is judged in at most this many parts (consecutive records) for a cause that held
in some of it."""
PART_SHARE = 0.2
PART_RECORDS = 2
"""A cause held in parts covering at least this share of the stretch's time and this many records
is named with that share."""


def reasons(
    timeline: Timeline,
    findings: Findings,
    stretch: Stretch,
    launched: bool = False,
    baseline: Baseline | None = None,
) -> list[Reason]:
    """What the signals say of a slow ``stretch``, strongest first; empty when nothing stood out.
    ``launched``: the run is a rank of a multi-rank launch (its backward may wait for its peers);
    ``baseline``: the run's regular records (``findings.regular``), shared by its stretches."""
    inside = np.arange(stretch.first, stretch.last + 1)
    return _judged(baseline or Baseline(timeline, findings.regular), inside, launched)


def against(timeline: Timeline, inside: Mask, baseline: Mask, launched: bool = False) -> list[Reason]:
    """What every rule says of the records ``inside`` compared with the ``baseline`` records
    (a slow stretch against the run's regular windows, or a lagging rank against the other
    ranks at the same time), strongest first: of all of them, or of the part a cause held in."""
    return _judged(Baseline(timeline, baseline), np.flatnonzero(inside), launched)


def _judged(base: Baseline, inside: Indices, launched: bool) -> list[Reason]:
    whole = _Frame(base, inside, launched)
    found = []
    for rule in RULES:
        said = rule(whole)
        found += said + _in_part(rule, whole, {reason.cause for reason in said})
    return sorted(found, key=lambda reason: -reason.strength)


def _in_part(rule: Rule, whole: _Frame, said: set[str]) -> list[Reason]:
    """``rule``'s reasons over the parts of ``whole`` where each held, but for the causes it
    ``said`` of the whole, where they cover ``PART_SHARE`` of its time, with that share."""
    records = whole.inside
    if len(records) <= PART_RECORDS:
        return []
    held: dict[str, list[Indices]] = {}
    for chunk in np.array_split(records, min(PART_CHUNKS, len(records))):
        for reason in rule(whole.part(chunk)):
            held.setdefault(reason.cause, []).append(chunk)
    weights = whole.base.weights
    total = weights[records].sum()
    found = []
    for cause, chunks in held.items():
        part = np.concatenate(chunks)
        share = weights[part].sum() / total if total > 0 else len(part) / len(records)
        if cause in said or share < PART_SHARE or len(part) < PART_RECORDS:
            continue
        found += [
            replace(
                reason,
                text=f"{reason.text}, for {share:.0%} of the stretch",
                strength=float(reason.strength * share),
                share=float(share),
            )
            for reason in rule(whole.part(part))
            if reason.cause == cause
        ]
    return found
