"""The sampling child's Prometheus endpoint, scraped over real HTTP, and its discovery entry."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fake_driver
import pytest
from conftest import FAST, Recorder, backend_script, free_ports, gone, scrape, wait_for

import sampler
from sampler.catalogue import STEP_PHASES
from sampler.child import main as child_main
from sampler.ipc.channel import PrometheusTarget
from sampler.ipc.status import ENDPOINT_BAD_ADDRESS, ENDPOINT_NO_CLIENT, ENDPOINT_UNAVAILABLE, ChildStatus
from sampler.prometheus import discovery, metrics
from sampler.prometheus.endpoint import RecordCollector
from sampler.supervision import exposition

parser = pytest.importorskip("prometheus_client.parser")

QUICK_RESTARTS = {"_restart_backoff": (0.05, 0.2)}
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""(metric sample name, sorted labels) -> value."""


def series(text: str) -> Series:
    out: Series = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def values_of(found: Series, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (metric, labels), value in found.items() if metric == name}


def refused(port: int) -> bool:
    try:
        scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


@pytest.fixture
def samples() -> Iterator[list[sampler.Sample]]:
    yield []


def monitor(hook: list[sampler.Sample] | None = None, **kwargs: Any) -> sampler.ResourceMonitor:
    options: dict[str, Any] = {
        **FAST,
        "interval_seconds": 0.2,
        "step_source": "seconds",
        "sink": Recorder(),
        "postmortem_dir": None,
        **kwargs,
    }
    if hook is not None:
        options["on_sample"] = hook.append
    return sampler.ResourceMonitor(**options)


def test_a_scrape_shows_one_logged_record_in_base_units(samples: list[sampler.Sample]) -> None:
    port = free_ports()
    with monitor(samples, prometheus_port=port, run_id="job-7") as mon:
        wait_for(lambda: len(samples) >= 2, what="two records")
        text = scrape(port)
        found = series(text)
        count = len(samples)
        wait_for(lambda: len(samples) >= count + 2, what="the scraped record logged")
        assert mon.stats()["prometheus_endpoint"] == f"http://127.0.0.1:{port}/metrics"
    labels = {"host": socket.gethostname(), "rank": "0", "local_rank": "0", "run_id": "job-7"}
    base = tuple(sorted(labels.items()))
    assert values_of(found, "wl_resource_process_threads")  # what the test below compares is there
    assert values_of(found, "wl_resource_process_memory_available_bytes")  # rank 0 samples the host
    matching = []
    for sample in samples:
        expected: Series = {}
        for name, value in sample.values.items():
            exposed = metrics.lookup(name)
            if exposed is not None:
                key = exposed.metric.name
                expected[(key, base)] = value * exposed.metric.scale
        if all(
            key in found and math.isclose(found[key], value, rel_tol=1e-12) for key, value in expected.items()
        ):
            matching.append(sample.step)
    assert matching, "no logged record matches the scrape"
    # Peaks, a counter and a ratio came through with their units.
    assert values_of(found, "wl_resource_process_memory_in_use_peak_bytes")
    assert values_of(found, "wl_resource_network_sent_bytes_total")
    ratio = values_of(found, "wl_resource_memory_utilization_ratio")[base]
    assert 0 < ratio < 1
    assert not [key for key in found if key[0].endswith("_per_second")]
    # CPU as Prometheus has it: time, a counter whose rate() is the cores in use, not a ratio above 1.
    for cpu in ("wl_resource_process_cpu_seconds_total", "wl_resource_process_tree_cpu_seconds_total"):
        assert f"\n# TYPE {cpu} counter\n" in text
        assert values_of(found, cpu)[base] > 0
    assert "process_cpu_utilization" not in text and "process_tree_cpu_utilization" not in text  # nor peaks
    assert found[("wl_resource_model_age", base)] >= 0
    assert (
        found[("wl_resource_monitor_restarts_total", tuple(sorted({**labels, "cause": "crash"}.items())))]
        == 0
    )
    info = values_of(found, "wl_resource_monitor_info")
    ((info_labels, one),) = info.items()
    assert one == 1 and dict(info_labels)["world_size"] == "1"
    # No model watched: no step was timed, and no phase metric is served.
    assert "steps_timed" not in text and "step_phase" not in text


