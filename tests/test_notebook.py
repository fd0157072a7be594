"""The monitor in a real notebook: cells executed by a real IPython kernel (nbclient, ipykernel),
run again, and the kernel restarted or killed under a running monitor."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import nbformat
import psutil
import pytest
from conftest import gone, wait_for
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbformat import NotebookNode

from sampler.supervision.spawn import is_sampling_child

USAGE = Path(__file__).resolve().parent.parent / "docs" / "usage.md"


def notebook_cells() -> list[str]:
    """The Python blocks of docs/usage.md's "In a notebook" section, in order: start, train, stop."""
    section = USAGE.read_text().split("\n## In a notebook\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def printed(cell: NotebookNode) -> list[str]:
    """The lines a cell showed: its streams, results and errors."""
    lines: list[str] = []
    for out in cell.outputs:
        if out.output_type == "stream":
            lines += out.text.splitlines()
        elif out.output_type == "error":
            lines += [f"{out.ename}: {out.evalue}"]
        else:
            lines += str(out.get("data", {}).get("text/plain", "")).splitlines()
    return lines


class Kernel:
    """A real kernel running cells one at a time, in ``cwd``."""

    def __init__(self, client: NotebookClient) -> None:
        self.client = client
        self.count = 0

    def run(self, source: str) -> list[str]:
        """Execute ``source`` as the notebook's next cell: the lines it printed."""
        cell = nbformat.v4.new_code_cell(source)
        self.client.nb.cells.append(cell)
        self.client.execute_cell(cell, self.count)
        self.count += 1
        return printed(cell)

    @property
    def pid(self) -> int:
        pid = self.client.km.provisioner.pid  # type: ignore[union-attr]
        assert isinstance(pid, int)
        return pid

    def sampling_children(self) -> list[int]:
        """The kernel's sampling children now running."""
        found = []
        for child in psutil.Process(self.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE and is_sampling_child(child.cmdline()):
                    found.append(child.pid)
        return found

    def leftovers(self) -> tuple[set[int], set[str]]:
        """Everything the kernel's run could leave: its descendants and the named shared memory
        they and the kernel hold (mapped or open)."""
        procs = [psutil.Process(self.pid), *psutil.Process(self.pid).children(recursive=True)]
        segments = set()
        for proc in procs:
            with contextlib.suppress(OSError):
                maps = Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
                segments |= {line.split(None, 5)[5] for line in maps if "/dev/shm/" in line}
            with contextlib.suppress(OSError):
                fds = os.listdir(f"/proc/{proc.pid}/fd")
                for fd in fds:
                    with contextlib.suppress(OSError):
                        target = os.readlink(f"/proc/{proc.pid}/fd/{fd}")
                        if target.startswith("/dev/shm/"):
                            segments.add(target)
        names = {s.removesuffix(" (deleted)") for s in segments}
        return {p.pid for p in procs}, names


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    nb = nbformat.v4.new_notebook()
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with client.setup_kernel():  # the environment conftest's ``hermetic`` left: no WL_ variables
        yield Kernel(client)


def assert_nothing_left(pids: set[int], segments: set[str]) -> None:
    wait_for(lambda: all(gone(pid) for pid in pids), what="the kernel and its children to end")
    assert not [s for s in segments if os.path.exists(s)], f"shared memory left: {segments}"


def runs(store: Path) -> list[tuple[int, object]]:
    """(pid, ended_at) of each run in the store."""
    with contextlib.closing(sqlite3.connect(store)) as db:
        return db.execute("SELECT pid, ended_at FROM runs ORDER BY id").fetchall()


def test_the_documented_cells_run_again_and_a_restart_leave_one_monitor_then_none(
    kernel: Kernel, tmp_path: Path
) -> None:
    start, train, stop = notebook_cells()
    assert kernel.run(start) == []
    first = wait_for(kernel.sampling_children, what="the first monitor's child")
    again = kernel.run(start)  # the cell run again: one monitor, said in one line
    assert len(again) == 1 and "replaces" in again[0], again
    second = wait_for(kernel.sampling_children, what="the second monitor's child")
    assert len(second) == 1 and second != first
    assert kernel.run(train) == []
    assert kernel.run(stop) == []
    wait_for(lambda: not kernel.sampling_children(), what="the children to end at stop()")
    ended = runs(tmp_path / "runs.sqlite")
    assert len(ended) == 2 and all(pid == kernel.pid and end is not None for pid, end in ended), ended

    assert kernel.run(start) == []  # running again, then the kernel restarted under it
    wait_for(kernel.sampling_children, what="the third monitor's child")
    pids, segments = kernel.leftovers()
    run_sync(kernel.client.km.restart_kernel)()  # a shutdown request, then a fresh kernel
    assert_nothing_left(pids, segments)
    assert kernel.run("import sampler; print(sampler.get_resource_monitor())") == ["None"]


def test_the_process_wide_monitor_run_again_stopped_and_killed_with_its_kernel(
    kernel: Kernel, tmp_path: Path
) -> None:
    start = "import sampler\nmon = sampler.start_resource_monitor_from_config()"
    setup = f"import os\nos.environ['WL_RESOURCE_MONITOR_STORE'] = {str(tmp_path / 'runs.sqlite')!r}"
    assert kernel.run(setup) == []
    assert kernel.run(start) == []
    first = wait_for(kernel.sampling_children, what="the monitor's child")
    assert kernel.run(start) == []  # run again: the same monitor keeps running
    assert kernel.run("mon is sampler.get_resource_monitor() and mon.running") == ["True"]
    assert kernel.sampling_children() == first

    # Stopped through its handle, then the cell run again: a monitor runs again.
    assert kernel.run("mon.stop()") == []
    wait_for(lambda: not kernel.sampling_children(), what="the child to end at stop()")
    assert kernel.run(start) == []
    assert kernel.run("mon.running") == ["True"]
    # The explicit form beside it, with the same store: it replaces the process-wide one.
    explicit = f"other = sampler.ResourceMonitor(store={str(tmp_path / 'runs.sqlite')!r}).start()"
    lines = kernel.run(explicit)
    assert len(lines) == 1 and "replaces" in lines[0], lines
    assert kernel.run("mon.running, other is sampler.get_resource_monitor()") == ["(False, True)"]
    wait_for(lambda: len(kernel.sampling_children()) == 1, what="one sampling child")

    pids, segments = kernel.leftovers()
    run_sync(kernel.client.km.shutdown_kernel)(now=True)  # killed: no atexit, no stop()
    assert_nothing_left(pids, segments)
