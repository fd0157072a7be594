"""The record's readings parsed from /proc through held descriptors give psutil's values, read
by psutil from the same files (``psutil.PROCFS_PATH``), and no reading where a file is gone,
malformed, or belongs to another process than the one the collector was made for."""

from __future__ import annotations

import math
import os
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import as_psutil_reads, wait_for

from sampler import catalogue
from sampler.catalogue import MIB
from sampler.collectors import host
from sampler.collectors.base import Collector
from sampler.collectors.host import CpuCollector, DiskCollector, MemoryCollector, NetworkCollector, ProcFile
from sampler.collectors.process import ProcessCollector


def values(collector: Collector) -> dict[str, float]:
    """One ``sample()`` by field name."""
    return dict(zip(collector.names, collector.sample(), strict=True))


def test_a_held_file_is_read_whole_past_its_first_read(tmp_path: Path) -> None:
    text = b"".join(b"line %05d\n" % n for n in range(1500))  # 16.5 KB: /proc/diskstats of many disks
    (tmp_path / "big").write_bytes(text)
    held = ProcFile(str(tmp_path / "big"))
    assert held.read() == text and held.read() == text
    held.close()


# --------------------------------------------------------------------------- cpu


def test_the_records_cpu_is_psutils_cpu_percent_on_the_same_file(tmp_path: Path) -> None:
    lines = Path("/proc/stat").read_text().splitlines()
    ticks = [int(n) for n in lines[0].split()[1:11]]

    def write(moved: list[int]) -> None:
        for i, n in enumerate(moved):
            ticks[i] += n
        (tmp_path / "stat").write_text("\n".join(["cpu  " + " ".join(map(str, ticks)), *lines[1:]]) + "\n")

    collector = CpuCollector()
    collector._stat = ProcFile(str(tmp_path / "stat"))
    write([0] * 10)
    collector.sample()  # the record's window starts at these ticks
    as_psutil_reads(tmp_path, lambda: psutil.cpu_percent(interval=None))  # and psutil's
    steps = [
        [300, 20, 80, 700, 30, 5, 7, 3, 0, 0],
        [300, 20, 80, 700, 30, 5, 7, 3, 120, 15],  # guest time, in user and nice already
        [50, 0, 10, 200, 0, 0, 0, -40, 0, 0],  # steal going back: a change of 0, not below
        [0] * 10,  # nothing moved: 0 %, as psutil says
    ]
    for moved in steps:
        write(moved)
        value = values(collector)[catalogue.CPU_UTILIZATION.name]
        assert value == as_psutil_reads(tmp_path, lambda: psutil.cpu_percent(interval=None))
    collector.close()


# --------------------------------------------------------------------------- memory


def swap_files(procfs: Path, available_kb: int) -> None:
    """This machine's /proc/meminfo and /proc/vmstat under ``procfs``, with swap in use and
    swapped pages, and ``available_kb`` as MemAvailable."""
    meminfo = []
    for line in Path("/proc/meminfo").read_text().splitlines():
        key = line.split(":")[0]
        value = {"MemAvailable": available_kb, "SwapTotal": 2_000_000, "SwapFree": 1_250_000}.get(key)
        meminfo.append(line if value is None else f"{key}: {value} kB")
    (procfs / "meminfo").write_text("\n".join(meminfo) + "\n")
    vmstat = []
    for line in Path("/proc/vmstat").read_text().splitlines():
        key = line.split()[0]
        vmstat.append({"pswpin": "pswpin 123457", "pswpout": "pswpout 98765"}.get(key, line))
    (procfs / "vmstat").write_text("\n".join(vmstat) + "\n")


def memory_reader(procfs: Path) -> MemoryCollector:
    collector = MemoryCollector(swap=True)
    collector._meminfo = ProcFile(str(procfs / "meminfo"))
    collector._vmstat = ProcFile(str(procfs / "vmstat"))
    return collector


