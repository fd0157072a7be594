"""Rules a mutation review found unpinned: the ring's second sequence check, the
idle deadline, the backoff reset after a healthy child, and the cadence's catch-up."""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from conftest import FAST, Recorder, wait_for

import sampler
from ringbuf import Ring, ring
from sampler.child import cadence
from sampler.supervision import supervisor

# --- the ring: a slot lapped during the vectorised copy ---------------------------------------

FIELDS = ("a", "b", "c")
CAPACITY = 16  # a read of this many records takes the vectorised path (above ring._FEW)
LAPPED = 4


class _LapAfterCopy:
    """Stands in for a reader's slot array: copies rows as numpy does, then has the
    writer write before the read takes its second look at the sequences."""

    def __init__(self, slots: npt.NDArray[np.uint64], then: Callable[[], None]) -> None:
        self.slots = slots
        self.then = then

    def __getitem__(self, key: Any) -> npt.NDArray[np.uint64]:
        rows = self.slots[key]
        self.then()
        return rows  # type: ignore[no-any-return]


def ring_pair(capacity: int) -> tuple[Ring, Ring]:
    """A ring's writer and a reader of it, through its descriptor."""
    writer, fd = Ring.create_anonymous(FIELDS, capacity)
    try:
        return writer, Ring.from_fd(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("method", ["read", "read_rows"])
def test_a_slot_overwritten_during_the_vectorised_copy_is_not_returned(method: str) -> None:
    """Records 0..3 are copied intact, then lapped before the second sequence check:
    they are lost, not returned as if still in the ring."""
    writer, reader = ring_pair(CAPACITY)
    with writer, reader:
        for k in range(CAPACITY):
            writer.write([float(k)] * len(FIELDS))

        def lap() -> None:
            for k in range(CAPACITY, CAPACITY + LAPPED):
                writer.write([float(k)] * len(FIELDS))

        real = reader._slots
        reader._slots = _LapAfterCopy(real, lap)  # type: ignore[assignment]
        try:
            got = getattr(reader, method)(0)
        finally:
            reader._slots = real
            del real  # close() unmaps only once no view of the segment is left
        assert writer.head == CAPACITY + LAPPED  # the writer did run inside the read
        indices = [int(i) for i in got.indices]
        assert indices == list(range(LAPPED, CAPACITY))
        assert got.lost == LAPPED and got.cursor == CAPACITY
        for index, row in zip(indices, got.values, strict=True):
            assert [float(v) for v in row] == [float(index)] * len(FIELDS)


class _LapBeforeSecondLook:
    """Stands in for the ring's struct of one sequence word: the second read of slot 0's
    sequence (the one after the copy) first has the writer lap that slot."""

    def __init__(self, real: Any, slot_offset: int, then: Callable[[], None]) -> None:
        self.real, self.slot_offset, self.then, self.looks = real, slot_offset, then, 0

    def unpack_from(self, buf: Any, offset: int = 0) -> tuple[int, ...]:
        if offset == self.slot_offset:
            self.looks += 1
            if self.looks == 2:
                self.then()
        return self.real.unpack_from(buf, offset)  # type: ignore[no-any-return]


FEW_CAPACITY = 4  # a read of this many records takes the slot-by-slot path (ring._FEW and below)


@pytest.mark.parametrize("method", ["read_rows", "read_committed"])
def test_a_slot_overwritten_during_the_slot_by_slot_copy_is_not_returned(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slot 0 is copied intact, then lapped by records 4 and 5 before its sequence is read
    again: records 0 and 1 are lost, never returned with the values they had."""
    writer, reader = ring_pair(FEW_CAPACITY)
    with writer, reader:
        for k in range(FEW_CAPACITY):
            writer.write([float(k)] * len(FIELDS))

        def lap() -> None:
            for k in range(FEW_CAPACITY, FEW_CAPACITY + 2):
                writer.write([float(k)] * len(FIELDS))

        monkeypatch.setattr(ring, "_U64", _LapBeforeSecondLook(ring._U64, reader._data_offset, lap))
        if method == "read_rows":
            got = reader.read_rows(0)
            pairs = [(int(i), list(map(float, row))) for i, row in zip(got.indices, got.values, strict=True)]
        else:
            records, _, _ = reader.read_committed(0)
            pairs = [(index, list(values)) for index, values, _ in records]
        monkeypatch.undo()
        assert writer.head == FEW_CAPACITY + 2  # the writer did run inside the read
        assert not [index for index, _ in pairs if index < 2], "a lapped record was returned"
        for index, values in pairs:
            assert values == [float(index)] * len(FIELDS)


# --- the reader: an idle child's deadline -----------------------------------------------------


def test_an_idle_child_has_its_interval_plus_the_hang_deadline() -> None:
    """A child idle for 1-2 s between samples is not hung at a 0.5 s hang deadline:
    idle, it is overdue only after interval + hang deadline. (``disk`` is not tracked,
    so the child stays idle between records.)"""
    with sampler.ResourceMonitor(
        categories=["disk"],
        sink=Recorder(),
        step_source="seconds",
        interval_seconds=2.0,
        hang_deadline_seconds=0.5,
    ) as monitor:

        def settled() -> dict[str, Any] | None:
            stats = monitor.stats()
            return stats if stats["records_read"] >= 3 or stats["deaths"] else None

        stats = wait_for(settled, timeout=40, what="3 records or a death")
    assert stats["isolation"] == "process"
    assert stats["restarts"] == 0 and stats["deaths"] == []


# --- the supervisor: the backoff resets after a healthy child ---------------------------------

HEALTHY = 1.0


def test_the_backoff_resets_after_a_child_that_lived_healthy_seconds(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Kills at once, at once, after > HEALTHY, at once: restarts wait base, 2x base,
    base again (not 4x), then 2x base."""
    monkeypatch.setattr(supervisor, "HEALTHY_SECONDS", HEALTHY)
    caplog.set_level(logging.WARNING, logger="sampler")
    with sampler.ResourceMonitor(
        categories=["cpu"],
        sink=Recorder(),
        step_source="seconds",
        interval_seconds=FAST["interval_seconds"],
        _min_interval_seconds=FAST["_min_interval_seconds"],
        _restart_backoff=(0.2, 30.0),
    ) as monitor:

        def replace(pid: int) -> int:
            os.kill(pid, signal.SIGKILL)
            new: int = wait_for(
                lambda: monitor.child_pid not in (None, pid) and monitor.child_pid, what="the next child"
            )
            return new

        pid = wait_for(lambda: monitor.child_pid, what="the first child")
        pid = replace(pid)
        pid = replace(pid)
        read = monitor.stats()["records_read"]
        # 15 records at 0.1 s: this child has lived > 1.5 s
        wait_for(lambda: monitor.stats()["records_read"] >= read + 15, what="15 records from the third child")
        pid = replace(pid)
        replace(pid)
        stats = monitor.stats()
    lifetimes = [d["lifetime_seconds"] for d in stats["deaths"]]
    assert len(lifetimes) == 4 and lifetimes[2] >= HEALTHY > max(lifetimes[:2] + lifetimes[3:]), lifetimes
    said = [re.search(r"restarting it in ([\d.]+) s", r.getMessage()) for r in caplog.records]
    delays = [float(m.group(1)) for m in said if m]
    assert delays == [0.2, 0.4, 0.2, 0.4]


# --- the cadence: catching up after an overrun ------------------------------------------------


def test_the_cadence_skips_missed_ticks_without_drift_or_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ticks stay on the grid first + k * interval: a late tick does not shift the
    next one, and an overrun skips the missed ticks instead of firing them back to back."""
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(cadence, "time", SimpleNamespace(monotonic=lambda: clock.now))
    ticks = cadence.Cadence(2.0)
    assert ticks.due == 1001.0  # the first after min(interval, FIRST_SAMPLE_MAX_DELAY)
    clock.now = 1001.5  # a tick that took 0.5 s
    ticks.advance()
    assert ticks.due == pytest.approx(1003.0)  # not 1003.5: no drift
    clock.now = 1008.2  # a tick that overran past 1005 and 1007
    ticks.advance()
    assert ticks.due == pytest.approx(1009.0)  # the next tick on the grid
    assert ticks.seconds_left() == pytest.approx(0.8)  # a wait, not a burst of missed ticks
    clock.now = 1009.1
    ticks.advance()
    assert ticks.due == pytest.approx(1011.0)
