"""The real supervision loop (`Runtime` built directly) with scripted fake children.

The fake child is launched through a small launcher (written per test) that records its
argv, picks the script of its launch number, and runs it with `fakechild.run`; a script may
also wait for a file the test creates (["wait_file", path]) to order itself after the guard.
A tiny HTTP server on 127.0.0.2 answers /health and /health_generate (the guard's
`health.host`), so the port check on 127.0.0.1 sees the port free, as SGLang would leave it.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from procutil import free_port
from sglang_guard.core import machine
from sglang_guard.core.argv import parse_command_line
from sglang_guard.core.events import SignalReceived
from sglang_guard.core.guardconfig import HealthSection, RestartSection
from sglang_guard.core.options import load_option_table
from sglang_guard.core.rules import Matcher, parse_pack
from sglang_guard.errors import EXIT_GIVE_UP, EXIT_OK
from sglang_guard.shell.journal import Journal, read_journal
from sglang_guard.shell.reloader import ReloadOutcome
from sglang_guard.shell.supervisor import Runtime, Supervisor, run_supervisor

from .conftest import FAKE, HashSink, wait_gone

HEALTH_HOST = "127.0.0.2"
FA3_LINE = "ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90."
CRASH_LINE = ("[2026-11-29 16:50:00 TP0] Scheduler hit an exception: "
              "Traceback (most recent call last):")
DRAFT_LINE = "ValueError: draft backend needs MLA"
GIVE_UP_LINE = "ERROR: [Errno 98] error while attempting to bind: address already in use"
PACK_TEXT = """
[pack]
name = "test"
sglang_versions = ">=0.5.23"

[[rules]]
id = "fa3-sm"
pattern = 'FlashAttention v3 Backend requires SM>=80'
action = "drop_flag"
flags = ["--attention-backend"]
values = ["fa3"]
reason = "fa3 needs SM80-90"
phase = "any"

[[rules]]
id = "draft-triton"
pattern = 'draft backend needs MLA'
action = "set_flag"
flags = ["--speculative-draft-attention-backend"]
new_value = "triton"
phase = "any"

[[rules]]
id = "port-busy"
pattern = '\\[Errno 98\\] .*address already in use'
action = "give_up"
reason = "the port is taken"

[[rules]]
id = "crash"
pattern = 'Scheduler hit an exception: '
action = "restart"
max_fires = 9
priority = -10
"""

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
        options=load_option_table(), matcher=Matcher([parse_pack(PACK_TEXT, "test.toml")]),
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


@pytest.fixture
def server() -> Iterator[HealthServer]:
    """The HTTP health endpoints the guard probes."""
    with HealthServer() as srv:
        yield srv


def base_argv(port: int, *more: str) -> list[str]:
    """An SGLang argv for the fake child: a model path and the health server's port."""
    return ["--model-path", "/models/fake", "--port", str(port), *more]


# --- the tests ---------------------------------------------------------------------------------


def test_fatal_line_drops_the_flag_and_the_next_launch_reaches_ready(
        tmp_path: Path, server: HealthServer) -> None:
    launcher = Launcher(tmp_path, [
        [["print", "stderr", FA3_LINE], ["exit", 1]],
        ready_then_wait(),
    ])
    rt = make_runtime(tmp_path, launcher)
    argv = base_argv(server.port, "--attention-backend", "fa3")
    code = supervise(rt, argv, terminate_when(tmp_path / "state", "ready"))
    assert code == EXIT_OK
    first, second = launcher.argvs()
    assert first == argv
    assert second == base_argv(server.port)
    assert server.hits.get("/health", 0) >= 1
    events = [r["event"] for r in journal_events(tmp_path / "state")]
    assert events.count("child.start") == 2
    assert "backoff" not in events  # a fix is not a crash
    assert events[-1] == "guard.exit"


def test_crash_loop_gives_up_with_75_in_bounded_time(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [[["print", "stderr", "boom"], ["exit", 3]]])
    rt = make_runtime(tmp_path, launcher, max_failures=3, window_s=60.0)
    started = time.monotonic()
    code = supervise(rt, base_argv(free_port()))
    assert code == EXIT_GIVE_UP
    assert time.monotonic() - started < 15
    assert len(launcher.argvs()) == 3
    records = journal_events(tmp_path / "state")
    assert [r["returncode"] for r in records if r["event"] == "child.exit"] == [3, 3, 3]
    assert [r["event"] for r in records].count("backoff") == 2
    give_up = next(r for r in records if r["event"] == "give_up")
    assert "crash loop: 3 failures" in give_up["reason"]


def test_huge_line_and_binary_output_pass_through_and_matching_goes_on(tmp_path: Path) -> None:
    size = 100 * (1 << 20)
    blob = random.Random(7).randbytes(1 << 20)  # noqa: S311 - test data, as fakechild makes it
    launcher = Launcher(tmp_path, [[
        ["fill", "stdout", size, "x"], ["hex", "stdout", "0a"],
        ["random", "stderr", 1 << 20, 7], ["hex", "stderr", "00ff1b5b306d0a"],
        ["print", "stderr", GIVE_UP_LINE], ["wait_term"], ["exit", 0],
    ]])
    out, err = HashSink(), io.BytesIO()
    rt = make_runtime(tmp_path, launcher, stdout=out, stderr=err)
    code = supervise(rt, base_argv(free_port()))
    assert code == EXIT_GIVE_UP
    want = hashlib.sha256()
    for _ in range(100):
        want.update(b"x" * (1 << 20))
    want.update(b"\n")
    assert (out.size, out.sha.hexdigest()) == (size + 1, want.hexdigest())
    assert err.getvalue() == blob + bytes.fromhex("00ff1b5b306d0a") + GIVE_UP_LINE.encode() + b"\n"
    planned = [r for r in journal_events(tmp_path / "state") if r["event"] == "give_up.planned"]
    assert [r["rule"] for r in planned] == ["port-busy"]


