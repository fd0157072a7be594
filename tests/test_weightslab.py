"""SPEC 5, WeightsLab: forward only inside a WeightsLab backend, never import it,
and let it start this monitor instead of its own."""

from __future__ import annotations

import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FAST, Recorder, wait_for

import sampler
from sampler import signals
from sampler.api import integrations
from sampler.pipeline import steps
from sampler.pipeline import weightslab as wl_adapter

CPU = "resource/cpu/utilization_percent"
MARKER = "weightslab.src was imported"

# A minimal stand-in for the parts of WeightsLab 2.0.3 the adapter touches (the
# real package needs torch to install). Importing its src leaves a marker file,
# as the real one leaves log files, so a test can tell it was never imported.
FAKE_WEIGHTSLAB = {
    "weightslab/__init__.py": "",
    "weightslab/src.py": f"""
        import pathlib

        from weightslab.backend.ledgers import get_logger

        (pathlib.Path(__file__).parent.parent / {MARKER!r}).touch()
        CALLS = []

        def _log_signal(scalar, signal_per_sample, reg_name, step=0, **kwargs):
            CALLS.append((reg_name, scalar, step, signal_per_sample, kwargs))
            logger = get_logger()
            if hasattr(logger, "add_scalars"):
                logger.add_scalars(reg_name, {{reg_name: scalar}}, global_step=step)
        """,
    "weightslab/backend/__init__.py": "",
    "weightslab/backend/ledgers.py": """
        class Proxy:
            def __init__(self):
                self._obj = None

            def __getattr__(self, item):
                obj = object.__getattribute__(self, "_obj")
                if obj is None:
                    raise AttributeError("Proxy target not set")
                return getattr(obj, item)

        _MODEL = Proxy()
        _LOGGERS = {}

        def get_model(name="main"):
            return _MODEL

        def register_model(model, name="main"):
            _MODEL._obj = model

        def get_logger(name="main"):
            return _LOGGERS.setdefault(name, Proxy())

        def register_logger(logger, name="main"):
            get_logger(name)._obj = logger
        """,
    "weightslab/monitoring/__init__.py": """
        from weightslab.monitoring.resource_monitor import (
            get_resource_monitor,
            start_resource_monitor_from_config,
            stop_resource_monitor,
        )
        """,
    "weightslab/monitoring/resource_monitor.py": """
        class ResourceMonitor:
            running = False

            def start(self):
                self.running = True

            def stop(self):
                self.running = False

        _singleton_instance = None

        def start_resource_monitor_from_config():
            global _singleton_instance
            if _singleton_instance is None:
                _singleton_instance = ResourceMonitor()
                _singleton_instance.start()
            return _singleton_instance

        def get_resource_monitor():
            return _singleton_instance

        def stop_resource_monitor():
            global _singleton_instance
            if _singleton_instance is not None:
                _singleton_instance.stop()
                _singleton_instance = None
        """,
}


FORWARDING = "sampler.pipeline.weightslab.forward_signal"
"""The name ``stats()["callbacks"]`` times WeightsLab's logger by."""


def weightslab_modules() -> set[str]:
    return {m for m in sys.modules if m == "weightslab" or m.startswith("weightslab.")}


def forget_weightslab() -> None:
    for name in weightslab_modules():
        del sys.modules[name]


