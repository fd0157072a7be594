"""Settings: one table (``MonitorSettings``, ``FIELDS``), the parsers it uses,
the YAML file's lookup, and the one resolution every front end goes through.

- ``table``: ``MonitorSettings``, each attribute one setting described once;
- ``parsers`` and ``selection``: reading values (``Invalid``, remarks, warnings);
- ``files``: where the YAML is looked for, and reading it bounded;
- ``resolve``: defaults, env vars, the file, arguments: ``resolve_settings``,
  ``resolve_config`` (with where each value came from), ``load_resource_monitoring_config``;
- ``placement``: the launcher's ranks and host.
"""

from sampler.catalogue import DEFAULT_CATEGORIES
from sampler.settings.files import (
    CONFIG_FILE_NAME,
    ENV_CONFIG_PATH,
    MAX_CONFIG_FILE_BYTES,
    SECTION,
    candidate_files,
)
from sampler.settings.parsers import (
    DEFAULT_DISK_PATH,
    DEFAULT_HANG_DEADLINE_SECONDS,
    DEFAULT_INNER_RATE_HZ,
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_POSTMORTEM_DIR,
    DEFAULT_PROMETHEUS_ADDRESS,
    DEFAULT_STEP_SOURCE,
    ISOLATION_MODES,
    MAX_HANG_DEADLINE_SECONDS,
    MAX_INNER_RATE_HZ,
    MAX_INTERVAL_SECONDS,
    MAX_PORT,
    MIN_INNER_RATE_HZ,
    MIN_INTERVAL_SECONDS,
    STEP_SOURCES,
    Invalid,
    parse_seconds,
    warn,
)
from sampler.settings.resolve import (
    API_SOURCE,
    DEFAULT_SOURCE,
    Resolution,
    load_resource_monitoring_config,
    resolve_config,
    resolve_settings,
)
from sampler.settings.selection import GPU_DEVICE_MODES
from sampler.settings.table import (
    ALL_FIELDS,
    API_FIELDS,
    BY_KEY,
    CATEGORIES,
    ENV,
    FIELDS,
    INTERVAL,
    MONITOR_FIELDS,
    POSTMORTEM_DIR,
    STEP_SOURCE,
    STORE,
    Field,
    MonitorSettings,
    defaults,
    env_table,
)

__all__ = [
    "ALL_FIELDS",
    "API_FIELDS",
    "API_SOURCE",
    "BY_KEY",
    "CATEGORIES",
    "CONFIG_FILE_NAME",
    "DEFAULT_CATEGORIES",
    "DEFAULT_DISK_PATH",
    "DEFAULT_HANG_DEADLINE_SECONDS",
    "DEFAULT_INNER_RATE_HZ",
    "DEFAULT_INTERVAL_SECONDS",
    "DEFAULT_POSTMORTEM_DIR",
    "DEFAULT_PROMETHEUS_ADDRESS",
    "DEFAULT_SOURCE",
    "DEFAULT_STEP_SOURCE",
    "ENV",
    "ENV_CONFIG_PATH",
    "FIELDS",
    "GPU_DEVICE_MODES",
    "INTERVAL",
    "ISOLATION_MODES",
    "MAX_CONFIG_FILE_BYTES",
    "MAX_HANG_DEADLINE_SECONDS",
    "MAX_INNER_RATE_HZ",
    "MAX_INTERVAL_SECONDS",
    "MAX_PORT",
    "MIN_INNER_RATE_HZ",
    "MIN_INTERVAL_SECONDS",
    "MONITOR_FIELDS",
    "POSTMORTEM_DIR",
    "SECTION",
    "STEP_SOURCE",
    "STEP_SOURCES",
    "STORE",
    "Field",
    "Invalid",
    "MonitorSettings",
    "Resolution",
    "candidate_files",
    "defaults",
    "env_table",
    "load_resource_monitoring_config",
    "parse_seconds",
    "resolve_config",
    "resolve_settings",
    "warn",
]