def test_a_failed_reading_is_absent_not_nan(tmp_path: Path) -> None:
    port = free_ports()
    recorder = Recorder()
    with monitor(
        prometheus_port=port, categories=["disk"], disk_path=str(tmp_path / "not-yet"), sink=recorder
    ):
        wait_for(lambda: recorder.calls, what="a record")
        found = series(scrape(port))
    assert values_of(found, "wl_resource_disk_read_bytes_total")
    assert not values_of(found, "wl_resource_disk_used_bytes")
    assert not [key for key, value in found.items() if math.isnan(value)]


def test_gpu_series_carry_their_index_and_uuid(nvml: fake_driver.Driver) -> None:
    uuids = ["GPU-aaaa1111-0000-4000-8000-000000000000", "GPU-bbbb2222-0000-4000-8000-000000000000"]
    nvml.configure(devices=[{"uuid": u, "temp": 40 + i} for i, u in enumerate(uuids)])
    port = free_ports()
    recorder = Recorder()
    with monitor(prometheus_port=port, categories=["gpu"], sink=recorder):
        wait_for(lambda: recorder.calls, what="a record")
        found = series(scrape(port))
    temperatures = {
        (dict(labels)["gpu"], dict(labels)["gpu_uuid"]): value
        for labels, value in values_of(found, "wl_resource_gpu_temperature_celsius").items()
    }
    assert temperatures == {("0", uuids[0]): 40.0, ("1", uuids[1]): 41.0}
    clocks = values_of(found, "wl_resource_gpu_sm_clock_hertz")
    assert all(value >= 1e6 for value in clocks.values())


def test_each_rank_serves_on_its_port_with_its_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic-42")
    base = free_ports(2)
    recorder = Recorder()
    with monitor(prometheus_port=base, sink=recorder) as mon:
        assert mon.prometheus_port == base + 1
        wait_for(lambda: recorder.calls, what="a record")
        found = series(scrape(base + 1))
        assert refused(base)
    names = {name for name, _ in found}
    assert "wl_resource_process_memory_in_use_bytes" in names
    # Host-wide readings are local rank 0's, the system's available memory too (a process signal by name).
    assert not names & {
        "wl_resource_cpu_utilization_ratio",
        "wl_resource_network_sent_bytes_total",
        "wl_resource_process_memory_available_bytes",
    }
    labels = dict(next(iter(values_of(found, "wl_resource_process_threads"))))
    assert labels == {"host": socket.gethostname(), "rank": "5", "local_rank": "1", "run_id": "elastic-42"}


def test_a_killed_child_takes_the_endpoint_down_and_its_successor_counts_the_crash(
    samples: list[sampler.Sample],
) -> None:
    port = free_ports()
    with monitor(samples, prometheus_port=port, categories=["cpu"], **QUICK_RESTARTS) as mon:
        wait_for(lambda: samples, what="a record")
        first = mon.child_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: refused(port) or mon.child_pid not in (None, first), what="the endpoint down")
        wait_for(lambda: mon.child_pid not in (None, first), what="a new child")
        found = wait_for(lambda: series(scrape(port)) if not refused(port) else None, what="served again")
    key = ("wl_resource_monitor_restarts_total", (("cause", "crash"),))
    restarts = {labels: v for (name, labels), v in found.items() if name == key[0]}
    crash = [v for labels, v in restarts.items() if ("cause", "crash") in labels]
    assert crash == [1.0]


def test_quarantined_categories_and_restarts_show_in_the_metrics(nvml: fake_driver.Driver) -> None:
    # In NVML's initialisation, on no device: the gpu category is quarantined, not one GPU.
    nvml.configure(devices=[{}], segfault={"nvmlInitWithFlags": True})
    port = free_ports()
    with monitor(prometheus_port=port, categories=["cpu", "gpu"], **QUICK_RESTARTS) as mon:
        wait_for(lambda: mon.stats()["quarantined"] == ["gpu"], what="gpu quarantined")

        def after_quarantine() -> Series | None:
            try:
                found = series(scrape(port))
            except (urllib.error.URLError, ConnectionError):
                return None
            flags = {
                dict(labels)["category"]: v
                for labels, v in values_of(found, "wl_resource_monitor_quarantined").items()
            }
            return found if flags.get("gpu") == 1 else None

        found = wait_for(after_quarantine, what="the quarantine in the metrics")
    flags = {
        dict(labels)["category"]: v
        for labels, v in values_of(found, "wl_resource_monitor_quarantined").items()
    }
    assert flags == {"cpu": 0, "gpu": 1}
    crashes = [
        v
        for labels, v in values_of(found, "wl_resource_monitor_restarts_total").items()
        if ("cause", "crash") in labels
    ]
    assert crashes == [3.0]
    assert not values_of(found, "wl_resource_gpu_temperature_celsius")


