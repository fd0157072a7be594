"""A small HTTP server for scrapes that no client can use to starve the child.

Any local user can connect to the endpoint. A thread and a descriptor per
connection, with no read timeout (``http.server``'s way), let a few hundred
idle connections take every descriptor the child has: its psutil readings then
fail, and its accept loop spins on ``EMFILE``. So one thread serves every
connection from a selector, and a client costs only itself:

- at most ``MAX_CONNECTIONS`` are open at once; a new one, when all are taken,
  replaces the connection that has waited longest for its request (an idle
  client), so a real scrape still gets through a flood of idle ones;
- a request must arrive whole within ``READ_TIMEOUT_SECONDS``, and the reply
  be taken within ``WRITE_TIMEOUT_SECONDS``, or the connection is dropped;
- a failed ``accept`` (the process or the system out of descriptors) pauses
  accepting for ``ACCEPT_PAUSE_SECONDS`` instead of retrying at once;
- each dropped connection is counted by reason (``dropped``), never printed.

With nothing to do the thread sleeps in ``select()`` with no timeout: an idle
endpoint costs no wake-ups. Each reply closes its connection (HTTP/1.0 style,
which Prometheus reads as it reads any other).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("sampler")

MAX_CONNECTIONS = 16
"""Connections open at once (a few Prometheus servers scrape a target, one request at a time each)."""
READ_TIMEOUT_SECONDS = 2.0
"""How long a client has to send its whole request."""
WRITE_TIMEOUT_SECONDS = 5.0
"""How long a client has to take the whole reply."""
ACCEPT_PAUSE_SECONDS = 0.5
"""How long accepting pauses after ``accept`` failed for want of descriptors or memory."""
BACKLOG = 1024
"""Connections the kernel queues before we accept them (capped by ``net.core.somaxconn``):
a long queue costs no descriptor, and a burst that overflows it delays real scrapes."""
MAX_REQUEST_BYTES = 16 * 1024
"""A request (line and headers) longer than this is refused."""
DROP_REASONS = ("timeout", "evicted", "full", "closed", "reset", "bad_request", "accept_failed")
"""Why connections are dropped, as counted in ``ScrapeServer.dropped``."""
_ACCEPT_FAILURES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

Render = Callable[[str], tuple[bytes, str]]
"""The reply's body and content type for a request's ``Accept`` header."""


@dataclass
class _Connection:
    sock: socket.socket
    deadline: float
    """``time.monotonic()`` by which it must have sent its request (reading) or taken the reply."""
    request: bytearray = field(default_factory=bytearray)
    reply: memoryview | None = None
    """What is left to send; None while the request is still being read."""


def _parse(request: bytes) -> tuple[str, str, dict[str, str]] | None:
    """(method, path, lower-cased headers) of a request's head, None if it is not HTTP."""
    line, *lines = request.decode("latin-1").split("\r\n")  # latin-1 decodes every byte
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    headers = {}
    for text in lines:
        name, colon, value = text.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


