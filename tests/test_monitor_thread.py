"""Issue 7: the monitor thread cannot die silently, and stop() cannot hang or raise,
whoever calls it from wherever."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import linecache
import logging
import sqlite3
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from conftest import FAST, Recorder, backend_script, gone, open_fds, wait_for

import sampler
from sampler.pipeline.timing import qualified_name
from sampler.store.reader import StoreReader
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


def test_a_subscriber_raising_a_base_exception_leaves_the_thread_alive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same through the pipeline (the default sink): the subscriber's error is reported,
    the other subscribers still get every signal."""
    after = Recorder()

    def cancelled(name: str, value: float, step: int) -> None:
        raise asyncio.CancelledError()

    unsubscribes = [sampler.signals.subscribe(cancelled), sampler.signals.subscribe(after)]
    try:
        with sampler.ResourceMonitor(categories=["cpu"], step_source="seconds", **FAST) as mon:
            wait_for(lambda: mon.stats()["records_logged"] >= 3, what="records despite the subscriber")
            assert mon.running
        stats = mon.stats()
    finally:
        for unsubscribe in unsubscribes:
            unsubscribe()
    assert stats["error"] is None and len(after.calls) >= stats["signals_logged"] > 0
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


def test_a_stop_that_lands_while_start_runs_ends_the_run_start_began(tmp_path: Path) -> None:
    """A signal handler (or another thread) calls stop() just after start() made the run the
    monitor's and before its thread started: stop() found a thread it could not join and raised
    into start(), whose run then never ended (no store row, its pipes and subscription left)."""
    store = tmp_path / "runs.sqlite"
    mon = sampler.ResourceMonitor(categories=["cpu"], store=str(store), step_source="seconds", **FAST)
    start = sampler.ResourceMonitor._start.__code__
    fds = open_fds()

    def at(frame: types.FrameType, event: str, arg: object) -> object:
        """Runs stop() where a signal handler could: before the line that starts the thread."""
        if (
            event == "line"
            and linecache.getline(start.co_filename, frame.f_lineno).strip() == "run.thread.start()"
        ):
            frame.f_trace = None
            mon.stop()
        return at

    sys.settrace(lambda frame, event, arg: at if frame.f_code is start else None)
    try:
        mon.start()
    finally:
        sys.settrace(None)
    assert not mon.running

    def ended() -> bool:
        try:
            with StoreReader(str(store)) as reader:
                return [run.ended_at is not None for run in reader.runs()] == [True]
        except (FileNotFoundError, sqlite3.Error):  # not there yet, or its schema not written yet
            return False

    wait_for(ended, what="the run to read as ended")
    wait_for(lambda: open_fds() <= fds, what="the run's pipes to close")


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


# --- Issue 26, item 13: the time callbacks take in the monitor thread ---------------------------------


def slow_sink(name: str, value: float, step: int) -> None:
    """A sink that costs 20 ms per signal: a per-signal request to a tracking server."""
    time.sleep(0.02)


def slow_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "callbacks in the monitor thread took" in r.getMessage()
    ]


def test_a_slow_sink_is_timed_in_stats_and_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """At 0.1 s a sample, 20 ms per signal is well over the tenth of the interval a sink may take:
    one warning names it (its qualified name) and the batched form; stats() shows its time."""
    name = f"{__name__}.slow_sink"
    with sampler.ResourceMonitor(categories=["cpu"], sink=slow_sink, step_source="seconds", **FAST) as mon:
        wait_for(lambda: slow_warnings(caplog), what="the slow sink to be named")
        logged = mon.stats()["records_logged"]
        wait_for(lambda: mon.stats()["records_logged"] >= logged + 10, what="10 more records")
    stats = mon.stats()
    [warning] = slow_warnings(caplog)
    assert name in warning and "on_sample" in warning and "log_metrics" in warning, warning
    timed = stats["callbacks"][name]
    assert timed["records"] == stats["records_logged"] + stats["records_unsent_at_stop"]
    # time.sleep(0.02) lasts at least 20 ms: these are lower bounds, whatever the machine's load.
    assert timed["seconds_total"] >= 0.02 * stats["signals_logged"]
    assert timed["seconds_max"] >= 0.02 and timed["seconds_total"] >= timed["seconds_max"]


