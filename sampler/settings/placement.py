"""Where this backend sits in a job: its host, and its rank as the launcher says.

torchrun (and ``torch.distributed.launch``, DeepSpeed, Accelerate, SLURM
wrappers that imitate them) start one backend per GPU and tell each its place
through ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``. A
backend started without them is rank 0 of a world of one.

With several ranks on a host, the readings that describe the host rather than
a rank (``HOST_WIDE_CATEGORIES``, and the GPUs no rank owns) are the same
whichever rank takes them; by default only local rank 0 samples them, so a
fleet view sums each host once (``host_sampling``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

HOST_WIDE_CATEGORIES: tuple[str, ...] = ("cpu", "memory", "disk", "network", "container")
"""Categories whose readings describe the host (or the container every local rank shares)."""
HOST_SAMPLING_MODES: tuple[str, ...] = ("local_rank_0", "every_rank")
DEFAULT_HOST_SAMPLING = "local_rank_0"

ENV_RANK = "RANK"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_ELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
"""torchrun's rendezvous id: the same in every rank of a launch (``none`` when not given)."""
ENV_ELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
"""Where torchrun's agent has a rank write its error: ``<log dir>/attempt_<restart>/<local rank>/error.json``,
under a log directory the agent makes afresh (``mkdtemp``) for each launch, shared by the ranks it
starts, all their restarts included."""
LAUNCHER_VARS = (
    ENV_RANK,
    ENV_LOCAL_RANK,
    ENV_WORLD_SIZE,
    ENV_LOCAL_WORLD_SIZE,
    ENV_ELASTIC_RUN_ID,
    ENV_ELASTIC_ERROR_FILE,
)
MAX_DIGITS = 30
"""The most significant digits a whole number read from text may have: no count, index, port or
pid comes near, and ``int()`` refuses strings past 4,300 digits."""


@dataclass(frozen=True)
class Placement:
    """This backend's host and rank."""

    host: str
    rank: int = 0
    local_rank: int = 0
    """Rank among the backends of this host (the GPU it uses, by convention)."""
    world_size: int = 1
    local_world_size: int = 1
    """Backends on this host."""
    run_id: str = ""
    """Shared by every rank of one launch (the ``run_id`` label)."""

    def samples_host(self, host_sampling: str) -> bool:
        """Whether this rank takes the host-wide readings under ``host_sampling``."""
        return host_sampling == "every_rank" or self.local_rank == 0

    def labels(self) -> dict[str, str]:
        """The labels that name this backend in a fleet."""
        return {
            "host": self.host,
            "rank": str(self.rank),
            "local_rank": str(self.local_rank),
            "run_id": self.run_id,
        }


def host_name() -> str:
    """This host's name as the fleet knows it (``socket.gethostname()``)."""
    return socket.gethostname() or "localhost"


def from_environment(environ: Mapping[str, str] | None = None, run_id: str | None = None) -> Placement:
    """The placement the launcher's variables describe; ``run_id`` None: the
    launcher's (``TORCHELASTIC_RUN_ID``), else one made from the rendezvous
    address (``MASTER_ADDR:MASTER_PORT``) for a multi-rank job (``<address>-<launch>``
    where torchrun's agent runs every rank on this host: the address is the same at
    every launch), else ``<host>-<pid>``. A variable that is not a usable number gets
    one warning and this backend counts as a world of one."""
    env = os.environ if environ is None else environ
    host = host_name()
    try:
        rank = _number(env, ENV_RANK, 0, minimum=0)
        local_rank = _number(env, ENV_LOCAL_RANK, 0, minimum=0)
        world_size = _number(env, ENV_WORLD_SIZE, max(1, rank + 1), minimum=1)
        local_world_size = _number(env, ENV_LOCAL_WORLD_SIZE, max(1, local_rank + 1), minimum=1)
        if rank >= world_size or local_rank >= local_world_size or local_world_size > world_size:
            raise ValueError(
                f"{ENV_RANK}={rank}, {ENV_LOCAL_RANK}={local_rank}, {ENV_WORLD_SIZE}={world_size}, "
                f"{ENV_LOCAL_WORLD_SIZE}={local_world_size} do not fit together"
            )
    except ValueError as exc:
        log.warning("resource monitor: %s; monitoring this backend as rank 0 of a world of one", exc)
        rank, local_rank, world_size, local_world_size = 0, 0, 1, 1
    if run_id is None:
        run_id = _launcher_run_id(env, host, local_rank, world_size, local_world_size)
    return Placement(host, rank, local_rank, world_size, local_world_size, run_id)


def whole_number(text: str) -> int | None:
    """The number ``text`` writes in the ASCII digits 0-9 alone, surrounding blanks aside (at
    most ``MAX_DIGITS`` of them past leading zeros), or None. ``int()`` also takes a sign, ``_``
    between digits, and other scripts' digits (Arabic-Indic, fullwidth): no launcher or setting
    means those."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()):
        return None
    significant = digits.lstrip("0") or "0"
    return int(significant) if len(significant) <= MAX_DIGITS else None


def _number(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    text = env.get(name)
    if text is None or not text.strip():
        return default
    value = whole_number(text)
    if value is None:
        raise ValueError(f"{name}={bounded_repr(text)} is not a whole number in the digits 0-9")
    if value < minimum:
        raise ValueError(f"{name}={bounded_repr(text)} is below {minimum}")
    return value


def _launcher_run_id(
    env: Mapping[str, str], host: str, local_rank: int, world_size: int, local_world_size: int
) -> str:
    elastic = env.get(ENV_ELASTIC_RUN_ID, "").strip()
    if elastic and elastic.lower() != "none":
        return elastic
    master = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if world_size > 1 and all(master):
        address = f"{master[0]}:{master[1]}"
        # One agent with every rank can tell its launches apart; agents on several hosts share
        # nothing but the address (the store's reader then tells launches apart by their ranks).
        log_dir = _elastic_log_dir(env, local_rank) if world_size == local_world_size else None
        if log_dir is None:
            return address
        return f"{address}-{hashlib.sha256(f'{host}/{log_dir}'.encode()).hexdigest()[:LAUNCH_DIGITS]}"
    return f"{host}-{os.getpid()}"


LAUNCH_DIGITS = 8
"""Hex digits of the part that tells one agent's launches at one address apart."""


def _elastic_log_dir(env: Mapping[str, str], local_rank: int) -> str | None:
    """The log directory torchrun's agent made for this launch, from this rank's
    ``TORCHELASTIC_ERROR_FILE``; None where that is not set, or not laid out as torchrun's."""
    rest, name = os.path.split(env.get(ENV_ELASTIC_ERROR_FILE, "").strip())
    rest, rank = os.path.split(rest)
    log_dir, attempt = os.path.split(rest)
    if name != "error.json" or rank != str(local_rank) or _ATTEMPT.fullmatch(attempt) is None:
        return None
    return log_dir if os.path.isabs(log_dir) else None


_ATTEMPT = re.compile(r"attempt_[0-9]+")
