"""The status port's HTTP side: a threading TCP server on a daemon thread, read-only.

Each request reads the board (status/shell/status.py) under its lock and answers; nothing here
touches the loop except /livez, which puts one no-op tick on its queue.

The HTTP here is the little the port needs, on socketserver: one GET or HEAD per
connection (HTTP/1.0: the answer ends it), a bounded request head, a JSON or text body.
http.server is not used: it imports http.client, email and ssl (~4 MiB of a guard's RSS,
issue 24) for features a read-only port has no use for.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import socket
import socketserver
import threading
import time
from typing import Any, Protocol

from sglang_guard.sglang.redact import redact_text
from sglang_guard.status import status as model


class Board(Protocol):
    """What the port reads: status/shell/status.py's `StatusBoard` (named here by its shape, so that
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
MAX_LINE = 65536  # bytes in the request line or one header line (http.server's bound)
MAX_HEADERS = 100  # header lines in one request (http.server's bound)
SERVER = "sglang-guard"
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 414: "URI Too Long",
           431: "Request Header Fields Too Large", 501: "Not Implemented",
           503: "Service Unavailable", 505: "HTTP Version Not Supported"}
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class _Refused(Exception):
    """A request head the port answers with an error status, then closes."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class _Handler(socketserver.StreamRequestHandler):
    board: Board
    timeout = IO_TIMEOUT_S  # StreamRequestHandler: the socket's timeout, reads and writes
    head_only = False

    def handle(self) -> None:
        """One request; until its request line and headers are in, the connection is idle."""
        book = tracker(self.server)
        book.idle(self.request)
        try:
            method, target = self._read_head()
        except _Refused as exc:
            self._send(exc.code, json.dumps({"error": str(exc)}).encode(), "application/json")
            return
        except (OSError, EOFError):  # hung up, or silent past IO_TIMEOUT_S
            return
        book.busy(self.request)
        self.head_only = method == "HEAD"  # GET without the body (a load balancer's check)
        self._answer(target.split("?", 1)[0])

    def _read_head(self) -> tuple[str, str]:
        """(method, target) of the request; its header lines are read and left unused."""
        words = self._line(414).decode("latin-1").split()
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            raise _Refused(400, "bad request line")
        method, target, version = words
        for _ in range(MAX_HEADERS + 1):
            if self._line(431) in (b"\r\n", b"\n"):
                break
        else:
            raise _Refused(431, "too many header lines")
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise _Refused(505, "HTTP/1.0 or HTTP/1.1 only")
        if method not in ("GET", "HEAD"):
            raise _Refused(501, "GET or HEAD only")
        return method, target

    def _line(self, too_long: int) -> bytes:
        """One line of the head, at most MAX_LINE bytes (longer: `too_long` is the answer)."""
        line = self.rfile.readline(MAX_LINE + 1)
        if not line:
            raise EOFError
        if len(line) > MAX_LINE:
            raise _Refused(too_long, "line too long")
        return line

    def _answer(self, path: str) -> None:
        board = self.board
        exposition = getattr(board.metrics, "exposition", None)  # None: the port is off
        if path == "/metrics" and exposition is not None:
            from sglang_guard.status.shell.metrics import CONTENT_TYPE  # noqa: PLC0415

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
        head = (f"HTTP/1.0 {code} {REASONS[code]}\r\nServer: {SERVER}\r\nDate: {http_date()}\r\n"
                f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                "Cache-Control: no-store\r\nConnection: close\r\n\r\n").encode("latin-1")
        with contextlib.suppress(OSError):  # the prober hung up: nothing to tell
            self.wfile.write(head if self.head_only else head + body)


def http_date(now: float | None = None) -> str:
    """An HTTP Date header's value (RFC 9110's IMF-fixdate), whatever the locale."""
    t = time.gmtime(now)
    return (f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


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


class CappedServer(socketserver.TCPServer):
    """A TCP server that keeps to its `connections` book: a new connection is admitted by
    closing the oldest idle one past the cap, and one that ends is forgotten (the status
    port and the group port)."""

    connections: Connections

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return self.connections.admit(request)

    def shutdown_request(self, request: Any) -> None:
        self.connections.gone(request)
        super().shutdown_request(request)


class _Server(socketserver.ThreadingMixIn, CappedServer):
    """A threading TCP server whose clients cannot take it, or the guard, down.

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
