"""Which GPUs a monitor samples: ``gpu_devices`` (``all``, ``visible`` as CUDA
reads ``CUDA_VISIBLE_DEVICES``, or NVML indices and GPU/MIG UUIDs) matched
against the devices the driver reports, and each rank's share of them."""

from __future__ import annotations

import functools
import logging
import os
from types import ModuleType
from typing import Any

from sampler.collectors.base import attempt
from sampler.settings.placement import whole_number
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")


def choose(
    nvml: ModuleType,
    handles: dict[int, Any],
    devices: str | tuple[str, ...],
    errors: tuple[type[BaseException], ...],
) -> tuple[list[int], dict[int, set[int]]]:
    """NVML indices of the devices ``devices`` names, in its order (CUDA's for
    ``visible``), each once; one warning names the entries that match none. And for a
    GPU chosen only through MIG devices (their UUIDs), its index -> the slots of those; a
    GPU chosen whole (``all``, its index or UUID) is absent: all its MIG devices are sampled."""
    if devices == "all":
        return list(handles), {}
    uuids = Uuids(nvml, handles, errors)
    if devices == "visible":
        raw = os.environ.get("CUDA_VISIBLE_DEVICES")
        if raw is None:  # unset: CUDA sees every device
            return list(handles), {}
        chosen, ignored = _visible(raw, uuids)
        entries = raw.split(",")
        entries = entries[: len(entries) - len(ignored)]  # CUDA reads no further than that
        if ignored:
            _warn_unmatched(
                f"CUDA_VISIBLE_DEVICES={bounded_repr(raw)}: {bounded_repr(ignored[0].strip(), 50)} matches "
                f"no GPU here; as CUDA does, it and the {len(ignored) - 1} entries after it are ignored",
                handles,
                chosen,
            )
    else:
        entries = list(devices)
        found = {entry: uuids.index(entry) for entry in devices}
        chosen = [index for index in found.values() if index is not None]
        unmatched = [bounded_repr(entry.strip(), 50) for entry, index in found.items() if index is None]
        if unmatched:
            shown = ", ".join(unmatched[:8]) + (", ..." if len(unmatched) > 8 else "")
            _warn_unmatched(f"gpu_devices: {shown} match no GPU here and are skipped", handles, chosen)
    return list(dict.fromkeys(chosen)), _mig_only(uuids, entries)


def _mig_only(uuids: Uuids, entries: list[str]) -> dict[int, set[int]]:
    """The GPUs ``entries`` choose through MIG devices alone -> those devices' slots."""
    whole: set[int] = set()
    slots: dict[int, set[int]] = {}
    for entry in entries:
        found = uuids.mig(entry)
        if found is not None:
            slots.setdefault(found[0], set()).add(found[1])
        elif (index := uuids.index(entry)) is not None:
            whole.add(index)
    return {index: chosen for index, chosen in slots.items() if index not in whole}


