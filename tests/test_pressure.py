"""The pressure collector: this kernel's PSI under real CPU starvation and real fsync I/O, a real
cgroup v2 made for the test, and fake /proc and cgroup trees for the absence and parsing cases."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import run_monitor, wait_for

from sampler import catalogue
from sampler.collectors import Sources, build_collector, pressure
from sampler.collectors.pressure import PressureCollector

SYSTEM = (
    "resource/pressure/cpu_some_percent",
    "resource/pressure/memory_some_percent",
    "resource/pressure/memory_full_percent",
    "resource/pressure/io_some_percent",
    "resource/pressure/io_full_percent",
)
CGROUP = (
    "resource/pressure/cgroup_cpu_some_percent",
    "resource/pressure/cgroup_memory_some_percent",
    "resource/pressure/cgroup_memory_full_percent",
    "resource/pressure/cgroup_io_some_percent",
    "resource/pressure/cgroup_io_full_percent",
)
CPU_SOME = "resource/pressure/cpu_some_percent"
IO_SOME = "resource/pressure/io_some_percent"
CGROUP_CPU_SOME = "resource/pressure/cgroup_cpu_some_percent"
PID = 4242
"""The process of the fake trees."""
WINDOW_SECONDS = 1.0
"""A measured window: a second of many scheduler switches, and short enough for a test."""
BUSY = "while 1: pass"
SLEEP = "import time; time.sleep(600)"
FSYNC_LOOP = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
block = os.urandom(1 << 16)
while True:
    os.write(fd, block)
    os.fsync(fd)
"""

HAS_PSI = Path("/proc/pressure/cpu").is_file()
needs_psi = pytest.mark.skipif(not HAS_PSI, reason="this kernel has no PSI (/proc/pressure)")


# Helpers: real processes, pinned; windows of real time; real cgroups.


