"""A real Prometheus server scraping three ranks, each a separate backend process.

The server (Debian's ``prometheus``, which ``.ci/run`` installs) scrapes every
second and finds its targets only through the monitors' file-based discovery
directory. Three backends run as torchrun would start them on one host
(``RANK``/``LOCAL_RANK`` 0..2, ``WORLD_SIZE``/``LOCAL_WORLD_SIZE`` 3, one
``TORCHELASTIC_RUN_ID``), each with three fake GPUs and one shared run store.
Everything is asserted through Prometheus' HTTP query API.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fake_driver
import psutil
import pytest
from conftest import backend_script, free_ports, start_ranks, wait_for
from prometheus_server import PrometheusServer, skip_reason

from sampler.store.reader import StoreReader

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
pytest.importorskip("prometheus_client")

RANKS = 3
GPUS = [{"uuid": f"GPU-{k}{k}{k}{k}0000-0000-4000-8000-000000000000", "temp": 50 + k} for k in range(RANKS)]
RESTART_DELAY = 4.0
"""How long a killed child stays dead: several scrapes, so ``up == 0`` is seen."""
MB = 1024**2


def rank_script(port: int, sd_dir: Path, store: Path) -> str:
    """A backend: a model whose age grows, the monitor from the API, stop on a line of stdin."""
    return backend_script(
        f"""
        t0 = time.monotonic()
        sampler.watch_model(lambda: int((time.monotonic() - t0) * 10))
        mon = sampler.ResourceMonitor(
            interval_seconds=1.0, store={str(store)!r}, postmortem_dir=None,
            prometheus_port={port}, prometheus_sd_dir={str(sd_dir)!r},
            _restart_backoff=({RESTART_DELAY}, {RESTART_DELAY}),
        )
        mon.start()
        print("started", flush=True)
        sys.stdin.readline()
        mon.stop()
        """
    )


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.sd_dir = tmp / "sd"
        self.store = tmp / "runs.sqlite"
        self.port = free_ports(RANKS)
        self.run_id = f"itest-{uuid.uuid4().hex[:8]}"
        self.backends: list[subprocess.Popen[str]] = []

    def start(self) -> None:
        self.backends = start_ranks(rank_script(self.port, self.sd_dir, self.store), RANKS, self.run_id)

    def child_of(self, rank: int) -> int:
        children = psutil.Process(self.backends[rank].pid).children()
        assert len(children) == 1, children
        return children[0].pid

    def stop(self, rank: int) -> None:
        backend = self.backends[rank]
        assert backend.stdin is not None
        backend.stdin.write("\n")
        backend.stdin.flush()
        assert backend.wait(timeout=15) == 0

    def close(self) -> None:
        for backend in self.backends:
            if backend.poll() is None:
                backend.kill()
            backend.wait()

    def logged(self) -> dict[int, dict[str, set[float]]]:
        """Rank -> signal -> every value its pipeline logged, from the run store."""
        out: dict[int, dict[str, set[float]]] = {}
        with StoreReader(str(self.store)) as reader:
            runs = {run.id: run for run in reader.runs() if run.launch_id == self.run_id}
        db = sqlite3.connect(f"file:{self.store}?mode=ro", uri=True)
        try:
            for run_id, run in runs.items():
                values = out.setdefault(run.rank, {})
                for name, value in db.execute("SELECT name, value FROM signals WHERE run_id = ?", (run_id,)):
                    values.setdefault(name, set()).add(value)
                steps = db.execute("SELECT DISTINCT step FROM signals WHERE run_id = ?", (run_id,))
                values["step"] = {step for (step,) in steps}
        finally:
            db.close()
        return out


@pytest.fixture
def fleet(tmp_path: Path, nvml: fake_driver.Driver) -> Iterator[tuple[Fleet, PrometheusServer]]:
    nvml.configure(devices=GPUS)  # before the backends start: each inherits it
    fleet = Fleet(tmp_path)
    fleet.sd_dir.mkdir()
    with PrometheusServer(tmp_path / "prometheus", fleet.sd_dir, scrape_interval=1.0) as server:
        try:
            fleet.start()
            yield fleet, server
        finally:
            fleet.close()


def by_rank(result: list[dict[str, Any]]) -> dict[str, float]:
    return {item["metric"]["rank"]: float(item["value"][1]) for item in result}


def agrees(
    prom: dict[str, float], logged: dict[int, dict[str, set[float]]], signal: str, scale: float
) -> bool:
    """Every rank's value in Prometheus is one its pipeline logged (in the metric's unit)."""

    def known(rank: str, value: float) -> bool:
        seen = logged.get(int(rank), {}).get(signal, set())
        return any(abs(v * scale - value) <= 1e-9 * max(1.0, abs(value)) for v in seen)

    return bool(prom) and all(known(rank, value) for rank, value in prom.items())


def test_prometheus_discovers_every_rank_and_reads_what_the_pipeline_logged(
    fleet: tuple[Fleet, PrometheusServer],
) -> None:
    ranks, server = fleet
    job = f'job="wl_resource_monitor",run_id="{ranks.run_id}"'

    # Every rank is discovered through the directory alone, and up, with its labels.
    up = server.wait_for_query(
        f"up{{{job}}}", lambda r: len(r) == RANKS and all(i["value"][1] == "1" for i in r)
    )
    instances = {item["metric"]["rank"]: item["metric"]["instance"] for item in up}
    assert instances == {str(r): f"127.0.0.1:{ranks.port + r}" for r in range(RANKS)}
    for item in up:
        labels = item["metric"]
        assert labels["local_rank"] == labels["rank"] and labels["host"] == os.uname().nodename

    # Host-wide series come from local rank 0 only; each rank has its own process and its own GPU.
    cpu = server.wait_for_query(f"wl_resource_cpu_utilization_ratio{{{job}}}", lambda r: len(r) == 1)
    assert cpu[0]["metric"]["rank"] == "0"
    assert not server.query(f"wl_resource_network_received_bytes_total{{{job},rank!='0'}}")
    threads = server.wait_for_query(f"wl_resource_process_threads{{{job}}}", lambda r: len(r) == RANKS)
    assert sorted(by_rank(threads)) == ["0", "1", "2"]
    gpus = server.wait_for_query(f"wl_resource_gpu_temperature_celsius{{{job}}}", lambda r: len(r) == RANKS)
    for item in gpus:
        labels, rank = item["metric"], int(item["metric"]["rank"])
        assert (labels["gpu"], labels["gpu_uuid"]) == (str(rank), GPUS[rank]["uuid"])
        assert float(item["value"][1]) == GPUS[rank]["temp"]

    # The values agree with what the same monitors logged through the pipeline (the run store).
    checks = [
        ("wl_resource_process_memory_in_use_bytes", "resource/process/memory_in_use_mb", MB),
        ("wl_resource_process_tree_memory_in_use_bytes", "resource/process_tree/memory_in_use_mb", MB),
        ("wl_resource_process_memory_in_use_peak_bytes", "resource/process/memory_in_use_mb_peak", MB),
        ("wl_resource_network_received_bytes_total", "resource/network/bytes_received", 1.0),
        ("wl_resource_model_age", "step", 1.0),
    ]
    for metric, logged_as, scale in checks:
        wait_for(
            lambda metric=metric, logged_as=logged_as, scale=scale: agrees(
                by_rank(server.query(f"{metric}{{{job}}}")), ranks.logged(), logged_as, scale
            ),
            timeout=20,
            what=f"{metric} to agree with the logged {logged_as}",
        )
    with StoreReader(str(ranks.store)) as reader:
        rows = {run.rank: run for run in reader.runs() if run.launch_id == ranks.run_id}
    assert sorted(rows) == [0, 1, 2]
    assert {(r.world_size, r.local_world_size) for r in rows.values()} == {(RANKS, RANKS)}

    # A killed child takes its endpoint down (up == 0) until the restarted child serves again.
    child = ranks.child_of(1)
    os.kill(child, signal.SIGKILL)
    server.wait_for_query(f'up{{{job},rank="1"}}', lambda r: len(r) == 1 and r[0]["value"][1] == "0")
    server.wait_for_query(
        f'up{{{job},rank="1"}}', lambda r: len(r) == 1 and r[0]["value"][1] == "1", timeout=30
    )
    server.wait_for_query(
        f'wl_resource_monitor_restarts_total{{{job},rank="1",cause="crash"}}',
        lambda r: len(r) == 1 and r[0]["value"][1] == "1",
    )
    assert ranks.child_of(1) != child

    # A stopped monitor's target disappears, with its discovery entry.
    ranks.stop(2)
    assert len(list(ranks.sd_dir.glob("*.json"))) == RANKS - 1
    server.wait_for_targets(lambda targets: sorted(t["labels"]["rank"] for t in targets) == ["0", "1"])
    server.wait_for_query(f"up{{{job}}}", lambda r: sorted(by_rank(r)) == ["0", "1"])


def documented_setup(sd_dir: Path) -> str:
    """The manual's ``prometheus.yml``, as written but for its discovery directory."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "prometheus.md").read_text(encoding="utf-8")
    block = text[text.index("# prometheus.yml") :].split("```", 1)[0]
    documented = "/var/lib/prometheus/wl-resource-monitor"
    assert documented in block
    return block.replace(documented, str(sd_dir))


