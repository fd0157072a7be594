"""Machine-wide counters that never fall when a device goes, as Prometheus' counters must not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from sampler.collectors.host import MonotonicTotals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REMOVE_AN_INTERFACE = """
import socket, subprocess, sys, time
import psutil
sys.path.insert(0, {root!r})
from sampler.collectors.host import NetworkCollector

def ip(*args):
    subprocess.run(["ip", *args], check=True)

ip("link", "add", "wl-test0", "type", "veth", "peer", "name", "wl-test1")
ip("link", "set", "wl-test0", "up")
ip("link", "set", "wl-test1", "up")

def received(name):
    return psutil.net_io_counters(pernic=True)[name].bytes_recv

collector = NetworkCollector()
before = collector.sample()[:2]
# Ethernet frames out of one end (layer 2 only, inside this private namespace). Until the
# kernel's link watcher has seen the carrier (up to a second later, more on a loaded machine)
# the device drops what it is given, so send until the peer has received 100 kB.
deadline = time.monotonic() + 30
with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
    raw.bind(("wl-test0", 0))
    frame = b"\\xff" * 6 + b"\\x02\\x00\\x00\\x00\\x00\\x01" + b"\\x88\\xb5" + b"\\0" * 986
    while received("wl-test1") < 100 * 1000 and time.monotonic() < deadline:
        for _ in range(10):
            raw.send(frame)
        time.sleep(0.01)
sent = collector.sample()[:2]
ip("link", "del", "wl-test0")  # its peer goes with it
after = collector.sample()[:2]
print(*before, *sent, *after)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"),
    reason="needs root, ip and unshare to remove an interface in a private network namespace",
)
def test_removing_an_interface_never_makes_the_network_counters_fall() -> None:
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", REMOVE_AN_INTERFACE.format(root=ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"no private network namespace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr
    sent0, received0, sent1, received1, sent2, received2 = map(float, done.stdout.split())
    assert sent1 - sent0 >= 100 * 1000 and received1 - received0 >= 100 * 1000  # the frames counted
    assert sent2 >= sent1 and received2 >= received1  # and kept after the interface went


def test_monotonic_totals_keep_what_a_device_added_and_survive_a_counter_reset() -> None:
    totals = MonotonicTotals(1)
    assert totals.update({"a": [10.0], "b": [5.0]}) == [15.0]
    assert totals.update({"a": [12.0], "b": [9.0]}) == [21.0]
    assert totals.update({"a": [13.0]}) == [22.0]  # b went: what it added stays
    assert totals.update({"a": [14.0], "c": [100.0]}) == [23.0]  # c appeared: it adds from now on
    assert totals.update({"a": [14.0], "c": [103.0]}) == [26.0]
    assert totals.update({"a": [2.0], "c": [103.0]}) == [28.0]  # a reset to 0 and moved 2
