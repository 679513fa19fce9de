"""GET SGLang's health endpoints over a plain socket (loopback, one request at a time).

http.client (and urllib.request) would do as well, but they import email and ssl: ~4 MiB of
the long-lived guard's RSS for a probe that sends one fixed request and reads one status
line. TLS is loaded only for an https:// URL, should one be configured.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

MAX_HEAD = 64 << 10  # bytes of response read before giving up on finding the status line


def probe_url(host: str, port: int, endpoint: str) -> str:
    """The URL to probe: a wildcard bind address is probed on loopback."""
    if host in ("0.0.0.0", ""):  # noqa: S104 - a bind address, mapped to loopback to probe
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}{endpoint}"


def get(url: str, timeout: float, api_key: str | None = None) -> tuple[bool, str]:
    """(200?, detail) for one GET of an http:// (or https://) URL, within `timeout` seconds."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    netloc = f"[{host}]" if ":" in host else host
    lines = [f"GET {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
             f"Host: {netloc}:{port}", "Connection: close", "Accept: */*"]
    if api_key:
        lines.append(f"Authorization: Bearer {api_key}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            sock = raw
            if parts.scheme == "https":
                import ssl  # noqa: PLC0415 - only where the user configured https

                sock = ssl.create_default_context().wrap_socket(raw, server_hostname=host)
            sock.sendall(request)
            return _status(sock, deadline)
    except OSError as exc:
        return False, f"{type(exc).__name__}: {exc}"


def _status(sock: socket.socket, deadline: float) -> tuple[bool, str]:
    """Read the response (to its end, `MAX_HEAD` at most); (status == 200, "HTTP <status>").

    The body is read and dropped, as http.client did: closing with unread data would reset
    the connection under the server's feet. The end is the server's close, or the
    Content-Length the headers give (a server that keeps the connection open regardless).
    """
    head = b""
    while len(head) <= MAX_HEAD and not _complete(head):
        left = deadline - time.monotonic()
        if left <= 0:
            if b"\n" in head:
                break  # the status is in; a body still coming does not change it
            raise TimeoutError("timed out")
        sock.settimeout(left)
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            if b"\n" in head:
                break
            raise
        if not chunk:
            break
        head += chunk
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    fields = line.split(None, 2)
    if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
        what = "no response" if not head else f"not an HTTP status line: {line[:80]!r}"
        return False, f"BadStatusLine: {what}"
    status = int(fields[1])
    return status == 200, f"HTTP {status}"


def _complete(data: bytes) -> bool:
    """Whether `data` holds the headers and as many body bytes as Content-Length says."""
    headers, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in headers.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(body) >= int(value.strip())
    return False  # no length given: the server's close ends it
