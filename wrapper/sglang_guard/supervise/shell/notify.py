"""systemd's sd_notify protocol: a datagram to $NOTIFY_SOCKET; a no-op without it.

Abstract sockets (a name starting with `@`) are supported, as gunicorn's systemd.py does.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends READY=1 / STATUS= / WATCHDOG=1 / RELOADING=1 to systemd."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        """True when running under systemd with Type=notify."""
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        """Send `KEY=value` fields as one message; False when it could not be delivered."""
        if not self.address or not fields:
            return False
        addr = self.address
        target = "\0" + addr[1:] if addr.startswith("@") else addr
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(fields).encode(), target)
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
