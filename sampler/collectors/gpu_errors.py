"""Which GPU devices an NVML error has stopped reading: said, counted, and carried to the next child.

A device stops reading when every reading of a sample fails with an NVML error (a driver upgraded
under the running job answers LIB_RM_VERSION_MISMATCH to everything; a GPU off the bus, GPU_IS_LOST),
or when a sampling child cannot open a device an earlier child read (``nvmlInit`` fails in a
restarted child). Each stop and each recovery is said once, naming the error and the device; a
device that keeps flapping is said at most once per ``FLAP_SECONDS`` after its first stop and first
recovery, with how many times it stopped meanwhile. The counts reach ``stats()`` and the metrics
endpoint through the child's status block (``GpuHealth.words``); what the next child must know (the
devices read so far, those stopped) reaches it through ``Sources`` (``carry``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType

from sampler import catalogue

log = logging.getLogger("sampler")

FLAP_SECONDS = 60.0
"""After a device's first stop and first recovery are said, at most one line about it per this many
seconds."""
MASK_BITS = 63
"""Devices the status block's mask names, by position: a stopped device after them is counted but
not carried, and the next child says it again if it still fails."""
NAMED = 8
"""Devices a line names; it counts the others (a host full of MIG devices stays one readable line)."""
NO_DRIVER = frozenset({9, 12})
"""nvmlInit's NVML_ERROR_DRIVER_NOT_LOADED and NVML_ERROR_LIBRARY_NOT_FOUND: a machine without
NVIDIA's driver, where there is nothing wrong to say."""
HINTS = {
    18: "the NVIDIA kernel driver and its NVML library differ in version, as after a driver upgrade "
    "under a running job; it lasts until the driver is reloaded or the machine rebooted",
}
"""What an NVML error usually means, where its name does not say."""


def error_name(nvml: ModuleType | None, code: int) -> str:
    """``NVML_ERROR_<NAME> (<code>)`` as the binding names ``code``, else ``NVML error <code>``."""
    names = [
        name
        for name, value in vars(nvml or object).items()
        if name.startswith("NVML_ERROR_") and isinstance(value, int) and value == code
    ]
    return f"{names[0]} ({code})" if names else f"NVML error {code}"


def gpu_labels(fields: Sequence[str]) -> tuple[str, ...]:
    """The device labels of ``resource/gpu/<label>/...`` among ``fields``, in their order."""
    prefix = catalogue.GPU_NAME_PREFIX
    found = (name.removeprefix(prefix).split("/")[0] for name in fields if name.startswith(prefix))
    return tuple(dict.fromkeys(label for label in found if catalogue.DEVICE_LABEL.fullmatch(label)))


