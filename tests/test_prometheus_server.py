"""The Prometheus test helper against a real server scraping a tiny exporter served here."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import prometheus_server
import psutil
import pytest
from prometheus_server import JOB_NAME, PrometheusServer, skip_reason

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

SD_LABELS = {"host": "node-a", "role": "trainer"}
UP = f'up{{job="{JOB_NAME}"}}'


class Exporter:
    """A minimal exporter: ``/metrics`` in the text format, startable again on the same port."""

    def __init__(self) -> None:
        self.value = 42.0
        self.port = 0  # chosen by the first start, reused by the next ones
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def body(self) -> bytes:
        return (
            "# TYPE demo_value gauge\n"
            f'demo_value{{rank="0"}} {self.value}\n'
            # Clashes with an SD label: honor_labels must keep the exporter's value.
            "# TYPE demo_labelled gauge\n"
            'demo_labelled{host="exporter-side"} 1\n'
        ).encode()

    def start(self) -> None:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = exporter.body()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per scrape would drown the test output

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="test-exporter")
        self._thread.start()

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.shutdown()
        self._server.server_close()  # the port refuses connections from here on
        self._thread.join()
        self._server = self._thread = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def write_sd(sd_dir: Path, name: str, targets: list[str], labels: dict[str, str]) -> Path:
    """Write ``sd_dir/<name>.json`` atomically: Prometheus must never read half a file."""
    path = sd_dir / f"{name}.json"
    tmp = sd_dir / f".{name}.json.tmp"  # not *.json, so file SD ignores it
    tmp.write_text(json.dumps([{"targets": targets, "labels": labels}]))
    os.replace(tmp, path)
    return path


def values(result: list[dict[str, Any]]) -> list[str]:
    return [item["value"][1] for item in result]


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    exp = Exporter()
    exp.start()
    yield exp
    exp.stop()


@pytest.fixture
def prom(tmp_path: Path) -> Iterator[PrometheusServer]:
    with PrometheusServer(tmp_path / "prometheus", tmp_path / "sd", scrape_interval=1.0) as server:
        yield server


@pytest.fixture
def scraped(prom: PrometheusServer, exporter: Exporter) -> Path:
    """The exporter listed in an SD file and scraped successfully once; the SD file's path."""
    path = write_sd(prom.sd_dir, "trainer", [exporter.address], SD_LABELS)
    prom.wait_for_query(UP, lambda r: values(r) == ["1"])
    return path


def test_sd_target_is_scraped_with_its_labels(
    prom: PrometheusServer, exporter: Exporter, scraped: Path
) -> None:
    (up,) = prom.query(UP)
    assert up["metric"] == {"__name__": "up", "job": JOB_NAME, "instance": exporter.address, **SD_LABELS}
    (target,) = prom.targets()
    assert target["health"] == "up"
    assert target["scrapeUrl"] == f"http://{exporter.address}/metrics"
    assert target["labels"] == {"job": JOB_NAME, "instance": exporter.address, **SD_LABELS}

    (value,) = prom.query("demo_value")
    assert value["metric"]["rank"] == "0"
    assert value["metric"]["host"] == SD_LABELS["host"]
    assert value["value"][1] == "42"
    # Later scrapes are read back too, not only the first one.
    exporter.value = 7.5
    prom.wait_for_query("demo_value", lambda r: values(r) == ["7.5"])

    (labelled,) = prom.query("demo_labelled")
    assert labelled["metric"]["host"] == "exporter-side"
    assert "exported_host" not in labelled["metric"]


def test_target_goes_down_and_recovers_on_the_same_port(
    prom: PrometheusServer, exporter: Exporter, scraped: Path
) -> None:
    exporter.stop()
    prom.wait_for_query(UP, lambda r: values(r) == ["0"])
    (target,) = prom.wait_for_targets(lambda ts: [t["health"] for t in ts] == ["down"])
    assert "connection refused" in target["lastError"]
    # The failed scrape marks the exporter's series stale: no old value is read as current.
    assert prom.query("demo_value") == []

    exporter.start()
    prom.wait_for_query(UP, lambda r: values(r) == ["1"])
    prom.wait_for_query("demo_value", lambda r: values(r) == ["42"])
    (target,) = prom.targets()
    assert target["health"] == "up"
    assert target["lastError"] == ""


def test_removed_sd_file_drops_the_target(prom: PrometheusServer, scraped: Path) -> None:
    scraped.unlink()
    prom.wait_for_targets(lambda ts: ts == [])
    prom.wait_for_query(UP, lambda r: r == [])


def test_failures_say_what_was_asked_and_what_came_back(prom: PrometheusServer) -> None:
    with pytest.raises(RuntimeError, match="parse error"):
        prom.query("up{")
    with pytest.raises(AssertionError, match=r"(?s)query 'up'.*last result: \[\].*targets: \[\]"):
        prom.wait_for_query("up", lambda r: False, timeout=0.5)
    with pytest.raises(AssertionError, match=r"last targets: \[\]"):
        prom.wait_for_targets(lambda ts: False, timeout=0.5)


def test_stop_kills_and_reaps_the_server(tmp_path: Path) -> None:
    with PrometheusServer(tmp_path / "prometheus", tmp_path / "sd") as server:
        pid = server.pid
        assert pid is not None
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        # Staleness markers hide most stopped targets anyway; the short lookback covers the rest.
        assert server.flags()["query.lookback-delta"] == "5s"
        server.stop()
        assert not psutil.pid_exists(pid)  # reaped, not left a zombie
        assert server.pid is None
        with pytest.raises(RuntimeError, match="refused"):
            server.query("up")
    # __exit__ stopped it a second time: idempotent.


def test_start_retries_a_taken_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Bound, not listening: Prometheus cannot bind it, and nothing answers on it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        ports = [taken.getsockname()[1]]
        real_free_port = prometheus_server._free_port
        monkeypatch.setattr(
            prometheus_server, "_free_port", lambda: ports.pop() if ports else real_free_port()
        )
        with PrometheusServer(tmp_path / "prometheus", tmp_path / "sd") as server:
            assert server.port != taken.getsockname()[1]
            assert server.query("vector(1)")[0]["value"][1] == "1"
    assert "address already in use" in server.log_path.read_text()


def test_start_failure_raises_with_the_log(tmp_path: Path) -> None:
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    (workdir / "data").write_text("a file where the TSDB directory should be")
    server = PrometheusServer(workdir, tmp_path / "sd")
    with pytest.raises(RuntimeError, match=r"(?s)did not start.*active query log"):
        server.start()
    assert server.pid is None
