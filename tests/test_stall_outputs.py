"""Where a stall is told besides its record: the endpoint's stalled gauge and age, the shipped
alert on them, the GPUs as they were, the other ranks' last steps, ``explain`` and the
postmortem. Each in a real backend with a real sampling child (the stall itself is
``tests/test_stalls.py``'s)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import FAST, Recorder, free_ports, scrape, wait_for

import sampler
from sampler.supervision.stacks import STACK_SIGNAL

parser = pytest.importorskip("prometheus_client.parser")

pytestmark = pytest.mark.skipif(STACK_SIGNAL is None, reason="the stall watch needs real-time signals")

STALL_SECONDS = 1.0


class Stepper:
    """A training loop's step, moved by a thread of its own until ``pause``."""

    def __init__(self) -> None:
        self.step = 0
        self._moving = threading.Event()
        self._moving.set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            self._moving.wait()
            self.step += 1
            self._done.wait(0.05)

    def pause(self) -> None:
        self._moving.clear()

    def resume(self) -> None:
        self._moving.set()

    def close(self) -> None:
        self._done.set()
        self._moving.set()
        self._thread.join()


@pytest.fixture
def stepper() -> Iterator[Stepper]:
    moving = Stepper()
    yield moving
    moving.close()


def stalling_monitor(stepper: Stepper, **kwargs: Any) -> sampler.ResourceMonitor:
    options: dict[str, Any] = {
        **FAST,
        "interval_seconds": 0.2,
        "categories": ["cpu"],
        "step_source": "model_age",
        "age_source": lambda: stepper.step,
        "stall_seconds": STALL_SECONDS,
        "sink": Recorder(),
        "postmortem_dir": None,
        **kwargs,
    }
    return sampler.ResourceMonitor(**options)


def stall_series(port: int) -> dict[str, float]:
    """The stall metrics in one scrape: name -> value (one rank: one series each)."""
    found = {}
    for family in parser.text_string_to_metric_families(scrape(port)):
        for sample in family.samples:
            if sample.name in ("wl_resource_stalled", "wl_resource_stall_age_seconds"):
                found[sample.name] = sample.value
    return found


def test_the_endpoint_serves_the_stalled_gauge_and_the_stall_s_age_while_it_lasts(stepper: Stepper) -> None:
    port = free_ports()
    with stalling_monitor(stepper, prometheus_port=port) as mon:
        wait_for(lambda: stepper.step >= 30 and mon.stats()["records_logged"] >= 5, what="a run that steps")
        assert stall_series(port) == {"wl_resource_stalled": 0}  # no age while no stall is open
        stepper.pause()
        paused_at = time.monotonic()
        first = wait_for(
            lambda: (found := stall_series(port)).get("wl_resource_stalled") == 1 and found, what="the stall"
        )
        assert STALL_SECONDS <= first["wl_resource_stall_age_seconds"] <= time.monotonic() - paused_at + 1
        later = wait_for(
            lambda: (
                (found := stall_series(port))["wl_resource_stall_age_seconds"]
                > first["wl_resource_stall_age_seconds"] + 0.5
                and found
            ),
            what="the age growing",
        )
        assert later["wl_resource_stalled"] == 1
        stepper.resume()
        wait_for(lambda: stall_series(port) == {"wl_resource_stalled": 0}, what="the stall closed")


def test_a_monitor_that_watches_no_stalls_serves_no_stall_metrics(stepper: Stepper) -> None:
    port = free_ports()
    with stalling_monitor(stepper, prometheus_port=port, stall_seconds="off") as mon:
        wait_for(lambda: mon.stats()["records_logged"] >= 2, what="records")
        text = scrape(port)
    assert "wl_resource_model_age" in text and "stall" not in text
