"""The metrics endpoint, served by the sampling child.

Serving from the child keeps scrapes off the backend entirely (no thread, no
GIL, no socket there), and ties the endpoint's life to the child's: a driver
crash takes it down, Prometheus records ``up == 0``, and the restarted child
serves again on the same port. A scrape reads the latest record the child
wrote and the status block (model age, health); it never samples.

Needs ``prometheus_client`` (the ``prometheus`` extra), imported only here.
"""

from __future__ import annotations

import errno
import math
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sampler import catalogue
from sampler.ipc.channel import PrometheusTarget
from sampler.ipc.status import (
    ENDPOINT_BAD_ADDRESS,
    ENDPOINT_NO_CLIENT,
    ENDPOINT_UNAVAILABLE,
    NOT_LOGGED,
    RESTART_CAUSES,
    ChildStatus,
)
from sampler.prometheus import metrics
from sampler.prometheus.scrape_server import ScrapeServer

GPU_LABELS = ("gpu", "gpu_uuid")


@dataclass(frozen=True)
class _Family:
    """The fields of a record one metric family exposes."""

    metric: metrics.Metric
    label_names: tuple[str, ...]
    members: tuple[tuple[int, tuple[str, ...]], ...]
    """(field index in the record, that series' label values)."""


class RecordCollector:
    """A ``prometheus_client`` collector over the child's latest record.

    ``update`` (the child's loop, once per record) swaps in a reference, which
    is atomic, so a scrape in the server's thread sees one whole record.
    """

    def __init__(
        self,
        fields: Sequence[str],
        target: PrometheusTarget,
        status: ChildStatus,
        categories: Sequence[str],
        gpu_uuids: dict[str, str],
        stall_since: Callable[[], float | None] | None = None,
        gpus_quarantined: Sequence[str] = (),
    ) -> None:
        self._status = status
        self._gpus_quarantined = tuple(gpus_quarantined)
        """The devices this child never opens (``Sources.gpus_quarantined``)."""
        self._stall_since = stall_since
        """The open stall's start (monotonic s), None while none is open; itself None when stalls
        are not watched."""
        self._categories = tuple(categories)
        base = dict(target.labels)
        self._base_names = tuple(base)
        self._base_values = tuple(base.values())
        self._info = {**base, **target.info}
        grouped: dict[str, tuple[metrics.Metric, list[tuple[int, tuple[str, ...]]], bool]] = {}
        for index, field in enumerate(fields):
            exposed = metrics.lookup(field)
            if exposed is None or (exposed.host_wide and not target.host_wide):
                continue
            extra: tuple[str, ...] = ()
            if exposed.gpu is not None:
                extra = (exposed.gpu, gpu_uuids.get(exposed.gpu, ""))
            entry = grouped.setdefault(exposed.metric.name, (exposed.metric, [], exposed.gpu is not None))
            entry[1].append((index, self._base_values + extra))
        self._families = tuple(
            _Family(metric, self._base_names + (GPU_LABELS if per_gpu else ()), tuple(members))
            for metric, members, per_gpu in grouped.values()
        )
        self._latest: tuple[Sequence[float], float] | None = None
        self.dropped: dict[str, int] = {}
        """The endpoint's dropped connections by reason, once it serves."""

    def update(self, values: Sequence[float], wall_time: float) -> None:
        """The record just written, sampled at ``wall_time`` (s since the epoch)."""
        self._latest = (values, wall_time)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def family(metric: metrics.Metric, label_names: Sequence[str]) -> Any:
            kind = CounterMetricFamily if metric.kind == catalogue.COUNTER else GaugeMetricFamily
            return kind(metric.name, metric.help, labels=list(label_names))

        latest = self._latest
        if latest is not None:
            values, wall_time = latest
            for spec in self._families:
                out = family(spec.metric, spec.label_names)
                for index, label_values in spec.members:
                    value = values[index]
                    if not math.isnan(value):  # a failed reading is absent, as in the pipeline
                        out.add_metric(label_values, value * spec.metric.scale)
                yield out
            stamp = family(metrics.LAST_RECORD, self._base_names)
            stamp.add_metric(self._base_values, wall_time)
            yield stamp
        yield from self._own(family)

    def _own(self, family: Any) -> Iterator[Any]:
        """The monitor's metrics: model age, health, the child's cost, the steps' phases once
        ``watch_model`` has timed any, whether the run is stalled and for how long, info."""
        names, values, status = self._base_names, self._base_values, self._status
        _, step = status.logged()
        if step != NOT_LOGGED:
            age = family(metrics.MODEL_AGE, names)
            age.add_metric(values, step)
            yield age
        health = status.health()
        restarts = family(metrics.RESTARTS, (*names, "cause"))
        for cause in RESTART_CAUSES:
            restarts.add_metric((*values, cause), health.restarts[cause])
        yield restarts
        lost = family(metrics.RECORDS_LOST, names)
        lost.add_metric(values, health.records_lost)
        yield lost
        quarantined = family(metrics.QUARANTINED, (*names, "category"))
        for category in dict.fromkeys((*self._categories, *health.quarantined)):
            quarantined.add_metric((*values, category), 1 if category in health.quarantined else 0)
        yield quarantined
        not_reading, _, stops = status.gpus()
        gpus = family(metrics.GPUS_NOT_READING, names)
        gpus.add_metric(values, not_reading)
        yield gpus
        quarantined_gpus = family(metrics.GPU_QUARANTINED, (*names, "gpu"))
        for device in self._gpus_quarantined:
            quarantined_gpus.add_metric((*values, device), 1)
        yield quarantined_gpus
        errors = family(metrics.GPU_ERRORS, names)
        errors.add_metric(values, health.gpu_errors + stops)
        yield errors
        per_sample = status.read().cpu_seconds_per_sample
        if per_sample is not None:
            cpu = family(metrics.CHILD_CPU, names)
            cpu.add_metric(values, per_sample)
            yield cpu
        steps, spent = status.phases()
        if steps:
            timed = family(metrics.STEPS_TIMED, names)
            timed.add_metric(values, steps)
            yield timed
            seconds = family(metrics.PHASE_SECONDS, (*names, "phase"))
            for (phase, _, _), phase_seconds in zip(catalogue.STEP_PHASES, spent, strict=True):
                seconds.add_metric((*values, phase), phase_seconds)
            yield seconds
        if self._stall_since is not None:
            since = self._stall_since()
            stalled = family(metrics.STALLED, names)
            stalled.add_metric(values, 0 if since is None else 1)
            yield stalled
            if since is not None:
                age = family(metrics.STALL_AGE, names)
                age.add_metric(values, max(0.0, time.monotonic() - since))
                yield age
        if self.dropped:
            dropped = family(metrics.CONNECTIONS_DROPPED, (*names, "reason"))
            for reason, count in self.dropped.items():
                dropped.add_metric((*values, reason), count)
            yield dropped
        info = family(metrics.INFO, tuple(self._info))
        info.add_metric(tuple(self._info.values()), 1)
        yield info


