"""Reading a run store, for the commands people run (``runs``, ``plot``,
``top``, ``export``, ``postmortem``); safe while a backend writes it (WAL readers never block
the writer and see whole transactions only)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

import psutil

from sampler import catalogue
from sampler.settings.parsers import DEFAULT_INTERVAL_SECONDS
from sampler.store import schema
from sampler.util.quoting import printable

ENERGY_GLOB = catalogue.PREFIX + catalogue.GPU_KEY_PREFIX.replace(catalogue.DEVICE, "*") + "energy_joules"
"""Every GPU's energy counter, as a GLOB pattern over signal names."""
LOST_AFTER_INTERVALS = 3
"""A run that has not written for this many intervals (and at least 30 s) without
an end time was lost: its backend died or hangs."""


@dataclass(frozen=True)
class Run:
    """One row of ``runs``, decoded."""

    id: int
    started_at: float
    ended_at: float | None
    updated_at: float
    host: str
    pid: int
    command: list[str]
    config: dict[str, Any]
    version: str
    stats: dict[str, Any] | None
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    launch_id: str | None = None
    """The id every rank of the launch shares (the metrics' run_id label)."""

    @property
    def interval(self) -> float:
        """Seconds between samples, as configured."""
        return float(self.config.get("interval_seconds", DEFAULT_INTERVAL_SECONDS))

    @property
    def status(self) -> str:
        """ "ended", "running", or "lost" now (see ``status_at``)."""
        return self.status_at(time.time(), self.process_alive())

    def status_at(self, now: float, alive: bool | None) -> str:
        """ "ended", "running" or "lost" at wall time ``now``: lost when it has
        neither ended nor written for a while, or at once when its process is
        known to be gone (``alive`` False, from ``process_alive``)."""
        if self.ended_at is not None:
            return "ended"
        if alive is False:
            return "lost"
        quiet = now - self.updated_at
        return "lost" if quiet > max(LOST_AFTER_INTERVALS * self.interval, 30.0) else "running"

    def process_alive(self) -> bool | None:
        """Whether the monitored process still runs; None when this cannot be
        told from here (the run is another host's)."""
        if self.host != socket.gethostname():
            return None
        try:
            return psutil.pid_exists(self.pid)
        except (psutil.Error, OSError):
            return None

    @property
    def where(self) -> str:
        """``host`` alone, or ``host rank R/W`` for a rank of a multi-rank job."""
        return self.host if self.world_size == 1 else f"{self.host} rank {self.rank}/{self.world_size}"

    @property
    def duration(self) -> float:
        """Seconds from start to end (or to the latest write)."""
        return (self.ended_at or self.updated_at) - self.started_at


@dataclass(frozen=True)
class Launch:
    """The runs of one multi-rank launch in a store: rows sharing a ``launch_id``, one per rank
    (or more where a rank's process started its monitor again)."""

    id: str
    """The ``launch_id``; ``<launch_id>@run<N>`` where the id names several launches (see
    ``launches``), N the first run's id."""
    runs: list[Run]
    """By rank, then run id."""

    @property
    def world_size(self) -> int:
        """The ranks the launch had, as its rows say (the largest, should it have changed)."""
        return max(run.world_size for run in self.runs)

    @property
    def ranks(self) -> int:
        """How many of its ranks the store holds."""
        return len({run.rank for run in self.runs})

    @property
    def held(self) -> str:
        """``3 of 4 ranks`` (``, 5 runs`` where a rank has several)."""
        text = f"{self.ranks} of {self.world_size} rank{'s' * (self.world_size != 1)}"
        return text + (f", {len(self.runs)} runs" if len(self.runs) != self.ranks else "")


