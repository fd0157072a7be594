"""The reader's hang verdict, driven through a real status block and real pipes,
with the test playing the child's part in the status block."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from sampler.ipc.status import ChildStatus, phase_of
from sampler.pipeline.emit import Emitter
from sampler.pipeline.stats import MonitorStats
from sampler.pipeline.steps import StepStamper
from sampler.supervision.reader import STALL_GRACE_NS, ChildReader, Outcome

INTERVAL = 0.1
DEADLINE = 0.5
"""The reader's interval and hang deadline, s."""
IDLE = -1
"""The phase between samples."""
TRIES = 5


@dataclass
class ChildChannel:
    """What the reader needs of a child: the backend's end of its channel and of its wake-up
    pipe, and no pidfd or log pipe (the test's child is no process; it never exits)."""

    sock: socket.socket
    wake_fd: int
    pid: int = 0
    pidfd: int | None = None
    log_fd: int | None = None

    def poll(self) -> bool:
        return False


@contextlib.contextmanager
def channel() -> Iterator[tuple[ChildReader, ChildStatus, int]]:
    """A reader of a status block the test writes as the child would, and the write end of its
    stop pipe."""
    status, status_fd = ChildStatus.create()
    os.close(status_fd)
    ours, theirs = socket.socketpair()
    stop_r, stop_w = os.pipe()
    wake_r, wake_w = os.pipe()
    stats = MonitorStats()
    emitter = Emitter(StepStamper("seconds", None, 0), lambda *a: None, stats)
    child = ChildChannel(ours, wake_r)
    yield (
        ChildReader(child, status, stop_r, emitter, stats, interval=INTERVAL, hang_deadline=DEADLINE),  # type: ignore[arg-type]
        status,
        stop_w,
    )
    for end in (ours, theirs):
        end.close()
    for fd in (stop_r, stop_w, wake_r, wake_w):
        os.close(fd)
    status.close()


@pytest.fixture
def reader() -> Iterator[tuple[ChildReader, ChildStatus, int]]:
    with channel() as made:
        yield made


def serve_in_thread(reader: ChildReader) -> tuple[threading.Thread, list[Outcome]]:
    result: list[Outcome] = []
    thread = threading.Thread(target=lambda: result.append(reader.serve()))
    thread.start()
    return thread, result


def play(
    status: ChildStatus, stop_w: int, phases: list[int], hold: float, current: tuple[float, float]
) -> bool:
    """The test as the child: ``hold`` seconds in each phase, then the next of ``phases``, and
    after the last the reader is stopped. Whether each phase ended within its deadline, from
    just before it was entered to just after the next one was, however long the machine kept
    this thread waiting; ``current``: (since, limit) for the phase current at the call."""
    fits = True
    began, limit = current
    for phase in [*phases, None]:
        time.sleep(hold)
        entering = time.monotonic()
        if phase is None:
            os.write(stop_w, b"x")
        else:
            status.enter(phase)
        fits = fits and time.monotonic() - began < limit
        # An idle child is overdue once its next sample is: an interval later, plus the deadline.
        began, limit = entering, DEADLINE + (INTERVAL if phase == IDLE else 0)
    return fits


def verdict_where_every_phase_fit(attempt: Callable[[], tuple[bool, list[Outcome]]]) -> list[Outcome]:
    """The reader's outcomes of the first of ``TRIES`` attempts whose child kept every phase
    within its deadline. A loaded machine may keep the test's thread, which plays the child,
    waiting past a deadline, and then the reader is right to call it hung: that try tells
    nothing and is made again."""
    for _ in range(TRIES):
        fits, result = attempt()
        if fits:
            return result
    raise AssertionError(f"none of {TRIES} tries kept every phase within its deadline: too loaded to tell")


def test_a_phase_past_its_deadline_is_a_hang(reader) -> None:
    serving, status, _ = reader
    status.enter(phase_of("gpu"))
    began = time.monotonic()
    assert serving.serve() is Outcome.HUNG  # should it never return, pytest's timeout ends the test
    assert time.monotonic() - began >= DEADLINE - 0.1
    assert serving.hung_phase == phase_of("gpu")


def test_a_child_that_keeps_moving_is_never_hung() -> None:
    def attempt() -> tuple[bool, list[Outcome]]:
        with channel() as (serving, status, stop_w):
            since = time.monotonic()
            # Past its start-up: the reader would not look again before that long deadline.
            status.enter(IDLE)
            thread, result = serve_in_thread(serving)
            # 1.6 s of a healthy child: a fresh phase every 0.1 s
            fits = play(status, stop_w, [phase_of("cpu"), IDLE] * 8, INTERVAL, (since, DEADLINE + INTERVAL))
            thread.join(15)
        return fits, result

    assert verdict_where_every_phase_fit(attempt) == [Outcome.STOPPED]


def test_after_a_stall_the_child_gets_a_grace_period() -> None:
    """As after a VM pause: the reader wakes to a status that is long overdue,
    but the child moves on within the grace period, so it is not killed."""

    def attempt() -> tuple[bool, list[Outcome]]:
        with channel() as (serving, status, stop_w):
            status.enter(phase_of("disk"))
            time.sleep(1.2)  # the deadline (0.5 s) is now more than the stall slack behind us
            since = time.monotonic()  # the reader wakes after this: its grace ends later
            thread, result = serve_in_thread(serving)
            # The child resumes and finishes its sample, then takes another.
            fits = play(status, stop_w, [IDLE, phase_of("cpu"), IDLE], 0.3, (since, STALL_GRACE_NS / 1e9))
            thread.join(15)
        return fits, result

    assert verdict_where_every_phase_fit(attempt) == [Outcome.STOPPED]


def test_a_stalled_child_that_stays_stuck_is_hung_after_the_grace(reader) -> None:
    serving, status, _ = reader
    status.enter(phase_of("disk"))
    time.sleep(1.2)
    began = time.monotonic()
    assert serving.serve() is Outcome.HUNG
    assert time.monotonic() - began >= STALL_GRACE_NS / 1e9 - 0.1
