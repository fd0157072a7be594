"""The record the catalogue lays out: the fields in the order records have always had them, and
one rate rule, a counter's change per second, for the child and for every view."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest

from sampler import catalogue
from sampler.pipeline.derived import THROUGHPUT, PerStep
from sampler.store.reader import Run, Series
from sampler.views import lines, panels, top

RECORDED = {
    "cpu": ["cpu/utilization_percent"],
    "memory": [
        "memory/system_utilization_percent",
        "memory/swap_used_mb",
        "memory/swapped_in_mb",
        "memory/swapped_out_mb",
        "memory/swapped_in_mb_per_second",
        "memory/swapped_out_mb_per_second",
    ],
    "gpu": [
        f"gpu/<i>/{suffix}"
        for suffix in (
            "memory_clock_mhz",
            "sm_clock_mhz",
            "memory_allocated_bytes",
            "memory_allocated_percent",
            "temperature_celsius",
            "utilization_percent",
            "power_watts",
            "process_memory_bytes",
            "tree_memory_bytes",
            "clock_throttle_reasons",
            "throttle_power",
            "throttle_thermal",
            "throttle_hw_slowdown",
            "power_limit_watts",
            "throttled_sw_power_cap_seconds",
            "throttled_hw_power_brake_seconds",
            "throttled_sw_thermal_seconds",
            "throttled_hw_thermal_seconds",
            "throttled_sw_power_cap_seconds_per_second",
            "throttled_hw_power_brake_seconds_per_second",
            "throttled_sw_thermal_seconds_per_second",
            "throttled_hw_thermal_seconds_per_second",
            "energy_joules",
            "energy_joules_per_second",
            "xid_critical",
            "sm_activity_percent",
            "sm_occupancy_percent",
            "tensor_activity_percent",
            "dram_bandwidth_percent",
            "pcie_tx_mb_per_second",
            "pcie_rx_mb_per_second",
            "nvlink_tx_mb_per_second",
            "nvlink_rx_mb_per_second",
        )
    ],
    "disk": [
        "disk/utilization_percent",
        "disk/utilization_gb",
        "disk/read_mb",
        "disk/written_mb",
        "disk/read_mb_per_second",
        "disk/written_mb_per_second",
    ],
    "network": [
        "network/bytes_sent",
        "network/bytes_received",
        "network/bytes_sent_per_second",
        "network/bytes_received_per_second",
    ],
    "process": [
        "process/cpu_utilization_percent",
        "process/cpu_threads_in_use",
        "process/memory_in_use_mb",
        "process/memory_in_use_percent",
        "process/memory_available_mb",
        "process/cpu_cores_allowed",
        "process/cpu_wait_percent",
        "process/cpu_seconds",
    ],
    "process_tree": [
        "process_tree/process_count",
        "process_tree/cpu_utilization_percent",
        "process_tree/memory_in_use_mb",
        "process_tree/cpu_seconds",
    ],
    "container": [
        "container/memory_limit_mb",
        "container/memory_used_mb",
        "container/memory_used_percent",
        "container/cpu_quota_cores",
        "container/cpu_throttled_seconds",
        "container/cpu_throttled_seconds_per_second",
    ],
    "pressure": [
        f"pressure/{scope}{part}_percent"
        for scope in ("", "cgroup_")
        for part in ("cpu_some", "memory_some", "memory_full", "io_some", "io_full")
    ],
}
"""Each category's fields as records laid them out before the catalogue did (the collectors'
own name tuples): the ring's, the store's and the endpoint's order, which must not change."""


@pytest.mark.parametrize("category", catalogue.DEFAULT_CATEGORIES)
def test_every_category_keeps_its_record_order(category: str) -> None:
    layout = catalogue.record_layout(category, catalogue.sampled(category))
    assert [signal.key for signal in layout] == RECORDED[category]


def test_a_counter_brings_its_rate_and_nothing_else_does() -> None:
    layout = catalogue.record_layout("disk", [catalogue.DISK_WRITTEN, catalogue.DISK_FULL])
    assert [s.key for s in layout] == [
        "disk/utilization_percent",
        "disk/written_mb",
        "disk/written_mb_per_second",
    ]
    assert catalogue.rate_of(catalogue.DISK_FULL) is None
    assert catalogue.rate_of(catalogue.PROCESS_CPU_SECONDS) is None  # its rate is a gauge of its own
    assert catalogue.counter_of(catalogue.rate_of(catalogue.DISK_WRITTEN)) is catalogue.DISK_WRITTEN  # type: ignore[arg-type]
    assert catalogue.counter_of(catalogue.GPU_PCIE_SENT) is None  # a gauge in MiB/s, no counter's


def test_a_rate_is_the_change_per_second_or_none() -> None:
    assert catalogue.rate(30.0, 10.0, 2.0) == 10.0
    assert catalogue.rate(10.0, 10.0, 2.0) == 0.0
    for value, last, seconds in [
        (5.0, 10.0, 2.0),  # went back: a reset, a wrap
        (10.0, math.nan, 2.0),  # the first reading, or the last one failed
        (math.nan, 10.0, 2.0),  # this one failed
        (30.0, 10.0, 0.0),  # no time passed
        (30.0, 10.0, -1.0),
    ]:
        assert math.isnan(catalogue.rate(value, last, seconds)), (value, last, seconds)


