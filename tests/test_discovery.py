"""Discovery entries of monitors in other pid namespaces: host-network containers share a host
name and a discovery directory, and each may run its backend as pid 1. Every monitor gets an
entry of its own, and a monitor removes another's entry only when that one's backend is provably
dead: in its own pid namespace, and gone (or its pid now another process's).

Real pid namespaces (``unshare --pid``, as a container has) where this machine lets us make
them; entries recording another namespace, boot or start time where a test needs a case no
real process gives on demand."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ENV_VARS, FAST, Recorder, backend_script, free_ports, wait_for
from prometheus_server import PrometheusServer, skip_reason

import sampler
from sampler.prometheus import discovery
from sampler.settings.placement import Placement

pytest.importorskip("prometheus_client")

HOST = socket.gethostname()
UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
"""A command after these runs as pid 1 of a pid namespace of its own (with its own ``/proc``),
and everything in it is killed when ``unshare`` is."""

IN_A_CONTAINER = """
mon = sampler.ResourceMonitor(interval_seconds=1.0, categories=["cpu"], sink=lambda *a: None,
                              step_source="seconds", postmortem_dir=None, prometheus_port=int(sys.argv[1]),
                              prometheus_sd_dir=sys.argv[2])
mon.start()
while mon.stats()["prometheus_endpoint"] is None:
    time.sleep(0.05)
print(os.getpid(), flush=True)
sys.stdin.readline()
mon.stop()
"""
"""A backend that lists itself in the directory ``argv[2]``, prints its pid and stops when told."""


def namespaces_work() -> str | None:
    """Why no pid namespace can be made here, or None."""
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, check=False)
    return (probe.stderr.decode().strip() or "unshare failed") if probe.returncode else None


@pytest.fixture
def container(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Start backends (``IN_A_CONTAINER``) each in a pid namespace of its own; all are stopped
    and reaped at the end."""
    why = namespaces_work()
    if why is not None:
        pytest.skip(f"cannot make a pid namespace here: {why}")
    started: list[subprocess.Popen[str]] = []
    yield started
    for backend in started:
        if backend.poll() is None:
            backend.kill()  # --kill-child: the namespace's pid 1 goes, and everything in it
        backend.wait()


