"""The reader's per-record path does only what a record needs: the ring read for a
reader that keeps up (``Ring.read_committed``) and the emitter's work per record.
Nothing here times anything; the overhead benchmark measures the cost."""

from __future__ import annotations

import builtins
import math
import os
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringbuf import Ring
from ringbuf import ring as ring_module
from sampler.pipeline import emit as emit_module
from sampler.pipeline.derived import THROUGHPUT
from sampler.pipeline.emit import WEIGHTSLAB_CHECK_EVERY, Emitter, Sample
from sampler.pipeline.stats import MonitorStats
from sampler.pipeline.steps import StepStamper

FIELDS = ("a", "b", "c")


def values_of(i: int) -> tuple[float, ...]:
    return (float(i), -0.5 * i - 1.0, i * 7.0 + 0.25)


@pytest.fixture
def pair() -> Iterator[tuple[Ring, Ring]]:
    """A writer and a reader attached through its descriptor, capacity 4."""
    writer, fd = Ring.create_anonymous(FIELDS, 4)
    try:
        reader = Ring.from_fd(fd)
    finally:
        os.close(fd)
    with writer, reader:
        yield writer, reader


def write(writer: Ring, first: int, count: int) -> None:
    for i in range(first, first + count):
        writer.write(values_of(i), timestamp_ns=1_000 + i)


# --- the ring: read_committed --------------------------------------------------------------


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=st.integers(min_value=1, max_value=12), batches=st.lists(st.integers(0, 30), max_size=20))
def test_read_committed_returns_what_read_rows_does(capacity: int, batches: list[int]) -> None:
    """After each batch of writes, both readers get the same records, cursor and losses."""
    writer, fd = Ring.create_anonymous(FIELDS, capacity)
    try:
        rows_reader, committed_reader = Ring.from_fd(fd), Ring.from_fd(fd)
    finally:
        os.close(fd)
    with writer, rows_reader, committed_reader:
        written = rows_cursor = committed_cursor = 0
        for batch in batches:
            write(writer, written, batch)
            written += batch
            rows = rows_reader.read_rows(rows_cursor)
            records, committed_cursor, lost = committed_reader.read_committed(committed_cursor)
            assert records == list(zip(rows.indices, rows.values, rows.timestamps_ns, strict=True))
            assert (committed_cursor, lost) == (rows.cursor, rows.lost) == (written, rows.lost)
            assert [values for _, values, _ in records] == [values_of(i) for i in rows.indices]
            rows_cursor = rows.cursor


def test_read_committed_needs_no_head_for_records_in_order(pair: tuple[Ring, Ring]) -> None:
    """The header's head is not read while each slot holds the next record: with it
    zeroed, the committed records still come, and the cursor stops at the first not begun."""
    writer, reader = pair
    write(writer, 0, 3)
    writer._head[0] = 0  # as if no record were committed: read_rows from 0 would return none
    assert reader.read_rows(0).indices == []
    records, cursor, lost = reader.read_committed(0)
    assert [index for index, _, _ in records] == [0, 1, 2]
    assert (cursor, lost) == (3, 0)
    assert reader.read_committed(3) == ([], 3, 0)


def test_a_full_batch_past_a_head_not_yet_advanced_is_returned_without_a_read_rows() -> None:
    """The writer committed record ``_FEW - 1`` but has not advanced its head: the
    loop takes ``_FEW`` records and stops with the cursor one past the head, where
    ``read_rows`` would refuse it. The records come, and the next read goes on from there."""
    writer, fd = Ring.create_anonymous(FIELDS, 4 * ring_module._FEW)
    try:
        reader = Ring.from_fd(fd)
    finally:
        os.close(fd)
    with writer, reader:
        few = ring_module._FEW
        write(writer, 0, few)
        writer._head[0] = few - 1
        records, cursor, lost = reader.read_committed(0)
        assert [index for index, _, _ in records] == list(range(few))
        assert (cursor, lost) == (few, 0)
        writer._head[0] = few
        write(writer, few, 2)
        assert [index for index, _, _ in reader.read_committed(cursor)[0]] == [few, few + 1]


def test_a_corrupt_slot_is_left_to_read_rows_which_counts_it_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ring_module, "VERIFY_CHECKSUMS", True)  # as on aarch64, whatever this machine is
    writer, fd = Ring.create_anonymous(FIELDS, 4)  # after the patch: a ring reads it when made
    try:
        reader = Ring.from_fd(fd)
    finally:
        os.close(fd)
    with writer, reader:
        write(writer, 0, 3)
        writer._slots[1, 4] ^= 1 << 17  # a value word: seq still says "record 1, committed"
        records, cursor, lost = reader.read_committed(0)
        assert [(index, values) for index, values, _ in records] == [(0, values_of(0)), (2, values_of(2))]
        assert (cursor, lost) == (3, 1)


