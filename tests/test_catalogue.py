"""The signal catalogue: every name a collector produces is in it, once, with what the
collectors really do (peaks, means), and the manual's tables and the views are drawn from it."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path

import fake_driver
import pytest

from sampler import catalogue, settings
from sampler.child.peaks import PeakTracker
from sampler.collectors import Sources, build_collectors
from sampler.collectors.base import Collector
from sampler.collectors.container import ContainerCollector
from sampler.collectors.host import MemoryCollector
from sampler.collectors.pressure import PressureCollector
from sampler.views import formatting, panels, top

DOCS = Path(__file__).resolve().parent.parent / "docs"
MiB = 1024**2
OWN_GPU_BYTES = 3 * MiB
"""What the backend holds on the fake GPU: unlike every other reading, so a swap shows."""


def published_table(page: str, heading: str) -> str:
    """The first table after the line ``heading`` in the manual's ``page`` (under docs/), as text."""
    text = "\n" + (DOCS / page).read_text(encoding="utf-8")
    lines = text[text.index(f"\n{heading}\n") :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end]) + "\n"


def test_the_published_tables_are_the_catalogues() -> None:
    assert published_table("signals.md", "# Signals") == catalogue.signals_table()
    assert published_table("prometheus.md", "## Prometheus metrics") == catalogue.metrics_table()


def test_the_published_env_var_table_is_the_settings_table() -> None:
    assert published_table("configuration.md", "## Environment variables") == settings.env_table()


