"""Which panels a plot draws: one per quantity, chosen and titled from ``sampler.catalogue``.

The run's own training signals (every name that is not ``resource/...``) come first, then those
derived from its steps (throughput, step time, phases), then the resource panels grouped by
category in the catalogue's order, one panel per quantity, titled and
with its unit as the catalogue says. A gpu panel holds one signal per device. A reading's peak
and mean between logged steps (``..._peak``, ``..._mean``) go into its panel, and a counter's own
``..._per_second`` rate is left out where the counter is drawn. Counters (disk reads/writes and
network bytes since boot, container CPU throttled) are drawn as rates (MiB/s, s/s); a counter
whose rate is a gauge of its own (CPU seconds, whose rate is the CPU %) is left out where that
gauge is drawn. Bytes are drawn in GiB, bytes/s in MiB/s, until ``fitted`` finds
the unit a panel's values read in.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field

from sampler import catalogue

TRAINING = "training"
"""The category of the run's own signals' panels."""
LOOP = (TRAINING, *catalogue.DERIVED_CATEGORIES)
"""The categories drawn first, apart from the machine's: the run's own signals and those derived
from its steps (throughput, step time, where each step's time went)."""
_DRAWN_AS = {
    "bytes": ("GiB", 1.0 / catalogue.GIB),  # GPU memory: bytes are unreadable at 10^10
    "bytes/s": ("MiB/s", 1.0 / catalogue.MIB),
}
"""Units drawn in another: the unit drawn and the factor from the stored one."""
BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
"""Sizes 1024 apart, each also per second: a panel drawn in one is redrawn in the one its
values read best in (``fitted``)."""


def fitted(unit: str, peak: float) -> tuple[str, float]:
    """The unit among ``BINARY_UNITS`` (per second when ``unit`` is) in which ``peak``, drawn
    in ``unit``, is from 1 to 1023, and the factor from ``unit`` to it (``MiB/s`` at 0.00035:
    ``B/s``, factor 1048576); ``unit`` itself, factor 1, for any other unit or no peak above 0."""
    size, _, per = unit.partition("/")
    if size not in BINARY_UNITS or per not in ("", "s") or not peak > 0 or peak != peak:
        return unit, 1.0
    index = BINARY_UNITS.index(size)
    value = peak
    while value < 1 and index > 0:
        value, index = value * 1024, index - 1
    while value >= 1024 and index < len(BINARY_UNITS) - 1:
        value, index = value / 1024, index + 1
    factor = 1024.0 ** (BINARY_UNITS.index(size) - index)
    return BINARY_UNITS[index] + unit[len(size) :], factor


def matches(name: str, pattern: str | None) -> bool:
    """Whether signal ``name`` is selected by ``pattern``: every name when None;
    an fnmatch glob over the whole name when the pattern has ``*``, ``?`` or ``[``
    (``resource/gpu/*``, ``*loss``; ``*`` also crosses ``/``), else a substring
    (``loss``, ``gpu/0/``). Case-sensitive."""
    if pattern is None:
        return True
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


@dataclass
class Panel:
    """One panel: the signals it draws (one per GPU device for gpu), how."""

    key: str
    """``train/loss``, ``resource/disk/read_mb``, or ``resource/gpu/*/power_watts``."""
    category: str
    """``training`` or the resource category."""
    title: str
    unit: str
    scale: float = 1.0
    """Drawn unit per stored unit."""
    rate: bool = False
    """A cumulative counter, drawn as its rate (unit per second)."""
    names: dict[str, str] = field(default_factory=dict)
    """Device (``""`` outside gpu) -> signal name."""
    variants: dict[tuple[str, str], str] = field(default_factory=dict)
    """(device, ``peak`` or ``mean``) -> the name of that reading's peak or mean between steps."""
    rank: int = len(catalogue.RANKS)
    """Its place within its category (the catalogue's order; unknown signals last)."""
    parts: tuple[str, ...] = ()
    """Shares of one whole drawn stacked, bottom first: then ``names`` is part -> signal name."""


def panels(names: Sequence[str]) -> list[Panel]:
    """The panels that draw ``names``, in drawing order: training signals, the categories derived
    from the steps (``LOOP``), then the other resource categories (``catalogue.CATEGORIES``, then
    any unknown ones)."""
    training: list[Panel] = []
    resources: dict[str, dict[str, Panel]] = {}
    present = set(names)
    variants: list[tuple[str, str, str]] = []
    for name in sorted(present):
        reading = catalogue.lookup(name)
        if reading is not None:
            if reading.variant and name.removesuffix("_" + reading.variant) in present:
                variants.append((name.removesuffix("_" + reading.variant), reading.variant, name))
                continue
            if catalogue.shown_by_another(name, present):
                continue  # a counter's rate, drawn as the counter's panel or as a gauge's
        parts = name.removeprefix(catalogue.PREFIX).split("/")
        if not name.startswith(catalogue.PREFIX) or len(parts) < 2:
            training.append(Panel(name, TRAINING, name, "", names={"": name}))
            continue
        category = parts[0]
        device = parts[1] if name.startswith(catalogue.GPU_NAME_PREFIX) and len(parts) >= 3 else ""
        signal = "/".join(parts[2:] if device else parts[1:])
        key = f"{catalogue.GPU_NAME_PREFIX}*/{signal}" if device else name
        panel = resources.setdefault(category, {}).get(key)
        if panel is None:
            panel = _resource_panel(key, category, signal, reading)
            resources[category][key] = panel
        panel.names[device] = name
    by_name = {name: (panel, device) for group in resources.values() for panel in group.values()
               for device, name in panel.names.items()}  # fmt: skip
    for base, kind, name in variants:
        if base in by_name:
            panel, device = by_name[base]
            panel.variants[device, kind] = name
    known = [*LOOP[1:], *(c for c in catalogue.CATEGORIES if c not in LOOP)]
    order = [c for c in known if c in resources] + sorted(set(resources) - set(known))
    result = list(training)
    for category in order:
        result += sorted(resources[category].values(), key=lambda p: (p.rank, p.key))
    return result


def _resource_panel(key: str, category: str, signal: str, reading: catalogue.Reading | None) -> Panel:
    """The panel of ``key``: as the catalogue says, a counter as its rate; a signal it does
    not know (a newer version's) titled by its name, without a unit."""
    if reading is None:
        return Panel(key, category, f"{category} {signal.replace('_', ' ')}", "")
    known = reading.signal
    rate = known.kind == catalogue.COUNTER
    per_second = catalogue.rate_of(known)  # its unit: J/s is W
    unit = (per_second.unit if per_second else known.unit + "/s") if rate else known.unit
    unit, scale = _DRAWN_AS.get(unit, (unit, 1.0))
    title = f"{known.title} ({reading.variant})" if reading.variant else known.title
    return Panel(key, category, title, unit, scale, rate=rate, rank=catalogue.RANKS[known.key])


PHASES_KEY = catalogue.PHASE_SHARES[0].name.replace(catalogue.STEP_PHASES[0][0], "*", 1)
"""The key of the panel that stacks the step's phases."""


def stack_phases(chosen: list[Panel]) -> list[Panel]:
    """``chosen`` with the panels of the step's phase shares (``catalogue.PHASE_SHARES``) made one,
    where the first of them was, that stacks them: where each step's time went."""
    labels = {
        s.name: label for s, (_, label, _) in zip(catalogue.PHASE_SHARES, catalogue.STEP_PHASES, strict=True)
    }
    shares = [p for p in chosen if p.key in labels and not p.variants]
    if len(shares) < 2:
        return chosen
    stacked = Panel(PHASES_KEY, shares[0].category, "where each step's time went", "%", rank=shares[0].rank)
    stacked.names = {labels[p.key]: p.key for p in sorted(shares, key=lambda p: p.rank)}
    stacked.parts = tuple(stacked.names)
    at = chosen.index(shares[0])
    rest = [p for p in chosen if p not in shares]
    return [*rest[:at], stacked, *rest[at:]]