@pytest.mark.parametrize("checksums", [False, True], ids=["seqlock", "seqlock+checksum"])
def test_a_slot_the_writer_begins_to_overwrite_during_the_copy_is_not_returned(
    monkeypatch: pytest.MonkeyPatch, checksums: bool
) -> None:
    """The seqlock's second read: the writer starts the next lap in a slot right after
    the reader copied it. The copy may be torn, so the record counts as lost."""
    monkeypatch.setattr(ring_module, "VERIFY_CHECKSUMS", checksums)
    writer, fd = Ring.create_anonymous(FIELDS, 4)
    try:
        reader = Ring.from_fd(fd)
    finally:
        os.close(fd)
    real = ring_module._U64
    reads = []

    class WriterBetweenReads:
        """``struct.Struct("<Q")`` whose second read of slot 1's seq finds record 5 begun there."""

        def unpack_from(self, buf: object, offset: int = 0) -> tuple[int, ...]:
            reads.append(offset)
            if reads.count(offset) == 2 and offset == reader._data_offset + reader._slot_bytes:
                writer._slots[1, 0] = 2 * 5 + 1
            return real.unpack_from(buf, offset)  # type: ignore[arg-type]

    with writer, reader:
        write(writer, 0, 3)
        monkeypatch.setattr(ring_module, "_U64", WriterBetweenReads())
        records, cursor, lost = reader.read_committed(0)
        assert [index for index, _, _ in records] == [0, 2]
        assert (cursor, lost) == (3, 1)


def test_a_slot_being_written_ends_the_read_there(pair: tuple[Ring, Ring]) -> None:
    writer, reader = pair
    write(writer, 0, 3)
    writer._slots[3, 0] = 2 * 3 + 1  # record 3 begun, not committed; the head still says 3
    records, cursor, lost = reader.read_committed(0)
    assert [index for index, _, _ in records] == [0, 1, 2]
    assert (cursor, lost) == (3, 0)


def test_a_lapped_reader_gets_what_is_left_and_the_count_lost(pair: tuple[Ring, Ring]) -> None:
    writer, reader = pair
    write(writer, 0, 7)  # capacity 4: records 0..2 overwritten
    records, cursor, lost = reader.read_committed(0)
    assert [index for index, _, _ in records] == [3, 4, 5, 6]
    assert [timestamp for _, _, timestamp in records] == [1_003, 1_004, 1_005, 1_006]
    assert (cursor, lost) == (7, 3)


# --- the emitter ----------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []

    def __call__(self, name: str, value: float, step: int) -> None:
        self.calls.append((name, value, step))


def emitter(sink: Sink, on_sample: Callable[[Sample], object] | None = None) -> tuple[Emitter, MonitorStats]:
    stats = MonitorStats()
    return Emitter(StepStamper("seconds", None, 0), sink, stats, on_sample=on_sample), stats


@pytest.mark.parametrize("with_hook", [False, True])
def test_nan_readings_are_skipped_and_the_others_logged(with_hook: bool) -> None:
    sink, samples = Sink(), list[Sample]()
    em, stats = emitter(sink, samples.append if with_hook else None)
    assert em.emit(FIELDS, (1.0, math.nan, 3.0), 2_000_000_000) == 2
    assert em.emit(FIELDS, (4.0, 5.0, 6.0), 3_000_000_000) == 3
    rate = (THROUGHPUT, 1.0, 3)  # one step in the second since the previous record
    assert sink.calls == [("a", 1.0, 2), ("c", 3.0, 2), ("a", 4.0, 3), ("b", 5.0, 3), ("c", 6.0, 3), rate]
    assert (stats.signals_logged, stats.records_logged) == (6, 2)
    if with_hook:
        assert samples == [
            Sample(2, 2_000_000_000, {"a": 1.0, "c": 3.0}),
            Sample(3, 3_000_000_000, {"a": 4.0, "b": 5.0, "c": 6.0, THROUGHPUT: 1.0}),
        ]


def test_throughput_is_the_steps_between_logged_records_over_their_time() -> None:
    ages = [100, 100, 140, 90, 110]  # a step standing still is dropped; one going back restarts
    sink, stats = Sink(), MonitorStats()
    em = Emitter(StepStamper("model_age", lambda: ages.pop(0), 0), sink, stats)
    for second in (0.0, 1.0, 2.0, 3.0, 3.5):
        em.emit(("a",), (1.0,), int(second * 1e9))
    assert [(value, step) for name, value, step in sink.calls if name == THROUGHPUT] == [
        (20.0, 140),  # 40 steps over the 2 s since the last logged record, the dropped one's time included
        (40.0, 110),  # after the step went back to 90: from there, 20 steps in 0.5 s
    ]
    assert stats.records_dropped == 1


def test_no_dict_is_built_for_a_record_nobody_takes_as_a_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []

    def counting_dict(pairs: object) -> dict[str, float]:
        built.append(1)
        return builtins.dict(pairs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(emit_module, "dict", counting_dict, raising=False)
    sink = Sink()
    em, _ = emitter(sink)
    for values in ((1.0, 2.0, 3.0), (1.0, math.nan, 3.0)):
        em.emit(FIELDS, values, 0)
    assert built == [] and len(sink.calls) == 5
    hooked, _ = emitter(Sink(), lambda sample: None)
    hooked.emit(FIELDS, (1.0, 2.0, 3.0), 0)
    assert built == [1]  # the hook takes the readings as a dict: built once


def test_weightslab_s_monitor_is_looked_for_at_the_first_record_and_every_16th(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looks: list[int] = []
    monkeypatch.setattr(emit_module.wl_adapter, "warn_if_weightslab_monitor_running", lambda: looks.append(1))
    em, stats = emitter(Sink())
    em.emit(FIELDS, (1.0, 2.0, 3.0), 0)
    assert len(looks) == 1
    for k in range(1, 2 * WEIGHTSLAB_CHECK_EVERY + 1):
        em.emit(FIELDS, (1.0, 2.0, 3.0), k * 1_000_000_000)
    assert stats.records_logged == 2 * WEIGHTSLAB_CHECK_EVERY + 1
    assert len(looks) == 3  # records 0, 16 and 32