def test_model_age_is_the_step_the_backend_stamped() -> None:
    port = free_ports()
    recorder = Recorder()
    with monitor(prometheus_port=port, step_source="model_age", age_source=lambda: 1234, sink=recorder):
        wait_for(lambda: recorder.calls, what="a record logged at 1234")
        found = wait_for(lambda: series(scrape(port)), what="a scrape")
    (age,) = values_of(found, "wl_resource_model_age").values()
    assert age == 1234
    assert {step for _, _, step in recorder.calls} == {1234}


def test_the_phases_the_backend_published_are_served_per_phase_once_a_step_was_timed() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    status, fd = ChildStatus.create()
    child = ChildStatus.from_fd(fd)
    os.close(fd)
    labels = {"host": "h", "rank": "2", "local_rank": "2", "run_id": "job-9"}
    target = PrometheusTarget("127.0.0.1", 0, labels, {}, None)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RecordCollector([], target, child, ("cpu",), {}))
    try:
        before = series(generate_latest(registry).decode())
        status.publish_phases(40, (2.0, 0.5, 6.25, 0.125, 0.0625))
        found = series(generate_latest(registry).decode())
    finally:
        child.close()
        status.close()
    assert not values_of(before, "wl_resource_steps_timed_total")  # nothing timed: nothing served
    assert not values_of(before, "wl_resource_step_phase_seconds_total")
    base = tuple(sorted(labels.items()))
    assert values_of(found, "wl_resource_steps_timed_total") == {base: 40}
    per_phase = {
        dict(key)["phase"]: value
        for key, value in values_of(found, "wl_resource_step_phase_seconds_total").items()
    }
    assert per_phase == dict(
        zip([p for p, _, _ in STEP_PHASES], (2.0, 0.5, 6.25, 0.125, 0.0625), strict=True)
    )


