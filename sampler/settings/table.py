"""The table of settings: ``MonitorSettings``, whose every attribute is one setting
described once for every front end (YAML key, env var, ``run`` flag, default,
parsers, help).

Adding a setting is adding one attribute here: the env var list, the YAML keys,
``ResourceMonitor``'s keyword arguments, ``run``'s flags, ``config``'s
provenance, the run store's run row and ``stats()`` are all read from ``FIELDS``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sampler.catalogue import DEFAULT_CATEGORIES
from sampler.settings import parsers, selection
from sampler.settings.files import ENV_CONFIG_PATH
from sampler.settings.parsers import (
    DEFAULT_DISK_PATH,
    DEFAULT_INNER_RATE_HZ,
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_POSTMORTEM_DIR,
    DEFAULT_PROMETHEUS_ADDRESS,
    DEFAULT_STEP_SOURCE,
    MAX_INNER_RATE_HZ,
    MAX_INTERVAL_SECONDS,
    MIN_INNER_RATE_HZ,
    MIN_INTERVAL_SECONDS,
    STEP_SOURCES,
    Parser,
)
from sampler.settings.placement import DEFAULT_HOST_SAMPLING, HOST_SAMPLING_MODES
from sampler.settings.selection import KNOWN
from sampler.util.quoting import bounded_repr


@dataclass(frozen=True)
class Field:
    """One setting, described once for every front end."""

    key: str
    """Key in the YAML section, keyword of ``ResourceMonitor``, attribute of ``MonitorSettings``."""
    env: str | None
    """Environment variable, or None."""
    flag: str | None
    """Flag of ``python -m sampler run``, or None."""
    default: Any
    from_text: Parser | None
    """Reads an env var's or a flag's text (None: the setting has neither)."""
    from_value: Parser
    """Reads a Python API argument, and a YAML value (but for categories, whose
    YAML form is a mapping of per-category flags that omitted ones keep, or a
    list read as the env var's allowlist)."""
    help: str
    show: Callable[[Any], str] = bounded_repr
    """Quotes a value of this field in a warning."""
    blank_is_unset: bool = False
    """An env var holding only blanks counts as unset: it sets nothing (its source stays the default)."""
    configured: bool = True
    """Read from the YAML file and env vars; False: only ever a ``ResourceMonitor`` argument."""
    in_api: bool = True
    """A keyword argument of ``ResourceMonitor``."""
    settle: Callable[[Any], Any] = lambda value: value
    """The resolved value as ``MonitorSettings`` holds it (categories: the names on)."""
    env_default: str | None = None
    """The default as the manual's env var table says it, where the value would read wrong there."""


def setting(**described: Any) -> Any:
    """One attribute of ``MonitorSettings``: its ``Field`` (less the key, which is
    the attribute's name) rides in the dataclass field's metadata."""
    field = Field(key="", **described)
    return dataclasses.field(default=field.settle(field.default), metadata={"setting": field})


def _enabled_names(value: Mapping[str, bool]) -> tuple[str, ...]:
    return tuple(name for name in DEFAULT_CATEGORIES if value[name])


@dataclass(frozen=True)
class MonitorSettings:
    """A monitor's settings, resolved once (arguments, then the YAML file, then env
    vars, then defaults) and carried unchanged to every stage."""

    enabled: bool = setting(
        env="WEIGHTSLAB_DISABLE_RESOURCE_MONITORING",
        flag=None,
        default=True,
        from_text=parsers.enabled_from_disable_var,
        from_value=parsers.enabled,
        help="master switch; its env var disables monitoring when 1/true/yes/on",
        in_api=False,
        env_default="`0`",
    )
    interval_seconds: float = setting(
        env="WL_RESOURCE_MONITOR_INTERVAL_SECONDS",
        flag="--interval",
        default=DEFAULT_INTERVAL_SECONDS,
        from_text=parsers.interval,
        from_value=parsers.interval,
        help=f"seconds between samples (floor {MIN_INTERVAL_SECONDS:g}, ceiling {MAX_INTERVAL_SECONDS:g})",
    )
    categories: tuple[str, ...] = setting(
        env="WL_RESOURCE_MONITOR_CATEGORIES",
        flag="--categories",
        default=dict.fromkeys(DEFAULT_CATEGORIES, True),
        from_text=selection.categories_from_text,
        from_value=selection.categories,
        help=f"comma-separated allowlist of {KNOWN}",
        show=selection.show_categories,
        settle=_enabled_names,
        env_default="all",
    )
    disk_path: str = setting(
        env="WL_RESOURCE_MONITOR_DISK_PATH",
        flag="--disk-path",
        default=DEFAULT_DISK_PATH,
        from_text=parsers.disk_path,
        from_value=parsers.disk_path,
        help="filesystem the disk usage signals report",
    )
    step_source: str = setting(
        env="WL_RESOURCE_MONITOR_STEP_SOURCE",
        flag="--step-source",
        default=DEFAULT_STEP_SOURCE,
        from_text=parsers.step_source,
        from_value=parsers.step_source,
        help=f"x axis of the curves: {' or '.join(STEP_SOURCES)}",
    )
    store: str | None = setting(
        env="WL_RESOURCE_MONITOR_STORE",
        flag="--store",
        default=None,
        from_text=parsers.store_from_text,
        from_value=parsers.store,
        help=(
            "SQLite file the run store records into (its directory must exist); none by default in a backend"
        ),
        show=lambda value: "None (no store)" if value is None else bounded_repr(value),
        blank_is_unset=True,
    )
    inner_rate_hz: float = setting(
        env="WL_RESOURCE_MONITOR_INNER_RATE_HZ",
        flag="--inner-rate",
        default=DEFAULT_INNER_RATE_HZ,
        from_text=parsers.inner_rate,
        from_value=parsers.inner_rate,
        help=(
            "Hz at which the child reads the fast-moving signals between records, for their _peak and "
            f"_mean (clamped to {MIN_INNER_RATE_HZ:g}..{MAX_INNER_RATE_HZ:g})"
        ),
    )
    gpu_devices: str | tuple[str, ...] = setting(
        env="WL_RESOURCE_MONITOR_GPU_DEVICES",
        flag="--gpu-devices",
        default="all",
        from_text=selection.gpu_devices,
        from_value=selection.gpu_devices,
        help=(
            "GPUs sampled: all, visible (as CUDA_VISIBLE_DEVICES says), "
            "or a comma-separated list of indices or UUIDs"
        ),
        show=selection.show_gpu_devices,
    )
    postmortem_dir: str | None = setting(
        env="WL_RESOURCE_MONITOR_POSTMORTEM_DIR",
        flag="--postmortem-dir",
        default=DEFAULT_POSTMORTEM_DIR,
        from_text=parsers.directory,
        from_value=parsers.directory,
        help=(
            "directory a postmortem goes to when the backend dies and no run store is configured "
            "(relative to where the monitor starts); false for none"
        ),
        show=lambda value: "None (no postmortem)" if value is None else bounded_repr(value),
    )
    prometheus_port: int | None = setting(
        env="WL_RESOURCE_MONITOR_PROMETHEUS_PORT",
        flag="--prometheus-port",
        default=None,
        from_text=parsers.port,
        from_value=parsers.port,
        help=(
            "serve Prometheus metrics from the sampling child on this port plus the local rank "
            "(needs the prometheus extra); off by default"
        ),
        show=lambda value: "None (no endpoint)" if value is None else str(value),
        env_default="off",
    )
    prometheus_address: str = setting(
        env="WL_RESOURCE_MONITOR_PROMETHEUS_ADDRESS",
        flag="--prometheus-address",
        default=DEFAULT_PROMETHEUS_ADDRESS,
        from_text=parsers.address,
        from_value=parsers.address,
        help="address the metrics endpoint binds (0.0.0.0 for every interface)",
    )
    prometheus_sd_dir: str | None = setting(
        env="WL_RESOURCE_MONITOR_PROMETHEUS_SD_DIR",
        flag="--prometheus-sd-dir",
        default=None,
        from_text=parsers.directory,
        from_value=parsers.directory,
        help="directory a Prometheus file_sd_configs entry per monitor is written to (removed at stop)",
        show=lambda value: "None (no discovery file)" if value is None else bounded_repr(value),
        blank_is_unset=True,
    )
    host_sampling: str = setting(
        env="WL_RESOURCE_MONITOR_HOST_SAMPLING",
        flag="--host-sampling",
        default=DEFAULT_HOST_SAMPLING,
        from_text=parsers.host_sampling,
        from_value=parsers.host_sampling,
        help=(
            "which ranks of a host sample cpu, memory, disk, network, container and unowned GPUs: "
            f"{' or '.join(HOST_SAMPLING_MODES)}"
        ),
        blank_is_unset=True,
    )
    run_id: str | None = setting(
        env="WL_RESOURCE_MONITOR_RUN_ID",
        flag="--run-id",
        default=None,
        from_text=parsers.run_id,
        from_value=parsers.run_id,
        help="the run_id label every rank of one launch shares (default: torchrun's, else made up)",
        show=lambda value: "None (the launcher's)" if value is None else bounded_repr(value),
        env_default="the launcher's",
        blank_is_unset=True,
    )
    stall_seconds: float | str = setting(
        env="WL_RESOURCE_MONITOR_STALL_SECONDS",
        flag="--stall-seconds",
        default=parsers.STALL_AUTO,
        from_text=parsers.stall_seconds,
        from_value=parsers.stall_seconds,
        help=(
            "seconds without a new step before the sampling child records a stall with every thread's "
            "stack: auto (learned from the run's step durations), a number, or off"
        ),
        blank_is_unset=True,
    )
    isolation: str = setting(
        env=None,
        flag=None,
        default="process",
        from_text=None,
        from_value=parsers.isolation,
        help=(
            "process: sample in a supervised child (thread when none can run); thread: in the monitor thread"
        ),
        configured=False,
    )
    hang_deadline_seconds: float = setting(
        env=None,
        flag=None,
        default=parsers.DEFAULT_HANG_DEADLINE_SECONDS,
        from_text=None,
        from_value=parsers.hang_deadline,
        help="seconds one collector call may run before the child is killed and restarted",
        configured=False,
    )
    nvml_module: str = setting(
        env=None,
        flag=None,
        default="pynvml",
        from_text=None,
        from_value=parsers.module_name,
        help="dotted name of the NVML binding the child imports",
        configured=False,
    )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> MonitorSettings:
        """The settings ``as_row`` gave (after a JSON round trip: lists back to tuples)."""
        values: dict[str, Any] = {
            key: tuple(value) if isinstance(value, list) else value for key, value in row.items()
        }
        return cls(**values)

    def as_row(self) -> dict[str, Any]:
        """The settings as plain JSON values, keyed as the table (the run row, ``stats()``)."""
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(self).items()
        }


