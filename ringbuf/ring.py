"""A single-writer, multi-reader ring of fixed-layout float64 records.

Segment layout (all words little-endian 64-bit)::

    header (128 B): magic, version, capacity, n_fields, names_len, data_offset,
                    ..., head at byte 64 (records committed so far)
    field names:    UTF-8 JSON list, padded to 64 bytes
    slots:          capacity x [seq, checksum, timestamp_ns, value_0 .. value_F-1]

Each slot is a seqlock. Writing record ``i`` stores ``seq = 2i+1`` (odd: being
written), the values and timestamp, the checksum, then ``seq = 2i+2``
(committed), then ``head = i+1``. A reader copies a batch of slots and accepts
record ``i`` only if ``seq`` read before *and* after the copy equals ``2i+2`` and
the checksum matches. Since ``seq`` names the record, not just the slot's
parity, a lapped slot is told apart from a torn one for free; both are counted
as lost, never returned.

Memory ordering: the seqlock relies on the writer's stores becoming visible in
program order and the reader's loads not being reordered, which x86 (TSO)
guarantees, so there the two sequence reads alone decide. Weaker architectures
(aarch64, POWER) may show a reader the new ``seq`` with stale values; the
writer always stores a checksum, a multiply-sum of the timestamp and value
words seeded with the committed ``seq``, and readers there check it
(``VERIFY_CHECKSUMS``), which rejects such a mix with probability ~1 - 2^-64,
so a torn record is never accepted there either. On x86 the check is skipped:
a reader woken once a second for one record pays for it in cold caches, about
a fifth of what a bare woken thread costs.
"""

from __future__ import annotations

import json
import operator
import os
import platform
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ringbuf import segment

_MAGIC = int.from_bytes(b"WLRING01", "little")
_VERSION = 1
_HEADER_WORDS = 16  # 128 bytes
_HEAD_WORD = 8  # own cache line: the only header word written after creation
_NAMES_OFFSET = _HEADER_WORDS * 8
_SLOT_META = 3  # seq, checksum, timestamp_ns
_ALIGN = 64
_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_TIMESTAMP_OFFSET = 16
"""A slot's timestamp word, in bytes from the slot's start (after seq and checksum)."""
_TSO_MACHINES = frozenset({"x86_64", "amd64", "i386", "i486", "i586", "i686"})
_FEW = 8
"""Reads of at most this many records take the struct path, larger ones numpy."""


def verifies_checksums(machine: str) -> bool:
    """Whether readers on a ``machine`` (``platform.machine()``) check each record's
    checksum: everywhere but x86, whose total store order makes the seqlock enough."""
    return machine.lower() not in _TSO_MACHINES


VERIFY_CHECKSUMS = verifies_checksums(platform.machine())
"""Whether this machine's readers check checksums; a ring reads it when it is created or attached."""


