"""The sampling child's watch for a stalled run: the stall rule (``sampler.child.stall``) fed
once per record from the status block, and, off the sampling loop, each stall's evidence taken
(``sampler.child.capture``), said in one warning and written to the run store's ``stalls``
table, then closed with its duration when the step moves again.

The child writes the record itself because the backend may be unable to: its GIL held, or its
process frozen. For the same reason the warning of a backend whose monitor thread takes no
record goes straight to stderr (the backend's, which the child shares); any other goes through
the log pipe to the backend's ``sampler`` logger.
"""

from __future__ import annotations

import array
import fcntl
import json
import logging
import math
import queue
import socket
import sqlite3
import termios
import threading
import time
from collections.abc import Sequence

from sampler import catalogue
from sampler.child.capture import Evidence, capture, main_frames
from sampler.child.postmortem_write import say
from sampler.child.stall import Lasting, Resumed, Stall, StallDetector
from sampler.ipc.channel import ChildParams, StackTarget
from sampler.ipc.status import ChildStatus
from sampler.store import schema

log = logging.getLogger("sampler")

STORE_TIMEOUT_SECONDS = 2.0
"""How long a stall's write waits for the store's lock at each try (the sampling loop never waits
on it: the writes run on the watch's own thread)."""
STORE_TRIES = 4
STORE_RETRY_SECONDS = 1.0
"""Tries of a stall's write while another process holds the store locked, and the pause between
them: about 11 s in all, then the write is given up, and said."""
FROZEN_NOT_TAKEN = 2
"""Records the monitor thread left untaken at a stall's detection that say the backend cannot
log the warning itself."""
GPU_STATE = (
    catalogue.GPU_UTILIZATION,
    catalogue.GPU_POWER,
    catalogue.GPU_POWER_LIMIT,
    catalogue.GPU_SM_ACTIVITY,
)
"""What a stall keeps of each GPU from the record it was seen at: a collective hang reads as
busy (utilization) at idle power, its SMs idle."""
GpuState = list[dict[str, object]]
"""Per GPU: ``gpu`` (its label) and each ``GPU_STATE`` suffix it read (NaN: left out)."""


def gpu_fields(fields: Sequence[str]) -> list[tuple[int, str, str]]:
    """Where each GPU's ``GPU_STATE`` readings sit in a record of ``fields``: (index, device
    label, suffix), by device."""
    wanted = {signal.key for signal in GPU_STATE}
    found = []
    for index, name in enumerate(fields):
        reading = catalogue.lookup(name)
        if reading is not None and not reading.variant and reading.signal.key in wanted:
            found.append((index, reading.device, reading.signal.suffix))
    return sorted(found, key=lambda where: catalogue.device_order(where[1]))


def gpu_state(where: list[tuple[int, str, str]], values: Sequence[float]) -> GpuState:
    """Each GPU's ``GPU_STATE`` in one record's ``values``, laid out as ``gpu_fields`` found."""
    by_device: dict[str, dict[str, object]] = {}
    for index, device, suffix in where:
        entry = by_device.setdefault(device, {"gpu": device})
        if index < len(values) and not math.isnan(values[index]):
            entry[suffix] = values[index]
    return list(by_device.values())


def not_taken(wake_fd: int) -> int:
    """Records the backend's monitor thread has not taken yet: the wake-up bytes (one per record)
    still in the pipe, asked of its write end."""
    count = array.array("i", [0])
    try:
        fcntl.ioctl(wake_fd, termios.FIONREAD, count)
    except OSError:
        return 0
    return count[0]


