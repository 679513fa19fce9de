"""What a running guard has imported: no asyncio, no OpenSSL, no http.server, status port on or off.

The guard runs as a process (the fake child as `[sglang] launch`, the full default pack); an
atexit hook writes its sys.modules when SIGTERM has stopped it. Waits are bounded polls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from sglang_guard.supervise.machine import READY_LINE
from support.harness import wait_for
from support.procs import free_port

FAKE = Path(__file__).resolve().parent.parent / "fakechild.py"
WRAPPER = """
import atexit, json, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "sglang-guard"
runpy.run_module("sglang_guard", run_name="__main__")
"""
OPENSSL = ("ssl", "_ssl", "_hashlib", "hashlib", "hmac")


def _run_guard(tmp: Path, status: str) -> list[str]:
    script = [["print", "stdout", READY_LINE], ["pause"]]
    lines = ["[sglang]", f"launch = {json.dumps([sys.executable, str(FAKE), json.dumps(script)])}",
             "[health]", "enabled = false", "[gpu]", 'sm = "none"', "[log]", 'format = "json"',
             "[status]", f"listen = {json.dumps(status)}"]
    cfg = tmp / "guard.toml"
    cfg.write_text("\n".join(lines) + "\n")
    modules, out = tmp / "modules.json", tmp / "out.log"
    env = {**os.environ, "SGLANG_GUARD_CACHE": str(tmp / "cache")}
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRAPPER, str(modules), "run", "--config", str(cfg),
             "--state-dir", str(tmp / "state"), "--no-preflight", "--",
             "--model-path", "/models/x", "--port", str(free_port())],
            stdout=sink, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        wait_for(lambda: READY_LINE.encode() in out.read_bytes(), 60)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert modules.exists(), err.decode(errors="replace")[-2000:]
    found: list[str] = json.loads(modules.read_text())
    return found


def test_status_port_off_no_asyncio_no_openssl(tmp_path: Path) -> None:
    found = set(_run_guard(tmp_path, "off"))
    assert "sglang_guard.supervise.shell.supervisor" in found  # it did run
    assert "hyperscan" in found
    assert not found & {"asyncio", "structlog", *OPENSSL, "http.client", "http.server"}
    # the compiled scan was saved for the next start
    assert list((tmp_path / "cache" / "hyperscan").glob("*.hsdb"))


def test_status_port_on_still_no_asyncio_no_openssl_no_http_server(tmp_path: Path) -> None:
    found = set(_run_guard(tmp_path, f"127.0.0.1:{free_port()}"))
    assert "sglang_guard.status.shell.statusserver" in found
    assert "prometheus_client.metrics" in found  # the metrics are served
    assert not found & {"asyncio", "structlog", *OPENSSL, "http.client", "http.server", "email",
                        "urllib.request", "wsgiref", "prometheus_client.exposition"}
