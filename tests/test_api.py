"""The public API of SPEC 5: singleton from config and signal pipeline (WeightsLab: test_weightslab.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import Recorder, free_ports, wait_for

import sampler
from sampler import signals

CPU = "resource/cpu/utilization_percent"


def test_public_names() -> None:
    assert sampler.DEFAULT_CATEGORIES[:6] == ("cpu", "memory", "gpu", "disk", "network", "process")
    assert sampler.DEFAULT_STEP_SOURCE == "model_age"
    assert sampler.STEP_SOURCES == ("model_age", "seconds")
    assert sampler.DEFAULT_INTERVAL_SECONDS == 15.0


def use_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, yaml_text: str) -> None:
    """Point the lookup at a config file of the test's own, from a cwd with no repository."""
    (tmp_path / "resource_monitoring.yaml").write_text(textwrap.dedent(yaml_text))
    monkeypatch.setenv("WL_RESOURCE_MONITOR_CONFIG_PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def test_singleton_from_config_is_idempotent_and_logs_through_the_pipeline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_config(
        monkeypatch,
        tmp_path,
        """
        resource_monitoring:
          interval_seconds: 1
          categories: [cpu, memory]
        """,
    )
    seen = Recorder()
    unsubscribe = signals.subscribe(seen)
    try:
        monitor = sampler.start_resource_monitor_from_config()
        assert monitor is not None
        assert sampler.start_resource_monitor_from_config() is monitor
        assert sampler.get_resource_monitor() is monitor
        assert monitor.interval_seconds == 1.0
        assert monitor.categories == ("cpu", "memory")
        wait_for(lambda: CPU in seen.names(), what="a resource signal through log_signal")
    finally:
        unsubscribe()
        sampler.stop_resource_monitor()
    assert sampler.get_resource_monitor() is None
    assert seen.steps(CPU)[0] == 0  # no model registered: step 0


def test_disabled_by_env_starts_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WEIGHTSLAB_DISABLE_RESOURCE_MONITORING", "TRUE")
    assert sampler.start_resource_monitor_from_config() is None
    assert sampler.get_resource_monitor() is None


def test_garbage_interval_does_not_stop_the_backend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    use_config(monkeypatch, tmp_path, "resource_monitoring:\n  interval_seconds: abc\n")
    monitor = sampler.start_resource_monitor_from_config()
    assert monitor is not None and monitor.interval_seconds == sampler.DEFAULT_INTERVAL_SECONDS
    assert any("'abc'" in r.getMessage() for r in caplog.records)


def test_subscribe_and_unsubscribe() -> None:
    first, second = Recorder(), Recorder()
    off_first = signals.subscribe(first)
    off_second = signals.subscribe(second)
    signals.log_signal("train/loss", 0.5, 3)
    off_first()
    signals.log_signal("train/loss", 0.4, 4)
    off_second()
    signals.log_signal("train/loss", 0.3, 5)
    assert first.calls == [("train/loss", 0.5, 3)]
    assert second.calls == [("train/loss", 0.5, 3), ("train/loss", 0.4, 4)]


def test_a_raising_subscriber_does_not_starve_the_others(caplog: pytest.LogCaptureFixture) -> None:
    def broken(name: str, value: float, step: int) -> None:
        raise ValueError("boom")

    good = Recorder()
    offs = [signals.subscribe(broken), signals.subscribe(good)]
    try:
        signals.log_signal("a", 1.0, 1)
    finally:
        for off in offs:
            off()
    assert good.calls == [("a", 1.0, 1)]
    assert any("boom" in r.getMessage() for r in caplog.records)


def test_each_broken_subscriber_is_said_however_recently_another_was(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One limiter for every subscriber held a second one's first failure back for a minute (and
    made the test above depend on which tests ran before it in the same process)."""
    errors = {"first": ValueError("first broke"), "second": KeyError("second broke")}

    def broken(which: str) -> signals.Subscriber:
        def receive(name: str, value: float, step: int) -> None:
            raise errors[which]

        return receive

    offs = [signals.subscribe(broken("first"))]
    try:
        signals.log_signal("a", 1.0, 1)
        signals.log_signal("a", 2.0, 2)  # the same one again within the minute: held back
        offs.append(signals.subscribe(broken("second")))
        signals.log_signal("a", 3.0, 3)
    finally:
        for off in offs:
            off()
    said = [r.getMessage() for r in caplog.records if "broke" in r.getMessage()]
    assert len(said) == 2 and "first broke" in said[0] and "second broke" in said[1], said


def test_a_second_monitor_of_the_process_replaces_the_first_unless_each_has_its_own_store_or_port(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store_a, store_b = str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite")
    a = sampler.ResourceMonitor(store=store_a, sink=Recorder()).start()
    b = sampler.ResourceMonitor(store=store_b, sink=Recorder()).start()
    started = [a, b]
    try:
        assert a.running and b.running  # a store each: both record their own run
        assert not [r for r in caplog.records if "replaces" in r.getMessage()]
        again = sampler.ResourceMonitor(store=store_a, sink=Recorder()).start()
        started.append(again)
        assert not a.running and b.running and again.running
        lines = [r.getMessage() for r in caplog.records if "replaces" in r.getMessage()]
        assert len(lines) == 1 and store_a in lines[0], lines
        storeless = sampler.ResourceMonitor(sink=Recorder()).start()  # no store: it takes over
        started.append(storeless)
        assert not again.running and not b.running and storeless.running
        port = free_ports(2)
        served = [sampler.ResourceMonitor(sink=Recorder(), prometheus_port=port + k).start() for k in (0, 1)]
        started += served
        assert not storeless.running and all(m.running for m in served)  # a port each: both serve
    finally:
        for monitor in started:
            monitor.stop()
