"""stop() takes one last sample, so a run's end is sampled however long its interval: a
60 s run at the 15 s default had its last 13.5 s unsampled. It goes through the same
pipeline (sink, store); a child that is hung or dead at stop() gives none, and stop() still ends."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest
from conftest import Recorder, wait_for

import sampler
from sampler.store.reader import StoreReader

CPU = "resource/cpu/utilization_percent"
LONG_INTERVAL = {"interval_seconds": 3600.0}
"""No second sample of its own comes in a test's life."""


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_stop_takes_a_last_sample_through_sink_and_store(tmp_path: Path, isolation: str) -> None:
    path = tmp_path / "runs.sqlite"
    step = [1]
    sink = Recorder()
    monitor = sampler.ResourceMonitor(
        categories=["cpu"],
        sink=sink,
        store=str(path),
        age_source=lambda: step[0],
        isolation=isolation,
        **LONG_INTERVAL,
    ).start()
    try:
        wait_for(lambda: monitor.stats()["records_logged"] >= 1, what="the first sample")
        step[0] = 7  # the training went on after it
    finally:
        monitor.stop()
    assert sink.steps(CPU) == [1, 7]
    assert monitor.stats()["records_logged"] == 2
    with StoreReader(str(path)) as reader:
        run = reader.run()
        assert run.ended_at is not None
        assert reader.records(run.id, [CPU]).steps.tolist() == [1, 7]


def test_stop_ends_without_a_last_sample_when_the_child_is_hung(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    step = [1]
    sink = Recorder()
    monitor = sampler.ResourceMonitor(
        categories=["cpu"], sink=sink, store=str(path), age_source=lambda: step[0], **LONG_INTERVAL
    ).start()
    try:
        wait_for(lambda: monitor.stats()["records_logged"] >= 1, what="the first sample")
        child = monitor.child_pid
        assert child is not None
        os.kill(child, signal.SIGSTOP)  # it cannot answer STOP
        step[0] = 7
    finally:
        monitor.stop()
    assert sink.steps(CPU) == [1]
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    with StoreReader(str(path)) as reader:
        assert reader.run().ended_at is not None
