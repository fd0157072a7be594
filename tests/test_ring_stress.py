"""Multi-process stress: one writer at full speed, fast and slow readers, small and large rings.

Every record is self-checking (see ``ring_stress_worker``), so a torn or misnumbered record
that ``Ring.read`` accepted is caught by the reader process and reported back.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from multiprocessing import resource_tracker

import pytest
import ring_stress_worker as worker
from conftest import shm_segments

from ringbuf import Ring

DURATION_S = 2.0
STARTUP_TIMEOUT_S = 60.0
SMALL_CAPACITIES = (1, 2, 7)
READERS = ("fast-0", "committed", "slow")


def pause_s(label: str, capacity: int) -> float:
    """Seconds a reader sleeps between reads (the others never): the slow one long enough that
    the writer (~1e5 records/s) laps it, so at capacity 4096 it copies whole rings whose oldest
    slots are being overwritten during the copy."""
    return 0.0 if label != "slow" else max(0.002, capacity * 1e-5)


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker_running():
    """Start multiprocessing's resource tracker before any per-test leak check looks.

    Every ``spawn`` start launches it once per interpreter, and it then lives until the
    interpreter exits; it is not one of this test's workers, all of which are joined.
    """
    resource_tracker.ensure_running()


def start(p, procs) -> None:
    p.start()
    procs.append(p)  # only started processes: join() refuses the others


def stop(procs) -> None:
    """Join every process; terminate, then kill, any that will not finish."""
    for p in procs:
        p.join(timeout=5)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


def receive(q, procs, timeout_s: float):
    """The next message on ``q``; fails early if a worker process died instead of reporting."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            dead = [f"{p.name} (exit code {p.exitcode})" for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"worker processes died: {dead}"
            assert time.monotonic() < deadline, f"no message from workers within {timeout_s} s"


def run_stress(capacity: int, n_fields: int) -> dict[str, dict[str, int]]:
    ctx = mp.get_context("spawn")
    ring = Ring.create([f"f{j}" for j in range(n_fields)], capacity)
    procs = []
    ready, results = ctx.Queue(), ctx.Queue()
    try:
        go, done = ctx.Event(), ctx.Event()
        for label in READERS:
            args = (ring.name, n_fields, label, pause_s(label, capacity), ready, go, done, results)
            start(ctx.Process(target=worker.reader, args=args, name=label, daemon=True), procs)
        args = (ring.name, n_fields, DURATION_S, ready, go, done, results)
        start(ctx.Process(target=worker.writer, args=args, name="writer", daemon=True), procs)
        for _ in procs:
            receive(ready, procs, STARTUP_TIMEOUT_S)
        go.set()
        out = {}
        for _ in procs:
            label, stats = receive(results, procs, DURATION_S + STARTUP_TIMEOUT_S)
            assert "error" not in stats, f"{label} failed:\n{stats['error']}"
            out[label] = stats
        stop(procs)
        assert [p.exitcode for p in procs] == [0] * len(procs)
        assert ring.head == out["writer"]["written"]
        return out
    finally:
        try:
            stop(procs)
            for q in (ready, results):
                q.close()
                q.join_thread()
        finally:
            ring.unlink()
            ring.close()


@pytest.mark.usefixtures("whole_machine")  # four busy processes: no test that judges speed beside them
@pytest.mark.parametrize("n_fields", [8, 64])
@pytest.mark.parametrize("capacity", [1, 2, 7, 4096])
def test_concurrent_readers_never_accept_torn_records(capacity, n_fields):
    before = shm_segments()
    out = run_stress(capacity, n_fields)
    leftovers = shm_segments() - before
    assert not leftovers, f"segments left in /dev/shm: {leftovers}"

    written = out["writer"]["written"]
    assert written > 0
    summary = [f"capacity={capacity} fields={n_fields} written={written}"]
    for label in READERS:
        s = out[label]
        summary.append(
            f"  {label}: accepted={s['accepted']} lost={s['lost']} reads={s['reads']} "
            f"(while writing: accepted={s['accepted_while_writing']} lost={s['lost_while_writing']})"
        )
    print("\n".join(summary))

    for label in READERS:
        s = out[label]
        assert s["torn"] == 0, f"{label} accepted {s['torn']} torn records"
        assert s["non_monotonic"] == 0, f"{label} saw out-of-order record numbers"
        assert s["accepted"] + s["lost"] == s["cursor"] == written, label
        if capacity in SMALL_CAPACITIES:
            # The writer lapped every reader, and every reader still got records through.
            assert s["lost_while_writing"] > 0, f"{label} was never lapped"
            assert s["accepted_while_writing"] >= 10, f"{label} accepted too few records"
