"""The health probe's plain-socket GET against real HTTP servers on free ports."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sglang_guard.supervise.shell import health


@contextmanager
def _server(status: int, seen: list[dict[str, str]]) -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, **dict(self.headers)})
            body = b"x" * 100_000  # more than one recv: the probe reads the body to the end
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def test_200_is_healthy_and_the_request_carries_path_and_key() -> None:
    seen: list[dict[str, str]] = []
    with _server(200, seen) as port:
        ok, detail = health.get(health.probe_url("0.0.0.0", port, "/health"), 5.0, "sk-1")  # noqa: S104
    assert (ok, detail) == (True, "HTTP 200")
    assert seen[0]["path"] == "/health"
    assert seen[0]["Authorization"] == "Bearer sk-1"
    assert seen[0]["Host"] == f"127.0.0.1:{port}"


def test_503_is_not_healthy() -> None:
    with _server(503, []) as port:
        assert health.get(f"http://127.0.0.1:{port}/health", 5.0) == (False, "HTTP 503")


def test_nothing_listening_and_garbage_are_failures_with_a_reason() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        ok, detail = health.get(f"http://127.0.0.1:{port}/health", 2.0)
    assert not ok
    assert detail.startswith("ConnectionRefusedError")

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"SSH-2.0-not-http\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        ok, detail = health.get(f"http://127.0.0.1:{listener.getsockname()[1]}/h", 5.0)
    finally:
        thread.join(5)
        listener.close()
    assert not ok
    assert detail.startswith("BadStatusLine")


def test_a_server_that_never_answers_times_out() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # accepts (the kernel does), never answers
    try:
        ok, detail = health.get(f"http://127.0.0.1:{listener.getsockname()[1]}/h", 0.2)
    finally:
        listener.close()
    assert not ok
    assert "TimeoutError" in detail or "timed out" in detail


def test_a_server_that_keeps_the_connection_open_is_read_to_its_content_length() -> None:
    """The probe closes once Content-Length bytes came; the server sees that close."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    saw_close: list[bool] = []

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            conn.settimeout(10)  # far past the probe's read; a probe waiting for EOF fails
            try:
                saw_close.append(conn.recv(1) == b"")  # the probe hung up, not the server
            except TimeoutError:
                saw_close.append(False)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        assert health.get(f"http://127.0.0.1:{listener.getsockname()[1]}/h", 60.0) == (
            True, "HTTP 200")
    finally:
        thread.join(65)
        listener.close()
    assert saw_close == [True]
