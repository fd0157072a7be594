"""Why a stretch was slow: what was different from the run's typical at the same time.

Each rule reads a few signals over the stretch's records and over the run's regular records
(the baseline) and compares their medians; it gives a ``Reason`` only when the difference is
large, citing the signals and both values. Reasons are ranked by ``strength``: how far past its
threshold each rule's difference went (1 at the threshold), so a CPU pressure of 60 % ranks above
an every-core-busy of 92 %. A rule whose signals the run did not record says nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

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
    """How far past its threshold the difference went (1: just at it)."""


@dataclass(frozen=True)
class _Compare:
    """Medians of one signal over a stretch and over the baseline."""

    name: str
    stretch: float
    typical: float

    @property
    def evidence(self) -> Evidence:
        return Evidence(self.name, self.stretch, self.typical)


def _compare(timeline: Timeline, name: str, inside: Mask, baseline: Mask) -> _Compare | None:
    column = timeline.column(name)
    if column is None:
        return None
    here, there = column[inside], column[baseline]
    here, there = here[np.isfinite(here)], there[np.isfinite(there)]
    if not len(here) or not len(there):
        return None
    return _Compare(name, float(np.median(here)), float(np.median(there)))


def _first(timeline: Timeline, names: Iterable[str], inside: Mask, baseline: Mask) -> _Compare | None:
    """The first of ``names`` the run recorded, compared."""
    for name in names:
        found = _compare(timeline, name, inside, baseline)
        if found is not None:
            return found
    return None


Rule = Callable[[Timeline, Mask, Mask], list[Reason]]


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

    def rule(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
        found = _first(timeline, names, inside, baseline)
        if found is None or found.stretch - found.typical < threshold or found.stretch < 1.5 * found.typical:
            return []
        text = (
            f"{resource} pressure: {what} {found.stretch:.0f}% of the time (typically {found.typical:.0f}%)"
        )
        evidence = [found.evidence]
        every = _FULL_PRESSURE.get(names[found.name])
        full = None if every is None else _compare(timeline, catalogue.name_of(every), inside, baseline)
        if full is not None and full.stretch - full.typical >= threshold / 2:
            text += f", every task at once {full.stretch:.0f}%"
            evidence.append(full.evidence)
        return [
            Reason(f"{resource}_pressure", text, tuple(evidence), (found.stretch - found.typical) / threshold)
        ]

    return rule


def _cpu_starved(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
    wait = _compare(timeline, catalogue.name_of(catalogue.PROCESS_CPU_WAIT), inside, baseline)
    if wait is None or wait.stretch - wait.typical < 20:
        return []
    text = (
        f"the backend's main thread waited for a CPU {wait.stretch:.0f}% of the time (typically "
        f"{wait.typical:.0f}%): other work held its cores"
    )
    return [Reason("cpu_starved", text, (wait.evidence,), (wait.stretch - wait.typical) / 20)]


def _cores_allowed(timeline: Timeline, inside: Mask, baseline: Mask) -> float | None:
    """The CPUs the backend's tree could have: its affinity, capped by a container quota."""
    cores = _compare(timeline, catalogue.name_of(catalogue.PROCESS_CORES), inside, inside | baseline)
    quota = _compare(timeline, catalogue.name_of(catalogue.CONTAINER_CPU_QUOTA), inside, inside | baseline)
    limits = [c.stretch for c in (cores, quota) if c is not None and c.stretch > 0]
    return min(limits) if limits else None


