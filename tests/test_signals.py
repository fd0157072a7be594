"""Every SPEC 2 signal, per category, from a real child reading real psutil."""

from __future__ import annotations

import os

import psutil
import pytest
from conftest import run_monitor

from sampler.collectors.host import SWAP_NAMES

SPEC_SIGNALS = {
    "cpu": {"resource/cpu/utilization_percent"},
    "memory": {"resource/memory/system_utilization_percent"},
    "disk": {
        "resource/disk/utilization_percent",
        "resource/disk/utilization_gb",
        "resource/disk/read_mb",
        "resource/disk/written_mb",
    },
    "network": {"resource/network/bytes_sent", "resource/network/bytes_received"},
    "process": {
        "resource/process/cpu_utilization_percent",
        "resource/process/cpu_threads_in_use",
        "resource/process/memory_in_use_mb",
        "resource/process/memory_in_use_percent",
        "resource/process/memory_available_mb",
    },
}
ADDED_SIGNALS = {
    "cpu": {"resource/cpu/utilization_percent_peak", "resource/cpu/utilization_percent_mean"},
    "memory": {"resource/memory/system_utilization_percent_peak"},
    "disk": {"resource/disk/read_mb_per_second", "resource/disk/written_mb_per_second"},
    "network": {"resource/network/bytes_sent_per_second", "resource/network/bytes_received_per_second"},
    "process": {
        "resource/process/cpu_utilization_percent_peak",
        "resource/process/cpu_utilization_percent_mean",
        "resource/process/cpu_seconds",
        "resource/process/memory_in_use_mb_peak",
        "resource/process/memory_in_use_mb_mean",
        "resource/process/cpu_cores_allowed",
        "resource/process/cpu_wait_percent",
    },
}
"""Beside the seed's: peaks and means between records, and the counters' rates."""
THROUGHPUT = {"resource/progress/steps_per_second"}
"""Logged with every logged record after the first, whatever the categories."""
SIGNALS = {category: SPEC_SIGNALS[category] | ADDED_SIGNALS[category] for category in SPEC_SIGNALS}
DISK_IO = {
    "resource/disk/read_mb",
    "resource/disk/written_mb",
    "resource/disk/read_mb_per_second",
    "resource/disk/written_mb_per_second",
}
HAS_DISK_IO = psutil.disk_io_counters() is not None


@pytest.mark.parametrize("category", sorted(SPEC_SIGNALS))
def test_one_category_yields_exactly_its_signals(category: str) -> None:
    sink, _ = run_monitor(records=3, categories=[category])
    expected = SIGNALS[category]
    if category == "disk" and not HAS_DISK_IO:
        expected = expected - DISK_IO
    names = sink.names() - THROUGHPUT
    if category == "memory":  # and where the machine has swap (when the child started), all of swap's
        assert names & set(SWAP_NAMES) in (set(), set(SWAP_NAMES))
        names -= set(SWAP_NAMES)
    assert names == expected


def test_all_categories_by_default_and_values_in_range() -> None:
    sink, stats = run_monitor(records=3, nvml_module="tests_have_no_such_module")
    assert {n for names in SPEC_SIGNALS.values() for n in names} - sink.names() <= {
        "resource/disk/read_mb",
        "resource/disk/written_mb",
    }
    for name in sink.names():
        if name.endswith("_percent") and "process/cpu" not in name:
            assert all(0.0 <= v <= 100.0 for v in sink.values(name)), name
    usage = psutil.disk_usage(os.sep)
    (used_gb, *_) = sink.values("resource/disk/utilization_gb")
    assert used_gb == pytest.approx(usage.used / 1024**3, rel=0.05)
    assert all(v >= 0 for v in sink.values("resource/network/bytes_received"))
    assert stats["records_lost"] == 0 and stats["sink_errors"] == 0


def test_disabled_categories_are_not_sampled() -> None:
    sink, _ = run_monitor(
        records=3, categories={"cpu": True, "memory": False, "disk": False, "network": True}
    )
    assert sink.names() - THROUGHPUT == SIGNALS["cpu"] | SIGNALS["network"]


def test_disk_path_selects_the_filesystem(tmp_path) -> None:
    sink, _ = run_monitor(categories=["disk"], disk_path=str(tmp_path))
    (percent, *_) = sink.values("resource/disk/utilization_percent")
    assert percent == pytest.approx(psutil.disk_usage(str(tmp_path)).percent, abs=1.0)


def test_unknown_category_is_a_clear_error() -> None:
    import sampler

    with pytest.raises(ValueError, match="gpus"):
        sampler.ResourceMonitor(categories=["cpu", "gpus"])


def test_a_disk_path_that_appears_later_is_reported_once_it_exists(tmp_path, caplog) -> None:
    """Kept as configured (never replaced by another filesystem's): its usage
    readings are skipped while it is missing, the I/O counters flow, and the
    usage appears once the path does, as a network mount would."""
    from conftest import FAST, Recorder, wait_for

    import sampler

    later = tmp_path / "mount"
    usage = "resource/disk/utilization_percent"
    sink = Recorder()
    with sampler.ResourceMonitor(
        categories=["disk"], disk_path=str(later), sink=sink, step_source="seconds", **FAST
    ) as mon:
        assert mon.disk_path == str(later)
        wait_for(lambda: mon.stats()["records_logged"] >= 3)
        assert usage not in sink.names()
        if HAS_DISK_IO:
            assert "resource/disk/read_mb" in sink.names()
        later.mkdir()
        wait_for(lambda: usage in sink.names(), what="usage once the path exists")
    assert sink.values(usage)[-1] == pytest.approx(psutil.disk_usage(str(later)).percent, abs=1.0)
    warnings = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage()]
    assert len(warnings) == 1 and str(later)[-20:] in warnings[0]
