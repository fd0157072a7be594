"""The child's status block, read by the backend while the child writes it."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import TESTS_DIR

from sampler.catalogue import STEP_PHASES
from sampler.collectors import Sources
from sampler.ipc.channel import ChildParams, PostmortemTarget, StackTarget, receive_hello, send_hello
from sampler.ipc.status import (
    CALL_BYTES,
    ENDPOINT_BAD_ADDRESS,
    ENDPOINT_NONE,
    ENDPOINT_UNAVAILABLE,
    EXIT_UNDECLARED,
    NOT_LOGGED,
    PHASE_IDLE,
    PHASE_STARTING,
    RESTART_CAUSES,
    ChildStatus,
    Health,
)
from sampler.settings import DEFAULT_CATEGORIES
from sampler.settings.table import MonitorSettings

WRITER = textwrap.dedent(
    """
    import signal, sys, time
    sys.path.insert(0, {tests!r})
    from sampler.ipc.status import ChildStatus
    status = ChildStatus.from_fd({fd})
    phases = list(range(-2, 6))
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    print("ready", flush=True)
    end = time.monotonic() + {seconds}
    k = 0
    while not stopped and time.monotonic() < end:
        # A new microsecond for every phase, so each 'since' names one phase.
        last = time.monotonic_ns() // 1000
        while time.monotonic_ns() // 1000 == last:
            pass
        status.enter(phases[k % len(phases)])
        status.count_sample(1000)
        k += 1
    print(k, flush=True)
    """
)


def test_a_concurrent_reader_never_sees_a_torn_or_zeroed_phase() -> None:
    """One process enters phases as fast as it can; this one reads as fast as
    it can, for 1.8 s and until it has read enough of them (on a loaded machine the
    writer may get little of a core: at most a minute). Every read must show a phase the
    writer wrote, with the 'since' it wrote it with: never zero, never going back,
    never another phase's."""
    status, fd = ChildStatus.create()
    seconds = 60.0
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER.format(tests=TESTS_DIR, fd=fd, seconds=seconds)],
        pass_fds=[fd],
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(fd)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        phase_at: dict[int, int] = {}
        reads = zeroed = torn = backwards = 0
        last_since = 0
        samples_seen = 0
        began = time.monotonic()
        end = began + seconds - 1

        def reading() -> bool:  # 1.8 s at least, as long as a quiet machine needs; longer until enough
            now = time.monotonic()
            enough = reads > 10_000 and len(phase_at) > 100 and samples_seen > 10_000
            return now < end and (now < began + 1.8 or not enough)

        while reading():
            snap = status.read()
            reads += 1
            if snap.since_ns == 0:
                zeroed += 1
                continue
            if phase_at.setdefault(snap.since_ns, snap.phase) != snap.phase:
                torn += 1
            if snap.since_ns < last_since:
                backwards += 1
            last_since = max(last_since, snap.since_ns)
            assert PHASE_STARTING <= snap.phase <= 5
            assert snap.samples >= samples_seen
            samples_seen = snap.samples
        writer.terminate()  # the writer stops at once and says how many it wrote
        written = int(writer.stdout.readline())
    finally:
        writer.kill()
        writer.wait()
        status.close()
    print(f"{reads} reads of {written} phases: {zeroed} zeroed, {torn} torn, {backwards} backwards")
    assert written > 10_000 and reads > 10_000 and len(phase_at) > 100
    assert (zeroed, torn, backwards) == (0, 0, 0)


def test_a_new_block_says_starting_and_nothing_declared() -> None:
    status, fd = ChildStatus.create()
    os.close(fd)
    try:
        snap = status.read()
        assert snap.phase == PHASE_STARTING and snap.exit_declared == EXIT_UNDECLARED
        assert abs(snap.since_ns - time.monotonic_ns()) < 1e9
        status.enter(PHASE_IDLE)
        status.declare_exit(3)
        status.count_sample(2_000_000)
        snap = status.read()
        assert (snap.phase, snap.exit_declared, snap.samples) == (PHASE_IDLE, 3, 1)
        assert snap.cpu_seconds_per_sample == 0.002
    finally:
        status.close()


def test_the_backend_publishes_what_it_logged_to_the_child() -> None:
    status, fd = ChildStatus.create()
    child = ChildStatus.from_fd(fd)
    os.close(fd)
    try:
        assert child.logged() == (0, NOT_LOGGED)  # nothing logged yet: carry every window
        status.publish_logged(41, 1234)
        assert child.logged() == (42, 1234)
        assert child.read().phase == PHASE_STARTING  # the child's words are untouched
    finally:
        child.close()
        status.close()


