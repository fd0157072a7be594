"""Resolve the monitor's configuration: defaults, then env vars, then the YAML file.

One table, ``FIELDS``, describes every setting once: its YAML key, env var,
command-line flag, default, parsers and help. A parser raises ``Invalid`` for a
value it cannot use, and reports a value it uses but not as given (an interval
clamped to the floor or the ceiling, a disk path that does not exist yet)
through its ``remark`` callback. Each front end decides what ``Invalid`` means:

- env vars and the YAML file (``load_resource_monitoring_config``): one warning
  on the ``sampler`` logger naming the variable or file, the key, the value
  (quoted bounded) and what is used instead; the key keeps its env-var or
  default value. Resolution never raises.
- the Python API (``resolve_api_settings``): ``TypeError`` or ``ValueError``.
- the command line (``sampler.commands``): an argparse error.

A remark is one warning everywhere.

``resolve_config`` is the full answer: the values, where each came from
(``sources``), the files looked for and the one used, and every warning
emitted while resolving (``warnings``), as ``python -m sampler config`` shows them.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
import numbers
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sampler.settings.placement import DEFAULT_HOST_SAMPLING, HOST_SAMPLING_MODES, MAX_DIGITS, whole_number
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

DEFAULT_CATEGORIES: tuple[str, ...] = (
    "cpu",
    "memory",
    "gpu",
    "disk",
    "network",
    "process",
    "process_tree",
    "container",
)
STEP_SOURCES: tuple[str, ...] = ("model_age", "seconds")
DEFAULT_STEP_SOURCE = "model_age"
DEFAULT_INTERVAL_SECONDS = 15.0
MIN_INTERVAL_SECONDS = 1.0
MAX_INTERVAL_SECONDS = 86400.0
"""One day, the longest interval: a longer one samples too rarely to plot, and a far longer one
(1e12 s) overflows the monitor thread's ``select()`` timeout."""
DEFAULT_DISK_PATH = os.path.abspath(os.sep)  # "/" or "C:\\"

CONFIG_FILE_NAME = "resource_monitoring.yaml"
SECTION = "resource_monitoring"
MAX_CONFIG_FILE_BYTES = 64 * 1024
"""A larger config file is ignored with a warning: PyYAML's pure-Python loader takes about 10 s
per MiB of hostile input (measured), and the documented example is 2 KiB."""

ENV_DISABLE = "WEIGHTSLAB_DISABLE_RESOURCE_MONITORING"
ENV_INTERVAL = "WL_RESOURCE_MONITOR_INTERVAL_SECONDS"
ENV_CATEGORIES = "WL_RESOURCE_MONITOR_CATEGORIES"
ENV_DISK_PATH = "WL_RESOURCE_MONITOR_DISK_PATH"
ENV_STEP_SOURCE = "WL_RESOURCE_MONITOR_STEP_SOURCE"
ENV_CONFIG_PATH = "WL_RESOURCE_MONITOR_CONFIG_PATH"
ENV_STORE = "WL_RESOURCE_MONITOR_STORE"
ENV_INNER_RATE = "WL_RESOURCE_MONITOR_INNER_RATE_HZ"
ENV_GPU_DEVICES = "WL_RESOURCE_MONITOR_GPU_DEVICES"
ENV_POSTMORTEM_DIR = "WL_RESOURCE_MONITOR_POSTMORTEM_DIR"
ENV_PROMETHEUS_PORT = "WL_RESOURCE_MONITOR_PROMETHEUS_PORT"
ENV_PROMETHEUS_ADDRESS = "WL_RESOURCE_MONITOR_PROMETHEUS_ADDRESS"
ENV_PROMETHEUS_SD_DIR = "WL_RESOURCE_MONITOR_PROMETHEUS_SD_DIR"
ENV_HOST_SAMPLING = "WL_RESOURCE_MONITOR_HOST_SAMPLING"
ENV_RUN_ID = "WL_RESOURCE_MONITOR_RUN_ID"

DEFAULT_INNER_RATE_HZ = 10.0
MIN_INNER_RATE_HZ = 1.0
MAX_INNER_RATE_HZ = 50.0
"""How often the child reads the fast-moving signals between records, for their
peaks and means: above 50 Hz the child's own CPU grows with no curve the better."""
GPU_DEVICE_MODES: tuple[str, ...] = ("all", "visible")
DEFAULT_POSTMORTEM_DIR = os.path.join(".resource_monitor", "postmortems")
"""Where a postmortem goes when no run store is configured, relative to the
working directory the monitor was started from."""

DEFAULT_PROMETHEUS_ADDRESS = "127.0.0.1"
"""Metrics can tell what runs on a host: the endpoint is local unless asked otherwise."""
MAX_PORT = 65535
MAX_RUN_ID = 128

DEFAULT_SOURCE = "built-in default"
"""How ``Resolution.sources`` names a value no env var or file set."""
IGNORED_SUFFIX = ".yml"
"""A config file named with this suffix is never read; one found where the lookup looks gets a warning."""

API_SOURCE = "ResourceMonitor"
"""How warnings name the Python API as the source of a value."""

_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("0", "false", "no", "off")
_WORDS = "1/true/yes/on or 0/false/no/off"
_KNOWN = ", ".join(DEFAULT_CATEGORIES)
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_EVERY_KEY = "using env vars and defaults for every key"


