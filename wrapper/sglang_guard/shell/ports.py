"""Is SGLang's HTTP port free? Checked the way the server will bind it.

SGLang 0.5.23 serves HTTP through `uvicorn.Server(uvicorn.Config(host=..., port=...))`
(srt/entrypoints/http_server.py:2990); uvicorn 0.54 then calls
`loop.create_server(host=..., port=...)` (uvicorn/server.py:182), which binds every address
`getaddrinfo(host)` returns, each with SO_REUSEADDR (asyncio's default on Unix) and
IPV6_V6ONLY on IPv6 sockets. We bind the same way: a port whose old connections sit in
TIME_WAIT is free, one with a live listener is not -- the answer the server gets next.
"""

from __future__ import annotations

import errno
import socket
import time

from sglang_guard.errors import InputError

_POLL = 0.1  # the kernel offers no event for "port released": poll, briefly


def port_is_free(host: str, port: int) -> bool:
    """True if a listener could bind `host:port` now (SO_REUSEADDR, as uvicorn binds)."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )
        for family, kind, proto, _, address in infos:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return False
        # Not a busy port but a bad address (not local, unresolvable, privileged):
        # waiting would not help, and SGLang would fail the same way.
        raise InputError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from exc
    return True


def wait_port_free(host: str, port: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for `host:port` to become free; False if it did not."""
    deadline = time.monotonic() + timeout
    while not port_is_free(host, port):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(_POLL, left))
    return True
