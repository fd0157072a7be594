"""``python -m sampler run``: the foreground monitor a user starts by hand."""

from __future__ import annotations

import argparse
import io
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import default_sigint, free_ports, scrape

import sampler
from sampler import commands as cli
from sampler.commands import run as run_command
from sampler.pipeline.emit import Sample
from sampler.views.rows import COLUMNS, GPU_COLUMNS, Rows

REPO = Path(__file__).resolve().parent.parent


def test_a_row_per_sample_names_only_the_columns_with_readings() -> None:
    rows = Rows()
    first = {
        "resource/cpu/utilization_percent": 12.5,
        "resource/gpu/0/utilization_percent": 97.0,
        "resource/gpu/0/memory_allocated_percent": 40.0,
        "resource/gpu/0/temperature_celsius": 41.0,
    }
    header, row = rows.lines(4, first)
    assert header.split() == ["step", "cpu%", "gpu0%", "gpu0mem%"]  # nothing without a reading
    assert row.split() == ["4", "12", "97", "40"] and len(header) == len(row)
    assert rows.lines(5, {"resource/cpu/utilization_percent": 1.0})[0].split() == ["5", "1", "-", "-"]
    second = {**first, "resource/network/bytes_received_per_second": 3 * 1024**2}  # a rate, from now on
    header, row = rows.lines(6, second)
    assert header.split() == ["step", "cpu%", "rxMiB/s", "gpu0%", "gpu0mem%"]
    assert row.split() == ["6", "12", "3.00", "97", "40"]
    assert len(rows.lines(7, second)) == 1


def test_a_full_row_fits_100_columns() -> None:
    sample = {"resource/" + column.key: 100.0 for column in COLUMNS}
    sample.update({f"resource/gpu/0/{column.key}": 100.0 for column in GPU_COLUMNS})
    assert all(len(line) < 100 for line in Rows().lines(1_000_000, sample))


def test_run_prints_samples_until_duration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    # 8 s: beside two busy loops and two other test workers, 2.5 s ended before the child's first
    # sample; where 8 s did too (a machine loaded further still), a longer run is tried.
    for duration in ("8", "30"):
        out = io.StringIO()
        argv = ["run", "--duration", duration, "--interval", "1", "--categories", "cpu,memory"]
        assert cli.main(argv, out) == 0
        lines = out.getvalue().splitlines()
        if not lines[-1].startswith("0 samples"):
            break
    assert lines[0].startswith("sampling every 1 s") and "cpu" not in lines[0]
    assert lines[1].split() == ["step", "cpu%", "mem%"]
    # A sample a second once the child runs (a loaded machine starts it late), each stamped with
    # its whole second since the start: steps 1, 2 ... A sample delayed past half a second takes
    # the next one's second (2, 3, 5, 5): within a second of its place, never out of order.
    steps = [int(line.split()[0]) for line in lines[2:-1]]
    assert steps == sorted(steps) and all(abs(step - steps[0] - i) <= 1 for i, step in enumerate(steps))
    assert steps and lines[-1] == f"{len(steps)} samples, 0 lost, 0 sink errors"


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
        preexec_fn=default_sigint,
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]  # banner, the columns' header
    assert lines[1].split() == ["step", "cpu%"]
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "samples, 0 lost" in rest


