"""The reader's hang verdict, driven through a real status block and real pipes,
with the test playing the child's part in the status block."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sampler.ipc.status import ChildStatus, phase_of
from sampler.pipeline.emit import Emitter
from sampler.pipeline.stats import MonitorStats
from sampler.pipeline.steps import StepStamper
from sampler.supervision.reader import ChildReader, Outcome


@dataclass
class ChildChannel:
    """What the reader needs of a child: the backend's end of its channel and of its wake-up
    pipe, and no pidfd (the test's child is no process; it never exits)."""

    sock: socket.socket
    wake_fd: int
    pid: int = 0
    pidfd: int | None = None

    def poll(self) -> bool:
        return False


@pytest.fixture
def reader() -> Iterator[tuple[ChildReader, ChildStatus, int]]:
    status, status_fd = ChildStatus.create()
    os.close(status_fd)
    ours, theirs = socket.socketpair()
    stop_r, stop_w = os.pipe()
    wake_r, wake_w = os.pipe()
    stats = MonitorStats()
    emitter = Emitter(StepStamper("seconds", None, 0), lambda *a: None, stats)
    child = ChildChannel(ours, wake_r)
    yield (
        ChildReader(child, status, stop_r, emitter, stats, interval=0.1, hang_deadline=0.5),  # type: ignore[arg-type]
        status,
        stop_w,
    )
    for end in (ours, theirs):
        end.close()
    for fd in (stop_r, stop_w, wake_r, wake_w):
        os.close(fd)
    status.close()


def serve_in_thread(reader: ChildReader) -> tuple[threading.Thread, list[Outcome]]:
    result: list[Outcome] = []
    thread = threading.Thread(target=lambda: result.append(reader.serve()))
    thread.start()
    return thread, result


def test_a_phase_past_its_deadline_is_a_hang(reader) -> None:
    serving, status, _ = reader
    status.enter(phase_of("gpu"))
    began = time.monotonic()
    assert serving.serve() is Outcome.HUNG
    assert 0.4 <= time.monotonic() - began < 3
    assert serving.hung_phase == phase_of("gpu")


def test_a_child_that_keeps_moving_is_never_hung(reader) -> None:
    serving, status, stop_w = reader
    thread, result = serve_in_thread(serving)
    for _ in range(15):  # 1.5 s of a healthy child: a fresh phase every 0.1 s
        status.enter(phase_of("cpu"))
        time.sleep(0.1)
        status.enter(-1)
    os.write(stop_w, b"x")
    thread.join(5)
    assert result == [Outcome.STOPPED]


def test_after_a_stall_the_child_gets_a_grace_period(reader) -> None:
    """As after a VM pause: the reader wakes to a status that is long overdue,
    but the child moves on within the grace period, so it is not killed."""
    serving, status, stop_w = reader
    status.enter(phase_of("disk"))
    time.sleep(1.2)  # the deadline (0.5 s) is now more than the stall slack behind us
    thread, result = serve_in_thread(serving)
    time.sleep(0.3)
    status.enter(-1)  # the child resumes and finishes its sample
    time.sleep(0.3)
    status.enter(phase_of("cpu"))
    time.sleep(0.3)
    status.enter(-1)
    os.write(stop_w, b"x")
    thread.join(5)
    assert result == [Outcome.STOPPED]


def test_a_stalled_child_that_stays_stuck_is_hung_after_the_grace(reader) -> None:
    serving, status, _ = reader
    status.enter(phase_of("disk"))
    time.sleep(1.2)
    began = time.monotonic()
    assert serving.serve() is Outcome.HUNG
    assert 0.9 <= time.monotonic() - began < 3
