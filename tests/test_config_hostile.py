"""Hostile configuration files (SPEC 4): huge numbers, deep nesting, alias bombs, oversized files.

Each one must end in warnings, never in an exception or a hang: ``load_resource_monitoring_config``
runs inside ``start_resource_monitor_from_config``, which is documented never to raise for bad
configuration. Every test uses a real file in a scratch tree, asserts exactly one warning naming the
file, a bounded message (values are quoted truncated, never expanded) and the fallback values. The
tests carry a short timeout so that a regression to unbounded work fails instead of stalling the suite.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

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