def carry(
    read: tuple[str, ...], fields: Sequence[str], mask: int
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """What the next child is told after one whose ring had ``fields`` (every device it was told
    of among them) and whose status block's mask was ``mask``: the devices read so far (``read``
    and the ring's new ones, the order ``GpuHealth`` gives the mask) and those of them last said
    to have stopped; None when the ring had no GPU (the child died first, or has none), which
    leaves what was known."""
    labels = gpu_labels(fields)
    if not labels:
        return None
    read = (*read, *(label for label in labels if label not in read))
    return read, tuple(label for k, label in enumerate(read[:MASK_BITS]) if mask >> k & 1)


@dataclass
class _Device:
    uuid: str = ""
    stopped: bool = False
    code: int | None = None
    """The NVML error that stopped it last; None where it is not known (stopped in an earlier child)."""
    said_stopped: bool = False
    """What the latest line about it said."""
    said_at: float = -math.inf
    lines: int = 0
    held: int = 0
    """Stops since the latest line about it."""


class GpuHealth:
    """The devices of one sampling child (or of the backend thread), whether each reads, what was
    said of it, and the stops counted. ``read_before`` and ``stopped_before``: ``Sources.gpus_read``
    and ``Sources.gpus_stopped``, what earlier children left (those last said to have stopped
    start stopped, and are not said again unless they read in between)."""

    def __init__(
        self, nvml: ModuleType | None, read_before: Sequence[str] = (), stopped_before: Iterable[str] = ()
    ) -> None:
        self._nvml = nvml
        self._devices = {label: _Device() for label in read_before}
        for label in stopped_before:
            if label in self._devices:
                self._devices[label].stopped = self._devices[label].said_stopped = True
        self.stops = 0
        """Times a device's readings stopped here (a flapping device counts each stop)."""

    def add(self, label: str, uuid: str) -> None:
        """A device this child opened (in sampling order)."""
        self._devices.setdefault(label, _Device()).uuid = uuid

    @property
    def not_reading(self) -> int:
        return sum(device.stopped for device in self._devices.values())

    def words(self) -> tuple[int, int, int]:
        """For the status block: devices not reading, those last said to have stopped (bit k:
        the k-th of ``read_before`` then of those added; what the next child must not say again,
        a flap held back included), and the stops counted."""
        devices = list(self._devices.values())[:MASK_BITS]
        mask = sum(1 << k for k, device in enumerate(devices) if device.said_stopped)
        return self.not_reading, mask, self.stops

    def unopened(self, labels: Sequence[str], why: str, code: int | None) -> None:
        """``labels``, read by an earlier child, cannot be opened here, ``why`` (``code``: the
        NVML error, where one). Said once for them all, but for those an earlier child said
        had stopped."""
        now = time.monotonic()
        unsaid = [label for label in labels if not self._devices[label].said_stopped]
        for label in labels:
            device = self._devices[label]
            if not device.stopped:
                self.stops += 1
            device.stopped, device.code = True, code
        for label in unsaid:
            device = self._devices[label]
            device.said_stopped, device.said_at, device.lines = True, now, device.lines + 1
        if unsaid:
            it, they = ("it", "it is") if len(unsaid) == 1 else ("them", "they are")
            log.warning(
                "resource monitor: %s, which an earlier sampling child read, stopped reading: this child "
                "cannot open %s (%s%s); %s tried again, and stats()['gpus_not_reading'] counts %s",
                self._names(unsaid),
                it,
                why,
                _hint(code),
                they,
                it,
            )

    def refused(self, what: str, why: str, code: int | None) -> None:
        """``what`` (NVML, or a GPU this monitor never read) cannot be opened as this child starts,
        ``why`` (``code``: the NVML error, where one): said and counted."""
        self.stops += 1
        log.warning(
            "resource monitor: %s cannot be opened (%s%s); it is not read, and stats()['gpu_errors'] "
            "counts it",
            what,
            why,
            _hint(code),
        )

    def judge(self, verdicts: dict[str, int | None]) -> None:
        """Each device's latest sample: the NVML error that stopped every reading of it, None
        when it read. Says what is due: a stop, a recovery, or how often a device flapped."""
        now = time.monotonic()
        for label, code in verdicts.items():
            device = self._devices[label]
            if code is not None:
                if not device.stopped:
                    self.stops += 1
                    device.held += 1
                device.code = code
            device.stopped = code is not None
        due: dict[tuple[bool, int | None], list[str]] = {}
        for label in verdicts:
            device = self._devices[label]
            if device.stopped == device.said_stopped and not device.held:
                continue
            if device.lines >= 2 and now - device.said_at < FLAP_SECONDS:
                continue  # flapping: held back, and counted in the next line
            due.setdefault((device.stopped, device.code), []).append(label)
        for (stopped, code), labels in due.items():
            self._say(labels, stopped, code, now)

    def _say(self, labels: list[str], stopped: bool, code: int | None, now: float) -> None:
        flaps = [
            f"{self._names([label])} stopped {n} times"
            for label in labels
            if (n := self._devices[label].held) > (1 if stopped else 0)
        ]
        since = f"; since the previous message {', '.join(flaps)}" if flaps else ""
        names = self._names(labels)
        if stopped:
            error = "an NVML error" if code is None else error_name(self._nvml, code)
            it, they = ("it", "it is") if len(labels) == 1 else ("them", "they are")
            log.warning(
                "resource monitor: %s stopped reading: every reading of %s fails with %s%s; the other "
                "readings go on, %s probed again, and stats()['gpus_not_reading'] counts %s%s",
                names,
                it,
                error,
                _hint(code),
                they,
                it,
                since,
            )
        else:
            log.warning(
                "resource monitor: %s %s reading again%s", names, "is" if len(labels) == 1 else "are", since
            )
        for label in labels:
            device = self._devices[label]
            device.said_stopped, device.said_at, device.lines, device.held = stopped, now, device.lines + 1, 0

    def _names(self, labels: Sequence[str]) -> str:
        """``GPU 0 (GPU-...)``, ``GPU 0 and GPU 1``, ``GPU 0, GPU 1 and GPU 2``; past
        ``NAMED`` devices, ``..., GPU 7 and 5 more GPUs``."""
        named = [
            f"GPU {label}" + (f" ({uuid})" if (uuid := self._devices[label].uuid) else "")
            for label in labels[:NAMED]
        ]
        if len(labels) > NAMED:
            named.append(f"{len(labels) - NAMED} more GPUs")
        return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"


def _hint(code: int | None) -> str:
    hint = HINTS.get(code) if code is not None else None
    return f" ({hint})" if hint else ""
