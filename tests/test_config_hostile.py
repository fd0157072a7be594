"""Hostile configuration files (SPEC 4): huge numbers, deep nesting, alias bombs, oversized files.

Each one must end in warnings, never in an exception or a hang: ``load_resource_monitoring_config``
runs inside ``start_resource_monitor_from_config``, which is documented never to raise for bad
configuration. Every test uses a real file in a scratch tree, asserts exactly one warning naming the
file, a bounded message (values are quoted truncated, never expanded) and the fallback values. The
tests carry a short timeout so that a regression to unbounded work fails instead of stalling the suite.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ENV_VARS, FAST, Recorder, wait_for

import sampler
from sampler import settings

pytestmark = pytest.mark.timeout(20)

FILE_NAME = "resource_monitoring.yaml"
ENV = {settings.ENV["interval_seconds"]: "30", settings.ENV["step_source"]: "seconds"}
"""Env values every test sets, so that a fallback is visible as 30.0 and "seconds"."""
MESSAGE_BUDGET = 400
"""Characters a warning may use besides the file's path."""


def load(tmp_path: Path, text: str | bytes) -> tuple[dict[str, Any], Path]:
    """Write ``text`` as the only config file of a scratch tree and resolve the config."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    path = work / FILE_NAME
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    cfg = settings.load_resource_monitoring_config(environ=dict(ENV), cwd=work, package_dir=tmp_path / "pkg")
    return cfg, path


def one_warning(caplog: pytest.LogCaptureFixture, path: Path, *fragments: str) -> str:
    messages = [
        r.getMessage() for r in caplog.records if r.name == "sampler" and r.levelno >= logging.WARNING
    ]
    assert len(messages) == 1, [m[:300] for m in messages]
    message = messages[0]
    assert str(path) in message
    assert len(message) - len(str(path)) < MESSAGE_BUDGET, message[:1000]
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"
    return message


@pytest.fixture(autouse=True)
def capture(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sampler")


def section(body: str) -> str:
    return "resource_monitoring:\n" + "".join(f"  {line}\n" for line in body.splitlines())


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """A flow sequence of nested aliases: ~400 bytes whose last item expands to width**levels strings."""
    items = ["&a0 [" + ", ".join(['"x"'] * width) + "]"]
    items += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


# --------------------------------------------------------------------------- whole file unusable


def test_integer_beyond_python_str_digits_limit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # PyYAML turns 5,000 decimal digits into int(), which raises ValueError (Python's 4,300-digit limit).
    cfg, path = load(tmp_path, section("interval_seconds: " + "9" * 5000))
    assert (cfg["interval_seconds"], cfg["step_source"], cfg["config_file"]) == (30.0, "seconds", None)
    one_warning(caplog, path, "cannot use", "ValueError", "env vars and defaults for every key")


def test_deep_nesting(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The composer recurses once per level: RecursionError long before 10,000.
    cfg, path = load(tmp_path, section("interval_seconds: " + "[" * 10_000 + "]" * 10_000))
    assert (cfg["interval_seconds"], cfg["config_file"]) == (30.0, None)
    one_warning(caplog, path, "cannot use", "RecursionError", "env vars and defaults")


def test_deep_nesting_of_mappings(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg, path = load(tmp_path, "resource_monitoring: " + "{a: " * 10_000 + "1" + "}" * 10_000 + "\n")
    assert cfg["interval_seconds"] == 30.0
    one_warning(caplog, path, "RecursionError")


def test_file_over_the_size_cap_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    text = section("interval_seconds: 5") + "#" * settings.MAX_CONFIG_FILE_BYTES + "\n"
    cfg, path = load(tmp_path, text)
    assert (cfg["interval_seconds"], cfg["config_file"]) == (30.0, None)
    one_warning(caplog, path, "larger than 64 KiB", "env vars and defaults")


def test_file_at_the_size_cap_is_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    head = section("interval_seconds: 5")
    text = head + "#" * (settings.MAX_CONFIG_FILE_BYTES - len(head))
    cfg, _ = load(tmp_path, text)
    assert cfg["interval_seconds"] == 5.0
    assert not caplog.records


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (section("interval_seconds: 2001-13-45"), "month must be in 1..12"),
        (section("interval_seconds: !!binary '*not base64*'"), "base64"),
        (section("interval_seconds: !!python/object/apply:os.system ['true']"), "python/object"),
        (section("interval_seconds: 5") + "---\n" + section("interval_seconds: 6"), "single document"),
        ("resource_monitoring:\n  ? [a, b]\n  : 1\n", "unhashable"),
        ("resource_monitoring:\n\tinterval_seconds: 5\n", "line 2"),
        ("resource_monitoring: *undefined\n", "undefined"),
    ],
)
def test_loader_errors_of_every_kind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, fragment: str
) -> None:
    cfg, path = load(tmp_path, text)
    assert (cfg["interval_seconds"], cfg["config_file"]) == (30.0, None)
    one_warning(caplog, path, "cannot use", fragment, "env vars and defaults for every key")


# --------------------------------------------------------------------------- huge values, bounded warnings


def test_integer_beyond_float_range_is_clamped_to_one_day(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # float() of a 400-digit int raises OverflowError; it is a finite number above the ceiling.
    cfg, path = load(tmp_path, section("interval_seconds: " + "9" * 400))
    assert cfg["interval_seconds"] == 86400.0
    one_warning(caplog, path, "resource_monitoring.interval_seconds=", "ceiling", "interval_seconds=86400.0")


@pytest.mark.parametrize(
    "number",
    [
        "9" * 400,
        "0x" + "f" * 60_000,  # 240,000 bits: no decimal string conversion may be attempted
        "1" + ":10" * 20_000,  # YAML 1.1 base 60: a 35,000-digit integer
        "-" + "9" * 400,
    ],
)
@pytest.mark.parametrize("key", ["disk_path", "step_source", "enabled", "bogus", "categories", "store"])
def test_huge_integers_are_quoted_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, number: str, key: str
) -> None:
    cfg, path = load(tmp_path, section(f"{key}: {number}"))
    assert cfg["step_source"] == "seconds" and cfg["disk_path"] == settings.DEFAULT_DISK_PATH
    assert cfg["enabled"] is True and all(cfg["categories"].values())
    one_warning(caplog, path, f"resource_monitoring.{key}=")


@pytest.mark.parametrize("number", ["0x" + "f" * 60_000, "1" + ":10" * 20_000])
def test_huge_integer_interval_is_clamped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, number: str
) -> None:
    cfg, path = load(tmp_path, section(f"interval_seconds: {number}"))
    assert cfg["interval_seconds"] == 86400.0
    one_warning(caplog, path, "ceiling")


def test_huge_integer_category_flag(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg, path = load(tmp_path, section("categories: {gpu: 0x" + "f" * 60_000 + "}"))
    assert cfg["categories"]["gpu"] is True
    one_warning(caplog, path, "resource_monitoring.categories.gpu=", "got int")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("interval_seconds: {laughs}", "resource_monitoring.interval_seconds=[["),
        ("bogus: {laughs}", "resource_monitoring.bogus=[["),
        ("categories: {laughs}", "resource_monitoring.categories=[["),
        ("categories: {{gpu: {laughs}}}", "resource_monitoring.categories.gpu=[["),
        ("disk_path: {laughs}", "resource_monitoring.disk_path=[["),
        ("enabled: {laughs}", "resource_monitoring.enabled=[["),
        ("store: {laughs}", "resource_monitoring.store=[["),
    ],
)
def test_billion_laughs_as_a_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, body: str, fragment: str
) -> None:
    # Expanded, the value would hold 9**9 (387 million) strings; quoting must not expand it.
    cfg, path = load(tmp_path, section(body.format(laughs=billion_laughs())))
    assert len(path.read_bytes()) < 600
    assert cfg["interval_seconds"] == 30.0 and all(cfg["categories"].values()) and cfg["store"] is None
    one_warning(caplog, path, fragment, "...")


def test_billion_laughs_as_the_top_level(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg, path = load(tmp_path, billion_laughs() + "\n")
    assert cfg["interval_seconds"] == 30.0
    one_warning(caplog, path, "<top level>=[[", "env vars and defaults for every key")


def test_billion_laughs_as_the_section_and_as_a_top_level_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, path = load(tmp_path, f"resource_monitoring: {billion_laughs()}\n")
    assert cfg["interval_seconds"] == 30.0
    one_warning(caplog, path, "resource_monitoring=[[", "env vars and defaults for every key")
    caplog.clear()
    cfg, path = load(tmp_path / "again", f"laughs: {billion_laughs()}\n")
    one_warning(caplog, path, "laughs=[[", "unknown top-level key")


def test_nesting_that_parses_is_quoted_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg, path = load(tmp_path, section("interval_seconds: " + "[" * 60 + "]" * 60))
    assert cfg["interval_seconds"] == 30.0
    one_warning(caplog, path, "interval_seconds=[[[")


@pytest.mark.parametrize("key", ["step_source", "disk_path", "bogus"])
def test_long_string_is_quoted_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture, key: str) -> None:
    value = "/" + "y" * 60_000 if key == "disk_path" else "y" * 60_000
    cfg, path = load(tmp_path, section(f"{key}: '{value}'"))
    assert cfg["step_source"] == "seconds"
    one_warning(caplog, path, "yyy...")


# --------------------------------------------------------------------------- keys that are not short strings


@pytest.mark.parametrize("key", ["1", "null", "3.5", "true", "2001-01-01", "9" * 400, "0x" + "f" * 60_000])
@pytest.mark.parametrize("level", ["top", "section", "categories"])
def test_non_string_keys_are_unknown_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, key: str, level: str
) -> None:
    # "? key" is YAML's explicit key, which (unlike a plain one) may be longer than 1,024 characters.
    text = {
        "top": f"? {key}\n: x\n" + section("interval_seconds: 5"),
        "section": section(f"? {key}\n: x\ninterval_seconds: 5"),
        "categories": section(f"categories:\n  ? {key}\n  : false\n  gpu: false\ninterval_seconds: 5"),
    }[level]
    cfg, path = load(tmp_path, text)
    assert cfg["interval_seconds"] == 5.0  # the rest of the file applies
    if level == "categories":
        assert cfg["categories"] == {name: name != "gpu" for name in settings.DEFAULT_CATEGORIES}
    message = one_warning(caplog, path, "ignoring it")
    assert "unknown" in message or "not a known category" in message


def test_long_string_key_is_quoted_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg, path = load(tmp_path, section("? " + "k" * 60_000 + "\n: 1\ninterval_seconds: 5"))
    assert cfg["interval_seconds"] == 5.0
    one_warning(caplog, path, "resource_monitoring.'kkkk", "unknown key")


# --------------------------------------------------------------------------- store, the categories list


def test_long_store_path_in_a_missing_directory_is_quoted_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    value = "/nowhere/" + "y" * 60_000 + "/runs.db"
    cfg, path = load(tmp_path, section(f"store: '{value}'"))
    assert cfg["store"] is None
    one_warning(caplog, path, "resource_monitoring.store='/nowhere/yyy", "does not exist", "store=None")


def test_many_unknown_categories_in_a_list_are_named_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = ", ".join(["cpu"] + [f"bogus{i}" for i in range(5_000)])
    cfg, path = load(tmp_path, section(f"categories: [{names}]"))
    assert cfg["categories"] == {name: name == "cpu" for name in settings.DEFAULT_CATEGORIES}
    one_warning(caplog, path, "'bogus0'", "ignoring that part", "using categories=cpu")


@pytest.mark.parametrize("item", ["9" * 400, "0x" + "f" * 60_000, "{a: 1}", "null"])
def test_categories_list_holding_other_things(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, item: str
) -> None:
    cfg, path = load(tmp_path, section(f"categories: [cpu, {item}]"))
    assert all(cfg["categories"].values())
    one_warning(caplog, path, "resource_monitoring.categories=['cpu', ", "list of category names")


def test_resolution_keeps_the_same_bounded_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    work = tmp_path / "work"
    work.mkdir()
    path = work / FILE_NAME
    path.write_text(section(f"interval_seconds: {billion_laughs()}"), encoding="utf-8")
    result = settings.resolve_config(environ=dict(ENV), cwd=work, package_dir=tmp_path / "pkg")
    (message,) = result.warnings
    assert message == one_warning(caplog, path, "...")
    assert result.used_file == path


# --------------------------------------------------------------------------- another user's files

NOBODY = 65534
"""The uid and gid of ``nobody``: another local user, for files this root-run suite makes theirs."""
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making another user's files needs root")


def theirs(path: Path, mode: int | None = None) -> Path:
    """``path`` made ``nobody``'s (the link itself, for a symlink), with ``mode`` if given."""
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    if mode is not None:
        os.chmod(path, mode)
    return path


