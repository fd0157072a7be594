"""What the sampling child is doing right now, in a small shared-memory block.

The child writes the first four words, the backend reads them. The backend uses it to attribute a crash
to the collector that was running, to notice a call that overruns its
deadline, to report the child's own CPU cost per sample, and to tell a clean
exit from a crash without trusting the exit status (which reads as 0 when the
backend ignores SIGCHLD). It is created by the backend before the child starts
and handed over as a descriptor, so even a child that dies while NVML
initialises leaves its last phase behind, and no other process can find it.

Words (int64, native order), each written with one aligned 8-byte store through
a numpy view (words 4 and 5, written per logged record, through a memoryview)
and read with one aligned 8-byte load (``struct``'s native ``q`` copies each
word with one 8-byte ``memcpy``; its standard ``<q`` assembles bytes one at a
time, and ``pack_into`` zeroes the target before writing), so no reader ever
sees a half-written or transiently zeroed word:

0. phase and since, packed into one word so a reader always sees a matching
   pair: ``since_us << 8 | (phase + _PHASE_BIAS)``, where since is
   ``time.monotonic`` (comparable across processes) in microseconds;
1. samples written;
2. CPU ns spent sampling;
3. the exit status the child declared before leaving, ``EXIT_UNDECLARED`` until then.

The backend writes the last two, the child reads them:

4. the step the backend last logged a record at, ``NOT_LOGGED`` before the first;
5. how many records the backend has handled up to and including the last one
   it logged (that record's number + 1; 0 before the first). The child carries
   peaks over every record after it, so a record the backend drops (the step
   stood still) hands its peak on to the next one logged. Written after word 4,
   so a reader that sees the count also sees at least that step.

The child writes:

6. its metrics endpoint: 0 while it has none, the port it serves on, or
   ``-errno`` when binding failed, or one of the ``ENDPOINT_*`` failures.

The backend writes the monitor's health, which outlives any one child, for
the child to export: once before the child starts, and as records are lost:

7. to 9. child restarts so far, by cause (``RESTART_CAUSES`` order);
10. records lost;
11. the quarantined categories, bit k for ``DEFAULT_CATEGORIES[k]``.

The child writes:

12. readings that failed because the child ran out of descriptors or memory
    (``EMFILE``, ``ENFILE``, ``ENOMEM``), so far;
13. GPU devices whose readings an NVML error has stopped, now;
14. those it last said had stopped: bit k for the k-th of ``Sources.gpus_read`` followed
    by the child's other devices (``sampler.collectors.gpu_errors``), for the next child;
15. times a GPU device's readings stopped in this child.

The backend writes, with the health:

16. times a GPU device's readings stopped in earlier children.

The backend writes, per logged record while ``watch_model`` times steps, for the child to export:

17. a sequence number, odd while the backend writes the words after it (a seqlock: a step
    count from one update beside seconds from another would make a wrong time per step);
18. steps timed so far;
19. to 23. nanoseconds spent so far in each phase of those steps (``catalogue.STEP_PHASES``
    order).

The backend writes, per batch of records it reads, for the child to read before it asks the
backend for its stacks (``sampler.child.capture``):

24. 1 once another handler has taken the stack dump's signal (``sampler.supervision.stacks``), 0
    while the dump handler is the monitor's own.

A reader of words 18 to 23 reads the sequence number before and after them and keeps the read
only where both are the same even number; it tries ``PHASE_READ_TRIES`` times, then returns the
last whole copy it read (a backend killed halfway through an update leaves the number odd).

The child writes, after the words:

- ``CALL_BYTES`` bytes: the NVML call under way (``<function> on GPU <label>``, ASCII, up to a NUL;
  empty between calls). Not written atomically: the backend reads it once the child is dead, to
  name the call a hung child was killed in.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ringbuf import segment
from sampler.catalogue import STEP_PHASES
from sampler.settings import DEFAULT_CATEGORIES

PHASE_STARTING = -2
"""Interpreter start-up and imports, before any collector is built."""
PHASE_IDLE = -1
"""Between samples."""
# phase k >= 0: building or sampling the collector of DEFAULT_CATEGORIES[k]

EXIT_CLEAN = 0
"""The child left because it was asked to, or because the backend is gone."""
EXIT_NO_SHARED_MEMORY = 3
"""The child cannot create its ring (no memory for it): the backend then stops
retrying and samples in-thread."""
EXIT_STARVED = 4
"""Every reading of a record failed for want of descriptors or memory: the child
leaves so that a fresh one, with nothing leaked, takes over."""
EXIT_UNDECLARED = -1
"""The child has not declared an exit: if it is gone, something killed it."""
NOT_LOGGED = -1
"""The logged step before the backend has logged any record."""
ENDPOINT_NONE = 0
ENDPOINT_UNAVAILABLE = -(1 << 20)
"""The endpoint could not start for a reason other than its socket's."""
ENDPOINT_BAD_ADDRESS = ENDPOINT_UNAVAILABLE - 1
"""The address to bind does not resolve."""
ENDPOINT_NO_CLIENT = ENDPOINT_UNAVAILABLE - 2
"""``prometheus_client`` cannot be imported in the child."""
RESTART_CAUSES: tuple[str, ...] = ("crash", "hang", "start")

