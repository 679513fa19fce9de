"""GET SGLang's health endpoints (no third-party HTTP client: urllib is enough on loopback)."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request


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
    """(200?, detail) for one GET."""
    request = urllib.request.Request(url)  # noqa: S310 - an http:// URL we built
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310
            return resp.status == 200, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        return False, f"{type(exc).__name__}: {exc}"
