"""The status port's HTTP side: a ThreadingHTTPServer on a daemon thread, read-only.

Each request reads the board (shell/status.py) under its lock and answers; nothing here
touches the loop except /livez, which puts one no-op tick on its queue.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from sglang_guard.core import status as model
from sglang_guard.core.redact import redact_text


class Board(Protocol):
    """What the port reads: shell/status.py's `StatusBoard` (named here by its shape, so that
    the board, which starts this server, and the server do not import each other)."""

    @property
    def metrics(self) -> object: ...

    def snapshot(self) -> model.Snapshot: ...

    def document(self) -> dict[str, Any]: ...

    def alive(self) -> bool: ...


# Bounds that keep the port answering whatever its clients do (issue 22, item 2).
IO_TIMEOUT_S = 5.0  # per connection: a read or a write that takes longer ends it
MAX_CONNECTIONS = 64  # past this, the oldest idle connection is closed for a new one
FDS_KEPT = 128  # fds the port leaves to the rest of the guard (pipes, journal, psutil's reads)
BACKLOG = 128  # the listen queue (socketserver's default of 5 drops a burst of probes)


class _Handler(BaseHTTPRequestHandler):
    board: Board
    server_version = "sglang-guard"
    timeout = IO_TIMEOUT_S  # StreamRequestHandler: the socket's timeout, reads and writes

    def handle_one_request(self) -> None:
        """One request; until its request line and headers are in, the connection is idle."""
        tracker(self.server).idle(self.request)
        super().handle_one_request()

    def parse_request(self) -> bool:
        """The request is in: from now on the connection is busy (never closed for another)."""
        ok = super().parse_request()
        if ok:
            tracker(self.server).busy(self.request)
        return ok

    def do_HEAD(self) -> None:
        """GET without the body (a load balancer's or curl -I's check)."""
        self._head_only = True
        self.do_GET()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        board = self.board
        exposition = getattr(board.metrics, "exposition", None)  # None: the port is off
        if path == "/metrics" and exposition is not None:
            from sglang_guard.shell.metrics import CONTENT_TYPE  # noqa: PLC0415

            self._send(200, exposition(), CONTENT_TYPE)
        elif path == "/status":
            self._send(200, json.dumps(board.document(), default=str).encode(),
                       "application/json")
        elif path in ("/livez", "/readyz", "/startupz"):
            snap = board.snapshot()
            if path == "/livez":
                ok = board.alive()
            else:
                ok = snap.ready if path == "/readyz" else model.startup_ok(snap)
            body = {"ok": ok, "phase": snap.phase, "stage": snap.stage,
                    "gave_up": redact_text(snap.gave_up) if snap.gave_up else None}
            self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")
        else:
            self._send(404, b'{"error": "not found"}', "application/json")

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if getattr(self, "_head_only", False):
            return
        with contextlib.suppress(OSError):  # the prober hung up: nothing to tell
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: probes every few seconds would drown SGLang's own output."""


class Connections:
    """The open connections of the port: each idle (waiting for a request) or busy."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._open: dict[socket.socket, tuple[bool, float]] = {}  # sock -> (busy, since)
        self.evicted = 0
        self.refused = 0

    def admit(self, sock: socket.socket) -> bool:
        """Room for `sock`: the oldest idle connection goes if need be (False: all busy)."""
        victim: socket.socket | None = None
        with self._lock:
            if len(self._open) >= self.cap:
                idle = [(since, s) for s, (busy, since) in self._open.items() if not busy]
                if not idle:
                    self.refused += 1
                    return False
                victim = min(idle, key=lambda item: item[0])[1]
                del self._open[victim]
                self.evicted += 1
            self._open[sock] = (False, time.monotonic())
        if victim is not None:  # its thread's read ends at once; the thread closes it
            with contextlib.suppress(OSError):
                victim.shutdown(socket.SHUT_RDWR)
        return True

    def idle(self, sock: socket.socket) -> None:
        """`sock` waits for its next request."""
        self._mark(sock, busy=False)

    def busy(self, sock: socket.socket) -> None:
        """`sock` has a whole request in: it is being answered."""
        self._mark(sock, busy=True)

    def _mark(self, sock: socket.socket, *, busy: bool) -> None:
        with self._lock:
            if sock in self._open:
                self._open[sock] = (busy, time.monotonic())

    def gone(self, sock: socket.socket) -> None:
        """`sock` was closed."""
        with self._lock:
            self._open.pop(sock, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


def connection_cap(nofile: int | None = None) -> int:
    """How many connections the port keeps: MAX_CONNECTIONS, fewer under a low fd limit, so
    that the supervisor always has fds to stop and relaunch SGLang."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile == resource.RLIM_INFINITY:
            return MAX_CONNECTIONS
    return max(4, min(MAX_CONNECTIONS, (nofile - FDS_KEPT) // 2))


def tracker(server: object) -> Connections:
    """The connection book of the server a handler belongs to."""
    book = getattr(server, "connections", None)
    return book if isinstance(book, Connections) else Connections(MAX_CONNECTIONS)


class _Server(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose clients cannot take it, or the guard, down.

    At most `connection_cap()` connections (threads, fds): a new one closes the oldest idle
    one. When the process is out of fds (EMFILE), a spare fd kept for the purpose is let
    go to accept the pending connection and close it, so the accept loop neither spins nor
    keeps the fds the supervisor needs to stop and relaunch SGLang.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[_Handler]) -> None:
        self.connections = Connections(connection_cap())
        self._spare: int | None = _spare_fd()
        self.dropped = 0  # connections closed unread for want of fds
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            self._shed()
            raise

    def _shed(self) -> None:
        """Out of fds: free the spare, take the pending connection and close it."""
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        with contextlib.suppress(OSError):
            sock, _ = self.socket.accept()
            sock.close()
            self.dropped += 1
        self._spare = _spare_fd()

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return self.connections.admit(request)

    def shutdown_request(self, request: Any) -> None:
        self.connections.gone(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that broke off: nothing to print (SGLang's output is on the same stream)."""

    def server_close(self) -> None:
        super().server_close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None


def _spare_fd() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class StatusServer:
    """The status port's server on its own daemon thread."""

    def __init__(self, board: Board, host: str, port: int) -> None:
        handler = type("Handler", (_Handler,), {"board": board})
        server_cls = type("Server", (_Server,), {
            "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
        self.httpd = server_cls((host, port), handler)
        self.address = self.httpd.server_address[:2]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.2,),
                                       name="status", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