class Invalid(ValueError):
    """A value a field cannot use; ``str()`` says why.

    ``wrong_type``: the value is of the wrong kind, not merely out of range.
    ``usable``: the part that can still be used, when only some of the value
    is bad (an allowlist naming unknown categories besides known ones), for the
    front ends that accept a partial value; None when nothing is usable.
    ``soft``: the value is well formed but cannot be used now (a store whose
    directory does not exist); the Python API then warns and uses the field's
    default instead of raising.
    """

    def __init__(
        self, reason: str, *, wrong_type: bool = False, usable: object = None, soft: bool = False
    ) -> None:
        super().__init__(reason)
        self.wrong_type = wrong_type
        self.usable = usable
        self.soft = soft


Remark = Callable[[str], None]
"""Told, as text that follows the value in a warning, about a value used but not as given."""
Parser = Callable[[Any, Remark], Any]


_collected: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "sampler_config_warnings", default=None
)
"""The warnings of the ``resolve_config`` call running in this context, or None."""
_logging: contextvars.ContextVar[bool] = contextvars.ContextVar("sampler_config_logging", default=True)


def _warning(message: str) -> None:
    """Log ``message`` on the ``sampler`` logger, and keep it for the resolution running, if any."""
    collected = _collected.get()
    if collected is not None:
        collected.append(message)
    if _logging.get():
        log.warning("%s", message)


def warn(where: str, raw: object, text: str) -> None:
    """One warning about the value ``raw`` found at ``where`` (an env var,
    ``file: key``, a flag); ``text`` says what is wrong and what is used."""
    _warning(f"resource monitor: {where}={bounded_repr(raw)} {text}")


# --------------------------------------------------------------------------- parsers


def parse_seconds(raw: object) -> float:
    """A finite number of seconds > 0, from a real number (not a bool) or its text.

    A finite number beyond the float range (``10**400``, ``"1e400"``) counts as
    the largest float. Raises ``Invalid``.
    """
    if isinstance(raw, bool) or not isinstance(raw, (numbers.Real, str)):
        raise Invalid(f"expected a number of seconds, got {type(raw).__name__}", wrong_type=True)
    try:
        value = float(raw)
        overflowed = isinstance(raw, str) and math.isinf(value) and "inf" not in raw.lower()
    except ValueError:
        raise Invalid("not a number") from None
    except OverflowError:  # an int or a fraction beyond the float range
        value, overflowed = (-1.0 if isinstance(raw, numbers.Real) and raw < 0 else 1.0), True
    if overflowed:
        value = math.copysign(sys.float_info.max, value)
    if not math.isfinite(value) or value <= 0:
        raise Invalid("expected a finite number of seconds > 0")
    return value


def _interval(raw: object, remark: Remark, floor: float = MIN_INTERVAL_SECONDS) -> float:
    """Seconds between samples from a number or its text, clamped to
    [``floor``, ``MAX_INTERVAL_SECONDS``] with a remark."""
    seconds = parse_seconds(raw)
    if seconds < floor:
        remark(f"is below the {floor:g} s floor; using interval_seconds={float(floor)!r} instead")
        return float(floor)
    if seconds > MAX_INTERVAL_SECONDS:
        ceiling = MAX_INTERVAL_SECONDS
        remark(f"is above the {ceiling:g} s (one day) ceiling; using interval_seconds={ceiling!r} instead")
        return ceiling
    return seconds


def _word(text: str) -> bool:
    """A boolean word as the env vars read it: 1/true/yes/on or 0/false/no/off, any case."""
    word = text.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise Invalid(f"expected {_WORDS}")