def fake_container(tmp_path: Path) -> ContainerCollector:
    """A container collector under a memory limit and a CPU quota (a fake cgroup v2 layout)."""
    pid = 4242
    (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    (tmp_path / "proc" / str(pid) / "cgroup").write_text("0::/a\n")
    files = {
        "cgroup.controllers": "cpu memory",
        "a/memory.max": str(256 * MiB),
        "a/memory.current": str(64 * MiB),
        "a/cpu.max": "50000 100000",
        "a/cpu.stat": "throttled_usec 1500000",
    }
    for name, text in files.items():
        path = tmp_path / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    collector = ContainerCollector.open(
        pid, proc_root=str(tmp_path / "proc"), cgroup_root=str(tmp_path / "cgroup")
    )
    assert collector is not None
    return collector


def fake_pressure(tmp_path: Path) -> PressureCollector:
    """A pressure collector with the system's and a cgroup v2's files (a fake layout)."""
    pid, root = 4242, tmp_path / "pressure"
    some = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\n"
    both = some + some.replace("some", "full")
    files = {
        f"proc/{pid}/cgroup": "0::/a\n",
        "proc/pressure/cpu": some,
        "proc/pressure/memory": both,
        "proc/pressure/io": both,
        "cgroup/cgroup.controllers": "cpu memory",
        "cgroup/a/cpu.pressure": both,
        "cgroup/a/memory.pressure": both,
        "cgroup/a/io.pressure": both,
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    collector = PressureCollector.open(pid, proc_root=str(root / "proc"), cgroup_root=str(root / "cgroup"))
    assert collector is not None
    return collector


@pytest.fixture
def collectors(tmp_path: Path, nvml: fake_driver.Driver) -> Iterator[list[Collector]]:
    """One collector of every category, each with every signal it can produce (two fake GPUs,
    both cgroup limits, the system's and a cgroup's pressure, swap); the GPUs' readings all differ,
    and the backend holds memory on them."""
    own = {"compute": [{"pid": os.getpid(), "used": OWN_GPU_BYTES}]}
    nvml.configure(devices=[own, {**own, "util": 40}])
    fake_driver.load()
    sources = Sources(disk_path=os.sep, pid=os.getpid(), nvml_module="pynvml")
    faked = ("memory", "container", "pressure")
    built = [c for c in build_collectors(catalogue.DEFAULT_CATEGORIES, sources) if c.category not in faked]
    built += [MemoryCollector(swap=True), fake_container(tmp_path), fake_pressure(tmp_path)]
    assert sorted(c.category for c in built) == sorted(catalogue.DEFAULT_CATEGORIES)
    yield built
    for collector in built:
        collector.close()


def key(name: str) -> str:
    return re.sub(r"^resource/gpu/\d+/", "resource/gpu/<i>/", name).removeprefix(catalogue.PREFIX)


def test_every_name_a_collector_produces_is_in_the_catalogue_and_nothing_else(
    collectors: list[Collector],
) -> None:
    for collector in collectors:
        for name in collector.names:
            assert catalogue.entry(name).category == collector.category, name
    produced = {key(name) for c in collectors for name in c.names}
    assert produced == {k for k, signal in catalogue.SIGNALS.items() if not signal.derived}
    # The peaks and means a record carries are the catalogue's, and it reads them back.
    peaks = PeakTracker(collectors, 4)
    readings = [catalogue.lookup(name) for name in peaks.names]
    assert None not in readings and len(set(peaks.names)) == len(peaks.names)
    carried = {(r.signal.key, r.variant) for r in readings if r is not None}
    assert carried == {(k, v) for k, signal in catalogue.SIGNALS.items() for v in signal.variants}


def test_the_readings_between_records_are_the_ones_with_a_peak(collectors: list[Collector]) -> None:
    for collector in collectors:
        assert len(collector.sample()) == len(collector.names), collector.category
        assert len(collector.sample_tracked()) == len(collector.tracked), collector.category
        assert len(collector.marks()) == len(collector.tracked), collector.category
        assert set(collector.averaged) <= set(collector.tracked)
    # Where the source stands still, a reading between records is the record's own:
    # the catalogue's peak flags name what sample_tracked() reads, in its order (but for
    # the GPU's clock and power, whose peaks come from the driver's sample buffer alone).
    for collector in collectors:
        if collector.category in ("gpu", "container"):
            record = dict(zip(collector.names, collector.sample(), strict=True))
            polled = dict(zip(collector.tracked, collector.sample_tracked(), strict=True))
            buffered_only = {n for n in polled if n.endswith(("/power_watts", "/sm_clock_mhz"))}
            assert {n for n, v in polled.items() if math.isnan(v)} == buffered_only, collector.category
            between = [v for n, v in polled.items() if n not in buffered_only]
            assert between == pytest.approx([record[n] for n in polled if n not in buffered_only])
            if collector.category == "gpu":
                assert OWN_GPU_BYTES in between


def test_every_entry_is_well_formed() -> None:
    stand_ins = {s.shown_as for s in catalogue.SIGNALS.values() if s.shown_as is not None}
    assert set(catalogue.CATEGORIES) == {*catalogue.DEFAULT_CATEGORIES, *catalogue.DERIVED_CATEGORIES}
    assert len(set(catalogue.DEFAULT_CATEGORIES)) == len(catalogue.DEFAULT_CATEGORIES)
    for k, signal in catalogue.SIGNALS.items():
        assert signal.key == k and signal.name == catalogue.PREFIX + k
        assert signal.unit in catalogue.UNITS and signal.kind in catalogue.KINDS, k
        assert signal.peak or not signal.mean, f"{k}: a mean without a peak"
        assert (signal.metric is None) == (signal.scale is None), k
        unexported = signal.kind == catalogue.RATE or signal.derived or k in stand_ins
        assert (signal.metric is None) == unexported, f"{k}: rates (stand-ins too), derived alone unexported"
        assert not any("|" in text for text in (signal.title, signal.label, signal.what)), k
        # The unit the name says, 1024-based for _mb and _gb.
        for suffix, units in (("_mb", {"MiB"}), ("_gb", {"GiB"}), ("_percent", {"%"}), ("_bytes", {"bytes"})):
            if k.endswith(suffix):
                assert signal.unit in units, k
        if signal.kind == catalogue.RATE:
            counter = catalogue.SIGNALS[k.removesuffix(catalogue.RATE_SUFFIX)]
            per_second = {"J": "W"}.get(counter.unit, counter.unit + "/s")  # a joule per second is a watt
            assert counter.kind == catalogue.COUNTER and signal.unit == per_second, k
        if signal.shown_as is not None:  # its rate is that gauge: a _per_second would say it again
            gauge = catalogue.SIGNALS[signal.shown_as]
            assert signal.kind == catalogue.COUNTER and gauge.kind == catalogue.GAUGE, k
            assert gauge.category == signal.category and k + catalogue.RATE_SUFFIX not in catalogue.SIGNALS, k
        elif signal.kind == catalogue.COUNTER:
            assert k + catalogue.RATE_SUFFIX in catalogue.SIGNALS, f"{k}: a counter without its rate"


def test_titles_are_unique_and_labels_within_a_category() -> None:
    titles = [signal.title for signal in catalogue.SIGNALS.values()]
    assert len(titles) == len(set(titles))
    labels = [(signal.category, signal.label) for signal in catalogue.SIGNALS.values()]
    assert len(labels) == len(set(labels))


def test_lookup_reads_a_recorded_name() -> None:
    reading = catalogue.lookup("resource/gpu/12/utilization_percent_mean")
    assert reading is not None
    assert (reading.signal.key, reading.variant, reading.device) == (
        "gpu/<i>/utilization_percent",
        "mean",
        "12",
    )
    assert catalogue.lookup("resource/disk/read_mb") == catalogue.Reading(catalogue.SIGNALS["disk/read_mb"])
    for unknown in (
        "resource/gpu/0/temperature_celsius_peak",  # no peak is carried for it
        "resource/memory/system_utilization_percent_mean",
        "resource/gpu/<i>/power_watts",
        "resource/gpu/²/power_watts",
        "resource/cpu/nonsense",
        "train/loss",
    ):
        assert catalogue.lookup(unknown) is None, unknown
    with pytest.raises(KeyError):
        catalogue.entry("resource/cpu/utilization_percent_peak")


def every_name() -> list[str]:
    """Every name a record of two GPUs can carry, peaks and means included."""
    names = []
    for signal in catalogue.SIGNALS.values():
        for device in ("0", "1") if signal.category == "gpu" else ("",):
            name = signal.name.replace(catalogue.DEVICE, device)
            names += [name, *(f"{name}_{variant}" for variant in signal.variants)]
    return names


def test_the_plot_draws_a_panel_per_signal_titled_and_in_units_as_the_catalogue_says() -> None:
    names = every_name()
    drawn = panels.panels(names)
    titles = [panel.title for panel in drawn]
    assert len(titles) == len(set(titles))
    assert {panel.title for panel in drawn} == {
        s.title for s in catalogue.SIGNALS.values() if s.kind != catalogue.RATE and s.shown_as is None
    }  # a counter's rate is drawn from the counter, and a counter with a gauge for its rate is that gauge
    alone = panels.panels(["resource/process/cpu_seconds"])  # without its gauge: drawn as its rate
    assert [(p.title, p.unit, p.rate) for p in alone] == [("process CPU time", "s/s", True)]
    units = {panel.key.removeprefix(catalogue.PREFIX): panel.unit for panel in drawn}
    assert units["process_tree/process_count"] == "processes"
    assert units["gpu/*/memory_allocated_bytes"] == "GiB"  # bytes drawn in GiB
    assert units["network/bytes_sent"] == "MiB/s" and units["container/cpu_throttled_seconds"] == "s/s"
    assert units["disk/read_mb"] == "MiB/s" and units["disk/utilization_gb"] == "GiB"
    order = [*panels.LOOP[1:], *(c for c in catalogue.CATEGORIES if c not in panels.LOOP)]
    assert [panel.category for panel in drawn] == sorted((panel.category for panel in drawn), key=order.index)
    peaks = [p for p in drawn if p.variants]
    assert {p.key.removeprefix(catalogue.PREFIX).replace("*", "<i>") for p in peaks} == {
        k for k, signal in catalogue.SIGNALS.items() if signal.peak
    }


def test_top_labels_and_units_are_the_catalogues() -> None:
    assert top.label_of("resource/process/memory_in_use_mb") == "memory (RSS)"
    assert top.label_of("resource/gpu/0/utilization_percent_peak") == "util peak"
    assert top.label_of("resource/cpu/fan_rpm") == "fan_rpm"  # unknown: its name
    for name in every_name():
        reading = catalogue.lookup(name)
        assert reading is not None
        shown = formatting.format_value(name, 1536.0)
        assert (shown == "1536") == (
            reading.signal.unit in ("threads", "processes", "cores", "0/1", "bitmask", "XID")
        )
    assert formatting.format_value("resource/disk/utilization_gb", 1.5) == "1.5 GiB"
    assert formatting.format_value("resource/process/memory_in_use_mb", 1536.0) == "1536 MiB"
    assert formatting.format_value("resource/gpu/0/memory_allocated_bytes", 1536.0 * MiB) == "1.5 GiB"
    assert formatting.format_value("resource/disk/read_mb", 1536.0, rate=True) == "1.5 GiB/s"
    assert formatting.format_value("resource/container/cpu_throttled_seconds", 0.25, rate=True) == "0.25 s/s"
    assert catalogue.stand_in("resource/process_tree/cpu_seconds") == (
        "resource/process_tree/cpu_utilization_percent"
    )
    assert catalogue.stand_in("resource/disk/read_mb") is None