ALL_FIELDS: tuple[Field, ...] = tuple(
    dataclasses.replace(attribute.metadata["setting"], key=attribute.name)
    for attribute in dataclasses.fields(MonitorSettings)
)
"""Every setting, in ``MonitorSettings`` order."""
BY_KEY: dict[str, Field] = {field.key: field for field in ALL_FIELDS}
FIELDS: tuple[Field, ...] = tuple(field for field in ALL_FIELDS if field.configured)
"""The configuration: the settings the YAML file and env vars set."""
API_FIELDS: tuple[Field, ...] = tuple(field for field in ALL_FIELDS if field.in_api)
"""The keyword arguments of ``ResourceMonitor``, each named by its key."""
MONITOR_FIELDS: tuple[Field, ...] = tuple(field for field in FIELDS if field.in_api)
"""The configured settings a ``ResourceMonitor`` takes (what ``run`` resolves and passes on)."""

INTERVAL = BY_KEY["interval_seconds"]
CATEGORIES = BY_KEY["categories"]
STEP_SOURCE = BY_KEY["step_source"]
STORE = BY_KEY["store"]
POSTMORTEM_DIR = BY_KEY["postmortem_dir"]
"""The fields the resolver and the front ends treat specially, by name."""
ENV: dict[str, str] = {field.key: field.env for field in FIELDS if field.env is not None}
"""Each configured setting's env var, by key."""


