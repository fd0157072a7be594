"""From the runs to the numbers: medians with their spread per cell, slowdowns paired round by
round, the floor's multiples and the loss-logging costs, all under typed keys until ``to_json``."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.overhead.measure import Run, percentile
from bench.overhead.plan import (
    ALL_MODES,
    FLOOR,
    INTERVALS,
    LOG_MODES,
    MODES,
    TRAINING,
    WORKLOADS,
    CellKey,
    interval_label,
    modes_for,
)

METRICS = (
    "steps_per_second",
    "step_ms_p50",
    "step_ms_p99",
    "step_ms_max",
    "backend_cpu_ms_per_sample",
    "monitor_thread_cpu_ms_per_sample",
    "child_cpu_ms_per_sample",
    "child_rss_mb",
    "start_ms",
    "first_sample_ms",
    "signals_per_sample",
    "log_call_us",
    "store_points",
)
"""The ``Run`` fields each cell reports as a median with its min..max spread."""
COMPARED = ("process", "store")
"""The isolated monitor without and with the run store, as multiples of the floor."""


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def spread(values: list[float | None]) -> tuple[float, float] | None:
    present = [v for v in values if v is not None]
    return (min(present), max(present)) if present else None


def stat(values: list[float | None]) -> dict[str, Any]:
    return {"median": median(values), "spread": spread(values)}


def paired_slowdown(base: list[Run], other: list[Run]) -> dict[str, Any]:
    """Throughput slowdown of ``other`` against ``base``, round by round (%)."""
    paired: list[float | None] = [
        100.0 * (1 - b.steps_per_second / a.steps_per_second)
        for a, b in zip(base, other, strict=True)
        if a.steps_per_second and b.steps_per_second
    ]
    return {"median_percent": median(paired), "spread_percent": spread(paired)}


def paired_ratio(base: list[float | None], other: list[float | None]) -> dict[str, Any]:
    """``other / base`` round by round: median and min..max."""
    ratios: list[float | None] = [b / a for a, b in zip(base, other, strict=True) if a and b is not None]
    return stat(ratios)


def round_to_round(runs: list[Run]) -> tuple[float, float] | None:
    """The spread of one mode against itself from one round to the next (%): the noise."""
    noise: list[float | None] = [
        100.0 * (1 - b.steps_per_second / a.steps_per_second)
        for a, b in itertools.pairwise(runs)
        if a.steps_per_second and b.steps_per_second
    ]
    return spread(noise)


@dataclass(frozen=True)
class FloorCell:
    """Backend CPU per sample against the floor measured in the same rounds, at one interval (idle)."""

    cost_ms: dict[str, dict[str, Any]]
    """Mode -> backend CPU ms per sample (median, spread)."""
    thread_ms: dict[str, float | None]
    """Mode -> median CPU ms per sample of the measured thread alone."""
    samples: dict[str, int]
    x_floor: dict[str, dict[str, Any]]
    """``COMPARED`` mode -> multiple of the floor, paired round by round."""
    thread_x_floor: dict[str, dict[str, Any]]
    """The same for the monitor thread against the floor thread."""
    signals_per_sample: float | None
    """The isolated monitor's sink calls per sample."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for mode, cost in self.cost_ms.items():
            out[f"{mode}_ms"] = cost
            out[f"{mode}_thread_ms"] = self.thread_ms[mode]
            out[f"{mode}_samples"] = self.samples[mode]
        out["process_signals_per_sample"] = self.signals_per_sample
        for mode in COMPARED:
            out[f"{mode}_x_floor"] = self.x_floor[mode]
            out[f"{mode}_thread_x_floor"] = self.thread_x_floor[mode]
        return out


@dataclass
class Summary:
    cells: dict[CellKey, dict[str, Any]]
    slowdowns: dict[CellKey, dict[str, Any]]
    """Each monitored cell of a training workload against ``off``, paired round by round."""
    noise: dict[CellKey, tuple[float, float] | None]
    """``off`` cell -> its spread against itself round to round (%)."""
    floor: dict[float, FloorCell]
    """Interval -> the floor's comparison there."""
    loss: dict[str, Any]
    scaling: list[dict[str, Any]]
    targets: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report's schema: cells and slowdowns under ``workload@intervals/mode`` labels."""
        slowdowns: dict[str, Any] = {key.label: entry for key, entry in self.slowdowns.items()}
        for key, noise in self.noise.items():
            slowdowns[key._replace(mode="off-vs-off").label] = {"spread_percent": noise}
        return {
            "cells": {key.label: cell for key, cell in self.cells.items()},
            "slowdowns": slowdowns,
            "floor": {interval_label(interval): cell.to_json() for interval, cell in self.floor.items()},
            "loss_logging": self.loss,
            "scaling": self.scaling,
            "targets": self.targets,
        }