class Endpoint:
    """The HTTP server, in a daemon thread of the child (see ``scrape_server``)."""

    def __init__(self, server: ScrapeServer) -> None:
        self._server = server

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def dropped(self) -> dict[str, int]:
        """Connections dropped so far, by reason (slow, idle or broken clients)."""
        return self._server.dropped

    def close(self) -> None:
        """Stop serving and release the port and every connection (bounded)."""
        self._server.close()


def open_endpoint(target: PrometheusTarget, collector: RecordCollector) -> tuple[Endpoint | None, int]:
    """Serve ``collector`` at ``target``: (the endpoint, the status word saying
    so), or (None, ``-errno`` or an ``ENDPOINT_*`` failure) when it cannot."""
    try:
        from prometheus_client import CollectorRegistry
        from prometheus_client.exposition import choose_encoder
    except ImportError:
        return None, ENDPOINT_NO_CLIENT
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    def render(accept: str) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type

    try:
        server = ScrapeServer(target.address, target.port, render)
    except socket.gaierror:
        return None, ENDPOINT_BAD_ADDRESS
    except OSError as exc:
        return None, -(exc.errno or errno.EIO)
    except Exception:
        return None, ENDPOINT_UNAVAILABLE
    endpoint = Endpoint(server)
    collector.dropped = server.dropped
    server.start()
    return endpoint, endpoint.port