def launches(runs: list[Run]) -> list[Launch | Run]:
    """``runs`` (in id order) with the ranks of each multi-rank launch (``world_size`` over 1)
    gathered into one ``Launch`` where its first run was; single-rank runs stay as they are.

    Runs sharing a ``launch_id`` are one launch until a rank comes back in another process:
    a launcher may give every launch one id (torchrun's static rendezvous names each by its
    ``MASTER_ADDR:MASTER_PORT``), so that run begins the id's next launch (as does each
    attempt of a launch whose ranks torchrun restarted)."""
    items: list[Run | list[Run]] = []
    current: dict[str, list[Run]] = {}
    count: dict[str, int] = {}
    for run in runs:
        if run.world_size == 1 or run.launch_id is None:
            items.append(run)
            continue
        group = current.get(run.launch_id)
        if group is None or any(r.rank == run.rank and (r.host, r.pid) != (run.host, run.pid) for r in group):
            group = current[run.launch_id] = []
            items.append(group)
            count[run.launch_id] = count.get(run.launch_id, 0) + 1
        group.append(run)
    return [item if isinstance(item, Run) else _launch(item, count) for item in items]


def _launch(runs: list[Run], count: dict[str, int]) -> Launch:
    """The launch of ``runs`` (by id), named ``<launch_id>@run<N>`` where its id names several."""
    first = runs[0]
    assert first.launch_id is not None
    name = first.launch_id if count[first.launch_id] == 1 else f"{first.launch_id}@run{first.id}"
    return Launch(name, sorted(runs, key=lambda run: (run.rank, run.id)))


@dataclass(frozen=True)
class Series:
    """One signal of one run, in step order."""

    name: str
    steps: list[int]
    wall_times: list[float]
    values: list[float]


@dataclass(frozen=True)
class PostmortemRow:
    """One row of ``postmortems`` without its body (``StoreReader.postmortem_body``)."""

    id: int
    run_id: int | None
    backend_pid: int
    host: str
    vanished_at: float
    """When the backend died, s since the epoch."""
    written_at: float
    records: int
    read_at: float | None
    """When it was read; None while it waits."""


