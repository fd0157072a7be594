"""Swap, read as the memory collector reads it: a real swap file, a real memory cgroup that a real
process outgrows, the kernel's own counters."""

from __future__ import annotations

import math
import subprocess
import sys

import psutil
import pytest
from cgroups import memory_cgroup, swap_file, swap_skip_reason
from conftest import wait_for

from sampler.catalogue import MIB
from sampler.collectors.host import SWAP_NAMES, MemoryCollector

MiB = 1024**2

TOUCHER = """
import sys
held = bytearray(int(sys.argv[1]) << 20)
for line in sys.stdin:  # each line: write every page again (what was swapped out comes back in)
    held[::4096] = bytes([len(line) % 250 + 1]) * len(range(0, len(held), 4096))
    print("touched", flush=True)
"""


def test_the_memory_category_names_swap_only_where_the_machine_has_swap() -> None:
    collector = MemoryCollector()
    has_swap = psutil.swap_memory().total > 0
    assert (set(SWAP_NAMES) <= set(collector.names)) is has_swap
    assert collector.names[0] == "resource/memory/system_utilization_percent"
    assert len(collector.sample()) == len(collector.names)
    assert len(collector.sample_tracked()) == len(collector.tracked) == 1  # swap is read at records only


@pytest.mark.usefixtures("whole_machine")
def test_a_process_that_outgrows_its_cgroup_moves_the_swap_signals() -> None:
    reason = swap_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with swap_file(256 * MiB), memory_cgroup(64 * MiB, swap_bytes=256 * MiB) as cgroup:
        collector = MemoryCollector()  # made after swapon, as a child started then is
        assert set(SWAP_NAMES) <= set(collector.names)
        index = {name: collector.names.index(name) for name in SWAP_NAMES}
        first = collector.sample()
        assert all(math.isnan(first[index[name]]) for name in SWAP_NAMES[3:])  # no rate before a window
        toucher = subprocess.Popen(
            [sys.executable, "-c", TOUCHER, "128"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            cgroup.add(toucher.pid)
            assert toucher.stdin is not None and toucher.stdout is not None

            def touch() -> None:
                assert toucher.stdin is not None and toucher.stdout is not None
                toucher.stdin.write("go\n")
                toucher.stdin.flush()
                assert toucher.stdout.readline() == "touched\n"

            touch()  # 128 MiB written in a 64 MiB cgroup: half of it, at least, goes out to swap
            wait_for(lambda: psutil.swap_memory().used >= 32 * MiB, what="the toucher's pages in swap")
            out = collector.sample()
            touch()  # and back in, as others go out
            back = collector.sample()
        finally:
            toucher.kill()
            toucher.wait()
    print({name: (first[i], out[i], back[i]) for name, i in index.items()})
    assert out[index["resource/memory/swap_used_mb"]] >= 32
    swapped_out, swapped_in = index["resource/memory/swapped_out_mb"], index["resource/memory/swapped_in_mb"]
    assert out[swapped_out] - first[swapped_out] >= 32  # MiB written out to swap since the first sample
    assert back[swapped_in] - out[swapped_in] >= 16  # read back in by the second touch
    assert out[index["resource/memory/swapped_out_mb_per_second"]] > 0
    assert back[index["resource/memory/swapped_in_mb_per_second"]] > 0
    vmstat = psutil.swap_memory()
    assert (
        back[swapped_in] <= vmstat.sin / MIB and back[swapped_out] <= vmstat.sout / MIB
    )  # since boot, as the kernel counts
