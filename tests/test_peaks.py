"""Peaks and means between logged records (the child's inner rate), and counter rates."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from cgroups import cgroup_skip_reason, memory_cgroup
from conftest import FAST, Recorder, as_psutil_reads, wait_for

import sampler
from sampler import catalogue
from sampler.child.peaks import PeakTracker
from sampler.collectors import base, process
from sampler.collectors.base import Collector, Readings
from sampler.collectors.container import ContainerCollector
from sampler.collectors.host import CpuCollector, MemoryCollector, NetworkCollector, ProcFile
from sampler.collectors.process import ProcessCollector

PEAK = "resource/process/memory_in_use_mb_peak"
MEAN = "resource/process/memory_in_use_mb_mean"
RSS = "resource/process/memory_in_use_mb"


class Tracked(Collector):
    category = "process"
    names = ("a", "b", "c")
    tracked = ("a", "b")
    averaged = ("b",)


def test_tracker_names_peaks_then_means() -> None:
    assert PeakTracker([Tracked()], 8).names == ("a_peak", "b_peak", "b_mean")


def test_an_averaged_name_must_be_tracked() -> None:
    class Wrong(Tracked):
        averaged = ("c",)

    with pytest.raises(ValueError, match="not tracked"):
        PeakTracker([Wrong()], 8)


def test_peak_and_mean_of_one_window() -> None:
    tracker = PeakTracker([Tracked()], 8)
    for a, b in [(1.0, 10.0), (5.0, 20.0), (3.0, 30.0)]:
        tracker.add([a, b])
    assert tracker.close(record=0, logged_through=0) == [5.0, 30.0, 20.0]


def test_a_dropped_record_hands_its_peak_on() -> None:
    tracker = PeakTracker([Tracked()], 8)
    tracker.add([1.0, 1.0])
    assert tracker.close(0, logged_through=0) == [1.0, 1.0, 1.0]  # logged
    tracker.add([9.0, 3.0])  # the spike, in a record the backend drops
    assert tracker.close(1, logged_through=1)[0] == 9.0
    tracker.add([2.0, 5.0])
    # Record 0 is still the last logged: record 2 carries record 1's window.
    assert tracker.close(2, logged_through=1) == [9.0, 5.0, 4.0]
    tracker.add([2.0, 7.0])
    # Record 2 was logged: its windows are not carried again.
    assert tracker.close(3, logged_through=3) == [2.0, 7.0, 7.0]


def test_failed_readings_are_skipped_not_counted() -> None:
    tracker = PeakTracker([Tracked()], 8)
    tracker.add([math.nan, 4.0])
    tracker.add([math.nan, math.nan])
    peak_a, peak_b, mean_b = tracker.close(0, 0)
    assert math.isnan(peak_a) and peak_b == 4.0 and mean_b == 4.0


def test_windows_kept_are_bounded_by_the_ring() -> None:
    tracker = PeakTracker([Tracked()], 2)
    tracker.add([100.0, 1.0])
    tracker.close(0, 0)
    for record in (1, 2):
        tracker.add([1.0, 1.0])
        tracker.close(record, 0)
    tracker.add([1.0, 1.0])
    # The backend logged nothing for longer than the ring holds: record 0's window is gone.
    assert tracker.close(3, 0)[0] == 1.0


def test_no_tracked_readings_no_fields() -> None:
    class Plain(Collector):
        category = "disk"
        names = ("x",)

    tracker = PeakTracker([Plain()], 4)
    tracker.add([])
    assert tracker.names == () and tracker.close(0, 0) == []


# --------------------------------------------------------------------------- rates


class Counting(Collector):
    """Network counters as given, at times as given: the base class derives their rates."""

    category = "network"

    def __init__(self, readings: list[dict[catalogue.Signal, float]]) -> None:
        self._readings = iter(readings)

    def read(self) -> Readings:
        return next(self._readings)


def test_rates_need_two_readings_and_a_forward_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    sent, received = catalogue.NETWORK_SENT, catalogue.NETWORK_RECEIVED
    collector = Counting(
        [
            {sent: 10.0, received: 10.0},
            {sent: 30.0, received: 14.0},
            {sent: 5.0},  # a NIC reset; a failed reading
            {sent: 25.0, received: 20.0},
        ]
    )
    clock = iter([100.0, 102.0, 104.0, 106.0])
    monkeypatch.setattr(base, "monotonic", lambda: next(clock))
    assert collector.names[2:] == (
        "resource/network/bytes_sent_per_second",
        "resource/network/bytes_received_per_second",
    )
    assert all(math.isnan(r) for r in collector.sample()[2:])  # the first has none
    assert collector.sample()[2:] == [10.0, 2.0]
    reset, failed = collector.sample()[2:]
    assert math.isnan(reset) and math.isnan(failed)
    again, after_failure = collector.sample()[2:]
    assert again == 10.0 and math.isnan(after_failure)  # from the counter's new base; none yet


def test_network_rate_sees_real_loopback_traffic() -> None:
    collector = NetworkCollector()
    collector.sample()
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    payload = b"x" * 64 * 1024  # fits the loopback buffers: one thread sends, then reads
    try:
        client.sendall(payload)
        received = 0
        while received < len(payload):
            received += len(conn.recv(2**20))
    finally:
        for s in (client, conn, server):
            s.close()
    values = dict(zip(collector.names, collector.sample(), strict=True))
    assert values["resource/network/bytes_sent_per_second"] > 0
    assert values["resource/network/bytes_received_per_second"] > 0


def test_network_counters_failing_give_no_rate(tmp_path: Path) -> None:
    collector = NetworkCollector()
    collector.sample()
    collector._dev = ProcFile(str(tmp_path / "dev"))  # gone: the kernel gives no /proc/net/dev
    assert all(math.isnan(v) for v in collector.sample())


# --------------------------------------------------------------------------- tracked readings


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_tracked_cpu_has_its_own_window() -> None:
    began = time.monotonic()
    collector = ProcessCollector(psutil.Process().pid)
    _spin(0.3)
    tracked = collector.sample_tracked()[0]
    # An idle half as long as the busy one, however long the machine took to give the spin its
    # CPU: then the idle reading (a clock tick at most) is far under the busy one's.
    time.sleep(time.monotonic() - began)
    idle = collector.sample_tracked()[0]
    whole = collector.sample()[0]
    # The record's CPU % covers both halves, undisturbed by the tracked reads.
    assert idle < whole < tracked


def test_tracked_system_cpu_is_a_percentage() -> None:
    collector = CpuCollector()
    _spin(0.2)
    (value,) = collector.sample_tracked()
    assert 0 < value <= 100


def meminfo_reader(procfs: Path, text: str) -> MemoryCollector:
    """A memory collector reading ``text`` as /proc/meminfo."""
    (procfs / "meminfo").write_text(text)
    collector = MemoryCollector(swap=False)
    collector._meminfo = ProcFile(str(procfs / "meminfo"))
    return collector


def test_tracked_memory_is_psutils_percentage(tmp_path: Path) -> None:
    real = Path("/proc/meminfo").read_text()
    collector = meminfo_reader(tmp_path, real)
    assert collector.sample_tracked() == [as_psutil_reads(tmp_path, psutil.virtual_memory).percent]
    # Another kernel's: MemAvailable past MemTotal (psutil then counts MemFree as available).
    lines = [line for line in real.splitlines() if not line.startswith("MemAvailable:")]
    total = int(lines[0].split()[1])
    collector = meminfo_reader(tmp_path, "\n".join([*lines[:2], f"MemAvailable: {total + 1} kB", *lines[2:]]))
    assert collector.sample_tracked() == [as_psutil_reads(tmp_path, psutil.virtual_memory).percent]
    collector.close()


def test_tracked_memory_without_memavailable_is_psutils_estimate(tmp_path: Path) -> None:
    """Kernels before 3.14 give no MemAvailable, and some give 0: psutil estimates it."""
    real = Path("/proc/meminfo").read_text().splitlines()
    for available in ([], ["MemAvailable:          0 kB"]):
        lines = [*real[:2], *available, *(line for line in real[2:] if not line.startswith("MemAvailable:"))]
        collector = meminfo_reader(tmp_path, "\n".join(lines) + "\n")
        tracked = as_psutil_reads(tmp_path, collector.sample_tracked)  # its estimate reads the same file
        expected = as_psutil_reads(tmp_path, psutil.virtual_memory).percent
        assert tracked == [expected] and 0 < expected < 100
        collector.close()


def test_tracked_system_cpu_is_psutils_busy_share(tmp_path: Path) -> None:
    """The tracked CPU % from /proc/stat's first line, as from ``psutil.cpu_times``."""
    collector = CpuCollector()
    collector._stat = ProcFile(str(tmp_path / "stat"))
    lines = Path("/proc/stat").read_text().splitlines()
    first = [int(n) for n in lines[0].split()[1:]]
    readings = []
    for step in range(3):
        ticks = [n + (k + 1) * step * 7 for k, n in enumerate(first)]  # every field moves, idle too
        (tmp_path / "stat").write_text("\n".join(["cpu  " + " ".join(map(str, ticks)), *lines[1:]]) + "\n")
        readings.append((collector.sample_tracked()[0], as_psutil_reads(tmp_path, psutil.cpu_times)))
    for (value, times), (_, before) in zip(readings[1:], readings[:-1], strict=True):
        busy = sum(times) - times.idle - times.iowait - (sum(before) - before.idle - before.iowait)
        assert value == pytest.approx(100 * busy / (sum(times) - sum(before)), rel=1e-9)
    collector.close()


