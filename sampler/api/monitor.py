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
import time
import weakref
from collections.abc import Iterable, Mapping
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
from sampler.store.writer import RunInfo, RunWriter
from sampler.supervision import exposition
from sampler.supervision.exposition import Exposition
from sampler.supervision.spawn import STOP_TIMEOUT_SECONDS
from sampler.supervision.supervisor import Settings, Supervisor
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

RING_CAPACITY = 1024
"""Records the ring holds: 17 minutes at the 1 s floor before a stalled reader loses any."""
DEFAULT_HANG_DEADLINE_SECONDS = 5.0
"""A collector call running longer than this gets the child killed (independent of the interval)."""
MAX_HANG_DEADLINE_SECONDS = 86400.0
RESTART_BACKOFF_SECONDS = (1.0, 60.0)
"""Delay before restarting a dead child: the first, doubling up to the second."""
_JOIN_SLACK_SECONDS = 1.0


ISOLATION_MODES = ("process", "thread")


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
        run store's last write (all the pipeline queued, the final stats), then the stop pipe."""
        if self.exposition is not None:
            self.exposition.close()
        if self.writer is not None and self._unsubscribe is not None:
            self._unsubscribe()
            final = {**stats.snapshot(), "running": False, "child_pid": None}
            try:
                self.writer.close(final)
            except Exception as exc:
                log.error(
                    "resource monitor: the run store failed at stop (%s)", bounded_repr(exc), exc_info=True
                )
            stats.note_store(self.writer)
        self.close_pipe()

    def close_pipe(self) -> None:
        """Release both ends of the stop pipe."""
        with self._pipe_lock:
            for fd in (self.stop_r, self._stop_w):
                if fd is not None:
                    os.close(fd)
            self._stop_w = None


