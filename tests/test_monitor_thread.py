"""Issue 7: the monitor thread cannot die silently, and stop() cannot hang or raise,
whoever calls it from wherever."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import FAST, Recorder, backend_script, gone, open_fds, wait_for

import sampler
from sampler.supervision import reader

CPU = "resource/cpu/utilization_percent"


def test_a_sink_raising_a_base_exception_is_counted_and_the_thread_lives_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def cancelled(name: str, value: float, step: int) -> None:
        raise asyncio.CancelledError()

    with sampler.ResourceMonitor(categories=["cpu"], sink=cancelled, step_source="seconds", **FAST) as mon:
        wait_for(lambda: mon.stats()["records_logged"] >= 3, what="records despite the sink")
        stats = mon.stats()
        assert mon.running
    assert stats["sink_errors"] >= 3 and stats["error"] is None
    assert any("CancelledError" in r.getMessage() for r in caplog.records)


def test_a_bug_in_the_thread_is_reported_once_and_everything_is_released(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fds = open_fds()
    calls = []
    real_drain = reader.ChildReader._drain

    def buggy(self: reader.ChildReader) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise KeyError("a bug")
        real_drain(self)

    monkeypatch.setattr(reader.ChildReader, "_drain", buggy)
    sink = Recorder()
    mon = sampler.ResourceMonitor(categories=["cpu"], sink=sink, step_source="seconds", **FAST).start()
    child = wait_for(lambda: mon.child_pid, what="the child")
    wait_for(lambda: not mon.running, what="the thread to end after the bug")
    stats = mon.stats()
    assert stats["error"] == "KeyError: a bug" and stats["running"] is False
    assert stats["child_pid"] is None
    wait_for(lambda: gone(child), timeout=3, what="the child to be stopped")
    assert open_fds() == fds  # socket, pidfd, stop pipe, ring and status mappings all released
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "monitor thread failed" in errors[0].getMessage()
    caplog.clear()
    mon.stop()  # quiet: no exception, no warning
    mon.stop()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    monkeypatch.setattr(reader.ChildReader, "_drain", real_drain)
    mon.start()  # and it can be started again
    seen = len(sink.calls)
    wait_for(lambda: len(sink.calls) > seen, what="records after a restart")
    mon.stop()


def test_stop_from_inside_the_sink() -> None:
    stopped = threading.Event()
    errors: list[BaseException] = []

    def sink(name: str, value: float, step: int) -> None:
        if not stopped.is_set():
            try:
                mon.stop()
            except BaseException as exc:
                errors.append(exc)
            stopped.set()

    mon = sampler.ResourceMonitor(categories=["cpu"], sink=sink, step_source="seconds", **FAST)
    mon.start()
    assert stopped.wait(15)
    wait_for(lambda: not mon.running, what="the thread to end after the sink returns")
    assert errors == [] and mon.stats()["error"] is None and mon.stats()["sink_errors"] == 0


def test_a_signal_handler_stopping_the_monitor_during_stop_does_not_deadlock(tmp_path: Path) -> None:
    """The SIGTERM handler of a training script calls stop_resource_monitor()
    while the main thread is already inside stop() (the atexit one, say)."""
    script = tmp_path / "backend.py"
    script.write_text(
        backend_script(
            """
            import threading
            release = threading.Event()
            def slow_sink(name, value, step):
                release.wait(3)  # keeps stop() joining for a while
            def on_term(signum, frame):
                sampler.stop_resource_monitor()
                print("handler returned", flush=True)
            signal.signal(signal.SIGTERM, on_term)
            os.environ["WL_RESOURCE_MONITOR_CONFIG_PATH"] = os.getcwd()
            os.environ["WL_RESOURCE_MONITOR_INTERVAL_SECONDS"] = "1"
            mon = sampler.start_resource_monitor_from_config()
            sampler.signals.subscribe(slow_sink)
            while mon.stats()["records_read"] < 1:
                time.sleep(0.01)
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
            mon.stop()
            release.set()
            print("stopped", mon.running, flush=True)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["handler returned", "stopped False"], done.stdout


def test_huge_deadlines_are_clamped_and_the_thread_lives(caplog: pytest.LogCaptureFixture) -> None:
    with sampler.ResourceMonitor(
        categories=["cpu"], sink=Recorder(), step_source="seconds", hang_deadline_seconds=1e12, **FAST
    ) as mon:
        assert mon.hang_deadline_seconds == 86400.0
        wait_for(lambda: mon.stats()["records_logged"] >= 2)
        assert mon.running and mon.stats()["error"] is None
    assert any("ceiling" in r.getMessage() for r in caplog.records)


def test_settings_are_read_only() -> None:
    mon = sampler.ResourceMonitor(categories=["cpu"])
    for name, value in [("interval_seconds", 0.001), ("categories", ("gpu",)), ("sink", print)]:
        with pytest.raises(AttributeError):
            setattr(mon, name, value)
    assert mon.interval_seconds == 15.0 and mon.categories == ("cpu",)


@pytest.mark.parametrize("argument", ["sink", "age_source", "on_sample"])
@pytest.mark.parametrize("value", [5, 0, "print"])
def test_callbacks_that_cannot_be_called_are_refused(argument: str, value: object) -> None:
    with pytest.raises(TypeError, match=argument):
        sampler.ResourceMonitor(**{argument: value})  # type: ignore[arg-type]


def test_a_sink_stuck_in_a_call_shows_in_stats() -> None:
    release = threading.Event()

    def stuck(name: str, value: float, step: int) -> None:
        release.wait(20)

    mon = sampler.ResourceMonitor(categories=["cpu"], sink=stuck, step_source="seconds", **FAST).start()
    try:
        waiting = wait_for(lambda: mon.stats()["waiting_for"], what="stats to show the stuck sink")
        assert "sink" in waiting
    finally:
        release.set()
        mon.stop()
    wait_for(lambda: mon.stats()["waiting_for"] is None, what="the stuck sink no longer reported")