PHASE_READ_TRIES = 1000
"""Reads of the phase totals before a reader keeps its last whole copy: an update takes the
backend a few microseconds, unless its thread loses the CPU in the middle."""
_MAX_WORD = 2**63
_PHASE_BIAS = 16
_SEQUENCE_AT = 17
_PHASES_AT = _SEQUENCE_AT + 1
_HANDLER_AT = _PHASES_AT + 1 + len(STEP_PHASES)
_WORDS = _HANDLER_AT + 1
_CHILD_WORDS = 4
CALL_BYTES = 64
_CALL_AT = _WORDS * 8
_SIZE = _CALL_AT + CALL_BYTES
_READ = struct.Struct(f"@{_CHILD_WORDS}q")
_LOGGED = struct.Struct("@2q")
_HEALTH = struct.Struct("@5q")
_WORD = struct.Struct("@q")
_GPUS = struct.Struct("@3q")
_PHASES = struct.Struct(f"@{1 + len(STEP_PHASES)}q")
"""The reader's side: numpy would be cheaper to write with, but the backend reads
once per wake-up, cache-cold, and struct touches far less code than numpy."""


def phase_of(category: str) -> int:
    return DEFAULT_CATEGORIES.index(category)


def category_of(phase: int) -> str | None:
    """The category a phase belongs to, None for start-up and idle."""
    return DEFAULT_CATEGORIES[phase] if 0 <= phase < len(DEFAULT_CATEGORIES) else None


def _fitting(value: float, last: int) -> int:
    """``value`` rounded where a word holds it as a count (0 to 2**63 - 1), else ``last``."""
    return round(value) if 0 <= value < _MAX_WORD else last


