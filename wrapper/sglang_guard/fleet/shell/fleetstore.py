"""Where fleet entries live: one small interface, a shared directory or etcd.

`file://DIR`: one file per key, written atomically (a temp file, fsync, rename) under an
flock, mode 0600 in a 0700 directory; a directory or file that others may write is refused
(its permissions are the store's only authentication). An entry older than the TTL is gone.

`etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (`etcds://` for TLS): etcd's v3 API through its
own JSON gateway (grpc-gateway: POST /v3/kv/range, /v3/kv/txn, /v3/kv/deleterange,
/v3/lease/grant, /v3/lease/revoke, /v3/auth/authenticate; keys and values base64) over the standard
library's HTTP(S) client. No maintained Python client exists: python-etcd3 had its last
release in 2020 and needs grpcio and an old protobuf; the gateway is part of every etcd
server since 3.3 and costs no dependency. Every write is a compare-and-swap (`update`) with
a fresh lease of the TTL; with auth on, a user/password token or a client certificate
authenticates the writer.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import random
import ssl
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sglang_guard.common.record import record
from sglang_guard.common.shell.files import read_bytes, write_atomic
from sglang_guard.config.guardconfig import LearnSection
from sglang_guard.errors import InputError
from sglang_guard.fleet.fleet import MAX_ENTRY_BYTES, valid_key

DAY_S = 86400
UPDATE_ATTEMPTS = 8  # etcd: another guard's write in between makes the compare fail; retry
UPDATE_JITTER_S = 0.05  # ... after up to this many seconds times the attempt (worker thread)
Change = Callable[[bytes | None], bytes | None]


class StoreError(Exception):
    """The store could not answer (down, refused, unauthenticated); the guard goes on alone."""


class Store(Protocol):
    """A key -> bytes map shared by the fleet's guards."""

    where: str  # for logs: the store's address, no credentials

    def get(self, key: str) -> bytes | None:
        """The value under `key` (None: none)."""

    def put(self, key: str, value: bytes) -> None:
        """Store `value` under `key` (with the store's TTL)."""

    def update(self, key: str, change: Change) -> bool:
        """Replace the value under `key` by `change(old)` atomically (None: write nothing);
        True when it wrote. `change` may be called again when another writer came first."""

    def delete(self, key: str) -> bool:
        """Remove `key`; False when it was not there."""

    def names(self) -> list[str]:
        """Every key the store holds."""


def _check_key(key: str) -> None:
    if not valid_key(key):
        raise StoreError(f"not a fleet key: {key[:80]!r}")


# -- file:// --------------------------------------------------------------------------------


class FileStore:
    """One file per key in a private directory (a host's own, or an NFS mount)."""

    def __init__(self, directory: str, ttl_s: float) -> None:
        self.dir = Path(directory)
        self.ttl_s = ttl_s
        self.where = f"file://{directory}"

    def _ready(self, create: bool) -> bool:
        """The directory exists and only its owner (this user or root) may write it."""
        if create:
            try:
                self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"{self.dir}: cannot create ({exc.strerror or exc})") from None
        try:
            st = self.dir.stat()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(f"{self.dir}: {exc.strerror or exc}") from None
        _private(self.dir, st)
        return True

    def _path(self, key: str) -> Path:
        _check_key(key)
        return self.dir / f"{key}.json"

    @contextlib.contextmanager
    def _locked(self, kind: int) -> Any:
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, kind)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _read(self, path: Path) -> bytes | None:
        """The file's bytes (the lock held); None when absent or older than the TTL."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        _private(path, st)
        if time.time() - st.st_mtime > self.ttl_s:
            return None
        return read_bytes(path, limit=MAX_ENTRY_BYTES + 1, nofollow=True)

    def _write(self, path: Path, value: bytes) -> None:
        """Temp file, fsync, rename (the lock held): the project's one atomic writer."""
        write_atomic(path, value, 0o600, fsync=True)

    def get(self, key: str) -> bytes | None:
        """The file's bytes; None when absent or older than the TTL."""
        path = self._path(key)
        if not self._ready(create=False):
            return None
        try:
            with self._locked(fcntl.LOCK_SH):
                return self._read(path)
        except OSError as exc:
            raise StoreError(f"{path}: {exc.strerror or exc}") from None

    def put(self, key: str, value: bytes) -> None:
        """Write the file atomically, 0600, under the directory's lock."""
        self.update(key, lambda _old: value)

    def update(self, key: str, change: Change) -> bool:
        """Read, change and write under one exclusive lock."""
        path = self._path(key)
        self._ready(create=True)
        try:
            with self._locked(fcntl.LOCK_EX):
                new = change(self._read(path))
                if new is None:
                    return False
                self._write(path, new)
                return True
        except OSError as exc:
            raise StoreError(f"{path}: {exc.strerror or exc}") from None

    def delete(self, key: str) -> bool:
        """Remove the file."""
        path = self._path(key)
        if not self._ready(create=False):
            return False
        try:
            with self._locked(fcntl.LOCK_EX):
                path.unlink()
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(f"{path}: {exc.strerror or exc}") from None

    def names(self) -> list[str]:
        """Every key with a file (expired ones too: `learned list` shows them)."""
        if not self._ready(create=False):
            return []
        try:
            names = [p.name for p in self.dir.iterdir()]
        except OSError as exc:
            raise StoreError(f"{self.dir}: {exc.strerror or exc}") from None
        return sorted(n[:-5] for n in names if n.endswith(".json") and valid_key(n[:-5]))


