"""Parsers of what is sampled: the categories on, and the GPUs chosen."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sampler.catalogue import DEFAULT_CATEGORIES
from sampler.settings.parsers import Invalid, Remark, flag
from sampler.settings.placement import MAX_DIGITS, whole_number
from sampler.util.quoting import bounded_repr

GPU_DEVICE_MODES: tuple[str, ...] = ("all", "visible")
KNOWN = ", ".join(DEFAULT_CATEGORIES)


def category(name: object) -> str | None:
    """The category ``name`` refers to (any case, surrounding blanks ignored), or None."""
    if isinstance(name, str):
        key = name.strip().lower()
        if key in DEFAULT_CATEGORIES:
            return key
    return None


def describe_unknown(names: list[object]) -> str:
    """``unknown categories 'a', 'b'; known: ...``, naming at most five."""
    shown = ", ".join(bounded_repr(name, 30) for name in names[:5]) + (", ..." if len(names) > 5 else "")
    return f"unknown {'category' if len(names) == 1 else 'categories'} {shown}; known: {KNOWN}"


def categories_from_text(text: str, remark: Remark) -> dict[str, bool]:
    """A comma-separated allowlist (any case); blank means all.

    Raises ``Invalid`` when it names no known category, and, with the known
    ones as ``usable``, when it names unknown ones besides.
    """
    if not text.strip():
        return dict.fromkeys(DEFAULT_CATEGORIES, True)
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    return allowlist(entries, "a comma-separated list of")


def allowlist(entries: list[str], expected: str) -> dict[str, bool]:
    """Only the categories ``entries`` name (any case) on. Raises ``Invalid``
    when they name no known category, and, with the known ones as ``usable``,
    when they name unknown ones besides."""
    known = {category(entry) for entry in entries} - {None}
    if not known:
        raise Invalid(f"names no known category; expected {expected} {KNOWN}")
    enabled = {name: name in known for name in DEFAULT_CATEGORIES}
    unknown: list[object] = [entry for entry in entries if category(entry) is None]
    if unknown:
        raise Invalid(describe_unknown(unknown), usable=enabled)
    return enabled


def categories_from_list(raw: object, remark: Remark) -> dict[str, bool]:
    """The YAML list form ``[cpu, process]``: only these, read as the env var
    reads its allowlist (unknown names besides known ones: the known ones
    apply); an empty list turns every category off, as the Python API does."""
    if not isinstance(raw, list) or not all(isinstance(entry, str) for entry in raw):
        kind = type(raw).__name__ if not isinstance(raw, list) else "a list holding other things"
        expected = "expected a list of category names such as [cpu, process]"
        raise Invalid(f"{expected}, got {kind}", wrong_type=True)
    if not raw:
        return dict.fromkeys(DEFAULT_CATEGORIES, False)
    return allowlist(raw, "a list of")


def categories(raw: object, remark: Remark) -> dict[str, bool]:
    """None (all), an iterable of names (an allowlist), or a mapping name ->
    flag (a bool or a word as the env vars read it), whose unlisted names are off."""
    if raw is None:
        return dict.fromkeys(DEFAULT_CATEGORIES, True)
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Iterable):
        raise Invalid(
            "expected a list of category names such as ['cpu', 'gpu'], a mapping name -> bool, "
            f"or None; got {type(raw).__name__}",
            wrong_type=True,
        )
    names: list[object] = list(raw)
    unknown = [name for name in names if category(name) is None]
    if unknown:
        raise Invalid(describe_unknown(unknown))
    enabled: set[str | None] = set()
    for name in names:
        try:
            on = flag(raw[name]) if isinstance(raw, Mapping) else True
        except Invalid as exc:
            raise Invalid(f"{bounded_repr(name, 30)}: {exc}", wrong_type=exc.wrong_type) from None
        if on:
            enabled.add(category(name))
    return {name: name in enabled for name in DEFAULT_CATEGORIES}


def show_categories(value: Mapping[str, bool]) -> str:
    return ",".join(name for name in DEFAULT_CATEGORIES if value[name]) or "none"


_GPU_DEVICES_EXPECTED = "expected all, visible, or a list of device indices or UUIDs"


def _gpu_device_entry(entry: object) -> str:
    """One explicit device: a non-negative index, or a UUID (``GPU-...``, ``MIG-...``)."""
    if isinstance(entry, bool) or not isinstance(entry, (int, str)):
        raise Invalid(
            f"{_GPU_DEVICES_EXPECTED}; got an entry of type {type(entry).__name__}", wrong_type=True
        )
    if isinstance(entry, int):
        if 0 <= entry < 10**MAX_DIGITS:
            return str(entry)
    elif whole_number(entry) is not None or entry.strip().upper().startswith(("GPU-", "MIG-")):
        return entry.strip()
    raise Invalid(f"{_GPU_DEVICES_EXPECTED}; {bounded_repr(entry, 40)} is neither an index nor a UUID")


def gpu_devices(raw: object, remark: Remark) -> str | tuple[str, ...]:
    """``all``, ``visible`` (honour ``CUDA_VISIBLE_DEVICES``), or the devices
    listed (indices or UUIDs; text is comma-separated)."""
    if isinstance(raw, str):
        word = raw.strip().lower()
        if word in GPU_DEVICE_MODES:
            return word
        raw = [entry for entry in raw.split(",") if entry.strip()]
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = [raw]
    if isinstance(raw, Iterable) and not isinstance(raw, (str, bytes, Mapping)):
        raw = list(raw)  # a generator or a range from the Python API
    if not isinstance(raw, list):
        raise Invalid(f"{_GPU_DEVICES_EXPECTED}, got {type(raw).__name__}", wrong_type=True)
    if not raw:
        raise Invalid(f"{_GPU_DEVICES_EXPECTED}; got an empty list")
    return tuple(dict.fromkeys(_gpu_device_entry(entry) for entry in raw))


def show_gpu_devices(value: str | tuple[str, ...]) -> str:
    return value if isinstance(value, str) else ",".join(value)
