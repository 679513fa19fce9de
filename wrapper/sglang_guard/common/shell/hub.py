"""Whether the Hugging Face hub may be asked at all: offline, or unreachable right now.

For the two places that fetch one small file from the hub the way SGLang would at start
(preflight/shell/modelprobe.py: config.json; sglang/shell/servebackend.py: model_index.json).
"""

from __future__ import annotations

import os

_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def offline() -> bool:
    """HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set to a true value (as huggingface_hub reads it)."""
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in _OFFLINE_VARS)


def unreachable(endpoint_url: str, timeout: float = 3.0) -> str | None:
    """None when the hub at `endpoint_url` takes a TCP connection within `timeout`, else its
    host name. One quick connection first: huggingface_hub retries a dead network for ~20 s,
    loudly."""
    import socket  # noqa: PLC0415 - only a hub download needs these
    from urllib.parse import urlsplit  # noqa: PLC0415

    endpoint = urlsplit(endpoint_url)
    host = endpoint.hostname or "huggingface.co"
    try:
        socket.create_connection((host, endpoint.port or 443), timeout=timeout).close()
    except OSError:
        return host
    return None
