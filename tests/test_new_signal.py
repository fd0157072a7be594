"""A signal is added in one catalogue entry and one reading, and nowhere else.

A copy of the packages gets a made-up counter in ``sampler/catalogue.py`` (its entry and its
``_per_second``'s, both in the one file) and one line in the cpu collector that reads it; a
fresh interpreter running that copy must then show it everywhere a signal shows: the
record's layout (with its rate, derived), a monitor's run store, the Prometheus endpoint's
metric, and ``top``'s rows.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import WAIT_SECONDS

ROOT = Path(__file__).resolve().parent.parent
ENTRY_ANCHOR = "    MEMORY_USED := Signal("
NEW_ENTRIES = """    CPU_MADE_UP := Signal(
        "cpu/made_up_seconds", "s", COUNTER, "made-up CPU time", "made up",
        "CPU time of every core since boot, read for a test.",
        metric="cpu_made_up_seconds_total", scale=1.0,
    ),
    Signal(
        "cpu/made_up_seconds_per_second", "s/s", RATE, "made-up CPU rate", "made up /s",
        "The same per second since the previous sample.",
    ),
"""
READING_ANCHOR = "            readings[catalogue.CPU_UTILIZATION] = _cpu_percent(before, ticks)\n"
NEW_READING = (
    "        readings[catalogue.CPU_MADE_UP] = sum(psutil.cpu_times())  # type: ignore[attr-defined]\n"
)
NAME = "resource/cpu/made_up_seconds"
RATE_NAME = NAME + "_per_second"

SCRIPT = textwrap.dedent(
    f"""
    import json, time
    import sampler
    from sampler.collectors.host import CpuCollector
    from sampler.prometheus import metrics
    from sampler.store.reader import StoreReader
    from sampler.views import top

    collector = CpuCollector()
    first = dict(zip(collector.names, collector.sample(), strict=True))
    time.sleep(0.05)
    record = dict(zip(collector.names, collector.sample(), strict=True))
    exposed = metrics.lookup({NAME!r})
    mon = sampler.ResourceMonitor(store="runs.sqlite", categories=["cpu"], isolation="thread",
                                  step_source="seconds", interval_seconds=1)
    logged = []
    sampler.signals.subscribe(lambda name, value, step: logged.append(name))
    mon.start()
    deadline = time.monotonic() + {WAIT_SECONDS}
    while logged.count("resource/cpu/utilization_percent") < 3 and time.monotonic() < deadline:
        time.sleep(0.1)  # three records: a counter's rate has come
    mon.stop()
    with StoreReader("runs.sqlite") as reader:
        stored = sorted(reader.names(reader.run().id))
    rows = [line.text for line in top.signal_lines({{{NAME!r}: [(0.0, 10.0), (1.0, 14.0)]}}, 120)]
    print(json.dumps({{
        "names": collector.names,
        "first_rate": first.get({RATE_NAME!r}),
        "rate": record.get({RATE_NAME!r}),
        "metric": None if exposed is None else [exposed.metric.name, exposed.metric.kind],
        "rate_metric": metrics.lookup({RATE_NAME!r}) is not None,
        "stored": stored,
        "top": rows,
    }}))
    """
)


def copy_of_the_packages(tmp: Path, new_signal: bool) -> Path:
    """The packages copied under ``tmp``; with ``new_signal``, the entries and the reading the
    only change."""
    for package in ("sampler", "ringbuf"):
        shutil.copytree(ROOT / package, tmp / package, ignore=shutil.ignore_patterns("__pycache__"))
    if new_signal:
        for path, anchor, new, before in (
            (tmp / "sampler" / "catalogue.py", ENTRY_ANCHOR, NEW_ENTRIES, True),
            (tmp / "sampler" / "collectors" / "host.py", READING_ANCHOR, NEW_READING, False),
        ):
            text = path.read_text()
            assert text.count(anchor) == 1
            path.write_text(text.replace(anchor, new + anchor if before else anchor + new))
    return tmp


def shown(tmp: Path, new_signal: bool) -> dict[str, object]:
    tree = copy_of_the_packages(tmp / "tree", new_signal)
    work = tmp / "work"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=work,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_one_new_entry_and_one_reading_reach_the_record_the_store_the_endpoint_and_top(
    tmp_path: Path,
) -> None:
    seen = shown(tmp_path, new_signal=True)
    assert seen["names"] == ["resource/cpu/utilization_percent", NAME, RATE_NAME]
    assert seen["first_rate"] != seen["first_rate"]  # NaN: no rate from the first reading
    rate = seen["rate"]
    assert isinstance(rate, float) and rate >= 0  # derived by the catalogue's rule, never negative
    assert seen["metric"] == ["wl_resource_cpu_made_up_seconds_total", "counter"]
    assert seen["rate_metric"] is False  # a rate is Prometheus' rate()'s job
    assert {NAME, RATE_NAME} <= set(seen["stored"])  # type: ignore[call-overload]
    rows = seen["top"]
    assert isinstance(rows, list) and any("made up /s" in row and "4" in row for row in rows), rows


def test_the_copy_without_the_entry_has_no_such_signal(tmp_path: Path) -> None:
    """The check above can fail: without the entry and the reading, nothing shows it."""
    seen = shown(tmp_path, new_signal=False)
    assert seen["names"] == ["resource/cpu/utilization_percent"]
    assert seen["metric"] is None
    assert not {NAME, RATE_NAME} & set(seen["stored"])  # type: ignore[call-overload]
