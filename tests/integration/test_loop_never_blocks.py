"""Nothing blocks the loop: every wait or slow step is a job whose result comes back as an
event, so SIGTERM is answered at once in every phase, /livez answers from the loop, and the
systemd watchdog is fed by the loop's own tick (a wedged loop stops the pings).

The slow steps are fakes: a stranger holding SGLang's port, a preflight whose model probe
does not return, a rule pack whose compile does not return. Each fake waits on an event the
test sets at the end, so that no thread outlives the test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.config.guardconfig import GuardConfig
from sglang_guard.errors import EXIT_OK, InputError
from sglang_guard.preflight.shell import modelprobe
from sglang_guard.rules.rules import Matcher
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.status.shell.status import LIVEZ_WAIT_S, StatusBoard
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Action
from sglang_guard.supervise.events import FileChanged, Tick
from sglang_guard.supervise.shell import reloader as reloader_mod
from sglang_guard.supervise.shell import supervisor
from sglang_guard.supervise.shell.observer import Quiet
from sglang_guard.supervise.shell.reloader import Reloader
from sglang_guard.supervise.shell.supervisor import Supervisor
from support.harness import Launcher, base_argv, journal_events, make_runtime, supervise, wait_for
from support.notify import Listener
from support.pack import FA3_LINE
from support.procs import free_port, wait_gone

# What "at once" means here: a loop that answers takes milliseconds; one that blocks takes
# the whole slow step (60 s for the port wait, up to 600 s for a model probe).
ANSWER_S = 1.0
SLOW_S = 30.0  # how long each fake blocks at most (a broken loop then ends the test anyway)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test: every fake slow step returns then."""
    event = threading.Event()
    yield event
    event.set()


def terminate_and_time(sup: Supervisor, sent: list[float]) -> None:
    """SIGTERM to this process, as systemd sends it; when it was sent."""
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_a_relaunch_port_wait_exits_0_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Launch 1 prints a fatal line once a stranger holds SGLang's port; the fixed launch 2
    # must wait for the port (the old server may still be letting go of it).
    monkeypatch.setattr(supervisor, "PORT_WAIT_S", SLOW_S)
    go = tmp_path / "go"
    launcher = Launcher(tmp_path, [
        [["wait_file", str(go)], ["print", "stderr", FA3_LINE], ["exit", 1]],
        [["exit", 0]],
    ])
    port = free_port()
    rt = make_runtime(tmp_path, launcher)
    state = tmp_path / "state"
    sent: list[float] = []
    with socket.socket() as stranger:
        def during(sup: Supervisor) -> None:
            wait_for(launcher.argvs, what="launch 1 running")
            stranger.bind(("127.0.0.1", port))
            stranger.listen()
            go.touch()
            wait_for(lambda: [r for r in journal_events(state)
                              if r["event"] == "child.start" and r["gen"] == 2],
                     what="the relaunch, waiting for the port")
            terminate_and_time(sup, sent)

        code = supervise(rt, base_argv(port, "--attention-backend", "fa3"), during)
        took = time.monotonic() - sent[0]
    assert code == EXIT_OK
    assert took < ANSWER_S, f"SIGTERM answered after {took:.1f}s"
    assert len(launcher.argvs()) == 1  # launch 2 never started: its port never came free
    events = [r["event"] for r in journal_events(state)]
    assert "give_up" not in events
    assert events[-1] == "guard.exit"