def planted_repository(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A world-writable shared directory in which ``nobody`` planted a ``.git`` and a config file
    pointing the store at a 0666 file of theirs; and root's own working directory inside it.
    Returns (the shared directory, nobody's store, root's working directory)."""
    shared = tmp_path / "job"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / ".git").mkdir()
    theirs(shared / ".git")
    store = shared / "theirs.sqlite"
    store.touch()
    theirs(store, 0o666)
    (shared / FILE_NAME).write_text(
        section(f"store: {store}\nprometheus_address: 0.0.0.0\nenabled: false\ninterval_seconds: 5"),
        encoding="utf-8",
    )
    theirs(shared / FILE_NAME)
    mine = shared / "mine"
    mine.mkdir()
    return shared, store, mine


@needs_root
def test_another_user_s_repository_in_a_shared_directory_configures_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared, store, mine = planted_repository(tmp_path)
    cfg = settings.load_resource_monitoring_config(environ=dict(ENV), cwd=mine, package_dir=tmp_path / "pkg")
    assert (cfg["store"], cfg["enabled"], cfg["prometheus_address"]) == (None, True, "127.0.0.1")
    assert (cfg["interval_seconds"], cfg["config_file"]) == (30.0, None)
    one_warning(caplog, shared / ".git", "ignoring", "owned by nobody", f"{shared} is not taken as")
    # Root's plain monitor, started in its own subdirectory, records nothing into their file.
    caplog.clear()
    monkeypatch.chdir(mine)
    recorder = Recorder()
    with sampler.ResourceMonitor(sink=recorder, categories=["cpu"], step_source="seconds", **FAST) as mon:
        assert mon.store is None
        wait_for(lambda: recorder.calls, what="a record")
    assert store.stat().st_size == 0
    one_warning(caplog, shared / ".git", "owned by nobody")


@needs_root
@pytest.mark.parametrize("where", ["env dir", "env dir, dot name", "repository root", "package dir", "cwd"])
def test_another_user_s_config_file_is_skipped_wherever_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    repo, pkg, env_dir = tmp_path / "repo", tmp_path / "pkg", tmp_path / "env"
    work = repo / "work"
    for directory in (repo / ".git", work, pkg, env_dir):
        directory.mkdir(parents=True)
    path = {
        "env dir": env_dir / FILE_NAME,
        "env dir, dot name": env_dir / ("." + FILE_NAME),
        "repository root": repo / FILE_NAME,
        "package dir": pkg / FILE_NAME,
        "cwd": work / FILE_NAME,
    }[where]
    path.write_text(section("interval_seconds: 5\nstep_source: model_age"), encoding="utf-8")
    theirs(path)
    environ = {**ENV, settings.ENV_CONFIG_PATH: str(env_dir)}
    resolution = settings.resolve_config(environ=environ, cwd=work, package_dir=pkg)
    assert (resolution.values["interval_seconds"], resolution.values["step_source"]) == (30.0, "seconds")
    assert resolution.used_file is None and resolution.found_file is None
    one_warning(caplog, path, "owned by nobody", "using env vars and defaults")


@needs_root
def test_the_next_file_is_used_instead_of_another_user_s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    work, pkg = tmp_path / "work", tmp_path / "pkg"
    (work / ".git").mkdir(parents=True)
    theirs_file = work / FILE_NAME  # the repository-level file, and (same place) the cwd one
    pkg.mkdir()
    (pkg / FILE_NAME).write_text(section("interval_seconds: 7"), encoding="utf-8")
    theirs_file.write_text(section("interval_seconds: 5"), encoding="utf-8")
    theirs(theirs_file)
    resolution = settings.resolve_config(environ=dict(ENV), cwd=work, package_dir=pkg)
    assert resolution.values["interval_seconds"] == 7.0 and resolution.used_file == pkg / FILE_NAME
    one_warning(caplog, theirs_file, "owned by nobody", f"using {pkg / FILE_NAME} instead")


@needs_root
@pytest.mark.parametrize(
    ("mode", "group", "used"),
    [
        (0o644, 0, True),
        (0o666, 0, False),
        (0o646, 0, False),
        (0o664, NOBODY, False),  # a group nobody is in
        (0o664, 0, True),  # root's own group, which has no other member
    ],
)
def test_a_config_file_others_can_write_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int, group: int, used: bool
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    path = work / FILE_NAME
    path.write_text(section("interval_seconds: 5"), encoding="utf-8")
    os.chown(path, 0, group)
    os.chmod(path, mode)
    cfg = settings.load_resource_monitoring_config(environ=dict(ENV), cwd=work, package_dir=tmp_path / "pkg")
    assert cfg["interval_seconds"] == (5.0 if used else 30.0)
    if used:
        assert not caplog.records
    else:
        one_warning(caplog, path, f"mode {mode:04o}", "owned by root", "can write it")


@needs_root
@pytest.mark.parametrize("how", ["nobody's", "writable by others", "nobody's symlink to root's"])
def test_a_git_others_made_does_not_hide_the_real_repository(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / FILE_NAME).write_text(section("interval_seconds: 5"), encoding="utf-8")
    shared = repo / "shared"
    work = shared / "work"
    work.mkdir(parents=True)
    planted = shared / ".git"
    if how == "nobody's symlink to root's":
        planted.symlink_to(repo / ".git")
        theirs(planted)
    else:
        planted.mkdir()
        if how == "nobody's":
            theirs(planted)
        else:
            os.chmod(planted, 0o777)
    cfg = settings.load_resource_monitoring_config(environ=dict(ENV), cwd=work, package_dir=tmp_path / "pkg")
    assert (cfg["interval_seconds"], cfg["config_file"]) == (5.0, str(repo / FILE_NAME))
    one_warning(caplog, planted, "ignoring", f"{shared} is not taken as the repository root")


@needs_root
@pytest.mark.parametrize(
    ("link_owner", "file_owner", "used"),
    [("root", "root", True), ("root", "nobody", False), ("nobody", "root", False)],
)
def test_a_symlinked_config_file_counts_only_when_link_and_file_are_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, link_owner: str, file_owner: str, used: bool
) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    target = elsewhere / "monitoring.yaml"
    target.write_text(section("interval_seconds: 5"), encoding="utf-8")
    link = work / FILE_NAME
    link.symlink_to(target)
    if file_owner == "nobody":
        theirs(target)
    if link_owner == "nobody":
        theirs(link)
    cfg = settings.load_resource_monitoring_config(environ=dict(ENV), cwd=work, package_dir=tmp_path / "pkg")
    assert cfg["interval_seconds"] == (5.0 if used else 30.0)
    if used:
        assert not caplog.records and cfg["config_file"] == str(link)
    else:
        one_warning(caplog, link, "owned by nobody")


@needs_root
def test_the_config_command_shows_the_skip(tmp_path: Path) -> None:
    shared, _, mine = planted_repository(tmp_path)
    (mine / FILE_NAME).write_text(section("interval_seconds: 9"), encoding="utf-8")
    theirs(mine / FILE_NAME)
    env = {key: value for key, value in os.environ.items() if key not in ENV_VARS}
    shown = subprocess.run(
        [sys.executable, "-m", "sampler", "config", "--json"],
        cwd=mine,
        env=env,
        capture_output=True,
        text=True,
        timeout=15,
        check=True,
    )
    report = json.loads(shown.stdout)
    assert report["used_file"] is None and report["values"]["interval_seconds"] == 15.0
    assert {
        "path": str(mine / FILE_NAME),
        "status": "skipped: another user's, or others can write it (see warnings)",
    } in report["files"]
    assert len(report["warnings"]) == 2
    assert str(shared / ".git") in report["warnings"][0] and "nobody" in report["warnings"][0]
    assert str(mine / FILE_NAME) in report["warnings"][1] and "nobody" in report["warnings"][1]
    text = subprocess.run(
        [sys.executable, "-m", "sampler", "config"],
        cwd=mine,
        env=env,
        capture_output=True,
        text=True,
        timeout=15,
        check=True,
    ).stdout
    assert "skipped: another user's" in text and "owned by nobody" in text


@needs_root
@pytest.mark.parametrize(("owner", "used"), [(NOBODY, True), (0, True), (NOBODY - 1, False)])
def test_a_backend_run_by_another_user_trusts_its_own_files_and_root_s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, owner: int, used: bool
) -> None:
    # The effective user is all the rule asks about; the suite runs as root, so it plays nobody.
    monkeypatch.setattr(os, "geteuid", lambda: NOBODY)
    work = tmp_path / "work"
    work.mkdir()
    path = work / FILE_NAME
    path.write_text(section("interval_seconds: 5"), encoding="utf-8")
    os.chown(path, owner, owner)
    cfg = settings.load_resource_monitoring_config(environ=dict(ENV), cwd=work, package_dir=tmp_path / "pkg")
    assert cfg["interval_seconds"] == (5.0 if used else 30.0)
    if used:
        assert not caplog.records
    else:
        one_warning(caplog, path, f"owned by uid {NOBODY - 1}, not by you (nobody) or root")


@needs_root
def test_a_file_swapped_in_between_the_look_and_the_read_is_judged_as_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    path = work / FILE_NAME
    path.write_text(section("interval_seconds: 5"), encoding="utf-8")  # root's: passes every look
    planted = tmp_path / "planted.yaml"
    planted.write_text(section("interval_seconds: 7"), encoding="utf-8")
    theirs(planted)
    real_open = os.open

    def swap_then_open(name: str, *args: Any, **kwargs: Any) -> int:
        if os.fspath(name) == str(path):
            os.replace(planted, path)  # another user, quicker than the lookup
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", swap_then_open)
    cfg = settings.load_resource_monitoring_config(environ=dict(ENV), cwd=work, package_dir=tmp_path / "pkg")
    assert (cfg["interval_seconds"], cfg["config_file"]) == (30.0, None)
    one_warning(caplog, path, "owned by nobody")


@needs_root
def test_a_fifo_planted_as_the_config_file_is_never_opened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    os.mkfifo(work / FILE_NAME)  # opened for reading, it would block the backend until a writer came
    theirs(work / FILE_NAME)
    cfg = settings.load_resource_monitoring_config(environ=dict(ENV), cwd=work, package_dir=tmp_path / "pkg")
    assert (cfg["interval_seconds"], cfg["config_file"]) == (30.0, None)
    assert not caplog.records
