"""Tests for ``sampler.settings``: defaults, env vars, the YAML file, lookup order, bad input (SPEC 4).

Every test is hermetic: it passes an explicit ``environ`` dict, a ``cwd`` and a ``package_dir`` under
pytest's ``tmp_path``, so neither the real environment nor the repository's own
``resource_monitoring.yaml`` can leak in. Warnings go through the ``sampler`` logger and are captured
with ``caplog``; each bad input must produce exactly one warning that names the source (env var or
file), the key, the bad value (quoted bounded, as ``quote`` does: a long path is cut) and what is
used instead. The Python API's validation, ``resolve_settings``, shares the parsers and is tested
at the end.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import ENV_VARS

import sampler
from sampler import settings
from sampler.util.quoting import bounded_repr as quote

ENV = settings.ENV
BY_KEY = settings.BY_KEY

ALL_ON = dict.fromkeys(settings.DEFAULT_CATEGORIES, True)
ROOT = os.path.abspath(os.sep)
FILE_NAME = "resource_monitoring.yaml"
DOT_FILE_NAME = ".resource_monitoring.yaml"
NEW_DEFAULTS: dict[str, Any] = {
    "prometheus_port": None,
    "prometheus_address": "127.0.0.1",
    "prometheus_sd_dir": None,
    "host_sampling": "local_rank_0",
    "run_id": None,
    "stall_seconds": "auto",
}
"""The defaults of the Prometheus, placement and stall keys."""


@dataclass
class Tree:
    """A scratch layout: ``base`` holds no ``.git``; ``pkg`` is an empty package dir; ``work`` the cwd."""

    base: Path
    pkg: Path
    work: Path

    def load(
        self,
        environ: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        package_dir: Path | None = None,
    ) -> dict[str, Any]:
        return settings.load_resource_monitoring_config(
            environ={} if environ is None else dict(environ),
            cwd=self.work if cwd is None else cwd,
            package_dir=self.pkg if package_dir is None else package_dir,
        )

    def resolve(
        self,
        environ: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        package_dir: Path | None = None,
        *,
        log_warnings: bool = True,
    ) -> settings.Resolution:
        return settings.resolve_config(
            environ={} if environ is None else dict(environ),
            cwd=self.work if cwd is None else cwd,
            package_dir=self.pkg if package_dir is None else package_dir,
            log_warnings=log_warnings,
        )


@pytest.fixture
def tree(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Tree:
    base = tmp_path.resolve()
    # Hermeticity guard: an ancestor repository holding a real config file would be picked up as the
    # "repository-level" file by every test that builds no .git of its own.
    for directory in (base, *base.parents):
        if (directory / ".git").exists() and (directory / FILE_NAME).exists():
            pytest.skip(f"{directory / FILE_NAME} above tmp_path would leak into the lookup")
    pkg = base / "pkg"
    work = base / "work"
    pkg.mkdir()
    work.mkdir()
    caplog.set_level(logging.WARNING, logger="sampler")
    return Tree(base=base, pkg=pkg, work=work)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def section(body: str) -> str:
    """A YAML document with ``body`` (one ``key: value`` per line) under ``resource_monitoring``."""
    lines = "".join(f"  {line}\n" for line in body.strip("\n").splitlines())
    return f"resource_monitoring:\n{lines}"


def make_repo(base: Path, depth: int = 3) -> tuple[Path, Path]:
    """A repository root (holding ``.git``) and a subdirectory ``depth`` levels below it."""
    root = base / "repo"
    (root / ".git").mkdir(parents=True)
    nested = root.joinpath(*(f"level{i}" for i in range(depth)))
    nested.mkdir(parents=True, exist_ok=True)
    return root, nested


def sampler_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sampler" and r.levelno >= logging.WARNING]


def assert_no_warnings(caplog: pytest.LogCaptureFixture) -> None:
    assert sampler_warnings(caplog) == []


def assert_one_warning(caplog: pytest.LogCaptureFixture, *fragments: str) -> str:
    """Exactly one ``sampler`` warning, containing every fragment; returns it."""
    messages = sampler_warnings(caplog)
    assert len(messages) == 1, messages
    for fragment in fragments:
        assert fragment in messages[0], f"{fragment!r} missing from {messages[0]!r}"
    return messages[0]


# --------------------------------------------------------------------------- defaults and constants


def test_defaults_with_empty_environment_and_no_file(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    cfg = tree.load()
    assert cfg == {
        "enabled": True,
        "interval_seconds": 15.0,
        "categories": ALL_ON,
        "disk_path": ROOT,
        "step_source": "model_age",
        "store": None,
        "inner_rate_hz": 5.0,
        "gpu_devices": "all",
        "postmortem_dir": str(tree.work / ".resource_monitor" / "postmortems"),
        **NEW_DEFAULTS,
        "config_file": None,
    }
    assert isinstance(cfg["interval_seconds"], float)
    assert_no_warnings(caplog)


def test_module_constants() -> None:
    assert settings.DEFAULT_CATEGORIES == (
        "cpu",
        "memory",
        "gpu",
        "disk",
        "network",
        "process",
        "process_tree",
        "container",
        "pressure",
    )
    assert settings.STEP_SOURCES == ("model_age", "seconds")
    assert settings.DEFAULT_STEP_SOURCE == "model_age"
    assert settings.DEFAULT_INTERVAL_SECONDS == 15.0


@pytest.mark.parametrize(
    "name", ["DEFAULT_CATEGORIES", "STEP_SOURCES", "DEFAULT_STEP_SOURCE", "DEFAULT_INTERVAL_SECONDS"]
)
def test_constants_exported_from_package(name: str) -> None:
    assert name in sampler.__all__
    assert getattr(sampler, name) == getattr(settings, name)


def test_load_is_exported_from_package() -> None:
    assert sampler.load_resource_monitoring_config is settings.load_resource_monitoring_config


def test_calls_do_not_share_state(tree: Tree) -> None:
    write(tree.work / FILE_NAME, section("categories: {cpu: false}"))
    assert tree.load()["categories"]["cpu"] is False
    (tree.work / FILE_NAME).unlink()
    assert tree.load()["categories"] == ALL_ON


# --------------------------------------------------------------------------- environment variables


@pytest.mark.parametrize("raw", ["1", "true", "YES", "On", "TRUE", " yes "])
def test_disable_env_truthy_disables(tree: Tree, caplog: pytest.LogCaptureFixture, raw: str) -> None:
    assert tree.load({ENV["enabled"]: raw})["enabled"] is False
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["0", "false", "no", "off", "", "OFF"])
def test_disable_env_falsy_keeps_enabled(tree: Tree, caplog: pytest.LogCaptureFixture, raw: str) -> None:
    assert tree.load({ENV["enabled"]: raw})["enabled"] is True
    assert_no_warnings(caplog)


def test_disable_env_garbage_warns_and_stays_enabled(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    assert tree.load({ENV["enabled"]: "maybe"})["enabled"] is True
    assert_one_warning(caplog, "WEIGHTSLAB_DISABLE_RESOURCE_MONITORING", "'maybe'", "enabled")


@pytest.mark.parametrize(("raw", "expected"), [("30", 30.0), ("2.5", 2.5), (" 60 ", 60.0), ("1", 1.0)])
def test_interval_env_valid(tree: Tree, caplog: pytest.LogCaptureFixture, raw: str, expected: float) -> None:
    value = tree.load({ENV["interval_seconds"]: raw})["interval_seconds"]
    assert value == expected
    assert isinstance(value, float)
    assert_no_warnings(caplog)


def test_interval_env_below_floor_is_clamped(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    assert tree.load({ENV["interval_seconds"]: "0.2"})["interval_seconds"] == 1.0
    assert_one_warning(caplog, "interval_seconds", "0.2", "1.0")


def test_interval_env_clamp_warning_names_the_variable(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    # SPEC 4: a value of the wrong range gets one warning naming the file or variable.
    tree.load({ENV["interval_seconds"]: "0.2"})
    assert_one_warning(caplog, "WL_RESOURCE_MONITOR_INTERVAL_SECONDS", "0.2", "1.0")


@pytest.mark.parametrize("raw", ["abc", "-5", "nan", "inf", "0", "-inf", ""])
def test_interval_env_invalid_warns_and_keeps_default(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    assert tree.load({ENV["interval_seconds"]: raw})["interval_seconds"] == 15.0
    assert_one_warning(caplog, "WL_RESOURCE_MONITOR_INTERVAL_SECONDS", "interval_seconds", repr(raw), "15.0")


def test_categories_env_allowlist(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    cats = tree.load({ENV["categories"]: "cpu, GPU"})["categories"]
    assert cats == {**dict.fromkeys(settings.DEFAULT_CATEGORIES, False), "cpu": True, "gpu": True}
    assert_no_warnings(caplog)


def test_categories_env_unknown_name_warns_and_known_ones_apply(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    cats = tree.load({ENV["categories"]: "cpu,bogus,disk"})["categories"]
    assert cats == {**dict.fromkeys(settings.DEFAULT_CATEGORIES, False), "cpu": True, "disk": True}
    assert_one_warning(
        caplog, "WL_RESOURCE_MONITOR_CATEGORIES", "'bogus'", "ignor", "using categories=cpu,disk"
    )


def test_categories_env_unset_means_all_on(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    assert tree.load({})["categories"] == ALL_ON
    assert_no_warnings(caplog)


def test_disk_path_env_existing_dir_is_used(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    disk = tree.base / "data"
    disk.mkdir()
    assert tree.load({ENV["disk_path"]: str(disk)})["disk_path"] == str(disk)
    assert_no_warnings(caplog)


def test_disk_path_env_missing_is_kept_with_one_warning(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    # SPEC 4: a disk_path that does not exist (yet) is kept, never replaced by another filesystem's.
    missing = str(tree.base / "no" / "such" / "dir")
    assert tree.load({ENV["disk_path"]: missing})["disk_path"] == missing
    assert_one_warning(caplog, ENV["disk_path"], quote(missing), "does not exist", "keeping it")


def test_disk_path_env_relative_is_made_absolute(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    assert tree.load({ENV["disk_path"]: "."})["disk_path"] == os.getcwd()
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["", "   "])
def test_disk_path_env_blank_warns_and_keeps_root(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    assert tree.load({ENV["disk_path"]: raw})["disk_path"] == ROOT
    assert_one_warning(caplog, "WL_RESOURCE_MONITOR_DISK_PATH", repr(raw), "non-empty", repr(ROOT))


@pytest.mark.parametrize("raw", ["seconds", "Seconds", "model_age"])
def test_step_source_env_valid(tree: Tree, caplog: pytest.LogCaptureFixture, raw: str) -> None:
    assert tree.load({ENV["step_source"]: raw})["step_source"] == raw.lower()
    assert_no_warnings(caplog)


def test_step_source_env_bogus_warns_and_uses_model_age(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    assert tree.load({ENV["step_source"]: "bogus"})["step_source"] == "model_age"
    assert_one_warning(caplog, "WL_RESOURCE_MONITOR_STEP_SOURCE", "step_source", "'bogus'", "'model_age'")


@pytest.mark.parametrize("raw", ["cpu;gpu", ",,,", "foo", "cpu gpu", " , ;"])
def test_categories_env_naming_no_known_category_warns_and_keeps_all_on(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    assert tree.load({ENV["categories"]: raw})["categories"] == ALL_ON
    assert_one_warning(
        caplog,
        "WL_RESOURCE_MONITOR_CATEGORIES",
        repr(raw),
        "names no known category",
        f"using categories={','.join(settings.DEFAULT_CATEGORIES)} instead",
    )


def test_categories_env_several_unknown_names_one_warning_naming_each(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    cats = tree.load({ENV["categories"]: "gpu,tpu,Memory,npu"})["categories"]
    assert cats == {name: name in ("gpu", "memory") for name in settings.DEFAULT_CATEGORIES}
    assert_one_warning(caplog, "'tpu'", "'npu'", "known: cpu, memory", "using categories=memory,gpu")


@pytest.mark.parametrize("raw", ["", "   ", "\t"])
def test_categories_env_blank_means_unset(tree: Tree, caplog: pytest.LogCaptureFixture, raw: str) -> None:
    assert tree.load({ENV["categories"]: raw})["categories"] == ALL_ON
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["1e12", "86400.5", "1e308", "1e400", "9" * 400, "9" * 5000])
def test_interval_env_above_one_day_is_clamped(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    assert (
        tree.load({ENV["interval_seconds"]: raw})["interval_seconds"]
        == settings.MAX_INTERVAL_SECONDS
        == 86400.0
    )
    assert_one_warning(caplog, "WL_RESOURCE_MONITOR_INTERVAL_SECONDS", "ceiling", "interval_seconds=86400.0")


def test_interval_env_one_day_is_allowed(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    assert tree.load({ENV["interval_seconds"]: "86400"})["interval_seconds"] == 86400.0
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["-1e400", "-" + "9" * 5000])
def test_interval_env_negative_beyond_float_range_is_invalid(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    assert tree.load({ENV["interval_seconds"]: raw})["interval_seconds"] == 15.0
    message = assert_one_warning(caplog, "WL_RESOURCE_MONITOR_INTERVAL_SECONDS", "> 0", "15.0")
    assert len(message) < 300


def test_disable_env_blank_keeps_enabled(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    assert tree.load({ENV["enabled"]: "   "})["enabled"] is True
    assert_no_warnings(caplog)


def test_env_warning_quotes_a_long_value_bounded(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    raw = "x" * 100_000
    cfg = tree.load(
        {
            ENV["step_source"]: raw,
            ENV["categories"]: raw,
            ENV["interval_seconds"]: raw,
        }
    )
    assert (cfg["step_source"], cfg["categories"], cfg["interval_seconds"]) == ("model_age", ALL_ON, 15.0)
    messages = sampler_warnings(caplog)
    assert len(messages) == 3
    assert all(len(m) < 400 and "xxx..." in m for m in messages), messages


# --------------------------------------------------------------------------- YAML over env


def test_file_interval_beats_env(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    write(tree.work / FILE_NAME, section("interval_seconds: 5"))
    cfg = tree.load({ENV["interval_seconds"]: "30"})
    assert cfg["interval_seconds"] == 5.0
    assert isinstance(cfg["interval_seconds"], float)
    assert_no_warnings(caplog)


def test_file_omitted_keys_keep_env_values(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    disk = tree.base / "data"
    disk.mkdir()
    write(tree.work / FILE_NAME, section("interval_seconds: 5"))
    cfg = tree.load(
        {
            ENV["step_source"]: "seconds",
            ENV["disk_path"]: str(disk),
            ENV["categories"]: "cpu",
            ENV["enabled"]: "1",
        }
    )
    assert cfg["interval_seconds"] == 5.0
    assert cfg["step_source"] == "seconds"
    assert cfg["disk_path"] == str(disk)
    assert cfg["categories"] == {name: name == "cpu" for name in settings.DEFAULT_CATEGORIES}
    assert cfg["enabled"] is False
    assert_no_warnings(caplog)


def test_file_categories_override_per_key(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    write(tree.work / FILE_NAME, section("categories: {memory: true, gpu: false}"))
    cats = tree.load({ENV["categories"]: "cpu,gpu"})["categories"]
    assert cats == {**dict.fromkeys(settings.DEFAULT_CATEGORIES, False), "cpu": True, "memory": True}
    assert_no_warnings(caplog)


def test_file_categories_override_defaults(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    write(tree.work / FILE_NAME, section("categories:\n  gpu: false\n  network: false"))
    cats = tree.load()["categories"]
    assert cats == {**ALL_ON, "gpu": False, "network": False}
    assert_no_warnings(caplog)


def test_file_enabled_false_disables(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    write(tree.work / FILE_NAME, section("enabled: false"))
    assert tree.load()["enabled"] is False
    assert_no_warnings(caplog)


def test_file_enabled_true_beats_env_disable(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    # SPEC 4: any key present in the file overrides the env var.
    write(tree.work / FILE_NAME, section("enabled: true"))
    assert tree.load({ENV["enabled"]: "1"})["enabled"] is True
    assert_no_warnings(caplog)


def test_file_step_source_and_disk_path_beat_env(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    env_disk = tree.base / "env_disk"
    file_disk = tree.base / "file_disk"
    env_disk.mkdir()
    file_disk.mkdir()
    write(tree.work / FILE_NAME, section(f"step_source: seconds\ndisk_path: '{file_disk}'"))
    cfg = tree.load({ENV["step_source"]: "model_age", ENV["disk_path"]: str(env_disk)})
    assert cfg["step_source"] == "seconds"
    assert cfg["disk_path"] == str(file_disk)
    assert_no_warnings(caplog)


def test_config_file_reports_the_path_used(tree: Tree) -> None:
    path = write(tree.work / FILE_NAME, section("interval_seconds: 5"))
    assert tree.load()["config_file"] == str(path)


def test_quoted_numeric_interval_is_accepted(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    # Intended leniency: a numeric string is read as a number, the same way the env var is.
    write(tree.work / FILE_NAME, section('interval_seconds: "30"'))
    value = tree.load()["interval_seconds"]
    assert value == 30.0
    assert isinstance(value, float)
    assert_no_warnings(caplog)


# --------------------------------------------------------------------------- lookup order


def test_config_path_dotfile_beats_plain_file(tree: Tree) -> None:
    cfg_dir = tree.base / "cfg"
    dot = write(cfg_dir / DOT_FILE_NAME, section("interval_seconds: 2"))
    write(cfg_dir / FILE_NAME, section("interval_seconds: 3"))
    cfg = tree.load({settings.ENV_CONFIG_PATH: str(cfg_dir)})
    assert cfg["interval_seconds"] == 2.0
    assert cfg["config_file"] == str(dot)


def test_config_path_plain_file_beats_repository_root(tree: Tree) -> None:
    root, nested = make_repo(tree.base)
    write(root / FILE_NAME, section("interval_seconds: 4"))
    cfg_dir = tree.base / "cfg"
    plain = write(cfg_dir / FILE_NAME, section("interval_seconds: 3"))
    cfg = tree.load({settings.ENV_CONFIG_PATH: str(cfg_dir)}, cwd=nested)
    assert cfg["interval_seconds"] == 3.0
    assert cfg["config_file"] == str(plain)


def test_config_path_without_files_falls_through(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    root, nested = make_repo(tree.base)
    root_file = write(root / FILE_NAME, section("interval_seconds: 4"))
    cfg_dir = tree.base / "cfg"
    cfg_dir.mkdir()
    cfg = tree.load({settings.ENV_CONFIG_PATH: str(cfg_dir)}, cwd=nested)
    assert cfg["config_file"] == str(root_file)
    assert_no_warnings(caplog)


@pytest.mark.parametrize("depth", [0, 1, 4])
def test_repository_root_found_from_nested_dir_beats_package(tree: Tree, depth: int) -> None:
    root, nested = make_repo(tree.base, depth=depth)
    root_file = write(root / FILE_NAME, section("interval_seconds: 4"))
    write(tree.pkg / FILE_NAME, section("interval_seconds: 5"))
    if depth:
        write(nested / FILE_NAME, section("interval_seconds: 6"))
    cfg = tree.load(cwd=nested)
    assert cfg["interval_seconds"] == 4.0
    assert cfg["config_file"] == str(root_file)


def test_nearest_git_ancestor_is_the_repository_root(tree: Tree) -> None:
    outer, _ = make_repo(tree.base, depth=0)
    write(outer / FILE_NAME, section("interval_seconds: 7"))
    inner = outer / "vendor" / "inner"
    (inner / ".git").mkdir(parents=True)
    inner_file = write(inner / FILE_NAME, section("interval_seconds: 8"))
    nested = inner / "src"
    nested.mkdir()
    assert tree.load(cwd=nested)["config_file"] == str(inner_file)


def test_package_file_beats_cwd_file(tree: Tree) -> None:
    pkg_file = write(tree.pkg / FILE_NAME, section("interval_seconds: 5"))
    write(tree.work / FILE_NAME, section("interval_seconds: 6"))
    cfg = tree.load()
    assert cfg["interval_seconds"] == 5.0
    assert cfg["config_file"] == str(pkg_file)


def test_cwd_file_used_when_nothing_else_exists(tree: Tree) -> None:
    cwd_file = write(tree.work / FILE_NAME, section("interval_seconds: 6"))
    cfg = tree.load()
    assert cfg["interval_seconds"] == 6.0
    assert cfg["config_file"] == str(cwd_file)


def test_only_the_first_file_found_is_used(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    root, nested = make_repo(tree.base)
    disk = tree.base / "data"
    disk.mkdir()
    cfg_dir = tree.base / "cfg"
    write(cfg_dir / DOT_FILE_NAME, section("interval_seconds: 2"))
    write(cfg_dir / FILE_NAME, section("step_source: seconds\ncategories: {cpu: false}"))
    write(root / FILE_NAME, section(f"disk_path: '{disk}'\nenabled: false"))
    write(tree.pkg / FILE_NAME, section("categories: {gpu: false}"))
    write(nested / FILE_NAME, section("categories: {disk: false}"))
    cfg = tree.load({settings.ENV_CONFIG_PATH: str(cfg_dir)}, cwd=nested)
    assert cfg == {
        "enabled": True,
        "interval_seconds": 2.0,
        "categories": ALL_ON,
        "disk_path": ROOT,
        "step_source": "model_age",
        "store": None,
        "inner_rate_hz": 5.0,
        "gpu_devices": "all",
        "postmortem_dir": str(nested.resolve() / settings.DEFAULT_POSTMORTEM_DIR),
        **NEW_DEFAULTS,
        "config_file": str(cfg_dir / DOT_FILE_NAME),
    }
    assert_no_warnings(caplog)


@pytest.mark.parametrize("kind", ["file", "missing"])
def test_config_path_not_a_directory_warns_and_search_goes_on(
    tree: Tree, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    not_dir = tree.base / "not_a_dir"
    if kind == "file":
        not_dir.write_text("x", encoding="utf-8")
    root, nested = make_repo(tree.base)
    root_file = write(root / FILE_NAME, section("interval_seconds: 4"))
    cfg = tree.load({settings.ENV_CONFIG_PATH: str(not_dir)}, cwd=nested)
    assert cfg["config_file"] == str(root_file)
    assert cfg["interval_seconds"] == 4.0
    assert_one_warning(caplog, "WL_RESOURCE_MONITOR_CONFIG_PATH", quote(str(not_dir)), "not a directory")


# --------------------------------------------------------------------------- bad YAML input


ENV_30 = {ENV["interval_seconds"]: "30", ENV["step_source"]: "seconds"}


def test_unparseable_file_warns_and_uses_env(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tree.work / FILE_NAME, "resource_monitoring: [unclosed\n")
    cfg = tree.load(ENV_30)
    assert cfg["interval_seconds"] == 30.0
    assert cfg["step_source"] == "seconds"
    assert cfg["categories"] == ALL_ON
    assert_one_warning(caplog, str(path))


def test_unparseable_first_file_is_not_replaced_by_a_later_one(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    # The first file found is the one used; when it is broken, env vars and defaults apply.
    path = write(tree.pkg / FILE_NAME, "resource_monitoring: [unclosed\n")
    write(tree.work / FILE_NAME, section("interval_seconds: 6"))
    assert tree.load(ENV_30)["interval_seconds"] == 30.0
    assert_one_warning(caplog, str(path))


def test_undecodable_file_warns_and_uses_env(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = tree.work / FILE_NAME
    path.write_bytes(b"resource_monitoring:\n  interval_seconds: 5\n  step_source: \xff\xfe\n")
    cfg = tree.load(ENV_30)
    assert cfg["interval_seconds"] == 30.0
    assert cfg["step_source"] == "seconds"
    assert_one_warning(caplog, str(path))


@pytest.mark.parametrize("text", ["- interval_seconds: 5\n", "just a string\n", "42\n"])
def test_top_level_not_a_mapping_warns(tree: Tree, caplog: pytest.LogCaptureFixture, text: str) -> None:
    path = write(tree.work / FILE_NAME, text)
    cfg = tree.load(ENV_30)
    assert cfg["interval_seconds"] == 30.0
    assert cfg["step_source"] == "seconds"
    assert_one_warning(caplog, str(path), "top level", "env")


@pytest.mark.parametrize("value", ["[1, 2]", "yes please", "5"])
def test_section_not_a_mapping_warns(tree: Tree, caplog: pytest.LogCaptureFixture, value: str) -> None:
    path = write(tree.work / FILE_NAME, f"resource_monitoring: {value}\n")
    cfg = tree.load(ENV_30)
    assert cfg["interval_seconds"] == 30.0
    assert cfg["step_source"] == "seconds"
    assert_one_warning(caplog, str(path), "resource_monitoring", "env")


def test_unknown_section_key_warns_and_other_keys_apply(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(
        tree.work / FILE_NAME, section("interval_secs: 5\ninterval_seconds: 7\nstep_source: seconds")
    )
    cfg = tree.load()
    assert cfg["interval_seconds"] == 7.0
    assert cfg["step_source"] == "seconds"
    assert_one_warning(caplog, str(path), "interval_secs", "5", "ignor")


def test_unknown_top_level_key_warns_and_section_applies(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tree.work / FILE_NAME, "resource_monitor:\n  x: 1\n" + section("interval_seconds: 7"))
    cfg = tree.load()
    assert cfg["interval_seconds"] == 7.0
    assert_one_warning(caplog, str(path), "resource_monitor=", "ignor")


@pytest.mark.parametrize(
    ("yaml_value", "parsed"),
    [
        ('"abc"', "abc"),
        ("-5", -5),
        (".nan", math.nan),
        (".inf", math.inf),
        ("0", 0),
        ("true", True),
        ("[1, 2]", [1, 2]),
        ("{a: 1}", {"a": 1}),
    ],
)
def test_file_interval_invalid_warns_and_keeps_env(
    tree: Tree, caplog: pytest.LogCaptureFixture, yaml_value: str, parsed: object
) -> None:
    path = write(tree.work / FILE_NAME, section(f"interval_seconds: {yaml_value}"))
    assert tree.load(ENV_30)["interval_seconds"] == 30.0
    assert_one_warning(caplog, str(path), "interval_seconds", repr(parsed), "30.0")


def test_file_interval_invalid_keeps_default(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    write(tree.work / FILE_NAME, section("interval_seconds: -5"))
    assert tree.load()["interval_seconds"] == 15.0
    assert_one_warning(caplog, "-5", "15.0")


def test_file_interval_below_floor_is_clamped(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    write(tree.work / FILE_NAME, section("interval_seconds: 0.5"))
    assert tree.load(ENV_30)["interval_seconds"] == 1.0
    assert_one_warning(caplog, "interval_seconds", "0.5", "1.0")


def test_file_interval_clamp_warning_names_the_file(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    # SPEC 4: a value of the wrong range gets one warning naming the file or variable.
    path = write(tree.work / FILE_NAME, section("interval_seconds: 0.5"))
    tree.load()
    assert_one_warning(caplog, str(path), "0.5", "1.0")


@pytest.mark.parametrize("yaml_value", ["1e12", "86401", "'1e12'", "1" + "0" * 30])
def test_file_interval_above_one_day_is_clamped(
    tree: Tree, caplog: pytest.LogCaptureFixture, yaml_value: str
) -> None:
    path = write(tree.work / FILE_NAME, section(f"interval_seconds: {yaml_value}"))
    assert tree.load(ENV_30)["interval_seconds"] == 86400.0
    assert_one_warning(caplog, str(path), "interval_seconds", "ceiling", "interval_seconds=86400.0")


def test_file_step_source_invalid_warns(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tree.work / FILE_NAME, section("step_source: sideways\ninterval_seconds: 7"))
    cfg = tree.load({ENV["step_source"]: "seconds"})
    assert cfg["step_source"] == "seconds"
    assert cfg["interval_seconds"] == 7.0
    assert_one_warning(caplog, str(path), "step_source", "'sideways'", "'seconds'")


def test_file_step_source_invalid_falls_back_to_default(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    write(tree.work / FILE_NAME, section("step_source: sideways"))
    assert tree.load()["step_source"] == "model_age"
    assert_one_warning(caplog, "'sideways'", "'model_age'")


def test_file_disk_path_missing_is_kept_with_one_warning(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tree.base / "nowhere")
    path = write(tree.work / FILE_NAME, section(f"disk_path: '{missing}'"))
    assert tree.load()["disk_path"] == missing
    assert_one_warning(caplog, str(path), "disk_path", quote(missing), "does not exist", "keeping it")


@pytest.mark.parametrize(
    ("yaml_value", "parsed"), [("5", 5), ("''", ""), ('"a\\0b"', "a\0b"), ("[/a]", ["/a"])]
)
def test_file_disk_path_invalid_warns_and_keeps_env(
    tree: Tree, caplog: pytest.LogCaptureFixture, yaml_value: str, parsed: object
) -> None:
    disk = tree.base / "data"
    disk.mkdir()
    path = write(tree.work / FILE_NAME, section(f"disk_path: {yaml_value}"))
    assert tree.load({ENV["disk_path"]: str(disk)})["disk_path"] == str(disk)
    assert_one_warning(caplog, str(path), "disk_path", repr(parsed), quote(str(disk)))


def test_file_unknown_category_warns_and_others_apply(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tree.work / FILE_NAME, section("categories: {gpu: false, tpu: true, disk: false}"))
    cats = tree.load()["categories"]
    assert cats == {**ALL_ON, "gpu": False, "disk": False}
    assert "tpu" not in cats
    assert_one_warning(caplog, str(path), "tpu", "ignor")


@pytest.mark.parametrize(("yaml_value", "parsed"), [("0", 0), ("5", 5), ('"maybe"', "maybe"), ("[]", [])])
def test_file_category_flag_not_a_bool_warns(
    tree: Tree, caplog: pytest.LogCaptureFixture, yaml_value: str, parsed: object
) -> None:
    path = write(tree.work / FILE_NAME, section(f"categories: {{cpu: {yaml_value}, gpu: false}}"))
    cats = tree.load({ENV["categories"]: "cpu,gpu,memory"})["categories"]
    assert cats["cpu"] is True  # keeps the env value
    assert cats["gpu"] is False  # the valid flag still applies
    assert_one_warning(caplog, str(path), "cpu", repr(parsed), "True")


WORDS_FALSE = ["'false'", "'no'", "'off'", "'0'", "'FALSE'", "'No'", "' off '"]
WORDS_TRUE = ["'true'", "'yes'", "'on'", "'1'", "'TRUE'", "'Yes'"]


@pytest.mark.parametrize("word", WORDS_FALSE)
def test_file_category_flag_quoted_false_word_turns_it_off(
    tree: Tree, caplog: pytest.LogCaptureFixture, word: str
) -> None:
    # SPEC 4: a boolean written as a string means what the same word means in the env vars.
    write(tree.work / FILE_NAME, section(f"categories: {{disk: {word}}}"))
    assert tree.load()["categories"] == {**ALL_ON, "disk": False}
    assert_no_warnings(caplog)


@pytest.mark.parametrize("word", WORDS_TRUE)
def test_file_category_flag_quoted_true_word_turns_it_on(
    tree: Tree, caplog: pytest.LogCaptureFixture, word: str
) -> None:
    write(tree.work / FILE_NAME, section(f"categories: {{disk: {word}}}"))
    cats = tree.load({ENV["categories"]: "cpu"})["categories"]
    assert cats == {name: name in ("cpu", "disk") for name in settings.DEFAULT_CATEGORIES}
    assert_no_warnings(caplog)


def test_file_category_names_are_read_in_any_case(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    write(tree.work / FILE_NAME, section("categories: {GPU: false, ' Disk ': false}"))
    assert tree.load()["categories"] == {**ALL_ON, "gpu": False, "disk": False}
    assert_no_warnings(caplog)


def test_file_categories_as_list_means_only_these(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    # Issue 8: a list, as the env var and the API already take, means "only these"; it beats the env var.
    write(tree.work / FILE_NAME, section("categories: [cpu, GPU]\ninterval_seconds: 7"))
    cfg = tree.load({ENV["categories"]: "memory"})
    assert cfg["categories"] == {name: name in ("cpu", "gpu") for name in settings.DEFAULT_CATEGORIES}
    assert cfg["interval_seconds"] == 7.0
    assert_no_warnings(caplog)


def test_file_categories_empty_list_turns_every_category_off(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    write(tree.work / FILE_NAME, section("categories: []"))
    assert tree.load()["categories"] == dict.fromkeys(settings.DEFAULT_CATEGORIES, False)
    assert_no_warnings(caplog)


def test_file_categories_list_with_unknown_names_uses_the_known_ones(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tree.work / FILE_NAME, section("categories: [cpu, tpu, process]"))
    cats = tree.load({ENV["categories"]: "memory"})["categories"]
    assert cats == {name: name in ("cpu", "process") for name in settings.DEFAULT_CATEGORIES}
    assert_one_warning(
        caplog, f"{path}: resource_monitoring.categories=", "'tpu'", "ignoring that part", "cpu,process"
    )


def test_file_categories_list_of_unknown_names_only_keeps_the_env_value(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tree.work / FILE_NAME, section("categories: [tpu, npu]"))
    cats = tree.load({ENV["categories"]: "memory"})["categories"]
    assert cats == {name: name == "memory" for name in settings.DEFAULT_CATEGORIES}
    assert_one_warning(caplog, str(path), "names no known category", "using categories=memory instead")


@pytest.mark.parametrize(("yaml_value", "parsed"), [("[cpu, 1]", ["cpu", 1]), ("[[cpu]]", [["cpu"]])])
def test_file_categories_list_not_of_strings_warns_and_keeps_the_env_value(
    tree: Tree, caplog: pytest.LogCaptureFixture, yaml_value: str, parsed: object
) -> None:
    path = write(tree.work / FILE_NAME, section(f"categories: {yaml_value}\ninterval_seconds: 7"))
    cfg = tree.load({ENV["categories"]: "memory"})
    assert cfg["categories"] == {name: name == "memory" for name in settings.DEFAULT_CATEGORIES}
    assert cfg["interval_seconds"] == 7.0
    assert_one_warning(
        caplog, str(path), "categories", repr(parsed), "list of category names", "using categories=memory"
    )


@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n\n"])
def test_empty_file_changes_nothing(tree: Tree, caplog: pytest.LogCaptureFixture, text: str) -> None:
    write(tree.work / FILE_NAME, text)
    cfg = tree.load(ENV_30)
    assert cfg["interval_seconds"] == 30.0
    assert cfg["step_source"] == "seconds"
    assert cfg["enabled"] is True
    assert cfg["categories"] == ALL_ON
    assert cfg["disk_path"] == ROOT
    assert_no_warnings(caplog)


@pytest.mark.parametrize(
    ("yaml_value", "parsed"), [("0", 0), ('"maybe"', "maybe"), ("''", ""), ("null", None)]
)
def test_file_enabled_not_a_bool_warns(
    tree: Tree, caplog: pytest.LogCaptureFixture, yaml_value: str, parsed: object
) -> None:
    path = write(tree.work / FILE_NAME, section(f"enabled: {yaml_value}"))
    assert tree.load()["enabled"] is True
    assert_one_warning(caplog, str(path), "enabled", repr(parsed), "True")


@pytest.mark.parametrize("word", WORDS_FALSE)
def test_file_enabled_quoted_false_word_disables(
    tree: Tree, caplog: pytest.LogCaptureFixture, word: str
) -> None:
    write(tree.work / FILE_NAME, section(f"enabled: {word}"))
    assert tree.load()["enabled"] is False
    assert_no_warnings(caplog)


@pytest.mark.parametrize("word", WORDS_TRUE)
def test_file_enabled_quoted_true_word_beats_env_disable(
    tree: Tree, caplog: pytest.LogCaptureFixture, word: str
) -> None:
    write(tree.work / FILE_NAME, section(f"enabled: {word}"))
    assert tree.load({ENV["enabled"]: "1"})["enabled"] is True
    assert_no_warnings(caplog)


def test_several_bad_keys_warn_once_each(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    write(
        tree.work / FILE_NAME,
        section("interval_seconds: abc\nstep_source: sideways\nbogus: 1\ncategories: {tpu: true}"),
    )
    cfg = tree.load()
    assert cfg["interval_seconds"] == 15.0
    assert cfg["step_source"] == "model_age"
    messages = sampler_warnings(caplog)
    assert len(messages) == 4, messages
    for fragment in ("'abc'", "'sideways'", "bogus", "tpu"):
        assert sum(fragment in m for m in messages) == 1, (fragment, messages)


def test_non_string_step_source_warns(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tree.work / FILE_NAME, section("step_source: 5"))
    assert tree.load()["step_source"] == "model_age"
    assert_one_warning(caplog, str(path), "step_source=5", "got int", "'model_age'")


def test_file_that_cannot_be_read_warns_and_uses_env(
    tree: Tree, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root reads any file whatever its mode, so the refusal is simulated at open().
    path = write(tree.work / FILE_NAME, section("interval_seconds: 5"))

    real_open = os.open

    def refuse(name: str, *args: Any, **kwargs: Any) -> int:
        if os.fspath(name) == str(path):
            raise PermissionError(13, "Permission denied", name)
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    cfg = tree.load(ENV_30)
    assert (cfg["interval_seconds"], cfg["config_file"]) == (30.0, None)
    assert_one_warning(caplog, str(path), "Permission denied", "env vars and defaults")


def test_removed_working_directory_skips_the_places_found_from_it(
    tree: Tree, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tree.base / "gone"
    gone.mkdir()
    pkg_file = write(tree.pkg / FILE_NAME, section("interval_seconds: 5"))
    monkeypatch.chdir(gone)
    gone.rmdir()
    cfg = settings.load_resource_monitoring_config(environ={}, package_dir=tree.pkg)
    assert (cfg["interval_seconds"], cfg["config_file"]) == (5.0, str(pkg_file))
    assert_no_warnings(caplog)


# --------------------------------------------------------------------------- one table of fields


def test_every_field_is_a_key_of_the_resolved_config(tree: Tree) -> None:
    keys = [field.key for field in settings.FIELDS]
    assert keys == [
        "enabled",
        "interval_seconds",
        "categories",
        "disk_path",
        "step_source",
        "store",
        "inner_rate_hz",
        "gpu_devices",
        "postmortem_dir",
        *NEW_DEFAULTS,
    ]
    assert set(tree.load()) == {*keys, "config_file"}
    envs = (
        ENV["enabled"],
        ENV["interval_seconds"],
        ENV["categories"],
        ENV["disk_path"],
    )
    assert [field.env for field in settings.FIELDS] == [
        *envs,
        ENV["step_source"],
        ENV["store"],
        ENV["inner_rate_hz"],
        ENV["gpu_devices"],
        ENV["postmortem_dir"],
        ENV["prometheus_port"],
        ENV["prometheus_address"],
        ENV["prometheus_sd_dir"],
        ENV["host_sampling"],
        ENV["run_id"],
        ENV["stall_seconds"],
    ]
    assert ENV["store"] == "WL_RESOURCE_MONITOR_STORE"
    assert [field.flag for field in settings.FIELDS][5:] == [
        "--store",
        "--inner-rate",
        "--gpu-devices",
        "--postmortem-dir",
        "--prometheus-port",
        "--prometheus-address",
        "--prometheus-sd-dir",
        "--host-sampling",
        "--run-id",
        "--stall-seconds",
    ]


def test_defaults_are_fresh_copies() -> None:
    first = settings.defaults()
    first["categories"]["cpu"] = False
    assert settings.defaults()["categories"] == ALL_ON
    assert settings.CATEGORIES.default == ALL_ON


# --------------------------------------------------------------------------- the Python API


def resolve(**overrides: object) -> settings.MonitorSettings:
    arguments: dict[str, Any] = {
        "interval_seconds": 15.0,
        "categories": None,
        "disk_path": ROOT,
        "step_source": "model_age",
        **overrides,
    }
    floor = arguments.pop("min_interval_seconds", settings.MIN_INTERVAL_SECONDS)
    return settings.resolve_settings(arguments, min_interval_seconds=floor)[0]


def test_api_defaults(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    resolved = resolve()
    assert resolved == settings.MonitorSettings(
        interval_seconds=15.0,
        categories=settings.DEFAULT_CATEGORIES,
        disk_path=ROOT,
        step_source="model_age",
        postmortem_dir=os.path.abspath(settings.DEFAULT_POSTMORTEM_DIR),
    )
    assert isinstance(resolved.interval_seconds, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.interval_seconds = 2.0  # type: ignore[misc]
    assert_no_warnings(caplog)


@pytest.mark.parametrize(
    ("raw", "expected"), [(30, 30.0), (2.5, 2.5), (86400, 86400.0), (1, 1.0)]
)  # fmt: skip
def test_api_interval_valid(caplog: pytest.LogCaptureFixture, raw: object, expected: float) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    assert resolve(interval_seconds=raw).interval_seconds == expected
    assert_no_warnings(caplog)


def test_api_interval_accepts_any_real_number() -> None:
    from fractions import Fraction

    assert resolve(interval_seconds=Fraction(5, 2)).interval_seconds == 2.5


@pytest.mark.parametrize(
    ("raw", "floor", "expected", "fragment"),
    [
        (0.5, 1.0, 1.0, "below the 1 s floor"),
        (0.01, 0.05, 0.05, "below the 0.05 s floor"),
        (1e12, 1.0, 86400.0, "above the 86400 s (one day) ceiling"),
        (10**400, 1.0, 86400.0, "above the 86400 s (one day) ceiling"),
    ],
)
def test_api_interval_is_clamped_with_one_warning(
    caplog: pytest.LogCaptureFixture, raw: object, floor: float, expected: float, fragment: str
) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    assert resolve(interval_seconds=raw, min_interval_seconds=floor).interval_seconds == expected
    message = assert_one_warning(caplog, "ResourceMonitor: interval_seconds=", fragment, repr(expected))
    assert len(message) < 200


def test_api_interval_floor_can_be_lowered() -> None:
    assert resolve(interval_seconds=0.1, min_interval_seconds=0.05).interval_seconds == 0.1


@pytest.mark.parametrize("raw", ["30", "abc", True, None, [1], b"5"])
def test_api_interval_of_the_wrong_type_is_a_type_error(raw: object) -> None:
    with pytest.raises(TypeError, match=r"interval_seconds=.*expected a number of seconds"):
        resolve(interval_seconds=raw)


@pytest.mark.parametrize("raw", [math.nan, math.inf, -math.inf, -5, 0, 0.0, -(10**400)])
def test_api_interval_out_of_range_is_a_value_error(raw: object) -> None:
    with pytest.raises(ValueError, match=r"interval_seconds=.*finite number of seconds > 0"):
        resolve(interval_seconds=raw)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, settings.DEFAULT_CATEGORIES),
        (["gpu", "cpu"], ("cpu", "gpu")),
        (("process",), ("process",)),
        ([], ()),
        (iter(["disk", "disk"]), ("disk",)),
        (["CPU", " Memory "], ("cpu", "memory")),
        ({"cpu": True, "memory": False, "disk": False, "network": True}, ("cpu", "network")),
        ({"gpu": "false", "cpu": "YES", "disk": "0", "memory": "on"}, ("cpu", "memory")),
    ],
)
def test_api_categories(raw: object, expected: tuple[str, ...]) -> None:
    assert resolve(categories=raw).categories == expected


@pytest.mark.parametrize("raw", ["cpu", "cpu,gpu", b"cpu", 5, 1.5, object()])
def test_api_categories_not_a_list_is_a_type_error(raw: object) -> None:
    with pytest.raises(TypeError, match="expected a list of category names"):
        resolve(categories=raw)


def test_api_categories_plain_string_is_not_split_into_letters() -> None:
    with pytest.raises(TypeError) as info:
        resolve(categories="cpu")
    assert "'c'" not in str(info.value)
    assert "categories='cpu'" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (["cpu", "gpus"], "'gpus'"),
        ({"tpu": True}, "'tpu'"),
        ({"tpu": False, "cpu": True}, "'tpu'"),
        ([1, "cpu"], "1"),
        ([None], "None"),
    ],
)
def test_api_unknown_categories_are_a_value_error_naming_them(raw: object, named: str) -> None:
    with pytest.raises(ValueError, match="unknown categor") as info:
        resolve(categories=raw)
    assert named in str(info.value)
    assert "known: cpu, memory, gpu, disk, network, process" in str(info.value)


def test_api_many_unknown_categories_are_named_bounded() -> None:
    with pytest.raises(ValueError) as info:
        resolve(categories=[f"bogus{i}" for i in range(10_000)])
    assert "'bogus0'" in str(info.value) and "'bogus5'" not in str(info.value)
    assert len(str(info.value)) < 400


@pytest.mark.parametrize(("flag", "error"), [("maybe", ValueError), (5, TypeError), (None, TypeError)])
def test_api_category_flag_must_be_a_bool_or_a_word(flag: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="'gpu': expected"):
        resolve(categories={"cpu": True, "gpu": flag})


def test_api_disk_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    assert resolve(disk_path="data").disk_path == str(tmp_path / "data")
    assert resolve(disk_path=tmp_path / "data").disk_path == str(tmp_path / "data")


def test_api_missing_disk_path_is_kept_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    missing = tmp_path / "not" / "yet"
    assert resolve(disk_path=missing).disk_path == str(missing)
    assert_one_warning(
        caplog, "ResourceMonitor: disk_path=", "does not exist (yet)", "skipped until it appears"
    )


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [
        ("", ValueError, "non-empty"),
        ("  ", ValueError, "non-empty"),
        ("a\0b", ValueError, "NUL"),
        (5, TypeError, "expected a path"),
        (None, TypeError, "expected a path"),
        (b"/tmp", TypeError, "expected a path"),
    ],
)
def test_api_bad_disk_path(raw: object, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        resolve(disk_path=raw)


@pytest.mark.parametrize(("raw", "expected"), [("seconds", "seconds"), (" Model_Age ", "model_age")])
def test_api_step_source(raw: str, expected: str) -> None:
    assert resolve(step_source=raw).step_source == expected


@pytest.mark.parametrize(("raw", "error"), [("sideways", ValueError), ("", ValueError), (5, TypeError)])
def test_api_bad_step_source(raw: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"step_source=.*model_age, seconds"):
        resolve(step_source=raw)


def test_api_store_defaults_to_none() -> None:
    assert resolve().store is None
    assert settings.MonitorSettings().store is None


def test_api_store_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve(store="runs.sqlite").store == str(tmp_path / "runs.sqlite")
    assert resolve(store=tmp_path / "a.db").store == str(tmp_path / "a.db")


@pytest.mark.parametrize("raw", [None, False, "false", " OFF ", "0"])
def test_api_store_off(raw: object) -> None:
    assert resolve(store=raw).store is None


@pytest.mark.parametrize("where", ["missing directory", "a directory"])
def test_api_store_that_cannot_be_used_warns_and_is_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    # Issue 8: a store that cannot be opened gets one clear warning and monitoring goes on.
    caplog.set_level(logging.WARNING, logger="sampler")
    raw = tmp_path / "no" / "such" / "runs.db" if where == "missing directory" else tmp_path
    assert resolve(store=raw).store is None
    fragment = "does not exist" if where == "missing directory" else "is a directory"
    assert_one_warning(caplog, "ResourceMonitor: store=", fragment, "using store=None (no store)")


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [
        (5, TypeError, "got int"),
        (True, TypeError, "got bool"),
        (b"/tmp/x.db", TypeError, "got bytes"),
        ("", ValueError, "empty path"),
        ("yes", ValueError, "write ./yes"),
        ("a\0b", ValueError, "NUL"),
    ],
)
def test_api_bad_store(raw: object, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        resolve(store=raw)


# --------------------------------------------------------------------------- the store key


def test_store_env_is_made_absolute(
    tree: Tree, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree.base)
    result = tree.resolve({ENV["store"]: "runs.sqlite"})
    assert result.values["store"] == str(tree.base / "runs.sqlite")
    assert result.sources["store"] == "WL_RESOURCE_MONITOR_STORE"
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["", "   "])
def test_store_env_empty_is_unset(tree: Tree, caplog: pytest.LogCaptureFixture, raw: str) -> None:
    result = tree.resolve({ENV["store"]: raw})
    assert result.values["store"] is None
    assert result.sources["store"] == settings.DEFAULT_SOURCE
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["0", "false", "OFF", "no"])
def test_store_env_false_word_is_off(tree: Tree, caplog: pytest.LogCaptureFixture, raw: str) -> None:
    result = tree.resolve({ENV["store"]: raw})
    assert result.values["store"] is None
    assert result.sources["store"] == "WL_RESOURCE_MONITOR_STORE"
    assert_no_warnings(caplog)


def test_store_env_in_a_missing_directory_warns_and_falls_back(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tree.base / "nowhere" / "runs.sqlite"
    result = tree.resolve({ENV["store"]: str(missing)})
    assert result.values["store"] is None
    assert result.sources["store"] == settings.DEFAULT_SOURCE
    assert_one_warning(
        caplog, "WL_RESOURCE_MONITOR_STORE=", "does not exist", quote(str(missing.parent)), "store=None"
    )


def test_store_env_true_word_is_not_a_path(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    assert tree.load({ENV["store"]: "1"})["store"] is None
    assert_one_warning(caplog, "WL_RESOURCE_MONITOR_STORE='1'", "path of a SQLite file", "./1")


def test_store_file_beats_env_and_is_made_absolute(
    tree: Tree, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree.work)
    (tree.base / "env").mkdir()
    path = write(tree.work / FILE_NAME, section("store: runs/here.sqlite"))
    (tree.work / "runs").mkdir()
    result = tree.resolve({ENV["store"]: str(tree.base / "env" / "x.db")})
    assert result.values["store"] == str(tree.work / "runs" / "here.sqlite")
    assert result.sources["store"] == f"{path}: resource_monitoring.store"
    assert_no_warnings(caplog)


@pytest.mark.parametrize("yaml_value", ["null", "false", "'false'", "'off'", "no", "'0'", "~"])
def test_store_file_null_or_false_turns_the_env_store_off(
    tree: Tree, caplog: pytest.LogCaptureFixture, yaml_value: str
) -> None:
    path = write(tree.work / FILE_NAME, section(f"store: {yaml_value}"))
    result = tree.resolve({ENV["store"]: str(tree.base / "x.db")})
    assert result.values["store"] is None
    assert result.sources["store"] == f"{path}: resource_monitoring.store"
    assert_no_warnings(caplog)


@pytest.mark.parametrize(
    ("yaml_value", "fragment"),
    [
        ("true", "got bool"),
        ("'yes'", "./yes"),
        ("''", "empty path"),
        ("5", "got int"),
        ("[a.db]", "got list"),
        ("/nowhere/at/all/x.db", "does not exist"),
        (".", "is a directory"),
    ],
)
def test_store_file_invalid_warns_and_keeps_env(
    tree: Tree, caplog: pytest.LogCaptureFixture, yaml_value: str, fragment: str
) -> None:
    env_store = str(tree.base / "env.db")
    path = write(tree.work / FILE_NAME, section(f"store: {yaml_value}"))
    result = tree.resolve({ENV["store"]: env_store})
    assert result.values["store"] == env_store
    assert result.sources["store"] == "WL_RESOURCE_MONITOR_STORE"
    assert_one_warning(caplog, f"{path}: resource_monitoring.store=", fragment, quote(env_store))


# --------------------------------------------------------------------------- provenance: resolve_config


def test_resolution_of_nothing_is_all_defaults(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    result = tree.resolve()
    assert result.values == tree.load()
    assert set(result.sources) == {field.key for field in settings.FIELDS} | {
        f"categories.{name}" for name in settings.DEFAULT_CATEGORIES
    }
    assert set(result.sources.values()) == {"built-in default"}
    assert (result.used_file, result.found_file, result.warnings) == (None, None, ())
    assert result.looked_for == (tree.pkg / FILE_NAME, tree.work / FILE_NAME)
    with pytest.raises(AttributeError):
        result.used_file = None  # type: ignore[misc]
    assert_no_warnings(caplog)


def test_load_is_the_values_of_the_resolution(tree: Tree) -> None:
    write(tree.work / FILE_NAME, section("interval_seconds: 7\ncategories: {gpu: false}"))
    env = {ENV["step_source"]: "seconds"}
    assert tree.load(env) == tree.resolve(env).values


def test_sources_name_each_env_var(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    disk = tree.base / "data"
    disk.mkdir()
    environ = {
        ENV["enabled"]: "0",
        ENV["interval_seconds"]: "30",
        ENV["categories"]: "cpu",
        ENV["disk_path"]: str(disk),
        ENV["step_source"]: "seconds",
        ENV["store"]: str(tree.base / "runs.db"),
        ENV["inner_rate_hz"]: "20",
        ENV["gpu_devices"]: "visible",
        ENV["postmortem_dir"]: str(tree.base / "pm"),
        ENV["prometheus_port"]: "9400",
        ENV["prometheus_address"]: "0.0.0.0",
        ENV["prometheus_sd_dir"]: str(tree.base / "sd"),
        ENV["host_sampling"]: "every_rank",
        ENV["run_id"]: "job-7",
        ENV["stall_seconds"]: "off",
    }
    result = tree.resolve(environ)
    for field in settings.FIELDS:
        assert result.sources[field.key] == field.env
    for name in settings.DEFAULT_CATEGORIES:
        assert result.sources[f"categories.{name}"] == "WL_RESOURCE_MONITOR_CATEGORIES"
    assert result.values["store"] == str(tree.base / "runs.db")
    assert_no_warnings(caplog)


def test_sources_name_the_file_and_key_that_beat_the_env(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    disk = tree.base / "data"
    disk.mkdir()
    body = (
        f"enabled: false\ninterval_seconds: 5\ncategories: [cpu, gpu]\ndisk_path: '{disk}'\n"
        f"step_source: seconds\nstore: '{tree.base / 'runs.db'}'\ninner_rate_hz: 20\n"
        f"gpu_devices: [0, GPU-abc]\npostmortem_dir: '{tree.base / 'pm'}'\nprometheus_port: 9400\n"
        f"prometheus_address: 0.0.0.0\nprometheus_sd_dir: '{tree.base / 'sd'}'\nhost_sampling: every_rank\n"
        "run_id: job-7\nstall_seconds: 90"
    )
    path = write(tree.work / FILE_NAME, section(body))
    environ = {
        ENV["interval_seconds"]: "30",
        ENV["categories"]: "memory",
        ENV["store"]: "off",
    }
    result = tree.resolve(environ)
    for field in settings.FIELDS:
        assert result.sources[field.key] == f"{path}: resource_monitoring.{field.key}"
    for name in settings.DEFAULT_CATEGORIES:
        assert result.sources[f"categories.{name}"] == f"{path}: resource_monitoring.categories"
    assert result.values["categories"] == {
        name: name in ("cpu", "gpu") for name in settings.DEFAULT_CATEGORIES
    }
    assert_no_warnings(caplog)


def test_sources_of_file_mapping_are_per_category(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tree.work / FILE_NAME, section("categories: {gpu: false, Disk: 'yes'}"))
    result = tree.resolve({ENV["categories"]: "cpu,gpu"})
    assert result.values["categories"] == {
        name: name in ("cpu", "disk") for name in settings.DEFAULT_CATEGORIES
    }
    where = f"{path}: resource_monitoring.categories"
    assert result.sources["categories.gpu"] == f"{where}.gpu"
    assert result.sources["categories.disk"] == f"{where}.Disk"
    for name in ("cpu", "memory", "network", "process"):
        assert result.sources[f"categories.{name}"] == "WL_RESOURCE_MONITOR_CATEGORIES"
    assert result.sources["categories"] == f"WL_RESOURCE_MONITOR_CATEGORIES, then {where} (gpu, disk)"
    assert result.sources["interval_seconds"] == "built-in default"
    assert_no_warnings(caplog)


def test_file_mapping_of_every_category_is_the_source_of_all(tree: Tree) -> None:
    flags = ", ".join(f"{name}: true" for name in settings.DEFAULT_CATEGORIES)
    path = write(tree.work / FILE_NAME, section(f"categories: {{{flags}}}"))
    result = tree.resolve({ENV["categories"]: "cpu"})
    assert result.sources["categories"] == f"{path}: resource_monitoring.categories"


def test_a_value_that_is_not_used_is_not_a_source(tree: Tree) -> None:
    path = write(
        tree.work / FILE_NAME,
        section("interval_seconds: abc\ncategories: {cpu: maybe, tpu: true}\nstep_source: sideways"),
    )
    result = tree.resolve(
        {
            ENV["interval_seconds"]: "30",
            ENV["disk_path"]: "",
            ENV["categories"]: "x",
        }
    )
    assert result.values["interval_seconds"] == 30.0
    assert result.sources["interval_seconds"] == "WL_RESOURCE_MONITOR_INTERVAL_SECONDS"
    assert result.sources["disk_path"] == "built-in default"
    assert result.sources["step_source"] == "built-in default"
    assert result.sources["categories"] == "built-in default"
    assert result.sources["categories.cpu"] == "built-in default"
    assert result.used_file == path
    assert len(result.warnings) == 6


def test_a_value_used_in_part_or_clamped_is_a_source(tree: Tree) -> None:
    path = write(tree.work / FILE_NAME, section("interval_seconds: 0.2"))
    result = tree.resolve({ENV["categories"]: "cpu,bogus"})
    assert result.sources["categories"] == "WL_RESOURCE_MONITOR_CATEGORIES"
    assert result.sources["interval_seconds"] == f"{path}: resource_monitoring.interval_seconds"
    assert len(result.warnings) == 2


def test_looked_for_in_lookup_order_and_the_file_used(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    root, nested = make_repo(tree.base)
    cfg_dir = tree.base / "cfg"
    cfg_dir.mkdir()
    root_file = write(root / FILE_NAME, section("interval_seconds: 4"))
    write(tree.pkg / FILE_NAME, section("interval_seconds: 5"))
    result = tree.resolve({settings.ENV_CONFIG_PATH: str(cfg_dir)}, cwd=nested)
    assert result.looked_for == (
        cfg_dir / DOT_FILE_NAME,
        cfg_dir / FILE_NAME,
        root / FILE_NAME,
        tree.pkg / FILE_NAME,
        nested / FILE_NAME,
    )
    assert result.used_file == result.found_file == root_file
    assert result.values["config_file"] == str(root_file)
    assert result.sources["interval_seconds"] == f"{root_file}: resource_monitoring.interval_seconds"
    assert_no_warnings(caplog)


def test_looked_for_names_each_place_once(tree: Tree) -> None:
    root, _ = make_repo(tree.base, depth=0)
    result = tree.resolve(cwd=root)  # the repository root is also the working directory
    assert result.looked_for == (root / FILE_NAME, tree.pkg / FILE_NAME)


def test_a_file_found_but_unusable_is_not_used(tree: Tree) -> None:
    path = write(tree.work / FILE_NAME, "resource_monitoring: [unclosed\n")
    result = tree.resolve(ENV_30)
    assert result.found_file == path
    assert result.used_file is None
    assert result.values["config_file"] is None
    assert result.sources["interval_seconds"] == "WL_RESOURCE_MONITOR_INTERVAL_SECONDS"
    (message,) = result.warnings
    assert str(path) in message and "env vars and defaults for every key" in message


def test_warnings_are_captured_in_order_and_logged(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tree.work / FILE_NAME, section("step_source: sideways\nbogus: 1"))
    environ = {ENV["interval_seconds"]: "abc", settings.ENV_CONFIG_PATH: str(tree.base / "nope")}
    result = tree.resolve(environ)
    assert list(result.warnings) == sampler_warnings(caplog)
    assert len(result.warnings) == 4
    first, second, third, fourth = result.warnings
    assert first.startswith("resource monitor: WL_RESOURCE_MONITOR_INTERVAL_SECONDS='abc'")
    assert second.startswith("resource monitor: WL_RESOURCE_MONITOR_CONFIG_PATH=")
    assert "not a directory" in second
    assert third.startswith(f"resource monitor: {path}: resource_monitoring.step_source='sideways'")
    assert fourth.startswith(f"resource monitor: {path}: resource_monitoring.bogus=1")


def test_warnings_can_be_captured_without_logging(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    result = tree.resolve({ENV["interval_seconds"]: "abc"}, log_warnings=False)
    assert len(result.warnings) == 1 and "'abc'" in result.warnings[0]
    assert_no_warnings(caplog)
    tree.resolve({ENV["interval_seconds"]: "abc"})  # the switch does not outlive the call
    assert len(sampler_warnings(caplog)) == 1


def test_each_resolution_reports_a_missing_disk_path(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    missing = str(tree.base / "not" / "yet")
    for _ in range(2):
        (message,) = tree.resolve({ENV["disk_path"]: missing}).warnings
        assert "does not exist (yet)" in message
    # ... while the API, given the same path after the configuration, does not repeat it.
    caplog.clear()
    assert resolve(disk_path=missing).disk_path == missing
    assert_no_warnings(caplog)


def test_warnings_outside_a_resolution_are_not_kept(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError):
        resolve(interval_seconds=-1)
    resolve(interval_seconds=0.5)  # a remark, logged
    assert len(sampler_warnings(caplog)) == 1
    assert tree.resolve().warnings == ()


# --------------------------------------------------------------------------- .yml files: ignored, said once


def test_yml_file_alone_is_ignored_with_one_warning(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    yml = write(tree.work / "resource_monitoring.yml", section("interval_seconds: 5"))
    result = tree.resolve()
    assert result.values["interval_seconds"] == 15.0
    assert result.used_file is None
    (message,) = result.warnings
    assert message == (
        f"resource monitor: ignoring {yml}: the configuration file is read only when named "
        "resource_monitoring.yaml (.yml is not looked for); rename it to resource_monitoring.yaml to use it"
    )
    assert_one_warning(caplog, str(yml))


def test_yml_file_beside_the_yaml_is_ignored_with_one_warning(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    write(tree.work / "resource_monitoring.yml", "not: [even, yaml")
    used = write(tree.work / FILE_NAME, section("interval_seconds: 6"))
    result = tree.resolve()
    assert result.values["interval_seconds"] == 6.0
    assert result.used_file == used
    assert_one_warning(
        caplog,
        str(tree.work / "resource_monitoring.yml"),
        "resource_monitoring.yaml beside it is used instead",
    )


def test_yml_files_in_the_config_directory(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    cfg_dir = tree.base / "cfg"
    dot_yml = write(cfg_dir / ".resource_monitoring.yml", section("interval_seconds: 2"))
    plain_yml = write(cfg_dir / "resource_monitoring.yml", section("interval_seconds: 3"))
    result = tree.resolve({settings.ENV_CONFIG_PATH: str(cfg_dir)})
    assert result.values["interval_seconds"] == 15.0
    assert len(result.warnings) == 2
    expected = "read only when named .resource_monitoring.yaml or resource_monitoring.yaml"
    assert str(dot_yml) in result.warnings[0] and expected in result.warnings[0]
    assert "rename it to .resource_monitoring.yaml" in result.warnings[0]
    assert (
        str(plain_yml) in result.warnings[1] and "rename it to resource_monitoring.yaml" in result.warnings[1]
    )
    assert len(sampler_warnings(caplog)) == 2


def test_dot_yml_beside_the_repository_file(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    root, nested = make_repo(tree.base)
    dot_yml = write(root / ".resource_monitoring.yml", section("interval_seconds: 2"))
    result = tree.resolve(cwd=nested)
    (message,) = result.warnings
    assert str(dot_yml) in message and "rename it to resource_monitoring.yaml to use it" in message


def test_yml_where_the_lookup_does_not_reach_is_not_mentioned(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    root, nested = make_repo(tree.base)
    write(root / FILE_NAME, section("interval_seconds: 4"))
    write(nested / "resource_monitoring.yml", section("interval_seconds: 6"))  # the cwd: after the root
    write(tree.pkg / "resource_monitoring.yml", section("interval_seconds: 6"))
    result = tree.resolve(cwd=nested)
    assert result.values["interval_seconds"] == 4.0
    assert result.warnings == ()
    assert_no_warnings(caplog)


def test_yml_in_every_place_visited_is_mentioned_once_each(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = make_repo(tree.base, depth=0)
    write(root / "resource_monitoring.yml", "")
    write(tree.pkg / "resource_monitoring.yml", "")
    result = tree.resolve(cwd=root)  # root is the repository root and the cwd: one place, one warning
    assert [str(root) in m for m in result.warnings] == [True, False]
    assert [str(tree.pkg) in m for m in result.warnings] == [False, True]


# --------------------------------------------------------------------------- prometheus_port

PORT_ENV = "WL_RESOURCE_MONITOR_PROMETHEUS_PORT"
NO_ENDPOINT = "using prometheus_port=None (no endpoint) instead"


def test_new_env_var_names() -> None:
    assert (
        ENV["prometheus_port"],
        ENV["prometheus_address"],
        ENV["prometheus_sd_dir"],
        ENV["host_sampling"],
        ENV["run_id"],
    ) == (
        PORT_ENV,
        "WL_RESOURCE_MONITOR_PROMETHEUS_ADDRESS",
        "WL_RESOURCE_MONITOR_PROMETHEUS_SD_DIR",
        "WL_RESOURCE_MONITOR_HOST_SAMPLING",
        "WL_RESOURCE_MONITOR_RUN_ID",
    )


@pytest.mark.parametrize(("raw", "expected"), [("9400", 9400), (" 1 ", 1), ("65535", 65535), ("08080", 8080)])
def test_prometheus_port_env_valid(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str, expected: int
) -> None:
    result = tree.resolve({PORT_ENV: raw})
    assert result.values["prometheus_port"] == expected
    assert result.sources["prometheus_port"] == PORT_ENV
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["", "   ", "off", "FALSE", "no"])
def test_prometheus_port_env_blank_or_false_word_is_no_endpoint(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    assert tree.load({PORT_ENV: raw})["prometheus_port"] is None
    assert_no_warnings(caplog)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("70000", "in 1..65535"),
        ("65536", "in 1..65535"),
        ("abc", "expected a port number (1..65535), or false/off for none"),
        ("true", "expected a port number"),
        ("-1", "expected a port number"),
        ("9400.5", "expected a port number"),
        ("\uff19\uff14\uff10\uff10", "expected a port number"),  # fullwidth digits: isdigit() but no port
        ("0", "in 1..65535, or false/off for none"),  # a port, not a false word: off is spelled off
        ("00", "in 1..65535"),
        ("94_00", "expected a port number"),  # int() reads 9400
        ("+9400", "expected a port number"),
        ("9" * 5000, "expected a port number"),  # past the digits int() converts: no traceback
    ],
)
def test_prometheus_port_env_invalid_warns_once_and_has_no_endpoint(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str, fragment: str
) -> None:
    result = tree.resolve({PORT_ENV: raw})
    assert result.values["prometheus_port"] is None
    assert result.sources["prometheus_port"] == settings.DEFAULT_SOURCE
    assert_one_warning(caplog, f"{PORT_ENV}={quote(raw)} is invalid", fragment, NO_ENDPOINT)


def test_prometheus_port_file_beats_env(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tree.work / FILE_NAME, section("prometheus_port: 9400"))
    result = tree.resolve({PORT_ENV: "9000"})
    assert result.values["prometheus_port"] == 9400
    assert result.sources["prometheus_port"] == f"{path}: resource_monitoring.prometheus_port"
    assert_no_warnings(caplog)


@pytest.mark.parametrize("yaml_value", ["null", "false", "'off'", "''"])
def test_prometheus_port_file_null_or_false_turns_the_env_port_off(
    tree: Tree, caplog: pytest.LogCaptureFixture, yaml_value: str
) -> None:
    write(tree.work / FILE_NAME, section(f"prometheus_port: {yaml_value}"))
    assert tree.load({PORT_ENV: "9000"})["prometheus_port"] is None
    assert_no_warnings(caplog)


@pytest.mark.parametrize(
    ("raw", "expected"), [(9400, 9400), ("9400", 9400), (1, 1), (65535, 65535), (None, None), (False, None)]
)
def test_api_prometheus_port(caplog: pytest.LogCaptureFixture, raw: object, expected: int | None) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    assert resolve(prometheus_port=raw).prometheus_port == expected
    assert resolve().prometheus_port is None
    assert_no_warnings(caplog)


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [
        (0, ValueError, r"in 1\.\.65535"),
        ("0", ValueError, r"in 1\.\.65535, or false/off for none"),
        ("94_00", ValueError, "expected a port number"),
        (70000, ValueError, r"in 1\.\.65535"),
        (-1, ValueError, r"in 1\.\.65535"),
        ("abc", ValueError, "expected a port number"),
        (True, TypeError, "got bool"),
        (9400.0, TypeError, "got float"),
    ],
)
def test_api_bad_prometheus_port(raw: object, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=rf"prometheus_port=.*{fragment}"):
        resolve(prometheus_port=raw)


# --------------------------------------------------------------------------- prometheus_address

ADDRESS_ENV = "WL_RESOURCE_MONITOR_PROMETHEUS_ADDRESS"
LOCAL_ONLY = "using prometheus_address='127.0.0.1' instead"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("0.0.0.0", "0.0.0.0"), (" ::1 ", "::1"), ("node-3.example.org", "node-3.example.org")],
)
def test_prometheus_address_env_valid(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str, expected: str
) -> None:
    result = tree.resolve({ADDRESS_ENV: raw})
    assert result.values["prometheus_address"] == expected
    assert result.sources["prometheus_address"] == ADDRESS_ENV
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["", "   "])
def test_prometheus_address_env_blank_warns_and_stays_local(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    result = tree.resolve({ADDRESS_ENV: raw})
    assert result.values["prometheus_address"] == settings.DEFAULT_PROMETHEUS_ADDRESS == "127.0.0.1"
    assert result.sources["prometheus_address"] == settings.DEFAULT_SOURCE
    assert_one_warning(
        caplog, f"{ADDRESS_ENV}={quote(raw)} is invalid", "host name or IP address", LOCAL_ONLY
    )


@pytest.mark.parametrize("raw", ["a b", "host\tname", "bell\x07", "h" * 256])
def test_prometheus_address_env_invalid_warns_once_and_stays_local(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    assert tree.load({ADDRESS_ENV: raw})["prometheus_address"] == "127.0.0.1"
    assert_one_warning(
        caplog, f"{ADDRESS_ENV}={quote(raw)} is invalid", "host name or IP address", LOCAL_ONLY
    )


def test_prometheus_address_file_beats_env(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tree.work / FILE_NAME, section("prometheus_address: 0.0.0.0"))
    result = tree.resolve({ADDRESS_ENV: "10.0.0.1"})
    assert result.values["prometheus_address"] == "0.0.0.0"
    assert result.sources["prometheus_address"] == f"{path}: resource_monitoring.prometheus_address"
    assert_no_warnings(caplog)


def test_api_prometheus_address() -> None:
    assert resolve().prometheus_address == "127.0.0.1"
    assert resolve(prometheus_address=" 0.0.0.0 ").prometheus_address == "0.0.0.0"
    assert resolve(prometheus_address="gpu-node-7").prometheus_address == "gpu-node-7"


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [
        ("", ValueError, "host name or IP address"),
        ("a b", ValueError, "host name or IP address"),
        ("h" * 256, ValueError, "host name or IP address"),
        (None, TypeError, "got NoneType"),
        (5, TypeError, "got int"),
    ],
)
def test_api_bad_prometheus_address(raw: object, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=rf"prometheus_address=.*{fragment}"):
        resolve(prometheus_address=raw)


# --------------------------------------------------------------------------- prometheus_sd_dir

SD_ENV = "WL_RESOURCE_MONITOR_PROMETHEUS_SD_DIR"
NO_DISCOVERY = "using prometheus_sd_dir=None (no discovery file) instead"


def test_prometheus_sd_dir_env_is_made_absolute(
    tree: Tree, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree.base)
    result = tree.resolve({SD_ENV: "sd/targets"})  # need not exist yet: created when first written
    assert result.values["prometheus_sd_dir"] == str(tree.base / "sd" / "targets")
    assert result.sources["prometheus_sd_dir"] == SD_ENV
    assert_no_warnings(caplog)


@pytest.mark.parametrize(
    ("raw", "source"), [("", settings.DEFAULT_SOURCE), ("  ", settings.DEFAULT_SOURCE), ("off", SD_ENV)]
)
def test_prometheus_sd_dir_env_blank_or_false_is_none(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str, source: str
) -> None:
    result = tree.resolve({SD_ENV: raw})
    assert result.values["prometheus_sd_dir"] is None
    assert result.sources["prometheus_sd_dir"] == source
    assert_no_warnings(caplog)


@pytest.mark.parametrize(
    ("what", "fragment"),
    [("a file", "exists and is not a directory"), ("yes", "write ./yes"), ("nul", "NUL")],
)
def test_prometheus_sd_dir_env_invalid_warns_once(
    tree: Tree, caplog: pytest.LogCaptureFixture, what: str, fragment: str
) -> None:
    raw = {"a file": str(write(tree.base / "plain", "")), "yes": "yes", "nul": "a\0b"}[what]
    result = tree.resolve({SD_ENV: raw})
    assert result.values["prometheus_sd_dir"] is None
    assert_one_warning(caplog, f"{SD_ENV}=", fragment, NO_DISCOVERY)


def test_prometheus_sd_dir_file_beats_env_and_false_turns_it_off(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tree.work / FILE_NAME, section(f"prometheus_sd_dir: '{tree.base / 'file_sd'}'"))
    result = tree.resolve({SD_ENV: str(tree.base / "env_sd")})
    assert result.values["prometheus_sd_dir"] == str(tree.base / "file_sd")
    assert result.sources["prometheus_sd_dir"] == f"{path}: resource_monitoring.prometheus_sd_dir"
    write(path, section("prometheus_sd_dir: false"))
    assert tree.load({SD_ENV: str(tree.base / "env_sd")})["prometheus_sd_dir"] is None
    assert_no_warnings(caplog)


def test_api_prometheus_sd_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve().prometheus_sd_dir is None
    assert resolve(prometheus_sd_dir="sd").prometheus_sd_dir == str(tmp_path / "sd")
    assert resolve(prometheus_sd_dir=tmp_path / "x").prometheus_sd_dir == str(tmp_path / "x")
    assert resolve(prometheus_sd_dir=False).prometheus_sd_dir is None
    assert resolve(prometheus_sd_dir="off").prometheus_sd_dir is None


def test_api_prometheus_sd_dir_that_is_a_file_warns_and_is_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    plain = write(tmp_path / "plain", "")
    assert resolve(prometheus_sd_dir=plain).prometheus_sd_dir is None
    assert_one_warning(caplog, "ResourceMonitor: prometheus_sd_dir=", "not a directory", NO_DISCOVERY)


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [("yes", ValueError, "write ./yes"), ("", ValueError, "empty path"), (True, TypeError, "got bool")],
)
def test_api_bad_prometheus_sd_dir(raw: object, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=rf"prometheus_sd_dir=.*{fragment}"):
        resolve(prometheus_sd_dir=raw)


# --------------------------------------------------------------------------- host_sampling

SAMPLING_ENV = "WL_RESOURCE_MONITOR_HOST_SAMPLING"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("every_rank", "every_rank"), (" Every_Rank ", "every_rank"), ("LOCAL_RANK_0", "local_rank_0")],
)
def test_host_sampling_env_valid(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str, expected: str
) -> None:
    result = tree.resolve({SAMPLING_ENV: raw})
    assert result.values["host_sampling"] == expected
    assert result.sources["host_sampling"] == SAMPLING_ENV
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["sideways", "every rank", "all"])
def test_host_sampling_env_invalid_warns_once_and_keeps_local_rank_0(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    result = tree.resolve({SAMPLING_ENV: raw})
    assert result.values["host_sampling"] == "local_rank_0"
    assert result.sources["host_sampling"] == settings.DEFAULT_SOURCE
    assert_one_warning(
        caplog,
        f"{SAMPLING_ENV}={quote(raw)} is invalid",
        "expected one of local_rank_0, every_rank",
        "using host_sampling='local_rank_0' instead",
    )


def test_host_sampling_file_beats_env(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tree.work / FILE_NAME, section("host_sampling: every_rank"))
    result = tree.resolve({SAMPLING_ENV: "local_rank_0"})
    assert result.values["host_sampling"] == "every_rank"
    assert result.sources["host_sampling"] == f"{path}: resource_monitoring.host_sampling"
    assert_no_warnings(caplog)


def test_api_host_sampling() -> None:
    assert resolve().host_sampling == "local_rank_0"
    assert resolve(host_sampling="Every_Rank").host_sampling == "every_rank"


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [
        ("sideways", ValueError, "local_rank_0, every_rank"),
        ("", ValueError, "local_rank_0"),
        (0, TypeError, "got int"),
    ],
)
def test_api_bad_host_sampling(raw: object, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=rf"host_sampling=.*{fragment}"):
        resolve(host_sampling=raw)


# --------------------------------------------------------------------------- run_id

RUN_ID_ENV = "WL_RESOURCE_MONITOR_RUN_ID"
LAUNCHERS = "using run_id=None (the launcher's) instead"


@pytest.mark.parametrize(
    ("raw", "expected"), [("job-7", "job-7"), (" nightly run 3 ", "nightly run 3"), ("é" * 128, "é" * 128)]
)
def test_run_id_env_valid(tree: Tree, caplog: pytest.LogCaptureFixture, raw: str, expected: str) -> None:
    result = tree.resolve({RUN_ID_ENV: raw})
    assert result.values["run_id"] == expected
    assert result.sources["run_id"] == RUN_ID_ENV
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["", "  "])
def test_run_id_env_blank_is_unset(tree: Tree, caplog: pytest.LogCaptureFixture, raw: str) -> None:
    result = tree.resolve({RUN_ID_ENV: raw})
    assert result.values["run_id"] is None
    assert result.sources["run_id"] == settings.DEFAULT_SOURCE
    assert_no_warnings(caplog)


@pytest.mark.parametrize("raw", ["x" * 200, "x" * 129, "job\x1b[31m", "a\tb", "line\nbreak"])
def test_run_id_env_invalid_warns_once_bounded_and_uses_the_launchers(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    assert tree.load({RUN_ID_ENV: raw})["run_id"] is None
    message = assert_one_warning(
        caplog, f"{RUN_ID_ENV}={quote(raw)} is invalid", "printable text of at most 128 characters", LAUNCHERS
    )
    assert len(message) < 300


def test_run_id_file_beats_env_and_a_number_is_text(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tree.work / FILE_NAME, section("run_id: 42"))
    result = tree.resolve({RUN_ID_ENV: "from-env"})
    assert result.values["run_id"] == "42"
    assert result.sources["run_id"] == f"{path}: resource_monitoring.run_id"
    assert_no_warnings(caplog)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, None), ("", None), ("  ", None), (" job-7 ", "job-7"), (7, "7"), ("x" * 128, "x" * 128)],
)
def test_api_run_id(raw: object, expected: str | None) -> None:
    assert resolve(run_id=raw).run_id == expected


@pytest.mark.parametrize(
    ("raw", "error", "fragment"),
    [
        ("x" * 200, ValueError, "at most 128"),
        ("a\x00b", ValueError, "printable"),
        ("a\nb", ValueError, "printable"),
        (True, TypeError, "got bool"),
        (1.5, TypeError, "got float"),
        (b"job", TypeError, "got bytes"),
    ],
)
def test_api_bad_run_id(raw: object, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=rf"run_id=.*{fragment}"):
        resolve(run_id=raw)


# --------------------------------------------------------------------------- postmortem_dir: no true word

POSTMORTEM_ENV = "WL_RESOURCE_MONITOR_POSTMORTEM_DIR"


@pytest.mark.parametrize("raw", ["yes", "TRUE", " on ", "1"])
def test_postmortem_dir_env_true_word_is_refused_with_one_warning(
    tree: Tree, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    result = tree.resolve({POSTMORTEM_ENV: raw})
    default = str(tree.work / settings.DEFAULT_POSTMORTEM_DIR)
    assert result.values["postmortem_dir"] == default
    assert result.sources["postmortem_dir"] == settings.DEFAULT_SOURCE
    assert_one_warning(
        caplog,
        f"{POSTMORTEM_ENV}={quote(raw)} is invalid",
        f"(write ./{raw.strip()} for a path of that name)",
        f"using postmortem_dir={quote(default)} instead",
    )


def test_postmortem_dir_file_true_word_is_refused_and_keeps_env(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    env_dir = str(tree.base / "pm")
    path = write(tree.work / FILE_NAME, section("postmortem_dir: 'yes'"))
    assert tree.load({POSTMORTEM_ENV: env_dir})["postmortem_dir"] == env_dir
    assert_one_warning(
        caplog, f"{path}: resource_monitoring.postmortem_dir='yes'", "write ./yes", quote(env_dir)
    )


def test_api_postmortem_dir_true_word_is_a_value_error_and_dot_slash_is_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=r"postmortem_dir='yes'.*write \./yes for a path of that name"):
        resolve(postmortem_dir="yes")
    monkeypatch.chdir(tmp_path)
    assert resolve(postmortem_dir="./yes").postmortem_dir == str(tmp_path / "yes")
    assert resolve(postmortem_dir="off").postmortem_dir is None


def test_every_setting_but_the_switch_is_a_keyword_of_the_monitor() -> None:
    keys = [field.key for field in settings.MONITOR_FIELDS]
    assert keys == [field.key for field in settings.FIELDS if field is not BY_KEY["enabled"]]
    assert set(keys) <= {field.key for field in settings.API_FIELDS}
    assert "enabled" not in {field.key for field in settings.API_FIELDS}
    with pytest.raises(TypeError, match="unexpected keyword argument 'enabled'"):
        sampler.ResourceMonitor(enabled=False)


def test_the_monitor_started_from_config_takes_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV["run_id"], "from-env")
    monkeypatch.setenv(ENV["host_sampling"], "every_rank")
    monkeypatch.setenv(ENV["inner_rate_hz"], "5")
    monitor = sampler.start_resource_monitor_from_config()
    assert monitor is not None
    sampler.stop_resource_monitor()
    assert monitor.placement.run_id == "from-env"
    assert (monitor.host_sampling, monitor.inner_rate_hz) == ("every_rank", 5.0)


FILE_INVALID = [
    # (field, env text, value the env var gives, YAML value, a fragment of the warning)
    *((BY_KEY["prometheus_port"], "9000", 9000, raw, why) for raw, why in [
        ("0", "in 1..65535"),
        ("'0'", "in 1..65535, or false/off for none"),  # a port, not a false word
        ("70000", "in 1..65535"),
        ("abc", "expected a port number (1..65535)"),
        ("true", "got bool"),
        ("9400.0", "got float"),
        ("[9400]", "got list"),
    ]),
    *((BY_KEY["prometheus_address"], "10.0.0.1", "10.0.0.1", raw, why) for raw, why in [
        ("''", "such as 127.0.0.1"), ("'  '", "such as 127.0.0.1"), ("'a b'", "such as 127.0.0.1"),
        ("5", "got int"), ("null", "got NoneType"),
    ]),
    *((BY_KEY["prometheus_sd_dir"], "/srv/prometheus/sd", "/srv/prometheus/sd", raw, why) for raw, why in [
        ("true", "got bool"), ("'on'", "./on"), ("5", "got int")
    ]),
    *((BY_KEY["host_sampling"], "every_rank", "every_rank", raw, why) for raw, why in [
        ("sideways", "expected one of local_rank_0, every_rank"), ("5", "got int")
    ]),
    *((BY_KEY["run_id"], "from-env", "from-env", raw, why) for raw, why in [
        ("x" * 200, "at most 128"), ('"a\\tb"', "printable"), ("true", "got bool"), ("1.5", "got float")
    ]),
]  # fmt: skip


@pytest.mark.parametrize(("field", "env_text", "kept", "yaml_value", "fragment"), FILE_INVALID)
def test_a_bad_file_value_of_the_new_fields_warns_once_and_keeps_the_env_var(
    tree: Tree,
    caplog: pytest.LogCaptureFixture,
    field: settings.Field,
    env_text: str,
    kept: object,
    yaml_value: str,
    fragment: str,
) -> None:
    assert field.env is not None
    path = write(tree.work / FILE_NAME, section(f"{field.key}: {yaml_value}"))
    result = tree.resolve({field.env: env_text})
    assert result.values[field.key] == kept
    assert result.sources[field.key] == field.env
    assert_one_warning(
        caplog,
        f"{path}: resource_monitoring.{field.key}=",
        fragment,
        f"using {field.key}={field.show(kept)} instead",
    )


# --------------------------------------------------------------------------- whole numbers: digits 0-9 alone


@pytest.mark.parametrize("raw", ["\u0661", "\u00b2", "\uff11", "1_0", "+1"])
def test_a_gpu_index_is_plain_ascii_digits(tree: Tree, caplog: pytest.LogCaptureFixture, raw: str) -> None:
    # U+0661 (Arabic-Indic one) and "²" pass str.isdigit(); int() reads the first as 1, refuses the second.
    result = tree.resolve({ENV["gpu_devices"]: f"0,{raw}"})
    assert result.values["gpu_devices"] == "all"
    assert_one_warning(
        caplog,
        f"{ENV['gpu_devices']}=",
        "is invalid",
        "neither an index nor a UUID",
        "using gpu_devices=all",
    )


def test_a_huge_gpu_index_in_the_file_warns(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    write(tree.work / FILE_NAME, section("gpu_devices: [0x" + "f" * 4000 + "]"))  # 4,800 decimal digits
    assert tree.load()["gpu_devices"] == "all"
    assert_one_warning(caplog, "resource_monitoring.gpu_devices=", "neither an index nor a UUID")


def test_gpu_indices_and_uuids_in_plain_digits_are_kept(tree: Tree, caplog: pytest.LogCaptureFixture) -> None:
    assert tree.load({ENV["gpu_devices"]: " 1 , 03,GPU-ab"})["gpu_devices"] == ("1", "03", "GPU-ab")
    assert resolve(gpu_devices=[2, "0"]).gpu_devices == ("2", "0")
    assert_no_warnings(caplog)


def test_a_monitor_built_explicitly_takes_what_it_is_not_given_from_the_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV["store"], str(tmp_path / "from-env.sqlite"))
    monkeypatch.setenv(ENV["interval_seconds"], "7")
    (tmp_path / "resource_monitoring.yaml").write_text("resource_monitoring:\n  inner_rate_hz: 4\n")
    mon = sampler.ResourceMonitor(interval_seconds=3)
    assert mon.store == str(tmp_path / "from-env.sqlite")
    assert mon.inner_rate_hz == 4.0
    assert mon.interval_seconds == 3.0  # an argument wins
    assert mon.settings.store == mon.store and mon.stats()["settings"]["interval_seconds"] == 3.0
    sources = mon.stats()["settings_sources"]
    assert sources["store"] == ENV["store"] and sources["interval_seconds"] == "ResourceMonitor"
    assert (
        sources["inner_rate_hz"]
        == f"{tmp_path / 'resource_monitoring.yaml'}: resource_monitoring.inner_rate_hz"
    )
    assert sampler.ResourceMonitor(store=None).store is None


# --------------------------------------------------------------------------- the inner rate's ceiling

CEILING_WARNING = ("is outside [1, 50] Hz", "using inner_rate_hz=50.0 instead")
"""What the one warning about an inner rate above the ceiling says (the ceiling: 50 Hz)."""


def test_an_inner_rate_of_1e9_hz_from_the_env_var_is_clamped_with_one_warning(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    assert settings.MAX_INNER_RATE_HZ == 50.0
    assert tree.load({ENV["inner_rate_hz"]: "1e9"})["inner_rate_hz"] == 50.0
    assert_one_warning(caplog, "WL_RESOURCE_MONITOR_INNER_RATE_HZ='1e9'", *CEILING_WARNING)


@pytest.mark.parametrize(
    "value", ["1e9", "1.0e+9", "1000000000"]
)  # YAML reads 1e9 as text, the others as numbers
def test_an_inner_rate_of_1e9_hz_from_the_file_is_clamped_with_one_warning(
    tree: Tree, caplog: pytest.LogCaptureFixture, value: str
) -> None:
    path = write(tree.work / FILE_NAME, section(f"inner_rate_hz: {value}"))
    assert tree.load()["inner_rate_hz"] == 50.0
    assert_one_warning(caplog, f"{path}: resource_monitoring.inner_rate_hz=", *CEILING_WARNING)


def test_an_inner_rate_of_1e9_hz_given_to_the_monitor_is_clamped_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")
    monitor = sampler.ResourceMonitor(inner_rate_hz=1e9)
    assert monitor.inner_rate_hz == monitor.settings.inner_rate_hz == 50.0
    assert_one_warning(caplog, "ResourceMonitor: inner_rate_hz=1000000000.0", *CEILING_WARNING)


def test_an_inner_rate_of_1e9_hz_given_to_run_is_clamped_with_one_warning(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sampler", "run", "--inner-rate", "1e9", "--duration", "1", "--no-store"],
        cwd=tmp_path,
        env={key: value for key, value in os.environ.items() if key not in ENV_VARS},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    warned = [line for line in lines if line.startswith("resource monitor:") and "inner" in line]
    assert len(warned) == 1 and "--inner-rate='1e9'" in warned[0], done.stderr
    assert all(fragment in warned[0] for fragment in CEILING_WARNING)
    (shown,) = [
        line.split() for line in lines if line.strip().startswith("inner_rate_hz")
    ]  # the settings used
    assert shown == ["inner_rate_hz", "50.0", "--inner-rate"]
