"""Process targets for ``test_ring_stress.py`` (importable by ``spawn`` children).

Record ``i`` is self-checking: field ``j`` holds ``((i * (2j+1)) ^ X_j) * (-1)**j`` and the
timestamp is ``1000 i + 17``. Every field on its own determines ``i``, so a row that mixes
words of two records (or is a whole other record) never equals ``expected_rows(i)``.
"""

from __future__ import annotations

import time
import traceback
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ringbuf import Ring

BLOCK = 4096  # records generated per vectorised batch by the writer


def expected_rows(indices: npt.NDArray[np.int64], n_fields: int) -> npt.NDArray[np.float64]:
    j = np.arange(n_fields, dtype=np.int64)
    mult = 2 * j + 1
    xor = 0x5555_5555 * (j + 1)
    sign = np.where(j % 2 == 0, 1, -1)
    ints = ((indices[:, None] * mult[None, :]) ^ xor[None, :]) * sign[None, :]
    return ints.astype(np.float64)  # exact: |ints| < 2**53 for any index this test reaches


def expected_timestamps(indices: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return indices * 1000 + 17


def writer(name, n_fields, duration_s, ready, go, done, results) -> None:
    """Attach as the ring's writer, write self-checking records for ``duration_s``."""
    ring = None
    written = 0
    try:
        ring = Ring.attach(name, writer=True)
        ready.put(("writer", None))
        go.wait()
        deadline = time.monotonic() + duration_s
        first = ring.head
        while time.monotonic() < deadline:
            idx = np.arange(first + written, first + written + BLOCK, dtype=np.int64)
            rows = expected_rows(idx, n_fields)
            stamps = expected_timestamps(idx).tolist()
            for k in range(BLOCK):
                ring.write(rows[k], timestamp_ns=stamps[k])
            written += BLOCK
        results.put(("writer", {"written": written, "head": ring.head}))
    except BaseException:
        results.put(("writer", {"error": traceback.format_exc()}))
        raise
    finally:
        done.set()
        if ring is not None:
            ring.close()


class Committed(NamedTuple):
    """What ``Ring.read_committed`` returned, as arrays like ``Ring.read``'s."""

    indices: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    timestamps_ns: npt.NDArray[np.int64]
    cursor: int
    lost: int


def read_committed(ring: Ring, cursor: int, n_fields: int) -> Committed:
    records, cursor, lost = ring.read_committed(cursor)
    return Committed(
        np.array([index for index, _, _ in records], dtype=np.int64),
        np.array([values for _, values, _ in records], dtype=np.float64).reshape(len(records), n_fields),
        np.array([stamp for _, _, stamp in records], dtype=np.int64),
        cursor,
        lost,
    )


def reader(name, n_fields, label, pause_s, ready, go, done, results) -> None:
    """Read in a loop (sleeping ``pause_s`` between reads) until the writer is done, then once more;
    the ``committed`` reader as the monitor's does (``read_committed``), the others with ``read``."""
    ring = None
    stats = {
        "accepted": 0,
        "lost": 0,
        "torn": 0,
        "non_monotonic": 0,
        "reads": 0,
        "accepted_while_writing": 0,
        "lost_while_writing": 0,
        "cursor": 0,
    }
    cursor = 0
    last_index = -1

    def take(res) -> None:
        nonlocal cursor, last_index
        idx = res.indices
        if len(idx):
            bad_order = int(np.count_nonzero(np.diff(idx) <= 0))
            bad_order += int(idx[0] <= last_index or idx[0] < cursor or idx[-1] >= res.cursor)
            stats["non_monotonic"] += bad_order
            good = (res.values == expected_rows(idx, n_fields)).all(axis=1)
            good &= res.timestamps_ns == expected_timestamps(idx)
            stats["torn"] += int(len(idx) - np.count_nonzero(good))
            last_index = int(idx[-1])
        if res.cursor < cursor:
            stats["non_monotonic"] += 1
        stats["accepted"] += len(idx)
        stats["lost"] += res.lost
        stats["reads"] += 1
        cursor = res.cursor

    try:
        ring = Ring.attach(name)
        ready.put((label, None))
        go.wait()
        read = ring.read if label != "committed" else lambda cursor: read_committed(ring, cursor, n_fields)
        while not done.is_set():
            take(read(cursor))
            if pause_s:
                time.sleep(pause_s)
        stats["accepted_while_writing"] = stats["accepted"]
        stats["lost_while_writing"] = stats["lost"]
        take(ring.read(cursor))  # the writer has finished: this read reaches the final head
        stats["cursor"] = cursor
        results.put((label, stats))
    except BaseException:
        results.put((label, {"error": traceback.format_exc()}))
        raise
    finally:
        if ring is not None:
            ring.close()
