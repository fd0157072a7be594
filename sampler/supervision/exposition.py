"""The backend's side of the child's metrics endpoint.

The child serves; the backend only learns, once per child, whether it does
(from the status block, when the child hands over its ring), says so in
``stats()``, warns once per problem rather than at every restart, and keeps
the service discovery entry naming the endpoint only while it can serve (and,
listing it, removes the entries dead monitors of its host left behind).
"""

from __future__ import annotations

import errno
import logging
import os

from sampler import settings
from sampler.ipc.channel import PrometheusTarget
from sampler.ipc.status import ENDPOINT_BAD_ADDRESS, ENDPOINT_NO_CLIENT, ENDPOINT_NONE, ENDPOINT_UNAVAILABLE
from sampler.pipeline.stats import MonitorStats
from sampler.prometheus import discovery
from sampler.settings.placement import Placement
from sampler.store.writer import package_version
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")


def rank_port(port: int | None, where: Placement) -> int | None:
    """This rank's port: the configured one plus the local rank; None for no
    endpoint, also (with a warning) past the last port."""
    if port is None:
        return None
    if port + where.local_rank > settings.MAX_PORT:
        log.warning(
            "resource monitor: prometheus_port=%d plus local rank %d is past port %d; no Prometheus endpoint",
            port,
            where.local_rank,
            settings.MAX_PORT,
        )
        return None
    return port + where.local_rank


def target(
    where: Placement, address: str, port: int, sd_dir: str | None, host_sampling: str
) -> PrometheusTarget:
    """The endpoint a run's children serve at ``address:port``, and its discovery entry in ``sd_dir``."""
    sd_file = None if sd_dir is None else discovery.entry_path(sd_dir, where, os.getpid())
    info = {
        "version": package_version(),
        "world_size": str(where.world_size),
        "local_world_size": str(where.local_world_size),
        "host_sampling": host_sampling,
    }
    return PrometheusTarget(address, port, where.labels(), info, sd_file, where.samples_host(host_sampling))


def describe_failure(state: int, target: PrometheusTarget) -> str:
    """Why the endpoint at ``target`` does not serve, from its status word."""
    where = f"{target.address}:{target.port}"
    if state == ENDPOINT_BAD_ADDRESS:
        return f"prometheus_address={bounded_repr(target.address)} does not resolve to an address to bind"
    if state == ENDPOINT_NO_CLIENT:
        return "prometheus_client cannot be imported (pip install 'wl-resource-monitor[prometheus]')"
    if state == ENDPOINT_UNAVAILABLE:
        return f"the endpoint at {where} failed to start"
    if -state == errno.EADDRINUSE:
        return f"port {target.port} at {target.address} is already in use by another process"
    return f"cannot listen at {where}: {os.strerror(-state)}"


class Exposition:
    """What the backend knows and keeps about its children's endpoint."""

    def __init__(self, target: PrometheusTarget, placement: Placement, stats: MonitorStats) -> None:
        self.target = target
        self.address = discovery.target(target.address, target.port, placement.host)
        """``host:port`` as a Prometheus server reaches the endpoint."""
        self._host = placement.host
        self.stats = stats
        self._warned: str | None = None
        self._listed = False
        self._state = ENDPOINT_NONE
        self._down = False
        """Whether users were told the endpoint does not serve."""

    def seen(self, state: int) -> None:
        """``state`` is the endpoint word of the child that handed over its ring: read
        at the handover, and at each record after it (a port in use is tried again)."""
        if state == self._state:
            return
        self._state = state
        if state == ENDPOINT_NONE:
            return
        if state > 0:
            self.stats.prometheus_error = None
            self._list()  # first: whoever sees the endpoint in stats() finds its entry listed
            self.stats.prometheus_endpoint = f"http://{self.address}/metrics"
            if self._down:
                self._down = False
                self._warned = None  # should it fail again, that is said again
                log.warning("resource monitor: the Prometheus endpoint serves at %s now", self.address)
            return
        problem = describe_failure(state, self.target)
        self.stats.prometheus_endpoint, self.stats.prometheus_error = None, problem
        self._unlist()
        if problem != self._warned:
            self._warned, self._down = problem, True
            log.warning(
                "resource monitor: no Prometheus endpoint: %s; monitoring goes on without it "
                "(stats()['prometheus_error'])",
                problem,
            )

    def close(self) -> None:
        """The monitor stopped: its target leaves the discovery directory."""
        self._unlist()

    def _list(self) -> None:
        path = self.target.sd_file
        if path is None or self._listed:
            return
        try:
            discovery.write_entry(path, self.address, self.target.labels)
        except OSError as exc:
            problem = f"cannot write the discovery entry {path}: {exc.strerror or exc}"
            self.stats.prometheus_error = problem
            if problem != self._warned:
                self._warned = problem
                log.warning("resource monitor: %s; Prometheus will not find this endpoint", problem)
            return
        self._listed = True
        discovery.remove_stale_entries(os.path.dirname(path), self._host)

    def _unlist(self) -> None:
        if self.target.sd_file is not None and self._listed:
            discovery.remove_entry(self.target.sd_file)
            self._listed = False
