"""The child's stop flag: what its sleeps between readings wait on."""

from __future__ import annotations

import threading

from conftest import WAIT_SECONDS

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
