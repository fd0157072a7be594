"""The container collector: real cgroup v1 limits on real child processes, and fake cgroup layouts
(v2, joined v1 mounts, containers) built in a temporary directory."""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgroups import cgroup_skip_reason, cpu_cgroup, memory_cgroup
from conftest import wait_for

from sampler.collectors.container import ContainerCollector

MEMORY = (
    "resource/container/memory_limit_mb",
    "resource/container/memory_used_mb",
    "resource/container/memory_used_percent",
)
CPU = (
    "resource/container/cpu_quota_cores",
    "resource/container/cpu_throttled_seconds",
    "resource/container/cpu_throttled_seconds_per_second",
)
MiB = 1024**2
PID = 4242
"""The process of the fake layouts."""

ALLOCATOR = """
import sys
chunks = []
for line in sys.stdin:
    chunks.append(b"\\x01" * (int(line) << 20))  # written, so every page is charged
    print("ok", flush=True)
"""


@contextlib.contextmanager
def child(code: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        process.kill()
        process.communicate()


def allocate(process: subprocess.Popen[str], mib: int) -> str:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(f"{mib}\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def needs(controller: str) -> None:
    reason = cgroup_skip_reason(controller)
    if reason:
        pytest.skip(reason)


def reading(collector: ContainerCollector, values: list[float], name: str) -> float:
    return values[collector.names.index(name)]


# Real cgroups (v1 here), real processes.


def test_real_memory_limit_and_usage() -> None:
    needs("memory")
    with memory_cgroup(256 * MiB) as cgroup, child(ALLOCATOR) as process:
        cgroup.add(process.pid)
        collector = ContainerCollector.open(process.pid)
        assert collector is not None
        assert collector.names[:3] == MEMORY
        assert collector.tracked == ("resource/container/memory_used_mb",)
        before = collector.sample()
        assert reading(collector, before, MEMORY[0]) == 256
        assert allocate(process, 64) == "ok"
        after = collector.sample()
        used = reading(collector, after, MEMORY[1])
        assert used - reading(collector, before, MEMORY[1]) >= 60
        assert reading(collector, after, MEMORY[2]) == pytest.approx(used / 256 * 100)
        assert collector.sample_tracked() == [pytest.approx(used, abs=1)]


def test_real_memory_limit_is_enforced() -> None:
    """What tests/cgroups.py makes is a real limit: allocating past it gets the process killed."""
    needs("memory")
    with memory_cgroup(64 * MiB) as cgroup, child(ALLOCATOR) as process:
        cgroup.add(process.pid)
        allocated_mib = 0
        while allocated_mib < 128 and allocate(process, 16) == "ok":
            allocated_mib += 16
        assert allocated_mib < 64
        assert process.wait() == -9


@pytest.mark.usefixtures("whole_machine")
def test_real_cpu_quota_and_throttling() -> None:
    needs("cpu")
    # A tenth of a core: a busy loop exceeds it even on a machine whose cores are all busy.
    with cpu_cgroup(0.1) as cgroup, child("while True: pass") as process:
        cgroup.add(process.pid)
        collector = ContainerCollector.open(process.pid)
        assert collector is not None
        assert collector.names[-3:] == CPU
        first = collector.sample()
        assert reading(collector, first, CPU[0]) == pytest.approx(0.1)
        assert math.isnan(reading(collector, first, CPU[2]))
        # A busy loop under a tenth of a core is throttled most of the time.
        wait_for(lambda: reading(collector, collector.sample(), CPU[2]) > 0, what="throttling")
        stat = Path(cgroup.path, "cpu.stat")
        low = _v1_throttled_seconds(stat)
        throttled = reading(collector, collector.sample(), CPU[1])
        assert low <= throttled <= _v1_throttled_seconds(stat)
        assert throttled > 0


def _v1_throttled_seconds(stat: Path) -> float:
    fields = dict(line.split() for line in stat.read_text().splitlines())
    return int(fields["throttled_time"]) / 1e9


def test_real_cgroup_removed_gives_nan() -> None:
    needs("memory")
    with child(ALLOCATOR) as process:
        with memory_cgroup(256 * MiB) as cgroup:
            cgroup.add(process.pid)
            collector = ContainerCollector.open(process.pid)
            assert collector is not None
            assert not math.isnan(collector.sample()[0])
        # The cgroup is gone (its process moved back to the parent): no reading is faked.
        assert all(math.isnan(value) for value in collector.sample()[:3])
        assert math.isnan(collector.sample_tracked()[0])


def test_pid_that_does_not_exist() -> None:
    with child("pass") as process:
        process.wait()
    assert ContainerCollector.open(process.pid) is None


# Fake layouts: /proc/<PID>/cgroup and the cgroup filesystem as plain files.


def layout(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> dict[str, str]:
    """Roots for ``open()``: ``proc_cgroup`` as /proc/<PID>/cgroup and ``files`` (path under the
    cgroup root: text) as the cgroup filesystem."""
    proc = tmp_path / "proc" / str(PID)
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(proc_cgroup)
    for name, text in files.items():
        path = tmp_path / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return {"proc_root": str(tmp_path / "proc"), "cgroup_root": str(tmp_path / "cgroup")}


def v2(files: dict[str, str]) -> dict[str, str]:
    """A cgroup2 mounted at the cgroup root, holding ``files``."""
    return {"cgroup.controllers": "cpu memory", **files}


def open_fake(roots: dict[str, str]) -> ContainerCollector:
    collector = ContainerCollector.open(PID, **roots)
    assert collector is not None
    return collector


def test_v2_limits_and_usage(tmp_path: Path) -> None:
    files = v2(
        {
            "a/memory.max": "max",
            "a/b/memory.max": str(256 * MiB),
            "a/b/memory.current": str(64 * MiB),
            "a/b/cpu.max": "50000 100000",
            "a/b/cpu.stat": "usage_usec 9\nthrottled_usec 1500000",
        }
    )
    roots = layout(tmp_path, "0::/a/b\n", files)
    collector = open_fake(roots)
    assert collector.names == MEMORY + CPU
    assert collector.tracked == ("resource/container/memory_used_mb",)
    assert collector.averaged == ()
    first = collector.sample()
    assert first[:5] == [256, 64, 25, 0.5, 1.5]
    assert math.isnan(first[5])
    assert collector.sample_tracked() == [64]

    stat = tmp_path / "cgroup/a/b/cpu.stat"
    start = time.monotonic()
    collector.sample()
    time.sleep(0.05)
    stat.write_text("throttled_usec 2500000\n")
    rate = collector.sample()[5]
    elapsed = time.monotonic() - start
    assert 1.0 / elapsed <= rate <= 1.0 / 0.05


def test_v2_smallest_limit_over_ancestors(tmp_path: Path) -> None:
    files = v2(
        {
            "a/memory.max": str(128 * MiB),
            "a/b/memory.max": str(256 * MiB),
            "a/b/memory.current": str(32 * MiB),
            "a/cpu.max": "100000 100000",
            "a/cpu.stat": "throttled_usec 7000000",
            "a/b/cpu.max": "max 100000",
            "a/b/cpu.stat": "throttled_usec 0",
        }
    )
    collector = open_fake(layout(tmp_path, "0::/a/b\n", files))
    values = collector.sample()
    assert values[:5] == [128, 32, 25, 1.0, 7.0]  # throttling counted where the quota binds

    (tmp_path / "cgroup/a/b/memory.max").write_text(f"{64 * MiB}\n")  # tightened at run time
    assert collector.sample()[:3] == [64, 32, 50]


def test_v2_max_means_no_limit(tmp_path: Path) -> None:
    files = v2({"a/memory.max": "max", "a/memory.current": "5", "a/cpu.max": "max 100000", "a/cpu.stat": ""})
    assert ContainerCollector.open(PID, **layout(tmp_path, "0::/a\n", files)) is None


def test_only_what_has_a_limit_is_reported(tmp_path: Path) -> None:
    files = v2(
        {"a/memory.max": "max", "a/memory.current": "5", "a/cpu.max": "25000 100000", "a/cpu.stat": ""}
    )
    collector = open_fake(layout(tmp_path, "0::/a\n", files))
    assert collector.names == CPU
    assert collector.tracked == ()
    assert collector.sample_tracked() == []
    assert collector.sample()[0] == 0.25


def test_limit_lifted_at_run_time_gives_nan(tmp_path: Path) -> None:
    files = v2({"a/memory.max": str(100 * MiB), "a/memory.current": str(10 * MiB)})
    collector = open_fake(layout(tmp_path, "0::/a\n", files))
    (tmp_path / "cgroup/a/memory.max").write_text("max\n")
    limit, used, percent = collector.sample()
    assert (math.isnan(limit), used, math.isnan(percent)) == (True, 10, True)


def test_zero_memory_limit_has_no_percent(tmp_path: Path) -> None:
    files = v2({"a/memory.max": "0", "a/memory.current": "0"})
    limit, used, percent = open_fake(layout(tmp_path, "0::/a\n", files)).sample()
    assert (limit, used, math.isnan(percent)) == (0, 0, True)


def test_v2_files_disappear(tmp_path: Path) -> None:
    files = v2(
        {
            "a/b/memory.max": str(256 * MiB),
            "a/b/memory.current": str(64 * MiB),
            "a/b/cpu.max": "50000 100000",
            "a/b/cpu.stat": "throttled_usec 1",
        }
    )
    collector = open_fake(layout(tmp_path, "0::/a/b\n", files))
    collector.sample()
    shutil.rmtree(tmp_path / "cgroup/a/b")
    assert all(math.isnan(value) for value in collector.sample())
    assert math.isnan(collector.sample_tracked()[0])


def test_throttled_counter_going_back_gives_no_rate(tmp_path: Path) -> None:
    files = v2({"a/cpu.max": "50000 100000", "a/cpu.stat": "throttled_usec 5000000"})
    collector = open_fake(layout(tmp_path, "0::/a\n", files))
    collector.sample()
    (tmp_path / "cgroup/a/cpu.stat").write_text("throttled_usec 1000000\n")
    throttled, rate = collector.sample()[1:]
    assert throttled == 1.0
    assert math.isnan(rate)
    (tmp_path / "cgroup/a/cpu.stat").write_text("throttled_usec 1000000\n")
    assert collector.sample()[2] == 0.0  # counting again from the new value


def test_unparsable_files_give_nan(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Text that is no number is a failed reading, not a bug of the monitor: nothing is logged."""
    files = v2(
        {"a/memory.max": str(100 * MiB), "a/memory.current": "lots", "a/cpu.max": "1 1", "a/cpu.stat": "x 1"}
    )
    collector = open_fake(layout(tmp_path, "0::/a\n", files))
    limit, used, percent, quota, throttled, rate = collector.sample()
    assert (limit, quota) == (100, 1.0)
    assert all(math.isnan(value) for value in (used, percent, throttled, rate))
    (tmp_path / "cgroup/a/memory.max").write_text("a lot\n")
    assert math.isnan(collector.sample()[0])
    assert not caplog.records


def test_unreadable_limit_at_open_is_not_reported(tmp_path: Path) -> None:
    files = v2({"a/memory.current": "5", "a/cpu.max": "50000 100000", "a/cpu.stat": ""})
    roots = layout(tmp_path, "0::/a\n", files)
    (tmp_path / "cgroup/a/memory.max").mkdir()  # exists, cannot be read as a file
    assert open_fake(roots).names == CPU


def test_v2_mounted_under_unified(tmp_path: Path) -> None:
    files = {"unified/cgroup.controllers": "memory", "unified/a/memory.max": "1048576"}
    files["unified/a/memory.current"] = "524288"
    assert open_fake(layout(tmp_path, "0::/a\n", files)).sample() == [1, 0.5, 50]


def test_v1_joined_cpu_cpuacct_mount(tmp_path: Path) -> None:
    proc = "3:cpu,cpuacct:/job\n2:memory:/job\n0::/\n"
    files = {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1",
        "cpu,cpuacct/cpu.cfs_period_us": "100000",
        "cpu,cpuacct/job/cpu.cfs_quota_us": "150000",
        "cpu,cpuacct/job/cpu.cfs_period_us": "100000",
        "cpu,cpuacct/job/cpu.stat": "nr_periods 3\nthrottled_time 2500000000",
        "memory/memory.limit_in_bytes": "9223372036854771712",
        "memory/job/memory.limit_in_bytes": "9223372036854771712",
        "memory/job/memory.usage_in_bytes": "5",
        "unified/cgroup.controllers": "",
    }
    collector = open_fake(layout(tmp_path, proc, files))
    assert collector.names == CPU  # the v1 "unlimited" memory limit is no limit
    assert collector.sample()[:2] == [1.5, 2.5]


def test_container_seeing_only_its_own_cgroup(tmp_path: Path) -> None:
    """No cgroup namespace: /proc says the host's path, the mount is the container's cgroup."""
    files = {"memory/memory.limit_in_bytes": str(512 * MiB), "memory/memory.usage_in_bytes": str(MiB)}
    files["memory/inner/memory.limit_in_bytes"] = "9223372036854771712"
    files["memory/inner/memory.usage_in_bytes"] = "0"
    assert open_fake(layout(tmp_path, "4:memory:/docker/0123abcd\n", files)).sample()[:2] == [512, 1]
    inner = layout(tmp_path / "inner", "4:memory:/docker/0123abcd/inner\n", {})
    collector = open_fake({**inner, "cgroup_root": str(tmp_path / "cgroup")})
    assert collector.sample()[:2] == [512, 0]


def test_cgroup_outside_the_namespace_root_is_none(tmp_path: Path) -> None:
    files = {"memory/memory.limit_in_bytes": str(512 * MiB), "memory/memory.usage_in_bytes": "0"}
    assert ContainerCollector.open(PID, **layout(tmp_path, "4:memory:/../sibling\n", files)) is None


def test_no_limit_anywhere_is_none(tmp_path: Path) -> None:
    files = v2({"a/memory.current": "5", "a/cpu.stat": "throttled_usec 0"})  # no limit files at all
    assert ContainerCollector.open(PID, **layout(tmp_path, "0::/a\n", files)) is None
    assert ContainerCollector.open(PID, **layout(tmp_path / "none", "0::/\n", {})) is None


def test_unreadable_proc_cgroup_is_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proc = tmp_path / "proc" / str(PID) / "cgroup"
    proc.mkdir(parents=True)  # a directory: reading it fails, even as root
    caplog.set_level(logging.DEBUG, logger="sampler")
    assert ContainerCollector.open(PID, proc_root=str(tmp_path / "proc")) is None
    assert str(proc) in caplog.text


def test_cgroup_path_out_of_reach_is_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A path the filesystem refuses to look up (here too long a name) is no exception out of open()."""
    files = v2({"a/memory.max": "1", "a/memory.current": "1"})
    caplog.set_level(logging.DEBUG, logger="sampler")
    assert ContainerCollector.open(PID, **layout(tmp_path, f"0::/a/{'x' * 300}\n", files)) is None
    assert "File name too long" in caplog.text