def _pack(phase: int, since_ns: int) -> int:
    return (since_ns // 1000) << 8 | (phase + _PHASE_BIAS)


class Snapshot(NamedTuple):
    """One read of the status block (a NamedTuple: the reader makes one per wake-up)."""

    phase: int
    since_ns: int
    """When the phase began, ``time.monotonic_ns`` to the microsecond."""
    samples: int
    sample_cpu_ns: int
    exit_declared: int

    @property
    def cpu_seconds_per_sample(self) -> float | None:
        return self.sample_cpu_ns / 1e9 / self.samples if self.samples else None


class Health(NamedTuple):
    """The monitor's health as the backend last published it."""

    restarts: dict[str, int]
    """Children restarted so far, by cause."""
    records_lost: int
    quarantined: tuple[str, ...]
    gpu_errors: int = 0
    """Times a GPU device's readings stopped in earlier children."""


class ChildStatus:
    """The status block; ``create`` on the backend side, ``from_fd`` in the child."""

    def __init__(self, seg: segment.Segment) -> None:
        self._seg = seg
        self._words = np.frombuffer(seg.buf, np.int64, _WORDS)
        self._logged = memoryview(seg.buf)[32:48].cast("q")
        """Words 4 and 5 as a plain memoryview: the backend writes them per logged record,
        cache-cold, and a memoryview store runs far less code than a numpy one."""
        self._child_words = memoryview(seg.buf)[0:24].cast("q")
        self._phases = memoryview(seg.buf)[_SEQUENCE_AT * 8 : _HANDLER_AT * 8].cast("q")
        """Words 17 to 23 the same way: the backend writes them per logged record."""
        self._last_phases: tuple[int, tuple[float, ...]] = (0, (0.0,) * len(STEP_PHASES))
        """The reader's last whole copy of the phase totals."""
        self._call = memoryview(seg.buf)[_CALL_AT:_SIZE]
        """Words 0 to 2 (phase, samples, CPU) the same way: the child marks a phase several
        times per reading."""

    @classmethod
    def create(cls) -> tuple[ChildStatus, int]:
        """A new block and the descriptor to hand the child (the caller closes it)."""
        seg, fd = segment.Segment.create_anonymous(_SIZE)
        status = cls(seg)
        status._words[1:6] = (0, 0, EXIT_UNDECLARED, NOT_LOGGED, 0)
        status._words[0] = _pack(PHASE_STARTING, time.monotonic_ns())
        return status, fd

    @classmethod
    def from_fd(cls, fd: int) -> ChildStatus:
        return cls(segment.Segment.from_fd(fd))

    def enter(self, phase: int) -> None:
        """Mark the start of ``phase`` now."""
        self._child_words[0] = _pack(phase, time.monotonic_ns())

    def note_call(self, where: bytes) -> None:
        """Child side: the NVML call under way, ``where`` ending with a NUL (b"\\0": none), cut
        to ``CALL_BYTES``."""
        if len(where) > CALL_BYTES:
            where = where[: CALL_BYTES - 1] + b"\0"
        self._call[: len(where)] = where

    def call(self) -> str | None:
        """Backend side, once the child is dead: the NVML call it was in, None if none."""
        where = bytes(self._call).partition(b"\0")[0].decode("ascii", "replace")
        return where or None

    def count_sample(self, cpu_ns: int) -> None:
        """One more sample written, which cost the child ``cpu_ns`` of CPU time."""
        words = self._child_words
        words[2] += cpu_ns
        words[1] += 1

    def declare_exit(self, code: int) -> None:
        """Record the status the child is about to exit with."""
        self._words[3] = code

    def publish_logged(self, record: int, step: int) -> None:
        """Backend side: record number ``record`` was logged at ``step``."""
        logged = self._logged
        logged[0] = step
        logged[1] = record + 1

    def logged(self) -> tuple[int, int]:
        """Child side: (records handled through the last one logged, its step)."""
        step, through = _LOGGED.unpack_from(self._seg.buf, 32)
        return through, step

    def set_endpoint(self, state: int) -> None:
        """Child side: the endpoint's port, or ``-errno`` / ``ENDPOINT_UNAVAILABLE``."""
        self._words[6] = state

    def endpoint(self) -> int:
        """Backend side: the endpoint word (``ENDPOINT_NONE`` until the child set it)."""
        return int(self._words[6])

    def publish_health(
        self, restarts: dict[str, int], records_lost: int, quarantined: list[str], gpu_errors: int = 0
    ) -> None:
        """Backend side: the monitor's health, for the child's metrics."""
        mask = sum(1 << DEFAULT_CATEGORIES.index(name) for name in quarantined)
        self._words[7:12] = (*(restarts.get(cause, 0) for cause in RESTART_CAUSES), records_lost, mask)
        self._words[16] = gpu_errors

    def publish_lost(self, records_lost: int) -> None:
        """Backend side: the records lost so far."""
        self._words[10] = records_lost

    def count_starved(self, readings: int) -> None:
        """Child side: ``readings`` more failed for want of descriptors or memory."""
        self._words[12] += readings

    def starved(self) -> int:
        """Backend side: readings the child has lost to starvation so far (one load)."""
        (count,) = _WORD.unpack_from(self._seg.buf, 96)
        return int(count)

    def set_gpus(self, not_reading: int, mask: int, stops: int) -> None:
        """Child side: its GPU devices not reading now, those it said had stopped (a mask), and
        the stops counted."""
        self._words[13:16] = (not_reading, mask, stops)

    def gpus(self) -> tuple[int, int, int]:
        """Either side: (GPU devices not reading, said to have stopped, stops in this child)."""
        not_reading, mask, stops = _GPUS.unpack_from(self._seg.buf, 104)
        return int(not_reading), int(mask), int(stops)

    def health(self) -> Health:
        """Child side: the monitor's health as last published."""
        crash, hang, start, lost, mask = _HEALTH.unpack_from(self._seg.buf, 56)
        (gpu_errors,) = _WORD.unpack_from(self._seg.buf, 128)
        quarantined = tuple(name for k, name in enumerate(DEFAULT_CATEGORIES) if mask >> k & 1)
        restarts = dict(zip(RESTART_CAUSES, (crash, hang, start), strict=True))
        return Health(restarts, lost, quarantined, gpu_errors)

    def publish_phases(self, steps: int, seconds: Sequence[float]) -> None:
        """Backend side: ``steps`` timed so far, and the seconds spent so far in each phase of
        them (``catalogue.STEP_PHASES`` order). A value that is not a number from 0 up to what
        a word holds (NaN, inf, negative, past 2**63 ns) leaves its word as it was: it comes
        from a clock oddity upstream, and this runs on the monitor thread."""
        words = self._phases
        values = [_fitting(steps, words[1])]
        slots = range(2, len(words))  # a phase past STEP_PHASES has no word: dropped, not raised
        values += [_fitting(spent * 1e9, words[k]) for k, spent in zip(slots, seconds, strict=False)]
        sequence = words[0]
        words[0] = sequence + 1  # odd: readers retry until the words below are whole again
        for k, value in enumerate(values, 1):
            words[k] = value
        words[0] = sequence + 2

    def phases(self) -> tuple[int, tuple[float, ...]]:
        """Child side: (steps timed so far, seconds so far per phase in ``STEP_PHASES`` order)
        from one update; (0, zeros) while none were published, and the last whole copy read
        while an update stays under way past ``PHASE_READ_TRIES`` reads."""
        buf = self._seg.buf
        for _ in range(PHASE_READ_TRIES):
            (before,) = _WORD.unpack_from(buf, _SEQUENCE_AT * 8)
            if before & 1:
                continue
            steps, *spent = _PHASES.unpack_from(buf, _PHASES_AT * 8)
            (after,) = _WORD.unpack_from(buf, _SEQUENCE_AT * 8)
            if after == before:
                self._last_phases = (steps, tuple(ns / 1e9 for ns in spent))
                break
        return self._last_phases

    def publish_handler_replaced(self, replaced: bool) -> None:
        """Backend side: whether another handler has taken the stack dump's signal."""
        self._words[_HANDLER_AT] = int(replaced)

    def handler_replaced(self) -> bool:
        """Child side: whether the backend said another handler has taken the dump's signal."""
        (word,) = _WORD.unpack_from(self._seg.buf, _HANDLER_AT * 8)
        return bool(word)

    def read(self) -> Snapshot:
        packed, samples, cpu_ns, exit_declared = _READ.unpack_from(self._seg.buf, 0)
        return Snapshot((packed & 0xFF) - _PHASE_BIAS, (packed >> 8) * 1000, samples, cpu_ns, exit_declared)

    def close(self) -> None:
        if not self._seg.buf.closed:
            del self._words
            self._logged.release()
            self._child_words.release()
            self._phases.release()
            self._call.release()
            self._seg.close()