def _flag(raw: object) -> bool:
    """A YAML or API boolean: a bool, or a word as the env vars read it."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        return _word(raw)
    raise Invalid(f"expected true or false, got {type(raw).__name__}", wrong_type=True)


def _enabled_from_disable_var(text: str, remark: Remark) -> bool:
    """``WEIGHTSLAB_DISABLE_RESOURCE_MONITORING``: a true word disables; blank or a false word does not."""
    return not _word(text) if text.strip() else True


def _enabled(raw: object, remark: Remark) -> bool:
    return _flag(raw)


def _category(name: object) -> str | None:
    """The category ``name`` refers to (any case, surrounding blanks ignored), or None."""
    if isinstance(name, str):
        key = name.strip().lower()
        if key in DEFAULT_CATEGORIES:
            return key
    return None


def _unknown(names: list[object]) -> str:
    """``unknown categories 'a', 'b'; known: ...``, naming at most five."""
    shown = ", ".join(bounded_repr(name, 30) for name in names[:5]) + (", ..." if len(names) > 5 else "")
    return f"unknown {'category' if len(names) == 1 else 'categories'} {shown}; known: {_KNOWN}"


def _categories_from_text(text: str, remark: Remark) -> dict[str, bool]:
    """A comma-separated allowlist (any case); blank means all.

    Raises ``Invalid`` when it names no known category, and, with the known
    ones as ``usable``, when it names unknown ones besides.
    """
    if not text.strip():
        return dict.fromkeys(DEFAULT_CATEGORIES, True)
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    return _allowlist(entries, "a comma-separated list of")


def _allowlist(entries: list[str], expected: str) -> dict[str, bool]:
    """Only the categories ``entries`` name (any case) on. Raises ``Invalid``
    when they name no known category, and, with the known ones as ``usable``,
    when they name unknown ones besides."""
    known = {_category(entry) for entry in entries} - {None}
    if not known:
        raise Invalid(f"names no known category; expected {expected} {_KNOWN}")
    enabled = {name: name in known for name in DEFAULT_CATEGORIES}
    unknown: list[object] = [entry for entry in entries if _category(entry) is None]
    if unknown:
        raise Invalid(_unknown(unknown), usable=enabled)
    return enabled


def _categories_from_list(raw: object, remark: Remark) -> dict[str, bool]:
    """The YAML list form ``[cpu, process]``: only these, read as the env var
    reads its allowlist (unknown names besides known ones: the known ones
    apply); an empty list turns every category off, as the Python API does."""
    if not isinstance(raw, list) or not all(isinstance(entry, str) for entry in raw):
        kind = type(raw).__name__ if not isinstance(raw, list) else "a list holding other things"
        expected = "expected a list of category names such as [cpu, process]"
        raise Invalid(f"{expected}, got {kind}", wrong_type=True)
    if not raw:
        return dict.fromkeys(DEFAULT_CATEGORIES, False)
    return _allowlist(raw, "a list of")


def _categories(raw: object, remark: Remark) -> dict[str, bool]:
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
    unknown = [name for name in names if _category(name) is None]
    if unknown:
        raise Invalid(_unknown(unknown))
    enabled: set[str | None] = set()
    for name in names:
        try:
            on = _flag(raw[name]) if isinstance(raw, Mapping) else True
        except Invalid as exc:
            raise Invalid(f"{bounded_repr(name, 30)}: {exc}", wrong_type=exc.wrong_type) from None
        if on:
            enabled.add(_category(name))
    return {name: name in enabled for name in DEFAULT_CATEGORIES}


def _show_categories(value: Mapping[str, bool]) -> str:
    return ",".join(name for name in DEFAULT_CATEGORIES if value[name]) or "none"


def _disk_path(raw: object, remark: Remark) -> str:
    """A non-empty path (str or ``os.PathLike``), made absolute. One that does
    not exist (yet) is kept, with a remark."""
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if not isinstance(raw, str):
        raise Invalid(f"expected a path, got {type(raw).__name__}", wrong_type=True)
    if not raw.strip():
        raise Invalid("expected a non-empty path")
    if "\0" in raw:
        raise Invalid("a path cannot contain a NUL character")
    path = os.path.abspath(raw)
    if not os.path.exists(path) and (path not in _reported_missing or _collected.get() is not None):
        # Once per path outside a resolution (which reports all it finds): the same path passes
        # through the config and then the API.
        _reported_missing.add(path)
        remark(
            "does not exist (yet); keeping it: the disk usage readings are skipped until it appears "
            "(the disk I/O counters keep flowing)"
        )
    return path


_reported_missing: set[str] = set()


def _step_source(raw: object, remark: Remark) -> str:
    """One of ``STEP_SOURCES``, any case."""
    if not isinstance(raw, str):
        raise Invalid(f"expected one of {', '.join(STEP_SOURCES)}, got {type(raw).__name__}", wrong_type=True)
    value = raw.strip().lower()
    if value not in STEP_SOURCES:
        raise Invalid(f"expected one of {', '.join(STEP_SOURCES)}")
    return value


_STORE_EXPECTED = "expected the path of a SQLite file, or false/null for no store"


def _optional_path(raw: object, expected: str) -> str | None:
    """A path made absolute, or None for None, False or a false word (as the
    env vars read it). A true word is refused: it is no path (``./true``
    names a file of that name)."""
    if raw is None or raw is False:
        return None
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if not isinstance(raw, str):
        raise Invalid(f"{expected}, got {type(raw).__name__}", wrong_type=True)
    word = raw.strip().lower()
    if word in _FALSE_WORDS:
        return None
    if word in _TRUE_WORDS:
        raise Invalid(f"{expected} (write ./{raw.strip()} for a path of that name)")
    if not word:
        raise Invalid(f"{expected}; got an empty path")
    if "\0" in raw:
        raise Invalid("a path cannot contain a NUL character")
    return os.path.abspath(raw)


def _store(raw: object, remark: Remark) -> str | None:
    """None (no store), or the path of the run store's SQLite file, made
    absolute, in a directory that exists."""
    path = _optional_path(raw, _STORE_EXPECTED)
    if path is None:
        return None
    if os.path.isdir(path):
        raise Invalid("is a directory; expected the path of a SQLite file", soft=True)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise Invalid(f"its directory {bounded_repr(parent)} does not exist", soft=True)
    return path


def _store_from_text(text: str, remark: Remark) -> str | None:
    """An env var's or a flag's store: blank means none (an empty env var is as if unset)."""
    return _store(text, remark) if text.strip() else None


def _inner_rate(raw: object, remark: Remark) -> float:
    """Hz of the child's reads between records, clamped to [``MIN_INNER_RATE_HZ``, ``MAX_INNER_RATE_HZ``]."""
    if isinstance(raw, bool) or not isinstance(raw, (numbers.Real, str)):
        raise Invalid(f"expected a rate in Hz, got {type(raw).__name__}", wrong_type=True)
    try:
        hz = float(raw)
    except (ValueError, OverflowError):
        raise Invalid("not a number") from None
    if not math.isfinite(hz) or hz <= 0:
        raise Invalid("expected a finite rate in Hz > 0")
    clamped = min(max(hz, MIN_INNER_RATE_HZ), MAX_INNER_RATE_HZ)
    if clamped != hz:
        remark(
            f"is outside [{MIN_INNER_RATE_HZ:g}, {MAX_INNER_RATE_HZ:g}] Hz; "
            f"using inner_rate_hz={clamped!r} instead"
        )
    return clamped


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


def _gpu_devices(raw: object, remark: Remark) -> str | tuple[str, ...]:
    """``all``, ``visible`` (honour ``CUDA_VISIBLE_DEVICES``), or the devices
    listed (indices or UUIDs; text is comma-separated)."""
    if isinstance(raw, str):
        word = raw.strip().lower()
        if word in GPU_DEVICE_MODES:
            return word
        raw = [entry for entry in raw.split(",") if entry.strip()]
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = [raw]
    if not isinstance(raw, (list, tuple)):
        raise Invalid(f"{_GPU_DEVICES_EXPECTED}, got {type(raw).__name__}", wrong_type=True)
    if not raw:
        raise Invalid(f"{_GPU_DEVICES_EXPECTED}; got an empty list")
    return tuple(dict.fromkeys(_gpu_device_entry(entry) for entry in raw))