def _private(path: Path, st: os.stat_result) -> None:
    """Refuse what another user may have written: the permissions are the authentication."""
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{path}: is a symbolic link")
    if st.st_uid not in (os.geteuid(), 0):
        raise StoreError(f"{path}: owned by uid {st.st_uid}, not this user")
    if st.st_mode & 0o022:
        raise StoreError(f"{path}: writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):o}); chmod go-w it")


# -- etcd:// --------------------------------------------------------------------------------


@record
class EtcdAddress:
    """Where the cluster is and the key prefix the guards share."""

    endpoints: tuple[str, ...]  # base URLs, e.g. https://10.0.0.1:2379
    prefix: str


def parse_store_url(url: str) -> tuple[str, str | EtcdAddress]:
    """("file", DIR) or ("etcd", EtcdAddress); InputError for anything else."""
    if url.startswith("file://"):
        directory = url[len("file://"):]
        if not directory.startswith("/"):
            raise InputError(f"[learn] store {url!r}: file:// needs an absolute path")
        return "file", directory
    for scheme, http in (("etcd://", "http"), ("etcds://", "https")):
        if url.startswith(scheme):
            rest = url[len(scheme):]
            hosts, _, prefix = rest.partition("/")
            endpoints = tuple(f"{http}://{h.strip()}" for h in hosts.split(",") if h.strip())
            if not endpoints or any("@" in e for e in endpoints):
                raise InputError(f"[learn] store {url!r}: expected {scheme}HOST:PORT[,HOST:PORT]"
                                 "/PREFIX (credentials go in [learn] user / password_file)")
            prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/sglang-guard/"
            return "etcd", EtcdAddress(endpoints, prefix)
    raise InputError(f"[learn] store {url!r}: expected file:///DIR or etcd://HOST:PORT/PREFIX")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's range_end for every key that starts with `prefix`."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


