"""Shared fixtures: fast monitors, and a guard that every test leaves nothing behind."""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import io
import os
import random
import secrets
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import fake_driver
import psutil
import pytest

import sampler
from ringbuf import NAME_PREFIX, segment
from sampler import commands, settings, signals
from sampler.pipeline import steps
from sampler.settings.placement import LAUNCHER_VARS
from sampler.store import schema

FAST = {"interval_seconds": 0.1, "_min_interval_seconds": 0.05}
"""Monitor settings for tests: below the 1 s floor, which only tests and benchmarks may use."""

ENV_VARS = (
    *(field.env for field in settings.FIELDS if field.env is not None),
    settings.ENV_CONFIG_PATH,
    "CUDA_VISIBLE_DEVICES",
    "FAKE_NVML",
    fake_driver.CONTROL_ENV,
    *LAUNCHER_VARS,
    "MASTER_ADDR",
    "MASTER_PORT",
)
"""Every variable the monitor reads: none of the user's may leak into a test."""


TESTS_DIR = str(Path(__file__).resolve().parent)


def backend_script(body: str) -> str:
    """A training script that imports the monitor, as a user would write it
    (``fake_nvml`` and the helpers of ``tests/`` importable)."""
    header = f"import os, signal, sys, time\nsys.path.insert(0, {TESTS_DIR!r})\nimport sampler\n"
    return header + textwrap.dedent(body)


def gone(pid: int) -> bool:
    """The process has exited (a zombie counts: it no longer runs)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def parse_command(*argv: str) -> argparse.Namespace:
    """``python -m sampler *argv`` as the real dispatcher parses it, not run yet."""
    return commands._parser().parse_args(list(argv))


def run_command(*argv: str, handler: Callable[[argparse.Namespace], int]) -> tuple[int, str]:
    """Run ``python -m sampler *argv`` in-process through the real dispatcher's
    parser, checking it reaches ``handler``: (exit status, what it printed)."""
    args = parse_command(*argv)
    assert args.handler is handler
    out = io.StringIO()
    args.out = out
    return args.handler(args), out.getvalue()


WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
"""This pytest-xdist worker's name (``gw0``, ``gw1``...), empty in a serial run."""
RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:6] or secrets.token_hex(3)
"""Six hex digits naming this test run: xdist's run id, shared by the run's workers (a serial
run draws its own), so that two runs side by side never take each other's names."""
SHM_PREFIX = NAME_PREFIX + RUN + f"{int(WORKER.removeprefix('gw') or 0):02x}"
"""The start of every segment name this run's worker makes (``per_run_segment_names``), so
that segments of other workers and of other runs never look like its leftovers."""


@pytest.fixture(autouse=True, scope="session")
def per_run_segment_names() -> Iterator[None]:
    """Segment names keep their form (the prefix and 16 hex digits): six digits name the run,
    two the worker, the rest are drawn."""
    tail = 16 - (len(SHM_PREFIX) - len(NAME_PREFIX))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(segment, "new_name", lambda: SHM_PREFIX + secrets.token_hex(8)[:tail])
        yield


WHOLE_MACHINE_LOCK = (
    Path(tempfile.gettempdir()) / f"wl-resource-monitor-tests-{os.geteuid()}.whole-machine.lock"
)
"""The file ``machine_to_itself`` locks: one name per user, shared by all of that user's test
runs (the point of it). Not one for all users: another user's file is not for us to trust."""
_refused: set[Path] = set()
"""Lock files this process found taken by something else and said so (once each)."""


def _open_lock(path: Path) -> int:
    """A descriptor of ``path``, a lock file of this user's alone (made 0600 if missing). OSError
    for a link (never followed), another user's file, one other users may open (and so hold the
    lock for good), or anything but a regular file (a FIFO is not waited on: opened, refused)."""
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    found = os.fstat(fd)
    if stat.S_ISREG(found.st_mode) and found.st_uid == os.geteuid() and not found.st_mode & 0o077:
        return fd
    os.close(fd)
    raise OSError(errno.EPERM, f"{stat.filemode(found.st_mode)}, owned by uid {found.st_uid}")


