"""Unit tests for ``ringbuf.Ring``: layout round trip, reads, laps, errors, lifetime."""

from __future__ import annotations

import errno
import os
import platform
import time

import numpy as np
import pytest
from conftest import shm_segments

from ringbuf import NAME_PREFIX, Ring, segment
from ringbuf import ring as ring_mod

SHM_DIR = "/dev/shm"
FIELDS = ("cpu", "mem", "gpu_util")


def mappings_of(name: str) -> int:
    """How many mappings of segment ``name`` this process holds."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if f"{SHM_DIR}/{name}" in line)  # may end in " (deleted)"


def record_values(i: int, n_fields: int = len(FIELDS)) -> list[float]:
    return [i * 10.0 + k + 0.5 for k in range(n_fields)]


class Rings:
    """Creates and attaches rings for one test; closes and unlinks them all afterwards."""

    def __init__(self) -> None:
        self.opened: list[Ring] = []
        self.names: list[str] = []

    def create(self, fields=FIELDS, capacity: int = 8, name: str | None = None) -> Ring:
        r = Ring.create(fields, capacity, name)
        self.opened.append(r)
        self.names.append(r.name)
        return r

    def attach(self, name: str, writer: bool = False) -> Ring:
        r = Ring.attach(name, writer=writer)
        self.opened.append(r)
        return r

    def cleanup(self) -> None:
        for n in self.names:  # names first: a failing close() must not leak a segment
            segment.unlink(n)
        for r in self.opened:
            r.close()


@pytest.fixture
def rings():
    before = shm_segments()
    rs = Rings()
    try:
        yield rs
    finally:
        rs.cleanup()
    assert shm_segments() <= before, "test left wlrb_* segments in /dev/shm"


# --- create / attach -------------------------------------------------------------------------


def test_create_attach_round_trip(rings):
    fields = ("cpu", "mem", "温度", 'quote"d', "")
    w = rings.create(fields, capacity=5)
    assert w.name.startswith(NAME_PREFIX)
    assert len(w.name) == len(NAME_PREFIX) + 16
    assert os.path.exists(f"{SHM_DIR}/{w.name}")
    assert w.fields == fields
    assert w.capacity == 5
    assert w.head == 0

    r = rings.attach(w.name)  # knows only the name: everything else comes from the segment
    assert r.name == w.name
    assert r.fields == fields
    assert r.capacity == 5
    assert r.head == 0
    assert repr(r) == f"Ring(name={w.name!r}, fields=5, capacity=5)"

    res = r.read(0)
    assert len(res) == 0
    assert res.values.shape == (0, len(fields))
    assert res.cursor == 0
    assert res.lost == 0


def test_create_with_explicit_name(rings):
    name = segment.new_name()
    w = rings.create(capacity=3, name=name)
    assert w.name == name
    assert rings.attach(name).capacity == 3
    with pytest.raises(FileExistsError):
        Ring.create(FIELDS, 3, name)


def test_write_read_values_and_timestamps(rings, read_path):
    w = rings.create(capacity=8)
    r = rings.attach(w.name)

    before = time.monotonic_ns()
    assert w.write(record_values(0)) == 0
    after = time.monotonic_ns()
    assert w.write(np.array(record_values(1)), timestamp_ns=123_456_789) == 1
    assert w.write(tuple(record_values(2)), timestamp_ns=0) == 2
    assert w.write(record_values(3), timestamp_ns=-5) == 3
    assert w.write(record_values(4), timestamp_ns=2**63 - 1) == 4
    assert w.head == r.head == 5

    res = r.read(0)
    assert res.values.dtype == np.float64
    assert res.timestamps_ns.dtype == np.int64
    assert res.indices.dtype == np.int64
    np.testing.assert_array_equal(res.indices, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(res.values, [record_values(i) for i in range(5)])
    assert before <= res.timestamps_ns[0] <= after  # default: time.monotonic_ns()
    assert res.timestamps_ns[1:].tolist() == [123_456_789, 0, -5, 2**63 - 1]
    assert res.cursor == 5
    assert res.lost == 0
    assert len(res) == 5

    mid = r.read(3)
    np.testing.assert_array_equal(mid.indices, [3, 4])
    np.testing.assert_array_equal(mid.values, [record_values(3), record_values(4)])
    assert (mid.cursor, mid.lost) == (5, 0)

    at_head = r.read(5)
    assert len(at_head) == 0
    assert (at_head.cursor, at_head.lost) == (5, 0)


def test_special_float_values_survive(rings):
    w = rings.create(("a", "b", "c", "d", "e", "f"), capacity=2)
    tiny = np.nextafter(0.0, 1.0)
    w.write([np.nan, np.inf, -np.inf, -0.0, tiny, np.finfo(np.float64).max])
    w.write([1.0, np.nan, np.nan, 2.0, -np.nan, 3.0])
    res = rings.attach(w.name).read(0)
    assert res.lost == 0
    first, second = res.values
    assert np.isnan(first[0])
    assert first[1] == np.inf and first[2] == -np.inf
    assert first[3] == 0.0 and np.signbit(first[3])
    assert first[4] == tiny
    assert first[5] == np.finfo(np.float64).max
    np.testing.assert_array_equal(np.isnan(second), [False, True, True, False, True, False])
    np.testing.assert_array_equal(second[[0, 3, 5]], [1.0, 2.0, 3.0])


# --- laps and cursors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "written"),
    [(1, 1), (1, 5), (4, 3), (4, 4), (4, 5), (4, 10), (7, 100)],
)
def test_lapped_reader_counts_lost_exactly(rings, capacity, written, read_path):
    w = rings.create(capacity=capacity)
    r = rings.attach(w.name)
    for i in range(written):
        w.write(record_values(i), timestamp_ns=i)

    res = r.read(0)
    first_kept = max(0, written - capacity)
    np.testing.assert_array_equal(res.indices, np.arange(first_kept, written))
    np.testing.assert_array_equal(res.values, [record_values(i) for i in range(first_kept, written)])
    np.testing.assert_array_equal(res.timestamps_ns, np.arange(first_kept, written))
    assert res.lost == first_kept
    assert res.cursor == written == len(res) + res.lost


def test_lost_accumulates_over_several_reads(rings):
    w = rings.create(capacity=4)
    r = rings.attach(w.name)
    accepted = lost = cursor = 0
    for batch in (10, 3, 9, 0, 4, 5):
        for _ in range(batch):
            w.write(record_values(w.head))
        res = r.read(cursor)
        expected_start = max(cursor, w.head - 4)
        np.testing.assert_array_equal(res.indices, np.arange(expected_start, w.head))
        assert res.lost == expected_start - cursor
        accepted += len(res)
        lost += res.lost
        cursor = res.cursor
    assert cursor == w.head == 31 == accepted + lost
    assert lost == 6 + 5 + 1  # 10 into 4 slots; 9 into 4; 5 into 4


def test_cursor_outside_range_raises(rings):
    w = rings.create(capacity=4)
    r = rings.attach(w.name)
    with pytest.raises(ValueError, match="cursor"):
        r.read(1)  # empty ring: only 0 is valid
    for i in range(3):
        w.write(record_values(i))
    for bad in (-1, 4, 100):
        with pytest.raises(ValueError, match="cursor"):
            r.read(bad)
    assert r.read(3).cursor == 3  # the head itself is valid


# --- writer errors ---------------------------------------------------------------------------


def test_write_on_read_only_attach_raises(rings):
    w = rings.create()
    r = rings.attach(w.name)
    with pytest.raises(PermissionError):
        r.write(record_values(0))
    assert w.head == 0
    assert w.write(record_values(0)) == 0


@pytest.mark.parametrize(
    "bad", [[], [1.0, 2.0], [1.0, 2.0, 3.0, 4.0], [[1.0, 2.0, 3.0]], 1.0, [1.0, "x", 3.0], (1.0, [2.0], 3.0)]
)
def test_wrong_number_of_values_raises(rings, bad):
    w = rings.create()
    with pytest.raises(ValueError, match="expected 3 values"):
        w.write(bad)
    assert w.head == 0
    assert w.write(record_values(0)) == 0  # the failed write consumed no record number


@pytest.mark.parametrize("capacity", [0, -1])
def test_capacity_below_one_raises(capacity):
    before = shm_segments()
    with pytest.raises(ValueError, match="capacity"):
        Ring.create(FIELDS, capacity)
    assert shm_segments() == before


@pytest.mark.parametrize("fields", [("a", "b", "a"), ("x", "x"), ("a", 1)])
def test_bad_field_names_raise(fields):
    before = shm_segments()
    with pytest.raises(ValueError, match="distinct strings"):
        Ring.create(fields, 4)
    assert shm_segments() == before


# --- attach errors ---------------------------------------------------------------------------


def test_attach_missing_name_raises():
    with pytest.raises(FileNotFoundError):
        Ring.attach(segment.new_name())


@pytest.mark.parametrize("writer", [False, True])
def test_attach_non_ring_segment_raises_and_unmaps(writer):
    raw = segment.Segment.create(4096)
    name = raw.name
    try:
        assert mappings_of(name) == 1  # the check below can see a mapping
        raw.close()
        assert mappings_of(name) == 0
        with pytest.raises(ValueError, match="not a ring") as excinfo:
            Ring.attach(name, writer=writer)
        # While the traceback (and so attach's frame) is alive, garbage collection has not
        # unmapped anything behind attach's back: only an explicit close leaves no mapping.
        assert excinfo.tb is not None
        assert mappings_of(name) == 0
    finally:
        raw.close()
        segment.unlink(name)


# --- writers, lifetime -----------------------------------------------------------------------


def test_second_writer_continues_numbering(rings):
    w = rings.create(capacity=8)
    for i in range(3):
        w.write(record_values(i))
    w.close()  # hand over: at most one writer at a time

    w2 = rings.attach(w.name, writer=True)
    assert w2.head == 3
    assert w2.write(record_values(3)) == 3
    assert w2.write(record_values(4)) == 4

    res = rings.attach(w.name).read(0)
    np.testing.assert_array_equal(res.indices, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(res.values, [record_values(i) for i in range(5)])
    assert (res.cursor, res.lost) == (5, 0)


def test_close_is_idempotent(rings):
    w = rings.create()
    r = rings.attach(w.name)
    assert mappings_of(w.name) == 2
    r.close()
    r.close()
    assert mappings_of(w.name) == 1
    w.close()
    w.close()
    assert mappings_of(w.name) == 0
    assert os.path.exists(f"{SHM_DIR}/{w.name}")  # close unmaps, it does not unlink
    assert rings.attach(w.name).fields == FIELDS


def test_owner_context_manager_unlinks_but_reader_keeps_reading(rings):
    with Ring.create(FIELDS, 4) as w:
        name = w.name
        rings.names.append(name)  # cleanup if the test fails inside the block
        w.write(record_values(0), timestamp_ns=10)
        w.write(record_values(1), timestamp_ns=11)
        r = rings.attach(name)
        assert os.path.exists(f"{SHM_DIR}/{name}")
    assert not os.path.exists(f"{SHM_DIR}/{name}")
    assert mappings_of(name) == 1  # only the reader's
    with pytest.raises(FileNotFoundError):
        Ring.attach(name)

    res = r.read(0)
    np.testing.assert_array_equal(res.indices, [0, 1])
    np.testing.assert_array_equal(res.values, [record_values(0), record_values(1)])
    np.testing.assert_array_equal(res.timestamps_ns, [10, 11])


def test_attacher_context_manager_does_not_unlink(rings):
    w = rings.create()
    with Ring.attach(w.name) as r:
        assert r.head == 0
    assert os.path.exists(f"{SHM_DIR}/{w.name}")
    assert mappings_of(w.name) == 1


def test_unlink_returns_false_the_second_time(rings):
    w = rings.create()
    assert w.unlink() is True
    assert not os.path.exists(f"{SHM_DIR}/{w.name}")
    assert w.unlink() is False
    w.write(record_values(0))  # the mapping outlives the name
    assert w.read(0).indices.tolist() == [0]


# --- torn slots ------------------------------------------------------------------------------


@pytest.fixture(params=["struct", "numpy"])
def read_path(request, monkeypatch):
    """Run a test through each of read()'s two implementations: slot by slot
    (small batches) and vectorised (large ones)."""
    monkeypatch.setattr(ring_mod, "_FEW", 10**9 if request.param == "struct" else 0)
    return request.param


def _write_three(rings, capacity=4):
    w = rings.create(capacity=capacity)
    r = rings.attach(w.name)
    for i in range(3):
        w.write(record_values(i), timestamp_ns=100 + i)
    assert r.read(0).indices.tolist() == [0, 1, 2]  # intact before corruption
    return w, r


def _assert_record_1_lost(r):
    res = r.read(0)
    np.testing.assert_array_equal(res.indices, [0, 2])
    np.testing.assert_array_equal(res.values, [record_values(0), record_values(2)])
    np.testing.assert_array_equal(res.timestamps_ns, [100, 102])
    assert res.lost == 1
    assert res.cursor == 3 == len(res) + res.lost


@pytest.fixture(params=[False, True], ids=["seqlock", "seqlock+checksum"])
def checksums(request, monkeypatch):
    """Run a test with readers that check checksums and with readers that rely on the
    seqlock alone (x86's default), whatever this machine is."""
    monkeypatch.setattr(ring_mod, "VERIFY_CHECKSUMS", request.param)
    return request.param


def test_readers_check_checksums_only_where_stores_may_be_seen_out_of_order():
    assert not ring_mod.verifies_checksums("x86_64") and not ring_mod.verifies_checksums("AMD64")
    assert ring_mod.verifies_checksums("aarch64") and ring_mod.verifies_checksums("ppc64le")
    assert ring_mod.verifies_checksums(platform.machine()) == ring_mod.VERIFY_CHECKSUMS


def test_torn_slot_odd_sequence_is_lost(rings, read_path, checksums):
    w, r = _write_three(rings)
    slot = 1 % w.capacity
    assert int(w._slots[slot, 0]) == 2 * 1 + 2  # committed
    w._slots[slot, 0] = 2 * 1 + 1  # as if the writer were mid-way through record 1
    _assert_record_1_lost(r)


def test_slot_with_other_records_sequence_is_lost(rings, read_path, checksums):
    w, r = _write_three(rings)
    w._slots[1, 0] = 2 * (1 + w.capacity) + 2  # committed, but for record 5 (a lap later)
    _assert_record_1_lost(r)


@pytest.mark.parametrize(
    ("column", "what"),
    [(1, "checksum"), (2, "timestamp"), (3, "first value"), (3 + len(FIELDS) - 1, "last value")],
)
def test_corrupt_word_fails_checksum_and_is_lost(rings, column, what, read_path, monkeypatch):
    monkeypatch.setattr(ring_mod, "VERIFY_CHECKSUMS", True)  # as on aarch64, whatever this machine is
    w, r = _write_three(rings)
    assert int(w._slots[1, 0]) == 4  # seq still says "record 1, committed"
    w._slots[1, column] ^= np.uint64(1 << 17)
    _assert_record_1_lost(r)


# --- reservation failure ---------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate")
@pytest.mark.parametrize("explicit_name", [False, True])
def test_reservation_failure_raises_enospc_and_leaves_nothing(monkeypatch, explicit_name):
    calls = []

    def no_space(fd, offset, length):
        calls.append((offset, length))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    name = segment.new_name() if explicit_name else None
    before = shm_segments()
    fds_before = len(os.listdir("/proc/self/fd"))
    try:
        with pytest.raises(OSError) as excinfo:
            Ring.create(FIELDS, 16, name)
    finally:
        if name is not None:
            segment.unlink(name)
    assert excinfo.value.errno == errno.ENOSPC
    assert len(calls) == 1
    assert calls[0][1] >= 16 * (ring_mod._SLOT_META + len(FIELDS)) * 8
    assert shm_segments() == before
    assert len(os.listdir("/proc/self/fd")) == fds_before


# A segment with the ring magic but a corrupt body: the parse error surfaces and nothing stays mapped.


def corrupt_mappings_of(name):
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if f"/dev/shm/{name}" in line)


def make_corrupt_segment(capacity, n_fields, names):
    raw = segment.Segment.create(4096)
    words = np.frombuffer(raw.buf, np.uint64, ring_mod._HEADER_WORDS)
    words[1:6] = (ring_mod._VERSION, capacity, n_fields, len(names), 192)
    raw.buf[ring_mod._NAMES_OFFSET : ring_mod._NAMES_OFFSET + len(names)] = names
    words[0] = ring_mod._MAGIC
    del words
    raw.close()
    return raw.name


@pytest.mark.parametrize(
    ("capacity", "n_fields", "names"),
    [
        (4, 1, b"not json!!"),  # fails in json.loads, while local `words` is alive
        (10**6, 1, b'["a"]'),  # slots run past the segment: fails after self._head is set
    ],
)
def test_attach_corrupt_ring_header_raises_valueerror_and_unmaps(capacity, n_fields, names):
    name = make_corrupt_segment(capacity, n_fields, names)
    try:
        with pytest.raises(ValueError) as excinfo:
            Ring.attach(name)
        assert excinfo.tb is not None
        assert corrupt_mappings_of(name) == 0
    finally:
        segment.unlink(name)
