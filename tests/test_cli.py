"""``python -m sampler run``: the foreground monitor a user starts by hand."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sampler import cli

REPO = Path(__file__).resolve().parent.parent


def test_format_sample_groups_by_category_and_device() -> None:
    text = cli.format_sample(
        4,
        {
            "resource/cpu/utilization_percent": 12.5,
            "resource/gpu/0/temperature_celsius": 41.0,
            "resource/gpu/1/temperature_celsius": 67.0,
        },
    )
    assert text.splitlines() == [
        "step 4",
        "  cpu    utilization_percent 12.50",
        "  gpu/0  temperature_celsius 41",
        "  gpu/1  temperature_celsius 67",
    ]


def test_run_prints_samples_until_duration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert cli.main(["run", "--duration", "2.5", "--interval", "1", "--categories", "cpu,memory"], out) == 0
    text = out.getvalue()
    assert "step 1\n" in text and "step 2\n" in text
    assert "utilization_percent" in text and "system_utilization_percent" in text
    assert "process" not in text.split("\n", 1)[1]
    assert text.rstrip().endswith("0 lost, 0 sink errors")


def test_bad_flags_are_rejected_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--categories", "cpu,gpus"])
    assert exit_info.value.code == 2
    assert "gpus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "--interval", "abc"])


def test_ctrl_c_stops_cleanly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sampler", "run", "--interval", "1", "--categories", "cpu"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]  # banner, first "step" line
    assert lines[1].startswith("step ")
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "samples, 0 lost" in rest