def test_a_slow_subscriber_and_a_slow_hook_are_each_named(caplog: pytest.LogCaptureFixture) -> None:
    """With the default sink, the subscriber that is slow is the one named; a slow on_sample hook
    (already one call per sample) is named with the other way out: a longer interval."""
    unsubscribe = sampler.signals.subscribe(slow_sink)
    try:
        with sampler.ResourceMonitor(categories=["cpu"], step_source="seconds", **FAST) as mon:
            wait_for(lambda: slow_warnings(caplog), what="the slow subscriber to be named")
            stats = mon.stats()
    finally:
        unsubscribe()
    [warning] = slow_warnings(caplog)
    assert f"{__name__}.slow_sink" in warning and "subscriber" in warning, warning
    assert stats["callbacks"][f"{__name__}.slow_sink"]["seconds_total"] > 0
    caplog.clear()

    def slow_hook(sample: object) -> None:
        time.sleep(0.05)

    with sampler.ResourceMonitor(
        categories=["cpu"], sink=Recorder(), on_sample=slow_hook, step_source="seconds", **FAST
    ) as mon:
        wait_for(lambda: slow_warnings(caplog), what="the slow hook to be named")
        stats = mon.stats()
    [warning] = slow_warnings(caplog)
    hook = f"{__name__}.{slow_hook.__qualname__}"
    assert hook in warning and "interval_seconds" in warning, warning
    assert stats["callbacks"][hook]["seconds_max"] >= 0.05