def _show_gpu_devices(value: str | tuple[str, ...]) -> str:
    return value if isinstance(value, str) else ",".join(value)


def _directory(raw: object, remark: Remark) -> str | None:
    """A directory (made absolute; created when first written), or None
    (false/off) for none."""
    path = _optional_path(raw, "expected a directory, or false for none")
    if path is not None and os.path.exists(path) and not os.path.isdir(path):
        raise Invalid("exists and is not a directory", soft=True)
    return path


_OFF_WORDS = tuple(word for word in _FALSE_WORDS if word != "0")
"""The false words but 0, which names a port (one the endpoint cannot take), not "none"."""


def _port(raw: object, remark: Remark) -> int | None:
    """A TCP port (1..65535) in plain digits, or None (null, false, blank text or a false word but
    ``0``: false/no/off) for no endpoint."""
    if raw is None or raw is False:
        return None
    if isinstance(raw, str):
        word = raw.strip().lower()
        if not word or word in _OFF_WORDS:
            return None
        number = whole_number(word)
        if number is None:
            raise Invalid(f"expected a port number (1..{MAX_PORT}), or false/off for none")
        raw = number
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise Invalid(f"expected a port number, got {type(raw).__name__}", wrong_type=True)
    if not 1 <= raw <= MAX_PORT:
        raise Invalid(f"expected a port number in 1..{MAX_PORT}, or false/off for none")
    return raw


def _address(raw: object, remark: Remark) -> str:
    """The address the endpoint binds: a host name or an IP address."""
    if not isinstance(raw, str):
        raise Invalid(f"expected a host name or IP address, got {type(raw).__name__}", wrong_type=True)
    text = raw.strip()
    if not text or not text.isprintable() or any(c.isspace() for c in text) or len(text) > 255:
        raise Invalid("expected a host name or IP address such as 127.0.0.1 or 0.0.0.0")
    return text


def _host_sampling(raw: object, remark: Remark) -> str:
    """One of ``HOST_SAMPLING_MODES``, any case."""
    if not isinstance(raw, str):
        raise Invalid(
            f"expected one of {', '.join(HOST_SAMPLING_MODES)}, got {type(raw).__name__}", wrong_type=True
        )
    value = raw.strip().lower()
    if value not in HOST_SAMPLING_MODES:
        raise Invalid(f"expected one of {', '.join(HOST_SAMPLING_MODES)}")
    return value


def _run_id(raw: object, remark: Remark) -> str | None:
    """Printable text of at most ``MAX_RUN_ID`` characters, or None (blank) for the launcher's."""
    if raw is None:
        return None
    if not isinstance(raw, (str, int)) or isinstance(raw, bool):
        raise Invalid(f"expected text, got {type(raw).__name__}", wrong_type=True)
    text = str(raw).strip()
    if not text:
        return None
    if len(text) > MAX_RUN_ID or not text.isprintable():
        raise Invalid(f"expected printable text of at most {MAX_RUN_ID} characters")
    return text


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Field:
    """One setting, described once for every front end."""

    key: str
    """Key in the YAML section and in the resolved dict."""
    env: str | None
    """Environment variable, or None."""
    flag: str | None
    """Flag of ``python -m sampler run``, or None."""
    default: Any
    from_text: Parser
    """Reads an env var's or a flag's text."""
    from_value: Parser
    """Reads a Python API argument, and a YAML value (but for categories, whose
    YAML form is a mapping of per-category flags that omitted ones keep, or a
    list read as the env var's allowlist)."""
    help: str
    show: Callable[[Any], str] = bounded_repr
    """Quotes a value of this field in a warning."""
    blank_is_unset: bool = False
    """An env var holding only blanks counts as unset: it sets nothing (its source stays the default)."""


ENABLED = Field(
    key="enabled",
    env=ENV_DISABLE,
    flag=None,
    default=True,
    from_text=_enabled_from_disable_var,
    from_value=_enabled,
    help="master switch; its env var disables monitoring when 1/true/yes/on",
)
INTERVAL = Field(
    key="interval_seconds",
    env=ENV_INTERVAL,
    flag="--interval",
    default=DEFAULT_INTERVAL_SECONDS,
    from_text=_interval,
    from_value=_interval,
    help=f"seconds between samples (floor {MIN_INTERVAL_SECONDS:g}, ceiling {MAX_INTERVAL_SECONDS:g})",
)
CATEGORIES = Field(
    key="categories",
    env=ENV_CATEGORIES,
    flag="--categories",
    default=dict.fromkeys(DEFAULT_CATEGORIES, True),
    from_text=_categories_from_text,
    from_value=_categories,
    help=f"comma-separated allowlist of {_KNOWN}",
    show=_show_categories,
)
DISK_PATH = Field(
    key="disk_path",
    env=ENV_DISK_PATH,
    flag="--disk-path",
    default=DEFAULT_DISK_PATH,
    from_text=_disk_path,
    from_value=_disk_path,
    help="filesystem the disk usage signals report",
)
STEP_SOURCE = Field(
    key="step_source",
    env=ENV_STEP_SOURCE,
    flag="--step-source",
    default=DEFAULT_STEP_SOURCE,
    from_text=_step_source,
    from_value=_step_source,
    help=f"x axis of the curves: {' or '.join(STEP_SOURCES)}",
)

