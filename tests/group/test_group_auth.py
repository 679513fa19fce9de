"""Issue 22, item 1: the group port answers only guards that prove the group's secret.

Real guards, one per simulated node, real HTTP; the test plays the attacker on the leader's
group port (forged beats, reports, joins; replays; huge and hostile bodies) and a fake
leader that does not know the secret.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sglang_guard.errors import EXIT_LEADER_LOST, EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from sglang_guard.group import groupauth as auth
from sglang_guard.group.group import encode
from support.group import OOM_LINE, Group, leader_plan, worker_plan
from support.harness import wait_for

API_KEY = "grp-api-key-5f1c9a7e3d"  # a value no message or file of the group may hold
KERNEL_LINE = ("ImportError: /usr/lib/python3/site-packages/sgl_kernel/common_ops.so: "
               "undefined symbol: _ZN3c104cuda9SetDeviceEi")


def raw_post(port: int, path: str, payload: bytes, headers: dict[str, str],
             *, send_body: bool = True) -> tuple[int, bytes, dict[str, str]]:
    """One POST to the leader's group port as any peer could send it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("POST", path)
        for key, value in headers.items():
            conn.putheader(key, value)
        conn.endheaders()
        if send_body:
            conn.send(payload)
        resp = conn.getresponse()
        return resp.status, resp.read(), dict(resp.headers)
    finally:
        conn.close()


def post(port: int, path: str, body: Any, secret: str | None = None, *,
         now: float | None = None, nonce: str | None = None) -> tuple[int, bytes, dict[str, str]]:
    """A JSON POST, signed with `secret` when given."""
    payload = body if isinstance(body, bytes) else encode(body)
    headers = {"Content-Type": "application/json", "Content-Length": str(len(payload))}
    if secret is not None:
        headers.update(auth.request_headers(secret.encode(), path, payload,
                                            time.time() if now is None else now,
                                            nonce or os.urandom(16).hex()))
    return raw_post(port, path, payload, headers)


def running_pair(g: Group, *more: str) -> tuple[Any, Any]:
    leader = g.node(0, [leader_plan(), leader_plan()])
    w1 = g.node(1, [worker_plan(), worker_plan()])
    for node in (leader, w1):
        g.start(node, *more)
    w1.wait_event("ready")
    return leader, w1


def stop(*nodes: Any) -> list[tuple[int, str]]:
    nodes[0].proc.send_signal(signal.SIGTERM)
    return [n.finish() for n in nodes]


def test_forged_beats_reports_and_joins_change_nothing(group: Any) -> None:
    g: Group = group(2)
    leader, w1 = running_pair(g)
    report = {"rank": 1, "gen": 1, "reports": [
        {"kind": "line", "gen": 1, "text": OOM_LINE}, {"kind": "line", "gen": 1,
                                                        "text": KERNEL_LINE},
        {"kind": "exit", "gen": 1, "returncode": 1}]}
    # No authentication at all, and a wrong secret: 401, and not a word of the launch.
    for secret in (None, "not-the-group-secret-at-all"):
        for path, body in (("/group/beat", report), ("/group/beat", {"rank": 1}),
                           ("/group/join", {"rank": 1, "digest": {"flags": {}}})):
            status, answer, _ = post(g.port, path, body, secret)
            assert status == 401, (path, answer)
            assert b"--model-path" not in answer and b"argv" not in answer
    # A genuine guard's request, replayed: 403; one signed two minutes ago: 403.
    beat = {"rank": 1, "gen": 0, "reports": []}
    nonce = os.urandom(16).hex()
    first = post(g.port, "/group/beat", beat, g.secret, nonce=nonce)
    assert first[0] == 200
    tampered = encode(report)  # a genuine request's MAC on another body: 401
    headers = auth.request_headers(g.secret.encode(), "/group/beat", encode(beat), time.time(),
                                   os.urandom(16).hex())
    assert raw_post(g.port, "/group/beat", tampered,
                    {**headers, "Content-Length": str(len(tampered))})[0] == 401
    assert post(g.port, "/group/beat", beat, g.secret, nonce=nonce)[0] == 403
    stale = post(g.port, "/group/beat", report, g.secret, now=time.time() - 120)
    assert stale[0] == 403 and b"stale" in stale[1]

    rejected = leader.wait_event("group.rejected")
    assert {r["status"] for r in rejected} >= {401, 403}
    # Nothing changed: no fix, no node down, no relaunch, no exit 69 for anyone.
    time.sleep(1.0)  # several of the group's heartbeats (0.2 s): a forged report would act
    for name in ("remediated", "group.node_down", "crash.detected", "group.relaunch"):
        assert not leader.events(name) and not w1.events(name), name
    assert len(leader.launcher.argvs()) == len(w1.launcher.argvs()) == 1
    (code0, err0), (code1, err1) = stop(leader, w1)
    assert (code0, code1) == (EXIT_OK, EXIT_OK), (err0, err1)
    assert "Traceback" not in err0 and "group.rejected" not in err0  # journaled, not printed