def test_a_slow_age_source_is_timed_in_stats_and_named(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 26: the model's age, asked once a sample in the monitor thread, is user code like
    the sink: timed in stats()['callbacks'], and named when it takes too much of the interval."""
    ages = itertools.count()

    def slow_age() -> int:
        time.sleep(0.05)
        return next(ages)

    name = f"{__name__}.{slow_age.__qualname__}"
    with sampler.ResourceMonitor(categories=["cpu"], sink=Recorder(), age_source=slow_age, **FAST) as mon:
        wait_for(lambda: slow_warnings(caplog), what="the slow age source to be named")
        stats = mon.stats()
    [warning] = slow_warnings(caplog)
    assert name in warning and "age" in warning and "interval_seconds" in warning, warning
    timed = stats["callbacks"][name]
    assert timed["seconds_max"] >= 0.05 and timed["records"] >= 3


QUIET = {"interval_seconds": 0.5, "_min_interval_seconds": 0.05}
"""Half a second a sample: a budget of 50 ms a sample for callbacks, which a fast one keeps
however loaded the machine is."""


def test_a_fast_sink_is_timed_and_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    sink = Recorder()
    with sampler.ResourceMonitor(categories=["cpu"], sink=sink, step_source="seconds", **QUIET) as mon:
        wait_for(lambda: mon.stats()["records_logged"] >= 8, what="8 records")
    stats = mon.stats()
    assert slow_warnings(caplog) == []
    [(name, timed)] = stats["callbacks"].items()
    assert name == "conftest.Recorder" and timed["records"] >= 8


def test_one_slow_call_is_not_a_slow_sink(caplog: pytest.LogCaptureFixture) -> None:
    """A sink that is slow once (its first request opening a connection; or a process
    suspended, a VM paused, while the thread was in a call) is not warned about: what
    counts is most of the latest samples, not their mean."""
    calls: list[str] = []

    def first_slow(name: str, value: float, step: int) -> None:
        calls.append(name)
        if len(calls) == 1:
            time.sleep(1.5)  # three intervals: the mean of three samples would be over the share

    with sampler.ResourceMonitor(categories=["cpu"], sink=first_slow, step_source="seconds", **QUIET) as mon:
        wait_for(lambda: mon.stats()["records_logged"] >= 8, what="8 records")
    stats = mon.stats()
    assert slow_warnings(caplog) == []
    assert stats["callbacks"][f"{__name__}.{first_slow.__qualname__}"]["seconds_max"] >= 1.5


@dataclasses.dataclass
class UnhashableSink:
    """A dataclass with eq (the default) has no hash: a sink the timing must not use as a key."""

    calls: int = 0

    def __call__(self, name: str, value: float, step: int) -> None:
        self.calls += 1


def test_an_unhashable_sink_and_subscriber_are_timed(caplog: pytest.LogCaptureFixture) -> None:
    sink, subscriber = UnhashableSink(), UnhashableSink()
    with sampler.ResourceMonitor(categories=["cpu"], sink=sink, step_source="seconds", **FAST) as mon:
        wait_for(lambda: mon.stats()["records_logged"] >= 3, what="3 records")
    unsubscribe = sampler.signals.subscribe(subscriber)
    try:
        with sampler.ResourceMonitor(categories=["cpu"], step_source="seconds", **FAST) as piped:
            wait_for(lambda: piped.stats()["records_logged"] >= 3, what="3 records")
    finally:
        unsubscribe()
    for monitor, called in ((mon, sink), (piped, subscriber)):
        stats = monitor.stats()
        assert stats["error"] is None and called.calls >= 3
        assert stats["callbacks"][f"{__name__}.UnhashableSink"]["records"] >= 3


def test_callbacks_are_named_by_their_qualified_name_whatever_they_are() -> None:
    class Odd:
        """Asked for any attribute it lacks (``__qualname__``, ``__module__``), it raises."""

        def __call__(self, *args: object) -> None: ...

        def __getattr__(self, name: str) -> object:
            raise RuntimeError(f"no {name}")

    def log(name: str, value: float, step: int) -> None: ...

    named = lambda name, value, step: None  # noqa: E731
    assert qualified_name(log) == f"{__name__}.{log.__qualname__}"
    assert qualified_name(functools.partial(log, "x")) == qualified_name(log)
    assert qualified_name(Recorder().names) == "conftest.Recorder.names"
    assert qualified_name(Recorder()) == "conftest.Recorder"
    line = named.__code__.co_firstlineno
    assert qualified_name(named) == f"{__name__}.{named.__qualname__} (test_monitor_thread.py:{line})"
    assert qualified_name(Odd()).endswith(".Odd")  # its class's name
    log.__qualname__ = "\x1b[2J" + "x" * 1000
    assert qualified_name(log).startswith(f"{__name__}.\\x1b[2J") and len(qualified_name(log)) == 200


def test_stop_leaves_a_sink_that_is_behind_after_its_call_under_way(caplog: pytest.LogCaptureFixture) -> None:
    """A sample takes the sink seconds (0.3 s a signal); stop() returns after the call under
    way, not after the rest of the sample, and the sink is not called again."""
    entered, calls, stopped_at = threading.Event(), [], []

    def behind(name: str, value: float, step: int) -> None:
        entered.set()
        calls.append(time.monotonic())
        time.sleep(0.3)

    mon = sampler.ResourceMonitor(categories=["cpu", "memory", "process"], sink=behind, **FAST).start()
    assert entered.wait(30)
    mon.stop()
    stopped_at.append(time.monotonic())
    stats = mon.stats()
    assert not mon.running and "thread is busy" not in caplog.text
    assert [t for t in calls if t > stopped_at[0]] == []
    assert stats["records_unsent_at_stop"] == 1 and stats["records_logged"] == 0


def test_stop_says_what_the_thread_is_busy_in_when_it_is_the_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another writer holds the store past the last write's wait at stop: the thread is in the
    store, not in a sink, and stop() says so."""
    store = tmp_path / "runs.sqlite"
    mon = sampler.ResourceMonitor(categories=["cpu"], store=store, sink=Recorder(), **FAST).start()
    wait_for(lambda: mon.stats()["store_points_written"] > 0, what="the run written")
    other = sqlite3.connect(store, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # held until stop() returns
        mon.stop()
    finally:
        other.close()
    [busy] = [r.getMessage() for r in caplog.records if "thread is busy" in r.getMessage()]
    assert "busy in the run store's last write" in busy, busy
    wait_for(lambda: not mon.running, what="the thread to end once the store is free")


@pytest.mark.parametrize("call_seconds", [0.4, 4.0])
def test_a_run_stopped_while_the_sink_is_busy_reads_ended(tmp_path: Path, call_seconds: float) -> None:
    """The MLflow recipe of old: every signal a slow request, so a sample takes seconds to log. A
    backend that stops and exits meanwhile ended normally: its run must read "ended", not "lost",
    whether the sink is between calls (0.4 s each) or inside one longer than stop() waits (4 s)."""
    store = tmp_path / "runs.sqlite"
    script = tmp_path / "backend.py"
    script.write_text(
        backend_script(
            f"""
            import threading
            entered = threading.Event()
            def slow(name, value, step):
                if name.startswith("resource/"):  # the monitor thread is in the sink
                    entered.set()
                time.sleep({call_seconds})
            sampler.signals.subscribe(slow)
            mon = sampler.ResourceMonitor(
                categories=["cpu", "memory", "process"], store={str(store)!r}, interval_seconds=1
            ).start()
            sampler.signals.log_signal("train/loss", 1.0, 1)
            entered.wait(60)
            mon.stop()
            print("stopped", flush=True)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90, cwd=tmp_path
    )
    assert done.returncode == 0 and done.stdout == "stopped\n", done.stderr
    with StoreReader(str(store)) as reader:
        [run] = reader.runs()
    assert run.status == "ended", done.stderr


def test_a_store_that_fails_is_off_and_says_why_in_stats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the run store (anything it raises) turns the store off, once, out loud, and
    stats() keeps saying why; the sink goes on getting every record."""
    from sampler.store.writer import RunWriter

    def broken(self: RunWriter, *args: object) -> None:
        raise RuntimeError("disk says no")

    monkeypatch.setattr(RunWriter, "record", broken)
    sink = Recorder()
    mon = sampler.ResourceMonitor(
        categories=["cpu"], store=tmp_path / "runs.sqlite", sink=sink, step_source="seconds", **FAST
    )
    with mon:
        wait_for(lambda: mon.stats()["records_logged"] >= 3, what="records after the store failed")
        stats = mon.stats()
    assert stats["store_error"] == "off after a failure: RuntimeError: disk says no", stats
    failed = [r for r in caplog.records if "the run store failed" in r.getMessage()]
    assert len(failed) == 1 and "disk says no" in failed[0].getMessage()


def test_a_run_whose_end_could_not_be_written_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process holds the store through the whole of stop()'s last write: the run's end
    is not recorded, so `runs` will call it lost, and the monitor says that, once, naming the store."""
    store = tmp_path / "runs.sqlite"
    mon = sampler.ResourceMonitor(categories=["cpu"], store=store, sink=Recorder(), **FAST).start()
    wait_for(lambda: mon.stats()["store_points_written"] > 0, what="the run written")
    other = sqlite3.connect(store, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # held until the thread is done
        mon.stop()
        wait_for(lambda: not mon.running, what="the thread to give up on the store")
    finally:
        other.close()
    said = [
        r.getMessage() for r in caplog.records if "end of this run could not be written" in r.getMessage()
    ]
    assert len(said) == 1 and str(store) in said[0], said
    with StoreReader(str(store)) as reader:
        [run] = reader.runs()
    assert run.ended_at is None
