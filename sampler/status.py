"""What the sampling child is doing right now, in a small shared-memory block.

The child writes, the backend reads. The backend uses it to attribute a crash
to the collector that was running, to notice a call that overruns its
deadline, and to report the child's own CPU cost per sample. It is created by
the backend before the child starts, so even a child that dies while NVML
initialises leaves its last phase behind.

Words (int64): phase, since_ns (``time.monotonic_ns`` when the phase began,
comparable across processes), samples written, CPU ns spent sampling.
"""

from __future__ import annotations

import struct
import time
from typing import NamedTuple

from ringbuf import segment
from sampler.config import DEFAULT_CATEGORIES

PHASE_STARTING = -2
"""Interpreter start-up and imports, before any collector is built."""
PHASE_IDLE = -1
"""Between samples."""
# phase k >= 0: building or sampling the collector of DEFAULT_CATEGORIES[k]

EXIT_NO_SHARED_MEMORY = 3
"""The child's exit status when it cannot create its ring (e.g. ``/dev/shm``
full): the backend then stops retrying and samples in-thread."""

_WORDS = struct.Struct("<4q")
_SIZE = 64


def phase_of(category: str) -> int:
    return DEFAULT_CATEGORIES.index(category)


def category_of(phase: int) -> str | None:
    """The category a phase belongs to, None for start-up and idle."""
    return DEFAULT_CATEGORIES[phase] if 0 <= phase < len(DEFAULT_CATEGORIES) else None


class Snapshot(NamedTuple):
    """One read of the status block (a NamedTuple: the reader makes one per wake-up)."""

    phase: int
    since_ns: int
    samples: int
    sample_cpu_ns: int

    @property
    def cpu_seconds_per_sample(self) -> float | None:
        return self.sample_cpu_ns / 1e9 / self.samples if self.samples else None


class ChildStatus:
    """The status block; ``create`` on the backend side, ``attach`` in the child."""

    def __init__(self, seg: segment.Segment) -> None:
        self._seg = seg
        self.name = seg.name

    @classmethod
    def create(cls) -> ChildStatus:
        status = cls(segment.Segment.create(_SIZE))
        _WORDS.pack_into(status._seg.buf, 0, PHASE_STARTING, time.monotonic_ns(), 0, 0)
        return status

    @classmethod
    def attach(cls, name: str) -> ChildStatus:
        return cls(segment.Segment.attach(name))

    def enter(self, phase: int) -> None:
        """Mark the start of ``phase`` now (since first: a reader that sees the
        new phase sees a since no older than it)."""
        struct.pack_into("<q", self._seg.buf, 8, time.monotonic_ns())
        struct.pack_into("<q", self._seg.buf, 0, phase)

    def count_sample(self, cpu_ns: int) -> None:
        """One more sample written, which cost the child ``cpu_ns`` of CPU time."""
        _, _, samples, total = _WORDS.unpack_from(self._seg.buf, 0)
        struct.pack_into("<2q", self._seg.buf, 16, samples + 1, total + cpu_ns)

    def read(self) -> Snapshot:
        return Snapshot._make(_WORDS.unpack_from(self._seg.buf, 0))

    def close(self) -> None:
        self._seg.close()

    def unlink(self) -> bool:
        return segment.unlink(self.name)
