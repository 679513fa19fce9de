"""The real supervision loop (`Runtime` built directly) with scripted fake children.

The fake child is launched through a small launcher (written per test) that records its
argv, picks the script of its launch number, and runs it with `fakechild.run`; a script may
also wait for a file the test creates (["wait_file", path]) to order itself after the guard.
A tiny HTTP server on 127.0.0.2 answers /health and /health_generate (the guard's
`health.host`), so the port check on 127.0.0.1 sees the port free, as SGLang would leave it.
"""

from __future__ import annotations

import http.server
import io
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_guard.config.guardconfig import HealthSection, RestartSection
from sglang_guard.rules.rules import Matcher
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise import machine
from sglang_guard.supervise.events import SignalReceived
from sglang_guard.supervise.shell.journal import Journal, read_journal
from sglang_guard.supervise.shell.reloader import ReloadOutcome
from sglang_guard.supervise.shell.supervisor import Runtime, Supervisor

from .children import FAKE
from .pack import parsed_pack

HEALTH_HOST = "127.0.0.2"


LAUNCHER = """
import json, os, signal, sys, time
sys.path.insert(0, {fakedir!r})
import fakechild
plans = json.loads(open({plans!r}).read())
with open({record!r}, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
with open({record!r}) as fh:
    n = len(fh.readlines())
script = plans[min(n, len(plans)) - 1]
if ["wait_term"] in script:
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
for step in script:
    if step[0] == "exit":
        sys.exit(int(step[1]))
    if step[0] == "orphan":  # a group member that closed its pipes and ignores SIGTERM
        import subprocess
        gc = [sys.executable, fakechild.__file__, json.dumps(fakechild.GRANDCHILD)]
        kid = subprocess.Popen(gc, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        open(step[1], "w").write(str(kid.pid))
        continue
    if step[0] == "wait_file":
        deadline = time.monotonic() + 30
        while not os.path.exists(step[1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        continue
    fakechild.run([step])
"""


def ready_then_wait() -> list[list[Any]]:
    """A launch that says it is ready, then runs until SIGTERM."""
    return [["print", "stdout", machine.READY_LINE], ["wait_term"], ["exit", 0]]


@dataclass
class Launcher:
    """Writes the launcher; `plans[i]` is the script of launch i+1 (the last one repeats)."""

    tmp: Path
    plans: list[list[list[Any]]]
    record: Path = field(init=False)
    command: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.record = self.tmp / "argv.jsonl"
        plans = self.tmp / "plans.json"
        plans.write_text(json.dumps(self.plans))
        script = self.tmp / "launcher.py"
        script.write_text(LAUNCHER.format(fakedir=str(FAKE.parent), plans=str(plans),
                                          record=str(self.record)))
        self.command = [sys.executable, str(script)]

    def argvs(self) -> list[list[str]]:
        """The SGLang argv of every launch so far."""
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]


class HealthServer:
    """Answers GET /health and /health_generate with settable statuses; counts the hits."""

    def __init__(self) -> None:
        self.status = {"/health": 200, "/health_generate": 200}
        self.hits: dict[str, int] = {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits[self.path] = owner.hits.get(self.path, 0) + 1
                self.send_response(owner.status.get(self.path, 404))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer((HEALTH_HOST, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="health-server")

    def __enter__(self) -> HealthServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `check` (bounded) until it returns something truthy; fail on timeout."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        if value := check():
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        pause.wait(0.02)


def journal_events(state_dir: Path) -> list[dict[str, Any]]:
    """Every record of the journal in `state_dir`."""
    return list(read_journal(state_dir / "journal.jsonl"))


def count(state_dir: Path, event: str) -> int:
    """How many `event` records the journal holds."""
    return sum(1 for r in journal_events(state_dir) if r["event"] == event)


def make_runtime(tmp: Path, launcher: Launcher, *, health: HealthSection | None = None,
                 stdout: Any = None, stderr: Any = None, **restart: Any) -> Runtime:
    """A Runtime that launches the fake child with the test pack and tiny timings."""
    restart = {"max_failures": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.05,
               "stop_grace_s": 2.0, **restart}
    env = machine.Env(
        options=load_option_table(), matcher=Matcher([parsed_pack()]),
        restart=RestartSection(**restart),
        health=health or HealthSection(host=HEALTH_HOST, timeout_s=2.0),
        arch="unknown", sm=None, sglang_version=None, derived_dir=str(tmp / "state" / "derived"),
    )
    return Runtime(launch=launcher.command, state_dir=str(tmp / "state"), env=env,
                   reload=lambda kind, path, env: ReloadOutcome(env, None, None, {
                       "event": "reload.applied", "kind": kind, "restart": False}),
                   stdout=stdout if stdout is not None else io.BytesIO(),
                   stderr=stderr if stderr is not None else io.BytesIO())


def supervise(rt: Runtime, argv: list[str],
              during: Callable[[Supervisor], None] | None = None) -> int:
    """Run the loop on this (the main) thread; `during` runs beside it on a helper thread."""
    journal = Journal.open(rt.state_dir)
    sup = Supervisor(rt, parse_command_line(tuple(argv), rt.env.options), journal)
    helper = None
    errors: list[BaseException] = []
    if during is not None:
        def guarded() -> None:
            try:
                during(sup)
            except BaseException as exc:
                errors.append(exc)
                sup.events.put(SignalReceived(signal.SIGTERM))  # end the run: the test failed

        helper = threading.Thread(target=guarded, name="test-helper")
        helper.start()
    try:
        return sup.run()
    finally:
        journal.close()
        if helper is not None:
            helper.join(30)
        if errors:
            raise errors[0]


def terminate_when(state_dir: Path, event: str, times: int = 1) -> Callable[[Supervisor], None]:
    """A `during` that sends SIGTERM (as an event) once `event` was journaled `times` times."""
    def during(sup: Supervisor) -> None:
        wait_for(lambda: count(state_dir, event) >= times, what=f"{times} x {event}")
        sup.events.put(SignalReceived(signal.SIGTERM))

    return during


def base_argv(port: int, *more: str) -> list[str]:
    """An SGLang argv for the fake child: a model path and the health server's port."""
    return ["--model-path", "/models/fake", "--port", str(port), *more]

