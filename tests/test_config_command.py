"""``python -m sampler config``: the resolved configuration, where each value came from, the files
looked for and every warning, as text and as JSON (issue 8).

The in-process tests call the command's ``run`` with a crafted environment and working directory; the
last ones run ``python -m sampler config`` as a real process.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import parse_command, run_command

from sampler import settings
from sampler.commands import config as command

ENV = settings.ENV
BY_KEY = settings.BY_KEY

REPO = Path(__file__).resolve().parent.parent
FILE_NAME = "resource_monitoring.yaml"
PACKAGE_FILE = REPO / "sampler" / FILE_NAME


@pytest.fixture(autouse=True)
def no_package_file() -> None:
    if PACKAGE_FILE.exists():
        pytest.skip(f"{PACKAGE_FILE} would be used before the files these tests write")


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository (``repo/.git``) holding a config file and a ``.yml`` beside it, worked in from
    ``repo/src``; env vars set."""
    for var in [name for name in os.environ if name.startswith("WL_RESOURCE_MONITOR_")]:
        monkeypatch.delenv(var)
    root = tmp_path.resolve() / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "src").mkdir()
    (root / FILE_NAME).write_text(
        "resource_monitoring:\n"
        "  interval_seconds: 5\n"
        "  categories: {gpu: false, tpu: true}\n"
        f"  store: '{root / 'runs.sqlite'}'\n",
        encoding="utf-8",
    )
    (root / "resource_monitoring.yml").write_text("resource_monitoring: {}\n", encoding="utf-8")
    monkeypatch.setenv(ENV["categories"], "cpu,gpu,disk")
    monkeypatch.setenv(ENV["step_source"], "seconds")
    monkeypatch.setenv(ENV["interval_seconds"], "30")
    monkeypatch.chdir(root / "src")
    return root


def run(*argv: str) -> tuple[int, str]:
    """``config *argv`` through the dispatcher's parser."""
    return run_command("config", *argv, handler=command.run)


def row(text: str, key: str) -> list[str]:
    """The cells (key, value, source) of ``key``'s line in the text report."""
    (line,) = [line for line in text.splitlines() if line.split()[:1] == [key] and line.startswith("  ")]
    key_cell, value, source = line.split(None, 2)
    return [key_cell, value, source]


def test_text_report(scratch: Path, caplog: pytest.LogCaptureFixture) -> None:
    status, text = run()
    assert status == 0
    used = scratch / FILE_NAME
    where = f"{used}: resource_monitoring"
    assert row(text, "enabled") == ["enabled", "true", "built-in default"]
    assert row(text, "interval_seconds") == ["interval_seconds", "5", f"{where}.interval_seconds"]
    assert row(text, "step_source") == ["step_source", "seconds", "WL_RESOURCE_MONITOR_STEP_SOURCE"]
    assert row(text, "categories") == [
        "categories",
        "cpu,disk",
        f"WL_RESOURCE_MONITOR_CATEGORIES, then {where}.categories (gpu)",
    ]
    assert row(text, "gpu") == ["gpu", "off", f"{where}.categories.gpu"]
    assert row(text, "cpu") == ["cpu", "on", "WL_RESOURCE_MONITOR_CATEGORIES"]
    assert row(text, "memory") == ["memory", "off", "WL_RESOURCE_MONITOR_CATEGORIES"]
    assert row(text, "store") == ["store", str(scratch / "runs.sqlite"), f"{where}.store"]
    assert row(text, "disk_path") == ["disk_path", settings.DEFAULT_DISK_PATH, "built-in default"]
    files = text.split("files looked for, in lookup order (the first one found is used):\n")[1]
    lines = files.split("\n\n")[0].splitlines()
    assert lines[0].split() == ["*", "1.", str(used), "used"]
    assert lines[1].split() == ["2.", str(REPO / "sampler" / FILE_NAME), "not", "present"]
    assert lines[2].split() == ["3.", str(scratch / "src" / FILE_NAME), "not", "present"]
    assert len(lines) == 3
    warnings = text.split("\nwarnings (2):\n")[1].splitlines()
    assert warnings[0].startswith(f"  resource monitor: ignoring {scratch / 'resource_monitoring.yml'}: ")
    assert warnings[0].endswith("resource_monitoring.yaml beside it is used instead")
    assert "resource_monitoring.categories.tpu=True is not a known category" in warnings[1]
    assert len(warnings) == 2
    assert not [r for r in caplog.records if r.name == "sampler"]  # reported, not logged twice