def parse(*argv: str) -> argparse.Namespace:
    return cli._parser().parse_args(["run", *argv])


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """argparse's error message for ``run *argv`` (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def cli_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sampler" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("raw", ["inf", "1e12", "nan", "-5", "0", "abc", "-inf", "2592001", "1e400"])
def test_duration_out_of_range_is_refused(capsys: pytest.CaptureFixture[str], raw: str) -> None:
    err = refused(capsys, f"--duration={raw}")
    assert f"argument --duration: {raw!r}" in err
    assert "seconds" in err or "not a number" in err


def test_duration_is_optional_and_bounded_by_30_days() -> None:
    assert parse().duration is None
    assert parse("--duration", "2592000").duration == run_command.MAX_DURATION_SECONDS == 30 * 86400
    assert parse("--duration", "0.5").duration == 0.5


@pytest.mark.parametrize(
    ("raw", "expected", "fragment"),
    [("1e12", 86400.0, "ceiling"), ("0.5", 1.0, "floor"), ("9" * 400, 86400.0, "ceiling")],
)
def test_interval_is_clamped_like_the_env_var(
    caplog: pytest.LogCaptureFixture, raw: str, expected: float, fragment: str
) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    assert parse("--interval", raw).interval_seconds == expected
    (message,) = cli_warnings(caplog)
    assert message.startswith("resource monitor: --interval=") and fragment in message and len(message) < 250


@pytest.mark.parametrize("raw", ["abc", "nan", "inf", "-5", "0", ""])
def test_bad_interval_is_refused(capsys: pytest.CaptureFixture[str], raw: str) -> None:
    assert f"argument --interval: {raw!r}" in refused(capsys, f"--interval={raw}")


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [(",,,", "names no known category"), ("cpu;gpu", "names no known category"), ("cpu,gpus,tpu", "'tpu'")],
)
def test_bad_categories_are_refused(capsys: pytest.CaptureFixture[str], raw: str, fragment: str) -> None:
    err = refused(capsys, "--categories", raw)
    assert fragment in err and "cpu, memory, gpu, disk, network, process" in err


def test_categories_flag_reads_like_the_env_var() -> None:
    assert parse("--categories", " CPU, gpu ").categories == {
        name: name in ("cpu", "gpu") for name in sampler.DEFAULT_CATEGORIES
    }


def test_step_source_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert "step_source" not in vars(parse())  # not given: main() then steps by seconds
    assert parse("--step-source", "Model_Age").step_source == "model_age"
    assert "model_age, seconds" in refused(capsys, "--step-source", "sideways")


@pytest.mark.parametrize("raw", ["0", "00", "70000", "94_00"])
def test_prometheus_port_0_is_refused_as_any_bad_port(capsys: pytest.CaptureFixture[str], raw: str) -> None:
    err = refused(capsys, "--prometheus-port", raw)
    assert f"argument --prometheus-port: {raw!r}: expected a port number" in err
    assert "or false/off for none" in err


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [("1_0", "'1_0': not a process id"), ("+1", "not a process id"), ("9" * 20, "no such process")],
)
def test_pid_is_plain_digits_of_a_live_process(
    capsys: pytest.CaptureFixture[str], raw: str, fragment: str
) -> None:
    assert fragment in refused(capsys, "--pid", raw)


def test_prometheus_port_flag_off_is_no_endpoint() -> None:
    assert parse("--prometheus-port", "off").prometheus_port is None
    assert parse("--prometheus-port", "9400").prometheus_port == 9400


def test_missing_disk_path_is_kept_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    missing = tmp_path / "not" / "yet"
    assert parse("--disk-path", str(missing)).disk_path == str(missing)
    (message,) = cli_warnings(caplog)
    assert message.startswith("resource monitor: --disk-path=") and "does not exist (yet)" in message


@pytest.mark.parametrize("buffering", ["buffered", "unbuffered"])
def test_closed_pipe_ends_the_run_quietly_with_status_141(tmp_path: Path, buffering: str) -> None:
    # `python -m sampler run | head -1`: head reads a line and exits. With stdout buffered (the
    # default for a pipe), the interpreter's final flush would also hit the closed pipe.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    if buffering == "unbuffered":
        env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sampler", "run", "--interval", "1", "--categories", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        assert proc.stdout.readline().startswith("sampling every")
        proc.stdout.close()
        # The run has no end of its own: leaving at all, with 141, is what the closed pipe did. The
        # bound is for a loaded machine (a second or two on an idle one).
        assert proc.wait(timeout=60) == run_command.EXIT_BROKEN_PIPE == 141
    finally:
        proc.kill()
        proc.wait()
    err = proc.stderr.read()
    proc.stderr.close()
    assert err.startswith("settings (and where each comes from):")  # the only thing said, on stderr
    assert "Traceback" not in err and "Exception ignored" not in err and "BrokenPipe" not in err, err


class _ClosedPipe(io.StringIO):
    """A stdout whose reader has gone."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_pipe_closed_before_the_banner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    out = _ClosedPipe()
    assert cli.main(["run", "--categories", "cpu"], out) == run_command.EXIT_BROKEN_PIPE