STORE = Field(
    key="store",
    env=ENV_STORE,
    flag="--store",
    default=None,
    from_text=_store_from_text,
    from_value=_store,
    help="SQLite file the run store records into (its directory must exist); none by default in a backend",
    show=lambda value: "None (no store)" if value is None else bounded_repr(value),
    blank_is_unset=True,
)

INNER_RATE = Field(
    key="inner_rate_hz",
    env=ENV_INNER_RATE,
    flag="--inner-rate",
    default=DEFAULT_INNER_RATE_HZ,
    from_text=_inner_rate,
    from_value=_inner_rate,
    help=(
        "Hz at which the child reads the fast-moving signals between records, for their _peak and _mean "
        f"(clamped to {MIN_INNER_RATE_HZ:g}..{MAX_INNER_RATE_HZ:g})"
    ),
)
GPU_DEVICES = Field(
    key="gpu_devices",
    env=ENV_GPU_DEVICES,
    flag="--gpu-devices",
    default="all",
    from_text=_gpu_devices,
    from_value=_gpu_devices,
    help=(
        "GPUs sampled: all, visible (as CUDA_VISIBLE_DEVICES says), "
        "or a comma-separated list of indices or UUIDs"
    ),
    show=_show_gpu_devices,
)
POSTMORTEM_DIR = Field(
    key="postmortem_dir",
    env=ENV_POSTMORTEM_DIR,
    flag="--postmortem-dir",
    default=DEFAULT_POSTMORTEM_DIR,
    from_text=_directory,
    from_value=_directory,
    help=(
        "directory a postmortem goes to when the backend dies and no run store is configured "
        "(relative to where the monitor starts); false for none"
    ),
    show=lambda value: "None (no postmortem)" if value is None else bounded_repr(value),
)

PROMETHEUS_PORT = Field(
    key="prometheus_port",
    env=ENV_PROMETHEUS_PORT,
    flag="--prometheus-port",
    default=None,
    from_text=_port,
    from_value=_port,
    help=(
        "serve Prometheus metrics from the sampling child on this port plus the local rank "
        "(needs the prometheus extra); off by default"
    ),
    show=lambda value: "None (no endpoint)" if value is None else str(value),
)
PROMETHEUS_ADDRESS = Field(
    key="prometheus_address",
    env=ENV_PROMETHEUS_ADDRESS,
    flag="--prometheus-address",
    default=DEFAULT_PROMETHEUS_ADDRESS,
    from_text=_address,
    from_value=_address,
    help="address the metrics endpoint binds (0.0.0.0 for every interface)",
)
PROMETHEUS_SD_DIR = Field(
    key="prometheus_sd_dir",
    env=ENV_PROMETHEUS_SD_DIR,
    flag="--prometheus-sd-dir",
    default=None,
    from_text=_directory,
    from_value=_directory,
    help="directory a Prometheus file_sd_configs entry per monitor is written to (removed at stop)",
    show=lambda value: "None (no discovery file)" if value is None else bounded_repr(value),
    blank_is_unset=True,
)
HOST_SAMPLING = Field(
    key="host_sampling",
    env=ENV_HOST_SAMPLING,
    flag="--host-sampling",
    default=DEFAULT_HOST_SAMPLING,
    from_text=_host_sampling,
    from_value=_host_sampling,
    help=(
        "which ranks of a host sample cpu, memory, disk, network, container and unowned GPUs: "
        f"{' or '.join(HOST_SAMPLING_MODES)}"
    ),
    blank_is_unset=True,
)
RUN_ID = Field(
    key="run_id",
    env=ENV_RUN_ID,
    flag="--run-id",
    default=None,
    from_text=_run_id,
    from_value=_run_id,
    help="the run_id label every rank of one launch shares (default: torchrun's, else made up)",
    show=lambda value: "None (the launcher's)" if value is None else bounded_repr(value),
    blank_is_unset=True,
)

FIELDS: tuple[Field, ...] = (
    ENABLED,
    INTERVAL,
    CATEGORIES,
    DISK_PATH,
    STEP_SOURCE,
    STORE,
    INNER_RATE,
    GPU_DEVICES,
    POSTMORTEM_DIR,
    PROMETHEUS_PORT,
    PROMETHEUS_ADDRESS,
    PROMETHEUS_SD_DIR,
    HOST_SAMPLING,
    RUN_ID,
)
_BY_KEY = {field.key: field for field in FIELDS}
MONITOR_FIELDS: tuple[Field, ...] = tuple(field for field in FIELDS if field is not ENABLED)
"""The settings a ``ResourceMonitor`` takes, each as the keyword argument named by its key."""


def defaults() -> dict[str, Any]:
    """The built-in configuration, before env vars and files."""
    cfg = {
        field.key: dict(field.default) if isinstance(field.default, dict) else field.default
        for field in FIELDS
    }
    cfg["config_file"] = None
    return cfg


# --------------------------------------------------------------------------- the Python API


@dataclass(frozen=True)
class ApiSettings:
    """``ResourceMonitor``'s settings, validated."""

    interval_seconds: float
    """Seconds between samples, within [floor, ``MAX_INTERVAL_SECONDS``]."""
    categories: tuple[str, ...]
    """The enabled categories, in ``DEFAULT_CATEGORIES`` order."""
    disk_path: str
    """Absolute path of the filesystem the disk usage signals report; may not exist (yet)."""
    step_source: str
    """One of ``STEP_SOURCES``."""
    store: str | None = None
    """Absolute path of the run store's SQLite file, or None for no store."""
    inner_rate_hz: float = DEFAULT_INNER_RATE_HZ
    """Hz of the child's reads between records."""
    gpu_devices: str | tuple[str, ...] = "all"
    """``all``, ``visible``, or the devices listed (indices or UUIDs, as text)."""
    postmortem_dir: str | None = None
    """Absolute directory for postmortems without a store, or None for none."""
    prometheus_port: int | None = None
    """The metrics endpoint's port before the local rank is added, or None for no endpoint."""
    prometheus_address: str = DEFAULT_PROMETHEUS_ADDRESS
    prometheus_sd_dir: str | None = None
    """Absolute directory for the file-based service discovery entry, or None."""
    host_sampling: str = DEFAULT_HOST_SAMPLING
    run_id: str | None = None
    """The run id label; None: the launcher's."""