def _cell(runs: list[Run]) -> dict[str, Any]:
    cell: dict[str, Any] = {"rounds": len(runs)}
    for metric in METRICS:
        cell[metric] = stat([getattr(r, metric) for r in runs])
    latencies = [x for r in runs for x in r.latency_ms]
    cell["sample_to_sink_ms"] = {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}
    cell["samples"] = sum(r.samples for r in runs)
    return cell


def summarize(matrix: list[Run], scaling: list[Run]) -> Summary:
    """Medians with their min..max spread per cell, paired slowdowns against off (round by
    round), the floor's multiples, and the loss-logging costs (targets: see ``targets``)."""
    by_key: dict[CellKey, list[Run]] = {}
    for run in matrix:
        by_key.setdefault(run.key, []).append(run)
    cells = {
        key: _cell(by_key[key])
        for key in (CellKey(w, i, m) for w in WORKLOADS for i in INTERVALS for m in ALL_MODES)
        if key in by_key
    }
    slowdowns: dict[CellKey, dict[str, Any]] = {}
    noise: dict[CellKey, tuple[float, float] | None] = {}
    for workload in TRAINING:
        for interval in INTERVALS:
            off_key = CellKey(workload, interval, "off")
            if off_key not in by_key:
                continue
            off = by_key[off_key]
            for mode in modes_for(workload, interval)[1:]:
                key = off_key._replace(mode=mode)
                slowdowns[key] = paired_slowdown(off, by_key[key])
            noise[off_key] = round_to_round(off)
    scale = [
        {
            "categories": ",".join(r.categories),
            "devices": r.devices,
            "mode": r.mode,
            "samples": r.samples,
            "signals_per_sample": r.signals_per_sample,
            "backend_cpu_ms_per_sample": r.backend_cpu_ms_per_sample,
            "child_cpu_ms_per_sample": r.child_cpu_ms_per_sample,
        }
        for r in scaling
    ]
    return Summary(cells, slowdowns, noise, floor_ratios(by_key), loss_logging(by_key), scale)


def floor_ratios(by_key: dict[CellKey, list[Run]]) -> dict[float, FloorCell]:
    """Backend CPU per sample of the isolated monitor, without and with the run store,
    as multiples of the floor measured in the same rounds (idle backend); also the
    same for the thread alone (the monitor thread against the floor thread)."""
    out: dict[float, FloorCell] = {}
    for interval in INTERVALS:
        runs = {mode: by_key.get(CellKey("idle", interval, mode), []) for mode in ("floor", *COMPARED)}
        if not runs["floor"]:
            continue
        cost = {mode: [r.backend_cpu_ms_per_sample for r in rs] for mode, rs in runs.items()}
        thread = {mode: [r.monitor_thread_cpu_ms_per_sample for r in rs] for mode, rs in runs.items()}
        out[interval] = FloorCell(
            cost_ms={mode: stat(values) for mode, values in cost.items()},
            thread_ms={mode: median(values) for mode, values in thread.items()},
            samples={mode: sum(r.samples for r in rs) for mode, rs in runs.items()},
            x_floor={mode: paired_ratio(cost["floor"], cost[mode]) for mode in COMPARED},
            thread_x_floor={mode: paired_ratio(thread["floor"], thread[mode]) for mode in COMPARED},
            signals_per_sample=median([r.signals_per_sample for r in runs["process"]]),
        )
    return out


def loss_logging(by_key: dict[CellKey, list[Run]]) -> dict[str, Any]:
    """The GIL-bound loop logging its loss every step (1 s interval), against the same
    loop with the pipeline off (no log_signal, no monitor), round by round: the whole
    slowdown, and its causes (the isolated monitor alone, the log_signal calls, the store)."""

    def runs(mode: str) -> list[Run]:
        return by_key.get(CellKey("gil", FLOOR, mode), [])

    off, process, log, store = runs("off"), runs("process"), runs("log"), runs("log+store")
    if not store:
        return {}
    return {
        "steps_per_second": {
            mode: median([r.steps_per_second for r in runs(mode)]) for mode in MODES + LOG_MODES
        },
        "log_call_us": {mode: median([r.log_call_us for r in runs(mode)]) for mode in LOG_MODES},
        "store_points": median([r.store_points for r in store]),
        "monitor_thread_cpu_ms_per_sample": median([r.monitor_thread_cpu_ms_per_sample for r in store]),
        "slowdown": {
            "log+store vs off (all of it)": paired_slowdown(off, store),
            "log vs off (log_signal + isolated monitor, no store)": paired_slowdown(off, log),
            "process vs off (the isolated monitor alone)": paired_slowdown(off, process),
            "log vs process (the log_signal calls)": paired_slowdown(process, log),
            "log+store vs log (the store)": paired_slowdown(log, store),
        },
        "off_vs_off_spread_percent": round_to_round(off),
    }
