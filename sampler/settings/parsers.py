"""The parsers every front end shares: each reads one setting's value, raises
``Invalid`` for one it cannot use, and reports one it uses but not as given (an
interval clamped to the floor, a disk path that does not exist yet) through its
``remark`` callback. ``warn`` is the one way a warning about configuration is said.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import numbers
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from sampler.settings.placement import HOST_SAMPLING_MODES, whole_number
from sampler.util.quoting import bounded_repr

log = logging.getLogger("sampler")

STEP_SOURCES: tuple[str, ...] = ("model_age", "seconds")
DEFAULT_STEP_SOURCE = "model_age"
DEFAULT_INTERVAL_SECONDS = 15.0
MIN_INTERVAL_SECONDS = 1.0
MAX_INTERVAL_SECONDS = 86400.0
"""One day, the longest interval: a longer one samples too rarely to plot, and a far longer one
(1e12 s) overflows the monitor thread's ``select()`` timeout."""
DEFAULT_DISK_PATH = os.path.abspath(os.sep)  # "/" or "C:\\"
DEFAULT_INNER_RATE_HZ = 5.0
MIN_INNER_RATE_HZ = 1.0
MAX_INNER_RATE_HZ = 50.0
"""How often the child reads the fast-moving signals between records, for their
peaks and means: above 50 Hz the child's own CPU grows with no curve the better.
5 Hz by default: the memory peaks an OOM follows (the backend's RSS, the container's
usage) are exact at any rate, from the kernel's high-water marks, and each read
between records costs the child a cold wake-up (about 0.8 ms with a large tree)."""
DEFAULT_POSTMORTEM_DIR = os.path.join(".resource_monitor", "postmortems")
"""Where a postmortem goes when no run store is configured, relative to the
working directory the monitor was started from."""
DEFAULT_PROMETHEUS_ADDRESS = "127.0.0.1"
"""Metrics can tell what runs on a host: the endpoint is local unless asked otherwise."""
MAX_PORT = 65535
MAX_RUN_ID = 128
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
_WORDS = "1/true/yes/on or 0/false/no/off"


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


def warning(message: str) -> None:
    """Log ``message`` on the ``sampler`` logger, and keep it for the resolution running, if any."""
    kept = _collected.get()
    if kept is not None:
        kept.append(message)
    if _logging.get():
        log.warning("%s", message)


@contextlib.contextmanager
def collecting(log_warnings: bool) -> Iterator[list[str]]:
    """Within: every warning is kept in the list yielded, and logged only if ``log_warnings``."""
    kept: list[str] = []
    collect, log_them = _collected.set(kept), _logging.set(log_warnings)
    try:
        yield kept
    finally:
        _logging.reset(log_them)
        _collected.reset(collect)


def warn(where: str, raw: object, text: str) -> None:
    """One warning about the value ``raw`` found at ``where`` (an env var,
    ``file: key``, a flag); ``text`` says what is wrong and what is used."""
    warning(f"resource monitor: {where}={bounded_repr(raw)} {text}")


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


def interval(raw: object, remark: Remark, floor: float = MIN_INTERVAL_SECONDS) -> float:
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


def word(text: str) -> bool:
    """A boolean word as the env vars read it: 1/true/yes/on or 0/false/no/off, any case."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise Invalid(f"expected {_WORDS}")


def flag(raw: object) -> bool:
    """A YAML or API boolean: a bool, or a word as the env vars read it."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        return word(raw)
    raise Invalid(f"expected true or false, got {type(raw).__name__}", wrong_type=True)


def enabled_from_disable_var(text: str, remark: Remark) -> bool:
    """``WEIGHTSLAB_DISABLE_RESOURCE_MONITORING``: a true word disables; blank or a false word does not."""
    return not word(text) if text.strip() else True


def enabled(raw: object, remark: Remark) -> bool:
    return flag(raw)


def disk_path(raw: object, remark: Remark) -> str:
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


def step_source(raw: object, remark: Remark) -> str:
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
    if word in FALSE_WORDS:
        return None
    if word in TRUE_WORDS:
        raise Invalid(f"{expected} (write ./{raw.strip()} for a path of that name)")
    if not word:
        raise Invalid(f"{expected}; got an empty path")
    if "\0" in raw:
        raise Invalid("a path cannot contain a NUL character")
    return os.path.abspath(raw)