def test_printer_stops_at_a_closed_pipe() -> None:
    closed = threading.Event()
    printer = run_command._Printer(_ClosedPipe(), closed)
    printer(Sample(step=1, timestamp_ns=0, values={"resource/cpu/utilization_percent": 1.0}))
    assert closed.is_set() and printer.samples == 0
    printer(Sample(step=2, timestamp_ns=0, values={"resource/cpu/utilization_percent": 1.0}))
    assert printer.samples == 0


def test_run_serves_metrics_with_the_prometheus_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("prometheus_client")
    monkeypatch.chdir(tmp_path)
    port = free_ports()
    scraped: list[str] = []

    def scrape_once_served() -> None:
        deadline = time.monotonic() + 10
        while not scraped and time.monotonic() < deadline:
            try:
                body = scrape(port)
            except OSError:
                body = ""
            if "wl_resource_cpu" in body:
                scraped.append(body)
            time.sleep(0.1)

    scraper = threading.Thread(target=scrape_once_served)
    scraper.start()
    # Long enough for a loaded machine to start the child and serve a scrape (2.5 s was not, beside
    # two busy loops and two other test workers).
    argv = ["run", "--duration", "8", "--interval", "1", "--categories", "cpu", "--no-store"]
    argv += [
        "--prometheus-port",
        str(port),
        "--prometheus-sd-dir",
        str(tmp_path / "sd"),
        "--run-id",
        "by-hand",
    ]
    out = io.StringIO()
    try:
        assert cli.main(argv, out) == 0
    finally:
        scraper.join()
    assert f"metrics at http://127.0.0.1:{port}/metrics" in out.getvalue()
    assert "wl_resource_cpu_utilization_ratio{host=" in scraped[0] and 'run_id="by-hand"' in scraped[0]
    assert list((tmp_path / "sd").iterdir()) == []  # the entry left with the run


def test_run_pid_without_pidfds_knows_the_process_by_its_start_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where the kernel has no pidfds: the process is known by its pid and start time, so it
    ends when it exits and is reaped (its pid free to be reused)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_command, "open_pidfd", lambda pid: None)
    trainer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    reaper = threading.Thread(target=trainer.wait)  # reaps it as soon as it exits
    reaper.start()
    out = io.StringIO()

    def end_the_trainer_after_a_sample() -> None:
        deadline = time.monotonic() + 30
        while not re.search(r"^1 ", out.getvalue(), re.M) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert trainer.stdin is not None
        trainer.stdin.close()

    ender = threading.Thread(target=end_the_trainer_after_a_sample)
    ender.start()
    argv = ["run", "--pid", str(trainer.pid), "--no-store", "--interval", "1", "--categories", "cpu"]
    try:
        assert cli.main([*argv, "--duration", "60"], out) == 0
    finally:
        ender.join()
        trainer.kill()
        reaper.join()
    assert f"\nprocess {trainer.pid} ended\n" in out.getvalue()


def test_a_flag_set_to_off_beats_the_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``--prometheus-port off`` turns off an endpoint the environment asks for; ``--store off``
    records nothing, though the run's own default would record."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WL_RESOURCE_MONITOR_PROMETHEUS_PORT", "9400")
    args = cli._parser().parse_args(["run", "--prometheus-port", "off", "--store", "off"])
    chosen = run_command._effective(args, sampler.settings.resolve_config())
    assert chosen["prometheus_port"] == (None, "--prometheus-port")
    assert chosen["store"] == (None, "--store")
    args = cli._parser().parse_args(["run"])
    chosen = run_command._effective(args, sampler.settings.resolve_config())
    assert chosen["prometheus_port"] == (9400, "WL_RESOURCE_MONITOR_PROMETHEUS_PORT")
    assert chosen["store"] == (str(tmp_path / "resource_monitor.sqlite"), "run's default")