class StallWatch:
    """One per child; ``feed`` once per record, from the sampling loop."""

    def __init__(
        self, params: ChildParams, target: StackTarget, memfd: int | None, wake_fd: int, status: ChildStatus
    ) -> None:
        self.params = params
        self.status = status
        self.target = target
        self.memfd = memfd
        self.wake_fd = wake_fd
        self.detector = StallDetector(params.settings.stall_seconds, params.settings.interval_seconds)
        self.gpus: list[tuple[int, str, str]] = []
        """Where each GPU's state sits in a record (``gpu_fields``); empty: no GPU sampled."""
        self._events: queue.SimpleQueue[tuple[Stall | Lasting | Resumed, float, GpuState]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._row: int | None = None
        """The open stall's row in the store."""
        self._threads: list[dict[str, object]] = []
        self._notes: list[str] = []
        """The open stall's kernel states and notes, over all its captures so far."""
        self._frames: list[str] = []
        """The open stall's main thread's innermost frames, once captured."""
        self._values: Sequence[float] = ()
        """The latest record's readings, for the GPUs of a stall seen between records."""
        self._store_failed = False
        self.last: Evidence | None = None
        """The latest stall's evidence (for tests and benches in the child)."""

    def take_over(self) -> None:
        """At the start of a child: the stall its backend's run left open in the store, if any (a
        child killed or restarted during it), is watched as this child's own, so that it is closed,
        with its duration, when the step moves again, not left lasting until the run ended."""
        store, target = self._store(), self.params.postmortem
        if store is None or target is None:
            return
        try:
            db = schema.connect(store, readonly=True, timeout=STORE_TIMEOUT_SECONDS)
            try:
                row = db.execute(
                    "SELECT id, kind, step, started_at, detected_after, timeout, stacks, notes FROM stalls"
                    " WHERE backend_pid = ? AND host = ? AND ended_at IS NULL AND run_id = (SELECT id FROM"
                    " runs WHERE started_at = ? AND host = ? AND pid IN (?, ?) ORDER BY id DESC LIMIT 1)"
                    " ORDER BY id DESC LIMIT 1",
                    (self.params.backend_pid, socket.gethostname(), target.started_at, socket.gethostname(),
                     self.params.sources.pid, self.params.backend_pid),
                ).fetchone()  # fmt: skip
            finally:
                db.close()
        except (sqlite3.Error, OSError) as exc:  # no store or no table yet: nothing was left open
            log.debug("resource monitor: no open stall read from %s (%s)", store, exc)
            return
        if row is None:
            return
        row_id, kind, step, started_at, detected_after, timeout, stacks, notes = row
        since = time.monotonic() - (time.time() - started_at)
        stall = Stall(kind, step, since, since + detected_after, timeout, 0)
        self.detector.watch(stall)
        self._row, self._frames = row_id, main_frames(stacks or "")
        self._notes = [str(note) for note in json.loads(notes or "[]")] + [
            "the sampling child watching it was restarted during it: its end is when the next one saw"
            " the step move"
        ]

    def open_since(self) -> float | None:
        """When the open stall's step stopped moving (monotonic s), None while none is open (for
        the endpoint's thread: one read of the detector's current stall)."""
        current = self.detector.current
        return None if current is None else current.since

    def open_stall(self) -> dict[str, object] | None:
        """The open stall as a postmortem's header keeps it (``sampler.child.postmortem``), None
        while none is open (for the watchdog's thread, as the backend dies)."""
        current = self.detector.current
        if current is None:
            return None
        ago = time.monotonic() - current.since
        return {
            "kind": current.kind,
            "step": current.step,
            "started_at": round(time.time() - ago, 6),
            "detected_after": round(current.waited, 6),
            "timeout": current.timeout,
            "main_frames": list(self._frames),
            "stall_id": self._row,
        }

    def feed(self, now: float, step: int, values: Sequence[float] | None = None) -> None:
        """A view at ``now`` (monotonic s): the step the backend last logged, and the readings
        of the record about to be written (laid out as ``gpus`` says), or None between records
        (a stall seen then keeps the last record's GPUs)."""
        record = values is not None
        if values is not None:
            self._values = values
        event = self.detector.observe(now, step, not_taken(self.wake_fd), record)
        if event is None:
            return
        gpus = gpu_state(self.gpus, self._values) if isinstance(event, Stall) else []
        self._events.put((event, time.time(), gpus))
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="stall-watch", daemon=True)
            self._thread.start()

    def _serve(self) -> None:
        while True:
            event, wall, gpus = self._events.get()
            if isinstance(event, Stall):
                self._open(event, wall, gpus)
            elif isinstance(event, Lasting):
                self._again(event)
            else:
                self._close(event, wall)

    def _open(self, stall: Stall, wall: float, gpus: GpuState) -> None:
        evidence = self._capture()
        self.last = evidence
        self._threads, self._notes = evidence.thread_rows(stall.waited), list(evidence.notes)
        self._frames = main_frames(evidence.stacks or "")
        started_at = wall - stall.waited
        store = self._store()
        if store is not None:
            self._row = self._write(
                store,
                "INSERT INTO stalls (run_id, backend_pid, host, kind, step, started_at, detected_after,"
                " timeout, stacks, threads, notes, gpus) VALUES ((SELECT id FROM runs WHERE started_at = ?"
                " AND host = ? AND pid IN (?, ?) ORDER BY id DESC LIMIT 1), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (self.params.postmortem.started_at if self.params.postmortem else None, socket.gethostname(),
                 self.params.backend_pid, self.params.sources.pid, self.params.backend_pid,
                 socket.gethostname(), stall.kind, stall.step, started_at, stall.waited, stall.timeout,
                 evidence.stacks, json.dumps(self._threads), json.dumps(self._notes),
                 json.dumps(gpus) if gpus else None),
            )  # fmt: skip
        message = self._message(stall, evidence, store)
        if stall.kind == "monitor" or stall.not_taken >= FROZEN_NOT_TAKEN:
            say(message.removeprefix("resource monitor: "))
        else:
            log.warning("%s", message)

    def _again(self, lasting: Lasting) -> None:
        """Capture a stall that lasts once more, after what was taken before."""
        evidence = self._capture()
        self.last = evidence
        self._threads += evidence.thread_rows(lasting.waited)
        self._notes += [note for note in evidence.notes if note not in self._notes]
        store = self._store()
        if store is None or self._row is None:
            return
        again = None
        if evidence.stacks is not None:
            again = f"=== again, {lasting.waited:.0f} s into the stall\n{evidence.stacks}"
        self._write(
            store,
            "UPDATE stalls SET stacks = COALESCE(stacks || char(10) || ?, ?, stacks), threads = ?, notes = ?"
            " WHERE id = ?",
            (again, again, json.dumps(self._threads), json.dumps(self._notes), self._row),
        )

    def _close(self, resumed: Resumed, wall: float) -> None:
        stall = resumed.stall
        store = self._store()
        if store is not None and self._row is not None:
            self._write(
                store,
                "UPDATE stalls SET ended_at = started_at + ?, duration = ?, notes = ? WHERE id = ?",
                (resumed.duration, resumed.duration, json.dumps(self._notes), self._row),
            )
        self._row, self._frames = None, []
        log.info(
            "resource monitor: the run moves again after standing %.1f s at step %d",
            resumed.duration,
            stall.step,
        )

    def _capture(self) -> Evidence:
        return capture(self.params.backend_pid, self.target, self.memfd, self.status.handler_replaced())

    def _message(self, stall: Stall, evidence: Evidence, store: str | None) -> str:
        if stall.kind == "monitor":
            what = (
                f"the backend's monitor thread has left a record untaken for {stall.untaken_for:.1f} s "
                f"(another thread holds the GIL, or the process is frozen); the step stands at {stall.step} "
                f"for {stall.waited:.0f} s"
            )
        else:
            what = (
                f"the run has made no step for {stall.waited:.0f} s (it stands at step {stall.step}; "
                f"the stall timeout is {stall.timeout:.0f} s)"
            )
        frames = main_frames(evidence.stacks or "")
        where = "; the main thread is in " + " <- ".join(frames) if frames else ""
        if not frames:
            where = "; no Python stack: " + "; ".join(evidence.notes) if evidence.notes else ""
        then = f". Every thread's stack: python -m sampler stalls {store}" if store else ""
        return (
            f"resource monitor: {what}{where}. A long evaluation or checkpoint between steps reads as a "
            f"stall too, and its stack then shows it{then}"
        )

    def _store(self) -> str | None:
        target = self.params.postmortem
        return None if target is None or self._store_failed else target.store

    def _write(self, store: str, sql: str, values: tuple[object, ...]) -> int | None:
        """Run one statement on the store; its row id. A store another process holds locked is
        tried again, ``STORE_TRIES`` times in all; any other failure ends the recording."""
        for attempt in range(1, STORE_TRIES + 1):
            try:
                db = schema.connect(store, timeout=STORE_TIMEOUT_SECONDS)
                try:
                    return int(db.execute(sql, values).lastrowid or 0)
                finally:
                    db.close()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc):
                    self._fail(store, exc)
                    return None
                if attempt == STORE_TRIES:
                    waited = STORE_TRIES * STORE_TIMEOUT_SECONDS + (STORE_TRIES - 1) * STORE_RETRY_SECONDS
                    say(
                        f"cannot record a stall in the run store {store}: another process held it locked "
                        f"for {waited:.0f} s; this stall's record there is incomplete or missing"
                    )
                    return None
                time.sleep(STORE_RETRY_SECONDS)
            except (sqlite3.Error, OSError) as exc:
                self._fail(store, exc)
                return None
        return None

    def _fail(self, store: str, exc: Exception) -> None:
        self._store_failed = True
        say(f"cannot record a stall in the run store {store} ({exc}); stalls go unrecorded there")
