"""A launch's ranks side by side: their signals on one step grid, their throughput on one time
grid, and the ranks that fell behind the others.

Ranks sample at moments of their own and log at different steps, so each rank's records are
interpolated onto grids the launch shares (:func:`gather`). Signals go on a grid of steps (for
drawing a signal's spread across ranks per step): from the lowest step any rank recorded to the
highest, every step or ``MAX_GRID`` points evenly apart; a rank has a value at a grid step only
within its own first and last recorded steps, on the straight line between its two records around
it, and a break in its line (a NaN) stays a break. Throughput goes on a grid of wall times (ranks
that do not wait for each other pass the same step at very different times, and falling behind is
making fewer steps in the same time): ``MAX_GRID`` times evenly apart from the first record any
rank made to the last; each rank's step is interpolated at them, within its own records' times, and
its throughput over each interval is the steps it made then over the interval's seconds (its own
window's throughput where the interval lies inside one window). A rank whose step went back (its
model restarted at age 0) keeps only the records whose step passed every earlier one.

A rank lags over a time interval where at least two ranks have a throughput there and its own is
below a share (``--slow``, 0.6) of their median; lagging intervals in a row (one interval between
them does not break them) make a :class:`Lag` once they cover ``stretches.MIN_INTERVALS`` of the
rank's sampling intervals and ``stretches.MIN_SECONDS``. Its reasons are the ``evidence`` rules
applied to its records then against the other ranks' records over the same time (a signal only
one rank per host samples compares only where both sides have it; each rank's GPUs are compared
by role, its k-th GPU against the other ranks' k-th, as each rank samples its own device under
its own index).

In synchronous data-parallel training every rank steps at the slowest one's pace, so no rank
lags; the rank that holds the others back is told by the phases of its steps (``watch_model``'s
``resource/progress/...`` signals). Each rank's seconds per step in input, forward and backward
(share times step time) go on the time grid; a rank holds the others back over a grid interval where
its input and forward take ``CULPRIT_SHARE`` of the median rank's step time or more longer than
the median rank's, and its backward (which holds the wait for the gradients' collective) that
much less: it arrives at the collective last and waits least, while the others wait for it.
Intervals in a row make a :class:`Culprit` as lagging ones make a lag, rechecked over the whole
span once bridged; its phase is whichever of input and forward ran longer than the median rank's
by more, and its reasons are the evidence rules on its records against the other ranks' then.
Intervals where a rank held the others back that no culprit covers are :func:`fleeting`: where the
holder moves between ranks, or one rank holds the others back in spells too short to name, their
seconds are said rather than one rank named. A rank that did not time its steps (no
``watch_model(module)`` there) is untimed: it cannot be told whether it held the others back.

A rank :func:`stopped` where its records pause (or end) for as long as ``stretches`` takes a pause
to last while another rank stood at a later step: in synchronous training the others ran one
forward further and wait for it at the collective, so the rank behind is the one stuck; ranks that
pause together (an evaluation, a checkpoint) stand at one step, and a rank whose run ended with
its records did not stop.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from sampler import catalogue
from sampler.analysis import evidence, stretches, timeline
from sampler.analysis.evidence import Mask, Reason
from sampler.analysis.explain import json_number
from sampler.analysis.timeline import Floats, Timeline
from sampler.store.reader import Launch, Run, StoreReader
from sampler.util.quoting import printable

MAX_GRID = 2000
"""Grid steps at most: finer than a rank's records in most runs (its throughput is then exactly
its windows'), and a launch of a million steps is still drawn and judged in milliseconds."""

CULPRIT_SHARE = 0.2
"""A rank holds the others back where its input and forward run longer, and its backward
shorter, than the median rank's by this share of the median rank's step time or more."""
INPUT, FORWARD, BACKWARD = "input", "forward", "backward"
"""The phases (``catalogue.STEP_PHASES``) that tell which rank holds the others back."""
_SHARES = {
    phase: catalogue.name_of(signal)
    for (phase, _, _), signal in zip(catalogue.STEP_PHASES, catalogue.PHASE_SHARES, strict=True)
}
_STEP_SECONDS = catalogue.name_of(catalogue.STEP_SECONDS)