class StoreReader:
    """A read-only view of a store; ``FileNotFoundError`` if there is none at ``path``,
    ``sqlite3.DatabaseError`` if it is not a run store."""

    def __init__(self, path: str) -> None:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no run store at {path}")
        self.path = path
        self.db = schema.connect(path, readonly=True, timeout=1.0)

    def runs(self) -> list[Run]:
        return [decode_run(row) for row in self.db.execute(f"SELECT {RUN_COLUMNS} FROM runs ORDER BY id")]

    def run(self, run_id: int | None = None) -> Run:
        """Run ``run_id``, or the newest; ``LookupError`` if there is none."""
        query = f"SELECT {RUN_COLUMNS} FROM runs " + (
            "WHERE id = ?" if run_id is not None else "ORDER BY id DESC LIMIT 1"
        )
        row = self.db.execute(query, () if run_id is None else (run_id,)).fetchone()
        if row is None:
            raise LookupError(
                f"{self.path} has no run {run_id}" if run_id is not None else f"{self.path} has no runs"
            )
        return decode_run(row)

    def launch(self, prefix: str) -> Launch:
        """The launch whose id is ``prefix`` or starts with it (a single-rank run's own launch
        too, as a ``Launch`` of one run); ``LookupError`` naming the store's multi-rank
        launches when none or several match."""
        grouped = launches(self.runs())
        found = [item for item in grouped if isinstance(item, Launch)]
        alone = [Launch(run.launch_id, [run]) for run in grouped if isinstance(run, Run) and run.launch_id]
        candidates = found + alone
        exact = [launch for launch in candidates if launch.id == prefix]
        matching = exact or [launch for launch in candidates if launch.id.startswith(prefix)]
        if len(matching) == 1:
            return matching[0]
        listed = "; ".join(f"{printable(launch.id)} ({launch.held})" for launch in found) or "none"
        what = "several launches start with" if matching else "no launch starts with"
        raise LookupError(f"{self.path}: {what} {printable(prefix)!r}; its multi-rank launches: {listed}")

    def names(self, run_id: int) -> list[str]:
        """Signal names the run logged, sorted."""
        rows = self.db.execute(
            "SELECT name FROM signal_names WHERE id IN (SELECT DISTINCT name_id FROM points WHERE run_id = ?)"
            " ORDER BY name",
            (run_id,),
        )
        return [name for (name,) in rows]

    def series(self, run_id: int, name: str) -> Series:
        rows = self.db.execute(
            "SELECT step, wall_time, value FROM points WHERE run_id = ?"
            " AND name_id = (SELECT id FROM signal_names WHERE name = ?) ORDER BY step, wall_time",
            (run_id, name),
        ).fetchall()
        return Series(name, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])

    def resource_points(self, run_id: int) -> list[tuple[str, int, float, float | None]]:
        """Every resource point of a run: (name, step, wall time, value), in no set order."""
        return self.db.execute(
            "SELECT n.name, p.step, p.wall_time, p.value FROM points AS p"
            " JOIN signal_names AS n ON n.id = p.name_id WHERE p.run_id = ? AND n.name LIKE 'resource/%'",
            (run_id,),
        ).fetchall()

    def counts(self, run_id: int) -> tuple[int, int | None]:
        """(resource samples recorded, last step logged) of a run."""
        (samples,) = self.db.execute(
            "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM points WHERE run_id = ?"
            " AND name_id IN (SELECT id FROM signal_names WHERE name LIKE 'resource/%') GROUP BY name_id)",
            (run_id,),
        ).fetchone()
        (last,) = self.db.execute("SELECT MAX(step) FROM points WHERE run_id = ?", (run_id,)).fetchone()
        return int(samples), last

    def energy_joules(self, run_id: int) -> float | None:
        """The energy the run's GPUs used while it was recorded (J): each GPU's energy
        counter from its first record to its last, summed; None where no GPU counted it."""
        (total,) = self.db.execute(
            "SELECT SUM(used) FROM (SELECT MAX(p.value) - MIN(p.value) AS used FROM points AS p"
            " JOIN signal_names AS n ON n.id = p.name_id"
            " WHERE p.run_id = ? AND n.name GLOB ? GROUP BY p.name_id)",
            (run_id, ENERGY_GLOB),
        ).fetchone()
        return None if total is None else float(total)

    def postmortems(self, unread_only: bool = False) -> list[PostmortemRow]:
        """The store's postmortems (all, or those not read yet), oldest death first."""
        rows = self.db.execute(
            f"SELECT {_POSTMORTEM_COLUMNS} FROM postmortems"
            + (" WHERE read_at IS NULL" if unread_only else "")
            + " ORDER BY vanished_at, id"
        )
        return [PostmortemRow(*row) for row in rows]

    def postmortem_body(self, postmortem_id: int) -> str:
        """A postmortem's JSON lines (``sampler.child.postmortem``); ``LookupError`` if none."""
        row = self.db.execute("SELECT body FROM postmortems WHERE id = ?", (postmortem_id,)).fetchone()
        if row is None:
            raise LookupError(f"{self.path} has no postmortem {postmortem_id}")
        return str(row[0])

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


RUN_COLUMNS = (
    "id, started_at, ended_at, updated_at, host, pid, command, config, version, stats,"
    " rank, local_rank, world_size, local_world_size, launch_id"
)
"""The columns of ``runs`` that ``decode_run`` reads, in its order."""
_POSTMORTEM_COLUMNS = "id, run_id, backend_pid, host, vanished_at, written_at, records, read_at"


def decode_run(row: sqlite3.Row | tuple[Any, ...]) -> Run:
    """A ``Run`` from a row of ``SELECT RUN_COLUMNS FROM runs``."""
    run_id, started, ended, updated, host, pid, command, config, version, stats = row[:10]
    rank, local_rank, world_size, local_world_size, launch_id = row[10:]
    return Run(
        id=run_id,
        started_at=started,
        ended_at=ended,
        updated_at=updated,
        host=host,
        pid=pid,
        command=json.loads(command),
        config=json.loads(config),
        version=version,
        stats=json.loads(stats) if stats else None,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        launch_id=launch_id,
    )