def _pad(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _layout(fields: Sequence[str], capacity: int) -> tuple[int, bytes]:
    """(segment size in bytes, encoded field names) of a new ring; ValueError if unusable."""
    fields = tuple(fields)
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if len(set(fields)) != len(fields) or not all(isinstance(f, str) for f in fields):
        raise ValueError("fields must be distinct strings")
    names = json.dumps(list(fields)).encode("utf-8")
    return _pad(_NAMES_OFFSET + len(names)) + capacity * (_SLOT_META + len(fields)) * 8, names


def _weights(n_fields: int) -> npt.NDArray[np.uint64]:
    """Odd per-word multipliers for the checksum: seq, timestamp, values..."""
    return np.array([(_GOLDEN * (k + 1)) & _MASK | 1 for k in range(n_fields + 2)], dtype=np.uint64)


def _parse_header(seg: segment.Segment) -> tuple[int, int, int, tuple[str, ...]]:
    """(capacity, n_fields, data_offset, field names) of a ring segment; ValueError
    if the segment is not a ring, not ready, or inconsistent."""
    size = len(seg.buf)
    if size < _NAMES_OFFSET:
        raise ValueError(f"shared-memory segment {seg.name!r} is too small to be a ring")
    words = struct.unpack_from(f"<{_HEADER_WORDS}Q", seg.buf, 0)
    if words[0] != _MAGIC or words[1] != _VERSION:
        raise ValueError(f"shared-memory segment {seg.name!r} is not a ring (or not ready)")
    capacity, n_fields, names_len, data_offset = words[2:6]
    if (
        capacity < 1
        or data_offset < _NAMES_OFFSET + names_len
        or data_offset % _ALIGN
        or data_offset + capacity * (_SLOT_META + n_fields) * 8 > size
    ):
        raise ValueError(f"ring {seg.name!r} has an inconsistent header")
    try:
        fields = tuple(json.loads(bytes(seg.buf[_NAMES_OFFSET : _NAMES_OFFSET + names_len]).decode("utf-8")))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"ring {seg.name!r} has unreadable field names") from None
    if len(fields) != n_fields or not all(isinstance(f, str) for f in fields):
        raise ValueError(f"ring {seg.name!r} field names do not match its layout")
    return capacity, n_fields, data_offset, fields


@dataclass(frozen=True)
class ReadResult:
    """Records accepted by one ``Ring.read`` call, oldest first."""

    values: npt.NDArray[np.float64]
    """(n, n_fields) record values."""
    timestamps_ns: npt.NDArray[np.int64]
    """(n,) writer timestamps, ns (``time.monotonic_ns`` unless the writer chose)."""
    indices: npt.NDArray[np.int64]
    """(n,) record numbers: the k-th record ever written is number k."""
    cursor: int
    """Pass to the next ``read``: every record before it was accepted or lost."""
    lost: int
    """Records overwritten (or torn) before this reader could copy them."""

    def __len__(self) -> int:
        return len(self.indices)


class Rows(NamedTuple):
    """Records accepted by one ``Ring.read_rows`` call, as Python values, oldest first."""

    values: list[tuple[float, ...]]
    timestamps_ns: list[int]
    indices: list[int]
    cursor: int
    lost: int


Record = tuple[int, tuple[float, ...], int]
"""One record as ``Ring.read_committed`` returns it: (record number, values, timestamp_ns)."""