def test_child_params_cross_the_channel_typed() -> None:
    sources = Sources(disk_path="/", pid=os.getpid(), nvml_module="pynvml", gpu_devices=("0", "GPU-ab"))
    target = PostmortemTarget(directory="/tmp/pm", store=None, started_at=1.5)
    params = ChildParams(
        ("cpu", "gpu"), MonitorSettings(gpu_devices=("0", "GPU-ab")), sources, os.getpid(), 64, target
    )
    assert ChildParams.decode(params.encode()[4:]) == params
    bare = ChildParams(("cpu",), MonitorSettings(), Sources("/", 1, "pynvml"), 1, 8, None)
    assert ChildParams.decode(bare.encode()[4:]) == bare


def test_a_hello_with_its_three_descriptors_arrives_whole_and_one_without_them_is_refused() -> None:
    params = ChildParams(("cpu",), MonitorSettings(), Sources("/", 1, "pynvml"), 1, 8, None)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    logs_r, logs_w = os.pipe()
    try:
        send_hello(ours, params, r, w, logs_w, None)
        got, status_fd, wake_fd, log_fd, stacks_fd = receive_hello(theirs)
        assert got == params and stacks_fd is None
        os.write(wake_fd, b".")  # the descriptors came in the order sent
        assert os.read(r, 1) == b"."
        os.write(log_fd, b"0 said")
        assert os.read(logs_r, 6) == b"0 said"
        for fd in (status_fd, wake_fd, log_fd):
            os.close(fd)
        socket.send_fds(ours, [params.encode()], [r])  # the pipes left out
        open_before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(ConnectionError, match="carried 1 descriptors, expected 3"):
            receive_hello(theirs)
        assert len(os.listdir("/proc/self/fd")) == open_before  # the one that came is closed
    finally:
        for fd in (r, w, logs_r, logs_w):
            os.close(fd)
        ours.close()
        theirs.close()


# --------------------------------------------------------------------------- endpoint and health words


def test_a_new_block_has_no_endpoint_and_a_clean_health() -> None:
    status, fd = ChildStatus.create()
    child = ChildStatus.from_fd(fd)
    os.close(fd)
    try:
        assert status.endpoint() == ENDPOINT_NONE == 0
        health = child.health()
        assert health == Health({"crash": 0, "hang": 0, "start": 0}, 0, ())
        assert list(health.restarts) == list(RESTART_CAUSES) == ["crash", "hang", "start"]
    finally:
        child.close()
        status.close()


@pytest.mark.parametrize(
    "state", [9400, 65535, -errno.EADDRINUSE, ENDPOINT_UNAVAILABLE, ENDPOINT_BAD_ADDRESS]
)
def test_the_child_tells_the_backend_its_endpoint(state: int) -> None:
    status, fd = ChildStatus.create()
    child = ChildStatus.from_fd(fd)
    os.close(fd)
    try:
        status.publish_logged(4, 99)
        status.publish_health({"crash": 1}, 2, ["gpu"])
        before = (status.read(), child.logged(), child.health())
        child.set_endpoint(state)
        assert status.endpoint() == state
        assert (status.read(), child.logged(), child.health()) == before  # no other word moved
    finally:
        child.close()
        status.close()


def test_the_endpoint_states_are_distinct_from_ports_and_errnos() -> None:
    lowest_errno = -max(errno.errorcode)
    assert max(ENDPOINT_UNAVAILABLE, ENDPOINT_BAD_ADDRESS) < lowest_errno
    assert len({ENDPOINT_NONE, ENDPOINT_UNAVAILABLE, ENDPOINT_BAD_ADDRESS}) == 3


def test_the_backend_publishes_its_health_to_the_child() -> None:
    status, fd = ChildStatus.create()
    child = ChildStatus.from_fd(fd)
    os.close(fd)
    try:
        status.publish_health({"crash": 3, "hang": 1, "start": 2}, 17, ["gpu", "cpu", "container"])
        health = child.health()
        assert health.restarts == {"crash": 3, "hang": 1, "start": 2}
        assert health.records_lost == 17
        assert health.quarantined == ("cpu", "gpu", "container")  # in DEFAULT_CATEGORIES order
        status.publish_health({"hang": 4}, 0, [])  # a cause not given counts 0; nothing quarantined
        assert child.health() == Health({"crash": 0, "hang": 4, "start": 0}, 0, ())
        everything = list(DEFAULT_CATEGORIES)
        status.publish_health({}, 2**40, everything)
        assert child.health() == Health(dict.fromkeys(RESTART_CAUSES, 0), 2**40, DEFAULT_CATEGORIES)
        assert child.read().phase == PHASE_STARTING and child.logged() == (0, NOT_LOGGED)
        assert status.endpoint() == ENDPOINT_NONE
    finally:
        child.close()
        status.close()


