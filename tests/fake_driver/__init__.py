"""The fake NVIDIA driver: ``libnvidia-ml.c`` beside this file, built with the
system's C compiler as ``libnvidia-ml.so.1`` and loaded by the real
``nvidia-ml-py`` binding, which finds it on ``LD_LIBRARY_PATH``.

A test configures it with the keys ``tests/fake_nvml.py`` takes (``devices``,
``init_error``, ``fail``/``fail_code``, ``segfault``, ``hang``, ``hang_marker``,
``missing``), plus per device:

- ``energy`` (false: no energy counter) and ``energy_mj`` (its count at the start);
- ``mig_compute`` ({slot: processes}: the processes on that MIG device);
- ``fields`` ({field id: nanoseconds per second}: a cumulative clocks event duration
  rising at that rate);
- ``spikes`` ([(sampling type, value, start_us, end_us)]: what ``nvmlDeviceGetSamples``
  reads then, real-time microseconds) and ``sample_period_us``;
- ``xids`` ([(code, at_us)]: critical XID errors, delivered to the event sets waiting
  from then on);
- ``gpm`` ({metric id: value}: GPM, supported on a device that has any, each metric that
  value between any two samples).

Function names are the C library's: ``nvmlInitWithFlags``,
``nvmlDeviceGetComputeRunningProcesses_v3``. ``missing`` functions are left out of the
library when it is built, as an older driver lacks them; the library is built once per set
of them and cached in the user's own directory under the temporary one. What the library
cannot do (hold the GIL while it hangs: ctypes releases it around every call) stays with
the Python fake.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("libnvidia-ml.c")
SONAME = "libnvidia-ml.so.1"
CONTROL_ENV = "FAKE_NVML_CONTROL"
DEVICE_KEYS = (
    "mem_clock",
    "sm_clock",
    "used",
    "total",
    "temp",
    "util",
    "power_mw",
    "power_limit_mw",
    "throttle",
    "uuid",
    "lost_after",
    "lost_code",
    "energy",
    "energy_mj",
    "sample_period_us",
)
"""Per-device keys written as ``device I KEY VALUE``."""
RULES = ("fail", "segfault", "hang")

_loaded: ctypes.CDLL | None = None


def default_uuid(index: int) -> str:
    """The UUID the library gives device ``index`` when its control names none."""
    return f"GPU-{index:08x}-fake-4e56-8d3a-000000000000"


FLAGS = ("-shared", "-fPIC", "-O1", "-Wall", "-Werror", f"-Wl,-soname,{SONAME}")


def _cache() -> Path:
    """This user's directory for the builds under the shared temporary one (made 0700 if missing).
    RuntimeError when its name is taken by something else (a link, another user's directory, one
    others may write): a library found there is loaded into every test process."""
    directory = Path(tempfile.gettempdir()) / f"wl-fake-nvml-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    found = directory.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o022:
        raise RuntimeError(
            f"{directory} is not a private directory of uid {os.geteuid()} ({stat.filemode(found.st_mode)},"
            f" owned by uid {found.st_uid}): the fake NVIDIA driver is not built there"
        )
    return directory


def build(omit: Iterable[str] = ()) -> Path:
    """The directory holding ``libnvidia-ml.so.1`` built without the functions
    ``omit`` names (cached by the hash of the source and the flags; built under a
    private name and renamed, so parallel test workers never see half a file)."""
    flags = [*FLAGS, *(f"-DOMIT_{name}" for name in sorted(set(omit)))]
    key = hashlib.sha256(SOURCE.read_bytes() + json.dumps(flags).encode()).hexdigest()[:16]
    directory = _cache() / key
    library = directory / SONAME
    if library.exists():
        return directory
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("the fake NVIDIA driver needs a C compiler (cc or gcc) on PATH")
    directory.mkdir(exist_ok=True)
    partial = directory / f".{SONAME}.{os.getpid()}"
    command = [compiler, *flags, "-o", str(partial), str(SOURCE), "-lpthread"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"building the fake NVIDIA driver failed:\n{done.stderr}")
    os.replace(partial, library)
    return directory


def load() -> ctypes.CDLL:
    """The full library, loaded into this process once: the binding's
    ``CDLL("libnvidia-ml.so.1")`` then finds it loaded, by its soname."""
    global _loaded
    if _loaded is None:
        _loaded = ctypes.CDLL(str(build() / SONAME))
    return _loaded


def _library() -> ctypes.CDLL:
    """The fake driver this process's binding uses (the one ``load`` preloaded, or
    the build ``LD_LIBRARY_PATH`` named when the process started), typed for the
    test hooks."""
    import pynvml

    library = pynvml.nvmlLib if pynvml.nvmlLib is not None else load()
    library.fake_nvml_calls.restype = ctypes.c_long
    library.fake_nvml_calls.argtypes = [ctypes.c_char_p, ctypes.c_int]
    library.fake_nvml_device_calls.restype = ctypes.c_long
    library.fake_nvml_function.restype = ctypes.c_char_p
    return library


def calls(function: str, index: int) -> int:
    """Calls of ``function`` on device ``index`` in this process since the control last changed."""
    return int(_library().fake_nvml_calls(function.encode(), index))


def all_calls(devices: int = 64) -> dict[tuple[str, int], int]:
    """(function, device index) -> its calls in this process since the control last changed."""
    library, names = _library(), []
    while (name := library.fake_nvml_function(len(names))) is not None:
        names.append(name.decode())
    return {(name, i): n for name in names for i in range(devices) if (n := calls(name, i))}


def device_calls(index: int) -> int:
    """Calls of any function on device ``index`` in this process since the control last changed."""
    return int(_library().fake_nvml_device_calls(index))


def initialized() -> bool:
    """NVML is initialised in this process (``nvmlInit*`` more often than ``nvmlShutdown``)."""
    return bool(_library().fake_nvml_initialized())


def control_text(config: dict[str, Any], origin_us: int) -> str:
    """The control file for ``config`` (the keys this module's docstring names)."""
    if config.get("hang_holding_gil"):
        raise ValueError("the C driver cannot hold the GIL (ctypes releases it): use tests/fake_nvml.py")
    lines = [f"origin_us {origin_us}"]
    if config.get("init_error"):
        lines.append(f"init_error {int(config['init_error'])}")
    if config.get("hang_marker"):
        lines.append(f"hang_marker {config['hang_marker']}")
    devices = config.get("devices", [])
    lines.append(f"devices {len(devices)}")
    for index, device in enumerate(devices):
        lines += _device_lines(index, device)
    codes = config.get("fail_code", {})
    for rule in RULES:
        for function, targets in config.get(rule, {}).items():
            where = ["all"] if targets is True else [str(index) for index in targets]
            code = f" {int(codes.get(function, 3))}" if rule == "fail" else ""
            lines += [f"{rule} {function} {target}{code}" for target in where]
    return "\n".join(lines) + "\n"


def _device_lines(index: int, device: dict[str, Any]) -> list[str]:
    unknown = set(device) - {
        *DEVICE_KEYS,
        "compute",
        "graphics",
        "mig",
        "mig_compute",
        "fields",
        "spikes",
        "xids",
        "gpm",
    }
    if unknown:
        raise ValueError(f"unknown device keys for the C driver: {sorted(unknown)}")
    lines = [
        f"device {index} {key} {int(device[key]) if key != 'uuid' else device[key]}"
        for key in DEVICE_KEYS
        if key in device
    ]
    for kind in ("compute", "graphics"):
        for process in device.get(kind, []):
            used = "na" if process["used"] is None else int(process["used"])
            lines.append(f"device {index} process {kind} {int(process['pid'])} {used}")
    lines += [f"device {index} mig {uuid}" for uuid in device.get("mig", [])]
    for slot, processes in device.get("mig_compute", {}).items():
        for process in processes:
            used = "na" if process["used"] is None else int(process["used"])
            lines.append(f"device {index} mig_process {int(slot)} compute {int(process['pid'])} {used}")
    lines += [f"device {index} field {int(i)} {float(rate)}" for i, rate in device.get("fields", {}).items()]
    lines += [
        f"device {index} spike {int(t)} {int(v)} {int(a)} {int(b)}" for t, v, a, b in device.get("spikes", [])
    ]
    lines += [f"device {index} xid {int(code)} {int(at_us)}" for code, at_us in device.get("xids", [])]
    lines += [
        f"device {index} gpm {int(metric)} {float(value)}" for metric, value in device.get("gpm", {}).items()
    ]
    return lines


class Driver:
    """One test's driver: its control file in ``directory``, named in this
    process's environment with the library's directory first on
    ``LD_LIBRARY_PATH``, both inherited by the sampling child it starts."""

    def __init__(self, directory: Path, environ: Any) -> None:
        self.control = directory / "fake-nvml.control"
        self.origin_us = time.time_ns() // 1000
        self._environ = environ

    def configure(self, **config: Any) -> None:
        """Write ``config`` (replacing the file, so a running driver reads it whole)."""
        library = build(config.get("missing", ()))
        partial = self.control.with_suffix(".partial")
        partial.write_text(control_text(config, self.origin_us))
        os.replace(partial, self.control)
        self._environ.setenv(CONTROL_ENV, str(self.control))
        path = os.environ.get("LD_LIBRARY_PATH", "")
        kept = [part for part in path.split(os.pathsep) if part and "wl-fake-nvml-" not in part]
        self._environ.setenv("LD_LIBRARY_PATH", os.pathsep.join([str(library), *kept]))
