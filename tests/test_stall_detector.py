"""The stall rule alone (``sampler.child.stall``), fed observations as the child's loop feeds
them: (time, step last logged, records the monitor thread has not taken)."""

from __future__ import annotations

import pytest

from sampler.child.stall import (
    FLOOR_SECONDS,
    MONITOR_MAX_SECONDS,
    NOT_TAKEN_RECORDS,
    RECAPTURES,
    Lasting,
    Resumed,
    Stall,
    StallDetector,
)
from sampler.ipc.status import NOT_LOGGED


def feed(detector: StallDetector, views: list[tuple[float, int, int]]) -> list[Stall | Lasting | Resumed]:
    events = []
    for now, step, not_taken in views:
        event = detector.observe(now, step, not_taken)
        if event is not None:
            events.append(event)
    return events


def test_no_stall_before_the_first_step_however_long() -> None:
    detector = StallDetector(2.0, 1.0)
    assert feed(detector, [(t, NOT_LOGGED, 0) for t in range(100)]) == []
    assert feed(detector, [(t, 0, NOT_TAKEN_RECORDS + 5) for t in range(100, 200)]) == []


def test_a_fixed_timeout_opens_one_stall_and_the_next_step_closes_it() -> None:
    detector = StallDetector(2.0, 0.5)
    steady = [(t * 0.5, t, 0) for t in range(10)]  # a step per record
    stuck = [(5.0 + t * 0.5, 10, 0) for t in range(10)]  # the step stands at 10 from 5.0
    events = feed(detector, steady + stuck)
    assert len(events) == 1
    stall = events[0]  # 5 s stuck: not yet 4 times the 2.5 s it took to be seen
    assert isinstance(stall, Stall)
    assert (stall.kind, stall.step, stall.since, stall.timeout) == ("steps", 10, 5.0, 2.0)
    assert stall.waited == 2.5  # the first record past 2 s
    resumed = detector.observe(20.0, 11, 0)
    assert isinstance(resumed, Resumed) and resumed.stall is stall and resumed.duration == 15.0
    assert detector.observe(20.5, 11, 0) is None  # a new stall needs the timeout again


def test_the_learned_timeout_follows_the_run_s_slow_steps_above_the_floor() -> None:
    detector = StallDetector("auto", 1.0)
    assert detector.timeout() == FLOOR_SECONDS
    # Steps of 20 s, one per 20 records: the timeout is 5 times that, 100 s.
    views = [(float(t), t // 20, 0) for t in range(0, 400)]
    assert feed(detector, views) == []
    assert detector.timeout() == pytest.approx(100.0)
    stuck = [(400.0 + t, 20, 0) for t in range(120)]
    events = [e for e in feed(detector, stuck) if not isinstance(e, Lasting)]
    assert [e.kind for e in events if isinstance(e, Stall)] == ["steps"]
    assert events[0].waited > 100.0


def test_fast_steps_keep_the_floor() -> None:
    detector = StallDetector("auto", 1.0)
    views = [(float(t), t * 50, 0) for t in range(100)]  # 50 steps per record
    assert feed(detector, views) == []
    assert detector.timeout() == FLOOR_SECONDS
    events = feed(detector, [(100.0 + t, 99 * 50, 0) for t in range(int(FLOOR_SECONDS) + 2)])
    assert len(events) == 1 and events[0].kind == "steps"


def test_a_monitor_thread_taking_no_record_is_a_stall_before_the_timeout() -> None:
    detector = StallDetector(600.0, 1.0)
    feed(detector, [(float(t), t, 0) for t in range(10)])
    # From t=10 on the monitor thread takes nothing: each record finds the ones before it waiting.
    events = feed(detector, [(10.0 + t, 9, t) for t in range(6)])
    assert len(events) == 1
    stall = events[0]
    assert isinstance(stall, Stall) and stall.kind == "monitor" and stall.not_taken == NOT_TAKEN_RECORDS
    assert stall.untaken_for == NOT_TAKEN_RECORDS * 1.0 and stall.detected_at == 13.0


def test_a_gil_held_40_s_is_seen_between_records_at_the_15_s_default() -> None:
    """Three intervals would be 45 s: the first record into the hold is watched between records
    and counts as not taken after ``MONITOR_MAX_SECONDS``."""
    detector = StallDetector("auto", 15.0)
    feed(detector, [(15.0 * t, 100 * t, 0) for t in range(11)])  # taken as written, to t=150
    assert detector.observe(165.0, 1000, 0) is None  # written into the hold (it began at 151)
    polls = [165.0 + 0.2 * k for k in range(1, 60)]
    events = [(now, detector.observe(now, 1000, 1, record=False)) for now in polls]
    seen = [(now, event) for now, event in events if event is not None]
    assert len(seen) == 1 and isinstance(seen[0][1], Stall) and seen[0][1].kind == "monitor"
    assert seen[0][0] == pytest.approx(165.0 + MONITOR_MAX_SECONDS), seen  # 24 s into a 40 s hold
    assert seen[0][1].untaken_for == pytest.approx(MONITOR_MAX_SECONDS)


def test_off_sees_nothing() -> None:
    detector = StallDetector("off", 1.0)
    views = [(float(t), min(t, 3), t) for t in range(1000)]
    assert feed(detector, views) == []


def test_a_step_going_back_is_a_move_not_a_duration() -> None:
    detector = StallDetector("auto", 1.0)
    feed(detector, [(0.0, 100, 0), (1.0, 200, 0), (2.0, 0, 0), (3.0, 5, 0)])
    assert list(detector.durations) == [1.0 / 100, 1.0 / 5]  # the first move's, a lower bound


def test_a_lasting_stall_is_captured_again_a_bounded_number_of_times() -> None:
    detector = StallDetector(2.0, 1.0)
    feed(detector, [(float(t), t, 0) for t in range(5)])
    events = feed(detector, [(5.0 + t, 5, 0) for t in range(1, 1000)])  # stuck for good
    stall, *again = events
    assert isinstance(stall, Stall) and stall.waited == 3.0
    assert [type(e) for e in again] == [Lasting] * RECAPTURES
    assert [e.waited for e in again if isinstance(e, Lasting)] == [12.0, 48.0]  # 4 and 16 times 3 s


def test_a_run_of_30_s_steps_is_no_stall_when_its_second_step_runs_past_the_floor() -> None:
    """Records every second, steps of about 30 s (the floor), the monitor started with the run:
    the first step, seen from its first record, bounds the step from below before any whole
    step is timed."""
    detector = StallDetector("auto", 1.0)
    moves = [0.0, 30.0, 61.5, 91.0, 122.0, 151.0, 183.0]  # the second step 31.5 s
    views = [(float(t), sum(t >= m for m in moves) - 1, 0) for t in range(1, 200)]
    assert feed(detector, views) == []
    assert detector.timeout() > 4 * FLOOR_SECONDS