def test_unreadable_proc_files_give_no_tracked_reading(tmp_path: Path) -> None:
    cpu, memory = CpuCollector(), MemoryCollector(swap=False)
    cpu._stat = ProcFile(str(tmp_path / "stat"))  # no such file: the kernel gives none
    memory._meminfo = ProcFile(str(tmp_path / "meminfo"))
    assert math.isnan(cpu.sample_tracked()[0]) and math.isnan(memory.sample_tracked()[0])
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\n")  # no MemFree: not parsed
    assert math.isnan(memory.sample_tracked()[0])
    cpu.close()
    memory.close()


def test_tracked_process_readings_are_psutils() -> None:
    proc = psutil.Process()
    collector = ProcessCollector(proc.pid)
    proc.cpu_percent(interval=None)  # the same window, give or take the two calls
    _spin(0.3)
    cpu, rss = collector.sample_tracked()
    assert cpu == pytest.approx(proc.cpu_percent(interval=None), abs=10)  # percent of one core
    assert rss * 2**20 == pytest.approx(proc.memory_info().rss, abs=2**20)
    collector.close()


def test_tracked_reading_of_a_vanished_process_is_missing() -> None:
    proc = psutil.Popen(["sleep", "30"])
    collector = ProcessCollector(proc.pid)
    proc.kill()
    proc.wait()
    assert all(math.isnan(v) for v in collector.sample_tracked())