def resolve_api_settings(
    *,
    interval_seconds: object,
    categories: object,
    disk_path: object,
    step_source: object,
    min_interval_seconds: float = MIN_INTERVAL_SECONDS,
    store: object = None,
    inner_rate_hz: object = DEFAULT_INNER_RATE_HZ,
    gpu_devices: object = "all",
    postmortem_dir: object = DEFAULT_POSTMORTEM_DIR,
    prometheus_port: object = None,
    prometheus_address: object = DEFAULT_PROMETHEUS_ADDRESS,
    prometheus_sd_dir: object = None,
    host_sampling: object = DEFAULT_HOST_SAMPLING,
    run_id: object = None,
) -> ApiSettings:
    """Validate the Python API's settings with the parsers env vars and YAML use.

    ``interval_seconds``: a real number (not a bool, not text), finite and
    > 0, clamped with a warning to [``min_interval_seconds``,
    ``MAX_INTERVAL_SECONDS``]. ``categories``: None (all), an iterable of
    names, or a mapping name -> bool (or a word as the env vars read it) whose
    unlisted names are off. ``disk_path``: a non-empty str or os.PathLike,
    made absolute; one that does not exist (yet) is kept with a warning.
    ``step_source``: one of ``STEP_SOURCES``. ``store``: None or False (no
    store), or the path (str or os.PathLike) of a SQLite file, made absolute;
    one whose directory does not exist, or that is a directory, gets a warning
    and no store is used. ``inner_rate_hz``: a number, clamped with a warning
    to [``MIN_INNER_RATE_HZ``, ``MAX_INNER_RATE_HZ``]. ``gpu_devices``: ``all``,
    ``visible`` or a list of indices or UUIDs. ``postmortem_dir``: a directory
    (made absolute) or None/False for none. ``prometheus_port``: a port or
    None; ``prometheus_address``: a host name or IP; ``prometheus_sd_dir``: a
    directory or None; ``host_sampling``: one of ``HOST_SAMPLING_MODES``;
    ``run_id``: text or None. Raises ``TypeError`` for a value of the wrong type and
    ``ValueError`` for a bad value.
    """
    if isinstance(interval_seconds, str):
        raise TypeError(
            f"interval_seconds={bounded_repr(interval_seconds)}: expected a number of seconds, got str"
        )
    interval = _from_api(INTERVAL, interval_seconds, functools.partial(_interval, floor=min_interval_seconds))
    enabled = _from_api(CATEGORIES, categories, CATEGORIES.from_value)
    return ApiSettings(
        interval_seconds=interval,
        categories=tuple(name for name in DEFAULT_CATEGORIES if enabled[name]),
        disk_path=_from_api(DISK_PATH, disk_path, DISK_PATH.from_value),
        step_source=_from_api(STEP_SOURCE, step_source, STEP_SOURCE.from_value),
        store=_from_api(STORE, store, STORE.from_value),
        inner_rate_hz=_from_api(INNER_RATE, inner_rate_hz, INNER_RATE.from_value),
        gpu_devices=_from_api(GPU_DEVICES, gpu_devices, GPU_DEVICES.from_value),
        postmortem_dir=_from_api(POSTMORTEM_DIR, postmortem_dir, POSTMORTEM_DIR.from_value),
        prometheus_port=_from_api(PROMETHEUS_PORT, prometheus_port, PROMETHEUS_PORT.from_value),
        prometheus_address=_from_api(PROMETHEUS_ADDRESS, prometheus_address, PROMETHEUS_ADDRESS.from_value),
        prometheus_sd_dir=_from_api(PROMETHEUS_SD_DIR, prometheus_sd_dir, PROMETHEUS_SD_DIR.from_value),
        host_sampling=_from_api(HOST_SAMPLING, host_sampling, HOST_SAMPLING.from_value),
        run_id=_from_api(RUN_ID, run_id, RUN_ID.from_value),
    )


def _from_api(field: Field, raw: object, parse: Parser) -> Any:
    where = f"{API_SOURCE}: {field.key}"
    try:
        return parse(raw, functools.partial(warn, where, raw))
    except Invalid as exc:
        if exc.soft:
            warn(where, raw, f"is unusable ({exc}); using {field.key}={field.show(field.default)} instead")
            return field.default
        error = TypeError if exc.wrong_type else ValueError
        raise error(f"{field.key}={bounded_repr(raw)}: {exc}") from None


# --------------------------------------------------------------------------- env vars and the file


class _State:
    """The values being resolved and where each came from."""

    def __init__(self) -> None:
        self.values = defaults()
        self.sources: dict[str, str] = {field.key: DEFAULT_SOURCE for field in FIELDS}
        self.sources.update({f"{CATEGORIES.key}.{name}": DEFAULT_SOURCE for name in DEFAULT_CATEGORIES})

    def set(self, field: Field, value: Any, where: str) -> None:
        self.values[field.key] = value
        self.sources[field.key] = where
        if field is CATEGORIES:
            for name in DEFAULT_CATEGORIES:
                self.sources[f"{CATEGORIES.key}.{name}"] = where


