"""What the training hands the pipeline and the run store that SQLite cannot take as it is: a
signal name that is not valid UTF-8, a step beyond 64 bits or no integer at all, a value whose
conversion raises. Each is said once and skipped or escaped; the store and the monitor go on."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FAST, Recorder, wait_for

import sampler
from sampler.store.reader import StoreReader
from sampler.store.writer import RunInfo, RunWriter

CPU = "resource/cpu/utilization_percent"
TOO_BIG = np.uint64(2**64 - 1)


def warnings(caplog: pytest.LogCaptureFixture, fragment: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and fragment in r.getMessage()
    ]


def latin1_name(directory: Path) -> str:
    """The name ``os.listdir`` gives for a file named in Latin-1 (``café``): a lone surrogate."""
    os.close(os.open(os.path.join(os.fsencode(directory), b"caf\xe9"), os.O_CREAT | os.O_WRONLY, 0o600))
    (name,) = os.listdir(directory)
    assert name == "caf\udce9"
    return name


def test_a_signal_name_that_is_not_utf8_is_stored_escaped_and_the_store_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One warning; its values are stored under the escaped name, and every other point of
    the run, before and after, is stored too."""
    files = tmp_path / "files"
    files.mkdir()
    name = f"data/{latin1_name(files)}/loss"
    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(categories=["cpu"], store=store, step_source="seconds", **FAST) as mon:
        for step in range(10):
            sampler.signals.log_signal("train/loss", 1.0, step)
            sampler.signals.log_signal(name, float(step), step)
        wait_for(lambda: mon.stats()["store_points_written"] >= 20, what="the points written")
        for step in range(10, 20):
            sampler.signals.log_signal("train/loss", 1.0, step)
            sampler.signals.log_signal(name, float(step), step)
        seen = mon.stats()["records_logged"]
        wait_for(lambda: mon.stats()["records_logged"] >= seen + 2, what="more samples")
        during = mon.stats()
    assert during["store_error"] is None and during["error"] is None
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
        assert run.status == "ended"
        assert reader.series(run.id, "data/caf\\udce9/loss").values == [float(s) for s in range(20)]
        assert reader.series(run.id, "train/loss").steps == list(range(20))
        assert len(reader.series(run.id, CPU).steps) >= seen + 2
    (said,) = warnings(caplog, "not valid UTF-8")
    assert "caf\\udce9" in said
    assert mon.stats()["store_points_dropped"] == 0


class Unconvertible:
    """A value whose conversion raises what no number conversion should (a tensor on a lost device)."""

    def __float__(self) -> float:
        raise RuntimeError("CUDA error: device-side assert triggered")


def test_a_value_whose_conversion_raises_anything_is_skipped_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(categories=["cpu"], store=store, step_source="seconds", **FAST) as mon:
        for step in range(5):
            sampler.signals.log_signal("train/loss", Unconvertible(), step)  # type: ignore[arg-type]
            sampler.signals.log_signal("train/accuracy", 0.5, step)
        wait_for(lambda: mon.stats()["store_points_written"] >= 5, what="the points written")
        seen = mon.stats()["records_logged"]
        wait_for(lambda: mon.stats()["store_points_written"] > 5 + seen, what="samples written after")
        during = mon.stats()
    assert during["store_error"] is None and during["store_points_dropped"] == 5
    with StoreReader(str(store)) as reader:
        assert reader.run().status == "ended"
        assert reader.series(1, "train/accuracy").steps == list(range(5))
        assert "train/loss" not in reader.names(1)
    (said,) = warnings(caplog, "cannot store train/loss")
    assert "device-side assert" in said


def test_a_write_that_fails_for_a_reason_no_one_foresaw_is_said_once_and_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the write itself (injected: looking up a signal's id raises): the error is
    said once and kept in ``error`` (``stats()['store_error']``); what is queued stays queued
    and is written by a later write."""
    writer = RunWriter(str(tmp_path / "runs.sqlite"), RunInfo(os.getpid(), ["train"], {}, time.time()))
    name_id = RunWriter._name_id
    failures = iter([RuntimeError("a bug"), RuntimeError("a bug")])

    def flaky(self: RunWriter, db: sqlite3.Connection, name: str) -> int:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return name_id(self, db, name)

    monkeypatch.setattr(RunWriter, "_name_id", flaky)
    writer.log("train/loss", 0.5, 0)
    writer.flush()
    assert writer.error is not None and "a bug" in writer.error
    writer.log("train/loss", 0.25, 1)
    writer.flush()
    writer.close({})
    assert writer.error is None and writer.points_written == 2
    with StoreReader(str(tmp_path / "runs.sqlite")) as reader:
        assert reader.run().status == "ended" and reader.series(1, "train/loss").steps == [0, 1]
    assert len(warnings(caplog, "the store")) == 1


def test_a_launch_id_that_is_not_utf8_is_stored_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher's run id comes from the environment, which may hold any bytes."""
    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "TORCHELASTIC_RUN_ID": "job-caf\udce9",
    }.items():
        monkeypatch.setenv(name, value)
    store = tmp_path / "runs.sqlite"
    with sampler.ResourceMonitor(categories=["cpu"], store=store, step_source="seconds", **FAST) as mon:
        wait_for(lambda: mon.stats()["store_points_written"] > 0, what="the run written")
        assert mon.stats()["store_error"] is None
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
    assert run.status == "ended" and run.launch_id is not None and "caf\\udce9" in run.launch_id


