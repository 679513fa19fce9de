"""SHA-256 from CPython's own implementation, not OpenSSL's.

`import hashlib` loads OpenSSL's libcrypto (~3.7 MiB of RSS) for good, in a supervisor that
hashes a few keys at start-up and nothing after: the cache keys and file digests here are
a few KiB, where the built-in implementation is as fast as it needs to be.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol


class Hash(Protocol):
    """What the guard uses of a hash object."""

    def update(self, data: bytes, /) -> None:
        """Feed more bytes."""

    def digest(self) -> bytes:
        """The digest so far."""

    def hexdigest(self) -> str:
        """The digest so far, as hex."""


def _builtin() -> Callable[..., Any]:
    for name in ("_sha2", "_sha256"):  # CPython 3.12+, 3.11
        try:
            return importlib.import_module(name).sha256  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    import hashlib  # noqa: PLC0415 - a CPython built without its own hashes  # pragma: no cover

    return hashlib.sha256  # pragma: no cover


_impl = _builtin()


def sha256(data: bytes = b"") -> Hash:
    """A new SHA-256 hash object, fed `data`."""
    h: Hash = _impl(data)
    return h