def test_hostile_bodies_are_refused_and_journaled_never_printed(group: Any) -> None:
    g: Group = group(2)
    leader, w1 = running_pair(g)
    # 256 MiB announced and never sent: refused at the header, before a byte of the body is
    # read (a server that waited for the body would leave the client to time out).
    status, answer, _ = raw_post(g.port, "/group/beat", b"", {
        "Content-Length": str(256 << 20)}, send_body=False)
    assert status == 413, answer
    for length in ("-1", "abc", "1e9", ""):
        status, _, _ = raw_post(g.port, "/group/beat", b"", {"Content-Length": length},
                                send_body=False)
        assert status == 400, length
    # Authenticated but hostile: non-finite numbers, deep nesting, wrong types.
    for body in (b'{"rank": 1e400}', b'{"rank": NaN}', b'{"rank": 1, "reports": ' +
                 b"[" * 5000 + b"]" * 5000 + b"}", b'{"rank": "1"}', b'{"rank": true}',
                 b"[1, 2]", b'{"rank": 1, "reports": [1]}', b"\xff\xfe"):
        for path in ("/group/beat", "/group/join"):
            status, answer, _ = post(g.port, path, body, g.secret)
            assert status == 400, (path, body[:40], answer)
    for body in (b'{"rank": 1, "digest": {"flags": 3}}', b'{"rank": 1, "digest": [1]}'):
        status, answer, _ = post(g.port, "/group/join", body, g.secret)
        assert status == 400, (body, answer)
    assert leader.wait_event("group.rejected")
    assert not leader.events("remediated")
    (code0, err0), (code1, _) = stop(leader, w1)
    assert (code0, code1) == (EXIT_OK, EXIT_OK)
    assert "Traceback" not in err0 and "Error" not in err0, err0


