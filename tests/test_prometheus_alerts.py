"""A real Prometheus evaluates the printed rules over three real backends, one of which stalls.

Three backend processes, started as torchrun starts the ranks of one launch on one host,
serve their metrics and list themselves in a discovery directory; the server (Debian's
``prometheus``, which ``.ci/run`` installs) finds them there only, scrapes and evaluates
every second. The rules are what ``python -m sampler prometheus rules`` prints, with the
steps-per-second window and ``WlRankStuck``'s ``for:`` shortened in the file, as a site
would change them. One rank stops advancing its step: the alert must fire for that rank
alone, read through the query API, and resolve when the rank moves again.
"""

from __future__ import annotations

import io
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import backend_script, free_ports, start_ranks
from prometheus_server import PrometheusServer, skip_reason

from sampler import commands

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
pytest.importorskip("prometheus_client")

RANKS = 3
STALLED = 1
INTERVAL = 0.5
"""The monitors' sampling interval, s: a record (and a new model age) twice a scrape."""
WINDOW = "8s"
"""The steps-per-second window: 16 records, so a rank that keeps stepping is never read as stopped."""
STUCK_FOR = "3s"
STUCK = 'ALERTS{alertname="WlRankStuck",alertstate="firing"}'


def rank_script(port: int, sd_dir: Path) -> str:
    """A backend stepping every 10 ms; ``pause``/``resume`` on stdin hold and release its step,
    ``stop`` (or the end of stdin) stops it."""
    return backend_script(
        f"""
        import threading
        step, running = 0, threading.Event()
        running.set()
        sampler.watch_model(lambda: step)
        mon = sampler.ResourceMonitor(
            interval_seconds={INTERVAL}, _min_interval_seconds={INTERVAL}, postmortem_dir=None,
            prometheus_port={port}, prometheus_sd_dir={str(sd_dir)!r},
        )
        mon.start()
        done = threading.Event()

        def commands():
            for line in sys.stdin:
                if line.strip() == "pause":
                    running.clear()
                elif line.strip() == "resume":
                    running.set()
                else:
                    break
            done.set()
            running.set()

        threading.Thread(target=commands, daemon=True).start()
        print("started", flush=True)
        while not done.is_set():
            running.wait()
            step += 1
            time.sleep(0.01)
        mon.stop()
        """
    )


def site_rules(tmp_path: Path) -> Path:
    """The printed rules with a short window and ``for:``, changed in the file as a site would."""
    out = io.StringIO()
    assert commands.main(["prometheus", "rules"], out=out) == 0
    rules = yaml.safe_load(out.getvalue())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("record") == "rank:wl_resource_steps_per_second":
                assert "[2m]" in rule["expr"]
                rule["expr"] = rule["expr"].replace("[2m]", f"[{WINDOW}]")
            if rule.get("alert") == "WlRankStuck":
                rule["for"] = STUCK_FOR
    path = tmp_path / "wl_resource_monitor.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


class Launch:
    """Three rank processes of one launch; closed by pid."""

    def __init__(self, sd_dir: Path) -> None:
        self.run_id = f"alerts-{uuid.uuid4().hex[:8]}"
        port = free_ports(RANKS)
        script = rank_script(port, sd_dir)
        self.backends = start_ranks(script, RANKS, self.run_id)

    def tell(self, rank: int, command: str) -> None:
        stdin = self.backends[rank].stdin
        assert stdin is not None
        stdin.write(command + "\n")
        stdin.flush()

    def close(self) -> None:
        for rank, backend in enumerate(self.backends):
            if backend.poll() is None:
                self.tell(rank, "stop")
        for backend in self.backends:
            try:
                backend.wait(timeout=20)
            except subprocess.TimeoutExpired:
                backend.kill()
                backend.wait()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[tuple[Launch, PrometheusServer]]:
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    rules = (site_rules(tmp_path),)
    with PrometheusServer(tmp_path / "prometheus", sd_dir, scrape_interval=1.0, rule_files=rules) as server:
        started = Launch(sd_dir)
        try:
            yield started, server
        finally:
            started.close()


def ranks(result: list[dict[str, Any]]) -> set[str]:
    return {item["metric"]["rank"] for item in result}


def test_a_stalled_rank_fires_wl_rank_stuck_for_itself_alone_and_resolves_when_it_moves(
    launch: tuple[Launch, PrometheusServer],
) -> None:
    fleet, server = launch
    mine = f'run_id="{fleet.run_id}"'
    every = {str(rank) for rank in range(RANKS)}
    server.wait_for_query(f"rank:wl_resource_steps_per_second{{{mine}}} > 0", lambda r: ranks(r) == every, 60)
    server.wait_for_query(f"launch:wl_resource_steps_per_second:median{{{mine}}}", lambda r: len(r) == 1)
    assert server.query(STUCK) == []

    fleet.tell(STALLED, "pause")
    paused_at = time.monotonic()
    seen: set[str] = set()

    def stuck_firing(result: list[dict[str, Any]]) -> bool:
        seen.update(ranks(result))
        return bool(result)

    server.wait_for_query(STUCK, stuck_firing, timeout=60)
    fired_after = time.monotonic() - paused_at
    alerts = [a for a in server.alerts() if a["labels"]["alertname"] == "WlRankStuck"]
    # Every other rank kept stepping all along: it was never stuck, not even pending, in any
    # evaluation (the server's own record of them, this test's alone) until three after the alert fired.
    stuck = f'alertname="WlRankStuck",{mine}'
    server.wait_for_query(f'count_over_time(ALERTS{{{stuck},alertstate="firing"}}[1h]) >= 3', bool, 60)
    seen.update(ranks(server.query(f"count by (rank) (count_over_time(ALERTS{{{stuck}}}[1h]))")))
    assert seen == {str(STALLED)}, seen
    (alert,) = alerts
    assert alert["state"] == "firing"
    assert alert["labels"]["run_id"] == fleet.run_id and alert["labels"]["rank"] == str(STALLED)
    summary = alert["annotations"]["summary"]
    assert f"Rank {STALLED} of launch {fleet.run_id} on {alert['labels']['host']}" in summary

    fleet.tell(STALLED, "resume")
    resumed_at = time.monotonic()
    server.wait_for_query(STUCK, lambda r: r == [], timeout=60)
    resolved_after = time.monotonic() - resumed_at
    report = {
        "fired_after_s": round(fired_after, 1),
        "resolved_after_s": round(resolved_after, 1),
        "alert": alert,
    }
    print(json.dumps(report, indent=1))
