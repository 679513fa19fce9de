"""A NOTIFY_SOCKET of the test's own: what the guard tells systemd, with arrival times."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path


class Listener:
    """A NOTIFY_SOCKET: collects every datagram with the time it arrived."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def fields(self) -> list[str]:
        """Every KEY=value field received so far."""
        return [f for _, m in self.messages for f in m.split("\n")]

    def close(self) -> None:
        """Stop listening."""
        self._stop.set()
        self._thread.join()
        self.sock.close()