def store(raw: object, remark: Remark) -> str | None:
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


def store_from_text(text: str, remark: Remark) -> str | None:
    """An env var's or a flag's store: blank means none (an empty env var is as if unset)."""
    return store(text, remark) if text.strip() else None


def inner_rate(raw: object, remark: Remark) -> float:
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


def directory(raw: object, remark: Remark) -> str | None:
    """A directory (made absolute; created when first written), or None
    (false/off) for none."""
    path = _optional_path(raw, "expected a directory, or false for none")
    if path is not None and os.path.exists(path) and not os.path.isdir(path):
        raise Invalid("exists and is not a directory", soft=True)
    return path


_OFF_WORDS = tuple(word for word in FALSE_WORDS if word != "0")
"""The false words but 0, which names a port (one the endpoint cannot take), not "none"."""


def port(raw: object, remark: Remark) -> int | None:
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


def address(raw: object, remark: Remark) -> str:
    """The address the endpoint binds: a host name or an IP address."""
    if not isinstance(raw, str):
        raise Invalid(f"expected a host name or IP address, got {type(raw).__name__}", wrong_type=True)
    text = raw.strip()
    if not text or not text.isprintable() or any(c.isspace() for c in text) or len(text) > 255:
        raise Invalid("expected a host name or IP address such as 127.0.0.1 or 0.0.0.0")
    return text


def host_sampling(raw: object, remark: Remark) -> str:
    """One of ``HOST_SAMPLING_MODES``, any case."""
    if not isinstance(raw, str):
        raise Invalid(
            f"expected one of {', '.join(HOST_SAMPLING_MODES)}, got {type(raw).__name__}", wrong_type=True
        )
    value = raw.strip().lower()
    if value not in HOST_SAMPLING_MODES:
        raise Invalid(f"expected one of {', '.join(HOST_SAMPLING_MODES)}")
    return value


def run_id(raw: object, remark: Remark) -> str | None:
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


STALL_AUTO = "auto"
STALL_OFF = "off"


def stall_seconds(raw: object, remark: Remark) -> float | str:
    """How long the step may stand still before the run counts as stalled: ``auto`` (learned
    from the run's own steps), seconds (a number > 0), or ``off`` (false, null or a false word but
    ``0``)."""
    if raw is None or raw is False:
        return STALL_OFF
    if isinstance(raw, str):
        word = raw.strip().lower()
        if word == STALL_AUTO:
            return STALL_AUTO
        if word in _OFF_WORDS:
            return STALL_OFF
    try:
        return parse_seconds(raw)
    except Invalid as exc:
        expected = "expected auto, a number of seconds, or off"
        raise Invalid(f"{exc}; {expected}", wrong_type=exc.wrong_type) from None


ISOLATION_MODES: tuple[str, ...] = ("process", "thread")
DEFAULT_HANG_DEADLINE_SECONDS = 5.0
"""A collector call running longer than this gets the child killed (independent of the interval)."""
MAX_HANG_DEADLINE_SECONDS = 86400.0


def isolation(raw: object, remark: Remark) -> str:
    """One of ``ISOLATION_MODES``."""
    if raw not in ISOLATION_MODES:
        raise Invalid(f"expected one of {', '.join(ISOLATION_MODES)}")
    return str(raw)


def hang_deadline(raw: object, remark: Remark) -> float:
    """Seconds one collector call may run: a number > 0, clamped to one day with a remark."""
    seconds = parse_seconds(raw)
    if seconds > MAX_HANG_DEADLINE_SECONDS:
        remark(f"is above the {MAX_HANG_DEADLINE_SECONDS:g} s ceiling; using {MAX_HANG_DEADLINE_SECONDS:g}")
        return MAX_HANG_DEADLINE_SECONDS
    return seconds


def module_name(raw: object, remark: Remark) -> str:
    """A dotted module name."""
    if not isinstance(raw, str):
        raise Invalid(f"expected a dotted module name, got {type(raw).__name__}", wrong_type=True)
    if not all(part.isidentifier() for part in raw.split(".")):
        raise Invalid("expected a dotted module name such as pynvml")
    return raw
