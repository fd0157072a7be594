"""``ResourceMonitor`` and the process-wide monitor a backend starts from config.

Forks. Training backends fork all the time (DataLoader workers,
``multiprocessing`` with the fork method, user code). A forked copy inherits
the monitor's objects, its ``atexit`` hook and copies of its descriptors, but
not its thread. Everything here is owned by the process that started it: in a
forked copy an inherited monitor is inert (``stop()`` is a no-op, ``running``
is False, ``start()`` starts a fresh one for that process) and the singleton is
forgotten, so nothing a fork does or however it ends reaches the parent's
monitor. The ownership check is by pid, so it holds for forks made from C as
well; ``os.register_at_fork`` additionally gives the copy fresh locks, in case
it forked while another thread held one.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import psutil

from sampler import settings, signals
from sampler.collectors import Sources
from sampler.ipc.channel import PostmortemTarget
from sampler.pipeline.emit import Emitter, SampleHook, Sink
from sampler.pipeline.stats import MonitorStats
from sampler.pipeline.steps import AgeSource, StepStamper
from sampler.postmortems import reading as postmortems
from sampler.settings import placement
from sampler.settings.placement import HOST_WIDE_CATEGORIES, Placement
from sampler.settings.table import MonitorSettings
from sampler.store.writer import RunInfo, RunWriter
from sampler.supervision import exposition
from sampler.supervision.exposition import Exposition
from sampler.supervision.spawn import STOP_TIMEOUT_SECONDS
from sampler.supervision.supervisor import Plan, Supervisor
from sampler.util.clock import RunClock
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

RING_CAPACITY = 1024
"""Records the ring holds: 17 minutes at the 1 s floor before a stalled reader loses any."""
RESTART_BACKOFF_SECONDS = (1.0, 60.0)
"""Delay before restarting a dead child: the first, doubling up to the second."""
_JOIN_SLACK_SECONDS = 1.0
"""How long stop() waits for the thread after the child's time to leave (``STOP_TIMEOUT_SECONDS``,
in which the sinks still get the last record), with the sinks no longer called."""


class _Run:
    """One ``start()`` to ``stop()`` of a monitor: its thread, the supervisor
    the thread runs, the pipe that tells the thread to stop, and the run
    store's writer, which hears every signal of the pipeline meanwhile."""

    def __init__(self, writer: RunWriter | None) -> None:
        self.pid = os.getpid()
        self.writer = writer
        self.exposition: Exposition | None = None
        self._unsubscribe = signals.subscribe(writer.log) if writer is not None else None
        self.stop_r, stop_w = os.pipe()
        self._stop_w: int | None = stop_w
        self._claim = threading.Lock()
        self._pipe_lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.supervisor: Supervisor | None = None

    def claim(self) -> bool:
        """True for exactly one caller: the one that stops this run. Never
        blocks, so a signal handler that calls stop() during stop() returns."""
        return self._claim.acquire(blocking=False)

    def signal_stop(self) -> None:
        """Wake the thread for good: the byte is never read, so every later wait sees it."""
        with self._pipe_lock:
            if self._stop_w is not None:
                with contextlib.suppress(OSError):  # the thread has ended and closed its end
                    os.write(self._stop_w, b"x")

    def finish(self, stats: MonitorStats) -> None:
        """The thread's last act, however it ends: the discovery entry goes, the
        run store's last write and its wake-up pipe (``end_store``), then the stop pipe."""
        if self.exposition is not None:
            self.exposition.close()
        self.end_store(stats, close=True)
        self.close_pipe()

    def end_store(self, stats: MonitorStats, close: bool = False) -> None:
        """The run store's last write (all the pipeline queued, the final stats, the end
        time), made once: by the thread on its way out (``close``: which also releases the
        writer's pipe), or by stop() while the thread is busy in a call."""
        if self.writer is None or self._unsubscribe is None:
            return
        self._unsubscribe()
        final = {**stats.snapshot(), "running": False, "child_pid": None}
        try:
            (self.writer.close if close else self.writer.end)(final)
        except Exception as exc:
            log.error("resource monitor: the run store failed at stop (%s)", bounded_repr(exc), exc_info=True)
        stats.note_store(self.writer)

    def close_pipe(self) -> None:
        """Release both ends of the stop pipe."""
        with self._pipe_lock:
            for fd in (self.stop_r, self._stop_w):
                if fd is not None:
                    os.close(fd)
            self._stop_w = None