def mig_devices(nvml: ModuleType, handle: Any, errors: tuple[type[BaseException], ...]) -> dict[int, Any]:
    """The MIG devices of a GPU in MIG mode (read only: nothing is changed), slot -> handle;
    empty for a GPU not in MIG mode, without MIG, or a binding without the calls."""
    mode = _call(nvml, "nvmlDeviceGetMigMode", errors, handle)
    if not mode or not mode[0]:
        return {}
    found: dict[int, Any] = {}
    for slot in range(_call(nvml, "nvmlDeviceGetMaxMigDeviceCount", errors, handle) or 0):
        mig = _call(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", errors, handle, slot)
        if mig is not None:  # an empty slot answers NOT_FOUND
            found[slot] = mig
    return found


def _call(nvml: ModuleType, name: str, errors: tuple[type[BaseException], ...], *args: Any) -> Any:
    """``nvml.<name>(*args)``, or None when it fails or the binding lacks it."""
    function = getattr(nvml, name, None)
    return None if function is None else attempt(functools.partial(function, *args), errors)


def owned(chosen: list[int], local_rank: int, local_world_size: int, *, one_each: bool = False) -> list[int]:
    """The part of ``chosen`` (in CUDA order) local rank ``local_rank`` samples
    when local rank 0 takes the host's share: each rank owns the device at its
    local rank's position (the one ``torch.cuda.set_device(local_rank)``
    picks); rank 0 also takes the devices no rank owns. ``one_each``: the
    launcher made one device visible to each rank, which is that rank's own."""
    if one_each:
        return chosen
    if local_rank > 0:
        return chosen[local_rank : local_rank + 1]
    return [index for position, index in enumerate(chosen) if not 0 < position < local_world_size]


def _warn_unmatched(problem: str, handles: dict[int, Any], chosen: list[int]) -> None:
    log.warning(
        "resource monitor: %s (NVML reports indices 0-%d; an entry is an NVML index, or a GPU-, MIG- or "
        "MIG-GPU- UUID, or a prefix of exactly one)%s",
        problem,
        max(handles),
        "" if chosen else "; no GPU is sampled",
    )


def _visible(raw: str, uuids: Uuids) -> tuple[list[int], list[str]]:
    """The devices ``CUDA_VISIBLE_DEVICES=raw`` leaves visible, and the entries
    ignored from the first that matches no device on (CUDA stops there; an
    empty value hides every device on purpose: nothing is unmatched)."""
    chosen: list[int] = []
    entries = raw.split(",")
    for position, entry in enumerate(entries):
        index = uuids.index(entry)
        if index is None:
            return chosen, entries[position:] if raw.strip() else []
        chosen.append(index)
    return chosen, []


class Uuids:
    """Finds the NVML index a device entry names: an index, a GPU UUID, a MIG
    device's UUID (its parent GPU), the legacy ``MIG-GPU-<uuid>/<gi>/<ci>``, or
    a prefix of exactly one UUID, as CUDA accepts them. Numeric entries are
    taken as NVML indices, which are CUDA's when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    or the GPUs are all of one model."""

    def __init__(
        self, nvml: ModuleType, handles: dict[int, Any], errors: tuple[type[BaseException], ...]
    ) -> None:
        self._nvml = nvml
        self._handles = handles
        self._errors = errors

    def index(self, entry: str) -> int | None:
        text = entry.strip().lower()
        number = whole_number(text)
        if number is not None:
            return number if number in self._handles else None
        if text.startswith("mig-gpu-"):
            text = text[len("mig-") :].split("/", 1)[0]
        if text.startswith("gpu-"):
            table = self._gpus
        elif text.startswith("mig-"):
            table = self._migs
        else:
            return None
        matches = [index for uuid, index in table.items() if uuid.startswith(text)]
        return matches[0] if len(matches) == 1 else None

    @functools.cached_property
    def _gpus(self) -> dict[str, int]:
        """UUID (lower case) of each GPU -> its index."""
        found = ((self._uuid(handle), index) for index, handle in self._handles.items())
        return {uuid: index for uuid, index in found if uuid is not None}

    def mig(self, entry: str) -> tuple[int, int] | None:
        """(parent GPU's index, slot) of the MIG device ``entry`` names by its UUID (or a
        prefix of exactly one); None for anything else."""
        text = entry.strip().lower()
        if not text.startswith("mig-") or text.startswith("mig-gpu-"):
            return None
        matches = [place for uuid, place in self._mig_places.items() if uuid.startswith(text)]
        return matches[0] if len(matches) == 1 else None

    @functools.cached_property
    def _migs(self) -> dict[str, int]:
        """UUID (lower case) of each MIG device -> its parent GPU's index."""
        return {uuid: index for uuid, (index, _) in self._mig_places.items()}

    @functools.cached_property
    def _mig_places(self) -> dict[str, tuple[int, int]]:
        """UUID (lower case) of each MIG device -> (its parent GPU's index, its slot)."""
        found: dict[str, tuple[int, int]] = {}
        for index, handle in self._handles.items():
            for slot, mig in mig_devices(self._nvml, handle, self._errors).items():
                uuid = self._uuid(mig)
                if uuid is not None:
                    found[uuid] = (index, slot)
        return found

    def _uuid(self, handle: Any) -> str | None:
        uuid = uuid_of(self._nvml, handle, self._errors)
        return None if uuid is None else uuid.lower()


def uuid_of(nvml: ModuleType, handle: Any, errors: tuple[type[BaseException], ...]) -> str | None:
    """The device's UUID as NVML spells it, or None when it does not tell."""
    function = getattr(nvml, "nvmlDeviceGetUUID", None)
    uuid = None if function is None else attempt(functools.partial(function, handle), errors)
    if isinstance(uuid, bytes):  # older pynvml releases return bytes
        uuid = uuid.decode("ascii", "replace")
    return uuid if isinstance(uuid, str) else None


def nvml_errors(nvml: ModuleType) -> tuple[type[BaseException], ...]:
    """What an NVML call may legitimately raise: the binding's ``NVMLError``
    (driver, device or support problems), its ``NVMLLibraryMismatchError``
    (a driver older than the binding) and ``OSError``."""
    found = (getattr(nvml, "NVMLError", None), getattr(nvml, "NVMLLibraryMismatchError", None))
    return (*(e for e in found if isinstance(e, type) and issubclass(e, BaseException)), OSError)