def defaults() -> dict[str, Any]:
    """The built-in configuration, before env vars and files (categories as name -> on)."""
    cfg = {
        field.key: dict(field.default) if isinstance(field.default, dict) else field.default
        for field in FIELDS
    }
    cfg["config_file"] = None
    return cfg


def settled(values: Mapping[str, Any]) -> MonitorSettings:
    """The ``MonitorSettings`` of resolved ``values`` (as ``defaults()`` has them; a
    setting only arguments give is its default when absent)."""
    resolved = {field.key: field.settle(values.get(field.key, field.default)) for field in ALL_FIELDS}
    return MonitorSettings(**resolved)


def _env_default(field: Field) -> str:
    if field.env_default is not None:
        return field.env_default
    if field.default is None:
        return "none"
    if isinstance(field.default, float):
        return f"`{field.default:g}`"
    return f"`{field.default}`"


def env_table() -> str:
    """The manual's table of environment variables (Markdown, one row per variable, in table order)."""
    rows = ["| env var | default | meaning |", "|---|---|---|"]
    for field in FIELDS:
        if field.env is not None:
            rows.append(f"| `{field.env}` | {_env_default(field)} | {field.help} |")
        if field is STEP_SOURCE:
            rows.append(f"| `{ENV_CONFIG_PATH}` | none | directory searched first for the YAML file |")
    return "\n".join(rows) + "\n"
