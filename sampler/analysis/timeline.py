"""A run's logged resource records as arrays: one row per record, one column per signal.

Every point of one record shares its step and its wall time (the store writes them together),
so a record is the set of resource points with one (wall time, step). Older runs without
``resource/progress/steps_per_second`` read the same: throughput comes from the records' steps
and times, not from that signal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sampler.store.reader import Run, StoreReader

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Timeline:
    """The records of one run, in time order."""

    steps: npt.NDArray[np.int64]
    """The step each record was logged at."""
    walls: Floats
    """When each was sampled, s since the epoch."""
    values: dict[str, Floats]
    """Signal name -> its value at each record; NaN where that record has none."""
    interval: float
    """The run's sampling interval, s."""

    def __len__(self) -> int:
        return len(self.steps)

    def window_steps(self) -> Floats:
        """Steps made in the window that ends at each record (NaN for the first)."""
        return np.concatenate(([np.nan], np.diff(self.steps).astype(np.float64)))

    def window_seconds(self) -> Floats:
        """Length of the window that ends at each record, s (NaN for the first)."""
        return np.concatenate(([np.nan], np.diff(self.walls)))

    def throughput(self) -> Floats:
        """Steps per second over the window that ends at each record (NaN for the first)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.window_steps() / self.window_seconds()

    def column(self, name: str) -> Floats | None:
        """``name``'s values per record, None when the run never logged it."""
        return self.values.get(name)


def load(reader: StoreReader, run: Run, names: Iterable[str] | None = None) -> Timeline:
    """The timeline of ``run`` as its store holds it now (``StoreReader.records``; ``names``:
    only these signals' values, every record all the same)."""
    records = reader.records(run.id, names)
    return Timeline(records.steps, records.walls, records.values, run.interval)


def joined(parts: list[Timeline], interval: float) -> Timeline:
    """The records of ``parts`` (several runs') one after the other, as one timeline whose
    columns are every part's signals, NaN in the records of a part that did not log one: for
    judging one run's records against another's (``evidence.against``), not for throughput."""
    names = sorted({name for part in parts for name in part.values})
    values = {
        name: np.concatenate([part.values.get(name, np.full(len(part), np.nan)) for part in parts])
        for name in names
    }
    steps = np.concatenate([part.steps for part in parts])
    walls = np.concatenate([part.walls for part in parts])
    return Timeline(steps, walls, values, interval)