class ResourceMonitor:
    """Samples resources in a child process and logs them as ``resource/...`` signals.

    Every setting is a keyword argument named as in the YAML file (the keys of
    ``sampler.settings.API_FIELDS``: ``interval_seconds``, ``categories``,
    ``store``, ...). One passed wins; one not passed comes from the configuration
    (the YAML file, env vars, defaults), exactly as for
    ``start_resource_monitor_from_config()``. ``settings`` holds the result.

    ``interval_seconds`` is clamped to the 1 s floor and the one-day ceiling.
    ``categories`` is None (all), a list of names, or a mapping name -> bool.
    ``sink(name, value, step)`` defaults to ``sampler.signals.log_signal``;
    ``age_source()`` to the model given to ``watch_model``. ``on_sample(sample)``
    gets each logged ``sampler.Sample`` once, after the sink.
    ``isolation="process"`` (default) samples in a supervised child and falls
    back to ``"thread"`` (sampling in the monitor thread itself) when no child
    can run. A collector call that takes longer than ``hang_deadline_seconds``
    gets the child killed and restarted. The settings are read-only after
    construction. Use as a context manager or call ``start()``/``stop()``.

    Under a launcher (torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
    ``LOCAL_WORLD_SIZE``) only local rank 0 samples the host-wide categories
    and the GPUs no rank owns, unless ``host_sampling="every_rank"``; each rank
    samples its own process and GPU. ``launcher_env``, when given, is read for
    them (and the run id's) in place of ``os.environ``: a framework that starts its ranks
    without setting them all passes its own (the Lightning callback: the trainer's ranks).
    ``prometheus_port`` (plus the local rank)
    has the child serve ``/metrics`` at ``prometheus_address``, listed for
    Prometheus' file-based discovery in ``prometheus_sd_dir``.
    """

    def __init__(
        self,
        *,
        sink: Sink | None = None,
        age_source: AgeSource | None = None,
        on_sample: SampleHook | None = None,
        pid: int | None = None,
        launcher_env: Mapping[str, str] | None = None,
        _min_interval_seconds: float = settings.MIN_INTERVAL_SECONDS,
        _ring_capacity: int = RING_CAPACITY,
        _restart_backoff: tuple[float, float] = RESTART_BACKOFF_SECONDS,
        _resolved: tuple[MonitorSettings, Mapping[str, str]] | None = None,
        **options: Any,
    ) -> None:
        if _resolved is None:
            resolved, resolution = settings.resolve_settings(
                options, min_interval_seconds=_min_interval_seconds
            )
            _resolved = resolved, resolution.sources
        elif options:
            raise TypeError("ResourceMonitor(): settings come resolved or as arguments, not both")
        self._settings, self._sources = _resolved[0], dict(_resolved[1])
        for name, fn in (("sink", sink), ("age_source", age_source), ("on_sample", on_sample)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable or None, got {type(fn).__name__}")
        s = self._settings
        where = self._placement = placement.from_environment(launcher_env, run_id=s.run_id)
        categories = s.categories
        if not where.samples_host(s.host_sampling):
            categories = tuple(c for c in categories if c not in HOST_WIDE_CATEGORIES)
        shared = s.host_sampling == "local_rank_0" and where.local_world_size > 1
        self._plan = Plan(
            settings=s,
            categories=categories,
            sources=Sources(
                disk_path=s.disk_path,
                pid=os.getpid() if pid is None else _pid(pid),
                nvml_module=s.nvml_module,
                gpu_devices=s.gpu_devices,
                gpu_share=(where.local_rank, where.local_world_size) if shared else None,
            ),
            ring_capacity=_ring_capacity,
            backoff_base=_restart_backoff[0],
            backoff_cap=_restart_backoff[1],
        )
        self._prometheus_port = exposition.rank_port(s.prometheus_port, where)
        self._sink: Sink = signals.log_signal if sink is None else sink
        self._age_source = age_source
        self._on_sample = on_sample
        self._lock = threading.RLock()
        self._stats = MonitorStats()
        self._run: _Run | None = None
        _monitors.add(self)

    # The settings are read-only: a change after construction would bypass validation.

    @property
    def settings(self) -> MonitorSettings:
        """The settings this monitor was resolved with (arguments, then config), unchanged."""
        return self._settings

    def __getattr__(self, name: str) -> Any:
        """Each setting by its name (``interval_seconds``, ``store``, ...), from ``settings``."""
        if name in settings.table.BY_KEY:
            return getattr(self._settings, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: object) -> None:
        if name in settings.table.BY_KEY or isinstance(getattr(type(self), name, None), property):
            raise AttributeError(f"{name} is read-only: settings are validated once, at construction")
        super().__setattr__(name, value)

    @property
    def categories(self) -> tuple[str, ...]:
        """The categories this rank samples, in ``DEFAULT_CATEGORIES`` order: the
        enabled ones, less the host-wide ones on a rank that leaves them to local rank 0."""
        return self._plan.categories

    @property
    def placement(self) -> Placement:
        """This backend's host and rank, as the launcher's environment said at construction."""
        return self._placement

    @property
    def prometheus_port(self) -> int | None:
        """The port the child serves metrics on (the configured one plus the local rank), or None."""
        return self._prometheus_port

    @property
    def pid(self) -> int:
        """The process the ``process`` category describes."""
        return self._plan.sources.pid

    @property
    def sink(self) -> Sink:
        """Where each ``(name, value, step)`` goes."""
        return self._sink

    @property
    def age_source(self) -> AgeSource | None:
        """The model age callable; None: the model given to ``watch_model``."""
        return self._age_source

    @property
    def on_sample(self) -> SampleHook | None:
        """Called with each logged ``Sample``, or None."""
        return self._on_sample

    def _current(self) -> _Run | None:
        """This process's run, if any (a run inherited through a fork is not)."""
        run = self._run
        return run if run is not None and run.pid == os.getpid() else None

    @property
    def child_pid(self) -> int | None:
        """Pid of the sampling child while it runs, else None."""
        run = self._current()
        child = run.supervisor.child if run is not None and run.supervisor is not None else None
        return child.pid if child is not None and not child.exited else None

    @property
    def running(self) -> bool:
        run = self._current()
        return run is not None and run.thread is not None and run.thread.is_alive()

    def start(self) -> ResourceMonitor:
        """Start the monitor thread (which launches the child); returns at once,
        and is a no-op while running. The first sample follows within
        min(interval, 1 s) plus the child's start-up. A running monitor of
        the same process is stopped and replaced, with one warning, unless
        each has a run store or a Prometheus port of its own. Nothing here raises for
        an unusable platform: the monitor falls back to sampling in-thread."""
        with _start_lock:
            if self.running:
                return self
            self._replace_twins()
            return self._start()

    def _replace_twins(self) -> None:
        """Stop the running monitors of the same process that share this one's run store (or
        have none, like this one): a notebook cell run again builds a second monitor, and the
        handle to the first is gone. Monitors with stores of their own both run."""
        for twin in [m for m in list(_monitors) if m is not self and m.running and m.pid == self.pid]:
            if _apart(self._settings, twin.settings):
                continue
            twin.stop()
            _hand_over_singleton(twin, self)
            log.warning(
                "resource monitor: stopped the monitor of pid %d started before (store %s): this one"
                " replaces it (two monitors of one process need a run store or a Prometheus port each)",
                self.pid,
                twin.settings.store,
            )

    def _start(self) -> ResourceMonitor:
        with self._lock:
            self._stop_run(self._current())  # a thread that died: release what it left
            s = self._settings
            postmortems.announce(s.postmortem_dir, s.store)  # once per process and place
            stats = self._stats = MonitorStats(isolation=s.isolation, store_path=s.store)
            info = self._run_info()
            run = _Run(RunWriter(s.store, info) if s.store is not None else None)
            stamper = StepStamper(s.step_source, self._age_source, info.started_ns)
            emitter = Emitter(
                stamper, self._sink, stats, self._on_sample, run.writer, self._placement, s.interval_seconds
            )
            plan = self._plan
            if s.store is not None or s.postmortem_dir is not None:
                target = PostmortemTarget(s.postmortem_dir, s.store, info.started_at)
                plan = dataclasses.replace(plan, postmortem=target)
            if self._prometheus_port is not None:
                endpoint = exposition.target(
                    self._placement,
                    s.prometheus_address,
                    self._prometheus_port,
                    s.prometheus_sd_dir,
                    s.host_sampling,
                )
                plan = dataclasses.replace(plan, prometheus=endpoint)
                run.exposition = Exposition(endpoint, self._placement, stats)
            run.supervisor = Supervisor(
                plan, emitter, stats, run.stop_r, lambda: run.finish(stats), run.exposition
            )
            run.thread = threading.Thread(target=run.supervisor.run, name="WL-ResourceMonitor", daemon=True)
            self._run = run
            run.thread.start()
            atexit.register(self.stop)
            return self

    def stop(self) -> None:
        """Stop the child and the thread; idempotent. Returns within about 2 s
        even if the child is stuck in a driver call or the sink is slow, and
        2 s more at most while another writer holds the run store (the run's
        last write waits that long for it).

        Safe from a signal handler (also one that interrupts another stop()),
        from inside the sink, and in a forked copy, where it does nothing."""
        run = self._current()
        if run is None:
            return
        atexit.unregister(self.stop)
        self._stop_run(run)

    def _stop_run(self, run: _Run | None) -> None:
        if run is None or not run.claim():
            return
        with self._lock:
            if self._run is run:
                self._run = None
        run.signal_stop()
        supervisor, thread = run.supervisor, run.thread
        child = supervisor.child if supervisor is not None else None
        if child is not None:
            child.request_stop()  # the child takes its last record, which the thread emits
        if thread is None or thread.ident is None or thread is threading.current_thread():
            if supervisor is not None:
                supervisor.emitter.stopping.set()
            # stop() from the sink: the thread ends once the sink returns. Or from a signal handler
            # or another thread while start() ran: its thread, once started, finds the stop byte.
            return
        thread.join(STOP_TIMEOUT_SECONDS)
        if supervisor is not None:  # a sink behind by seconds of calls must not keep the thread
            supervisor.emitter.stopping.set()
        thread.join(_JOIN_SLACK_SECONDS)
        if thread.is_alive():
            # A call holds the thread; it reaps the child and releases shared
            # memory when that call returns.
            child = supervisor.child if supervisor is not None else None
            if child is not None:
                child.kill()
            if self._stats.in_sink_since is not None:
                what = "a call of the sink or a hook"
            else:  # the store's last write waits up to its timeout for another writer's lock
                what = "the run store's last write, or a collector sampling in the thread"
            log.warning("resource monitor: the monitor thread is busy in %s; it ends after it returns", what)
            run.end_store(self._stats)  # the run ends now all the same: it must not read as lost

    def stats(self) -> dict[str, Any]:
        """Counters and health: records read/logged/dropped/lost, signals logged,
        sink errors, restarts (total and by cause), recent child deaths with the
        collector each was attributed to, quarantined categories, isolation in
        use, the child's CPU seconds per sample, its pid, the seconds since the
        last record, what the monitor is waiting for if records are overdue,
        the error that stopped the thread, if any, the ``settings`` resolved and
        ``settings_sources``: where each came from (``ResourceMonitor`` for an
        argument, an env var's name, ``<file>: resource_monitoring.<key>``, a default)."""
        out = self._stats.snapshot()
        out["child_pid"] = self.child_pid
        out["running"] = self.running
        out["placement"] = dataclasses.asdict(self._placement)
        out["settings"] = self._settings.as_row()
        out["settings_sources"] = dict(self._sources)
        return out

    def _run_info(self) -> RunInfo:
        """What the run store records about this run."""
        pid = self._plan.sources.pid
        if pid == os.getpid():
            command = list(sys.orig_argv)
        else:
            try:
                command = psutil.Process(pid).cmdline()
            except psutil.Error:
                command = []
        row = self._settings.as_row()
        row.update(categories=list(self._plan.categories), prometheus_port=self._prometheus_port)
        clock = RunClock.start()  # every time stored of the run, and step_source: seconds
        return RunInfo(pid, command, row, clock.started_at, self._placement, clock.started_ns)

    def _forget_after_fork(self) -> None:
        """In a forked copy: drop the parent's run without touching it."""
        self._lock = threading.RLock()
        self._run = None
        self._stats = MonitorStats(isolation=self.isolation)

    def __enter__(self) -> ResourceMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pid(raw: object) -> int:
    """A process to describe: a live pid."""
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeError(f"pid must be an int, got {type(raw).__name__}")
    if raw <= 0 or not psutil.pid_exists(raw):
        raise ValueError(f"pid={raw}: no such process")
    return raw


_monitors: weakref.WeakSet[ResourceMonitor] = weakref.WeakSet()
_start_lock = threading.RLock()
"""Held while a monitor starts: two monitors replacing each other at once (``_replace_twins``)
would each wait for the other's lock."""
_singleton_lock = threading.RLock()
_singleton: ResourceMonitor | None = None
_singleton_pid = 0
"""The process that started ``_singleton``: a copy forked from C (no at-fork hooks) must not reuse it."""


def start_resource_monitor_from_config() -> ResourceMonitor | None:
    """Start the process-wide monitor from ``load_resource_monitoring_config()``.

    Idempotent: returns the running monitor if there is one (one stopped
    meanwhile is followed by a fresh one). None when monitoring is disabled.
    Never raises for bad configuration.
    """
    global _singleton, _singleton_pid
    with _start_lock, _singleton_lock:  # start()'s order: it may hand the singleton over
        if _singleton is not None and _singleton_pid == os.getpid() and _singleton.running:
            return _singleton
        resolved, resolution = settings.resolve_settings({})
        if not resolved.enabled:
            log.info("resource monitor: disabled by configuration")
            return None
        monitor = ResourceMonitor(_resolved=(resolved, resolution.sources))
        _singleton, _singleton_pid = monitor.start(), os.getpid()
        return _singleton


def get_resource_monitor() -> ResourceMonitor | None:
    """The process-wide monitor, or None (also in a forked copy of the process that started it)."""
    return _singleton if _singleton_pid == os.getpid() else None


def _apart(one: MonitorSettings, other: MonitorSettings) -> bool:
    """Whether two monitors of one process deliver to places of their own: each its own run
    store, or each its own Prometheus port (a notebook cell run again delivers where it did)."""
    stores, ports = (one.store, other.store), (one.prometheus_port, other.prometheus_port)
    if None not in stores and os.path.realpath(str(stores[0])) != os.path.realpath(str(stores[1])):
        return True
    return None not in ports and ports[0] != ports[1]


def _hand_over_singleton(old: ResourceMonitor, new: ResourceMonitor) -> None:
    """``new`` replaced ``old``: if that was the process-wide monitor, ``new`` is it now."""
    global _singleton
    with _singleton_lock:
        if _singleton is old and _singleton_pid == os.getpid():
            _singleton = new


def stop_resource_monitor() -> None:
    """Stop the process-wide monitor and forget it."""
    global _singleton
    with _singleton_lock:
        monitor, _singleton = _singleton, None
    if monitor is not None:
        monitor.stop()


def _after_fork_in_child() -> None:
    global _singleton, _singleton_lock, _start_lock
    _singleton_lock = threading.RLock()
    _start_lock = threading.RLock()
    _singleton = None
    for monitor in list(_monitors):
        monitor._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