@dataclass(frozen=True)
class Rank:
    """One rank's run of a launch, on the launch's time grid."""

    run: Run
    repeated: bool
    """The store holds several runs of this rank (it was restarted)."""
    records: Timeline
    """Its records' steps and times, in time order, each at a step past every earlier one,
    without their signals' values (``timeline``)."""
    steps: Floats
    """Its step at each time of the grid (NaN outside its records' times)."""
    throughput: Floats
    """Its steps/s over the grid interval that ends at each time (NaN at the first time and
    outside its records' times)."""

    reader: StoreReader
    """The store it was read from."""

    @cached_property
    def timeline(self) -> Timeline:
        """Its records with every signal's values, read from the store when first needed (the
        evidence of a lag): a launch's ranks are not all held in memory to draw or compare them."""
        return _rising(timeline.load(self.reader, self.run))

    @cached_property
    def phases(self) -> Timeline:
        """Its records with only the step time and the phases' shares (``watch_model``'s); none
        read where no run in the store timed its steps."""
        if _STEP_SECONDS not in self.reader.columns():
            return Timeline(self.records.steps, self.records.walls, {}, self.records.interval)
        return _rising(timeline.load(self.reader, self.run, [_STEP_SECONDS, *_SHARES.values()]))

    @property
    def label(self) -> str:
        """``rank 2``, or ``rank 2 (run 7)`` for one of several runs of that rank."""
        return f"rank {self.run.rank}" + (f" (run {self.run.id})" if self.repeated else "")

    @property
    def named(self) -> str:
        """``rank 2 (run 7)`` always: where text names the run beside the rank."""
        return f"rank {self.run.rank} (run {self.run.id})"

    @property
    def typical(self) -> float:
        """Its median throughput over the grid, steps/s (NaN without one)."""
        finite = self.throughput[np.isfinite(self.throughput)]
        return float(np.median(finite)) if len(finite) else math.nan


@dataclass(frozen=True)
class Ranks:
    """A launch's ranks on one step grid and one time grid."""

    launch: Launch
    steps: Floats
    """The steps signals are interpolated at, rising (empty without two ranks with records)."""
    times: Floats
    """The wall times steps are interpolated at, s since the epoch, rising (empty likewise)."""
    ranks: list[Rank]
    """The runs with at least two records, by rank."""
    silent: list[Run]
    """The runs with fewer than two records: no throughput, nothing to draw."""
    median: Floats
    """The median across ranks of the throughput over each time interval, steps/s (NaN where
    fewer than two ranks have one)."""


@dataclass(frozen=True)
class Lag:
    """Where one rank fell behind the others."""

    rank: Rank
    start_step: int
    end_step: int
    """That rank's steps when the lag began and ended."""
    start_wall: float
    end_wall: float
    """When it began and ended, s since the epoch."""
    throughput: float
    """That rank's steps/s over it."""
    median: float
    """The ranks' median steps/s over it (the mean of its intervals' medians)."""
    reasons: list[Reason]
    """What its signals then show against the other ranks', strongest first."""

    @property
    def seconds(self) -> float:
        return self.end_wall - self.start_wall

    @property
    def behind(self) -> float:
        """Steps/s below the median."""
        return self.median - self.throughput

    @property
    def share_behind(self) -> float:
        """The share of the median it fell short by (0.4: 40% slower)."""
        return self.behind / self.median


@dataclass(frozen=True)
class Culprit:
    """Where one rank held the others back: its input or forward ran longer than theirs, and
    they waited for it in the gradients' collective (their backward)."""

    rank: Rank
    phase: str
    """``INPUT`` or ``FORWARD``: the one it spent longer in than the other ranks, by more."""
    start_step: int
    end_step: int
    """Its steps when it began and ended."""
    start_wall: float
    end_wall: float
    """When it began and ended, s since the epoch."""
    step_seconds: float
    """The median rank's step time over it, s."""
    shares: dict[str, float]
    """Its mean share of the step in input, forward and backward over it, %."""
    others: dict[str, float]
    """The other ranks' median shares then, %."""
    others_typical_backward: float
    """The other ranks' median backward share where no rank held the others back, % (NaN
    without such a time)."""
    reasons: list[Reason]
    """What its signals then show against the other ranks', strongest first."""
    machine: list[Reading]
    """Its ``MACHINE`` signals then against the other ranks'."""

    @property
    def seconds(self) -> float:
        return self.end_wall - self.start_wall

    def as_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank.run.rank,
            "run": self.rank.run.id,
            "phase": self.phase,
            "first_step": self.start_step,
            "last_step": self.end_step,
            "start": self.start_wall,
            "end": self.end_wall,
            "seconds": self.seconds,
            "seconds_per_step": self.step_seconds,
            "percent": self.shares,
            "others_percent": self.others,
            "others_typical_backward_percent": json_number(self.others_typical_backward),
            "reasons": [asdict(reason) for reason in self.reasons],
            "machine": [asdict(reading) for reading in self.machine],
        }