def test_the_records_memory_and_swap_are_psutils_on_the_same_files(tmp_path: Path) -> None:
    total = int(Path("/proc/meminfo").read_text().split()[1])
    swap_files(tmp_path, total // 3)
    collector = memory_reader(tmp_path)
    read = values(collector)
    memory = as_psutil_reads(tmp_path, psutil.virtual_memory)
    swap = as_psutil_reads(tmp_path, psutil.swap_memory)
    assert read[catalogue.MEMORY_USED.name] == memory.percent
    assert read[catalogue.SWAP_USED.name] == swap.used / MIB
    assert read[catalogue.SWAPPED_IN.name] == swap.sin / MIB
    assert read[catalogue.SWAPPED_OUT.name] == swap.sout / MIB
    collector.close()


def test_a_record_shares_the_meminfo_read_its_tracked_reading_made(tmp_path: Path) -> None:
    total = int(Path("/proc/meminfo").read_text().split()[1])
    swap_files(tmp_path, total // 2)
    collector = memory_reader(tmp_path)
    (tracked,) = collector.sample_tracked()
    swap_files(tmp_path, total // 4)  # the file changes between the two reads of one wake-up
    assert values(collector)[catalogue.MEMORY_USED.name] == tracked == 50.0
    assert values(collector)[catalogue.MEMORY_USED.name] == 75.0  # no tracked read since: the file now
    collector.close()


def test_meminfo_without_memfree_gives_no_reading(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\n")
    collector = MemoryCollector(swap=False)
    collector._meminfo = ProcFile(str(tmp_path / "meminfo"))
    assert math.isnan(collector.sample_tracked()[0]) and math.isnan(collector.sample()[0])
    collector.close()


# --------------------------------------------------------------------------- process


@pytest.fixture
def procfs(tmp_path: Path) -> Iterator[Path]:
    """A /proc under ``tmp_path`` with this process's files, for psutil and the collector."""
    pid = str(os.getpid())
    (tmp_path / pid).mkdir()
    for name in ("status", "schedstat"):
        (tmp_path / pid / name).write_bytes(Path(f"/proc/self/{name}").read_bytes())
    (tmp_path / "stat").write_bytes(Path("/proc/stat").read_bytes())  # psutil's boot time
    swap_files(tmp_path, int(Path("/proc/meminfo").read_text().split()[1]) // 3)
    yield tmp_path


def write_process(procfs: Path, utime: int, stime: int, rss_pages: int) -> None:
    """``stat`` and ``statm`` of this process under ``procfs``, with the given ticks and RSS."""
    real = Path("/proc/self/stat").read_text()
    head, _, rest = real.rpartition(")")
    fields = rest.split()
    fields[11], fields[12], fields[21] = str(utime), str(stime), str(rss_pages)
    pid = str(os.getpid())
    (procfs / pid / "stat").write_text(f"{head}) {' '.join(fields)}\n")
    statm = Path("/proc/self/statm").read_text().split()
    statm[1] = str(rss_pages)
    (procfs / pid / "statm").write_text(" ".join(statm) + "\n")


def test_the_records_process_readings_are_psutils_on_the_same_files(
    procfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(host, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(psutil, "_timer", lambda: clock[0])
    write_process(procfs, 1000, 400, 25_000)
    collector = ProcessCollector(os.getpid())
    pid = procfs / str(os.getpid())
    collector._stat = ProcFile(str(pid / "stat"))
    collector._status = ProcFile(str(pid / "status"))
    collector._schedstat = ProcFile(str(pid / "schedstat"))
    collector._meminfo = ProcFile(str(procfs / "meminfo"))
    collector.sample()  # the record's CPU window starts here
    proc = as_psutil_reads(procfs, psutil.Process)
    as_psutil_reads(procfs, lambda: proc.cpu_percent(interval=None))  # and psutil's
    clock[0] += 2.0
    write_process(procfs, 1000 + 173, 400 + 61, 31_234)
    read = values(collector)
    memory = as_psutil_reads(procfs, psutil.virtual_memory)  # the total psutil's percent divides by
    times = as_psutil_reads(procfs, proc.cpu_times)
    cpu = as_psutil_reads(procfs, lambda: proc.cpu_percent(interval=None))
    assert read[catalogue.PROCESS_CPU.name] == cpu
    assert read[catalogue.PROCESS_CPU_SECONDS.name] == times.user + times.system
    assert read[catalogue.PROCESS_RSS.name] == as_psutil_reads(procfs, proc.memory_info).rss / MIB
    assert read[catalogue.PROCESS_RSS_PERCENT.name] == as_psutil_reads(procfs, proc.memory_percent)
    assert read[catalogue.PROCESS_MEMORY_AVAILABLE.name] == memory.available / MIB
    collector.close()


def test_memory_available_without_memavailable_is_psutils_estimate(procfs: Path) -> None:
    """Kernels before 3.14 give no MemAvailable: psutil estimates it, from the same file."""
    meminfo = procfs / "meminfo"
    lines = [line for line in meminfo.read_text().splitlines() if not line.startswith("MemAvailable:")]
    meminfo.write_text("\n".join(lines) + "\n")
    collector = ProcessCollector(os.getpid())
    collector._meminfo = ProcFile(str(meminfo))
    available = catalogue.PROCESS_MEMORY_AVAILABLE.name
    read = as_psutil_reads(procfs, lambda: values(collector))
    assert read[available] == as_psutil_reads(procfs, psutil.virtual_memory).available / MIB
    meminfo.write_text("MemTotal: 1000000 kB\n")  # no MemFree: no estimate either
    read = values(collector)
    assert math.isnan(read[available]) and read[catalogue.PROCESS_RSS_PERCENT.name] > 0
    collector.close()


def test_a_reused_pid_is_never_read_as_the_backend() -> None:
    """The backend gone, a new process given its pid: the collector made for the backend reads
    nothing, where reading /proc/<pid> by its path would read the newcomer."""
    backend = subprocess.Popen(["sleep", "60"])
    collector = ProcessCollector(backend.pid)
    collector.sample()
    backend.kill()
    backend.wait()
    newcomer = None
    try:
        for _ in range(50):  # other processes on the machine may take the pid first
            try:
                Path("/proc/sys/kernel/ns_last_pid").write_text(str(backend.pid - 1))
            except OSError as exc:
                pytest.skip(f"cannot choose the next pid here: {exc}")
            newcomer = subprocess.Popen(["sleep", "60"])
            if newcomer.pid == backend.pid:
                break
            newcomer.kill()
            newcomer.wait()
        else:
            pytest.skip("the backend's pid was never given again")
        newcomer_runs = lambda: psutil.Process(backend.pid).cmdline() == ["sleep", "60"]  # noqa: E731
        wait_for(newcomer_runs, what="the newcomer to run sleep")
        assert all(math.isnan(v) for v in collector.sample_tracked())
        read = values(collector)
        machine = read.pop(catalogue.PROCESS_MEMORY_AVAILABLE.name)  # the machine's, not the backend's
        assert machine > 0 and all(math.isnan(v) for v in read.values()), read
    finally:
        if newcomer is not None:
            newcomer.kill()
            newcomer.wait()
        collector.close()


def test_a_failed_tracked_read_leaves_no_stale_bytes_for_the_record() -> None:
    """The backend dies between two tracked reads: the record reads nothing of it, not the
    bytes the earlier tracked read left unclaimed."""
    backend = subprocess.Popen(["sleep", "60"])
    collector = ProcessCollector(backend.pid)
    collector.sample_tracked()
    backend.kill()
    backend.wait()
    assert all(math.isnan(v) for v in collector.sample_tracked())
    read = values(collector)
    assert math.isnan(read[catalogue.PROCESS_RSS.name])
    assert math.isnan(read[catalogue.PROCESS_CPU_SECONDS.name])
    collector.close()


def test_a_process_gone_before_its_collector_is_made_raises() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(psutil.NoSuchProcess):
        ProcessCollector(gone.pid)


# --------------------------------------------------------------------------- disk and network


def scaled(line: str, first: int, factor: int) -> str:
    """``line`` with every field from ``first`` on multiplied by ``factor`` (and moved by 1)."""
    fields = line.split()
    return " ".join([*fields[:first], *(str(int(n) * factor + 1) for n in fields[first:])])


def test_disk_io_is_psutils_whole_disks_on_the_same_file(tmp_path: Path) -> None:
    lines = [scaled(line, 3, 7) for line in Path("/proc/diskstats").read_text().splitlines()]
    names = [line.split()[2] for line in lines]
    whole = [name for name in names if Path("/sys/block", name.replace("/", "!")).exists()]
    assert whole, "no whole disk on this machine"
    name = whole[0]  # a partition of it, as a Linux 2.6 kernel writes one: 7 fields
    lines.append(f"259 99 {name}p9 11 22 33 44")
    (tmp_path / "diskstats").write_text("\n".join(lines) + "\n")
    collector = DiskCollector(str(tmp_path))
    collector._diskstats = ProcFile(str(tmp_path / "diskstats"))
    read = values(collector)
    disks = as_psutil_reads(tmp_path, lambda: psutil.disk_io_counters(perdisk=True, nowrap=False))
    assert f"{name}p9" in disks
    assert read[catalogue.DISK_READ.name] == sum(disks[n].read_bytes / MIB for n in whole)
    assert read[catalogue.DISK_WRITTEN.name] == sum(disks[n].write_bytes / MIB for n in whole)
    collector.close()


def test_a_diskstats_line_of_no_known_layout_gives_no_disk_io(tmp_path: Path) -> None:
    (tmp_path / "diskstats").write_text(Path("/proc/diskstats").read_text() + "   8 0 sdz 1 2 3\n")
    collector = DiskCollector(str(tmp_path))
    collector._diskstats = ProcFile(str(tmp_path / "diskstats"))
    read = values(collector)
    assert math.isnan(read[catalogue.DISK_READ.name]) and math.isnan(read[catalogue.DISK_WRITTEN.name])
    assert read[catalogue.DISK_FULL.name] >= 0  # the filesystem's usage is read all the same
    collector.close()


def test_network_bytes_are_psutils_on_the_same_file(tmp_path: Path) -> None:
    lines = Path("/proc/net/dev").read_text().splitlines()
    (tmp_path / "net").mkdir()
    body = [f"{line.split(':')[0]}: {scaled(line.split(':')[1], 0, 13)}" for line in lines[2:]]
    (tmp_path / "net" / "dev").write_text("\n".join([*lines[:2], *body]) + "\n")
    collector = NetworkCollector()
    collector._dev = ProcFile(str(tmp_path / "net" / "dev"))
    read = values(collector)
    nics = as_psutil_reads(tmp_path, lambda: psutil.net_io_counters(pernic=True, nowrap=False))
    assert read[catalogue.NETWORK_SENT.name] == sum(float(n.bytes_sent) for n in nics.values())
    assert read[catalogue.NETWORK_RECEIVED.name] == sum(float(n.bytes_recv) for n in nics.values())
    collector.close()