# --------------------------------------------------------------------------- steps


@pytest.mark.parametrize(
    "step",
    [
        TOO_BIG,
        2**63,
        -(2**63) - 1,
        float("nan"),
        float("inf"),
        2.5,
        1e300,
        np.float32(0.5),
        Fraction(10**400),
        True,
        "7",
        None,
    ],
    ids=repr,
)
def test_what_cannot_be_a_step_is_refused_once_and_the_monitor_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, step: Any
) -> None:
    """Logged at such a step, a value reaches no subscriber and no store; one warning says so,
    and the monitor (stamping its samples at the training's step) and the store go on."""
    store = tmp_path / "runs.sqlite"
    loss = f"train/{tmp_path.name}"  # said once per name in a process: one no other test logs
    heard = Recorder()
    off = sampler.signals.subscribe(heard)
    try:
        with sampler.ResourceMonitor(categories=["cpu"], store=store, **FAST) as mon:
            sampler.signals.log_signal(loss, 0.5, 1)
            sampler.signals.log_signal(loss, 0.5, step)
            sampler.signals.log_signal(loss, 0.25, step)
            wait_for(lambda: mon.stats()["records_logged"] >= 1, what="a sample")
            sampler.signals.log_signal(loss, 0.125, 2)
            wait_for(lambda: 2 in heard.steps(CPU), what="a sample at the training's next step")
            during = mon.stats()
    finally:
        off()
    assert during["error"] is None and during["store_error"] is None and mon.stats()["error"] is None
    assert heard.steps(loss) == [1, 2]
    with StoreReader(str(store)) as reader:
        (run,) = reader.runs()
        assert run.status == "ended" and reader.series(run.id, loss).steps == [1, 2]
        assert set(reader.series(run.id, CPU).steps) <= {0, 1, 2}
    (said,) = warnings(caplog, "is not a step")
    assert loss in said


def test_steps_that_are_whole_numbers_of_any_kind_are_taken_as_integers(tmp_path: Path) -> None:
    heard = Recorder()
    off = sampler.signals.subscribe(heard)
    try:
        steps = (np.int64(3), np.uint64(4), 5.0, np.float64(6.0), np.float32(7.0), Fraction(8), -9)
        for step in (*steps, 2**63 - 1, -(2**63)):
            sampler.signals.log_signal("train/x", 1.0, step)  # type: ignore[arg-type]
    finally:
        off()
    assert heard.steps("train/x") == [3, 4, 5, 6, 7, 8, -9, 2**63 - 1, -(2**63)]
    assert all(type(step) is int for step in heard.steps("train/x"))


def test_a_model_age_beyond_64_bits_is_refused_once_and_the_monitor_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The watched model's age is no step: samples land as if there were none (at 0, once),
    the monitor thread lives on, and once the age is one again they follow it."""
    store = tmp_path / "runs.sqlite"
    age: list[object] = [TOO_BIG]
    sink = Recorder()
    with sampler.ResourceMonitor(
        categories=["cpu"], store=store, sink=sink, age_source=lambda: age[0], **FAST
    ) as mon:
        wait_for(lambda: mon.stats()["records_dropped"] >= 3, what="samples with no step")
        age[0] = 5
        wait_for(lambda: 5 in sink.steps(CPU), what="a sample at the age")
        during = mon.stats()
    assert during["error"] is None and during["store_error"] is None and mon.running is False
    assert sink.steps(CPU) == [0, 5]
    (said,) = warnings(caplog, "is not a step")
    assert "18446744073709551615" in said


def test_a_step_beyond_64_bits_given_to_the_writer_itself_is_skipped_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = RunWriter(str(tmp_path / "runs.sqlite"), RunInfo(os.getpid(), ["train"], {}, time.time()))
    writer.log("train/loss", 0.5, 2**63)  # type: ignore[arg-type]
    writer.log("train/loss", 0.5, 1)
    writer.log("train/loss", 0.5, TOO_BIG)  # type: ignore[arg-type]
    writer.flush()
    writer.close({})
    assert writer.error is None and writer.points_written == 1 and writer.points_dropped == 2
    with StoreReader(str(tmp_path / "runs.sqlite")) as reader:
        assert reader.series(1, "train/loss").steps == [1]
    (said,) = warnings(caplog, "cannot store train/loss")
    assert "64-bit" in said