class _Blocking:
    """A slow step: says it began, then waits for the test's release (or SLOW_S)."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.entered = threading.Event()

    def wait(self) -> None:
        self.entered.set()
        self.release.wait(SLOW_S)


def _reloading_runtime(tmp_path: Path, launcher: Launcher, prepare: Any) -> Any:
    rt = make_runtime(tmp_path, launcher)
    cl = parse_command_line(tuple(base_argv(free_port())), rt.env.options)
    rt.reload = Reloader(GuardConfig(), lambda cfg: cfg, prepare, cl, cl.argv).reload
    rt.observer = StatusBoard(metrics=False)
    return rt


def _term_during_reload(tmp_path: Path, rt: Any, launcher: Launcher, slow: _Blocking,
                        kind: Any) -> tuple[int, float, bool]:
    sent: list[float] = []
    alive: list[bool] = []

    def during(sup: Supervisor) -> None:
        wait_for(launcher.argvs, what="SGLang running")
        sup.events.put(FileChanged(str(tmp_path / "changed"), kind))  # as the watcher does
        assert slow.entered.wait(SLOW_S), "the reload never began"
        alive.append(rt.observer.alive(LIVEZ_WAIT_S))  # /livez, while the slow step runs
        terminate_and_time(sup, sent)

    code = supervise(rt, ["--model-path", "/models/fake", "--port", str(free_port())], during)
    return code, time.monotonic() - sent[0], alive[0]


def test_sigterm_during_a_reload_with_a_slow_model_probe_exits_0_at_once(
        tmp_path: Path, release: threading.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = Launcher(tmp_path, [[["wait_term"], ["exit", 0]]])
    probe = _Blocking(release)
    monkeypatch.setattr(reloader_mod, "load_packs", lambda cfg, options: [])  # no compile here

    def prepare(cfg: GuardConfig, argv: tuple[str, ...]) -> Any:  # preflight: the model probe
        probe.wait()
        raise InputError("the model probe did not answer before the test ended")

    rt = _reloading_runtime(tmp_path, launcher, prepare)
    code, took, alive = _term_during_reload(tmp_path, rt, launcher, probe, "sglang_yaml")
    assert code == EXIT_OK
    assert alive, "/livez did not answer while the reload ran"
    assert took < ANSWER_S, f"SIGTERM answered after {took:.1f}s"


def test_sigterm_during_a_rule_pack_compile_exits_0_at_once(
        tmp_path: Path, release: threading.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = Launcher(tmp_path, [[["wait_term"], ["exit", 0]]])
    compile_ = _Blocking(release)
    monkeypatch.setattr(reloader_mod, "load_packs", lambda cfg, options: [])
    monkeypatch.setattr(Matcher, "prepare_scan", lambda self: compile_.wait())
    rt = _reloading_runtime(tmp_path, launcher, None)
    code, took, alive = _term_during_reload(tmp_path, rt, launcher, compile_, "rule_pack")
    assert code == EXIT_OK
    assert alive, "/livez did not answer while the pack compiled"
    assert took < ANSWER_S, f"SIGTERM answered after {took:.1f}s"


class _Wedge(Quiet):
    """A listener whose `stepped` blocks once `wedged` is set: the loop stands still there."""

    def __init__(self, release: threading.Event) -> None:
        self.wedged = threading.Event()
        self.inside = threading.Event()
        self.release = release

    def stepped(self, state: machine.State, env: machine.Env, actions: Sequence[Action]) -> None:
        if self.wedged.is_set():
            self.inside.set()
            self.release.wait(SLOW_S)


def test_the_watchdog_is_fed_by_the_loop_and_a_wedged_loop_stops_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> None:
    listener = Listener(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    monkeypatch.setenv("WATCHDOG_USEC", "60000")  # a ping every 20 ms
    launcher = Launcher(tmp_path, [[["wait_term"], ["exit", 0]]])  # loading, never ready
    rt = make_runtime(tmp_path, launcher)
    wedge = _Wedge(release)
    rt.observer = wedge
    pings: dict[str, int] = {}

    def watchdogs() -> int:
        return listener.fields().count("WATCHDOG=1")

    def during(sup: Supervisor) -> None:
        wait_for(lambda: watchdogs() >= 2, what="pings while SGLang loads")
        wedge.wedged.set()
        sup.events.put(Tick("test.wedge", -1))  # the loop's next step blocks in the observer
        assert wedge.inside.wait(SLOW_S)
        pings["at_wedge"] = watchdogs()
        threading.Event().wait(0.3)  # 15 periods: a side thread would have pinged here
        pings["wedged"] = watchdogs()
        wedge.wedged.clear()
        release.set()
        wait_for(lambda: watchdogs() > pings["wedged"], what="pings again once unwedged")
        sup.events.put(Tick("test.after", -1))
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        assert supervise(rt, base_argv(free_port()), during) == EXIT_OK
    finally:
        listener.close()
    # One ping may already have been on its way when the loop entered the step.
    assert pings["wedged"] - pings["at_wedge"] <= 1, pings


def test_sigterm_during_a_reload_stops_the_probe_subprocess_too(
        tmp_path: Path, release: threading.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    # The model probe runs AutoConfig in a subprocess (preflight/shell/modelprobe.py): a guard that
    # exits during a reload leaves no probe behind.
    launcher = Launcher(tmp_path, [[["wait_term"], ["exit", 0]]])
    monkeypatch.setattr(reloader_mod, "load_packs", lambda cfg, options: [])
    slow = tmp_path / "slow_probe.py"
    slow.write_text("import os, sys, time\n"
                    f"open({str(tmp_path / 'probe.pid')!r}, 'w').write(str(os.getpid()))\n"
                    "time.sleep(60)\n")
    monkeypatch.setattr(modelprobe, "_PROBE_COMMAND", (sys.executable, str(slow)))
    pid_file = tmp_path / "probe.pid"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({  # no cache holds this one
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "name": str(tmp_path)}))

    def prepare(cfg: GuardConfig, argv: tuple[str, ...]) -> Any:  # preflight's model probe
        modelprobe.resolve_model(str(model), isolate=True, use_cache=False)
        raise InputError("the probe was stopped")

    rt = _reloading_runtime(tmp_path, launcher, prepare)
    probe_pid: list[int] = []

    def during(sup: Supervisor) -> None:
        wait_for(launcher.argvs, what="SGLang running")
        sup.events.put(FileChanged(str(tmp_path / "changed"), "sglang_yaml"))
        probe_pid.append(int(wait_for(lambda: pid_file.exists() and pid_file.read_text(),
                                      what="the probe subprocess")))
        os.kill(os.getpid(), signal.SIGTERM)

    assert supervise(rt, ["--model-path", "/models/fake", "--port", str(free_port())],
                     during) == EXIT_OK
    assert wait_gone(probe_pid, timeout=5) == [], "the model probe outlived the loop"