def test_a_port_in_use_is_one_warning_and_monitoring_goes_on(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    port = free_ports()
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    recorder = Recorder()
    try:
        with (
            caplog.at_level(logging.WARNING, logger="sampler"),
            monitor(
                prometheus_port=port,
                prometheus_sd_dir=str(tmp_path),
                sink=recorder,
                categories=["cpu"],
                **QUICK_RESTARTS,
            ) as mon,
        ):
            wait_for(lambda: recorder.calls, what="records without the endpoint")
            first = mon.child_pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            wait_for(lambda: mon.stats()["restarts"] == 1 and mon.child_pid, what="a restart")
            count = len(recorder.calls)
            wait_for(lambda: len(recorder.calls) > count, what="records from the new child")
            stats = mon.stats()
    finally:
        squatter.close()
    warnings = [r.getMessage() for r in caplog.records if "Prometheus" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"port {port}" in warnings[0] and "already in use" in warnings[0]
    assert stats["prometheus_endpoint"] is None and "already in use" in stats["prometheus_error"]
    assert list(tmp_path.iterdir()) == []  # no discovery entry for an endpoint that does not serve


def test_a_port_freed_later_is_bound_then_listed_and_said(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A port held for a while (an outgoing connection, a job still shutting down) costs
    the rank its endpoint only until the child tries it again."""
    port = free_ports()
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    with (
        caplog.at_level(logging.WARNING, logger="sampler"),
        monitor(prometheus_port=port, prometheus_sd_dir=str(tmp_path), categories=["cpu"]) as mon,
    ):
        try:
            wait_for(lambda: mon.stats()["prometheus_error"], what="the port in use to be said")
            assert list(tmp_path.iterdir()) == []
        finally:
            squatter.close()
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(
            lambda: mon.stats()["prometheus_endpoint"] == url,
            timeout=child_main.REBIND_SECONDS + 30,
            what="the endpoint once its port was free",
        )
        assert mon.stats()["prometheus_error"] is None
        assert len(list(tmp_path.glob("*.json"))) == 1  # listed before stats() showed it
        assert "wl_resource_cpu_utilization_ratio" in wait_for(lambda: scrape_or_none(port), what="a scrape")
        child = mon.child_pid
    warnings = [r.getMessage() for r in caplog.records if "Prometheus" in r.getMessage()]
    assert len(warnings) == 2 and "already in use" in warnings[0], warnings
    assert f"serves at 127.0.0.1:{port} now" in warnings[1]
    assert mon.stats()["restarts"] == 0 and child is not None  # the same child bound it


def scrape_or_none(port: int) -> str | None:
    try:
        return scrape(port)
    except OSError:
        return None


def test_the_discovery_entry_lives_while_the_monitor_serves(tmp_path: Path) -> None:
    port = free_ports()
    sd_dir = tmp_path / "sd"
    recorder = Recorder()
    with monitor(prometheus_port=port, prometheus_sd_dir=str(sd_dir), run_id="r1", sink=recorder):
        entries = wait_for(lambda: list(sd_dir.glob("*.json")), what="the discovery entry")
        assert not [p for p in sd_dir.iterdir() if p.suffix != ".json"]  # written atomically
        (entry,) = entries
        body = json.loads(entry.read_text())
    owner = discovery.this_process()
    assert owner is not None
    assert body == [
        {
            "targets": [f"127.0.0.1:{port}"],
            "labels": {
                "host": socket.gethostname(),
                "rank": "0",
                "local_rank": "0",
                "run_id": "r1",
                **owner.labels(),  # who wrote it, for other monitors to judge (Prometheus drops them)
            },
        }
    ]
    assert not entry.exists()


def test_a_dead_backend_s_entry_is_removed_by_its_child(tmp_path: Path) -> None:
    port = free_ports()
    sd_dir = tmp_path / "sd"
    script = backend_script(
        f"""
        mon = sampler.ResourceMonitor(interval_seconds=1.0, categories=["cpu"], sink=lambda *a: None,
                                      postmortem_dir=None, prometheus_port={port},
                                      prometheus_sd_dir={str(sd_dir)!r})
        mon.start()
        while mon.stats()["prometheus_endpoint"] is None:
            time.sleep(0.05)
        print(mon.child_pid, flush=True)
        time.sleep(60)
        """
    )
    backend = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert backend.stdout is not None
        child = int(backend.stdout.readline())
        assert list(sd_dir.glob("*.json"))
        backend.kill()
        backend.wait()
        wait_for(lambda: gone(child), what="the child to leave")
        assert list(sd_dir.glob("*.json")) == []
    finally:
        backend.kill()
        backend.wait()


def test_sampling_in_thread_says_there_is_no_endpoint(caplog: pytest.LogCaptureFixture) -> None:
    port = free_ports()
    recorder = Recorder()
    with (
        caplog.at_level(logging.WARNING, logger="sampler"),
        monitor(prometheus_port=port, isolation="thread", categories=["cpu"], sink=recorder) as mon,
    ):
        wait_for(lambda: recorder.calls, what="a record in-thread")
        stats = mon.stats()
    assert refused(port)
    assert "needs the child" in stats["prometheus_error"]
    assert [r for r in caplog.records if "no Prometheus endpoint" in r.getMessage()]


def test_a_child_without_prometheus_client_says_how_to_install_it(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "prometheus_client"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed here')\n")
    script = backend_script(
        f"""
        sys.path.insert(0, {str(shadow.parent)!r})
        mon = sampler.ResourceMonitor(interval_seconds=1.0, categories=["cpu"], sink=lambda *a: None,
                                      postmortem_dir=None, prometheus_port={free_ports()})
        with mon:
            while mon.stats()["records_read"] < 1:
                time.sleep(0.05)
            print(mon.stats()["prometheus_error"])
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "prometheus_client cannot be imported" in done.stdout
    assert "wl-resource-monitor[prometheus]" in done.stderr  # the one warning


@pytest.mark.parametrize(
    ("state", "words"),
    [
        (ENDPOINT_NO_CLIENT, "cannot be imported"),
        (ENDPOINT_BAD_ADDRESS, "does not resolve"),
        (ENDPOINT_UNAVAILABLE, "failed to start"),
        (-13, "Permission denied"),
    ],
)
def test_each_endpoint_failure_is_described(state: int, words: str) -> None:
    target = PrometheusTarget("127.0.0.1", 80, {}, {}, None)
    assert words in exposition.describe_failure(state, target)


def test_an_address_that_does_not_resolve_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    with (
        caplog.at_level(logging.WARNING, logger="sampler"),
        monitor(
            prometheus_port=free_ports(),
            prometheus_address="no-such-host.invalid",
            categories=["cpu"],
            sink=recorder,
        ) as mon,
    ):
        wait_for(lambda: recorder.calls, what="a record")
        stats = mon.stats()
    assert "does not resolve" in stats["prometheus_error"]


def test_a_discovery_directory_that_cannot_be_made_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    port = free_ports()
    recorder = Recorder()
    with (
        caplog.at_level(logging.WARNING, logger="sampler"),
        monitor(prometheus_port=port, prometheus_sd_dir=str(blocker / "sd"), sink=recorder) as mon,
    ):
        wait_for(lambda: recorder.calls, what="a record")
        found = series(scrape(port))  # the endpoint serves; only discovery is missing
        stats = mon.stats()
    assert values_of(found, "wl_resource_process_threads")
    (warning,) = [r.getMessage() for r in caplog.records if "discovery entry" in r.getMessage()]
    assert "Prometheus will not find this endpoint" in warning
    assert "cannot write the discovery entry" in stats["prometheus_error"]


def test_a_port_past_the_last_is_one_warning_and_no_endpoint(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    with caplog.at_level(logging.WARNING, logger="sampler"):
        mon = monitor(prometheus_port=65534)
    assert mon.prometheus_port is None
    (warning,) = [r.getMessage() for r in caplog.records if "past port" in r.getMessage()]
    assert "prometheus_port=65534 plus local rank 3" in warning


def test_the_endpoint_is_in_stats_only_once_its_discovery_entry_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever sees stats()['prometheus_endpoint'] finds the entry Prometheus discovers it by
    (seen missing beside two busy loops: the URL was in stats() before the entry was written)."""
    from sampler.supervision import exposition

    seen_while_writing: list[object] = []
    mon = sampler.ResourceMonitor(
        categories=["cpu"], sink=Recorder(), prometheus_port=free_ports(), prometheus_sd_dir=str(tmp_path)
    )
    write = exposition.discovery.write_entry

    def watched(*args: Any) -> None:
        seen_while_writing.append(mon.stats()["prometheus_endpoint"])
        write(*args)

    monkeypatch.setattr(exposition.discovery, "write_entry", watched)
    with mon:
        wait_for(lambda: mon.stats()["prometheus_endpoint"] is not None, what="the endpoint")
        assert list(tmp_path.glob("*.json"))
    assert seen_while_writing == [None]


def test_a_watched_models_steps_and_their_phases_reach_the_endpoint() -> None:
    torch = pytest.importorskip("torch")
    port = free_ports()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    sampler.watch_model(model)
    found: Series = {}
    try:
        with monitor(prometheus_port=port, step_source="model_age"):

            def stepped() -> bool:
                for _ in range(20):
                    model(torch.randn(2, 4)).sum().backward()
                    optimizer.step()
                    optimizer.zero_grad()
                try:
                    found.update(series(scrape(port)))
                except (urllib.error.URLError, ConnectionError):
                    return False  # not serving yet
                return sum(values_of(found, "wl_resource_steps_timed_total").values()) >= 10

            wait_for(stepped, what="steps timed on the endpoint")
    finally:
        sampler.watch_model(None)
    (steps,) = values_of(found, "wl_resource_steps_timed_total").values()
    seconds = {
        dict(k)["phase"]: v for k, v in values_of(found, "wl_resource_step_phase_seconds_total").items()
    }
    assert list(seconds) == [phase for phase, _, _ in STEP_PHASES]
    assert seconds["forward"] > 0 and seconds["optimizer"] > 0
    assert 0 < sum(seconds.values()) < steps  # each step well under a second