def start_in_namespace(started: list[subprocess.Popen[str]], tmp_path: Path, port: int, sd_dir: Path) -> int:
    """A backend in a pid namespace of its own, listed in ``sd_dir``; its pid there."""
    script = tmp_path / "backend.py"
    script.write_text(backend_script(IN_A_CONTAINER))
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    command = [*UNSHARE, sys.executable, str(script)]
    backend = subprocess.Popen(
        [*command, str(port), str(sd_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    started.append(backend)
    assert backend.stdout is not None
    return int(backend.stdout.readline())


def stop(backend: subprocess.Popen[str]) -> None:
    assert backend.stdin is not None
    backend.stdin.write("\n")
    backend.stdin.close()
    assert backend.wait(timeout=60) == 0


def test_a_monitor_in_another_pid_namespace_leaves_a_live_monitor_s_entry(
    tmp_path: Path, container: list[subprocess.Popen[str]]
) -> None:
    sd_dir = tmp_path / "sd"
    options: dict[str, Any] = {**FAST, "step_source": "seconds", "postmortem_dir": None, "sink": Recorder()}
    ports = free_ports(2)
    with sampler.ResourceMonitor(prometheus_port=ports, prometheus_sd_dir=str(sd_dir), **options) as mon:
        wait_for(lambda: mon.stats()["prometheus_endpoint"], what="the endpoint")
        (ours,) = wait_for(lambda: list(sd_dir.glob("*.json")), what="our entry")
        # Its pid is no process of the other namespace: kill(pid, 0) there says "no such process".
        assert start_in_namespace(container, tmp_path, ports + 1, sd_dir) == 1
        stop(container[0])  # it listed itself (and swept the directory) before it stopped
        assert ours.exists()
        assert list(sd_dir.glob("*.json")) == [ours]


def test_two_backends_that_are_pid_1_each_get_an_entry(
    tmp_path: Path, container: list[subprocess.Popen[str]]
) -> None:
    sd_dir = tmp_path / "sd"
    port = free_ports(2)
    assert [start_in_namespace(container, tmp_path, port + i, sd_dir) for i in range(2)] == [1, 1]
    wait_for(lambda: len(list(sd_dir.glob("*.json"))) == 2, what="two entries")
    targets = {json.loads(p.read_text())[0]["targets"][0] for p in sd_dir.glob("*.json")}
    assert targets == {f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"}
    for backend in container:
        stop(backend)
    assert list(sd_dir.glob("*.json")) == []


# --------------------------------------------------------------------------- entries judged by their owner


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def plant(sd_dir: Path, name: str, owner: discovery.Owner | None, host: str = HOST) -> Path:
    """An entry of a monitor of ``host`` as ``write_entry`` writes it, recording ``owner``
    (None: none, as an earlier release wrote it)."""
    path = Path(discovery.entry_path(str(sd_dir), Placement(host, run_id=name), 7))
    labels = {"host": host, "rank": "0", "local_rank": "0", "run_id": name}
    content = [{"targets": ["127.0.0.1:9"], "labels": {**labels, **(owner.labels() if owner else {})}}]
    sd_dir.mkdir(exist_ok=True)
    path.write_text(json.dumps(content))
    return path


@pytest.fixture
def alive() -> Iterator[subprocess.Popen[bytes]]:
    """A process that runs until the test ends."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield process
    process.kill()
    process.wait()


def test_an_entry_goes_only_when_its_owner_is_provably_gone(
    tmp_path: Path, alive: subprocess.Popen[bytes]
) -> None:
    sd_dir = tmp_path / "sd"
    here = discovery.this_process()
    assert here is not None and here.pid == os.getpid() and here.started == discovery.start_ticks(os.getpid())
    dead = dataclasses.replace(here, pid=dead_pid())
    started = discovery.start_ticks(alive.pid)
    assert started is not None
    running = dataclasses.replace(here, pid=alive.pid, started=started)
    gone = [
        plant(sd_dir, "dead", dead),
        # Its pid is now another process's: one that started at another time.
        plant(sd_dir, "reused", dataclasses.replace(running, started=started - 1)),
    ]
    kept = [
        plant(sd_dir, "alive", running),
        plant(sd_dir, "ours", here),
        # A dead pid of this namespace is no proof for another namespace's, or another kernel's.
        plant(sd_dir, "container", dataclasses.replace(dead, namespace=here.namespace + 1)),
        plant(sd_dir, "other-boot", dataclasses.replace(dead, boot_id=here.boot_id[::-1])),
        plant(sd_dir, "no-owner", None),  # written before entries recorded their owner
        plant(sd_dir, "another-host", dead, host="another-host"),
    ]
    before = {p: p.read_bytes() for p in kept}
    assert sorted(discovery.remove_stale_entries(str(sd_dir), HOST)) == sorted(map(str, gone))
    assert {p: p.read_bytes() for p in kept if p.exists()} == before
    # A suspended backend (Ctrl-Z, scontrol suspend) still runs: its entry stays.
    os.kill(alive.pid, signal.SIGSTOP)
    try:
        assert discovery.remove_stale_entries(str(sd_dir), HOST) == []
    finally:
        os.kill(alive.pid, signal.SIGCONT)


@pytest.mark.parametrize(
    "owner",
    [
        {"pid": "0"},  # kill(0, 0) asks about this process group
        {"pid": "-1"},  # kill(-1, 0) about every process we may signal
        {"pid": str(1 << 22)},
        {"pid": "1" * 5000},
        {"pid": 7},
        {"started": "soon"},
        {"__meta_wl_resource_pid_namespace": None},
    ],
)
def test_an_entry_whose_owner_is_malformed_stays(tmp_path: Path, owner: dict[str, object]) -> None:
    sd_dir = tmp_path / "sd"
    here = discovery.this_process()
    assert here is not None
    path = plant(sd_dir, "odd", here)
    content = json.loads(path.read_text())
    labels = content[0]["labels"]
    for key, value in owner.items():
        name = key if key.startswith("__") else f"__meta_wl_resource_{key}"
        labels[name] = value
    path.write_text(json.dumps(content))
    assert discovery.remove_stale_entries(str(sd_dir), HOST) == []
    assert path.exists()


def test_two_monitors_of_one_process_get_an_entry_each(tmp_path: Path) -> None:
    sd_dir = tmp_path / "sd"
    port = free_ports(2)
    options: dict[str, Any] = {
        **FAST,
        "step_source": "seconds",
        "postmortem_dir": None,
        "prometheus_sd_dir": str(sd_dir),
    }
    with (
        sampler.ResourceMonitor(prometheus_port=port, sink=Recorder(), **options),
        sampler.ResourceMonitor(prometheus_port=port + 1, sink=Recorder(), **options) as second,
    ):
        wait_for(lambda: len(list(sd_dir.glob("*.json"))) == 2, what="two entries")
        second.stop()
        (left,) = list(sd_dir.glob("*.json"))
        assert json.loads(left.read_text())[0]["targets"] == [f"127.0.0.1:{port}"]


@pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
def test_prometheus_keeps_an_entry_s_owner_off_the_series(tmp_path: Path) -> None:
    """The owner's labels are discovery metadata (``__meta_``): Prometheus takes the entry as
    it is and drops them after relabelling."""
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    port = free_ports()
    path = discovery.entry_path(str(sd_dir), Placement(HOST, run_id="r"), os.getpid())
    with PrometheusServer(tmp_path / "prometheus", sd_dir) as server:
        discovery.write_entry(path, f"127.0.0.1:{port}", Placement(HOST, run_id="r").labels())
        (target,) = server.wait_for_targets(lambda targets: len(targets) == 1)
    assert set(discovery.Owner.LABELS) <= set(target["discoveredLabels"])
    assert not [name for name in target["labels"] if name.startswith("__")]
    assert target["labels"]["run_id"] == "r"


def test_a_launcher_s_long_run_id_still_gets_an_entry(tmp_path: Path) -> None:
    """torchrun's ``--rdzv-id`` has no bound; a file name has (255 bytes)."""
    sd_dir = tmp_path / "sd"
    placement = Placement(HOST, run_id="r" * 300)
    path = discovery.entry_path(str(sd_dir), placement, os.getpid())
    discovery.write_entry(path, "127.0.0.1:9", placement.labels())
    assert json.loads(Path(path).read_text())[0]["labels"]["run_id"] == "r" * 300


NOBODY = 65534
"""The uid and gid of ``nobody``: another local user."""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to sweep as another user")
def test_another_user_s_sweep_judges_a_process_it_may_not_signal_by_its_start_time(tmp_path: Path) -> None:
    """``kill(pid, 0)`` on another user's process says only that it exists (EPERM): the entry
    stays while the pid is still its owner's, and goes once the pid is another process's."""
    sd_dir = tmp_path / "sd"
    here = discovery.this_process()
    assert here is not None
    kept = plant(sd_dir, "root-s", here)
    gone = plant(sd_dir, "reused", dataclasses.replace(here, started=here.started + 1))
    sd_dir.chmod(0o777)
    # A forked copy of this interpreter becomes nobody (no interpreter of this machine may
    # be one of theirs to start) and sweeps the directory it was in.
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: never returns into pytest
        status = 1
        try:
            os.chdir(sd_dir)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            logging.getLogger("sampler").disabled = True  # a lock another thread held at the fork
            os.write(write, str(len(discovery.remove_stale_entries(".", HOST))).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as answer:
        swept = answer.read()
    assert os.waitpid(pid, 0)[1] == 0 and swept == "1"
    assert kept.exists() and not gone.exists()