def _apply(state: _State, field: Field, parse: Parser, raw: object, where: str) -> None:
    """Set ``field`` to ``parse(raw)``, from ``where``; when that fails, warn
    once and keep the previous value, or use the usable part of ``raw``."""
    try:
        state.set(field, parse(raw, functools.partial(warn, where, raw)), where)
    except Invalid as exc:
        if exc.usable is None:
            using = field.show(state.values[field.key])
            warn(where, raw, f"is invalid ({exc}); using {field.key}={using} instead")
        else:
            state.set(field, exc.usable, where)
            warn(
                where,
                raw,
                f"is partly invalid ({exc}); ignoring that part, using {field.key}={field.show(exc.usable)}",
            )


def _apply_env(state: _State, environ: Mapping[str, str]) -> None:
    for field in FIELDS:
        if field.env is None or field.env not in environ:
            continue
        text = environ[field.env]
        if field.blank_is_unset and not text.strip():
            continue
        _apply(state, field, field.from_text, text, field.env)


def _label(key: object) -> str:
    """A YAML key as warnings name it: short printable text as is, anything else quoted bounded."""
    return key if isinstance(key, str) and len(key) <= 40 and key.isprintable() else bounded_repr(key, 40)


class _Unusable(Exception):
    """The config file cannot be used at all; the message says why."""


def _read_document(path: Path) -> object:
    """The file's YAML document; raises ``_Unusable``. Bounded: at most
    ``MAX_CONFIG_FILE_BYTES`` are read, and the loader's every exception is caught."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        raise _Unusable(f"cannot read it: {exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise _Unusable(f"larger than {MAX_CONFIG_FILE_BYTES // 1024} KiB, which no configuration needs")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Unusable(f"not UTF-8 text (byte {exc.start})") from None
    try:
        return yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = ", ".join(part for part in (exc.context, exc.problem) if part) or type(exc).__name__
        raise _Unusable(f"not valid YAML: {what[:120]}{at}") from None
    except Exception as exc:  # ValueError, RecursionError, OverflowError, MemoryError, other YAMLErrors...
        raise _Unusable(f"cannot parse it: {bounded_repr(exc)}") from None


def _apply_file(state: _State, path: Path) -> bool:
    """Apply the file's keys; False when the file cannot be used at all (read or parsed)."""
    source = str(path)
    try:
        document = _read_document(path)
    except _Unusable as exc:
        _warning(f"resource monitor: cannot use {source} ({exc}); {_EVERY_KEY}")
        return False
    state.values["config_file"] = source
    if document is None:
        return True
    if not isinstance(document, dict):
        warn(
            f"{source}: <top level>",
            document,
            f"is invalid (expected a mapping with a {SECTION!r} key); {_EVERY_KEY}",
        )
        return True
    for key, raw in document.items():
        if key != SECTION:
            warn(
                f"{source}: {_label(key)}",
                raw,
                f"is an unknown top-level key (only {SECTION!r} is read); ignoring it",
            )
    section = document.get(SECTION)
    if section is None:
        return True
    if not isinstance(section, dict):
        warn(f"{source}: {SECTION}", section, f"is invalid (expected a mapping of settings); {_EVERY_KEY}")
        return True
    for key, raw in section.items():
        field = _BY_KEY.get(key) if isinstance(key, str) else None
        where = f"{source}: {SECTION}.{_label(key)}"
        if field is None:
            warn(where, raw, f"is an unknown key (known: {', '.join(_BY_KEY)}); ignoring it")
        elif field is CATEGORIES:
            _apply_file_categories(state, where, raw)
        else:
            _apply(state, field, field.from_value, raw, where)
    return True


def _apply_file_categories(state: _State, where: str, raw: object) -> None:
    """A list: only these (as the env var's allowlist). A mapping: per-category
    flags, omitted ones keep their value."""
    if raw is None:
        return
    if isinstance(raw, list):
        _apply(state, CATEGORIES, _categories_from_list, raw, where)
        return
    categories: dict[str, bool] = state.values[CATEGORIES.key]
    if not isinstance(raw, dict):
        using = _show_categories(categories)
        warn(
            where,
            raw,
            "is invalid (expected a mapping of category: true/false, or a list of category names); "
            f"using categories={using} instead",
        )
        return
    before = state.sources[CATEGORIES.key]
    touched: list[str] = []
    for name, flag in raw.items():
        entry = f"{where}.{_label(name)}"
        category = _category(name)
        if category is None:
            warn(entry, flag, f"is not a known category (known: {_KNOWN}); ignoring it")
            continue
        try:
            categories[category] = _flag(flag)
        except Invalid as exc:
            warn(
                entry,
                flag,
                f"is invalid ({exc}); using categories.{category}={categories[category]!r} instead",
            )
            continue
        state.sources[f"{CATEGORIES.key}.{category}"] = entry
        if category not in touched:
            touched.append(category)
    if len(touched) == len(DEFAULT_CATEGORIES):
        state.sources[CATEGORIES.key] = where
    elif touched:
        named = ", ".join(name for name in DEFAULT_CATEGORIES if name in touched)
        state.sources[CATEGORIES.key] = f"{before}, then {where} ({named})"


# --------------------------------------------------------------------------- lookup


def _repository_root(cwd: Path) -> Path | None:
    for directory in (cwd, *cwd.parents):
        if os.path.exists(directory / ".git"):
            return directory
    return None