class ResourceMonitor:
    """Samples resources in a child process and logs them as ``resource/...`` signals.

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
    samples its own process and GPU. ``prometheus_port`` (plus the local rank)
    has the child serve ``/metrics`` at ``prometheus_address``, listed for
    Prometheus' file-based discovery in ``prometheus_sd_dir``.
    """

    def __init__(
        self,
        interval_seconds: float = settings.DEFAULT_INTERVAL_SECONDS,
        categories: Iterable[str] | Mapping[str, bool] | None = None,
        disk_path: str = settings.DEFAULT_DISK_PATH,
        step_source: str = settings.DEFAULT_STEP_SOURCE,
        sink: Sink | None = None,
        age_source: AgeSource | None = None,
        nvml_module: str = "pynvml",
        *,
        isolation: str = "process",
        hang_deadline_seconds: float = DEFAULT_HANG_DEADLINE_SECONDS,
        on_sample: SampleHook | None = None,
        store: str | os.PathLike[str] | None = None,
        pid: int | None = None,
        inner_rate_hz: float = settings.DEFAULT_INNER_RATE_HZ,
        gpu_devices: str | Iterable[int | str] = "all",
        postmortem_dir: str | os.PathLike[str] | None = settings.DEFAULT_POSTMORTEM_DIR,
        prometheus_port: int | None = None,
        prometheus_address: str = settings.DEFAULT_PROMETHEUS_ADDRESS,
        prometheus_sd_dir: str | os.PathLike[str] | None = None,
        host_sampling: str = placement.DEFAULT_HOST_SAMPLING,
        run_id: str | None = None,
        _min_interval_seconds: float = settings.MIN_INTERVAL_SECONDS,
        _ring_capacity: int = RING_CAPACITY,
        _restart_backoff: tuple[float, float] = RESTART_BACKOFF_SECONDS,
    ) -> None:
        api = settings.resolve_api_settings(
            interval_seconds=interval_seconds,
            categories=categories,
            disk_path=disk_path,
            step_source=step_source,
            store=store,
            min_interval_seconds=_min_interval_seconds,
            inner_rate_hz=inner_rate_hz,
            gpu_devices=gpu_devices if isinstance(gpu_devices, (str, int)) else list(gpu_devices),
            postmortem_dir=postmortem_dir,
            prometheus_port=prometheus_port,
            prometheus_address=prometheus_address,
            prometheus_sd_dir=prometheus_sd_dir,
            host_sampling=host_sampling,
            run_id=run_id,
        )
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
        for name, fn in (("sink", sink), ("age_source", age_source), ("on_sample", on_sample)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable or None, got {type(fn).__name__}")
        where = self._placement = placement.from_environment(run_id=api.run_id)
        self._host_sampling = api.host_sampling
        categories = api.categories
        if not where.samples_host(api.host_sampling):
            categories = tuple(c for c in categories if c not in HOST_WIDE_CATEGORIES)
        shared = api.host_sampling == "local_rank_0" and where.local_world_size > 1
        self._settings = Settings(
            interval=api.interval_seconds,
            categories=categories,
            sources=Sources(
                disk_path=api.disk_path,
                pid=os.getpid() if pid is None else _pid(pid),
                nvml_module=nvml_module,
                gpu_devices=api.gpu_devices,
                gpu_share=(where.local_rank, where.local_world_size) if shared else None,
            ),
            inner_rate_hz=api.inner_rate_hz,
            isolation=isolation,
            hang_deadline=_hang_deadline(hang_deadline_seconds),
            ring_capacity=_ring_capacity,
            backoff_base=_restart_backoff[0],
            backoff_cap=_restart_backoff[1],
        )
        self._postmortem_dir = api.postmortem_dir
        self._prometheus_port = exposition.rank_port(api.prometheus_port, where)
        self._prometheus_address = api.prometheus_address
        self._prometheus_sd_dir = api.prometheus_sd_dir
        self._store = api.store
        self._step_source = api.step_source
        self._sink: Sink = signals.log_signal if sink is None else sink
        self._age_source = age_source
        self._on_sample = on_sample
        self._lock = threading.RLock()
        self._stats = MonitorStats()
        self._run: _Run | None = None
        _monitors.add(self)

    # The settings are read-only: a change after construction would bypass validation.

    @property
    def interval_seconds(self) -> float:
        """Seconds between samples."""
        return self._settings.interval

    @property
    def categories(self) -> tuple[str, ...]:
        """The categories this rank samples, in ``DEFAULT_CATEGORIES`` order: the
        enabled ones, less the host-wide ones on a rank that leaves them to local rank 0."""
        return self._settings.categories

    @property
    def placement(self) -> Placement:
        """This backend's host and rank, as the launcher's environment said at construction."""
        return self._placement

    @property
    def host_sampling(self) -> str:
        """``local_rank_0`` or ``every_rank``: which ranks sample the host-wide categories."""
        return self._host_sampling

    @property
    def prometheus_port(self) -> int | None:
        """The port the child serves metrics on (the configured one plus the local rank), or None."""
        return self._prometheus_port

    @property
    def prometheus_address(self) -> str:
        """The address the metrics endpoint binds."""
        return self._prometheus_address

    @property
    def prometheus_sd_dir(self) -> str | None:
        """Where the file-based discovery entry goes (absolute), or None."""
        return self._prometheus_sd_dir

    @property
    def disk_path(self) -> str:
        """The filesystem the disk usage signals describe (absolute)."""
        return self._settings.sources.disk_path

    @property
    def step_source(self) -> str:
        """``"model_age"`` or ``"seconds"``."""
        return self._step_source

    @property
    def isolation(self) -> str:
        """``"process"`` or ``"thread"``, as asked (``stats()`` says what runs)."""
        return self._settings.isolation

    @property
    def hang_deadline_seconds(self) -> float:
        """How long one collector call may run before the child is killed."""
        return self._settings.hang_deadline

    @property
    def nvml_module(self) -> str:
        """The NVML binding the child imports."""
        return self._settings.sources.nvml_module

    @property
    def store(self) -> str | None:
        """The run store this monitor writes (absolute path), or None."""
        return self._store

    @property
    def inner_rate_hz(self) -> float:
        """How often the child reads the tracked signals between records, for their peaks."""
        return self._settings.inner_rate_hz

    @property
    def gpu_devices(self) -> str | tuple[str, ...]:
        """``all``, ``visible``, or the devices listed (indices or UUIDs, as text)."""
        return self._settings.sources.gpu_devices

    @property
    def postmortem_dir(self) -> str | None:
        """Where a postmortem goes without a store (absolute), or None."""
        return self._postmortem_dir

    @property
    def pid(self) -> int:
        """The process the ``process`` category describes."""
        return self._settings.sources.pid

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
        min(interval, 1 s) plus the child's start-up. Nothing here raises for
        an unusable platform: the monitor falls back to sampling in-thread."""
        with self._lock:
            if self.running:
                return self
            self._stop_run(self._current())  # a thread that died: release what it left
            postmortems.announce(self._postmortem_dir, self._store)  # once per process and place
            stats = self._stats = MonitorStats(isolation=self.isolation, store_path=self._store)
            info = self._run_info()
            run = _Run(RunWriter(self._store, info) if self._store is not None else None)
            stamper = StepStamper(self._step_source, self._age_source, time.monotonic_ns())
            emitter = Emitter(stamper, self._sink, stats, self._on_sample, run.writer, self._placement)
            settings = self._settings
            if self._store is not None or self._postmortem_dir is not None:
                target = PostmortemTarget(self._postmortem_dir, self._store, info.started_at)
                settings = dataclasses.replace(settings, postmortem=target)
            if self._prometheus_port is not None:
                endpoint = exposition.target(
                    self._placement,
                    self._prometheus_address,
                    self._prometheus_port,
                    self._prometheus_sd_dir,
                    self._host_sampling,
                )
                settings = dataclasses.replace(settings, prometheus=endpoint)
                run.exposition = Exposition(endpoint, self._placement, stats)
            run.supervisor = Supervisor(
                settings, emitter, stats, run.stop_r, lambda: run.finish(stats), run.exposition
            )
            run.thread = threading.Thread(target=run.supervisor.run, name="WL-ResourceMonitor", daemon=True)
            self._run = run
            run.thread.start()
            atexit.register(self.stop)
            return self

    def stop(self) -> None:
        """Stop the child and the thread; idempotent. Returns within about 2 s
        even if the child is stuck in a driver call or the sink is slow.

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
            child.request_stop()
        if thread is None or thread is threading.current_thread():
            return  # stop() from the sink: the thread ends once the sink returns
        thread.join(STOP_TIMEOUT_SECONDS + _JOIN_SLACK_SECONDS)
        if thread.is_alive():
            # The sink (or an in-thread collector) holds the thread; it reaps
            # the child and releases shared memory when that call returns.
            child = supervisor.child if supervisor is not None else None
            if child is not None:
                child.kill()
            log.warning("resource monitor: the monitor thread is busy in a call; it ends after it returns")

    def stats(self) -> dict[str, Any]:
        """Counters and health: records read/logged/dropped/lost, signals logged,
        sink errors, restarts (total and by cause), recent child deaths with the
        collector each was attributed to, quarantined categories, isolation in
        use, the child's CPU seconds per sample, its pid, the seconds since the
        last record, what the monitor is waiting for if records are overdue,
        and the error that stopped the thread, if any."""
        out = self._stats.snapshot()
        out["child_pid"] = self.child_pid
        out["running"] = self.running
        out["placement"] = dataclasses.asdict(self._placement)
        return out

    def _run_info(self) -> RunInfo:
        """What the run store records about this run."""
        s = self._settings
        pid = s.sources.pid
        if pid == os.getpid():
            command = list(sys.orig_argv)
        else:
            try:
                command = psutil.Process(pid).cmdline()
            except psutil.Error:
                command = []
        settings = {
            "interval_seconds": s.interval,
            "categories": list(s.categories),
            "disk_path": s.sources.disk_path,
            "step_source": self._step_source,
            "isolation": s.isolation,
            "hang_deadline_seconds": s.hang_deadline,
            "nvml_module": s.sources.nvml_module,
            "gpu_devices": s.sources.gpu_devices,
            "inner_rate_hz": s.inner_rate_hz,
            "store": self._store,
            "postmortem_dir": self._postmortem_dir,
            "prometheus_port": self._prometheus_port,
            "prometheus_address": self._prometheus_address,
            "prometheus_sd_dir": self._prometheus_sd_dir,
            "host_sampling": self._host_sampling,
        }
        return RunInfo(pid, command, settings, time.time(), self._placement)

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


def _hang_deadline(raw: object) -> float:
    """Seconds one collector call may run: a number > 0, clamped to one day."""
    try:
        seconds = settings.parse_seconds(raw)
    except settings.Invalid as exc:
        error = TypeError if exc.wrong_type else ValueError
        raise error(f"hang_deadline_seconds={bounded_repr(raw)}: {exc}") from None
    if seconds > MAX_HANG_DEADLINE_SECONDS:
        log.warning(
            "resource monitor: hang_deadline_seconds=%s is above the %g s ceiling; using %g",
            bounded_repr(raw),
            MAX_HANG_DEADLINE_SECONDS,
            MAX_HANG_DEADLINE_SECONDS,
        )
        return MAX_HANG_DEADLINE_SECONDS
    return seconds


_monitors: weakref.WeakSet[ResourceMonitor] = weakref.WeakSet()
_singleton_lock = threading.RLock()
_singleton: ResourceMonitor | None = None
_singleton_pid = 0
"""The process that started ``_singleton``: a copy forked from C (no at-fork hooks) must not reuse it."""


def start_resource_monitor_from_config() -> ResourceMonitor | None:
    """Start the process-wide monitor from ``load_resource_monitoring_config()``.

    Idempotent: returns the running monitor if there is one. None when
    monitoring is disabled. Never raises for bad configuration.
    """
    global _singleton, _singleton_pid
    with _singleton_lock:
        if _singleton is not None and _singleton_pid == os.getpid():
            return _singleton
        cfg = settings.load_resource_monitoring_config()
        if not cfg["enabled"]:
            log.info("resource monitor: disabled by configuration")
            return None
        monitor = ResourceMonitor(**{field.key: cfg[field.key] for field in settings.MONITOR_FIELDS})
        _singleton, _singleton_pid = monitor.start(), os.getpid()
        return _singleton


def get_resource_monitor() -> ResourceMonitor | None:
    """The process-wide monitor, or None (also in a forked copy of the process that started it)."""
    return _singleton if _singleton_pid == os.getpid() else None


def stop_resource_monitor() -> None:
    """Stop the process-wide monitor and forget it."""
    global _singleton
    with _singleton_lock:
        monitor, _singleton = _singleton, None
    if monitor is not None:
        monitor.stop()


def _after_fork_in_child() -> None:
    global _singleton, _singleton_lock
    _singleton_lock = threading.RLock()
    _singleton = None
    for monitor in list(_monitors):
        monitor._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
