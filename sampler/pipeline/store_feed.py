"""The run store's side of the pipeline: each record written before the sink gets it, and the
reader's waits ended for the queue the pipeline fills in between."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from sampler.pipeline.stats import MonitorStats
from sampler.store.writer import FLUSH_SECONDS, RunWriter
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

SAMPLE_SLACK_SECONDS = 0.25
"""A sample expected no later than this after the run store's queue is due writes the
queue instead (one wake-up, not two); should it be late, the wait for it ends this
long after it was expected."""


class StoreFeed:
    """Hands records to the run store (``recorder``); a store that raises is turned off."""

    def __init__(self, recorder: RunWriter | None, stats: MonitorStats) -> None:
        self.recorder = recorder
        """The store while it is on."""
        self._writer = recorder
        """The store's writer, kept for its ``wake_fd`` should the store be turned off."""
        self.wake_fd = recorder.wake_fd if recorder is not None else None
        """Readable once the pipeline logs into an empty queue: waits select on it too."""
        self.stats = stats
        self._health: tuple[object, ...] = ()

    def due(self, next_sample: float | None) -> float | None:
        """When (monotonic s) a wait must end to write the run store's queue; None: no
        store, or nothing queued (a point logged then makes ``wake_fd`` readable).
        A sample expected at ``next_sample`` (monotonic s) writes the queue itself if it
        comes about when the queue is due, or before: the wait then ends for it (or,
        should it be late, ``SAMPLE_SLACK_SECONDS`` after it), and a sample that soon
        also makes a wake-up for the first point logged needless."""
        recorder = self.recorder
        if recorder is None:
            return None
        now = time.monotonic()
        by_sample = None if next_sample is None else next_sample + SAMPLE_SLACK_SECONDS
        if by_sample is not None and not now < by_sample <= now + FLUSH_SECONDS + SAMPLE_SLACK_SECONDS:
            by_sample = None  # late (it is overdue: wait no more for it), or too far off
        due = recorder.next_flush(wake=by_sample is None)
        if by_sample is not None and (due is None or by_sample <= due + 2 * SAMPLE_SLACK_SECONDS):
            return by_sample
        return due

    def serve(self, ready: Collection[int], due: float | None) -> None:
        """After a wait: take a wake-up from ``wake_fd`` (in ``ready``), and write the run
        store's queue if ``due`` (from ``due()`` before the wait) has come."""
        if self._writer is not None and self.wake_fd in ready:
            self._writer.woken()
        recorder = self.recorder
        if recorder is not None and due is not None and time.monotonic() >= due:
            self._store(recorder, recorder.flush)

    def record(self, values: dict[str, float] | None, step: int, timestamp_ns: int) -> None:
        """Hand the sample to the run store, with the monitor's stats when they changed."""
        recorder, stats = self.recorder, self.stats
        if recorder is None:
            return
        health = (stats.restarts, stats.records_lost, stats.quarantined, stats.error, stats.waiting_for)
        changed = health != self._health
        if self._store(
            recorder,
            lambda: recorder.record(values, step, timestamp_ns, stats.snapshot() if changed else None),
        ):
            self._health = health

    def _store(self, recorder: RunWriter, write: Callable[[], None]) -> bool:
        """Run ``write`` on the run store; False, and the store off from here on, if it raised."""
        try:
            write()
        except Exception as exc:  # a bug in the store must not stop the monitoring
            self.recorder = None
            why = bounded_repr(exc)
            self.stats.store_error = f"off after a failure: {why}"
            log.error(
                "resource monitor: the run store failed (%s); it is off from here on", why, exc_info=True
            )
            return False
        self.stats.note_store(recorder)
        return True