class Ring:
    """A ring in a named shared-memory segment; use ``create`` or ``attach``."""

    def __init__(self, seg: segment.Segment, *, writer: bool, owner: bool) -> None:
        # The header is validated through struct, not numpy views, so a corrupt
        # segment raises before any view exists and the caller can unmap it.
        capacity, n_fields, data_offset, fields = _parse_header(seg)
        self._seg = seg
        self._writer = writer
        self._owner = owner
        self.name: str | None = seg.name
        """None for an anonymous ring."""
        self.fields: tuple[str, ...] = fields
        self.capacity: int = capacity
        stride = _SLOT_META + n_fields
        count = capacity * stride
        self._head = np.frombuffer(seg.buf, np.uint64, 1, _HEAD_WORD * 8)
        self._slots = np.frombuffer(seg.buf, np.uint64, count, data_offset).reshape(capacity, stride)
        self._fslots = np.frombuffer(seg.buf, np.float64, count, data_offset).reshape(capacity, stride)
        self._seq = self._slots[:, 0]
        self._weights = _weights(n_fields)
        self._seed = int(self._weights[0])
        self._weights_int = (0, 0, *(int(w) for w in self._weights[1:]))
        """Checksum multipliers aligned with a whole slot's words (seq and checksum weigh 0)."""
        self._verify = VERIFY_CHECKSUMS
        self._data_offset = data_offset
        self._slot_bytes = stride * 8
        self._unpack_words = struct.Struct(f"<{stride}Q").unpack
        self._unpack_values = struct.Struct(f"<{n_fields}d").unpack_from
        self._pack_record = struct.Struct(f"<Q{n_fields}d").pack
        """A slot's timestamp and values, as the writer stores them after seq and checksum."""
        self._unpack_record_words = struct.Struct(f"<{n_fields + 1}Q").unpack
        self._words = memoryview(seg.buf).cast("Q")
        """The segment as native words, as the numpy views see it: a store of one is one
        8-byte store, which a reader never sees half done (struct's ``<Q`` stores byte by byte)."""
        self._record_weights = self._weights_int[2:]
        self._next = self.head

    @classmethod
    def create(cls, fields: Sequence[str], capacity: int, name: str | None = None) -> Ring:
        """Create a ring (the owning, writing side) in a new named segment."""
        size, names = _layout(fields, capacity)
        return cls._init_owned(segment.Segment.create(size, name), fields, capacity, names)

    @classmethod
    def create_anonymous(cls, fields: Sequence[str], capacity: int) -> tuple[Ring, int]:
        """Create a ring in a segment with no name, and a descriptor the readers
        attach through (``from_fd``); the caller closes the descriptor."""
        size, names = _layout(fields, capacity)
        seg, fd = segment.Segment.create_anonymous(size)
        try:
            return cls._init_owned(seg, fields, capacity, names), fd
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _init_owned(cls, seg: segment.Segment, fields: Sequence[str], capacity: int, names: bytes) -> Ring:
        words = np.frombuffer(seg.buf, dtype=np.uint64, count=_HEADER_WORDS)
        words[1:6] = (_VERSION, capacity, len(fields), len(names), _pad(_NAMES_OFFSET + len(names)))
        seg.buf[_NAMES_OFFSET : _NAMES_OFFSET + len(names)] = names
        words[0] = _MAGIC  # last: an attach that sees the magic sees a whole header
        del words
        try:
            return cls(seg, writer=True, owner=True)
        except BaseException:
            seg.close()
            if seg.name is not None:
                segment.unlink(seg.name)
            raise

    @classmethod
    def attach(cls, name: str, writer: bool = False) -> Ring:
        """Attach to an existing ring by name; layout is read from the segment.

        At most one writer may exist at a time; a writer that attaches continues
        numbering after the records already committed.
        """
        return cls._attached(segment.Segment.attach(name), writer)

    @classmethod
    def from_fd(cls, fd: int, writer: bool = False) -> Ring:
        """Attach through a descriptor of the ring's segment (see ``create_anonymous``);
        the descriptor stays the caller's to close."""
        return cls._attached(segment.Segment.from_fd(fd), writer)

    @classmethod
    def _attached(cls, seg: segment.Segment, writer: bool) -> Ring:
        try:
            return cls(seg, writer=writer, owner=False)
        except BaseException:
            seg.close()
            raise

    @property
    def head(self) -> int:
        """Records committed so far."""
        return int(_U64.unpack_from(self._seg.buf, _HEAD_WORD * 8)[0])

    def write(self, values: Sequence[float] | npt.ArrayLike, timestamp_ns: int | None = None) -> int:
        """Append one record; returns its record number.

        A list or tuple is packed with struct, the checksum summed in Python: a writer that
        sleeps between records pays for numpy's per-call paths in cold caches each time."""
        if not self._writer:
            raise PermissionError(f"ring {self.name!r} is attached read-only")
        n_fields = len(self.fields)
        row: Sequence[float]
        if isinstance(values, list | tuple):
            row = values
        else:
            array = np.asarray(values, dtype=np.float64)
            if array.shape != (n_fields,):
                raise ValueError(f"expected {n_fields} values, got shape {array.shape}")
            row = array.tolist()
        if len(row) != n_fields:
            raise ValueError(f"expected {n_fields} values, got {len(row)}")
        ts = (time.monotonic_ns() if timestamp_ns is None else int(timestamp_ns)) & _MASK
        try:
            packed = self._pack_record(ts, *row)
        except struct.error as exc:
            raise ValueError(f"expected {n_fields} values, one of them is not a number ({exc})") from None
        index = self._next
        committed = 2 * index + 2
        buf, offset = self._seg.buf, self._data_offset + index % self.capacity * self._slot_bytes
        words = self._unpack_record_words(packed)
        checksum = (sum(map(operator.mul, words, self._record_weights)) + committed * self._seed) & _MASK
        words_out, seq_word = self._words, offset // 8
        words_out[seq_word] = committed - 1
        buf[offset + _TIMESTAMP_OFFSET : offset + self._slot_bytes] = packed
        words_out[seq_word + 1] = checksum
        words_out[seq_word] = committed
        words_out[_HEAD_WORD] = index + 1
        self._next = index + 1
        return index

    def _span(self, cursor: int) -> tuple[int, int]:
        """(first record still in the ring at or after ``cursor``, head)."""
        head = self.head
        if not 0 <= cursor <= head:
            raise ValueError(f"cursor {cursor} outside [0, {head}] for ring {self.name!r}")
        return max(cursor, head - self.capacity), head

    def read(self, cursor: int) -> ReadResult:
        """Copy every record from ``cursor`` up to the writer's head.

        Records the writer overwrote before they could be copied are skipped
        and counted in ``lost``; the returned cursor is always the head seen.
        """
        start, head = self._span(cursor)
        if head - start <= _FEW:
            rows = self._read_few(cursor, start, head)
            return ReadResult(
                values=np.array(rows.values, dtype=np.float64).reshape(len(rows.indices), len(self.fields)),
                timestamps_ns=np.array(rows.timestamps_ns, dtype=np.int64),
                indices=np.array(rows.indices, dtype=np.int64),
                cursor=rows.cursor,
                lost=rows.lost,
            )
        return self._read_many(cursor, start, head)

    def read_rows(self, cursor: int) -> Rows:
        """``read`` with plain Python values instead of arrays: cheaper for a
        reader that consumes a record or two per wake-up."""
        start, head = self._span(cursor)
        if head - start <= _FEW:
            return self._read_few(cursor, start, head)
        result = self._read_many(cursor, start, head)
        return Rows(
            values=[tuple(row) for row in result.values.tolist()],
            timestamps_ns=result.timestamps_ns.tolist(),
            indices=result.indices.tolist(),
            cursor=result.cursor,
            lost=result.lost,
        )

    def read_committed(self, cursor: int) -> tuple[list[Record], int, int]:
        """``read_rows`` for a reader that keeps up with the writer, as (records,
        cursor, lost), each record a ``Record``: from ``cursor`` on, slot by slot
        with the same seqlock and checksum checks, while each slot holds its record
        committed and intact, up to the first slot the writer has not begun. The
        header's head, a cache line the writer dirties at every record, is not
        read: a wake-up for one record touches that record's slot and the next
        slot's sequence (with no checksum to compute on x86, see
        ``VERIFY_CHECKSUMS``), and builds a list and a tuple. Anything else (a slot being
        written, torn or lapped, more than ``_FEW`` records) is left to
        ``read_rows`` from there, which counts what was lost. The cursor returned
        may pass the head of a writer that has committed a record but not yet
        advanced its head."""
        buf, seq_at, slot_bytes = self._seg.buf, _U64.unpack_from, self._slot_bytes
        records: list[Record] = []
        index = cursor
        while index - cursor < _FEW:
            offset = self._data_offset + index % self.capacity * slot_bytes
            committed = 2 * index + 2
            (before,) = seq_at(buf, offset)
            if before < committed - 1:  # an earlier lap's record, or none: ``index`` is still to come
                return records, index, 0
            if before != committed:
                break
            raw = buf[offset : offset + slot_bytes]
            (after,) = seq_at(buf, offset)
            if after != committed or (self._verify and not self._intact(raw, committed)):
                break
            (timestamp_ns,) = _I64.unpack_from(raw, _TIMESTAMP_OFFSET)
            records.append((index, self._unpack_values(raw, _SLOT_META * 8), timestamp_ns))
            index += 1
        if index > self.head:  # the writer committed what we took but has not yet advanced its head
            return records, index, 0
        rest = self.read_rows(index)
        records += zip(rest.indices, rest.values, rest.timestamps_ns, strict=True)
        return records, rest.cursor, rest.lost

    def _read_many(self, cursor: int, start: int, head: int) -> ReadResult:
        """The vectorised read: every check done on whole columns at once."""
        indices = np.arange(start, head, dtype=np.uint64)
        slots = (indices % np.uint64(self.capacity)).astype(np.intp)
        expected = indices * np.uint64(2) + np.uint64(2)
        seq_before = self._seq[slots]
        rows = self._slots[slots]
        seq_after = self._seq[slots]
        ok = (seq_before == expected) & (seq_after == expected)
        if self._verify:
            ok &= self._checksum(rows[:, 2:], expected) == rows[:, 1]
        rows = rows[ok]
        return ReadResult(
            values=rows[:, _SLOT_META:].view(np.float64),
            timestamps_ns=rows[:, 2].view(np.int64),
            indices=indices[ok].astype(np.int64),
            cursor=head,
            lost=(start - cursor) + int(len(ok) - np.count_nonzero(ok)),
        )

    def _read_few(self, cursor: int, start: int, head: int) -> Rows:
        """The read for a handful of records, slot by slot with struct: the same
        seqlock and checksum checks, without numpy's per-call overhead, which
        dominates what a reader woken for one record spends. A slot's words and
        values come from one copy of it (``raw``), taken between the two reads of
        its sequence."""
        buf, seq_at, slot_bytes = self._seg.buf, _U64.unpack_from, self._slot_bytes
        values: list[tuple[float, ...]] = []
        timestamps: list[int] = []
        indices: list[int] = []
        for index in range(start, head):
            offset = self._data_offset + index % self.capacity * slot_bytes
            committed = 2 * index + 2
            (before,) = seq_at(buf, offset)
            raw = buf[offset : offset + slot_bytes]
            (after,) = seq_at(buf, offset)
            if (
                before != committed
                or after != committed
                or (self._verify and not self._intact(raw, committed))
            ):
                continue
            indices.append(index)
            timestamps.append(_I64.unpack_from(raw, _TIMESTAMP_OFFSET)[0])
            values.append(self._unpack_values(raw, _SLOT_META * 8))
        return Rows(values, timestamps, indices, head, (head - cursor) - len(indices))

    def _intact(self, raw: bytes, committed: int) -> bool:
        """Whether a copied slot's checksum matches its words, seeded with its ``committed`` seq."""
        words = self._unpack_words(raw)
        return bool(
            (sum(map(operator.mul, words, self._weights_int)) + committed * self._seed) & _MASK == words[1]
        )

    def _checksum(self, words: npt.NDArray[np.uint64], seq: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """Per-row checksums of (n, 1 + n_fields) words; uint64 array arithmetic
        wraps modulo 2**64 silently, which is the point."""
        mixed = (words * self._weights[1:]).sum(axis=-1, dtype=np.uint64)
        return mixed + seq * self._weights[0]  # type: ignore[no-any-return]

    def close(self) -> None:
        """Unmap this side's view; the segment lives on while others map it."""
        if self._seg.buf.closed:
            return
        del self._head, self._slots, self._fslots, self._seq
        self._words.release()
        self._seg.close()

    def unlink(self) -> bool:
        """Remove the segment's name so nothing can attach or leak it; mappings
        stay. False if it had none left (or never had one: anonymous)."""
        return self.name is not None and segment.unlink(self.name)

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if self._owner:
            self.unlink()

    def __repr__(self) -> str:
        return f"Ring(name={self.name!r}, fields={len(self.fields)}, capacity={self.capacity})"