# --------------------------------------------------------------------------- end to end


def test_a_spike_while_the_step_stands_still_shows_at_the_next_step() -> None:
    """An evaluation: the step stands still, memory spikes and falls back; the
    records taken meanwhile are dropped, and the next logged one carries the peak."""
    step = [1]
    sink = Recorder()
    monitor = sampler.ResourceMonitor(
        **{**FAST, "interval_seconds": 0.3},
        inner_rate_hz=50,
        sink=sink,
        age_source=lambda: step[0],
        categories=["process"],
        postmortem_dir=None,
    )
    with monitor:
        wait_for(lambda: sink.values(PEAK), what="a first record")
        before = monitor.stats()["records_dropped"]
        spike = np.ones(256 * 2**20 // 8)  # 256 MiB, touched
        wait_for(
            lambda: monitor.stats()["records_dropped"] >= before + 2, what="records dropped in the spike"
        )
        del spike
        dropped = monitor.stats()["records_dropped"]
        wait_for(lambda: monitor.stats()["records_dropped"] > dropped, what="a record after the spike")
        step[0] = 2
        wait_for(lambda: 2 in sink.steps(PEAK), what="the next step")
        step[0] = 3
        wait_for(lambda: 3 in sink.steps(PEAK), what="the step after")
    at = sink.steps(PEAK).index(2)
    baseline = sink.values(RSS)[0]
    assert sink.values(PEAK)[at] > baseline + 200
    # Step 2 was logged with the spike: the backend said so, and step 3 does not carry it again.
    assert sink.values(PEAK)[sink.steps(PEAK).index(3)] < baseline + 100
    assert sink.values(RSS)[sink.steps(RSS).index(2)] < baseline + 100  # the instant reading missed it
    assert baseline < sink.values(MEAN)[sink.steps(MEAN).index(2)] < sink.values(PEAK)[at]


def test_peaks_are_logged_with_their_names() -> None:
    sink = Recorder()
    with sampler.ResourceMonitor(
        **FAST, sink=sink, step_source="seconds", categories=["cpu", "memory", "process"], postmortem_dir=None
    ) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= 2, what="two records")
    assert {
        "resource/cpu/utilization_percent_peak",
        "resource/cpu/utilization_percent_mean",
        "resource/memory/system_utilization_percent_peak",
        "resource/process/cpu_utilization_percent_peak",
        "resource/process/cpu_utilization_percent_mean",
        PEAK,
        MEAN,
    } <= sink.names()
    assert "resource/memory/system_utilization_percent_mean" not in sink.names()


def test_a_process_being_torn_down_reads_no_memory() -> None:
    """A killed process's RSS reads 0 while its memory is freed: no reading, not 0 MB."""
    assert math.isnan(process._memory_mb(0)) and math.isnan(process._memory_mb(None))
    assert process._memory_mb(3 * 2**20) == 3.0


