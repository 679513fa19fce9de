"""A real etcd server for tests: Debian's `etcd-server` binary on free loopback ports.

`EtcdServer(tmp).start()` runs `etcd` with its data in `tmp`, waits (bounded, on its
/health answer) until it serves, and `stop()` ends it by its pid. `enable_auth` adds a
root user with a password through the v3 JSON gateway and turns authentication on.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .procs import free_port

ETCD = shutil.which("etcd")
if ETCD is None and os.environ.get("CI"):
    # CI installs etcd-server (.ci/run): a missing binary there is a broken setup, not a skip.
    raise RuntimeError("CI=true but no etcd binary on PATH: .ci/run installs etcd-server")


class EtcdServer:
    """One etcd member on 127.0.0.1."""

    def __init__(self, tmp: Path, tls: Path | None = None) -> None:
        self.tmp = tmp
        self.tls = tls  # a directory from make_certs: serve HTTPS, require client certs
        self.client_port = free_port()
        self.peer_port = free_port()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.client_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / "etcd.log"

    def start(self, timeout: float = 30.0) -> EtcdServer:
        """Run etcd and wait until it answers /health."""
        assert ETCD, "etcd is not installed (apt-get install etcd-server)"
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [ETCD, "--name", "t", "--data-dir", str(self.tmp / "etcd-data"),
               "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"t={peer}", "--log-level", "error"]
        if self.tls is not None:
            cmd += ["--cert-file", str(self.tls / "server.pem"),
                    "--key-file", str(self.tls / "server-key.pem"),
                    "--trusted-ca-file", str(self.tls / "ca.pem"), "--client-cert-auth"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        pause = threading.Event()
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"etcd did not start: {self.log.read_text()[-2000:]}")
            pause.wait(0.05)
        return self

    def _healthy(self) -> bool:
        ctx = None
        if self.tls is not None:
            ctx = ssl.create_default_context(cafile=str(self.tls / "ca.pem"))
            ctx.load_cert_chain(str(self.tls / "client.pem"), str(self.tls / "client-key.pem"))
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1, context=ctx) as resp:
                return bool(json.loads(resp.read()).get("health") in ("true", True))
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        """SIGKILL etcd (a crashed store, as the guard sees it) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(30)

    def call(self, path: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
        """POST to the v3 JSON gateway."""
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", **({"Authorization": token}
                                                              if token else {})})
        with urllib.request.urlopen(req, timeout=5) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data

    def enable_auth(self, password: str) -> None:
        """A root user with `password`, and authentication on."""
        self.call("/v3/auth/user/add", {"name": "root", "password": password})
        self.call("/v3/auth/user/grant", {"user": "root", "role": "root"})
        self.call("/v3/auth/enable", {})

    def raw_put(self, key: str, value: bytes, token: str | None = None) -> None:
        """Put a value directly (a poisoned entry, as a writer with access would)."""
        self.call("/v3/kv/put", {"key": base64.b64encode(key.encode()).decode(),
                                 "value": base64.b64encode(value).decode()}, token)

    def token(self, password: str) -> str:
        """root's auth token."""
        return str(self.call("/v3/auth/authenticate", {"name": "root",
                                                        "password": password})["token"])


def make_certs(directory: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (openssl)."""
    directory.mkdir(parents=True, exist_ok=True)

    def ssl_(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ssl_("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
         "-keyout", "ca-key.pem", "-out", "ca.pem")
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "root")):
        ssl_("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
             "-keyout", f"{name}-key.pem", "-out", f"{name}.csr")
        ssl_("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
             *(["-extfile", "san.cnf"] if name == "server" else []))
    return directory