@contextlib.contextmanager
def processes(count: int, code: str, *args: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` Python processes running ``code``, killed by pid when done."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            started.append(subprocess.Popen([sys.executable, "-c", code, *args]))
        yield started
    finally:
        for process in started:
            process.kill()
            process.wait()


@contextlib.contextmanager
def pinned_to_one_core() -> Iterator[int]:
    """This process on one of its CPUs (what it starts inherits it); its affinity back after."""
    before = os.sched_getaffinity(0)
    core = max(before)
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, before)


def spinning(process: subprocess.Popen[bytes], cpu_seconds: float = 0.2) -> bool:
    """The process is past its start-up and has burnt ``cpu_seconds`` of user time."""
    return psutil.Process(process.pid).cpu_times().user >= cpu_seconds


Window = dict[str, float]
"""A sample's readings by name."""


def window(collector: PressureCollector, seconds: float = WINDOW_SECONDS) -> Window:
    """The readings over a window of ``seconds``: a sample to open it, one to close it."""
    collector.sample()
    start = time.monotonic()
    wait_for(lambda: time.monotonic() - start >= seconds, what="the window to pass")
    return dict(zip(collector.names, collector.sample(), strict=True))


def windows_until(collector: PressureCollector, done: Callable[[Window], bool]) -> list[Window]:
    """Windows until one satisfies ``done`` (60 s at most): all of them."""
    seen: list[Window] = []

    def measured() -> bool:
        seen.append(window(collector))
        return done(seen[-1])

    try:
        wait_for(measured, timeout=60.0, what="a window that shows it")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; windows: {seen}") from None
    return seen


def shown(windows: list[Window], name: str) -> list[float]:
    return [round(w[name], 1) for w in windows]


def starved(share: float, quiet: float) -> bool:
    """A CPU-starved window: at least a third of the way from the quiet share to 100 %. On the
    pinned core some task always waits; the share is under 100 % only as far as other cores are
    busy without waiting (the kernel weighs each core by its non-idle time)."""
    return share >= quiet + max(5.0, (100.0 - quiet) / 3)


def waiting_on_io(share: float, quiet: float) -> bool:
    """A window of fsync waits: three times the quiet share and 3 points more. One writer on this
    VM's virtio disk stalls only 5 to 30 % of the time (it copies its block in between, and the
    device answers fast), against under 1 % quiet."""
    return share >= 3 * quiet + 3.0


def v2_mount() -> Path | None:
    """Where the cgroup2 filesystem is mounted, from /proc/self/mountinfo; None without one."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        if tail.split()[0] == "cgroup2":
            return Path(fields.split()[4])
    return None


@contextlib.contextmanager
def v2_cgroup() -> Iterator[Path]:
    """A new cgroup v2 under the mount root (no controller needed: PSI is in every cgroup);
    what is left in it goes back to the root and it is removed after. Skips where it cannot."""
    mount = v2_mount()
    if os.geteuid() != 0 or mount is None:
        pytest.skip("making a cgroup v2 needs root and a cgroup2 mount")
    path = mount / f"wl-test-{uuid.uuid4().hex[:12]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup v2 here: {exc}")

    def removed() -> bool:
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                (mount / "cgroup.procs").write_text(pid)
        try:
            path.rmdir()
        except OSError:  # the kernel still counts a process that is exiting
            return False
        return True

    try:
        if not (path / "cpu.pressure").is_file():
            pytest.skip("this kernel's cgroups v2 have no pressure files")
        yield path
    finally:
        wait_for(removed, what=f"{path} to be removed")


def own_cgroup_names() -> tuple[str, ...]:
    """The cgroup signals this process should have: its cgroup v2 directory (read independently
    of the collector) has pressure files and is not the host's root cgroup, or none."""
    mount = v2_mount()
    lines = [line for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::")]
    if mount is None or not lines:
        return ()
    path = lines[0].removeprefix("0::").strip("/")
    if not path and os.readlink("/proc/self/ns/cgroup") == "cgroup:[4026531835]":
        return ()  # the host's root cgroup: its pressure is the system's
    return CGROUP if (mount / path / "cpu.pressure").is_file() else ()


# The real kernel.


@needs_psi
def test_this_kernel_has_a_collector_and_the_first_sample_no_window() -> None:
    collector = build_collector("pressure", Sources(disk_path=os.sep, pid=os.getpid(), nvml_module="x"))
    assert isinstance(collector, PressureCollector)
    assert collector.names == SYSTEM + own_cgroup_names()
    assert collector.tracked == () and collector.averaged == ()
    first = collector.sample()
    assert len(first) == len(collector.names) and all(math.isnan(v) for v in first)
    for _ in range(3):
        values = collector.sample()
        assert all(0.0 <= v <= 100.0 for v in values), dict(zip(collector.names, values, strict=True))


@needs_psi
def test_a_monitor_logs_the_pressure_through_its_child() -> None:
    sink, _ = run_monitor(records=3, categories=["pressure"])
    expected = set(SYSTEM + own_cgroup_names())
    assert sink.names() - {"resource/progress/steps_per_second"} == expected
    for name in expected:
        assert all(0.0 <= value <= 100.0 for value in sink.values(name)), name


@needs_psi
@pytest.mark.usefixtures("whole_machine")
def test_cpu_pressure_rises_when_tasks_wait_for_one_core() -> None:
    collector = PressureCollector.open(os.getpid())
    assert collector is not None
    with pinned_to_one_core() as core:
        quiet = window(collector)[CPU_SOME]
        if quiet >= 95.0:  # other runs saturate the machine (seen beside a second suite and builds)
            pytest.skip(f"every window is CPU-starved already (quiet: {quiet:.1f} %): no rise can show")
        with processes(3, BUSY) as busy:
            assert all(os.sched_getaffinity(p.pid) == {core} for p in busy)
            wait_for(lambda: all(spinning(p) for p in busy), timeout=60, what="the busy loops to spin")
            starving = windows_until(collector, lambda w: starved(w[CPU_SOME], quiet))
    print(f"cpu some: quiet window {quiet:.1f} %, starved windows {shown(starving, CPU_SOME)} %")


@needs_psi
@pytest.mark.usefixtures("whole_machine")
def test_io_pressure_rises_while_a_process_waits_on_fsync(tmp_path: Path) -> None:
    collector = PressureCollector.open(os.getpid())
    assert collector is not None
    quiet = window(collector)[IO_SOME]
    with processes(1, FSYNC_LOOP, str(tmp_path / "synced")) as (writer,):
        wait_for(lambda: (tmp_path / "synced").exists(), timeout=60, what="the writer to start")
        assert writer.poll() is None
        syncing = windows_until(collector, lambda w: waiting_on_io(w[IO_SOME], quiet))
    print(f"io some: quiet window {quiet:.1f} %, fsync windows {shown(syncing, IO_SOME)} %")


@needs_psi
@pytest.mark.usefixtures("whole_machine")
def test_cgroup_cpu_pressure_is_the_backends_own_not_the_hosts() -> None:
    with v2_cgroup() as cgroup, processes(1, SLEEP) as (sleeper,):
        (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        collector = PressureCollector.open(sleeper.pid)
        assert collector is not None and collector.names == SYSTEM + CGROUP
        with pinned_to_one_core(), processes(2, BUSY) as busy:
            wait_for(lambda: all(spinning(p) for p in busy), timeout=60, what="the busy loops to spin")
            # The host waits for a CPU; the cgroup, its one task asleep, does not.
            outside = windows_until(collector, lambda w: starved(w[CPU_SOME], w[CGROUP_CPU_SOME]))
            quiet = outside[-1][CGROUP_CPU_SOME]
            for process in busy:
                (cgroup / "cgroup.procs").write_text(str(process.pid))
            inside = windows_until(collector, lambda w: starved(w[CGROUP_CPU_SOME], quiet))
    print(
        f"busy loops outside the cgroup: host {shown(outside, CPU_SOME)} %, cgroup "
        f"{shown(outside, CGROUP_CPU_SOME)} %; inside: cgroup {shown(inside, CGROUP_CPU_SOME)} %"
    )


@needs_psi
def test_a_cgroup_with_pressure_turned_off_has_no_cgroup_signals() -> None:
    with v2_cgroup() as cgroup, processes(1, SLEEP) as (sleeper,):
        if not (cgroup / "cgroup.pressure").is_file():
            pytest.skip("this kernel cannot turn PSI off per cgroup (cgroup.pressure, Linux 6.1+)")
        (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        (cgroup / "cgroup.pressure").write_text("0")
        assert not (cgroup / "cpu.pressure").exists()  # the kernel hides the files
        collector = PressureCollector.open(sleeper.pid)
        assert collector is not None and collector.names == SYSTEM


def test_the_system_signals_are_exported_once_per_host_and_the_cgroups_per_rank() -> None:
    for name in SYSTEM + CGROUP:
        signal = catalogue.entry(name)
        assert signal.host_wide == (name in SYSTEM), name
        assert signal.unit == "%" and signal.kind == catalogue.GAUGE and not signal.variants, name
        assert signal.metric == name.removeprefix("resource/").replace("/", "_").replace("_percent", "_ratio")
    assert pressure.SYSTEM_NAMES == SYSTEM and pressure.CGROUP_NAMES == CGROUP
    assert catalogue.DEFAULT_CATEGORIES.index("pressure") == 8  # its quarantine bit, after container's


# Fake trees: where the kernel has no PSI, and what a reading makes of the counters.


def psi(some: int, full: int | None = None) -> str:
    """A pressure file's text with these ``total=`` counters (µs)."""
    text = f"some avg10=1.00 avg60=2.00 avg300=3.00 total={some}\n"
    return text if full is None else text + f"full avg10=0.50 avg60=0.25 avg300=0.12 total={full}\n"


def fake_tree(
    root: Path,
    *,
    system: bool = True,
    cgroup_file: str | None = "0::/a/b\n",
    mount: str | None = "unified",
    cgroup_pressure: tuple[str, ...] = ("cpu", "memory", "io"),
) -> tuple[str, str]:
    """A /proc (``system``: with /proc/pressure; ``cgroup_file``: process PID's cgroup file, None
    for a process gone) and a cgroup root with the v2 mount at ``mount`` (None: cgroup v1 only)
    holding /a/b's pressure files of ``cgroup_pressure``: (proc_root, cgroup_root)."""
    proc, cgroups = root / "proc", root / "cgroup"
    (proc / str(PID)).mkdir(parents=True)
    cgroups.mkdir()
    if system:
        (proc / "pressure").mkdir()
        write_totals(proc / "pressure", "{}", [0, 0, 0, 0, 0])
    if cgroup_file is not None:
        (proc / str(PID) / "cgroup").write_text(cgroup_file)
    if mount is not None:
        (cgroups / mount).mkdir(exist_ok=True)
        (cgroups / mount / "cgroup.controllers").write_text("cpu io memory\n")
        level = cgroups / mount / "a" / "b"
        level.mkdir(parents=True)
        for resource in cgroup_pressure:
            (level / f"{resource}.pressure").write_text(psi(0, 0))
    return str(proc), str(cgroups)


def write_totals(directory: Path, pattern: str, totals: list[int]) -> None:
    """cpu (some), memory and io (some, full) counters into ``directory``'s three files."""
    cpu, memory_some, memory_full, io_some, io_full = totals
    (directory / pattern.format("cpu")).write_text(psi(cpu))
    (directory / pattern.format("memory")).write_text(psi(memory_some, memory_full))
    (directory / pattern.format("io")).write_text(psi(io_some, io_full))


def open_fake(root: Path, **layout: Any) -> PressureCollector | None:
    proc_root, cgroup_root = fake_tree(root, **layout)
    return PressureCollector.open(PID, proc_root=proc_root, cgroup_root=cgroup_root)


def test_no_proc_pressure_and_no_cgroup_v2_no_collector(tmp_path: Path) -> None:
    assert open_fake(tmp_path, system=False, mount=None) is None


def test_no_proc_pressure_but_a_cgroup_with_it_reads_the_cgroup(tmp_path: Path) -> None:
    collector = open_fake(tmp_path, system=False)
    assert collector is not None and collector.names == CGROUP


@pytest.mark.parametrize("mount", ["", "unified"])
def test_the_cgroup_is_found_under_the_v2_mount_at_the_root_or_at_unified(tmp_path: Path, mount: str) -> None:
    collector = open_fake(tmp_path, mount=mount)
    assert collector is not None and collector.names == SYSTEM + CGROUP


@pytest.mark.parametrize(
    "layout",
    [
        {"cgroup_file": "4:memory:/a/b\n1:cpu:/a/b\n"},  # cgroup v1 only: no 0:: line
        {"mount": None},  # a 0:: line but no v2 mount (no cgroup.controllers)
        {"cgroup_file": None},  # the process is gone
        {"cgroup_file": "0::/elsewhere\n"},  # its cgroup is not under the mount
        {"cgroup_pressure": ()},  # a v2 cgroup without PSI files
    ],
    ids=["v1-only", "no-v2-mount", "process-gone", "not-under-the-mount", "no-cgroup-psi"],
)
def test_without_a_readable_v2_cgroup_only_the_system_signals(tmp_path: Path, layout: dict[str, Any]) -> None:
    collector = open_fake(tmp_path, **layout)
    assert collector is not None and collector.names == SYSTEM


def test_a_missing_file_leaves_out_its_signals_alone(tmp_path: Path) -> None:
    proc_root, cgroup_root = fake_tree(tmp_path, cgroup_pressure=("cpu", "memory"))
    Path(proc_root, "pressure", "memory").unlink()
    collector = PressureCollector.open(PID, proc_root=proc_root, cgroup_root=cgroup_root)
    assert collector is not None
    assert collector.names == (
        "resource/pressure/cpu_some_percent",
        "resource/pressure/io_some_percent",
        "resource/pressure/io_full_percent",
        "resource/pressure/cgroup_cpu_some_percent",
        "resource/pressure/cgroup_memory_some_percent",
        "resource/pressure/cgroup_memory_full_percent",
    )


def eopnotsupp_under(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a pressure file under ``root`` fails as under psi=0 (the files are there, a read
    fails with EOPNOTSUPP), which no file of a tmp tree can do: the collector's one read is patched."""
    real = pressure._read

    def read(path: str) -> bytes:
        if Path(path).is_relative_to(root):
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), path)
        return real(path)

    monkeypatch.setattr(pressure, "_read", read)


def test_psi_off_reads_eopnotsupp_and_no_collector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc_root, cgroup_root = fake_tree(tmp_path)
    eopnotsupp_under(tmp_path, monkeypatch)
    assert PressureCollector.open(PID, proc_root=proc_root, cgroup_root=cgroup_root) is None


def test_psi_off_in_the_cgroup_only_leaves_the_system_signals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc_root, cgroup_root = fake_tree(tmp_path)
    eopnotsupp_under(Path(cgroup_root), monkeypatch)
    collector = PressureCollector.open(PID, proc_root=proc_root, cgroup_root=cgroup_root)
    assert collector is not None and collector.names == SYSTEM


class Clocked:
    """Samples of a fake tree's collector with bounds on when each file was read."""

    def __init__(self, root: Path) -> None:
        proc_root, cgroup_root = fake_tree(root)
        self.system = Path(proc_root, "pressure")
        self.cgroup = Path(cgroup_root, "unified", "a", "b")
        collector = PressureCollector.open(PID, proc_root=proc_root, cgroup_root=cgroup_root)
        assert collector is not None and collector.names == SYSTEM + CGROUP
        self.collector = collector
        self.spans: list[tuple[int, int]] = []
        """(monotonic ns before, after) each sample."""

    def write(self, system: list[int], cgroup: list[int]) -> None:
        write_totals(self.system, "{}", system)
        write_totals(self.cgroup, "{}.pressure", cgroup)

    def sample(self, after_seconds: float = 0.05) -> dict[str, float]:
        """A sample at least ``after_seconds`` after the previous one (a window that long)."""
        if self.spans:
            since = self.spans[-1][1]
            wait_for(lambda: time.monotonic_ns() - since >= after_seconds * 1e9, what="the window")
        before = time.monotonic_ns()
        values = self.collector.sample()
        self.spans.append((before, time.monotonic_ns()))
        return dict(zip(self.collector.names, values, strict=True))

    def bounds(self, stalled_us: int) -> tuple[float, float]:
        """The least and most share (%) ``stalled_us`` can be over the last window."""
        (before_1, after_1), (before_2, after_2) = self.spans[-2:]
        longest_us, shortest_us = (after_2 - before_1) / 1000, (before_2 - after_1) / 1000
        return stalled_us / longest_us * 100, stalled_us / shortest_us * 100


def test_each_share_is_its_counters_growth_over_the_wall_time(tmp_path: Path) -> None:
    clocked = Clocked(tmp_path)
    start = [10**9 + 10**6 * k for k in range(10)]
    clocked.write(start[:5], start[5:])
    assert all(math.isnan(v) for v in clocked.sample().values())  # no window yet
    stalled = [1000 * (k + 1) for k in range(10)]  # µs, a different one per signal: a swap shows
    ended = [a + d for a, d in zip(start, stalled, strict=True)]
    clocked.write(ended[:5], ended[5:])
    values = clocked.sample()
    for name, stall in zip(SYSTEM + CGROUP, stalled, strict=True):
        low, high = clocked.bounds(stall)
        assert low <= values[name] <= high, (name, values[name], low, high)
    # Standing counters: nothing stalled.
    assert set(clocked.sample().values()) == {0.0}


def test_a_counter_that_goes_backwards_has_no_share_for_that_sample(tmp_path: Path) -> None:
    clocked = Clocked(tmp_path)
    clocked.write([5000] * 5, [5000] * 5)
    clocked.sample()
    clocked.write([6000, 6000, 100, 6000, 6000], [6000] * 4 + [100])  # memory full, cgroup io full: reset
    values = clocked.sample()
    nan = {name for name, value in values.items() if math.isnan(value)}
    assert nan == {"resource/pressure/memory_full_percent", "resource/pressure/cgroup_io_full_percent"}
    assert all(0.0 < value <= 100.0 for name, value in values.items() if name not in nan)
    # From the new value on, it has a window again.
    clocked.write([6000, 6000, 200, 6000, 6000], [6000] * 4 + [200])
    values = clocked.sample()
    assert (
        values["resource/pressure/memory_full_percent"] > 0
        and values["resource/pressure/cgroup_io_full_percent"] > 0
    )


def test_a_window_fully_stalled_is_100_percent_however_the_clocks_fall(tmp_path: Path) -> None:
    clocked = Clocked(tmp_path)
    clocked.write([0] * 5, [0] * 5)
    clocked.sample()
    clocked.write([10**9] * 5, [10**9] * 5)  # 1000 s stalled in a window of a fraction of one
    assert set(clocked.sample().values()) == {100.0}


@pytest.mark.parametrize(
    "broken",
    [None, "some avg10=0.00 avg60=0.00 avg300=0.00\n", "some total=12x\n", "\xff\xfe"],
    ids=["removed", "no-total", "not-a-number", "not-text"],
)
def test_a_file_that_fails_after_open_skips_its_readings_then_recovers(
    tmp_path: Path, broken: str | None
) -> None:
    clocked = Clocked(tmp_path)
    clocked.write([1000] * 5, [1000] * 5)
    clocked.sample()
    memory = clocked.system / "memory"
    if broken is None:
        memory.unlink()
    else:
        memory.write_bytes(broken.encode("latin-1"))
    values = clocked.sample()
    nan = {name for name, value in values.items() if math.isnan(value)}
    assert nan == {"resource/pressure/memory_some_percent", "resource/pressure/memory_full_percent"}
    clocked.write([2000] * 5, [2000] * 5)
    assert math.isnan(
        clocked.sample()["resource/pressure/memory_some_percent"]
    )  # failed last time: no window
    clocked.write([3000] * 5, [3000] * 5)
    assert clocked.sample()["resource/pressure/memory_some_percent"] > 0


@pytest.mark.parametrize(
    ("namespace", "has_cgroup"), [("cgroup:[4026531835]", False), ("cgroup:[4026532999]", True)]
)
def test_the_hosts_root_cgroup_repeats_the_system_but_a_containers_root_is_its_own(
    tmp_path: Path, namespace: str, has_cgroup: bool
) -> None:
    """At the root of the host's own cgroup namespace the cgroup's pressure is the system's again;
    at the root of a container's namespace it is the container's."""
    proc_root, cgroup_root = fake_tree(tmp_path, cgroup_file="0::/\n")
    write_totals(Path(cgroup_root, "unified"), "{}.pressure", [0, 0, 0, 0, 0])
    (Path(proc_root, str(PID), "ns")).mkdir()
    Path(proc_root, str(PID), "ns", "cgroup").symlink_to(namespace)
    collector = PressureCollector.open(PID, proc_root=proc_root, cgroup_root=cgroup_root)
    assert collector is not None and collector.names == SYSTEM + (CGROUP if has_cgroup else ())
