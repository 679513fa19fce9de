"""The status port without prometheus-client's exposition module or http.server (issue 24).

`status/shell/metrics.py` imports only prometheus-client's metric classes, registry and process
collector, and writes the text format itself; `status/shell/statusserver.py` speaks its HTTP on
socketserver. Here, in fresh interpreters: the status-on run path serves /metrics, /status
and /readyz with none of ssl, http.client, http.server, email, urllib.request, wsgiref or
asyncio imported; its text format is byte for byte what prometheus-client's own
`generate_latest` writes for the same registry; and where the light import does not fit the
installed package, the normal import takes over with the same output.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("prometheus_client")

HEAVY = ("ssl", "_ssl", "http.client", "http.server", "email", "urllib.request", "wsgiref",
         "asyncio", "prometheus_client.exposition", "hashlib", "hmac")

SERVE = r"""
import json, re, socket, sys
PATCH
import sglang_guard.supervise.shell.runner, sglang_guard.supervise.shell.session  # the run path
from sglang_guard.status.status import Counts
from sglang_guard.status.shell.status import StatusBoard
from sglang_guard.status.shell.statusserver import StatusServer

board = StatusBoard(metrics=True)
m = board.metrics
m.known_remediations([("log", 'odd "rule" \\ with\nnewline', "--attention-backend", "drop_flag"),
                      ("preflight", "r2", "--kv-cache-dtype", "set_flag")])
m.count(Counts(launch="first", remediation=("log", "r3", "--page-size", "drop_flag"),
               time_to_ready=42.5))
m.count(Counts(restart="crash", give_up="repeat"))
m.build("0.5.23")
light = sys.modules["prometheus_client.metrics"]  # the kinds the guard may add one day
light.Info("extra", "an info", registry=m.registry).info({"k": "v\\"})
light.Enum("state", "an enum", states=["a", "b"], registry=m.registry).state("b")
server = StatusServer(board, "127.0.0.1", 0)
answers = {}
for method, path in (("GET", "/metrics"), ("GET", "/status"), ("HEAD", "/readyz"),
                     ("GET", "/nope"), ("POST", "/metrics"), ("GET", "/livez?x=1 HTTP/9")):
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    answers[f"{method} {path}"] = [head.split(b" ")[1].decode(), body.decode()]
server.close()
heavy = sorted(set(sys.argv[1].split(",")) & set(sys.modules))
bare_left = "prometheus_client" in sys.modules
import prometheus_client  # the real package, over the modules already loaded
norm = lambda t: re.sub(r"(?m)^(process_\w+|sglang_guard_phase_seconds) .*$", r"\1 N", t)
ours = norm(m.exposition().decode())
theirs = norm(prometheus_client.generate_latest(m.registry).decode())
print(json.dumps({"heavy": heavy, "bare_left": bare_left, "answers": answers,
                  "same": ours == theirs, "ours": ours}))
"""


def _serve(patch: str = "") -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", SERVE.replace("PATCH", patch), ",".join(HEAVY)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, object] = json.loads(done.stdout)
    return out


def test_status_on_path_serves_without_heavy_modules_and_writes_the_same_text() -> None:
    out = _serve()
    assert out["heavy"] == []
    assert out["bare_left"] is False  # the bare package left sys.modules again
    answers = out["answers"]
    assert isinstance(answers, dict)
    code, text = answers["GET /metrics"]
    assert code == "200"
    assert 'sglang_guard_remediations_total{action="drop_flag",flag="--attention-backend",' \
           'rule="odd \\"rule\\" \\\\ with\\nnewline",trigger="log"} 0.0' in text
    assert "sglang_guard_time_to_ready_seconds_bucket" in text and "process_open_fds" in text
    assert out["same"] is True, out["ours"]
    ours = str(out["ours"])
    assert 'extra_info{k="v\\\\"} 1.0' in ours and 'state{state="b"} 1.0' in ours
    code, text = answers["GET /status"]
    assert code == "200" and "phase" in json.loads(text)
    assert answers["HEAD /readyz"] == ["503", ""]  # not ready: HEAD answers like GET, no body
    assert answers["GET /nope"][0] == "404"
    assert answers["POST /metrics"][0] == "501"
    assert answers["GET /livez?x=1 HTTP/9"][0] == "400"  # four words: not a request line


def test_a_package_layout_the_light_import_does_not_fit_falls_back_to_the_normal_one() -> None:
    # A bare module that is no package: importing prometheus_client.metrics under it fails.
    patch = ("import importlib.util, types\n"
             "importlib.util.module_from_spec = lambda spec: types.ModuleType(spec.name)\n")
    out = _serve(patch)
    assert "prometheus_client.exposition" in out["heavy"]  # the normal import ran
    assert out["same"] is True
    answers = out["answers"]
    assert isinstance(answers, dict)
    assert answers["GET /metrics"][0] == "200"
