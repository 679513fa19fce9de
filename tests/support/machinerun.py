"""The machine as a scripted history (no process, no thread): a fake clock and fixed jitter.

`Run` drives `supervise.machine` with the test pack (support/pack.py); the unit tests of the
machine, its group side and the advice read the actions it collects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sglang_guard.config.guardconfig import HealthSection, RestartSection
from sglang_guard.rules.rules import Matcher
from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Action, Journal, Probe, Schedule, Spawn
from sglang_guard.supervise.events import ChildExited, ChildLine, Event, HealthResult, Tick

from .pack import parsed_pack

OPTIONS = load_option_table()


PACK = parsed_pack()


ARGV = ("--model-path", "/m", "--attention-backend", "fa3", "--port", "31000")


JITTER = 0.5  # fixed: every delay is base * 1.125


def make_env(*, health: HealthSection | None = None, **restart: Any) -> machine.Env:
    restart.setdefault("backoff_initial_s", 1.0)
    restart.setdefault("backoff_factor", 2.0)
    return machine.Env(
        options=OPTIONS, matcher=Matcher([PACK]), restart=RestartSection(**restart),
        health=health or HealthSection(liveness_interval_s=30.0, liveness_failures=2),
        arch="unknown", sm=None, sglang_version=None, derived_dir="/tmp/derived",
    )


@dataclass
class Run:
    """One scripted history: the machine, a fake clock and every action it asked for."""

    env: machine.Env = field(default_factory=make_env)
    argv: tuple[str, ...] = ARGV
    now: float = 1000.0
    state: machine.State = field(init=False)
    log: list[Action] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = machine.State(cl=parse_command_line(self.argv, OPTIONS))

    def start(self) -> list[Action]:
        self.state, actions = machine.start(self.state, self.env)
        self.log += actions
        return actions

    def send(self, event: Event, *, after: float = 0.0) -> list[Action]:
        self.now += after
        self.state, actions = machine.step(self.state, event, self.env, self.now, JITTER)
        self.log += actions
        return actions

    @property
    def gen(self) -> int:
        return self.state.gen

    def line(self, text: str) -> list[Action]:
        return self.send(ChildLine(self.gen, "stderr", text, len(text)))

    def exited(self, rc: int = 1, *, after: float = 0.0) -> list[Action]:
        return self.send(ChildExited(self.gen, 4242, rc), after=after)

    def tick(self, name: str) -> list[Action]:
        return self.send(Tick(name, self.gen))

    def health(self, endpoint: str, ok: bool) -> list[Action]:
        return self.send(HealthResult(self.gen, endpoint, ok, "HTTP 200" if ok else "HTTP 503"))

    def ready(self) -> list[Action]:
        assert Probe(self.gen, "/health") in self.line(machine.READY_LINE)
        return self.health("/health", ok=True)

    def backoff_then_spawn(self) -> Spawn:
        """After a failure: the backoff timer fires and the next launch starts."""
        assert self.state.phase == "backoff"
        spawn: Spawn = only(self.tick("backoff"), Spawn)
        return spawn


def of(actions: list[Action], kind: type[Any]) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def only(actions: list[Action], kind: type[Any]) -> Any:
    found = of(actions, kind)
    assert len(found) == 1, f"want one {kind.__name__} in {actions}"
    return found[0]


def events_of(actions: list[Action]) -> list[str]:
    return [a.record.event for a in of(actions, Journal)]


def record(actions: list[Action], event: str) -> dict[str, Any]:
    found = [a.record.to_record() for a in of(actions, Journal) if a.record.event == event]
    assert len(found) == 1, f"want one {event!r} in {events_of(actions)}"
    return found[0]


def delay_of(actions: list[Action], name: str) -> float:
    return float(next(a.delay for a in of(actions, Schedule) if a.name == name))

