"""Where a stall is told besides its record: the endpoint's stalled gauge and age, the shipped
alert on them, the GPUs as they were, the other ranks' last steps, ``explain`` and the
postmortem. Each in a real backend with a real sampling child (the stall itself is
``tests/test_stalls.py``'s)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fake_driver
import pynvml
import pytest
from conftest import (
    ENV_VARS,
    FAST,
    Recorder,
    backend_script,
    free_ports,
    run_command,
    scrape,
    torchrun,
    wait_for,
)

import sampler
from sampler.commands import explain, stalls
from sampler.commands import postmortem as postmortem_command
from sampler.store import schema
from sampler.supervision.stacks import STACK_SIGNAL

parser = pytest.importorskip("prometheus_client.parser")

pytestmark = pytest.mark.skipif(STACK_SIGNAL is None, reason="the stall watch needs real-time signals")

STALL_SECONDS = 1.0


class Stepper:
    """A training loop's step, moved by a thread of its own until ``pause``."""

    def __init__(self) -> None:
        self.step = 0
        self._moving = threading.Event()
        self._moving.set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            self._moving.wait()
            self.step += 1
            self._done.wait(0.05)

    def pause(self) -> None:
        self._moving.clear()

    def resume(self) -> None:
        self._moving.set()

    def close(self) -> None:
        self._done.set()
        self._moving.set()
        self._thread.join()


@pytest.fixture
def stepper() -> Iterator[Stepper]:
    moving = Stepper()
    yield moving
    moving.close()


def stalling_monitor(stepper: Stepper, **kwargs: Any) -> sampler.ResourceMonitor:
    options: dict[str, Any] = {
        **FAST,
        "interval_seconds": 0.2,
        "categories": ["cpu"],
        "step_source": "model_age",
        "age_source": lambda: stepper.step,
        "stall_seconds": STALL_SECONDS,
        "sink": Recorder(),
        "postmortem_dir": None,
        **kwargs,
    }
    return sampler.ResourceMonitor(**options)


def stall_series(port: int) -> dict[str, float]:
    """The stall metrics in one scrape: name -> value (one rank: one series each)."""
    found = {}
    for family in parser.text_string_to_metric_families(scrape(port)):
        for sample in family.samples:
            if sample.name in ("wl_resource_stalled", "wl_resource_stall_age_seconds"):
                found[sample.name] = sample.value
    return found


def test_the_endpoint_serves_the_stalled_gauge_and_the_stall_s_age_while_it_lasts(stepper: Stepper) -> None:
    port = free_ports()
    with stalling_monitor(stepper, prometheus_port=port) as mon:
        wait_for(lambda: stepper.step >= 30 and mon.stats()["records_logged"] >= 5, what="a run that steps")
        assert stall_series(port) == {"wl_resource_stalled": 0}  # no age while no stall is open
        stepper.pause()
        paused_at = time.monotonic()
        first = wait_for(
            lambda: (found := stall_series(port)).get("wl_resource_stalled") == 1 and found, what="the stall"
        )
        assert STALL_SECONDS <= first["wl_resource_stall_age_seconds"] <= time.monotonic() - paused_at + 1
        later = wait_for(
            lambda: (
                (found := stall_series(port))["wl_resource_stall_age_seconds"]
                > first["wl_resource_stall_age_seconds"] + 0.5
                and found
            ),
            what="the age growing",
        )
        assert later["wl_resource_stalled"] == 1
        stepper.resume()
        wait_for(lambda: stall_series(port) == {"wl_resource_stalled": 0}, what="the stall closed")


def test_a_monitor_that_watches_no_stalls_serves_no_stall_metrics(stepper: Stepper) -> None:
    port = free_ports()
    with stalling_monitor(stepper, prometheus_port=port, stall_seconds="off") as mon:
        wait_for(lambda: mon.stats()["records_logged"] >= 2, what="records")
        text = scrape(port)
    assert "wl_resource_model_age" in text and "stall" not in text