def _workers_saturated(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
    tree = _compare(timeline, catalogue.name_of(catalogue.TREE_CPU), inside, baseline)
    cores = _cores_allowed(timeline, inside, baseline)
    if tree is None or cores is None:
        return []
    used, typical = tree.stretch / 100, tree.typical / 100
    if used < 0.9 * cores or used < 1.2 * typical:
        return []
    text = (
        f"the process tree kept {used:.1f} of its {cores:.0f} CPUs busy (typically {typical:.1f}): "
        "the backend and its workers are saturated"
    )
    return [Reason("workers_saturated", text, (tree.evidence,), 1 + (used / cores - 0.9) * 10)]


def _gil_bound(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
    backend = _compare(timeline, catalogue.name_of(catalogue.PROCESS_CPU), inside, baseline)
    if backend is None or not 85 <= backend.stretch <= 115 or abs(backend.typical - 100) <= 25:
        return []
    text = (
        f"the backend itself ran at one full core ({backend.stretch:.0f}%, typically "
        f"{backend.typical:.0f}%): a step bound by one Python thread (the GIL)"
    )
    return [Reason("gil_bound", text, (backend.evidence,), abs(backend.typical - 100) / 25)]


def _all_cores_busy(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
    system = _compare(timeline, catalogue.name_of(catalogue.CPU_UTILIZATION), inside, baseline)
    if system is None or system.stretch < 90 or system.stretch - system.typical < 15:
        return []
    text = f"every core of the host was busy ({system.stretch:.0f}% CPU, typically {system.typical:.0f}%)"
    return [Reason("host_cpu_busy", text, (system.evidence,), (system.stretch - system.typical) / 15)]


def _container_memory(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
    used = _compare(timeline, catalogue.name_of(catalogue.CONTAINER_MEMORY_PERCENT), inside, baseline)
    if used is None or used.stretch < 90 or used.stretch - used.typical < 5:
        return []
    text = f"memory at {used.stretch:.0f}% of the container's limit (typically {used.typical:.0f}%)"
    return [Reason("container_memory", text, (used.evidence,), 1 + (used.stretch - 90) / 5)]


SWAP_IN_MIB_PER_SECOND = 1.0
"""Swap-ins that make a reason: this many MiB/s more than typical, and twice typical."""


def _swapping(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
    swap_in = _compare(timeline, catalogue.name_of(catalogue.SWAPPED_IN_RATE), inside, baseline)
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
    swap_out = _compare(timeline, catalogue.name_of(catalogue.SWAPPED_OUT_RATE), inside, baseline)
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


def _gpu_throttled_time(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
    """The driver's own count of the time each reason held the clocks down: a burst
    between samples counts, which the sampled bitmask misses."""
    reasons = []
    for device in _gpus(timeline):
        for part, _, cause in catalogue.THROTTLE_REASONS:
            held = _compare(timeline, _throttle_share(device, part), inside, baseline)
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


def _gpu_throttled(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
    """The sampled bitmask's flags, for a device whose driver counts no throttle time."""
    reasons = []
    for device in _gpus(timeline):
        if any(
            timeline.column(_throttle_share(device, part)) is not None
            for part, _, _ in catalogue.THROTTLE_REASONS
        ):
            continue
        for signal, why in _THROTTLES:
            name = catalogue.name_of(signal, device)
            column = timeline.column(name)
            if column is None:
                continue
            share, typical = _share(column, inside), _share(column, baseline)
            if share >= 0.5 and share - typical >= 0.3:
                text = (
                    f"GPU {device} was {why}-throttled in {share:.0%} of the stretch's samples "
                    f"(typically {typical:.0%})"
                )
                reasons.append(
                    Reason(f"gpu_{why}_throttle", text, (Evidence(name, share, typical),), share / 0.5)
                )
    return reasons


def _share(column: Floats, mask: Mask) -> float:
    values = column[mask]
    values = values[np.isfinite(values)]
    return float(np.mean(values > 0)) if len(values) else 0.0


def _gpu_idle(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
    """A GPU that waited for work: its SMs' activity (GPM) where recorded, which reads low
    while a kernel waits in a collective, else NVML's utilization, which reads 100% then."""
    reasons = []
    for device in _gpus(timeline):
        names = (
            catalogue.name_of(catalogue.GPU_SM_ACTIVITY, device),
            catalogue.name_of(catalogue.GPU_UTILIZATION, device),
        )
        util = _first(timeline, names, inside, baseline)
        what = "its SMs were" if util is not None and util.name == names[0] else "it was"
        if util is not None and util.typical - util.stretch >= 20:
            text = (
                f"GPU {device}: {what} busy {util.stretch:.0f}% of the time (typically {util.typical:.0f}%)"
            )
            evidence = [util.evidence]
            power = _compare(timeline, catalogue.name_of(catalogue.GPU_ENERGY_RATE, device), inside, baseline)
            if power is not None and power.stretch < power.typical:  # the energy counter agrees
                text += f", drawing {power.stretch:.0f} W (typically {power.typical:.0f} W)"
                evidence.append(power.evidence)
            strength = (util.typical - util.stretch) / 20 * 0.5
            reasons.append(Reason("gpu_waiting", text + ": it waited for work", tuple(evidence), strength))
    return reasons


RULES: tuple[Rule, ...] = (
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


def reasons(timeline: Timeline, findings: Findings, stretch: Stretch) -> list[Reason]:
    """What the signals say of a slow ``stretch``, strongest first; empty when nothing stood out."""
    inside = np.zeros(len(timeline), dtype=bool)
    inside[stretch.first : stretch.last + 1] = True
    return against(timeline, inside, findings.regular)


def against(timeline: Timeline, inside: Mask, baseline: Mask) -> list[Reason]:
    """What every rule says of the records ``inside`` compared with the ``baseline`` records
    (a slow stretch against the run's regular windows, or a lagging rank against the other
    ranks at the same time), strongest first."""
    found = [reason for rule in RULES for reason in rule(timeline, inside, baseline)]
    return sorted(found, key=lambda reason: -reason.strength)