def test_publish_lost_changes_only_the_records_lost() -> None:
    status, fd = ChildStatus.create()
    child = ChildStatus.from_fd(fd)
    os.close(fd)
    try:
        child.set_endpoint(9401)
        status.publish_logged(9, 300)
        status.publish_health({"crash": 2, "hang": 1, "start": 5}, 4, ["disk", "process_tree"])
        status.publish_lost(11)
        assert child.health() == Health({"crash": 2, "hang": 1, "start": 5}, 11, ("disk", "process_tree"))
        assert status.endpoint() == 9401 and child.logged() == (10, 300)
        snap = status.read()
        assert (snap.phase, snap.samples, snap.exit_declared) == (PHASE_STARTING, 0, EXIT_UNDECLARED)
    finally:
        child.close()
        status.close()


def test_health_crosses_to_another_process() -> None:
    status, fd = ChildStatus.create()
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from sampler.ipc.status import ChildStatus\n"
        "child = ChildStatus.from_fd(int(sys.argv[2]))\n"
        "h = child.health()\n"
        "print(h.restarts['crash'], h.restarts['start'], h.records_lost, *h.quarantined)\n"
        "child.set_endpoint(9402)"
    )
    try:
        status.publish_health({"crash": 1, "start": 6}, 23, ["network"])
        done = subprocess.run(
            [sys.executable, "-c", code, TESTS_DIR, str(fd)],
            pass_fds=[fd],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["1", "6", "23", "network"]
        assert status.endpoint() == 9402
    finally:
        os.close(fd)
        status.close()


def test_the_nvml_call_under_way_is_read_back_and_a_long_one_cut() -> None:
    status, fd = ChildStatus.create()
    os.close(fd)
    try:
        assert status.call() is None  # no call yet
        status.note_call(b"nvmlDeviceGetPowerUsage on GPU 1\0")
        assert status.call() == "nvmlDeviceGetPowerUsage on GPU 1"
        status.note_call(b"x" * 100 + b"\0")
        assert status.call() == "x" * (CALL_BYTES - 1)
        status.note_call(b"\0")  # the call returned
        assert status.call() is None
    finally:
        status.close()


# --------------------------------------------------------------------------- the step phases


def test_the_backend_publishes_the_step_phases_to_the_child_and_no_other_word_moves() -> None:
    status, fd = ChildStatus.create()
    child = ChildStatus.from_fd(fd)
    os.close(fd)
    try:
        assert child.phases() == (0, (0.0,) * len(STEP_PHASES))  # nothing timed yet
        child.set_endpoint(9403)
        child.note_call(b"nvmlDeviceGetCount on GPU 0\0")
        status.publish_logged(2, 40)
        status.publish_health({"hang": 1}, 3, ["gpu"], gpu_errors=2)

        def words() -> tuple[object, ...]:
            return (
                status.read(),
                child.logged(),
                child.health(),
                child.gpus(),
                status.endpoint(),
                status.call(),
            )

        before = words()
        status.publish_phases(17, (1.5, 0.25, 3.0, 0.125, 1e-9))
        assert child.phases() == (17, (1.5, 0.25, 3.0, 0.125, 1e-9))
        assert words() == before
        status.publish_phases(2**40, (1e6,) * len(STEP_PHASES))  # a week of steps still fits a word
        assert child.phases() == (2**40, (1e6,) * len(STEP_PHASES))
    finally:
        child.close()
        status.close()


def test_a_hello_with_a_stack_signal_carries_the_dump_s_memory_file() -> None:
    stacks = StackTarget(signal.SIGRTMIN + 13, 1234, 5678)
    params = ChildParams(("cpu",), MonitorSettings(), Sources("/", 1, "pynvml"), 1, 8, None, stacks=stacks)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    memfd = os.memfd_create("test-stacks")
    try:
        with pytest.raises(ValueError, match="goes with its memory file"):
            send_hello(ours, params, r, w, w, None)
        send_hello(ours, params, r, w, w, memfd)
        got, *fds, stacks_fd = receive_hello(theirs)
        assert got == params and got.stacks == stacks and stacks_fd is not None
        os.write(memfd, b"Thread 0x1")
        assert os.pread(stacks_fd, 10, 0) == b"Thread 0x1"  # the same file
        for fd in (*fds, stacks_fd):
            os.close(fd)
    finally:
        for fd in (r, w, memfd):
            os.close(fd)
        ours.close()
        theirs.close()
