"""The postmortem: what the sampling child leaves behind when the backend dies under it.

A backend that is SIGKILLed, taken by the OOM killer or crashes never stops its
monitor, and the records it had not logged yet would die with it. The child
outlives it by a moment (its watchdog sees the death within a second); before
leaving, it writes down everything its ring still holds, so the readings that led
up to the death (memory climbing to a limit, say) can still be read.

Format: JSON lines (no NaN: a reading that failed is left out).

- a header object: ``format`` (``FORMAT``), ``version``, ``backend_pid``,
  ``monitored_pid`` (the process the ``process`` readings describe), ``host``,
  ``vanished_at`` (when the child saw the backend gone) and ``written_at`` and
  ``monitor_started_at`` (s since the epoch), ``interval_seconds``,
  ``ring_capacity``, ``fields`` (the ring's field names; peaks and means end in
  ``_peak``/``_mean``), ``records`` (how many follow), ``last_logged_record`` and
  ``last_logged_step`` (the last record the backend logged and its step; null
  before any); since version 2 how it died: ``exit`` (``Exit``: its exit status or the
  signal that ended it, learned through its pidfd, or why that could not be learned; null
  when not looked up) and ``memory_cgroup`` (``CgroupAtDeath``: its memory cgroup's OOM kill
  count when the child started and when the backend vanished, its high-water mark and limit;
  null without one), and ``peaks`` (the last record's ``_peak`` fields, name -> value);
  ``stall``: the stall open as the backend vanished, null when none was (``kind``, ``step``,
  ``started_at``, ``detected_after``, ``timeout``, ``main_frames``: the main thread's
  innermost frames once captured, ``stall_id``: its row in the store's ``stalls``, or null);
- then one object per record, oldest first: ``record`` (its number), ``wall_time``
  (s since the epoch), ``logged`` (the backend had logged it or a later record)
  and ``values`` (field -> reading).

Where: with a run store, a row of its ``postmortems`` table (``sampler.store.schema``);
otherwise a file ``postmortem-<UTC time>-pid<N>.jsonl`` in the postmortem
directory (mode 0600), written under a temporary name and then renamed, never
through a link planted at either name (``sampler.util.atomicfile``), so a reader
never sees half of one. What cannot be written falls back, said on stderr: a
store to the directory (or the temporary one), a directory to
``fallback_directory()``, this user's own under the shared temporary directory
(one planted there by another user, or a link, is refused).
Writing is capped at ``WRITE_CAP_SECONDS``: a stuck filesystem never keeps the
child alive.

Here is when: the backend's death told (``backend_died``) and the postmortem left in time
(``leave``). What is copied is ``snapshot``'s, the text ``postmortem_text``'s, where it goes
(and the fallback directory's security) ``postmortem_write``'s.
"""

from __future__ import annotations

import os
import select
import threading
import time
from dataclasses import replace

from ringbuf import Ring
from sampler.child.postmortem_write import say, write
from sampler.child.snapshot import Witness, take
from sampler.ipc.channel import ChildParams
from sampler.ipc.status import ChildStatus

WRITE_CAP_SECONDS = 2.0
"""The longest the child spends writing a postmortem before it leaves without one."""
EOF_DEATH_WAIT_SECONDS = 0.25
"""After EOF on the channel, how long to wait for the backend's death to show: its
socket closes while it exits, a moment before its pidfd signals."""


def backend_died(backend_pid: int, pidfd: int | None) -> bool:
    """After EOF on the channel: whether the backend is gone (or goes within
    ``EOF_DEATH_WAIT_SECONDS``), rather than alive and done with us."""
    deadline = time.monotonic() + EOF_DEATH_WAIT_SECONDS
    while os.getppid() == backend_pid:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if pidfd is not None:
            return bool(select.select([pidfd], [], [], left)[0])
        time.sleep(min(left, 0.01))
    return True


def leave(
    params: ChildParams,
    ring: Ring | None,
    status: ChildStatus,
    vanished_at: float,
    witness: Witness,
    stall: dict[str, object] | None = None,
) -> bool:
    """Write the postmortem of the backend that just vanished, with how it died and the
    ``stall`` open then, within ``EXIT_WAIT_SECONDS + WRITE_CAP_SECONDS``; False if it was
    still being written then (the child should leave anyway)."""
    target = params.postmortem
    if target is None:
        return True
    snap = replace(witness.learn(take(params, ring, status, vanished_at)), stall=stall)
    # Not a daemon (which it would be by default, made by the watchdog): if the main
    # thread ends meanwhile, the interpreter waits for it.
    writer = threading.Thread(target=write, args=(snap, target), name="postmortem", daemon=False)
    writer.start()
    writer.join(WRITE_CAP_SECONDS)
    if writer.is_alive():
        say(f"the postmortem could not be written within {WRITE_CAP_SECONDS:g} s; leaving without it")
        return False
    return True
