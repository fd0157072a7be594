"""Critical XID errors, as NVML's event API delivers them, waited for in a thread of the
sampling child's own (never the backend's: a wait stuck in the driver must cost nothing there).

An XID is the driver's code for a GPU fault (79: the GPU fell off the bus, 48: a double-bit
ECC error, 13 and 43: a kernel fault); NVML marks the ones that need attention as critical.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from types import ModuleType
from typing import Any

from sampler.collectors.base import attempt
from sampler.util.ratelimit import RateLimitedWarning

log = logging.getLogger("sampler")

WAIT_MS = 250
"""How long one wait for an event lasts: the thread sees a close this soon."""
NVML_ERROR_TIMEOUT = 10
XID_CRITICAL = 0x8
"""``nvmlEventTypeXidCriticalError``."""
EVENT_API = ("nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2", "nvmlEventSetFree")


class XidWatch:
    """Waits on the critical-XID events of ``handles`` (device label -> handle) and keeps,
    per device, the latest XID since ``take()`` last asked. ``open`` gives None where the
    binding or the driver has no event API, or no device supports the event."""

    def __init__(
        self,
        nvml: ModuleType,
        event_set: Any,
        handles: dict[str, Any],
        errors: tuple[type[BaseException], ...],
    ) -> None:
        self._nvml = nvml
        self._set = event_set
        self._errors = errors
        self._index = {_address(handle): index for index, handle in handles.items()}
        self.watched = tuple(handles)
        """The labels of the devices whose events are waited for."""
        self._latest: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._said = RateLimitedWarning()
        self._thread = threading.Thread(target=self._wait, name="wl-nvml-xid", daemon=True)
        self._thread.start()

    @classmethod
    def open(
        cls, nvml: ModuleType, handles: dict[str, Any], errors: tuple[type[BaseException], ...]
    ) -> XidWatch | None:
        if not all(hasattr(nvml, name) for name in EVENT_API):
            return None
        event_set = attempt(nvml.nvmlEventSetCreate, errors)
        if event_set is None:
            return None
        registered = {
            index: handle
            for index, handle in handles.items()
            if attempt(functools.partial(_register, nvml, handle, event_set), errors)
        }
        if not registered:
            attempt(functools.partial(nvml.nvmlEventSetFree, event_set), errors)
            return None
        return cls(nvml, event_set, registered, errors)

    @property
    def watching(self) -> bool:
        """Events are still waited for (the wait has not failed)."""
        return self._thread.is_alive()

    def take(self) -> dict[str, int]:
        """Device label -> the latest critical XID since the previous call (devices without one: absent)."""
        with self._lock:
            latest, self._latest = self._latest, {}
        return latest

    def _wait(self) -> None:
        nvml = self._nvml
        while not self._closing.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, WAIT_MS)
            except self._errors as exc:
                if getattr(exc, "value", None) == NVML_ERROR_TIMEOUT:
                    continue
                log.warning(
                    "resource monitor: waiting for GPU XID events failed (%s); XIDs are no longer watched",
                    exc,
                )
                return
            if not int(data.eventType) & XID_CRITICAL:
                continue
            index = self._index.get(_address(data.device))
            if index is None:
                continue
            xid = int(data.eventData)
            with self._lock:
                self._latest[index] = xid
            self._said.warn("resource monitor: GPU %s reported critical XID %d", index, xid)

    def close(self) -> None:
        """Stop waiting (within ``WAIT_MS``) and free the event set; before NVML shuts down."""
        self._closing.set()
        self._thread.join(timeout=4 * WAIT_MS / 1000)
        if not self._thread.is_alive():  # a wait stuck in the driver keeps the set it waits on
            attempt(functools.partial(self._nvml.nvmlEventSetFree, self._set), self._errors)


def _register(nvml: ModuleType, handle: Any, event_set: Any) -> bool:
    nvml.nvmlDeviceRegisterEvents(handle, XID_CRITICAL, event_set)
    return True


def _address(handle: Any) -> int | None:
    """What a device handle points at: the handle NVML puts in an event is another object."""
    return ctypes.cast(handle, ctypes.c_void_p).value
