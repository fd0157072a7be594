"""What every collector is: a category, fixed signal names, one reading per name."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar, TypeVar

MB = 1024**2
"""Bytes per MB (MiB), the unit of every ``*_mb`` signal."""
GB = 1024**3
"""Bytes per GB (GiB), the unit of every ``*_gb`` signal."""
MISSING = math.nan
"""A reading that failed: skipped for this sample, never logged."""

T = TypeVar("T")


def attempt(read: Callable[[], T]) -> T | None:
    """One reading, or None if it raised (the reading is skipped, not faked)."""
    try:
        return read()
    except Exception:
        return None


class Collector:
    """Reads one category. ``sample()`` returns one float per name in ``names``,
    ``MISSING`` (NaN) where a reading failed."""

    category: ClassVar[str]
    names: tuple[str, ...]

    def sample(self) -> list[float]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the collector holds (NVML handles); idempotent."""