def run_backend(store: Path, body: str, categories: tuple[str, ...] = ("cpu",)) -> str:
    """A backend that steps (every 50 ms) until it has logged records, then runs ``body``:
    its stdout and stderr once it ended."""
    script = backend_script(
        textwrap.dedent(
            f"""
        steps = [0]
        mon = sampler.ResourceMonitor(categories={list(categories)!r}, store=sys.argv[1],
                                      interval_seconds=0.2, _min_interval_seconds=0.05,
                                      age_source=lambda: steps[0], stall_seconds={STALL_SECONDS})
        mon.start()
        while steps[0] < 30 or mon.stats()["records_logged"] < 5:
            steps[0] += 1
            time.sleep(0.05)
        """
        )
        + textwrap.dedent(body)
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(store)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


STALL_THEN_STEP = """
def collective():
    time.sleep(4)
collective()
steps[0] += 1
time.sleep(1)
mon.stop()
"""


def stalls_output(store: Path, *argv: str) -> str:
    status, out = run_command("stalls", str(store), *argv, handler=stalls.main)
    assert status == 0, out
    return out


def test_a_stall_keeps_each_gpu_as_the_record_it_was_seen_at_had_it(
    tmp_path: Path, nvml: fake_driver.Driver
) -> None:
    # GPU 0 as a collective hang leaves it: busy by the driver's count, at idle power, its SMs idle.
    hung = {
        "util": 100,
        "power_mw": 62_000,
        "power_limit_mw": 400_000,
        "gpm": {pynvml.NVML_GPM_METRIC_SM_UTIL: 3.0},
    }
    nvml.configure(devices=[hung, {"util": 0, "power_mw": 30_000}])
    store = tmp_path / "runs.sqlite"
    run_backend(store, STALL_THEN_STEP, categories=("cpu", "gpu"))
    db = sqlite3.connect(store)
    ((gpus,),) = db.execute("SELECT gpus FROM stalls").fetchall()
    db.close()
    assert json.loads(gpus) == [
        {"gpu": "0", "utilization_percent": 100, "power_watts": 62, "power_limit_watts": 400,
         "sm_activity_percent": 3},
        {"gpu": "1", "utilization_percent": 0, "power_watts": 30, "power_limit_watts": 700},  # no GPM there
    ]  # fmt: skip
    out = stalls_output(store)
    assert "    gpu 0: 100% busy, 62 W of 400 W, SMs 3% active\n    gpu 1: 0% busy, 30 W of 700 W\n" in out
    print(out)


def test_a_stall_without_gpus_keeps_none_and_a_version_7_store_gains_the_column(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    run_backend(store, STALL_THEN_STEP)
    db = sqlite3.connect(store)
    assert db.execute("SELECT gpus FROM stalls").fetchall() == [(None,)]
    db.close()
    assert "GPUs when" not in stalls_output(store)
    old = tmp_path / "old.sqlite"
    db = sqlite3.connect(old, isolation_level=None)
    for version in range(7):
        schema._MIGRATIONS[version](db)
    db.execute("PRAGMA user_version = 7")
    db.execute(
        "INSERT INTO stalls (backend_pid, host, kind, step, started_at, detected_after, timeout, threads,"
        " notes) VALUES (42, 'h', 'steps', 7, 2.0, 30.0, 30.0, '[]', '[]')"
    )
    db.close()
    assert "stall 1: run ? (pid 42 on h), step 7" in stalls_output(old)  # read as it is
    schema.connect(str(old)).close()
    db = sqlite3.connect(old)
    assert db.execute("SELECT step, gpus FROM stalls").fetchall() == [(7, None)]
    assert db.execute("PRAGMA user_version").fetchone() == (schema.SCHEMA_VERSION,)
    db.close()


def test_a_stalled_rank_shows_where_each_other_rank_of_its_launch_stood(tmp_path: Path) -> None:
    # Synchronous training where rank 1 stopped at step 40: rank 0 ran one forward further and
    # waits for it in the collective, at 41. Both stall; each row shows where the other stood.
    store = tmp_path / "runs.sqlite"
    script = backend_script(
        f"""
        last = int(os.environ["LAST_STEP"])
        steps = [0]
        mon = sampler.ResourceMonitor(categories=["process"], store=sys.argv[1], postmortem_dir=None,
                                      interval_seconds=0.2, _min_interval_seconds=0.05,
                                      age_source=lambda: steps[0], stall_seconds={STALL_SECONDS})
        mon.start()
        while steps[0] < last:
            steps[0] += 1
            time.sleep(0.05)
        def all_reduce():
            time.sleep(5)
        all_reduce()
        steps[0] += 1
        time.sleep(1)
        mon.stop()
        """
    )
    launch_id = f"stall-{uuid.uuid4().hex[:8]}"
    started = []
    try:
        for rank, last in ((0, 41), (1, 40)):
            env = {
                **{k: v for k, v in os.environ.items() if k not in ENV_VARS},
                **torchrun(rank, rank, 2, 2, TORCHELASTIC_RUN_ID=launch_id),
                "LAST_STEP": str(last),
            }
            started.append(subprocess.Popen([sys.executable, "-c", script, str(store)], env=env))
        assert [backend.wait(timeout=120) for backend in started] == [0, 0]
    finally:  # whatever happened: kill (by pid) and reap what still runs
        for backend in started:
            if backend.poll() is None:
                backend.kill()
            backend.wait()
    db = sqlite3.connect(store)
    runs = dict(db.execute("SELECT rank, id FROM runs").fetchall())
    stalled = dict(db.execute("SELECT run_id, step FROM stalls").fetchall())
    db.close()
    assert stalled == {runs[0]: 41, runs[1]: 40}
    out = stalls_output(store, "--run", str(runs[1]))
    print(out)
    assert f"launch {launch_id} when it was seen (" in out and "this run stood at step 40 since" in out
    assert f"\n    rank 0 (run {runs[0]}): step 41 since " in out and "(1 step further)" in out
    out = stalls_output(store, "--run", str(runs[0]))
    assert f"\n    rank 1 (run {runs[1]}): step 40 since " in out and "(1 step behind)" in out


def test_explain_names_each_stall_with_its_step_duration_and_frame(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    run_backend(store, STALL_THEN_STEP)
    status, out = run_command("explain", str(store), handler=explain.main)
    assert status == 0, out
    print(out)
    (line,) = [line for line in out.splitlines() if line.startswith("Stalled")]
    db = sqlite3.connect(store)
    ((step, duration),) = db.execute("SELECT step, duration FROM stalls").fetchall()
    db.close()
    assert line.startswith(f"Stalled at step {step} from ") and f" for {duration:.1f} s (no new step)" in line
    assert line.endswith(" in collective.") and '; the main thread in File "<string>", line ' in line
    status, out = run_command("explain", str(store), "--json", handler=explain.main)
    assert status == 0, out
    (stall,) = json.loads(out)["stalls"]
    assert stall["step"] == step and stall["duration"] == duration and stall["kind"] == "steps"
    assert stall["main_frames"][0].startswith('File "<string>", line ') and stall["main_frames"][0].endswith(
        " in collective"
    )
    assert line.startswith(f"Stalled at step {step} from {explain._clock(stall['started_at'])} ")


def test_a_postmortem_written_during_a_stall_carries_it(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    script = backend_script(
        f"""
        steps = [0]
        mon = sampler.ResourceMonitor(categories=["cpu"], store=sys.argv[1], interval_seconds=0.2,
                                      _min_interval_seconds=0.05, age_source=lambda: steps[0],
                                      stall_seconds={STALL_SECONDS})
        mon.start()
        while steps[0] < 30 or mon.stats()["records_logged"] < 5:
            steps[0] += 1
            time.sleep(0.05)
        def hung_collective():
            time.sleep(600)  # until the scheduler kills the job
        hung_collective()
        """
    )
    backend = subprocess.Popen([sys.executable, "-c", script, str(store)], stderr=subprocess.PIPE, text=True)
    try:

        def stall_with_stacks() -> tuple[int, int] | None:
            if not store.exists():
                return None
            db = sqlite3.connect(store)
            try:
                row = db.execute("SELECT id, step FROM stalls WHERE stacks IS NOT NULL").fetchone()
            except sqlite3.OperationalError:
                return None  # the store not made yet
            finally:
                db.close()
            return None if row is None else (int(row[0]), int(row[1]))

        stall_id, step = wait_for(stall_with_stacks, timeout=60, what="the stall recorded")
        backend.kill()  # the scheduler's SIGKILL: the child writes the postmortem
        backend.wait(timeout=30)
    finally:
        if backend.poll() is None:
            backend.kill()
        backend.wait()
        assert backend.stderr is not None
        backend.stderr.close()

    def postmortem() -> str | None:
        db = sqlite3.connect(store)
        try:
            row = db.execute("SELECT body FROM postmortems").fetchone()
        finally:
            db.close()
        return None if row is None else str(row[0])

    header = json.loads(wait_for(postmortem, timeout=30, what="the postmortem").splitlines()[0])
    stall = header["stall"]
    assert (stall["kind"], stall["step"], stall["stall_id"]) == ("steps", step, stall_id)
    assert stall["main_frames"][0].endswith("in hung_collective")
    assert stall["started_at"] < header["vanished_at"] and stall["detected_after"] >= STALL_SECONDS
    status, out = run_command(
        "postmortem", "--store", str(store), "--show", "1", handler=postmortem_command.main
    )
    assert status == 0, out
    print(out)
    assert f"\nit was stalled at step {step} since " in out
    assert "s before it died); the main thread in File " in out and "in hung_collective <- " in out
    assert f"every thread's stack: stall {stall_id} in the run store's stalls" in out
