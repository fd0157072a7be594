"""Counters the monitor thread keeps and ``ResourceMonitor.stats()`` reports."""

from __future__ import annotations

import signal
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sampler.ipc.status import EXIT_STARVED

if TYPE_CHECKING:
    from sampler.store.writer import RunWriter

MAX_DEATHS_KEPT = 20
SLOW_SINK_SECONDS = 1.0
"""A sink call running longer than this shows in ``stats()['waiting_for']``."""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class Death:
    """One sampling child that died or was killed."""

    cause: str
    """"crash" (it died), "hang" (killed past a deadline) or "start" (died before sampling)."""
    category: str | None
    """The collector it was in, None if it was between samples or starting up."""
    exit_code: int | None
    """Exit status; negative: the signal that ended it; None: unknown (the
    backend ignores SIGCHLD, or something else reaped the child)."""
    lifetime_seconds: float
    killed: bool = True
    """It left without declaring an exit status in its status block: a signal
    (SIGKILL, SIGSEGV, ...) ended it, whatever the exit status says."""
    call: str | None = None
    """The NVML call it was in, with the device asked (``nvmlDeviceGetPowerUsage on GPU 1``),
    None if it was in none."""

    def describe_exit(self) -> str:
        if self.exit_code is not None and self.exit_code < 0:
            return f"killed by {_signal_name(-self.exit_code)}"
        if self.exit_code == EXIT_STARVED and not self.killed:
            return "every reading failed: the child ran out of file descriptors or memory"
        if self.exit_code is not None:
            return f"exit status {self.exit_code}"
        if self.killed:
            return "killed by a signal; exit status unknown: SIGCHLD is ignored in this process"
        return "exit status unknown"


@dataclass
class CallbackTime:
    """The time one callback (the sink, a signal subscriber, the ``on_sample`` hook)
    took in the monitor thread, s."""

    records: int = 0
    """Samples it was called for."""
    seconds_total: float = 0.0
    seconds_last: float = 0.0
    """In the latest of them (all its calls for that sample: one per signal for a sink)."""
    seconds_max: float = 0.0
    """In the slowest of them."""

    def add(self, seconds: float) -> None:
        """Count one sample's calls, ``seconds`` in all."""
        self.records += 1
        self.seconds_total += seconds
        self.seconds_last = seconds
        self.seconds_max = max(self.seconds_max, seconds)


@dataclass
class MonitorStats:
    """Written by the monitor thread only; read as a snapshot from any thread."""

    isolation: str = "process"
    """Where collectors run now: "process" (the child) or "thread" (fallback or chosen)."""
    records_read: int = 0
    """Samples taken from the ring (or, in-thread, taken at all)."""
    records_logged: int = 0
    """Samples whose signals went to the sink."""
    records_dropped: int = 0
    """Samples not logged because their step equals the last logged step."""
    records_lost: int = 0
    """Samples overwritten in the ring before the reader got to them (a slow sink)."""
    records_unsent_at_stop: int = 0
    """Samples read after ``stop()`` was called, or during the sink's calls for them: stored,
    but not (or not wholly) handed to the sink and hooks, which are called no more then."""
    signals_logged: int = 0
    """Readings handed to the sink (``sink_errors`` counts the calls that raised)."""
    sink_errors: int = 0
    callbacks: dict[str, CallbackTime] = field(default_factory=dict)
    """The time each callback took, by its qualified name. Replaced, never resized, by
    the monitor thread: ``snapshot()`` may copy it from another thread meanwhile."""
    readings_starved: int = 0
    """Readings the child skipped because it ran out of file descriptors or memory
    (``EMFILE``, ``ENFILE``, ``ENOMEM``): the monitor's trouble, not the machine's."""
    gpus_not_reading: int = 0
    """GPU devices whose readings an NVML error has stopped, now (each said once, with the error)."""
    gpu_errors: int = 0
    """Times an NVML error stopped a GPU device's readings (a flapping device counts each stop)."""
    restarts: int = 0
    restarts_by_cause: dict[str, int] = field(default_factory=lambda: {"crash": 0, "hang": 0, "start": 0})
    deaths: list[Death] = field(default_factory=list)
    """The latest ``MAX_DEATHS_KEPT`` children that died, oldest first."""
    quarantined: list[str] = field(default_factory=list)
    """Categories left out after bringing sampling children down ``QUARANTINE_AFTER`` times."""
    gpus_quarantined: list[str] = field(default_factory=list)
    """GPU devices left out the same way, by label: a call on them brought the children down."""
    child_exit_code: int | None = None
    """Exit status of the latest child that ended (0: it left when asked)."""
    child_cpu_seconds_per_sample: float | None = None
    """CPU the current child spent per sample (collectors plus ring write), s."""
    waiting_for: str | None = None
    """What the monitor has been waiting for since its child started without a
    record arriving (set when the monitor warns about it), else None."""
    error: str | None = None
    """The error that stopped the monitor thread, if one did."""
    store_path: str | None = None
    """The run store this monitor writes, if any."""
    store_points_written: int = 0
    store_points_dropped: int = 0
    """Points the store could not take for so long that the queue's bound dropped them."""
    store_error: str | None = None
    """Why the store cannot be written right now; None when it can."""
    prometheus_endpoint: str | None = None
    """The URL the latest child served metrics at (also while it is being restarted), None when
    it could not serve."""
    prometheus_error: str | None = None
    """Why no endpoint serves (or cannot be found), when one was asked for."""
    last_record_monotonic: float | None = None
    in_sink_since: float | None = None
    """``time.monotonic()`` when the current record's sink calls began, else None."""

    def note_store(self, writer: RunWriter) -> None:
        """Take the run store's counters from its writer."""
        self.store_points_written = writer.points_written
        self.store_points_dropped = writer.points_dropped
        self.store_error = writer.error

    def record_death(self, death: Death) -> None:
        self.deaths = [*self.deaths, death][-MAX_DEATHS_KEPT:]

    def snapshot(self) -> dict[str, Any]:
        out = asdict(self)
        last = out.pop("last_record_monotonic")
        out["seconds_since_last_record"] = None if last is None else time.monotonic() - last
        in_sink = out.pop("in_sink_since")
        if in_sink is not None and time.monotonic() - in_sink > SLOW_SINK_SECONDS:
            out["waiting_for"] = f"the sink to return (called {time.monotonic() - in_sink:.0f} s ago)"
        return out
