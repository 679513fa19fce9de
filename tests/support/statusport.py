"""The guard's status port as a client sees it."""

from __future__ import annotations

import http.client


def get(address: tuple[str, int], path: str) -> tuple[int, bytes]:
    """One GET on the status port."""
    conn = http.client.HTTPConnection(address[0], address[1], timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()