def candidate_files(
    environ: Mapping[str, str], cwd: Path | None, package_dir: Path = _PACKAGE_DIR
) -> list[Path]:
    """Where the YAML is looked for, first match wins (SPEC 4 lookup order),
    each place once. ``cwd`` None (the working directory is gone) skips the two
    places found from it."""
    found: list[Path] = []
    config_dir = environ.get(ENV_CONFIG_PATH, "").strip()
    if config_dir:
        if not os.path.isdir(config_dir):
            warn(ENV_CONFIG_PATH, config_dir, "is not a directory; skipping it")
        found += [Path(config_dir) / ("." + CONFIG_FILE_NAME), Path(config_dir) / CONFIG_FILE_NAME]
    root = _repository_root(cwd) if cwd is not None else None
    if root is not None:
        found.append(root / CONFIG_FILE_NAME)
    found.append(package_dir / CONFIG_FILE_NAME)
    if cwd is not None:
        found.append(cwd / CONFIG_FILE_NAME)
    return list(dict.fromkeys(found))


def _warn_ignored_names(directory: Path, names: list[str], found: Path | None) -> None:
    """One warning for each ``.yml`` spelling of a config file in ``directory``,
    where the lookup reads only ``names`` (``.yaml``); ``found`` is the file used, if any."""
    others = [name for name in (CONFIG_FILE_NAME, "." + CONFIG_FILE_NAME) if name not in names]
    for yaml_name in [*names, *others]:
        ignored = directory / (yaml_name[: -len(".yaml")] + IGNORED_SUFFIX)
        if not os.path.isfile(ignored):
            continue
        expected = " or ".join(names)
        rename = yaml_name if yaml_name in names else names[-1]
        if found is not None and found.parent == directory:
            outcome = f"{found.name} beside it is used instead"
        else:
            outcome = f"rename it to {rename} to use it"
        _warning(
            f"resource monitor: ignoring {ignored}: the configuration file is read only when named "
            f"{expected} ({IGNORED_SUFFIX} is not looked for); {outcome}"
        )


def _look_up(looked_for: list[Path]) -> Path | None:
    """The first file of ``looked_for`` that exists, warning about ``.yml``
    files in each directory the lookup visits (up to the one found)."""
    found = next((path for path in looked_for if os.path.isfile(path)), None)
    visited = looked_for[: looked_for.index(found) + 1] if found is not None else looked_for
    names: dict[Path, list[str]] = {}
    for path in looked_for:
        names.setdefault(path.parent, []).append(path.name)
    for directory in dict.fromkeys(path.parent for path in visited):
        _warn_ignored_names(directory, names[directory], found)
    return found


@dataclass(frozen=True)
class Resolution:
    """The configuration resolved, with where each value came from."""

    values: dict[str, Any]
    """What ``load_resource_monitoring_config`` returns."""
    sources: dict[str, str]
    """Key -> where its value came from: ``DEFAULT_SOURCE``, an env var's name, or
    ``"<file>: resource_monitoring.<key>"``. Besides each key of ``FIELDS``,
    ``"categories.<name>"`` for each category (a file's mapping sets categories one
    by one; then ``"categories"`` says ``"<before>, then <file>: ... (<names>)"``)."""
    looked_for: tuple[Path, ...]
    """Where the file was looked for, in lookup order."""
    used_file: Path | None
    """The file whose keys apply, or None."""
    found_file: Path | None
    """The first file found: the one used unless it could not be read or parsed."""
    warnings: tuple[str, ...]
    """Every warning emitted while resolving, in order."""


def resolve_config(
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    *,
    package_dir: str | os.PathLike[str] = _PACKAGE_DIR,
    log_warnings: bool = True,
) -> Resolution:
    """Resolve the configuration once, recording where each value came from;
    never raises for bad configuration.

    ``environ`` and ``cwd`` default to the process's own. Each warning is
    logged on the ``sampler`` logger (unless ``log_warnings`` is false) and kept
    in ``Resolution.warnings``.
    """
    environ = os.environ if environ is None else environ
    try:
        cwd_path: Path | None = Path(os.getcwd() if cwd is None else cwd).resolve()
    except (OSError, RuntimeError):  # the working directory was removed; a symlink loop
        cwd_path = None
    collected: list[str] = []
    collecting = _collected.set(collected)
    logging_on = _logging.set(log_warnings)
    try:
        state = _State()
        if cwd_path is not None:  # relative to where the monitor is started from, as the API reads it
            state.values[POSTMORTEM_DIR.key] = str(cwd_path / DEFAULT_POSTMORTEM_DIR)
        _apply_env(state, environ)
        looked_for = candidate_files(environ, cwd_path, Path(package_dir))
        found = _look_up(looked_for)
        used = found if found is not None and _apply_file(state, found) else None
    finally:
        _logging.reset(logging_on)
        _collected.reset(collecting)
    return Resolution(
        values=state.values,
        sources=state.sources,
        looked_for=tuple(looked_for),
        used_file=used,
        found_file=found,
        warnings=tuple(collected),
    )


def load_resource_monitoring_config(
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    *,
    package_dir: str | os.PathLike[str] = _PACKAGE_DIR,
) -> dict[str, Any]:
    """Resolve the configuration once; never raises for bad configuration.

    Returns a dict with ``enabled`` (bool), ``interval_seconds`` (float, s),
    ``categories`` (each of ``DEFAULT_CATEGORIES`` -> bool), ``disk_path``
    (absolute), ``step_source``, ``store`` (absolute path of the run store's
    SQLite file, or None) and ``config_file`` (the YAML used, or None).
    ``environ`` and ``cwd`` default to the process's own. ``resolve_config``
    also says where each value came from.
    """
    return resolve_config(environ, cwd, package_dir=package_dir).values
