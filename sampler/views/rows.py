"""One compact row per sample, for ``python -m sampler run``: a header naming the
columns that the first sample has readings for, then a row per sample, each
under 100 columns with one GPU. The columns: system CPU, memory and disk %,
network MiB/s received and sent, the backend's CPU % (100 per core) and RSS in
MiB, the process tree's processes and CPU %, the cgroup's memory %, and per GPU
its utilization and memory %."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sampler import catalogue
from sampler.catalogue import GPU_NAME_PREFIX as GPU
from sampler.catalogue import MIB, PREFIX


@dataclass(frozen=True)
class Column:
    """One column: the signal it shows (without ``resource/``), its header, and
    the factor from the signal's unit to the one shown."""

    key: str
    header: str
    scale: float = 1.0
    decimals: int = 0


COLUMNS = (
    Column(catalogue.CPU_UTILIZATION.key, "cpu%"),
    Column(catalogue.MEMORY_USED.key, "mem%"),
    Column(catalogue.DISK_FULL.key, "disk%"),
    Column(catalogue.NETWORK_RECEIVED_RATE.key, "rxMiB/s", 1 / MIB, 2),
    Column(catalogue.NETWORK_SENT_RATE.key, "txMiB/s", 1 / MIB, 2),
    Column(catalogue.PROCESS_CPU.key, "proc%"),
    Column(catalogue.PROCESS_RSS.key, "rssMiB"),
    Column(catalogue.TREE_PROCESSES.key, "procs"),
    Column(catalogue.TREE_CPU.key, "tree%"),
    Column(catalogue.CONTAINER_MEMORY_PERCENT.key, "cgmem%"),
)
GPU_COLUMNS = (
    Column(catalogue.GPU_UTILIZATION.suffix, "%"),
    Column(catalogue.GPU_MEMORY_PERCENT.suffix, "mem%"),
)
"""Per GPU: what follows ``gpu/<i>/`` in the shown signals' names."""
STEP_WIDTH = 7


class Rows:
    """Formats samples. The columns are those with readings so far: a column that
    first has one later (a rate, from the second sample on) brings a new header."""

    def __init__(self) -> None:
        self.columns: list[tuple[str, Column, str]] = []
        """(the signal's full name, its column, the header shown), in order."""

    def lines(self, step: int, sample: Mapping[str, float]) -> list[str]:
        """The row of ``sample``, after a header when the columns grew."""
        wanted = self._choose(sample)
        if [name for name, _, _ in wanted] == [name for name, _, _ in self.columns]:
            return [self.row(step, sample)]
        self.columns = wanted
        return [self.header(), self.row(step, sample)]

    def _choose(self, sample: Mapping[str, float]) -> list[tuple[str, Column, str]]:
        known = {name for name, _, _ in self.columns} | set(sample)
        chosen = [(PREFIX + c.key, c, c.header) for c in COLUMNS if PREFIX + c.key in known]
        devices = sorted(
            {name.removeprefix(GPU).split("/")[0] for name in known if name.startswith(GPU)},
            key=catalogue.device_order,
        )
        for device in devices:
            for column in GPU_COLUMNS:
                name = f"{GPU}{device}/{column.key}"
                if name in known:
                    chosen.append((name, column, f"gpu{device}{column.header}"))
        return chosen

    def header(self) -> str:
        cells = [f"{'step':<{STEP_WIDTH}}"] + [f"{shown:>{_width(shown)}}" for _, _, shown in self.columns]
        return " ".join(cells)

    def row(self, step: int, sample: Mapping[str, float]) -> str:
        """One sample under the header (``-`` where a reading is missing)."""
        cells = [f"{step:<{STEP_WIDTH}}"]
        for name, column, shown in self.columns:
            value = sample.get(name)
            text = "-" if value is None else f"{value * column.scale:.{column.decimals}f}"
            cells.append(f"{text:>{_width(shown)}}")
        return " ".join(cells)


def _width(header: str) -> int:
    return max(len(header), 5)
