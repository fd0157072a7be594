"""The signal -> metric table: complete, well named, and the one the manual publishes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import fake_driver
import pytest

from sampler import catalogue
from sampler.child.peaks import PeakTracker
from sampler.collectors import Sources, build_collectors
from sampler.collectors.base import Collector
from sampler.collectors.container import CPU_NAMES, MEMORY_NAMES
from sampler.collectors.host import MemoryCollector
from sampler.collectors.pressure import CGROUP_NAMES, SYSTEM_NAMES
from sampler.prometheus import metrics
from sampler.settings import DEFAULT_CATEGORIES

PROMETHEUS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "prometheus.md"
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


class _Container(Collector):
    """The container category's names with every limit set (this machine may have none)."""

    category = "container"
    names = MEMORY_NAMES + CPU_NAMES
    tracked = ("resource/container/memory_used_mb",)


class _Pressure(Collector):
    """The pressure category's names, the cgroup's too (this machine may have neither)."""

    category = "pressure"
    names = SYSTEM_NAMES + CGROUP_NAMES


def every_signal(nvml: fake_driver.Driver) -> list[str]:
    """Every name a record can carry: each collector's (two fake GPUs), then the peaks and means."""
    nvml.configure(devices=[{}, {}])
    fake_driver.load()
    sources = Sources(disk_path=os.sep, pid=os.getpid(), nvml_module="pynvml")
    faked = ("memory", "container", "pressure")
    collectors = [c for c in build_collectors(DEFAULT_CATEGORIES, sources) if c.category not in faked]
    collectors += [MemoryCollector(swap=True), _Container(), _Pressure()]  # swap: this machine may have none
    try:
        assert {c.category for c in collectors} == set(DEFAULT_CATEGORIES)
        peaks = PeakTracker(collectors, 4)
        return [name for c in collectors for name in c.names] + list(peaks.names)
    finally:
        for collector in collectors:
            collector.close()


def test_every_signal_is_exposed_except_the_rates_prometheus_computes(
    nvml: fake_driver.Driver,
) -> None:
    signals = every_signal(nvml)
    rates = {s for s in signals if (r := catalogue.lookup(s)) is not None and r.signal.kind == catalogue.RATE}
    assert {s for s in signals if s.endswith("_per_second")} > rates  # GPM's traffic is a gauge per second
    shown_as = {s.shown_as for s in catalogue.SIGNALS.values()}  # a counter's rate: CPU seconds' CPU %
    rates |= {s for s in signals if (r := catalogue.lookup(s)) is not None and r.signal.key in shown_as}
    missing = [s for s in signals if metrics.lookup(s) is None and s not in rates]
    assert missing == []
    assert all(metrics.lookup(s) is None for s in rates)
    # Nothing in the table that no collector produces.
    keys = {
        "/".join("<i>" if i == 2 and p.isdigit() else p for i, p in enumerate(s.split("/"))) for s in signals
    }
    assert set(metrics.SIGNALS) <= {k.removeprefix("resource/") for k in keys}


def test_names_follow_prometheus_conventions(nvml: fake_driver.Driver) -> None:
    exposed = [e for e in map(metrics.lookup, every_signal(nvml)) if e is not None]
    every = [e.metric for e in exposed] + list(metrics.OWN_METRICS)
    for metric in every:
        assert METRIC_NAME.match(metric.name) and metric.name.startswith("wl_resource_"), metric.name
        assert metric.name.endswith("_total") == (metric.kind == catalogue.COUNTER), metric.name
        assert not re.search(r"_(percent|mb|gb|mhz)(_|$)", metric.name), metric.name
    # One metric per (name, gpu): no two signals of a device collide.
    keys = [(e.metric.name, e.gpu) for e in exposed]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    ("signal", "name", "value", "expected", "gpu"),
    [
        (
            "resource/process/memory_in_use_mb",
            "wl_resource_process_memory_in_use_bytes",
            2.0,
            2 * 1024**2,
            None,
        ),
        ("resource/disk/utilization_gb", "wl_resource_disk_used_bytes", 1.5, 1.5 * 1024**3, None),
        ("resource/cpu/utilization_percent", "wl_resource_cpu_utilization_ratio", 50.0, 0.5, None),
        ("resource/gpu/3/sm_clock_mhz", "wl_resource_gpu_sm_clock_hertz", 1410.0, 1.41e9, "3"),
        (
            "resource/gpu/0/memory_allocated_bytes_peak",
            "wl_resource_gpu_memory_allocated_peak_bytes",
            7.0,
            7.0,
            "0",
        ),
        ("resource/cpu/utilization_percent_mean", "wl_resource_cpu_utilization_mean_ratio", 20.0, 0.2, None),
        ("resource/network/bytes_sent", "wl_resource_network_sent_bytes_total", 5.0, 5.0, None),
    ],
)
def test_units_become_base_units(
    signal: str, name: str, value: float, expected: float, gpu: str | None
) -> None:
    exposed = metrics.lookup(signal)
    assert exposed is not None
    assert (exposed.metric.name, exposed.gpu) == (name, gpu)
    assert value * exposed.metric.scale == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "signal", ["resource/disk/read_mb_per_second", "resource/gpu/0/nonsense", "loss/train"]
)
def test_rates_and_unknown_names_are_not_exposed(signal: str) -> None:
    assert metrics.lookup(signal) is None


def test_the_published_table_lists_every_metric() -> None:
    text = PROMETHEUS_PAGE.read_text(encoding="utf-8")
    section = text[text.index("\n## Prometheus metrics\n") :]
    rows = {
        match.group(1): match.group(2)
        for match in re.finditer(r"^\| `(resource/[^`]+)` \| `(wl_resource_[a-z_]+)` \|", section, re.M)
    }
    expected = {f"resource/{key}": metric.name for key, metric in metrics.SIGNALS.items()}
    assert rows == expected
    for metric in metrics.OWN_METRICS:
        assert f"`{metric.name}`" in section, metric.name