class EtcdStore:
    """etcd v3 through its JSON gateway; one request per call, endpoints tried in order."""

    def __init__(self, address: EtcdAddress, *, ttl_s: float, timeout_s: float,
                 user: str | None = None, password: str | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.address = address
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.user, self._password = user, password
        self._ssl = ssl_context
        self._token: str | None = None
        self.where = f"etcd {','.join(address.endpoints)} prefix {address.prefix}"

    def _full(self, key: str) -> bytes:
        _check_key(key)
        return (self.address.prefix + key).encode()

    def _send(self, endpoint: str, path: str, body: dict[str, Any], token: str | None
              ) -> dict[str, Any]:
        req = urllib.request.Request(  # noqa: S310 - http(s) only: parse_store_url builds it
            endpoint + path, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json",
                     **({"Authorization": token} if token else {})})
        with urllib.request.urlopen(req, timeout=self.timeout_s,  # noqa: S310
                                    context=self._ssl) as resp:
            data = json.loads(resp.read(4 * MAX_ENTRY_BYTES * 64))
        if not isinstance(data, dict):
            raise StoreError(f"etcd {path}: unexpected answer")
        return data

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the first endpoint that answers; re-authenticates once on a stale token."""
        errors: list[str] = []
        for endpoint in self.address.endpoints:
            for attempt in range(2):
                try:
                    if self.user is not None and self._token is None:
                        self._token = self._authenticate(endpoint)
                    return self._send(endpoint, path, body, self._token)
                except urllib.error.HTTPError as exc:
                    detail = _error_text(exc)
                    if attempt == 0 and self.user is not None and "token" in detail.lower():
                        self._token = None
                        continue
                    raise StoreError(f"etcd {endpoint}{path}: {exc.code} {detail}") from None
                except (OSError, ValueError) as exc:  # refused, timed out, TLS, bad JSON
                    errors.append(f"{endpoint}: {getattr(exc, 'reason', None) or exc}")
                    break
        raise StoreError("etcd unreachable (" + "; ".join(errors) + ")")

    def _authenticate(self, endpoint: str) -> str:
        answer = self._send(endpoint, "/v3/auth/authenticate",
                            {"name": self.user, "password": self._password or ""}, None)
        token = answer.get("token")
        if not isinstance(token, str):
            raise StoreError("etcd authentication gave no token")
        return token

    def get(self, key: str) -> bytes | None:
        """The value under PREFIX/key."""
        answer = self._call("/v3/kv/range", {"key": _b64(self._full(key))})
        kvs = answer.get("kvs") or []
        if not kvs:
            return None
        raw = base64.b64decode(kvs[0].get("value", ""))
        return raw[:MAX_ENTRY_BYTES + 1]

    def put(self, key: str, value: bytes) -> None:
        """Put with a fresh lease of the TTL (the entry disappears unless rewritten)."""
        self.update(key, lambda _old: value)

    def update(self, key: str, change: Change) -> bool:
        """Compare-and-swap: the put happens only if nobody wrote the key since it was read
        (its mod_revision, or its absence); the old entry's lease is revoked after."""
        full = _b64(self._full(key))
        for attempt in range(UPDATE_ATTEMPTS):
            if attempt:  # spread the writers that lost the last round
                time.sleep(random.uniform(0, UPDATE_JITTER_S * attempt))  # noqa: S311
            kvs = self._call("/v3/kv/range", {"key": full}).get("kvs") or []
            old = base64.b64decode(kvs[0].get("value", ""))[:MAX_ENTRY_BYTES + 1] \
                if kvs else None
            new = change(old)
            if new is None:
                return False
            lease = self._call("/v3/lease/grant", {"TTL": max(1, int(self.ttl_s))}).get("ID")
            if lease is None:
                raise StoreError("etcd lease grant gave no ID")
            compare = ({"key": full, "target": "MOD", "result": "EQUAL",
                        "mod_revision": kvs[0].get("mod_revision", "0")} if kvs else
                       {"key": full, "target": "CREATE", "result": "EQUAL",
                        "create_revision": "0"})
            answer = self._call("/v3/kv/txn", {"compare": [compare], "success": [
                {"request_put": {"key": full, "value": _b64(new), "lease": lease}}]})
            won = bool(answer.get("succeeded"))
            # Won: the old entry's lease is spare (each entry has its own). Lost: ours is.
            stale = (kvs[0].get("lease") if kvs else None) if won else lease
            if stale not in (None, "0"):
                with contextlib.suppress(StoreError):  # it expires at its TTL anyway
                    self._call("/v3/lease/revoke", {"ID": stale})
            if won:
                return True
        raise StoreError(f"etcd: {UPDATE_ATTEMPTS} concurrent writers in a row on {key[:16]}")

    def delete(self, key: str) -> bool:
        """Delete PREFIX/key."""
        answer = self._call("/v3/kv/deleterange", {"key": _b64(self._full(key))})
        return int(answer.get("deleted", 0)) > 0

    def names(self) -> list[str]:
        """Every fleet key under the prefix."""
        prefix = self.address.prefix.encode()
        answer = self._call("/v3/kv/range", {"key": _b64(prefix),
                                             "range_end": _b64(_prefix_end(prefix)),
                                             "keys_only": True})
        out = []
        for kv in answer.get("kvs") or []:
            name = base64.b64decode(kv.get("key", "")).decode(errors="replace")[len(prefix):]
            if valid_key(name):
                out.append(name)
        return sorted(out)


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read(4096))
        return str(body.get("error") or body.get("message") or body)[:200]
    except (ValueError, OSError, AttributeError):
        return str(exc.reason)[:200]


# -- from the guard config --------------------------------------------------------------------


def _secret(path: str | None, what: str) -> str | None:
    if not path:
        return None
    try:
        return read_bytes(path, limit=4096).decode().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"[learn] {what} {path}: cannot read it ({exc})") from None


def _ssl_context(learn: LearnSection) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=learn.ca_file or None)
    if learn.cert_file:
        try:
            ctx.load_cert_chain(learn.cert_file, learn.key_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise InputError(f"[learn] cert_file {learn.cert_file}: {exc}") from None
    return ctx


def open_store(learn: LearnSection) -> Store:
    """The store `[learn]` names; InputError when its address or credentials are unusable."""
    _, where = parse_store_url(learn.store)
    ttl_s = learn.ttl_days * DAY_S
    if isinstance(where, str):
        return FileStore(where, ttl_s)
    tls = any(e.startswith("https://") for e in where.endpoints)
    if (learn.ca_file or learn.cert_file) and not tls:
        raise InputError(f"[learn] store {learn.store!r}: TLS files are set; write etcds://")
    password = _secret(learn.password_file, "password_file")
    return EtcdStore(where, ttl_s=ttl_s, timeout_s=learn.timeout_s, user=learn.user,
                     password=password, ssl_context=_ssl_context(learn) if tls else None)