def test_json_report(scratch: Path) -> None:
    status, text = run("--json")
    assert status == 0
    data: dict[str, Any] = json.loads(text)
    used = scratch / FILE_NAME
    where = f"{used}: resource_monitoring"
    assert data["values"].pop("postmortem_dir") == str(Path.cwd().resolve() / settings.DEFAULT_POSTMORTEM_DIR)
    assert data["values"] == {
        "enabled": True,
        "interval_seconds": 5.0,
        "categories": {name: name in ("cpu", "disk") for name in settings.DEFAULT_CATEGORIES},
        "disk_path": settings.DEFAULT_DISK_PATH,
        "step_source": "seconds",
        "store": str(scratch / "runs.sqlite"),
        "inner_rate_hz": 5.0,
        "gpu_devices": "all",
        "prometheus_port": None,
        "prometheus_address": "127.0.0.1",
        "prometheus_sd_dir": None,
        "host_sampling": "local_rank_0",
        "run_id": None,
        "stall_seconds": "auto",
        "config_file": str(used),
    }
    assert data["sources"]["interval_seconds"] == f"{where}.interval_seconds"
    assert data["sources"]["step_source"] == "WL_RESOURCE_MONITOR_STEP_SOURCE"
    assert data["sources"]["enabled"] == "built-in default"
    assert data["sources"]["categories.gpu"] == f"{where}.categories.gpu"
    assert data["sources"]["categories.cpu"] == "WL_RESOURCE_MONITOR_CATEGORIES"
    assert data["files"] == [
        {"path": str(used), "status": "used"},
        {"path": str(REPO / "sampler" / FILE_NAME), "status": "not present"},
        {"path": str(scratch / "src" / FILE_NAME), "status": "not present"},
    ]
    assert data["used_file"] == str(used)
    assert len(data["warnings"]) == 2 and "tpu" in data["warnings"][1]


def test_no_file_no_warnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV["store"], raising=False)
    status, text = run()
    assert status == 0
    assert text.rstrip().endswith("\n\nno warnings")
    assert "no file used: env vars and built-in defaults apply" in text
    assert "*" not in text
    assert row(text, "store") == ["store", "none", "built-in default"]


def test_a_later_file_that_exists_is_shown_as_not_used(scratch: Path) -> None:
    (scratch / "src" / FILE_NAME).write_text("resource_monitoring: {interval_seconds: 9}\n", encoding="utf-8")
    data = json.loads(run("--json")[1])
    assert data["files"][2] == {
        "path": str(scratch / "src" / FILE_NAME),
        "status": "present, not used (an earlier file wins)",
    }
    assert data["values"]["interval_seconds"] == 5.0


@pytest.mark.parametrize(
    "text",
    [
        "resource_monitoring: [unclosed\n",
        "resource_monitoring:\n  interval_seconds: " + "[" * 10_000 + "]" * 10_000 + "\n",
        "resource_monitoring:\n  interval_seconds: " + "9" * 5000 + "\n",
    ],
)
def test_a_file_that_cannot_be_used_is_reported(scratch: Path, text: str) -> None:
    (scratch / FILE_NAME).write_text(text, encoding="utf-8")
    status, report = run()
    assert status == 0
    first = [line for line in report.splitlines() if line.startswith("  1. ")]
    assert first[0].split(None, 2) == ["1.", str(scratch / FILE_NAME), "found, cannot be used (see warnings)"]
    assert "no file used" in report
    assert row(report, "interval_seconds") == [
        "interval_seconds",
        "30",
        "WL_RESOURCE_MONITOR_INTERVAL_SECONDS",
    ]
    data = json.loads(run("--json")[1])
    assert data["used_file"] is None
    assert data["files"][0]["status"] == "found, cannot be used (see warnings)"
    assert any("cannot use" in warning for warning in data["warnings"])


def test_odd_paths_never_break_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An undecodable byte (kept as a surrogate) and a newline in the config directory's name, and a
    # disk path an ASCII stream cannot hold.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(settings.ENV_CONFIG_PATH, os.fsdecode(b"/nowhere/\xff\nx"))
    monkeypatch.setenv(ENV["disk_path"], "/nowhere/caf\u00e9")  # printable, but not ASCII
    for argv in ((), ("--json",)):
        args = parse_command("config", *argv)
        raw = io.BytesIO()
        args.out = io.TextIOWrapper(raw, encoding="ascii")
        assert command.run(args) == 0
        text = raw.getvalue().decode("ascii")
        assert "\\udcff" in text
        assert "caf\\xe9" in text if not argv else "caf\\u00e9" in text
        if argv:
            assert len(json.loads(text)["warnings"]) == 2
        else:
            assert "warnings (2):" in text
            assert all(line.isprintable() for line in text.splitlines())


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_closed_pipe_is_status_141(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert command.run(argparse.Namespace(json=False, out=_ClosedPipe())) == command.EXIT_BROKEN_PIPE


# --------------------------------------------------------------------------- a real process


def sampler_config(cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("WL_", "WEIGHTSLAB_"))}
    return subprocess.run(
        [sys.executable, "-m", "sampler", "config", *argv],
        cwd=cwd,
        env={**environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_python_m_sampler_config(tmp_path: Path) -> None:
    # Needs `config` registered in sampler/commands/__init__.py.
    work = tmp_path.resolve()
    (work / FILE_NAME).write_text("resource_monitoring:\n  step_source: sideways\n", encoding="utf-8")
    proc = sampler_config(work, WL_RESOURCE_MONITOR_INTERVAL_SECONDS="20")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    text = proc.stdout
    assert row(text, "interval_seconds") == ["interval_seconds", "20", "WL_RESOURCE_MONITOR_INTERVAL_SECONDS"]
    assert row(text, "step_source") == ["step_source", "model_age", "built-in default"]
    assert f"* 2. {work / FILE_NAME}" in text
    assert "warnings (1):" in text and "resource_monitoring.step_source='sideways' is invalid" in text

    proc = sampler_config(work, "--json", WL_RESOURCE_MONITOR_INTERVAL_SECONDS="20")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["values"]["interval_seconds"] == 20.0
    assert data["used_file"] == str(work / FILE_NAME)
    assert [entry["status"] for entry in data["files"]] == ["not found", "used"]
