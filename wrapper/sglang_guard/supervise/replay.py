"""The supervisor's decision over saved output: the pure machine (supervise/machine.py), replayed.

`explain` and the tests ask what the running guard would do with a failure's lines. They do
not re-implement "which rule wins in a burst": they feed the same events the reader threads
would put on the queue (each line with what rules/tracebacks.py says of it), to the same
`machine.step`, with a clock the replay advances (from SGLang's record timestamps, where the
lines carry them), and read off the fix the machine acted on.

Only what decides a failure's fix is simulated: a settle window closes when the clock passes
it or the output ends (the child exits), a readiness probe answers ok at once (a ready line
makes the running-phase rules the ones that act). Stall, ready and liveness timers are not:
a saved excerpt's clock says nothing about them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from sglang_guard.config.guardconfig import HealthSection, RestartSection
from sglang_guard.rules import tracebacks
from sglang_guard.rules.rules import Fix, Matcher
from sglang_guard.sglang.argv import CommandLine
from sglang_guard.sglang.options import OptionTable
from sglang_guard.supervise import machine
from sglang_guard.supervise.actions import Action, Probe, Schedule, Stop
from sglang_guard.supervise.events import ChildExited, ChildLine, Event, HealthResult, Tick

LINE_GAP_S = 0.001  # between two lines that carry no timestamp of their own
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})?)")
_TIMERS = ("settle", "health_retry")  # the timers a decision waits on


def env_for(matcher: Matcher, options: OptionTable, *, sm: int | None = None,
            sglang_version: str | None = None, arch: str = "unknown") -> machine.Env:
    """The machine's environment for a replay: the guard's defaults, no derived files."""
    return machine.Env(options=options, matcher=matcher, restart=RestartSection(),
                       health=HealthSection(), arch=arch, sm=sm, sglang_version=sglang_version,
                       derived_dir="/nonexistent/sglang-guard-replay")


@dataclass
class Replay:
    """One launch of `cl`, fed line by line; `decision` once the machine stopped the child."""

    env: machine.Env
    cl: CommandLine
    state: machine.State = field(init=False)
    decision: Fix | None = field(init=False, default=None)
    done: bool = field(init=False, default=False)  # the machine stopped or ended the launch
    _read: str = field(init=False, default=tracebacks.UNKNOWN)
    _now: float = field(init=False, default=0.0)
    _zero: float | None = field(init=False, default=None)
    _due: list[tuple[float, str]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.state, actions = machine.start(machine.State(cl=self.cl), self.env)
        self._act(actions)

    def feed(self, text: str, ends: bool | None = None, *, read: bool = True,
             exception: bool = False) -> None:
        """One cleaned line; `ends` and `exception` as the reader said them (computed here
        when `read`)."""
        if self.done:
            return
        if read:
            before = self._read
            self._read, ends = tracebacks.step(before, text)
            exception = tracebacks.ends_frames(before, self._read)
        self._advance(self._stamp(text))
        if not self.done:
            self._step(ChildLine(self.state.gen, "stderr", text, len(text), ends, exception))

    def finish(self) -> Fix | None:
        """The output ended: the child exits; what the machine acted on (None: nothing)."""
        if not self.done:
            self._step(ChildExited(self.state.gen, 0, 1))
        return self.decision

    def _stamp(self, text: str) -> float:
        found = _STAMP.match(text)
        if found is None:
            return self._now + LINE_GAP_S
        try:
            at = datetime.fromisoformat(found[1]).timestamp()
        except ValueError:
            return self._now + LINE_GAP_S
        if self._zero is None:
            self._zero = at - self._now
        return max(self._now, at - self._zero)

    def _advance(self, now: float) -> None:
        """Deliver the timers due before `now`, in order, then move the clock there."""
        while self._due and not self.done:
            self._due.sort()
            at, name = self._due[0]
            if at > now:
                break
            self._due.pop(0)
            self._now = max(self._now, at)
            self._step(Tick(name, self.state.gen))
        self._now = max(self._now, now)

    def _step(self, event: Event) -> None:
        self.state, actions = machine.step(self.state, event, self.env, self._now, 0.5)
        self._act(actions)

    def _act(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Schedule) and action.name in _TIMERS:
                self._due.append((self._now + action.delay, action.name))
            elif isinstance(action, Probe):
                self._step(HealthResult(action.gen, action.endpoint, True, "replay"))
            elif isinstance(action, Stop):
                self.done = True
        if self.decision is None and self.state.decided is not None:
            self.decision = self.state.decided
        if self.state.phase in ("stopping", "done"):
            self.done = True


def replay(lines: Iterable[str] | Iterable[tuple[str, bool | None]], env: machine.Env,
           cl: CommandLine) -> Fix | None:
    """The fix the supervisor would act on after this output of one launch of `cl`.

    Plain lines are read in order as the reader reads a stream from its start; (line,
    ends_traceback) pairs carry what the reader said of each (as `explain` keeps them).
    """
    run = Replay(replace(env), cl)
    for item in lines:
        if isinstance(item, str):
            run.feed(item)
        else:
            run.feed(item[0], item[1], read=False)
        if run.done:
            break
    return run.finish()