@pytest.mark.timeout(120)
def test_the_documented_prometheus_setup_finds_a_backend_set_up_as_documented(tmp_path: Path) -> None:
    """The manual's scrape configuration (its 15 s interval included) and its two env vars
    on a backend: Prometheus finds the rank through the discovery entry and scrapes it."""
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    port = free_ports()
    script = backend_script(
        """
        sampler.start_resource_monitor_from_config()
        print("started", flush=True)
        sys.stdin.readline()
        sampler.stop_resource_monitor()
        """
    )
    env = {
        **os.environ,
        "WL_RESOURCE_MONITOR_PROMETHEUS_PORT": str(port),
        "WL_RESOURCE_MONITOR_PROMETHEUS_SD_DIR": str(sd_dir),
        "WL_RESOURCE_MONITOR_CATEGORIES": "cpu",
    }
    config = documented_setup(sd_dir)
    with PrometheusServer(tmp_path / "prometheus", sd_dir, config_text=config) as server:
        backend = subprocess.Popen(
            [sys.executable, "-c", script], text=True, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert backend.stdout is not None and backend.stdout.readline() == "started\n"
            up = server.wait_for_query(
                'up{job="wl_resource_monitor"}', lambda r: [float(i["value"][1]) for i in r] == [1.0], 60
            )
            assert up[0]["metric"]["rank"] == "0" and up[0]["metric"]["instance"] == f"127.0.0.1:{port}"
            cpu = server.wait_for_query("wl_resource_cpu_utilization_ratio", lambda r: len(r) == 1, 60)
            assert 0 <= float(cpu[0]["value"][1]) <= 1
        finally:
            assert backend.stdin is not None
            backend.stdin.write("\n")
            backend.stdin.flush()
            if backend.wait(timeout=15) != 0:
                backend.kill()