class FakeLeader(http.server.ThreadingHTTPServer):
    """Answers every join with another launch (another model, remote code, no API key)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int) -> None:
        self.hits = 0

        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.hits += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                launch = {"argv": ["--model-path", "/evil", "--trust-remote-code",
                                   "--nnodes", "2", "--node-rank", "0"],
                          "yaml_data": None, "derived_dir": ""}
                body = encode({"gen": 1, "ready": True, "exit": None, "launch": launch,
                               "cause": None})
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                # a MAC of its own making: it cannot know the group's secret
                self.send_header(auth.H_TIME, f"{time.time():.3f}")
                self.send_header(auth.H_MAC, "0" * 64)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", port), Handler)


@pytest.fixture
def fake_leader(group: Any) -> Iterator[tuple[Group, FakeLeader]]:
    g: Group = group(2)
    g.settings["join_timeout_s"] = 2.0
    server = FakeLeader(g.port)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield g, server
    server.shutdown()
    server.server_close()


def test_a_worker_follows_no_leader_that_cannot_prove_the_secret(
        fake_leader: tuple[Group, FakeLeader]) -> None:
    g, server = fake_leader
    w1 = g.start(g.node(1, [worker_plan()]))
    code, err = w1.finish()
    assert code == EXIT_LEADER_LOST, err
    assert "proves the group secret" in err
    assert server.hits >= 1
    assert w1.launcher.argvs() == []  # nothing of the fake leader's launch ran


def test_no_secret_in_any_group_answer_or_file(group: Any) -> None:
    g: Group = group(2)
    leader = g.node(0, [leader_plan(), leader_plan()])
    w1 = g.node(1, [worker_plan(["print", "stderr", OOM_LINE]), worker_plan()])
    for node in (leader, w1):
        g.start(node, "--api-key", API_KEY)
    # The fix for the worker's line reaches ready: the leader keeps what it learned.
    wait_for(lambda: any(r["gen"] == 2 for r in leader.events("ready")), what="gen 2 ready")
    wait_for(lambda: len(w1.launcher.argvs()) >= 2, what="worker 1 relaunched")
    learned = leader.state / "group-learned.json"
    wait_for(learned.is_file, what="group-learned.json")
    assert stat.S_IMODE(learned.stat().st_mode) == 0o600
    # A genuine guard's join and beat (signed): the launch comes with the key masked.
    for path, body in (("/group/beat", {"rank": 1, "gen": 2, "reports": []}),):
        status, answer, _ = post(g.port, path, body, g.secret)
        assert status == 200
        assert API_KEY.encode() not in answer
        launch = json.loads(answer)["launch"]
        assert launch["argv"][launch["argv"].index("--api-key") + 1] == "***"
    # Each worker launched with its own key, filled in from its own command line.
    for argv in w1.launcher.argvs():
        assert argv[argv.index("--api-key") + 1] == API_KEY
    stop(leader, w1)
    for node in (leader, w1):
        for path in node.state.rglob("*"):
            if path.is_file():
                assert API_KEY.encode() not in path.read_bytes(), path
    # The learned command line replays with the leader's own key put back.
    for node in (leader, w1):
        g.start(node, "--api-key", API_KEY)
    leader.wait_event("learned.replayed")
    wait_for(lambda: len(leader.launcher.argvs()) >= 3, what="leader's third launch")
    third = leader.launcher.argvs()[2]
    assert third[third.index("--api-key") + 1] == API_KEY
    assert third[third.index("--mem-fraction-static") + 1] == "0.81"
    stop(leader, w1)


def test_a_tampered_learned_file_is_not_replayed(group: Any) -> None:
    g: Group = group(2)
    leader = g.node(0, [leader_plan(), leader_plan()])
    w1 = g.node(1, [worker_plan(["print", "stderr", OOM_LINE]), worker_plan()])
    for node in (leader, w1):
        g.start(node)
    learned = leader.state / "group-learned.json"
    wait_for(learned.is_file, what="group-learned.json")
    stop(leader, w1)
    data = json.loads(learned.read_text())
    data["argv"] += ["--trust-remote-code"]  # a flag no rule may set
    learned.write_text(json.dumps(data))
    for node in (leader, w1):
        g.start(node)
    refused = leader.wait_event("learned.refused")[0]
    assert "--trust-remote-code" in refused["reason"] and "deny list" in refused["reason"]
    wait_for(lambda: len(leader.launcher.argvs()) >= 3, what="leader's third launch")
    assert "--trust-remote-code" not in leader.launcher.argvs()[2]
    assert not leader.events("learned.replayed")
    stop(leader, w1)


def test_a_worker_with_other_rule_packs_is_refused(group: Any) -> None:
    g: Group = group(2)
    leader = g.start(g.node(0, [leader_plan()]))
    w1 = g.node(1, [worker_plan()])
    text = (w1.root / "guard.toml").read_text()
    (w1.root / "guard.toml").write_text(text.replace("[restart]", "[rules]\ndefault_pack = "
                                                     "false\n[restart]"))
    leader.wait_event("child.start")
    code, err = g.start(w1).finish()
    assert code == EXIT_REFUSED, err
    assert "rule packs" in err
    stop(leader)


def test_a_group_without_a_secret_refuses_to_start_unless_insecure(group: Any) -> None:
    g: Group = group(2)
    leader = g.node(0, [leader_plan()])
    toml = leader.root / "guard.toml"
    text = toml.read_text()
    secret_line = next(ln for ln in text.splitlines() if ln.startswith("secret_file"))
    toml.write_text(text.replace(secret_line + "\n", ""))
    code, err = g.start(leader).finish()
    assert code == EXIT_USAGE, err
    assert "secret_file" in err.strip().splitlines()[-1] and "Traceback" not in err
    assert leader.launcher.argvs() == []
    # A secret file too short to be a secret: exit 2 too.
    (leader.root / "group.secret").write_text("short\n")
    toml.write_text(text)
    code, err = g.start(leader).finish()
    assert code == EXIT_USAGE and "at least 16" in err, err
    # insecure = true, said explicitly: it runs (the port binds to the leader host only).
    toml.write_text(text.replace(secret_line, "insecure = true"))
    g.start(leader)
    started = leader.wait_event("child.start")
    assert started
    with socket.create_connection(("127.0.0.1", g.port), timeout=5):
        pass
    stop(leader)


def test_idle_connections_on_the_group_port_do_not_shut_the_workers_out(group: Any) -> None:
    g: Group = group(2)
    leader, w1 = running_pair(g)
    idle = [socket.create_connection(("127.0.0.1", g.port), timeout=5) for _ in range(300)]
    try:
        status, _, _ = post(g.port, "/group/beat", {"rank": 1, "gen": 0, "reports": []},
                            g.secret)
        assert status == 200
        time.sleep(1.0)  # five of the worker's heartbeats: it must not lose its leader
        assert not w1.events("group.exit") and w1.proc.poll() is None  # type: ignore[union-attr]
    finally:
        for sock in idle:
            sock.close()
    (code0, err0), (code1, err1) = stop(leader, w1)
    assert (code0, code1) == (EXIT_OK, EXIT_OK), (err0, err1)