def _reply(status: str, body: bytes, content_type: str, extra: str = "") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class ScrapeServer:
    """Serves ``render``'s body at every path but ``/favicon.ico``, for GET and HEAD.

    Binds at construction (raising ``OSError``, or ``socket.gaierror`` for an
    address that does not resolve); ``start`` serves from a daemon thread;
    ``close`` stops it within a moment and closes every socket.
    """

    def __init__(self, address: str, port: int, render: Render) -> None:
        self._render = render
        family, kind, proto, _, where = socket.getaddrinfo(
            address or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, kind, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(where)
            listener.listen(BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._selector.register(listener, selectors.EVENT_READ)
        self._accepting = True
        self._resume_at = 0.0
        self._connections: dict[int, _Connection] = {}
        self._thread = threading.Thread(target=self._serve, name="wl-metrics-endpoint", daemon=True)
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        """Connections dropped so far, by reason (the client's problem, never printed)."""
        self._render_failed = False

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port and every connection (bounded)."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(1.0)
        if not self._thread.is_alive():
            self._release()

    def _release(self) -> None:
        for conn in list(self._connections.values()):
            conn.sock.close()
        self._connections.clear()
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    def _serve(self) -> None:
        while True:
            events = self._selector.select(self._timeout())
            for key, _ in events:
                if key.fileobj is self._wake_r:
                    return
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    conn = self._connections.get(key.fd)
                    if conn is not None:
                        self._step(conn)
            self._expire()

    def _timeout(self) -> float | None:
        """Seconds to the next deadline (a connection's, or the end of an accept pause)."""
        deadlines = [conn.deadline for conn in self._connections.values()]
        if not self._accepting:
            deadlines.append(self._resume_at)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _accept(self) -> None:
        for _ in range(MAX_CONNECTIONS):  # bounded work per wake-up
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _ACCEPT_FAILURES:
                    # The connection stays queued in the kernel; retrying at once would spin.
                    self.dropped["accept_failed"] += 1
                    self._selector.unregister(self._listener)
                    self._accepting = False
                    self._resume_at = time.monotonic() + ACCEPT_PAUSE_SECONDS
                return  # ECONNABORTED and the like: the client gave up
            if len(self._connections) >= MAX_CONNECTIONS and not self._evict_idlest():
                self.dropped["full"] += 1
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Connection(sock, time.monotonic() + READ_TIMEOUT_SECONDS)
            self._connections[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ)
            # A real client has sent its request by now: serve it before the next
            # accept can evict it.
            self._step(conn)

    def _evict_idlest(self) -> bool:
        """Drop the connection that has waited longest for its request, one that
        has sent nothing before one that has begun; False if all are replying."""
        reading = [conn for conn in self._connections.values() if conn.reply is None]
        if not reading:
            return False
        self._drop(min(reading, key=lambda conn: (bool(conn.request), conn.deadline)), "evicted")
        return True

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._connections.values() if c.deadline <= now]:
            self._drop(conn, "timeout")
        if not self._accepting and now >= self._resume_at:
            self._accepting = True
            self._selector.register(self._listener, selectors.EVENT_READ)

    def _drop(self, conn: _Connection, reason: str | None) -> None:
        if reason is not None:
            self.dropped[reason] += 1
        self._connections.pop(conn.sock.fileno(), None)
        self._selector.unregister(conn.sock)
        conn.sock.close()

    def _step(self, conn: _Connection) -> None:
        """Read more of the request, or send more of the reply."""
        try:
            if conn.reply is None:
                data = conn.sock.recv(4096)
                if not data:
                    self._drop(conn, "closed")
                    return
                conn.request += data
                end = conn.request.find(b"\r\n\r\n")
                if end < 0:
                    if len(conn.request) > MAX_REQUEST_BYTES:
                        self._drop(conn, "bad_request")
                    return
                conn.reply = memoryview(self._answer(bytes(conn.request[:end])))
                conn.deadline = time.monotonic() + WRITE_TIMEOUT_SECONDS
                self._selector.modify(conn.sock, selectors.EVENT_WRITE)
            sent = conn.sock.send(conn.reply)
            conn.reply = conn.reply[sent:]
            if not conn.reply:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_WR)
                self._drop(conn, None)
        except (BlockingIOError, InterruptedError):
            return  # the socket was not ready after all
        except OSError:
            self._drop(conn, "reset")

    def _answer(self, head: bytes) -> bytes:
        parsed = _parse(head)
        if parsed is None:
            self.dropped["bad_request"] += 1
            return _reply("400 Bad Request", b"bad request\n", "text/plain")
        method, path, headers = parsed
        if method not in ("GET", "HEAD"):
            return _reply("405 Method Not Allowed", b"", "text/plain", "Allow: GET, HEAD\r\n")
        if path.split("?", 1)[0] == "/favicon.ico":
            return _reply("404 Not Found", b"", "text/plain")
        try:
            body, content_type = self._render(headers.get("accept", ""))
        except Exception:
            if not self._render_failed:  # ours, not the client's: said once
                self._render_failed = True
                log.exception("resource monitor: the metrics endpoint failed to render a scrape")
            return _reply("500 Internal Server Error", b"", "text/plain")
        extra = ""
        if "gzip" in headers.get("accept-encoding", ""):
            body, extra = gzip.compress(body, compresslevel=1), "Content-Encoding: gzip\r\n"
        reply = _reply("200 OK", body, content_type, extra)
        if method == "HEAD":
            return reply[: reply.index(b"\r\n\r\n") + 4]
        return reply
