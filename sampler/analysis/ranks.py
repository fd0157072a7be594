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
one rank per host samples compares only where both sides have it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from sampler.analysis import evidence, stretches, timeline
from sampler.analysis.evidence import Reason
from sampler.analysis.explain import json_number
from sampler.analysis.timeline import Floats, Timeline
from sampler.store.reader import Launch, Run, StoreReader
from sampler.util.quoting import printable

MAX_GRID = 2000
"""Grid steps at most: finer than a rank's records in most runs (its throughput is then exactly
its windows'), and a launch of a million steps is still drawn and judged in milliseconds."""


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

    @property
    def label(self) -> str:
        """``rank 2``, or ``rank 2 (run 7)`` for one of several runs of that rank."""
        return f"rank {self.run.rank}" + (f" (run {self.run.id})" if self.repeated else "")

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
class Comparison:
    """Each rank's throughput against the launch's median, and the lags found."""

    ranks: Ranks
    lags: list[Lag]

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
    return Comparison(ranks, lags)


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
    the other ranks' records then."""
    parts = [rank.timeline, *(other.timeline for other in ranks.ranks if other is not rank)]
    joined = timeline.joined(parts, rank.run.interval)
    during = (joined.walls > start) & (joined.walls <= end)
    own = np.zeros(len(joined), dtype=bool)
    own[: len(rank.timeline)] = True
    return evidence.against(joined, during & own, during & ~own)
