"""The metrics endpoint against clients that misbehave, and a child starved of descriptors.

A local user can connect to the endpoint at will: idle, slow, broken or too
many connections must cost that client, never the sampling or a real scrape.
"""

from __future__ import annotations

import gzip
import logging
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from conftest import FAST, Recorder, backend_script, free_ports, scrape, wait_for

import sampler
from sampler.ipc.status import EXIT_STARVED
from sampler.prometheus import scrape_server
from sampler.prometheus.scrape_server import MAX_CONNECTIONS, READ_TIMEOUT_SECONDS, ScrapeServer

pytest.importorskip("prometheus_client")

BODY = b"# a tiny exposition\nup 1\n"


def render(accept: str) -> tuple[bytes, str]:
    return BODY, "text/plain; version=0.0.4"


@pytest.fixture
def server() -> Iterator[ScrapeServer]:
    served = ScrapeServer("127.0.0.1", 0, render)
    served.start()
    yield served
    served.close()


def get(port: int, path: str = "/metrics", headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def idle_connections(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that never send anything (non-blocking connects: a full
    backlog must not block the test)."""
    held = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        held.append(sock)
    return held


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_a_scrape_is_answered_and_the_connection_closed(server: ScrapeServer) -> None:
    status, body, headers = get(server.port)
    assert (status, body) == (200, BODY)
    assert headers["Content-Type"] == "text/plain; version=0.0.4"
    assert headers["Connection"] == "close"
    wait_for(lambda: server.open_connections == 0, what="the connection closed")


def test_gzip_head_and_bad_methods(server: ScrapeServer) -> None:
    status, body, headers = get(server.port, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == BODY
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", method="HEAD")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200 and response.read() == b""
        assert int(response.headers["Content-Length"]) == len(BODY)
    assert get(server.port, "/favicon.ico")[0] == 404
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 405


def test_a_client_that_never_finishes_its_request_is_dropped(server: ScrapeServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: never complete
        slow.settimeout(READ_TIMEOUT_SECONDS + 15)
        started = time.monotonic()
        assert slow.recv(1) == b""  # the server closed it
        assert time.monotonic() - started >= READ_TIMEOUT_SECONDS * 0.9
    assert server.dropped["timeout"] == 1


def test_a_request_too_long_or_not_http_is_refused(server: ScrapeServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as client:
        client.sendall(b"GET /" + b"a" * (scrape_server.MAX_REQUEST_BYTES + 10))
        client.settimeout(10)
        assert client.recv(1) == b""
    with socket.create_connection(("127.0.0.1", server.port)) as client:
        client.sendall(b"hello there\r\n\r\n")
        client.settimeout(10)
        assert client.recv(100).startswith(b"HTTP/1.1 400")
    assert server.dropped["bad_request"] == 2


def test_idle_connections_give_way_to_a_real_scrape(server: ScrapeServer) -> None:
    held = idle_connections(server.port, 200)
    try:
        wait_for(lambda: server.dropped["evicted"] >= 200 - MAX_CONNECTIONS, what="idle clients evicted")
        assert server.open_connections == MAX_CONNECTIONS
        # The oldest idle connections were the ones dropped.
        assert wait_for(lambda: closed_by_peer(held[0]), what="the first idle connection dropped")
        evicted, timed_out = server.dropped["evicted"], server.dropped["timeout"]
        status, body, _ = get(server.port)  # while every slot holds an idle client
        assert (status, body) == (200, BODY)
        # It took an idle client's slot rather than waiting for one to time out.
        assert server.dropped["evicted"] == evicted + 1 or server.dropped["timeout"] > timed_out
    finally:
        for sock in held:
            sock.close()


def test_a_client_that_resets_mid_reply_is_counted_not_printed(capfd: pytest.CaptureFixture[str]) -> None:
    big = b"x" * (8 << 20)  # more than any socket buffer takes at once: the reply is still being sent
    served = ScrapeServer("127.0.0.1", 0, lambda accept: (big, "text/plain"))
    served.start()
    try:
        for _ in range(5):
            client = socket.create_connection(("127.0.0.1", served.port))
            client.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            client.recv(1024)  # the reply has begun
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # a reset, not a close
        wait_for(lambda: served.dropped["reset"] == 5, what="five resets counted")
        assert get(served.port)[0] == 200  # still serving
    finally:
        served.close()
    assert "Traceback" not in capfd.readouterr().err


def test_close_releases_the_port_and_every_connection(server: ScrapeServer) -> None:
    held = idle_connections(server.port, 5)
    wait_for(lambda: server.open_connections == 5, what="five connections accepted")
    port = server.port
    server.close()
    try:
        for sock in held:
            wait_for(lambda sock=sock: closed_by_peer(sock), what="the server side closed")
        with socket.socket() as again:
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", port))
    finally:
        for sock in held:
            sock.close()


ACCEPT_FAILS = """
import os, socket, sys, time
sys.path.insert(0, {root!r})
from sampler.prometheus.scrape_server import ScrapeServer, ACCEPT_PAUSE_SECONDS
server = ScrapeServer("127.0.0.1", 0, lambda accept: (b"up 1\\n", "text/plain"))
server.start()
spent = []
try:
    while True:
        spent.append(os.dup(2))
except OSError:
    pass
os.close(spent.pop())  # one for the client's socket: the server's accept finds none
client = socket.create_connection(("127.0.0.1", server.port))
connected = time.monotonic()
client.sendall(b"GET / HTTP/1.1\\r\\n\\r\\n")
while server.dropped["accept_failed"] < 1 and time.monotonic() < connected + 30:
    time.sleep(0.05)
time.sleep(4 * ACCEPT_PAUSE_SECONDS)  # four pauses more: a spin would fail thousands of times
failed = server.dropped["accept_failed"]
elapsed = time.monotonic() - connected
for fd in spent:
    os.close(fd)
client.settimeout(30)
reply = client.recv(100)
print(failed, elapsed, reply[:12].decode())
"""


def test_accepting_pauses_while_the_process_is_out_of_descriptors() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    done = subprocess.run(
        [sys.executable, "-c", ACCEPT_FAILS.format(root=root)],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    failed, elapsed, reply = done.stdout.split(maxsplit=2)
    # A pause between tries: a failure a pause at most (the first at once), not a spin of thousands.
    assert 1 <= int(failed) <= float(elapsed) / scrape_server.ACCEPT_PAUSE_SECONDS + 2
    assert reply.startswith("HTTP/1.1 200")  # served once descriptors came back
    assert "Traceback" not in done.stderr


FD_LIMIT = 128
"""The backend's (and so its child's) descriptor limit in the flood test: well
below the connections the flood opens."""


def test_hundreds_of_idle_connections_neither_blind_the_monitor_nor_block_a_scrape() -> None:
    port = free_ports()
    script = backend_script(
        f"""
        import resource
        from sampler.collectors import Sources, build_collectors
        # The readings themselves (peaks, means and rates are derived: a mean can be missing).
        sources = Sources(disk_path="/", pid=os.getpid(), nvml_module="pynvml")
        everything = ["cpu", "memory", "disk", "network", "process"]
        BASE = {{n for c in build_collectors(everything, sources) for n in c.names if "_per_second" not in n}}
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, hard))
        mon = sampler.ResourceMonitor(
            interval_seconds=0.2, _min_interval_seconds=0.05, step_source="seconds",
            categories=["cpu", "memory", "disk", "network", "process"], sink=lambda *a: None,
            on_sample=lambda sample: print(len(set(sample.values) & BASE), flush=True),
            postmortem_dir=None, prometheus_port={port},
        )
        mon.start()
        while mon.stats()["prometheus_endpoint"] is None:
            time.sleep(0.05)
        print("child", mon.child_pid, flush=True)
        sys.stdin.read()
        mon.stop()
        print("restarts", mon.stats()["restarts"], flush=True)
        """
    )
    backend = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    assert backend.stdout is not None and backend.stdin is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(backend.stdout.readline, "")), daemon=True)
    reader.start()
    held: list[socket.socket] = []
    try:
        child = int(
            wait_for(lambda: [ln for ln in lines if ln.startswith("child")], what="the child")[0].split()[1]
        )
        records = lambda: [int(ln) for ln in lines if ln.strip().isdigit()]  # noqa: E731
        full = wait_for(lambda: records()[1:], what="two records")[-1]
        for _ in range(3 * FD_LIMIT):  # as an attacker would: each held, none sending
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            except OSError:
                break  # the endpoint no longer accepts (it ran out of descriptors)
        before = len(records())
        wait_for(lambda: len(records()) >= before + 10, timeout=60, what="ten records during the flood")
        # Every reading still there: the endpoint did not take the child's descriptors.
        assert records()[before:] == [full] * (len(records()) - before)
        assert psutil.Process(child).num_fds() < FD_LIMIT // 2
        found = scrape(port)  # a real scrape answers meanwhile
        assert "wl_resource_cpu_utilization_ratio" in found
        assert "wl_resource_monitor_endpoint_connections_dropped_total{" in found
    finally:
        for sock in held:
            sock.close()
        backend.stdin.close()
        backend.wait(60)
        reader.join(10)
    assert "restarts 0" in [ln.strip() for ln in lines]


def starve(pid: int) -> None:
    """Leave the process no descriptor to open: its limit set to its lowest free
    descriptor number (a new descriptor gets the lowest free number, which must
    be below the limit)."""
    held = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    lowest_free = min(set(range(len(held) + 1)) - held)
    proc = psutil.Process(pid)
    proc.rlimit(psutil.RLIMIT_NOFILE, (lowest_free, proc.rlimit(psutil.RLIMIT_NOFILE)[1]))


def test_a_child_whose_every_reading_fails_for_want_of_descriptors_is_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = Recorder()
    options = {**FAST, "step_source": "seconds", "postmortem_dir": None, "_restart_backoff": (0.05, 0.2)}
    with (
        caplog.at_level(logging.WARNING, logger="sampler"),
        # The process tree opens /proc files at each reading; cpu, memory, disk, network and
        # process read files held open since their first reading, which starving cannot fail.
        sampler.ResourceMonitor(sink=sink, categories=["process_tree"], **options) as mon,
    ):
        wait_for(lambda: mon.stats()["records_logged"] >= 2, what="two records")
        first = mon.child_pid
        assert first is not None
        starve(first)
        wait_for(lambda: mon.stats()["restarts"] >= 1, what="the starved child replaced")
        logged = mon.stats()["records_logged"]
        wait_for(lambda: mon.stats()["records_logged"] >= logged + 2, what="records from the new child")
        stats = mon.stats()
    assert stats["readings_starved"] > 0
    death = stats["deaths"][-1]
    assert (death["exit_code"], death["killed"], death["category"]) == (EXIT_STARVED, False, None)
    assert "every reading failed: the child ran out of file descriptors or memory" in caplog.text
    assert caplog.text.count("is skipping readings because it ran out of file descriptors") == 1


def test_a_child_losing_some_readings_to_starvation_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    sink = Recorder()
    options = {**FAST, "step_source": "seconds", "postmortem_dir": None}
    with (
        caplog.at_level(logging.WARNING, logger="sampler"),
        sampler.ResourceMonitor(
            sink=sink, categories=["process_tree", "disk"], disk_path="/", **options
        ) as mon,
    ):
        wait_for(lambda: mon.stats()["records_logged"] >= 2, what="two records")
        assert mon.child_pid is not None
        starve(mon.child_pid)
        wait_for(lambda: mon.stats()["readings_starved"] >= 6, what="readings lost to starvation")
        # The disk usage needs no descriptor (statvfs): it still flows, so the child stays.
        count = len(sink.values("resource/disk/utilization_percent"))
        wait_for(
            lambda: len(sink.values("resource/disk/utilization_percent")) >= count + 2, what="disk usage"
        )
        stats = mon.stats()
    assert stats["restarts"] == 0
    assert caplog.text.count("is skipping readings because it ran out of file descriptors") == 1


def test_clients_that_reset_leave_nothing_in_the_backends_stderr() -> None:
    port = free_ports()
    script = backend_script(
        f"""
        mon = sampler.ResourceMonitor(
            interval_seconds=0.2, _min_interval_seconds=0.05, step_source="seconds", sink=lambda *a: None,
            postmortem_dir=None, prometheus_port={port},
        )
        mon.start()
        while mon.stats()["prometheus_endpoint"] is None:
            time.sleep(0.05)
        print("serving", flush=True)
        sys.stdin.read()
        mon.stop()
        """
    )
    backend = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert backend.stdin is not None and backend.stdout is not None
    try:
        assert backend.stdout.readline().strip() == "serving"
        for request in [b"GET /metrics HTTP/1.1\r\n", b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"] * 10:
            client = socket.create_connection(("127.0.0.1", port), timeout=10)
            client.sendall(request)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # a reset while the request is read or the reply is on its way
        found = scrape(port)
    finally:
        backend.stdin.close()
        assert backend.stderr is not None
        err = backend.stderr.read()
        backend.wait(60)
    assert "wl_resource_monitor_endpoint_connections_dropped_total" in found
    assert "Traceback" not in err and "Error" not in err, err[:2000]
