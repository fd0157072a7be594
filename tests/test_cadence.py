"""The child's schedule (records, and readings between them) and its stop flag."""

from __future__ import annotations

import itertools
import threading

import pytest
from conftest import WAIT_SECONDS

from sampler.child import cadence
from sampler.child.cadence import Stop


def test_a_wait_on_an_unset_stop_times_out() -> None:
    stop = Stop()
    assert not stop.wait(0) and not stop.wait(0.01) and not stop.is_set()


def test_setting_the_stop_from_another_thread_wakes_a_waiter() -> None:
    stop = Stop()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(stop.wait(WAIT_SECONDS)))
    waiter.start()
    stop.set()
    waiter.join(WAIT_SECONDS)
    assert woke == [True]


def test_a_set_stop_stays_set_for_every_later_wait() -> None:
    stop = Stop()
    stop.set()
    stop.set()  # a second call changes nothing
    assert stop.is_set() and stop.wait(0) and stop.wait(WAIT_SECONDS) and stop.wait(0)


@pytest.mark.parametrize(("interval", "inner_interval"), [(1.0, 0.2), (1.0, 0.3), (15.0, 0.2), (0.5, 0.2)])
def test_readings_between_records_keep_their_window_beside_the_record(
    monkeypatch: pytest.MonkeyPatch, interval: float, inner_interval: float
) -> None:
    """The child's schedule on a clock the test moves (each reading takes 1 ms): no tracked
    reading comes a few ms after another (a window that short reads a CPU % of 0 or 100 into the
    record's mean), and a record costs no extra wake-up: about one tracked reading per inner
    interval, the record's own included."""
    now = [1000.0]
    monkeypatch.setattr(cadence.time, "monotonic", lambda: now[0])
    records, inner = cadence.Cadence(interval), cadence.Cadence(inner_interval)
    tracked: list[float] = []
    record_times: list[float] = []
    while now[0] < 1000.0 + 20 * interval:
        if cadence.inner_first(records, inner):
            now[0] += inner.seconds_left()
            tracked.append(now[0])
            now[0] += 0.001
            inner.advance()
            continue
        now[0] += records.seconds_left()
        record_times.append(now[0])
        tracked.append(now[0])
        now[0] += 0.001
        cadence.record_took(inner)
        records.advance()
    gaps = [b - a for a, b in itertools.pairwise(tracked)]
    assert min(gaps) >= inner_interval / 2 - 0.002, sorted(gaps)[:3]
    span = record_times[-1] - record_times[0]
    assert len([t for t in tracked if record_times[0] < t <= record_times[-1]]) <= span / inner_interval + 1
