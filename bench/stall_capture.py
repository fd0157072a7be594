"""What one stall capture costs: the sampling child's CPU time to read every thread's kernel state
and take every thread's Python stack, the backend's CPU time in the dump handler (its signalled
thread's run time across the dump, from ``schedstat``), and the wall time of a capture.

``python -m bench.stall_capture [--captures 20] [--threads 8] [--depth 30] [--quick]``: a backend
process installs the dump handler (``sampler.supervision.stacks``) and runs ``--threads``
threads asleep ``--depth`` frames deep; this process, in the sampling child's place, opens
the handler's memory file through ``/proc`` and captures that backend ``--captures`` times,
printing the median and the worst of each cost.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time

from sampler.child.capture import capture
from sampler.ipc.channel import StackTarget
from sampler.supervision.stacks import STACK_SIGNAL

BACKEND = textwrap.dedent(
    """
    import os, socket, sys, threading, time
    from sampler.supervision import stacks
    threads, depth, channel = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    fd = stacks.install()
    socket.send_fds(socket.socket(fileno=channel), [b"."], [fd])  # the very file, as the child gets it
    def deep(n):
        return deep(n - 1) if n else time.sleep(3600)
    for _ in range(threads):
        threading.Thread(target=deep, args=(depth,), daemon=True).start()
    print(threading.get_native_id(), threading.main_thread().ident, flush=True)
    deep(depth)
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--captures", type=int, default=20)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--depth", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="3 captures of 3 threads (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.captures, args.threads = 3, 2
    ours, theirs = socket.socketpair()
    backend = subprocess.Popen(
        [sys.executable, "-c", BACKEND, str(args.threads), str(args.depth), str(theirs.fileno())],
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=[theirs.fileno()],
    )
    theirs.close()
    try:
        assert backend.stdout is not None
        tid, main_ident = (int(word) for word in backend.stdout.readline().split())
        # The main thread is signalled here (the backend has no monitor thread): it sleeps in
        # Python's time.sleep, which resumes after a handled signal.
        _, (memfd,), _, _ = socket.recv_fds(ours, 1, 1)
        target = StackTarget(STACK_SIGNAL, tid, main_ident)
        cpu, handler, wall, size = [], [], [], []
        for _ in range(args.captures):
            began = time.monotonic()
            evidence = capture(backend.pid, target, memfd)
            wall.append(time.monotonic() - began)
            assert evidence.stacks is not None, evidence.notes
            cpu.append(evidence.cpu_seconds)
            if evidence.handler_seconds is not None:
                handler.append(evidence.handler_seconds)
            size.append(len(evidence.stacks))
        left = os.fstat(memfd).st_size
        os.close(memfd)
    finally:
        backend.kill()
        backend.wait()
    print(
        f"{args.captures} captures of {args.threads + 1} threads {args.depth} frames deep "
        f"({size[0]} B of stacks; the memory file holds {left} B after them)"
    )
    for name, values in (("child CPU", cpu), ("handler CPU (backend)", handler), ("wall", wall)):
        if values:
            print(
                f"  {name:22} median {statistics.median(values) * 1e3:7.2f} ms   "
                f"worst {max(values) * 1e3:7.2f} ms"
            )


if __name__ == "__main__":
    main()