@contextlib.contextmanager
def machine_to_itself() -> Iterator[None]:
    """For work that disturbs the whole machine or judges it whole (busy processes pinned to a
    core, swap turned on, a run whose slow stretches are compared with its typical): one such
    at a time, across pytest-xdist workers and test runs (an exclusive lock on one file).
    Where ``WHOLE_MACHINE_LOCK`` is taken by something else, this run's own lock file beside it
    is used instead, after one warning: its workers still take turns, not with other runs."""
    try:
        fd = _open_lock(WHOLE_MACHINE_LOCK)
    except OSError as exc:
        if WHOLE_MACHINE_LOCK not in _refused:
            _refused.add(WHOLE_MACHINE_LOCK)
            warnings.warn(
                f"{WHOLE_MACHINE_LOCK} is not a lock file of uid {os.geteuid()} ({exc.strerror}): the"
                " tests that need the machine to themselves take turns within this run only",
                stacklevel=3,
            )
        fd = _open_lock(WHOLE_MACHINE_LOCK.with_name(f"{WHOLE_MACHINE_LOCK.name}.{RUN}"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the file closes
        yield
    finally:
        os.close(fd)


@pytest.fixture
def whole_machine() -> Iterator[None]:
    """The test has the machine to itself (``machine_to_itself``)."""
    with machine_to_itself():
        yield


WAIT_FOR_THE_MACHINE_SECONDS = 600
"""Added to the timeout of a test that waits for the machine: the suite's 120 s would count the
turns of another run's tests on it (two clones' suites side by side timed one out in its setup)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "whole_machine" in getattr(item, "fixturenames", ()):
            marker = item.get_closest_marker("timeout")
            own = float(marker.args[0]) if marker is not None and marker.args else 120.0
            item.add_marker(pytest.mark.timeout(own + WAIT_FOR_THE_MACHINE_SECONDS), append=False)


def shm_segments() -> set[str]:
    """This test run's (this worker's) named segments in /dev/shm."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIX)}


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.fixture(autouse=True)
def hermetic(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No user env var leaks in; no process, thread or segment leaks out. Each test
    starts in a scratch directory, so what a backend leaves where it was started
    (a postmortem, a store) never lands in the repository."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    signals._training_step = None  # the training step another test logged
    before_children = {p.pid for p in psutil.Process().children(recursive=True)}
    before_shm = shm_segments()
    yield
    sampler.stop_resource_monitor()
    steps.watch_model(None)
    signals._training_step = None
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        children = {p.pid for p in psutil.Process().children(recursive=True)} - before_children
        threads = [t for t in threading.enumerate() if t.name == "WL-ResourceMonitor"]
        if not children and not threads:
            break
        time.sleep(0.05)
    assert not children, f"test left child processes {children}"
    assert not threads, "test left a WL-ResourceMonitor thread running"
    assert shm_segments() <= before_shm, f"test left shared memory {shm_segments() - before_shm}"


class Recorder:
    """A sink that keeps every (name, value, step) it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []
        self._lock = threading.Lock()

    def __call__(self, name: str, value: float, step: int) -> None:
        with self._lock:
            self.calls.append((name, value, step))

    def names(self) -> set[str]:
        return {name for name, _, _ in self.calls}

    def gpus(self) -> set[str]:
        """The GPU indices some ``resource/gpu/<index>/...`` signal was logged for."""
        return {name.split("/")[2] for name in self.names() if name.startswith("resource/gpu/")}

    def steps(self, name: str) -> list[int]:
        return [step for n, _, step in self.calls if n == name]

    def values(self, name: str) -> list[float]:
        return [value for n, value, _ in self.calls if n == name]


WAIT_SECONDS = 60.0
"""How long a test waits for what it checks: a bound for a loaded machine, where (beside another
run of the suite) a sampling child took more than 15 s to start."""


def wait_for(predicate: Callable[[], Any], timeout: float = WAIT_SECONDS, what: str = "condition") -> Any:
    """``predicate()``'s first true result, polled every 20 ms; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def run_monitor(records: int = 2, **kwargs: Any) -> tuple[Recorder, dict[str, Any]]:
    """Run a fast monitor until ``records`` samples were logged; returns the sink and stats."""
    sink = Recorder()
    options = {**FAST, "step_source": "seconds", **kwargs}
    with sampler.ResourceMonitor(sink=sink, **options) as monitor:
        wait_for(lambda: monitor.stats()["records_logged"] >= records, what=f"{records} records")
        stats = monitor.stats()
    return sink, stats


def torchrun(
    rank: int, local_rank: int, world_size: int, local_world_size: int, **more: str
) -> dict[str, str]:
    """The variables torchrun sets for one of its ranks."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        **more,
    }


def start_ranks(script: str, ranks: int, run_id: str) -> list[subprocess.Popen[str]]:
    """``ranks`` backends of one launch on one host, as torchrun starts them, each running
    ``script`` with pipes for stdin and stdout; returns once each has printed ``started``."""
    backends = []
    for rank in range(ranks):
        env = {**os.environ, **torchrun(rank, rank, ranks, ranks, TORCHELASTIC_RUN_ID=run_id)}
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        backends.append(subprocess.Popen([sys.executable, "-c", script], text=True, env=env, **pipes))
    for backend in backends:
        assert backend.stdout is not None and backend.stdout.readline() == "started\n"
    return backends


def free_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1 right now, below the
    kernel's ephemeral range: a port in that range can be taken at any moment by any
    outgoing connection (a Prometheus server's scrape of another test's endpoint), and a
    test that restarts a child on its port would then find it in use."""
    ephemeral_low = _ephemeral_ports()[0]
    pick = random.Random(f"{os.getpid()}-{time.monotonic_ns()}")
    for _ in range(200):
        first = pick.randrange(10000, max(10001, ephemeral_low - count))
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError("no free ports")


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default if unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(part) for part in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def sampler_command(
    *args: str, cwd: Path, timeout: float = 60, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """``python -m sampler ARGS`` run in ``cwd``, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "sampler", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        **kwargs,
    )


def scrape(port: int) -> str:
    """The body of ``/metrics`` on 127.0.0.1:``port``; raises ``OSError`` when nothing serves."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def old_store(path: Path, version: int) -> Path:
    """A run store left at schema ``version`` by the real migrations, holding one run
    (pid 42 on host ``h``, written by ``0.0.<version>``) with one ``train/loss`` point."""
    db = sqlite3.connect(path, isolation_level=None)
    for migrate in range(version):
        schema._MIGRATIONS[migrate](db)
    db.execute(f"PRAGMA user_version = {version}")
    db.execute(
        "INSERT INTO runs (started_at, updated_at, host, pid, command, config, version)"
        f" VALUES (1.5, 2.5, 'h', 42, '[]', '{{}}', '0.0.{version}')"
    )
    db.execute("INSERT INTO signal_names (name) VALUES ('train/loss')")
    db.execute("INSERT INTO points VALUES (1, 1, 7, 3.5, 0.25)")
    db.close()
    return path


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> fake_driver.Driver:
    """The fake NVIDIA driver for this test (``nvml.configure(devices=[...])``): the real
    binding loads it in every process started after, the sampling child included."""
    return fake_driver.Driver(tmp_path, monkeypatch)


@pytest.fixture
def backends() -> Iterator[list[Any]]:
    """Backend processes (objects with ``close()``) to kill and reap after the test, whatever happened."""
    started: list[Any] = []
    yield started
    for backend in started:
        backend.close()


def default_sigint() -> None:
    """``preexec_fn`` of a process a test interrupts: SIGINT at its default, as under a terminal,
    whatever this test run inherited (a shell's background job starts with SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


T = TypeVar("T")


def as_psutil_reads(procfs: Path, read: Callable[[], T]) -> T:
    """``read()`` with psutil reading ``procfs`` as /proc (files a test wrote there)."""
    saved, psutil.PROCFS_PATH = psutil.PROCFS_PATH, str(procfs)
    try:
        return read()
    finally:
        psutil.PROCFS_PATH = saved
