"""The status port's HTTP side: a ThreadingHTTPServer on a daemon thread, read-only.

Each request reads the board (shell/status.py) under its lock and answers; nothing here
touches the loop except /livez, which puts one no-op tick on its queue.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from sglang_guard.core import status as model
from sglang_guard.core.redact import redact_text

if TYPE_CHECKING:
    from sglang_guard.shell.status import StatusBoard


class _Handler(BaseHTTPRequestHandler):
    board: StatusBoard
    server_version = "sglang-guard"

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
        with contextlib.suppress(OSError):  # the prober hung up: nothing to tell
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: probes every few seconds would drown SGLang's own output."""


class StatusServer:
    """A ThreadingHTTPServer on its own daemon thread."""

    def __init__(self, board: StatusBoard, host: str, port: int) -> None:
        handler = type("Handler", (_Handler,), {"board": board})
        server_cls = type("Server", (ThreadingHTTPServer,), {
            "daemon_threads": True, "allow_reuse_address": True,
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