@dataclass(frozen=True)
class Stop:
    """Where one rank stopped stepping while another stood at a later step."""

    rank: Rank
    step: int
    """Its step when it stopped."""
    start_wall: float
    """Its last record before it stopped, s since the epoch."""
    end_wall: float | None
    """Its next record, s since the epoch; None where its records end there."""
    others_step: int
    """The furthest other rank's step once it had stood still that long."""
    others_went_on: bool
    """Another rank made steps past ``others_step`` before it stepped again."""
    silent: bool = False
    """Its monitor wrote nothing more, and never ended its run: its process died, or hung
    holding the interpreter."""

    def as_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank.run.rank,
            "run": self.rank.run.id,
            "step": self.step,
            "start": self.start_wall,
            "end": self.end_wall,
            "others_step": self.others_step,
            "others_went_on": self.others_went_on,
            "silent": self.silent,
        }


@dataclass(frozen=True)
class Comparison:
    """Each rank's throughput against the launch's median, the lags found, and the ranks that
    held the others back."""

    ranks: Ranks
    lags: list[Lag]
    culprits: list[Culprit]
    timed: bool
    """At least two ranks recorded their steps' phases (``watch_model``)."""
    untimed: list[Rank]
    """The ranks that recorded no step phases, where another rank did."""
    fleeting: list[tuple[Rank, float]]
    """Per rank, the seconds it held the others back outside every culprit (:func:`fleeting`)."""
    stops: list[Stop]

    @property
    def fleeting_seconds(self) -> float:
        """The seconds some rank held the others back outside every culprit."""
        return sum(seconds for _, seconds in self.fleeting)

    def as_json(self) -> dict[str, Any]:
        """The comparison as plain JSON types."""
        return {
            "launch": self.ranks.launch.id,
            "world_size": self.ranks.launch.world_size,
            "ranks": [
                {"rank": r.run.rank, "run": r.run.id, "typical_steps_per_second": json_number(r.typical)}
                for r in self.ranks.ranks
            ],
            "silent_runs": [run.id for run in self.ranks.silent],
            "lags": [
                {
                    "rank": lag.rank.run.rank,
                    "run": lag.rank.run.id,
                    "first_step": lag.start_step,
                    "last_step": lag.end_step,
                    "start": lag.start_wall,
                    "end": lag.end_wall,
                    "seconds": lag.seconds,
                    "steps_per_second": lag.throughput,
                    "median_steps_per_second": lag.median,
                    "behind_steps_per_second": lag.behind,
                    "share_behind": lag.share_behind,
                    "reasons": [asdict(reason) for reason in lag.reasons],
                }
                for lag in self.lags
            ],
            "phases_timed": self.timed,
            "untimed_ranks": [{"rank": r.run.rank, "run": r.run.id} for r in self.untimed],
            "culprits": [culprit.as_json() for culprit in self.culprits],
            "fleeting_seconds": self.fleeting_seconds,
            "fleeting": [{"rank": r.run.rank, "run": r.run.id, "seconds": s} for r, s in self.fleeting],
            "stops": [stop.as_json() for stop in self.stops],
        }