def test_the_vectorized_rates_are_the_scalar_rule_pair_by_pair() -> None:
    values = np.array([10.0, 30.0, 5.0, math.nan, 25.0, 45.0, 50.0, 50.0])
    seconds = np.array([0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 10.0, 12.0])
    got = catalogue.rates(values, seconds)
    expected = [math.nan] + [
        catalogue.rate(values[i], values[i - 1], seconds[i] - seconds[i - 1]) for i in range(1, len(values))
    ]
    assert np.array_equal(got, expected, equal_nan=True)
    assert np.array_equal(
        got, [math.nan, 10.0, math.nan, math.nan, math.nan, 10.0, math.nan, 0.0], equal_nan=True
    )
    assert catalogue.rates(np.array([]), np.array([])).size == 0
    assert np.isnan(catalogue.rates(np.array([1.0]), np.array([0.0]))).all()


def _drawn(walls: list[float], values: list[float]) -> list[float]:
    """``lines.points``' y for a disk-read counter read at ``walls`` (step = index)."""
    (panel,) = panels.panels([catalogue.DISK_READ.name])
    assert panel.rate
    series = Series(catalogue.DISK_READ.name, list(range(len(walls))), walls, values)
    run = cast(Run, SimpleNamespace(started_at=0.0))
    _, ys = lines.points(series, run, "seconds", panel)
    return ys.tolist()


def test_plot_draws_a_counter_by_the_one_rate_rule() -> None:
    # The first reading has none, a counter that went back and a failed reading leave gaps.
    ys = _drawn([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 2.0, 1.0, 3.0, math.nan, 9.0])
    assert np.array_equal(ys, [2.0, math.nan, 2.0, math.nan, math.nan], equal_nan=True)
    # A reading at the same instant as the one before has no rate: the earlier stays the base.
    assert _drawn([0.0, 1.0, 1.0, 2.0], [0.0, 2.0, 5.0, 4.0]) == [2.0, 2.0]


def test_top_shows_a_counter_by_the_one_rate_rule() -> None:
    points = [(0.0, 0.0), (1.0, 2.0), (2.0, 1.0), (3.0, 3.0), (4.0, math.nan), (5.0, 9.0), (5.0, 10.0)]
    assert top.rates(points) == [(1.0, 2.0), (3.0, 2.0)]
    assert top.rates([]) == [] and top.rates([(0.0, 1.0)]) == []


def test_a_counters_change_per_step_follows_the_one_rate_rule() -> None:
    energy = catalogue.name_of(catalogue.GPU_ENERGY, "0")
    per_step = catalogue.name_of(catalogue.GPU_ENERGY_PER_STEP, "0")
    fields = ("resource/cpu/utilization_percent", energy)
    derived = PerStep()
    second = 1_000_000_000
    assert derived.derive(fields, [1.0, 100.0], 10, 1 * second) == []  # a run's first logged record
    assert derived.derive(fields, [1.0, 160.0], 13, 2 * second) == [(THROUGHPUT, 3.0), (per_step, 20.0)]
    assert derived.derive(fields, [1.0, 40.0], 14, 3 * second) == [(THROUGHPUT, 1.0)]  # a driver reload
    assert derived.derive(fields, [1.0, math.nan], 15, 4 * second) == [(THROUGHPUT, 1.0)]  # failed
    assert derived.derive(fields, [1.0, 50.0], 16, 5 * second) == [(THROUGHPUT, 1.0)]  # none before
    assert derived.derive(fields, [1.0, 52.0], 16, 6 * second) == []  # the step did not move on
    assert derived.derive(list(fields), [1.0, 60.0], 18, 7 * second) == [(THROUGHPUT, 2.0)]  # a new ring


def test_a_new_childs_ring_restarts_the_per_step_counters_even_with_the_same_layout() -> None:
    """Each child's ring brings its own fields: the previous child's counters are not compared."""
    energy = catalogue.name_of(catalogue.GPU_ENERGY, "0")
    per_step = catalogue.name_of(catalogue.GPU_ENERGY_PER_STEP, "0")
    first_ring = ("resource/cpu/utilization_percent", energy)
    second_ring = tuple(list(first_ring))  # a new child's: equal names, another tuple
    derived = PerStep()
    second = 1_000_000_000
    derived.derive(first_ring, [1.0, 100.0], 10, 1 * second)
    assert derived.derive(first_ring, [1.0, 120.0], 12, 2 * second) == [(THROUGHPUT, 2.0), (per_step, 10.0)]
    assert derived.derive(second_ring, [1.0, 130.0], 13, 3 * second) == [(THROUGHPUT, 1.0)]
    assert derived.derive(second_ring, [1.0, 136.0], 15, 4 * second) == [(THROUGHPUT, 2.0), (per_step, 3.0)]