@pytest.fixture
def weightslab(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The fake WeightsLab installed (on sys.path) but not imported; yields the
    marker file its ``src`` leaves when imported."""
    for relative, text in FAKE_WEIGHTSLAB.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_weightslab()
    yield tmp_path / MARKER
    forget_weightslab()


class Logger:
    """A WeightsLab logger: keeps every (tag, value, step) it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []

    def add_scalars(self, tag: str, values: dict[str, float], global_step: int) -> None:
        self.calls.append((tag, values[tag], global_step))


class Model:
    def __init__(self, age: int = 0) -> None:
        self.age = age

    def get_age(self) -> int:
        return self.age


def stamped(monitor: sampler.ResourceMonitor) -> int:
    """Records the monitor has stamped with a step, logged or not."""
    stats = monitor.stats()
    return int(stats["records_logged"] + stats["records_dropped"])


def grpc_serve_starts_the_monitor() -> object:
    """What WeightsLab's grpc_serve() does to start its resource monitor."""
    from weightslab.monitoring.resource_monitor import start_resource_monitor_from_config

    return start_resource_monitor_from_config()


def test_installed_but_not_imported_weightslab_is_never_imported(weightslab: Path) -> None:
    seen = Recorder()
    unsubscribe = signals.subscribe(seen)
    try:
        # model_age: every record asks for the age, which would reach the ledger.
        with sampler.ResourceMonitor(categories=["cpu"], step_source="model_age", **FAST) as monitor:
            wait_for(lambda: stamped(monitor) >= 4, what="4 stamped records")
        signals.log_signal("train/loss", 0.5, 3)
    finally:
        unsubscribe()
    assert not weightslab.exists()
    assert weightslab_modules() == set()
    assert seen.steps(CPU) == [0]  # no model anywhere: step 0, once
    assert ("train/loss", 0.5, 3) in seen.calls
    assert steps.watched_model_age() == 3  # the step the training logged at; WeightsLab is not asked
    assert weightslab_modules() == set()


def test_weightslab_without_a_logger_gets_nothing(weightslab: Path) -> None:
    from weightslab import src

    imported = weightslab_modules()
    failures = signals._forward_failures.count
    seen = Recorder()
    unsubscribe = signals.subscribe(seen)
    try:
        with sampler.ResourceMonitor(categories=["cpu"], step_source="seconds", **FAST) as monitor:
            wait_for(lambda: stamped(monitor) >= 3, what="3 stamped records")
    finally:
        unsubscribe()
    assert CPU in seen.names()
    assert src.CALLS == []
    assert signals._forward_failures.count == failures
    assert weightslab_modules() == imported
    assert FORWARDING not in monitor.stats()["callbacks"]  # nothing forwarded, nothing timed


def test_a_half_set_up_weightslab_costs_the_value_not_an_exception(
    weightslab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from weightslab import src
    from weightslab.backend import ledgers

    def not_ready(name: str = "main") -> object:
        raise RuntimeError("ledger not ready")

    monkeypatch.setattr(ledgers, "get_logger", not_ready)
    wl_adapter.forward_signal("train/loss", 1.0, 3)
    assert src.CALLS == []


def test_weightslab_gets_every_signal_at_the_ledger_models_age(weightslab: Path) -> None:
    from weightslab import src
    from weightslab.backend import ledgers

    logger = Logger()
    ledgers.register_logger(logger)
    signals.log_signal("train/loss", 0.25, 7)
    assert src.CALLS == [("train/loss", 0.25, 7, None, {"per_sample": False})]
    assert logger.calls == [("train/loss", 0.25, 7)]

    model = Model()
    seen = Recorder()
    unsubscribe = signals.subscribe(seen)
    try:
        with sampler.ResourceMonitor(categories=["cpu", "memory"], step_source="model_age", **FAST) as mon:
            wait_for(lambda: any(c[0] == CPU for c in logger.calls), what="step 0 before a model")
            ledgers.register_model(model)
            model.age = 42
            wait_for(lambda: (CPU, 42) in {(c[0], c[2]) for c in logger.calls}, what="the model's age")
    finally:
        unsubscribe()
    assert [c[2] for c in logger.calls if c[0] == CPU] == [0, 42]
    assert [c for c in logger.calls if c[0].startswith("resource/")] == seen.calls
    # WeightsLab's logger is timed like a subscriber, under the function that forwards to it.
    assert mon.stats()["callbacks"][FORWARDING]["records"] >= 2


def test_watch_model_beats_the_ledger(weightslab: Path) -> None:
    from weightslab.backend import ledgers

    ledgers.register_model(Model(100))
    sampler.watch_model(Model(5))
    assert steps.watched_model_age() == 5
    sampler.watch_model(None)
    assert steps.watched_model_age() == 100


def test_replace_weightslab_monitor_makes_grpc_serve_start_this_one(
    weightslab: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "resource_monitoring.yaml").write_text(
        "resource_monitoring:\n"
        "  interval_seconds: 1\n"
        "  categories: {memory: false, gpu: false, disk: false, network: false, process: false}\n"
    )
    monkeypatch.setenv("WL_RESOURCE_MONITOR_CONFIG_PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    from weightslab.monitoring import resource_monitor as theirs

    already = theirs.start_resource_monitor_from_config()
    integrations.replace_weightslab_monitor()
    assert not already.running and theirs._singleton_instance is None

    started = grpc_serve_starts_the_monitor()
    assert isinstance(started, sampler.ResourceMonitor)
    assert sampler.get_resource_monitor() is started
    assert theirs._singleton_instance is None

    integrations.replace_weightslab_monitor()  # a second call keeps ours running
    assert sampler.get_resource_monitor() is started and started.running
    import weightslab.monitoring as package

    assert package.get_resource_monitor() is started
    package.stop_resource_monitor()
    assert sampler.get_resource_monitor() is None
    assert not weightslab.exists()


def test_replace_weightslab_monitor_without_weightslab_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "weightslab", None)  # not importable, whatever is installed
    with pytest.raises(ImportError, match=r"replace_weightslab_monitor\(\) needs WeightsLab"):
        integrations.replace_weightslab_monitor()


@pytest.fixture
def fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wl_adapter, "_warned_both_monitors", False)


def test_both_monitors_running_warns_once(
    weightslab: Path, fresh_warning: None, caplog: pytest.LogCaptureFixture
) -> None:
    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "sampler" and r.levelname == "WARNING"]

    assert not wl_adapter.warn_if_weightslab_monitor_running()  # not imported
    from weightslab.monitoring import resource_monitor as theirs

    assert not any(wl_adapter.warn_if_weightslab_monitor_running() for _ in range(10))
    assert warnings() == []

    theirs.start_resource_monitor_from_config()
    results: list[bool] = []

    def call_many() -> None:
        results.extend(wl_adapter.warn_if_weightslab_monitor_running() for _ in range(200))

    threads = [threading.Thread(target=call_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 1600 and all(results)
    [message] = warnings()
    assert "twice" in message and "sampler.replace_weightslab_monitor()" in message

    theirs.stop_resource_monitor()
    assert not wl_adapter.warn_if_weightslab_monitor_running()
    assert len(warnings()) == 1