def test_a_peak_is_never_below_the_record_s_own_reading() -> None:
    tracker = PeakTracker([Tracked()], 8)
    tracker.add([1.0, 2.0])
    tracker.include([5.0, math.nan])  # the record's reading: higher than any inner one for a
    assert tracker.close(0, 0) == [5.0, 2.0, 2.0]  # the mean stays the inner readings'


# --------------------------------------------------------------------------- the kernel's high-water marks

SPIKER = """
import sys
print("ready", flush=True)
for line in sys.stdin:
    block = bytearray(SIZE)
    block[::4096] = b"\\x01" * len(range(0, SIZE, 4096))  # every page touched: resident
    del block  # freed at once: the spike lasts a few ms
    print("spiked", flush=True)
"""
SPIKE_MB = 300
MiB = 1024**2


@pytest.fixture
def spiker() -> Iterator[subprocess.Popen[str]]:
    """A process that, for each line it reads, holds SPIKE_MB MiB resident for a few ms."""
    program = SPIKER.replace("SIZE", str(SPIKE_MB * MiB))
    proc = subprocess.Popen(
        [sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()


def spike(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "spiked\n"


def test_a_spike_shorter_than_the_inner_period_is_caught_by_the_rss_high_water_mark(
    spiker: subprocess.Popen[str],
) -> None:
    collector = ProcessCollector(spiker.pid)
    rss = collector.tracked.index(process.RSS)
    base = collector.sample()[collector.names.index(process.RSS)]
    assert math.isnan(collector.marks()[rss])  # nothing rose since the collector was made
    polled = []
    for _ in range(3):  # an inner rate of 10 Hz around one spike
        polled.append(collector.sample_tracked()[rss])
        spike(spiker)
        time.sleep(0.1)
    collector.sample()  # the record: it reads the mark, as the child's does
    mark = collector.marks()[rss]
    print(f"base {base:.0f} MiB, polled peak {max(polled):.0f} MiB, high-water mark {mark:.0f} MiB")
    assert mark >= base + 0.95 * SPIKE_MB and mark >= max(polled)
    assert max(polled) < base + 0.5 * SPIKE_MB  # polling, however fast, read before or after it
    collector.sample()
    assert math.isnan(collector.marks()[rss])  # no new spike: the mark did not rise


def test_the_child_folds_the_marks_into_the_records_peak(spiker: subprocess.Popen[str]) -> None:
    collector = ProcessCollector(spiker.pid)
    tracker = PeakTracker([collector], 4)
    tracker.add(collector.sample_tracked())
    spike(spiker)
    values = collector.sample()
    tracker.include([values[collector.names.index(name)] for name in collector.tracked])
    tracker.include(collector.marks())
    fields = dict(zip(tracker.names, tracker.close(0, 0), strict=True))
    assert fields[process.RSS + "_peak"] >= values[collector.names.index(process.RSS)] + 0.95 * SPIKE_MB
    # The mean is the polled readings' alone: a mark is no reading.
    assert fields[process.RSS + "_mean"] < values[collector.names.index(process.RSS)] + 0.5 * SPIKE_MB


@pytest.mark.skipif(cgroup_skip_reason("memory") is not None, reason=str(cgroup_skip_reason("memory")))
def test_a_container_spike_is_caught_by_the_cgroups_high_water_mark(spiker: subprocess.Popen[str]) -> None:
    with memory_cgroup(4 * 1024 * MiB) as cgroup:
        cgroup.add(spiker.pid)
        collector = ContainerCollector.open(spiker.pid)
        assert collector is not None
        used = collector.names.index("resource/container/memory_used_mb")
        base = collector.sample()[used]
        polled = collector.sample_tracked()[0]
        spike(spiker)
        mark = collector.marks()[0]
        print(f"cgroup: base {base:.0f} MiB, polled {polled:.0f} MiB, high-water mark {mark:.0f} MiB")
        assert mark >= base + 0.95 * SPIKE_MB
        assert math.isnan(collector.marks()[0])
        spiker.kill()  # out of the cgroup before it goes
        spiker.wait()


def test_a_records_peak_carries_a_spike_between_its_inner_readings(spiker: subprocess.Popen[str]) -> None:
    """Through the real child: the record after a spike peaks at it, whenever the readings fell."""
    sink = Recorder()
    peak = process.RSS + "_peak"
    with sampler.ResourceMonitor(
        categories=["process"], sink=sink, pid=spiker.pid, step_source="seconds", inner_rate_hz=1, **FAST
    ):
        wait_for(lambda: len(sink.values(peak)) >= 2, what="two records")
        base = max(sink.values(process.RSS))
        spike(spiker)
        wait_for(
            lambda: max(sink.values(peak)) >= base + 0.95 * SPIKE_MB, what="the spike in a record's peak"
        )
