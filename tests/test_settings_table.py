"""A setting is added in one table entry and nowhere else.

A copy of the packages gets one new attribute in ``MonitorSettings`` (and no
other edit); a fresh interpreter running that copy must then show the setting
everywhere a setting shows: the env var and the YAML key (``config --json``,
with where each value came from), ``run``'s flags, ``ResourceMonitor``'s keyword
arguments and ``settings``, the run store's run row, and ``stats()``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANCHOR = "    isolation: str = setting("
NEW_ENTRY = """    flavour: str = setting(
        env="WL_RESOURCE_MONITOR_FLAVOUR",
        flag="--flavour",
        default="plain",
        from_text=parsers.address,
        from_value=parsers.address,
        help="a setting added for the test",
    )
"""


def copy_with_new_setting(tmp: Path) -> Path:
    """The packages copied under ``tmp``, with ``NEW_ENTRY`` the only change."""
    for package in ("sampler", "ringbuf"):
        shutil.copytree(ROOT / package, tmp / package, ignore=shutil.ignore_patterns("__pycache__"))
    table = tmp / "sampler" / "settings" / "table.py"
    text = table.read_text()
    assert text.count(ANCHOR) == 1
    table.write_text(text.replace(ANCHOR, NEW_ENTRY + ANCHOR))
    return tmp


def python(tree: Path, cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_one_new_entry_in_the_table_reaches_every_front_end(tmp_path: Path) -> None:
    tree = copy_with_new_setting(tmp_path / "tree")
    work = tmp_path / "work"
    work.mkdir()

    from_env = json.loads(
        python(tree, work, "-m", "sampler", "config", "--json", env={"WL_RESOURCE_MONITOR_FLAVOUR": "spicy"})
    )
    assert from_env["values"]["flavour"] == "spicy"
    assert from_env["sources"]["flavour"] == "WL_RESOURCE_MONITOR_FLAVOUR"

    (work / "resource_monitoring.yaml").write_text("resource_monitoring:\n  flavour: sweet\n")
    from_file = json.loads(python(tree, work, "-m", "sampler", "config", "--json"))
    assert from_file["values"]["flavour"] == "sweet" and from_file["warnings"] == []
    assert from_file["sources"]["flavour"].endswith("resource_monitoring.flavour")
    (work / "resource_monitoring.yaml").unlink()

    assert "--flavour" in python(tree, work, "-m", "sampler", "run", "--help")

    script = textwrap.dedent(
        """
        import json, sampler
        from sampler.store.reader import StoreReader
        mon = sampler.ResourceMonitor(flavour="salty", store="runs.sqlite", categories=["cpu"],
                                      isolation="thread", step_source="seconds")
        mon.start()
        mon.stop()
        with StoreReader("runs.sqlite") as reader:
            row = reader.run().config
        print(json.dumps({"settings": mon.settings.flavour, "attribute": mon.flavour,
                          "row": row.get("flavour"), "stats": mon.stats()["settings"].get("flavour")}))
        """
    )
    shown = json.loads(python(tree, work, "-c", script).splitlines()[-1])
    assert shown == {"settings": "salty", "attribute": "salty", "row": "salty", "stats": "salty"}


def test_the_copy_without_the_entry_knows_no_such_setting(tmp_path: Path) -> None:
    """The check above can fail: without the entry, the same front ends refuse the setting."""
    tree = tmp_path / "tree"
    for package in ("sampler", "ringbuf"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    (work / "resource_monitoring.yaml").write_text("resource_monitoring:\n  flavour: sweet\n")
    resolved = json.loads(python(tree, work, "-m", "sampler", "config", "--json"))
    assert "flavour" not in resolved["values"]
    assert any("flavour" in warning and "unknown key" in warning for warning in resolved["warnings"])
