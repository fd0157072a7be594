"""A real Prometheus server for integration tests: started on a free local port,
fed targets through file service discovery, queried over its HTTP API.

Only the standard library is used, so the helper runs wherever the ``prometheus``
binary does (CI installs Debian's package with apt).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

PROMETHEUS = shutil.which("prometheus")
"""The server binary, or None where it is not installed."""

JOB_NAME = "wl_resource_monitor"
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
HTTP_TIMEOUT = 10.0
PORT_ATTEMPTS = 3
LOG_TAIL_LINES = 40

# A proxy from the environment (http_proxy) must never see requests to 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def skip_reason() -> str | None:
    """Why a server cannot run here, or None when it can."""
    if PROMETHEUS is None:
        return "no `prometheus` binary on PATH (apt-get install prometheus)"
    return None


def _free_port() -> int:
    # The port is released before Prometheus binds it, so another process may win
    # the race: start() retries on "address already in use".
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _duration(seconds: float) -> str:
    """A Prometheus duration string, in whole milliseconds."""
    return f"{max(1, round(seconds * 1000))}ms"


class PrometheusServer:
    """One Prometheus process scraping the targets listed in ``sd_dir/*.json``.

    ``workdir`` receives the configuration, the TSDB and the log; nothing is
    deleted at stop, so a failed test's log stays in pytest's ``tmp_path``.
    """

    def __init__(
        self,
        workdir: Path,
        sd_dir: Path,
        scrape_interval: float = 1.0,
        config_text: str | None = None,
        rule_files: tuple[Path, ...] = (),
    ) -> None:
        self.config_text = config_text
        """A configuration to use as it is, instead of the one written from ``sd_dir`` and the interval."""
        self.workdir = Path(workdir)
        self.sd_dir = Path(sd_dir)
        self.scrape_interval = scrape_interval
        self.rule_files = rule_files
        """Rules files to load, evaluated every ``scrape_interval``."""
        self.config_path = self.workdir / "prometheus.yml"
        self.log_path = self.workdir / "prometheus.log"
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle ---------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("Prometheus is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs (None before start and after stop)."""
        return None if self._proc is None else self._proc.pid

    def _write_config(self) -> None:
        if self.config_text is not None:
            self.config_path.write_text(self.config_text)
            return
        interval = _duration(self.scrape_interval)
        # scrape_timeout must not exceed the interval; a slow scrape then fails
        # instead of overlapping the next one.
        timeout = _duration(self.scrape_interval * 0.8)
        # JSON is valid YAML: no YAML library is needed to write the config.
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": interval,
                "evaluation_interval": interval,
                "scrape_timeout": timeout,
            },
            "scrape_configs": [
                {
                    "job_name": JOB_NAME,
                    "honor_labels": True,
                    "file_sd_configs": [{"files": [str(self.sd_dir / "*.json")], "refresh_interval": "1s"}],
                }
            ],
        }
        if self.rule_files:
            config["rule_files"] = [str(path) for path in self.rule_files]
        self.config_path.write_text(json.dumps(config, indent=2) + "\n")

    def _command(self, port: int) -> list[str]:
        assert PROMETHEUS is not None, skip_reason()
        # Queries look back at most this far for a sample: short, so a target that
        # stopped answering is not read as current for the default 5 minutes.
        lookback = _duration(max(5.0, 5 * self.scrape_interval))
        return [
            PROMETHEUS,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--query.lookback-delta={lookback}",
            "--log.level=info",
        ]

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(no log at {self.log_path}: {exc})"
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def start(self) -> PrometheusServer:
        """Write the config, start the server and wait until ``/-/ready`` answers 200."""
        if self._proc is not None:
            raise RuntimeError(f"Prometheus already running as pid {self._proc.pid}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sd_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.port = _free_port()
            with self.log_path.open("ab") as log:
                log.write(f"--- start attempt {attempt} on port {self.port}\n".encode())
                log.flush()
                self._proc = subprocess.Popen(
                    self._command(self.port),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                )
            try:
                if self._wait_ready():
                    return self
            except BaseException:
                self.stop()
                raise
            # It exited before being ready: lost the port race, or a real failure.
            self.stop()
            if "address already in use" not in self._log_tail():
                break
        raise RuntimeError(f"Prometheus did not start (log {self.log_path}):\n{self._log_tail()}")

    def _wait_ready(self) -> bool:
        """True once ready; False if the process exited first; raises on timeout."""
        assert self._proc is not None
        deadline = time.monotonic() + READY_TIMEOUT
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                with _OPENER.open(f"{self.url}/-/ready", timeout=HTTP_TIMEOUT) as resp:
                    if resp.status == 200 and self._owns_port():
                        return True
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"  # 503 while the TSDB is still opening
            except OSError as exc:
                last = repr(exc)  # not listening yet
            time.sleep(0.1)
        raise RuntimeError(
            f"Prometheus pid {self._proc.pid} not ready at {self.url}/-/ready after {READY_TIMEOUT} s "
            f"(last: {last}); log {self.log_path}:\n{self._log_tail()}"
        )

    def _owns_port(self) -> bool:
        """Whether the server answering on our port is ours: if another process won the
        port race, its answer must not pass for our server being ready."""
        try:
            return self.flags().get("config.file") == str(self.config_path)
        except RuntimeError:
            return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a bounded wait; the process is always reaped. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- HTTP API ----------------------------------------------------------

    def _api(self, path: str, params: dict[str, str] | None = None) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; raises with the answer on any failure."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with _OPENER.open(url, timeout=HTTP_TIMEOUT) as resp:
                body = resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            # Bad queries answer 400/422 with a JSON error body: show it.
            detail = exc.read().decode(errors="replace")
            raise RuntimeError(f"GET {url} -> HTTP {exc.code}: {detail}") from exc
        except OSError as exc:
            raise RuntimeError(f"GET {url} failed: {exc!r}; log tail:\n{self._log_tail()}") from exc
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise RuntimeError(f"GET {url} answered non-JSON: {body[:500]!r}") from exc
        if answer.get("status") != "success":
            raise RuntimeError(f"GET {url} -> {answer}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query: ``data.result``, items with ``metric`` (labels) and ``value`` [ts, "str"]."""
        data = self._api("query", {"query": expr})
        if data.get("resultType") != "vector":
            raise RuntimeError(f"query {expr!r} gave a {data.get('resultType')}, not a vector: {data}")
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        """``activeTargets``: items with ``labels``, ``health`` (up/down/unknown), ``lastError``,
        ``scrapeUrl``..."""
        data = self._api("targets", {"state": "active"})
        active: list[dict[str, Any]] = data["activeTargets"]
        return active

    def alerts(self) -> list[dict[str, Any]]:
        """``/api/v1/alerts``: items with ``labels``, ``annotations``, ``state`` (pending/firing),
        ``activeAt`` and ``value``."""
        alerts: list[dict[str, Any]] = self._api("alerts")["alerts"]
        return alerts

    def flags(self) -> dict[str, str]:
        """The command-line flags the running server parsed (``/api/v1/status/flags``)."""
        flags: dict[str, str] = self._api("status/flags")
        return flags

    def wait_for_query(
        self,
        expr: str,
        predicate: Callable[[list[dict[str, Any]]], bool],
        timeout: float = 20.0,
    ) -> list[dict[str, Any]]:
        """Poll ``query(expr)`` until ``predicate`` holds on its result; return that result.

        On timeout the AssertionError carries the last result and the targets, so a
        failing CI log says why (target down, never discovered, wrong labels...).
        """

        def failure(result: list[dict[str, Any]]) -> str:
            return f"query {expr!r}: predicate still false after {timeout} s\n" + (
                f"last result: {json.dumps(result)}\ntargets: {json.dumps(self.targets(), indent=1)}"
            )

        return _poll(lambda: self.query(expr), predicate, timeout, failure)

    def wait_for_targets(
        self,
        predicate: Callable[[list[dict[str, Any]]], bool],
        timeout: float = 20.0,
    ) -> list[dict[str, Any]]:
        """Poll ``targets()`` until ``predicate`` holds on them; return them (AssertionError on timeout)."""

        def failure(active: list[dict[str, Any]]) -> str:
            last = json.dumps(active, indent=1)
            return f"targets: predicate still false after {timeout} s\nlast targets: {last}"

        return _poll(self.targets, predicate, timeout, failure)


def _poll(
    fetch: Callable[[], list[dict[str, Any]]],
    predicate: Callable[[list[dict[str, Any]]], bool],
    timeout: float,
    failure: Callable[[list[dict[str, Any]]], str],
) -> list[dict[str, Any]]:
    """``fetch()`` every 0.2 s until ``predicate`` holds on what it returns;
    after ``timeout`` s, AssertionError with ``failure(last)``."""
    deadline = time.monotonic() + timeout
    while True:
        found = fetch()
        if predicate(found):
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(failure(found))
        time.sleep(0.2)
