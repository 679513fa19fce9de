"""Is SGLang's HTTP port free? Checked the way the server will bind it. And a free port for an
internal flag (`free_port` fixes), picked the way SGLang picks its own.

SGLang 0.5.23 serves HTTP through `uvicorn.Server(uvicorn.Config(host=..., port=...))`
(srt/entrypoints/http_server.py:2990); uvicorn 0.54 then calls
`loop.create_server(host=..., port=...)` (uvicorn/server.py:182), which binds every address
`getaddrinfo(host)` returns, each with SO_REUSEADDR (asyncio's default on Unix) and
IPV6_V6ONLY on IPv6 sockets. We bind the same way: a port whose old connections sit in
TIME_WAIT is free, one with a live listener is not -- the answer the server gets next.
"""

from __future__ import annotations

import errno
import random
import socket
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

from sglang_guard.errors import InputError

_POLL = 0.1  # the kernel offers no event for "port released": poll, briefly


def port_is_free(host: str, port: int, *, reuse_addr: bool = True) -> bool:
    """True if a listener could bind `host:port` now (SO_REUSEADDR, as uvicorn binds).

    `host` "" is every address (0.0.0.0 and ::, each family on its own); `reuse_addr=False`
    also counts a port whose old connections linger in TIME_WAIT as busy.
    """
    try:
        infos = socket.getaddrinfo(
            host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )
        for family, kind, proto, _, address in infos:
            with socket.socket(family, kind, proto) as sock:
                if reuse_addr:
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


def wait_port_free(host: str, port: int, timeout: float,
                   cancel: threading.Event | None = None) -> bool:
    """Wait up to `timeout` seconds for `host:port` to become free; False if it did not, or
    if `cancel` was set meanwhile."""
    deadline = time.monotonic() + timeout
    stop = cancel if cancel is not None else threading.Event()
    while not port_is_free(host, port):
        left = deadline - time.monotonic()
        if left <= 0 or stop.wait(min(_POLL, left)):
            return False
    return True


# Where a picked port comes from: below the kernel's ephemeral range, as SGLang 0.5.23 picks
# its own --nccl-port (srt/utils/network.py:205, get_free_port_below_ephemeral): the child
# binds it only later, and a port the kernel hands to outgoing connections could be taken
# in between. A port above that range is the fallback, as there.
PICK_LOW, PICK_HIGH, PICK_ATTEMPTS = 22000, 29999, 64
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_low(path: str = EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range (Linux default 32768)."""
    try:
        return int(Path(path).read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    """Free on every address of every family, TIME_WAIT counted as busy: what the TCPStore
    (any address) and SGLang's own port check (srt/utils/network.py:181) need."""
    try:
        return port_is_free("", port, reuse_addr=False)
    except InputError:
        return False


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def pick_free_port(avoid: Collection[int] = (), *, rng: random.Random | None = None,
                   is_free: Callable[[int], bool] = _bindable,
                   kernel_port: Callable[[], int] = _kernel_port,
                   low_ephemeral: int | None = None) -> int:
    """A port that can be bound now on every address, not in `avoid`; OSError if none."""
    rng = rng or random.Random()  # noqa: S311 - a port, not a secret
    high = min(PICK_HIGH, (ephemeral_low() if low_ephemeral is None else low_ephemeral) - 1)
    pool = [p for p in range(PICK_LOW, high + 1) if p not in avoid]
    for port in rng.sample(pool, min(PICK_ATTEMPTS, len(pool))):
        if is_free(port):
            return port
    for _ in range(PICK_ATTEMPTS):
        port = kernel_port()
        if port not in avoid and is_free(port):
            return port
    raise OSError(errno.EADDRINUSE, f"no free port found in {PICK_LOW}-{high} or from the kernel")