def rising(steps: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Which of ``steps`` (in time order) pass every step before them."""
    values = np.asarray(steps, dtype=np.float64)
    before = np.maximum.accumulate(np.concatenate(([-np.inf], values[:-1])))
    return values > before


def on_grid(grid: Floats, xs: npt.ArrayLike, values: npt.ArrayLike) -> Floats:
    """``values`` at the positions ``xs`` (steps or times, in time order) interpolated at the
    ``grid``'s: NaN outside ``xs``, and on either side of a NaN value (a break stays a break)."""
    at, ys = np.asarray(xs, dtype=np.float64), np.asarray(values, dtype=np.float64)
    keep = rising(at)
    at, ys = at[keep], ys[keep]
    if not len(at):
        return np.full(len(grid), np.nan)
    out = np.interp(grid, at, ys)
    out[(grid < at[0]) | (grid > at[-1])] = np.nan
    return out


def several(reader: StoreReader, prefix: str, verb: str) -> Launch:
    """The launch ``prefix`` names (``StoreReader.launch``), which must hold two ranks or more:
    ``LookupError`` for a launch of one rank, saying to ``verb`` it with ``--run`` instead."""
    launch = reader.launch(prefix)
    if launch.ranks < 2:
        runs = " --run ".join(str(run.id) for run in launch.runs)
        raise LookupError(
            f"launch {printable(launch.id)} has {launch.held} in {reader.path}: no other rank to"
            f" compare it with; {verb} it with --run {runs}"
        )
    return launch


def gather(reader: StoreReader, launch: Launch) -> Ranks:
    """Every run of ``launch``, read from the store and put on the launch's grids."""
    loaded = [(run, _rising(timeline.load(reader, run, names=()))) for run in launch.runs]
    recorded = [(run, line) for run, line in loaded if len(line) >= 2]
    silent = [run for run, line in loaded if len(line) < 2]
    if len(recorded) < 2:
        none = np.array([])
        return Ranks(
            launch,
            none,
            none,
            [_rank(reader, launch, run, line, none) for run, line in recorded],
            silent,
            none,
        )
    lines = [line for _, line in recorded]
    low = min(float(line.steps[0]) for line in lines)
    high = max(float(line.steps[-1]) for line in lines)
    steps = np.linspace(low, high, max(2, min(MAX_GRID, int(high - low) + 1)))
    times = np.linspace(min(line.walls[0] for line in lines), max(line.walls[-1] for line in lines), MAX_GRID)
    ranks = [_rank(reader, launch, run, line, times) for run, line in recorded]
    rates = np.vstack([rank.throughput for rank in ranks])
    counted = np.isfinite(rates).sum(axis=0) >= 2
    median = np.full(len(times), np.nan)
    median[counted] = np.nanmedian(rates[:, counted], axis=0)
    return Ranks(launch, steps, times, ranks, silent, median)


def _rank(reader: StoreReader, launch: Launch, run: Run, line: Timeline, times: Floats) -> Rank:
    steps = on_grid(times, line.walls, line.steps)
    with np.errstate(invalid="ignore", divide="ignore"):  # every record at one instant: no rate
        rate = np.concatenate(([np.nan], np.diff(steps) / np.diff(times)))[: len(times)]
    rate[~np.isfinite(rate)] = np.nan
    repeated = sum(other.rank == run.rank for other in launch.runs) > 1
    return Rank(run, repeated, line, steps, rate, reader)


def _rising(line: Timeline) -> Timeline:
    keep = rising(line.steps)
    if keep.all():
        return line
    values = {name: column[keep] for name, column in line.values.items()}
    return Timeline(line.steps[keep], line.walls[keep], values, line.interval)


def compare(ranks: Ranks, share: float = stretches.SLOW_FRACTION) -> Comparison:
    """Each rank's lags below ``share`` of the launch's median throughput, in rank and time order."""
    lags = []
    for rank in ranks.ranks:
        behind = np.zeros(len(ranks.times), dtype=bool)
        known = np.isfinite(rank.throughput) & np.isfinite(ranks.median)
        behind[known] = rank.throughput[known] < share * ranks.median[known]
        least = max(stretches.MIN_INTERVALS * rank.run.interval, stretches.MIN_SECONDS)
        for first, last in stretches.spans(behind, np.zeros_like(behind)):
            start, end = first - 1, last  # interval i runs from grid time i - 1 to grid time i
            if ranks.times[end] - ranks.times[start] < least:
                continue
            lag = _lag(ranks, rank, start, end)
            if lag.throughput < share * lag.median:  # still, with the intervals bridged
                lags.append(lag)
    grid = phase_grid(ranks)
    found = culprits(ranks, grid)
    return Comparison(
        ranks,
        lags,
        [_explained(ranks, culprit) for culprit in found],
        grid is not None,
        untimed(ranks),
        fleeting(ranks, grid, found) if grid is not None else [],
        stopped(ranks),
    )


def untimed(ranks: Ranks) -> list[Rank]:
    """The ranks that recorded no step phases, where another rank did (empty where none did)."""
    timed = [_timed(rank) for rank in ranks.ranks]
    return [rank for rank, its in zip(ranks.ranks, timed, strict=True) if not its] if any(timed) else []


def _timed(rank: Rank) -> bool:
    """``rank`` recorded a step time (``watch_model(module)`` timed its steps)."""
    column = rank.phases.column(_STEP_SECONDS)
    return column is not None and bool(np.isfinite(column).any())


@dataclass(frozen=True)
class PhaseGrid:
    """The ranks' phases on the time grid: per phase, one row per rank of its seconds per step,
    and the medians across ranks (NaN where fewer than two ranks have one)."""

    seconds: dict[str, Floats]
    shares: dict[str, Floats]
    median: dict[str, Floats]
    step: Floats
    """The median rank's step time, s."""


def phase_grid(ranks: Ranks) -> PhaseGrid | None:
    """The ranks' phases on the time grid; None where fewer than two ranks recorded any."""
    times = ranks.times
    shares: dict[str, list[Floats]] = {phase: [] for phase in (INPUT, FORWARD, BACKWARD)}
    steps = []
    for rank in ranks.ranks:
        line = rank.phases
        step = line.column(_STEP_SECONDS)
        steps.append(on_grid(times, line.walls, step) if step is not None else np.full(len(times), np.nan))
        for phase, rows in shares.items():
            column = line.column(_SHARES[phase])
            rows.append(
                on_grid(times, line.walls, column) if column is not None else np.full(len(times), np.nan)
            )
    step_rows = np.vstack(steps) if steps else np.empty((0, len(times)))
    if not len(times) or (np.isfinite(step_rows).any(axis=1).sum() < 2):
        return None
    share_rows = {phase: np.vstack(rows) for phase, rows in shares.items()}
    seconds = {phase: rows / 100 * step_rows for phase, rows in share_rows.items()}
    seconds["busy"] = seconds[INPUT] + seconds[FORWARD]
    median = {phase: _across(rows) for phase, rows in seconds.items()}
    return PhaseGrid(seconds, share_rows, median, _across(step_rows))


def _across(rows: Floats) -> Floats:
    """Per grid time (column): the median of the finite values, NaN where fewer than two are."""
    out = np.full(rows.shape[1], np.nan)
    counted = np.isfinite(rows).sum(axis=0) >= 2
    out[counted] = np.nanmedian(rows[:, counted], axis=0)
    return out


def culprits(ranks: Ranks, grid: PhaseGrid | None = None) -> list[Culprit]:
    """The ranks that held the others back, and where (see the module), in rank and time order;
    without their reasons (:func:`compare` adds them); empty where fewer than two ranks timed their steps."""
    grid = grid if grid is not None else phase_grid(ranks)
    if grid is None:
        return []
    holding = _holding(grid)
    quiet = np.asarray(~holding.any(axis=0), dtype=bool)
    found = []
    for i, rank in enumerate(ranks.ranks):
        least = max(stretches.MIN_INTERVALS * rank.run.interval, stretches.MIN_SECONDS)
        for first, last in stretches.spans(holding[i], np.zeros(len(ranks.times), dtype=bool)):
            start, end = first - 1, last
            if start < 0 or ranks.times[end] - ranks.times[start] < least:
                continue
            span = slice(first, last + 1)

            def over(phase: str, i: int = i, span: slice = span) -> float:
                """How much longer rank i ran ``phase`` than the median rank, s per step."""
                return float(np.nanmean(grid.seconds[phase][i, span] - grid.median[phase][span]))

            step = float(np.nanmean(grid.step[span]))
            if not (over("busy") > CULPRIT_SHARE * step and -over(BACKWARD) > CULPRIT_SHARE * step):
                continue  # not once the intervals between are bridged
            others = [k for k in range(len(ranks.ranks)) if k != i]

            def their(phase: str, where: slice | npt.NDArray[np.bool_], others: list[int] = others) -> float:
                rows = grid.shares[phase][others][:, where]
                rows = rows[:, np.isfinite(rows).any(axis=0)]
                return float(np.mean(np.nanmedian(rows, axis=0))) if rows.size else math.nan

            found.append(
                Culprit(
                    rank,
                    INPUT if over(INPUT) >= over(FORWARD) else FORWARD,
                    round(rank.steps[start]),
                    round(rank.steps[end]),
                    float(ranks.times[start]),
                    float(ranks.times[end]),
                    step,
                    {phase: float(np.nanmean(grid.shares[phase][i, span])) for phase in grid.shares},
                    {phase: their(phase, span) for phase in grid.shares},
                    their(BACKWARD, quiet),
                    [],
                    [],
                )
            )
    return found


def _holding(grid: PhaseGrid) -> npt.NDArray[np.bool_]:
    """Per rank (row) and grid time: it held the others back over the interval ending then."""
    margin = CULPRIT_SHARE * grid.step
    with np.errstate(invalid="ignore"):
        return np.asarray(
            (grid.seconds["busy"] - grid.median["busy"] > margin)
            & (grid.median[BACKWARD] - grid.seconds[BACKWARD] > margin),
            dtype=bool,
        )


def fleeting(ranks: Ranks, grid: PhaseGrid, found: list[Culprit]) -> list[tuple[Rank, float]]:
    """Per rank, the seconds it held the others back outside every one of ``found``, where
    those seconds, over every rank, add up to as long as a culprit must last (rank order)."""
    times = ranks.times
    covered = np.zeros(len(times), dtype=bool)
    for culprit in found:
        covered |= (times > culprit.start_wall) & (times <= culprit.end_wall)
    lengths = np.concatenate(([0.0], np.diff(times)))  # interval i ends at grid time i
    loose = _holding(grid) & ~covered
    least = max(
        stretches.MIN_INTERVALS * max(rank.run.interval for rank in ranks.ranks), stretches.MIN_SECONDS
    )
    if float(lengths[loose.any(axis=0)].sum()) < least:
        return []
    return [
        (rank, float(lengths[row].sum())) for rank, row in zip(ranks.ranks, loose, strict=True) if row.any()
    ]


def stopped(ranks: Ranks) -> list[Stop]:
    """Where each rank stopped while another rank stood at a later step (see the module), in
    rank and time order: a pause of its records only where the others stood still too (ranks
    that step on their own pause on their own), the end of its records whether they did or not."""
    found = []
    end = max((_alive_until(rank.run) for rank in ranks.ranks), default=math.nan)
    late = max((rank.run.interval for rank in ranks.ranks), default=0.0)
    """A record comes up to one interval after its step: the others' steps are compared this
    long before the rank's next record."""
    for rank in ranks.ranks:
        walls, steps = rank.records.walls, rank.records.steps
        typical = rank.typical
        least = max(
            stretches.PAUSE_INTERVALS * rank.run.interval,
            stretches.PAUSE_STEPS / typical if typical > 0 else 0.0,
            stretches.PAUSE_MIN_SECONDS,
        )
        pauses: list[tuple[int, float | None, bool]] = [
            (int(k), float(walls[k + 1]), False) for k in np.flatnonzero(np.diff(walls) >= least)
        ]
        replaced = any(
            other.run.rank == rank.run.rank and other.run.id > rank.run.id for other in ranks.ranks
        )
        alive = _alive_until(rank.run)
        silent = rank.run.ended_at is None and end - alive >= least  # died, or hung holding the GIL
        if not replaced and (alive - walls[-1] >= least or silent):
            pauses.append((len(walls) - 1, None, silent))
        others = [other for other in ranks.ranks if other.run.rank != rank.run.rank]
        for k, resumed, quiet in pauses:
            start, step = float(walls[k]), float(steps[k])
            ahead = max((_step_at(other, start + least) for other in others), default=math.nan)
            until = max(start + least, (resumed if resumed is not None else end) - late)
            went_on = max(_step_at(other, until) for other in others) > ahead if others else False
            if ahead > step and (resumed is None or not went_on):
                found.append(Stop(rank, round(step), start, resumed, round(ahead), went_on, quiet))
    return found


def _alive_until(run: Run) -> float:
    """When ``run``'s monitor last wrote its store, on its records' clock, s since the epoch
    (the backend logs no record while the step stands still, but goes on writing)."""
    if run.elapsed is not None:
        return run.started_at + run.elapsed
    return run.ended_at if run.ended_at is not None else run.updated_at


def _step_at(rank: Rank, wall: float) -> float:
    """``rank``'s step at its last record at or before ``wall`` (-inf before its first)."""
    k = int(np.searchsorted(rank.records.walls, wall, side="right"))
    return float(rank.records.steps[k - 1]) if k else -math.inf


def _explained(ranks: Ranks, culprit: Culprit) -> Culprit:
    """``culprit`` with its reasons and what its machine showed."""
    joined, mine, theirs = _against(ranks, culprit.rank, culprit.start_wall, culprit.end_wall)
    found = evidence.against(joined, mine, theirs)
    return Culprit(**{**vars(culprit), "reasons": found, "machine": _machine(joined, mine, theirs)})


def _lag(ranks: Ranks, rank: Rank, start: int, end: int) -> Lag:
    """``rank``'s lag from grid time ``start`` to ``end``."""
    seconds = ranks.times[end] - ranks.times[start]
    median = ranks.median[start + 1 : end + 1]  # the intervals are equally long: their mean is the span's
    start_wall, end_wall = float(ranks.times[start]), float(ranks.times[end])
    return Lag(
        rank,
        round(rank.steps[start]),
        round(rank.steps[end]),
        start_wall,
        end_wall,
        float((rank.steps[end] - rank.steps[start]) / seconds),
        float(np.nanmean(median)),
        _reasons(ranks, rank, start_wall, end_wall),
    )


def _reasons(ranks: Ranks, rank: Rank, start: float, end: float) -> list[Reason]:
    """The evidence rules on ``rank``'s records between ``start`` and ``end`` (wall time) against
    the other ranks' records then, their GPUs named as ``rank``'s (:func:`by_role`)."""
    return evidence.against(*_against(ranks, rank, start, end))


def _against(ranks: Ranks, rank: Rank, start: float, end: float) -> tuple[Timeline, Mask, Mask]:
    """Every rank's records in one timeline, the other ranks' GPUs named as ``rank``'s: (it,
    ``rank``'s records between ``start`` and ``end``, the other ranks' records then)."""
    own = _devices(rank.timeline)
    parts = [rank.timeline, *(by_role(other.timeline, own) for other in ranks.ranks if other is not rank)]
    joined = timeline.joined(parts, rank.run.interval)
    during = (joined.walls > start) & (joined.walls <= end)
    mine = np.zeros(len(joined), dtype=bool)
    mine[: len(rank.timeline)] = True
    return joined, during & mine, during & ~mine


MACHINE = (catalogue.PROCESS_CPU, catalogue.TREE_CPU, catalogue.PROCESS_CPU_WAIT, catalogue.GPU_UTILIZATION)
"""What a rank that held the others back shows of its machine beside the rules' reasons, each
against the other ranks at the same time: its own CPU, with its DataLoader workers', the time its
threads waited for a CPU, and its GPUs' utilization."""


@dataclass(frozen=True)
class Reading:
    """One of a rank's signals over a span, and the other ranks' then (medians)."""

    signal: str
    title: str
    unit: str
    own: float
    others: float


def _machine(joined: Timeline, mine: Mask, theirs: Mask) -> list[Reading]:
    """The ``MACHINE`` signals ``mine`` and ``theirs`` both have values of."""
    found = []
    devices = sorted(
        {reading.device for name in joined.values if (reading := catalogue.lookup(name)) and reading.device},
        key=catalogue.device_order,
    )
    for signal in MACHINE:
        for device in devices if catalogue.DEVICE in signal.key else [""]:
            name = catalogue.name_of(signal, device)
            column = joined.column(name)
            if column is None:
                continue
            own, others = column[mine], column[theirs]
            own, others = own[np.isfinite(own)], others[np.isfinite(others)]
            if len(own) and len(others):
                title = signal.title.replace("GPU", f"GPU {device}", 1) if device else signal.title
                found.append(
                    Reading(name, title, signal.unit, float(np.median(own)), float(np.median(others)))
                )
    return found


def _devices(line: Timeline) -> list[str]:
    """The GPU devices ``line`` has signals of, in device order."""
    found = {reading.device for name in line.values if (reading := catalogue.lookup(name)) and reading.device}
    return sorted(found, key=catalogue.device_order)


def by_role(line: Timeline, devices: list[str]) -> Timeline:
    """``line`` with its k-th GPU's signals named as the k-th of ``devices`` (another rank's own
    GPUs), and those of its GPUs past ``devices``' count left out: each rank samples its own
    GPU under its own index, and a rank's GPU is compared with the others' GPUs, not with the
    same index on another rank (which none of them samples)."""
    theirs = _devices(line)
    if not theirs:
        return line
    renamed = dict(zip(theirs, devices, strict=False))
    values = {}
    for name, column in line.values.items():
        reading = catalogue.lookup(name)
        if reading is None or not reading.device:
            values[name] = column
        elif reading.device in renamed:
            before = f"{catalogue.GPU_NAME_PREFIX}{reading.device}/"
            values[f"{catalogue.GPU_NAME_PREFIX}{renamed[reading.device]}/" + name.removeprefix(before)] = (
                column
            )
    return Timeline(line.steps, line.walls, values, line.interval)
