"""Issue 7: what the child inherits from a real backend (its terminal's Ctrl-C,
its ignored SIGCHLD, its import path) cannot break it or fool the monitor."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from conftest import backend_script

FAST = "interval_seconds=0.1, _min_interval_seconds=0.05"
REPO = Path(__file__).resolve().parent.parent


def run_backend(tmp_path: Path, body: str, **popen: Any) -> tuple[dict[str, Any], str]:
    script = tmp_path / "backend.py"
    script.write_text(backend_script(body))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path, **popen
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_ctrl_c_in_the_terminal_does_not_reach_the_child(tmp_path: Path) -> None:
    """SIGINT to the whole process group, as a terminal sends it, while the
    child starts up and again while it samples; the backend survives it (as a
    Jupyter kernel does), and so must the child: no traceback, no restart."""
    result, stderr = run_backend(
        tmp_path,
        f"""
        import json
        interrupts = []
        signal.signal(signal.SIGINT, lambda *a: interrupts.append(1))
        got = []
        mon = sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: got.append(a),
                                      step_source="seconds", {FAST}).start()
        while mon.child_pid is None:
            time.sleep(0.001)
        first = mon.child_pid
        os.killpg(0, signal.SIGINT)  # the child is still importing
        while len(got) < 3:
            time.sleep(0.01)
        os.killpg(0, signal.SIGINT)  # the child is sampling
        sampled = len(got)
        while len(got) < sampled + 3:  # three more records: from the same child, unless it died
            time.sleep(0.01)
        stats = mon.stats()
        mon.stop()
        print(json.dumps({{"interrupts": len(interrupts), "same_child": stats["child_pid"] == first,
                          "restarts": stats["restarts"], "exit": mon.stats()["child_exit_code"]}}))
        """,
        start_new_session=True,  # a process group of its own, like a terminal job
    )
    assert result == {"interrupts": 2, "same_child": True, "restarts": 0, "exit": 0}, result
    assert "KeyboardInterrupt" not in stderr, stderr


def test_with_sigchld_ignored_a_killed_child_is_not_a_clean_exit(tmp_path: Path) -> None:
    """The kernel reaps children at once when SIGCHLD is ignored, so every exit
    status reads as 0; the status block still tells a kill from a clean exit."""
    result, stderr = run_backend(
        tmp_path,
        f"""
        import json
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        got = []
        mon = sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: got.append(a),
                                      step_source="seconds", _restart_backoff=(0.05, 0.2), {FAST}).start()
        while len(got) < 2:
            time.sleep(0.01)
        os.kill(mon.child_pid, signal.SIGKILL)
        while mon.stats()["restarts"] < 1:
            time.sleep(0.01)
        while mon.stats()["records_read"] < 5:
            time.sleep(0.01)
        stats = mon.stats()
        mon.stop()
        print(json.dumps({{"deaths": stats["deaths"], "exit_after_stop": mon.stats()["child_exit_code"]}}))
        """,
    )
    (death,) = result["deaths"]
    assert death["cause"] == "crash" and death["killed"] is True and death["exit_code"] is None
    assert result["exit_after_stop"] == 0  # a child that left when asked declared so
    assert "exit status 0" not in stderr and "exit status unknown" in stderr, stderr


def test_with_sigchld_ignored_a_child_without_shared_memory_is_still_recognised(tmp_path: Path) -> None:
    result, stderr = run_backend(
        tmp_path,
        f"""
        import json, resource
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # the ring cannot be made
        got = []
        with sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: got.append(a),
                                     step_source="seconds", {FAST}) as mon:
            while len(got) < 3:
                time.sleep(0.01)
            stats = mon.stats()
        print(json.dumps({{"isolation": stats["isolation"], "deaths": stats["deaths"]}}))
        """,
    )
    assert result == {"isolation": "thread", "deaths": []}, result
    assert "cannot create its ring" in stderr


def test_a_site_package_with_a_standard_library_name_does_not_break_the_child(tmp_path: Path) -> None:
    """A regular (non-editable) install: ``sampler`` lives in site-packages
    beside a package that shadows a standard-library module (as the old
    ``pathlib`` backport did). The backend's path has the standard library
    first; the child's must too, or it imports the shadow and dies."""
    site = tmp_path / "site-packages"
    for package in ("sampler", "ringbuf"):
        shutil.copytree(REPO / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    (site / "json.py").write_text("raise ImportError('the shadowing json was imported')\n")
    script = tmp_path / "backend.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys, time
            sys.path.append({str(site)!r})  # after the standard library, where site-packages is
            import sampler
            assert sampler.__file__.startswith({str(site)!r}), sampler.__file__
            got = []
            with sampler.ResourceMonitor(categories=["cpu"], sink=lambda *a: got.append(a),
                                         step_source="seconds", {FAST}) as mon:
                deadline = time.monotonic() + 20
                while len(got) < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
                stats = mon.stats()
            result = {{"records": len(got), "isolation": stats["isolation"], "deaths": stats["deaths"]}}
            print(json.dumps(result))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["records"] >= 2 and result["isolation"] == "process" and result["deaths"] == [], result
    assert "shadowing json" not in done.stderr