def test_catch_all_waits_and_the_specific_line_of_the_crash_wins(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [
        [["print", "stderr", CRASH_LINE], ["print", "stderr", "  File x.py"],
         ["print", "stderr", FA3_LINE], ["wait_term"], ["exit", 1]],
        [["exit", 1]],
    ])
    rt = make_runtime(tmp_path, launcher)
    code = supervise(rt, base_argv(free_port(), "--attention-backend", "fa3"))
    assert code == EXIT_GIVE_UP  # launch 2 just exits: max_failures = 1
    assert "fa3" not in launcher.argvs()[1]
    records = journal_events(tmp_path / "state")
    assert [r["rule"] for r in records if r["event"] == "remediated"] == ["fa3-sm"]
    assert not any(r["event"] == "crash.detected" for r in records)


def test_liveness_failures_after_ready_restart_the_child(
        tmp_path: Path, server: HealthServer) -> None:
    server.status["/health_generate"] = 503
    launcher = Launcher(tmp_path, [ready_then_wait()])
    health = HealthSection(host=HEALTH_HOST, timeout_s=2.0, liveness_interval_s=0.05,
                           liveness_failures=2)
    rt = make_runtime(tmp_path, launcher, health=health, max_failures=2)
    code = supervise(rt, base_argv(server.port))
    assert code == EXIT_GIVE_UP
    records = journal_events(tmp_path / "state")
    events = [r["event"] for r in records]
    assert events.count("ready") == 2
    assert [r["streak"] for r in records if r["event"] == "liveness.failed"] == [1, 2, 1, 2]
    assert [r["returncode"] for r in records if r["event"] == "child.exit"] == [0, 0]
    assert "liveness probe failed" in next(r for r in records if r["event"] == "give_up")["reason"]


def test_a_fix_that_does_not_hold_restores_the_last_ready_command_line(
        tmp_path: Path, server: HealthServer) -> None:
    go = tmp_path / "go"
    launcher = Launcher(tmp_path, [
        [["print", "stdout", machine.READY_LINE], ["wait_file", str(go)],
         ["print", "stderr", DRAFT_LINE], ["wait_term"], ["exit", 0]],
        [["print", "stderr", DRAFT_LINE], ["wait_term"], ["exit", 0]],
        ready_then_wait(),
    ])
    rt = make_runtime(tmp_path, launcher)
    state = tmp_path / "state"

    def during(sup: Supervisor) -> None:
        wait_for(lambda: count(state, "ready") >= 1, what="first ready")
        go.touch()  # only now does launch 1 print its fatal line: after ready
        terminate_when(state, "ready", 2)(sup)

    argv = base_argv(server.port)
    assert supervise(rt, argv, during) == EXIT_OK
    fixed = [*argv, "--speculative-draft-attention-backend", "triton"]
    assert launcher.argvs() == [argv, fixed, argv]
    records = journal_events(state)
    restored = next(r for r in records if r["event"] == "restored")
    assert (restored["rule"], restored["argv_after"]) == ("draft-triton", argv)


def test_a_fix_that_does_not_hold_without_a_ready_line_gives_up(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [[["print", "stderr", DRAFT_LINE], ["exit", 1]]])
    rt = make_runtime(tmp_path, launcher, max_failures=5)
    assert supervise(rt, base_argv(free_port())) == EXIT_GIVE_UP
    assert len(launcher.argvs()) == 2
    exit_ = [r for r in journal_events(tmp_path / "state") if r["event"] == "guard.exit"]
    assert "fired again after its fix" in exit_[0]["reason"]


def test_leftover_group_members_are_stopped_before_the_next_launch(tmp_path: Path) -> None:
    # The main process exits; a member of its group lives on with its pipes closed and
    # SIGTERM ignored. It must not outlive its launch (it would hold the GPU or the port).
    orphan = tmp_path / "orphan.pid"
    launcher = Launcher(tmp_path, [[["orphan", str(orphan)], ["exit", 1]], [["exit", 1]]])
    rt = make_runtime(tmp_path, launcher, max_failures=2, stop_grace_s=0.2)
    try:
        assert supervise(rt, base_argv(free_port())) == EXIT_GIVE_UP
        assert len(launcher.argvs()) == 2
        assert wait_gone([int(orphan.read_text())], timeout=10) == []
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(orphan.read_text()), signal.SIGKILL)


def test_journal_failure_is_reported_once_and_the_loop_goes_on(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, [[["print", "stdout", "hello"], ["exit", 1]]])
    out = io.BytesIO()
    rt = make_runtime(tmp_path, launcher, stdout=out)
    journal = Journal(Path("/dev/full"))  # every write fails with ENOSPC
    journal._fd = os.open(journal.path, os.O_WRONLY)
    cl = parse_command_line(tuple(base_argv(free_port())), rt.env.options)
    code = run_supervisor(rt, cl, journal)  # closes the journal
    assert code == EXIT_GIVE_UP
    assert out.getvalue() == b"hello\n"
    assert journal.error is not None
