"""GET SGLang's health endpoints over plain http.client (loopback, one request at a time).

urllib.request would do as well but costs the long-lived guard about a MiB of imports
(email, ssl helpers) for nothing it needs here.
"""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit


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
    """(200?, detail) for one GET of an http:// URL."""
    parts = urlsplit(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.request("GET", parts.path or "/", headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200, f"HTTP {resp.status}"
    except (OSError, http.client.HTTPException) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
