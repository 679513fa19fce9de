"""The supervision state machine: `step(state, event) -> (state, actions)`, no I/O.

The shell feeds it events (lines, exits, health results, timers, signals) and carries out
the actions it returns (spawn, stop, probe, journal, notify, exit). Time and randomness
come in as arguments, so every branch is testable with a scripted history.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from dataclasses import field, replace
from typing import assert_never

from sglang_guard.common.outcomes import (
    NODE_TAGGED,
    BackingOff,
    ChildExit,
    ChildStarted,
    CrashDetected,
    FixRefused,
    GaveUp,
    GiveUpCause,
    GiveUpPlanned,
    GroupExited,
    GroupRelaunched,
    JournalEvent,
    LivenessFailed,
    LogFix,
    NodeDown,
    Ready,
    RestartPlanned,
    Restored,
    SignalSeen,
    Stable,
    StageStarted,
    StartStalled,
    StopCause,
    UndoFix,
)
from sglang_guard.common.record import record
from sglang_guard.config.guardconfig import HealthSection, RestartSection, StartSection
from sglang_guard.errors import EXIT_ENVIRONMENT, EXIT_GIVE_UP, EXIT_OK, EXIT_USAGE, GuardError
from sglang_guard.rules.fixes import (
    FIX_KINDS,
    EditFlag,
    EndGuard,
    PickFreePort,
    Relaunch,
    UndoLastEdit,
)
from sglang_guard.rules.logline import crash_signature
from sglang_guard.rules.rules import (
    Fix,
    MatchContext,
    Matcher,
    advice_for,
    advice_record,
    choose_fix,
    first_fix,
    is_catch_all,
    refired,
    warm_ranges,
)
from sglang_guard.rules.stages import READY_LINE, Stalled, is_progress
from sglang_guard.sglang.argv import CommandLine, parse_command_line
from sglang_guard.sglang.edits import Edit, apply_edits
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.redact import redact_argv
from sglang_guard.supervise.actions import (
    Action,
    Exit,
    Journal,
    Notify,
    PickPort,
    Probe,
    Reload,
    Schedule,
    Spawn,
    Stop,
)
from sglang_guard.supervise.backoff import backoff_delay, failures_in_window
from sglang_guard.supervise.events import (
    ChildExited,
    ChildLine,
    ChildOutput,
    ChildStage,
    CommandChanged,
    Event,
    FileChanged,
    GroupExit,
    GroupReady,
    GroupRelaunch,
    HealthResult,
    PeerDown,
    PeerLine,
    PortChosen,
    SignalReceived,
    Tick,
)

SETTLE_S = 2.0  # a catch-all match waits this long for a more specific line of the same crash
HEALTH_RETRY_S = 1.0


@record
class Env:
    """What the machine decides with, besides its state (replaced on reload)."""

    options: OptionTable
    matcher: Matcher
    restart: RestartSection
    health: HealthSection
    arch: str
    sm: int | None
    sglang_version: str | None
    derived_dir: str
    # A multi-node group: "leader" also decides for its workers' lines and failures;
    # a "worker" decides nothing itself and follows its leader's orders (group/group.py).
    role: str = "solo"  # solo | leader | worker
    start: StartSection = field(default_factory=StartSection)


@record
class PortFix:
    """A `free_port` fix waiting for its port: the shell picks one once the child is gone."""

    fix: Fix
    line: str
    gen: int  # the launch whose line asked for it


@record
class Pending:
    """What to do once the stopping child has exited."""

    kind: str  # "restart" | "exit"
    cl: CommandLine | None = None
    code: int = EXIT_OK
    reason: str = ""
    failure: bool = False  # counts toward the crash-loop limit and the backoff
    port_fix: PortFix | None = None  # restart only after the shell's PortChosen
    cause: GiveUpCause = GiveUpCause.OTHER  # an exit that gives up: why (the metrics' label)


@record
class CatchAll:
    """A catch-all rule matched: its fix waits out SETTLE_S for a more specific line."""

    fix: Fix
    line: str


@record
class Refired:
    """A rule fired again after its fix: waits out SETTLE_S, then restore or give up."""

    rule_id: str
    line: str


@record
class Base:
    """What every record about a log line's rule names: the rule, the line, the launch."""

    rule: str
    line: str
    gen: int

    def planned(self, reason: str, klass: str | None = None) -> GiveUpPlanned:
        """The give-up this line's rule plans."""
        return GiveUpPlanned(trigger="log", rule=self.rule, line=self.line, gen=self.gen,
                             klass=klass, reason=reason)


def _at_node(record: JournalEvent, node: int) -> JournalEvent:
    """A worker's line decided on the leader: its records name the worker's rank."""
    return replace(record, node=node) if isinstance(record, NODE_TAGGED) else record


@record
class State:
    """Everything the loop remembers between events."""

    cl: CommandLine
    gen: int = 0
    # idle | starting | ready | stopping | picking (a free port, from the shell) | backoff |
    # held | done
    phase: str = "idle"
    ready_line: bool = False
    last_ready: CommandLine | None = None
    fired: Mapping[str, int] = field(default_factory=dict)
    failures: tuple[float, ...] = ()
    attempt: int = 0
    liveness_streak: int = 0
    pending: Pending | None = None
    # What waits out SETTLE_S (with the line that triggered it).
    tentative: CatchAll | Refired | None = None
    # The command line before the guard's last fix, and the flag that fix changed: SGLang's
    # parser rejecting that flag undoes the fix (cleared once a launch is ready).
    before_fix: tuple[CommandLine, str] | None = None
    # The start-up watch (rules/stages.py): the stage SGLang is in, when it last made
    # progress (None: not since the spawn), the last line it printed, the live stall
    # timer's number, and what was seen when the start stalled (for /startupz).
    stage: str = "init"
    progress_at: float | None = None
    last_line: str = ""
    stall_seq: int = 0
    stalled: Stalled | None = None
    # The last exception line (ending a traceback) this launch printed, and the command line
    # and masked exception line of the last failed launch: the same crash twice is not
    # retried (RestartSection.give_up_on_repeat).
    exception_line: str | None = None
    last_crash: tuple[tuple[str, ...], str] | None = None
    # The last fix the machine acted on (supervise/replay.py reads it off after each event).
    decided: Fix | None = None


def start(state: State, env: Env) -> tuple[State, list[Action]]:
    """The first launch."""
    return _spawn(state, env, state.cl, "start")


# What `rehearse` feeds a throwaway launch: a scheduler's crash banner (a catch-all: the
# settle window) and the fatal line of a drop_flag rule of the default pack, on a command
# line that gives it something to drop. Neither is the child's: the state is thrown away.
_REHEARSAL_FLAG = ("--attention-backend", "hpc_ops")
REHEARSAL_LINES = (
    "[2026-01-01 00:00:00] Scheduler hit an exception: Traceback (most recent call last):",
    "ValueError: hpc_ops backend can only be used with non-MLA models.",
)


def rehearse(env: Env, cl: CommandLine) -> None:
    """Step a throwaway launch of `cl` through a crash banner and a fatal line, and drop it.

    The first fatal line a process reads otherwise pays for the line path's first use
    (the rule scan's and each regex's first match, the interpreter's first runs of the fix
    path): ~0.5 ms of the ~3 ms from the child's write to its SIGTERM, measured on the idle
    reaction (bench/README.md, "Reaction, fifth round"), on what is usually a launch's only
    fatal line. Pure: `env` keeps only what its matcher caches; nothing is carried out. The
    pipes' threads run it too, each on itself (supervise/shell/supervisor.py, `_warm_pump`)."""
    try:
        trial = parse_command_line((*cl.argv, *_REHEARSAL_FLAG), env.options, cl.yaml_data)
    except GuardError:  # a table without the flag: the line path still runs, with no fix
        trial = cl
    warm_ranges(env.matcher.rules, env.sglang_version)  # every rule's, not only the trial's
    state, _ = start(State(cl=trial), env)
    lines = [ChildLine(state.gen, "stderr", text, len(text), True, i == len(REHEARSAL_LINES) - 1)
             for i, text in enumerate(REHEARSAL_LINES)]
    stops_at(state, env, lines)  # the early stop's question, which a pipe's reader asks
    for line in lines:
        state, _ = step(state, line, env, 0.0, 0.5)


def step(state: State, event: Event, env: Env, now: float, jitter: float
         ) -> tuple[State, list[Action]]:
    """Advance the machine by one event."""
    if state.phase == "done":
        return state, []
    if isinstance(event, SignalReceived):
        return _on_signal(state, event)
    if isinstance(event, FileChanged):
        return state, [Reload(event.kind, event.path)]
    if isinstance(event, CommandChanged):
        return _on_command_changed(state, event, env)
    if isinstance(event, GroupRelaunch | GroupReady | GroupExit):
        return _on_group_order(state, event, env)
    if getattr(event, "gen", state.gen) != state.gen:
        return state, []  # a late event of a launch that is already over
    if isinstance(event, ChildLine):
        return _on_line(state, event, env, now)
    if isinstance(event, PeerLine | PeerDown):
        return _on_peer(state, event, env, now)
    if isinstance(event, ChildOutput):
        return _on_output(state, event, now), []
    if isinstance(event, ChildStage):
        return _on_stage(state, event.stage, env, now)
    if isinstance(event, HealthResult):
        return _on_health(state, event, env)
    if isinstance(event, Tick):
        if event.name.startswith(STALL):
            return _on_stall_tick(state, event, env, now)
        return _on_tick(state, event, env)
    if isinstance(event, ChildExited):
        return _on_exit(state, event, env, now, jitter)
    if isinstance(event, PortChosen):
        return _on_port(state, event, env)
    return state, []


def _spawn(state: State, env: Env, cl: CommandLine, why: str) -> tuple[State, list[Action]]:
    gen = state.gen + 1
    new = replace(state, cl=cl, gen=gen, phase="starting", ready_line=False,
                  liveness_streak=0, pending=None, tentative=None, stage="init",
                  progress_at=None, last_line="", stalled=None, exception_line=None)
    argv = redact_argv(cl.argv, env.options)
    new, watch = _watch_stall(new, env, env.start.limit("init"))
    return new, [
        Spawn(gen, cl.argv),
        Journal(ChildStarted(gen=gen, reason=why, argv=argv)),
        Notify(status=f"loading (launch {gen})"),
        Schedule("ready_timeout", gen, env.restart.ready_timeout_s),
        *watch,
    ]


def _stop(state: State, pending: Pending, why: str, cause: StopCause | None = None
          ) -> tuple[State, list[Action]]:
    new = replace(state, phase="stopping", pending=pending, tentative=None)
    return new, [Stop(state.gen, why, cause)]


def _on_signal(state: State, event: SignalReceived) -> tuple[State, list[Action]]:
    if event.signum == signal.SIGHUP:
        return state, [Reload("guard_config", None)]
    journal = Journal(SignalSeen(signal=signal.Signals(event.signum).name))
    pending = Pending("exit", code=EXIT_OK, reason="stopped by signal")
    if state.phase in ("starting", "ready", "stopping"):
        new, actions = _stop(state, pending, "signal")
        return new, [journal, Notify(status="stopping"), *actions]
    return replace(state, phase="done"), [journal, Exit(EXIT_OK, "stopped by signal")]


def _on_command_changed(state: State, event: CommandChanged, env: Env
                        ) -> tuple[State, list[Action]]:
    """A config edit changed what SGLang would run: one graceful restart with the new line."""
    journal = Journal(RestartPlanned(reason=event.reason,
                                     argv_after=redact_argv(event.cl.argv, env.options)))
    if state.phase in ("starting", "ready"):
        new, actions = _stop(state, Pending("restart", cl=event.cl, reason=event.reason),
                             "config changed", StopCause.RELOAD)
        return new, [journal, Notify(status="config changed, restarting"), *actions]
    pending = state.pending
    if pending is not None and pending.kind == "restart":  # stopping or in backoff already
        return replace(state, pending=replace(pending, cl=event.cl)), [journal]
    return state, []


def _ctx(state: State, env: Env) -> MatchContext:
    phase = "running" if state.phase == "ready" else "start"
    return MatchContext(state.cl.effective(), env.arch, env.sm, env.sglang_version, env.options,
                        state.before_fix[1] if state.before_fix else None, phase=phase)


# --- the start-up watch ---------------------------------------------------------------------

STALL = "stall:"  # Tick names "stall:<n>": only the latest timer of a launch counts


def _watch_stall(state: State, env: Env, delay: float) -> tuple[State, list[Action]]:
    """Start a new stall timer (the older one, if any, is ignored when it fires)."""
    seq = state.stall_seq + 1
    state = replace(state, stall_seq=seq)
    if delay <= 0:  # this stage is not watched
        return state, []
    return state, [Schedule(f"{STALL}{seq}", state.gen, delay)]


def _on_output(state: State, event: ChildOutput, now: float) -> State:
    if state.phase != "starting":
        return state
    if event.tail:
        state = replace(state, last_line=event.tail)
    if is_progress(event.tail, event.bar):
        state = replace(state, progress_at=now)
    return state


def _on_stage(state: State, stage: str, env: Env, now: float) -> tuple[State, list[Action]]:
    """The next stage began: progress, and a timer with that stage's own limit."""
    if state.phase != "starting":
        return state, []
    if stage == state.stage:  # every TP rank prints its markers: the same stage again
        return replace(state, progress_at=now), []
    state = replace(state, progress_at=now, stage=stage)
    state, watch = _watch_stall(state, env, env.start.limit(stage))
    return state, [Journal(StageStarted(gen=state.gen, stage=stage)), *watch]


def _on_stall_tick(state: State, event: Tick, env: Env, now: float
                   ) -> tuple[State, list[Action]]:
    if state.phase != "starting" or event.name != f"{STALL}{state.stall_seq}":
        return state, []
    if env.role == "worker":  # a worker's stalled start is the group's: its leader decides
        return state, []
    limit = env.start.limit(state.stage)
    if limit <= 0:
        return state, []
    # No progress since the spawn: this timer was set at the spawn, for the whole limit.
    silent = limit if state.progress_at is None else now - state.progress_at
    if silent < limit:
        return _watch_stall(state, env, limit - silent)
    stalled = Stalled(state.stage, state.last_line, round(silent, 3))
    state = replace(state, stalled=stalled)
    reason = (f"start stalled: no progress in stage {stalled.stage} for {silent:.0f}s "
              f"(limit {limit:g}s; last line: {stalled.line[:200]!r})")
    journal = Journal(StartStalled(gen=state.gen, stage=stalled.stage, line=stalled.line,
                                   silent_s=stalled.silent_s, limit_s=limit,
                                   action=env.start.on_stall))
    notify = Notify(status=f"start stalled in {stalled.stage}")
    if env.start.on_stall == "give_up":
        pending = Pending("exit", code=EXIT_GIVE_UP, reason=reason, cause=GiveUpCause.STALLED)
        new, actions = _stop(state, pending, "start stalled")
        return new, [journal, Journal(GiveUpPlanned(gen=state.gen, reason=reason)), notify,
                     *actions]
    pending = Pending("restart", cl=state.cl, failure=True, reason=reason)
    new, actions = _stop(state, pending, "start stalled")
    return new, [journal, notify, *actions]


# --- log lines ------------------------------------------------------------------------------


def _on_line(state: State, event: ChildLine, env: Env, now: float
             ) -> tuple[State, list[Action]]:
    actions: list[Action] = []
    if state.phase not in ("starting", "ready"):
        return state, actions
    if state.phase == "starting":
        state = replace(state, last_line=event.text)
        if is_progress(event.text, False):
            state = replace(state, progress_at=now)
    if env.role == "worker":
        return state, actions  # a worker's lines go to its leader, which decides
    if event.exception:  # the exception line that ends a traceback: the crash's own
        state = replace(state, exception_line=event.text)
    if state.phase == "starting" and READY_LINE in event.text and not state.ready_line:
        state = replace(state, ready_line=True)
        if not env.health.enabled:  # no HTTP probing at all: the line alone says ready
            return _ready(state, env)
        actions.append(Probe(state.gen, "/health"))
    ends = event.ends_traceback
    if not env.matcher.candidates(event.text, ends):
        # No rule reads this line (most lines of a chunk the prefilter passed): nothing to
        # decide, and no context to build for it.
        return state, actions
    ctx = _ctx(state, env)
    # Advice rules change nothing: journaled, never a remediation, a restart or a fire.
    actions += [Journal(advice_record(r, event.text, state.gen))
                for r in advice_for(env.matcher, event.text, ctx, ends)]
    fix, exhausted = first_fix(env.matcher, event.text, ctx, state.fired, ends)
    if fix is None:
        # A rule that already fired and now finds nothing left to change (its flag is gone
        # or already has the new value) fired again after its fix: the fix did not hold.
        again = exhausted or refired(env.matcher, event.text, state.fired, ctx.phase, ends)
        if again and not isinstance(state.tentative, Refired):
            # Not at once: a later line of the same burst may still name a fix (torch's OOM
            # line comes before SGLang's "Capture cuda graph failed", say). A pending
            # catch-all restart gives way: a fix that did not hold says more than a crash.
            if state.tentative is None:
                actions.append(Schedule("settle", state.gen, SETTLE_S))
            state = replace(state, tentative=Refired(again[0].id, event.text))
        return state, actions
    if is_catch_all(fix.rule):  # give the specific line of the same crash a moment
        if state.tentative is None:
            actions.append(Schedule("settle", state.gen, SETTLE_S))
            state = replace(state, tentative=CatchAll(fix, event.text))
        elif (isinstance(state.tentative, CatchAll)
              and fix.rule.priority > state.tentative.fix.rule.priority):
            # A nearer catch-all of the same crash (torch's OOM line after the scheduler's
            # crash banner) takes the waiting one's place; the settle window already runs.
            state = replace(state, tentative=CatchAll(fix, event.text))
        return state, actions
    new, more = _apply_fix(state, fix, event.text, env)
    return new, actions + more


def stops_at(state: State, env: Env, lines: Iterable[ChildLine]) -> bool:
    """Whether `step` stops the running child on one of `lines`, stepped in order from
    `state` with no other event between them: what a pipe's reader may act on before the
    loop steps them (supervise/shell/child.py, the early stop). Never True where the steps
    would not stop it (tests/unit/test_early_stop.py holds the two equal over stored logs,
    states and line orders); False where it cannot tell cheaply.

    `_on_line` stops the child exactly when `first_fix` finds a fix that is not a catch-all's
    (every way through `_apply_fix` ends in `_stop`). The lines before that one leave what
    that choice reads alone (the phase, the command line, the fires, the last fix), except
    the ready line, which may start the ready phase: the answer is then False.
    """
    if state.phase not in ("starting", "ready") or env.role == "worker":
        return False
    ctx: MatchContext | None = None
    for line in lines:
        if line.gen != state.gen:
            continue  # `step` ignores it
        if state.phase == "starting" and READY_LINE in line.text:
            return False
        ends = line.ends_traceback
        if all(is_catch_all(rule) for rule in env.matcher.candidates(line.text, ends)):
            continue  # none, or only catch-alls: whatever it picks is no stop (a crash banner)
        ctx = ctx or _ctx(state, env)
        fix, _ = choose_fix(env.matcher, line.text, ctx, state.fired, ends)
        if fix is not None and not is_catch_all(fix.rule):
            return True
    return False


def _settle(state: State, env: Env) -> tuple[State, list[Action]]:
    """The settle window closed with no better line: act on what was waiting."""
    what = state.tentative
    state = replace(state, tentative=None)
    if isinstance(what, Refired):
        return _repeat(state, what.rule_id, what.line, env, [])
    assert what is not None  # noqa: S101 - callers check
    return _apply_fix(state, what.fix, what.line, env)


def _apply_fix(state: State, fix: Fix, line: str, env: Env) -> tuple[State, list[Action]]:
    rule = fix.rule
    fired = {**state.fired, rule.id: state.fired.get(rule.id, 0) + 1}
    state = replace(state, fired=fired, decided=fix)
    base = Base(rule.id, line, state.gen)
    match FIX_KINDS[fix.action].apply(fix, line):
        case EndGuard(code=code, exit_reason=exit_reason, reason=reason, klass=klass,
                      status=shown):
            pending = Pending("exit", code=code, reason=exit_reason, cause=GiveUpCause.RULE)
            new, actions = _stop(state, pending, f"rule {rule.id}")
            journal = Journal(base.planned(reason, klass=klass))
            notify = [Notify(status=shown)] if shown is not None else []
            return new, [journal, *notify, *actions]
        case UndoLastEdit() if state.before_fix is not None:
            before, flag = state.before_fix
            journal = Journal(UndoFix(
                rule=base.rule, line=base.line, gen=base.gen, flag=flag,
                reason=f"SGLang {env.sglang_version or ''} rejects the guard's own change of "
                       f"{flag}; restoring the command line before it",
                argv_before=redact_argv(state.cl.argv, env.options),
                argv_after=redact_argv(before.argv, env.options)))
            pending = Pending("restart", cl=before, reason="undo guard edit")
            new, actions = _stop(replace(state, before_fix=None), pending, f"rule {rule.id}")
            return new, [journal, *actions]
        case Relaunch(reason=reason):
            pending = Pending("restart", cl=state.cl, failure=True, reason=reason)
            new, actions = _stop(state, pending, f"rule {rule.id}")
            return new, [Journal(CrashDetected(rule=base.rule, line=base.line, gen=base.gen,
                                               reason=reason)), *actions]
        case PickFreePort():  # the port is picked once the child is gone, before the launch
            pending = Pending("restart", cl=state.cl, reason=rule.reason,
                              port_fix=PortFix(fix, line, state.gen))
            return _stop(state, pending, f"rule {rule.id}")
        case EditFlag(value=value, drop=drop):
            new_cl, changed = _edited(state.cl, fix.flag, value, env, drop=drop)
        case UndoLastEdit():  # a ready launch cleared the edit since the plan: as before, the
            # edit path (unreached by the shipped packs: no undo rule is a catch-all)
            new_cl, changed = _edited(state.cl, fix.flag, fix.new_value, env)
        case _ as unknown:
            assert_never(unknown)
    if not changed:
        return _repeat(state, rule.id, line, env, [])
    rejected = _new_problems(state.cl, new_cl)
    if rejected:  # never launch what the release's parser rejects: the next rung, or give up
        return _refuse_fix(state, fix, line, env, rejected)
    journal = _remediated(state.cl, new_cl, fix, fix.new_value, base=base, env=env)
    status = Notify(status=f"remediated {fix.flag} ({rule.id}), restarting")
    pending = Pending("restart", cl=new_cl, reason=rule.reason)
    state = replace(state, before_fix=(state.cl, fix.flag or ""))
    new, actions = _stop(state, pending, f"rule {rule.id}")
    return new, [journal, status, *actions]


def _edited(cl: CommandLine, flag: str | None, value: str | None, env: Env, *,
            drop: bool = False) -> tuple[CommandLine, bool]:
    """`cl` with `flag` dropped or set to `value`; and whether anything changed."""
    dest = env.options.spec(flag or "").dest
    edit = Edit(dest, "drop") if drop else Edit(dest, "set", value)
    result = apply_edits(cl, env.options, [edit], env.derived_dir)
    yaml_data = result.derived_yaml if result.derived_yaml is not None else cl.yaml_data
    new_cl = parse_command_line(result.argv, env.options, yaml_data)
    return new_cl, new_cl.argv != cl.argv or result.derived_yaml is not None


def _remediated(before: CommandLine, after: CommandLine, fix: Fix, value: str | None, *,
                base: Base, env: Env) -> Journal:
    return Journal(LogFix(
        rule=base.rule, line=base.line, gen=base.gen, flag=fix.flag, action=fix.action,
        old_value=fix.old_value, new_value=value, reason=fix.rule.reason,
        free_port=bool(fix.free_port), busy_port=fix.busy_port if fix.free_port else None,
        argv_before=redact_argv(before.argv, env.options),
        argv_after=redact_argv(after.argv, env.options)))


def _avoid(cl: CommandLine, fix: Fix) -> tuple[int, ...]:
    """Ports a picked one must not be: the busy one, and the HTTP --port (SGLang's 30000)."""
    http = cl.value("port") or "30000"
    return tuple(sorted({p for p in (fix.busy_port, int(http) if http.isdigit() else None)
                         if p is not None}))


def _on_port(state: State, event: PortChosen, env: Env) -> tuple[State, list[Action]]:
    """The shell found a free port: set the flag to it, journal the fix, launch."""
    pending = state.pending
    if state.phase != "picking" or pending is None or pending.port_fix is None \
            or pending.cl is None or event.flag != pending.port_fix.fix.flag:
        return state, []
    planned = pending.port_fix
    fix, rule = planned.fix, planned.fix.rule
    base = Base(rule.id, planned.line, planned.gen)
    new_cl, _ = (pending.cl, False) if event.port is None else \
        _edited(pending.cl, fix.flag, str(event.port), env)
    rejected = _new_problems(pending.cl, new_cl)
    if event.port is None or rejected:
        why = (f"{rule.id}: no free port for {fix.flag}: {event.detail or 'none found'}"
               if event.port is None else
               f"{rule.id}: SGLang {env.sglang_version or ''} would reject {fix.flag} "
               f"{event.port} ({'; '.join(rejected)})").replace("SGLang  ", "SGLang ")
        done = replace(state, phase="done", pending=None)
        return done, [Journal(base.planned(why)),
                      Journal(GaveUp(reason=why, cause=GiveUpCause.RULE)),
                      Exit(EXIT_GIVE_UP, why)]
    journal = _remediated(pending.cl, new_cl, fix, str(event.port), base=base, env=env)
    status = Notify(status=f"remediated {fix.flag} ({rule.id}): port {event.port}, restarting")
    state = replace(state, before_fix=(pending.cl, fix.flag or ""))
    new, actions = _spawn(state, env, new_cl, rule.reason)
    return new, [journal, status, *actions]


def _new_problems(before: CommandLine, after: CommandLine) -> tuple[str, ...]:
    """What the release's parser would reject in `after` that it did not in `before`."""
    old = {o.problem for o in before.occurrences if o.problem}
    return tuple(dict.fromkeys(o.problem for o in after.occurrences
                               if o.problem and o.problem not in old))


def _refuse_fix(state: State, fix: Fix, line: str, env: Env, rejected: tuple[str, ...]
                ) -> tuple[State, list[Action]]:
    """The fix would give a command line SGLang's parser rejects: try the next one, or give up."""
    why = (f"{fix.rule.id}: SGLang {env.sglang_version or ''} would reject the edited command "
           f"line ({'; '.join(rejected)})").replace("SGLang  ", "SGLang ")
    journal = Journal(FixRefused(rule=fix.rule.id, flag=fix.flag, new_value=fix.new_value,
                                 gen=state.gen, reason=why))
    nxt, _ = first_fix(env.matcher, line, _ctx(state, env), state.fired)
    if nxt is not None and not is_catch_all(nxt.rule):
        new, actions = _apply_fix(state, nxt, line, env)
        return new, [journal, *actions]
    pending = Pending("exit", code=EXIT_GIVE_UP, reason=why, cause=GiveUpCause.RULE)
    new, actions = _stop(state, pending, f"rule {fix.rule.id}")
    return new, [journal, Journal(GiveUpPlanned(rule=fix.rule.id, line=line, gen=state.gen,
                                                reason=why)), *actions]


def _repeat(state: State, rule_id: str, line: str, env: Env, actions: list[Action]
            ) -> tuple[State, list[Action]]:
    """A rule fired again after its fix: restore the last command line that worked, or give up."""
    good = state.last_ready
    if good is not None and good.argv != state.cl.argv:
        journal = Journal(Restored(rule=rule_id, line=line, gen=state.gen,
                                   argv_after=redact_argv(good.argv, env.options),
                                   reason=f"{rule_id} fired again after its fix; restoring the "
                                          "last command line that reached ready"))
        new, more = _stop(state, Pending("restart", cl=good, reason="restore"), f"repeat {rule_id}")
        return new, [*actions, journal, *more]
    reason = (f"{rule_id} fired again after its fix was applied, and no earlier command line "
              "reached ready")
    journal = Journal(GiveUpPlanned(rule=rule_id, line=line, gen=state.gen, reason=reason))
    new, more = _stop(state, Pending("exit", code=EXIT_GIVE_UP, reason=reason,
                                     cause=GiveUpCause.FIX_NOT_HELD), f"repeat {rule_id}")
    return new, [*actions, journal, *more]


def _ready(state: State, env: Env) -> tuple[State, list[Action]]:
    new = replace(state, phase="ready", last_ready=state.cl, before_fix=None)
    return new, [
        Journal(Ready(gen=state.gen, argv=redact_argv(state.cl.argv, env.options))),
        Notify(ready=True, status="ready"),
        Schedule("stable", state.gen, env.restart.stable_after_s),
        *([Schedule("liveness", state.gen, env.health.liveness_interval_s)]
          if env.health.enabled else []),
    ]


def _on_health(state: State, event: HealthResult, env: Env) -> tuple[State, list[Action]]:
    if event.endpoint == "/health" and state.phase == "starting":
        if not event.ok:
            return state, [Schedule("health_retry", state.gen, HEALTH_RETRY_S)]
        return _ready(state, env)
    if event.endpoint == "/health_generate" and state.phase == "ready":
        if event.ok:
            return replace(state, liveness_streak=0), [
                Notify(watchdog=True),
                Schedule("liveness", state.gen, env.health.liveness_interval_s)]
        streak = state.liveness_streak + 1
        journal = Journal(LivenessFailed(gen=state.gen, streak=streak, detail=event.detail))
        if streak < env.health.liveness_failures:
            return replace(state, liveness_streak=streak), [
                journal, Schedule("liveness", state.gen, env.health.liveness_interval_s)]
        pending = Pending("restart", cl=state.cl, failure=True, reason="liveness probe failed")
        new, actions = _stop(replace(state, liveness_streak=streak), pending, "liveness",
                             StopCause.LIVENESS)
        return new, [journal, Notify(status="liveness failed, restarting"), *actions]
    return state, []


def _on_tick(state: State, event: Tick, env: Env) -> tuple[State, list[Action]]:
    name = event.name
    if name == "backoff" and state.phase == "backoff" and state.pending and state.pending.cl:
        return _spawn(state, env, state.pending.cl, "backoff over")
    if name == "health_retry" and state.phase == "starting":
        return state, [Probe(state.gen, "/health")]
    if name == "liveness" and state.phase == "ready":
        return state, [Probe(state.gen, "/health_generate")]
    if name == "stable" and state.phase == "ready":
        # A long healthy run forgives the past: backoff and the rules' fire budgets restart
        # (a crash rule may fire again next week without ending in a give-up).
        return replace(state, attempt=0, fired={}, last_crash=None), [
            Journal(Stable(gen=state.gen))]
    if name == "settle" and state.tentative is not None and state.phase in ("starting", "ready"):
        return _settle(state, env)
    if name == "ready_timeout" and state.phase == "starting" and env.role != "worker":
        pending = Pending("restart", cl=state.cl, failure=True, reason="not ready in time")
        return _stop(state, pending, "ready timeout", StopCause.READY_TIMEOUT)
    return state, []


def _on_exit(state: State, event: ChildExited, env: Env, now: float, jitter: float
             ) -> tuple[State, list[Action]]:
    journal: list[Action] = [Journal(ChildExit(gen=event.gen, pid=event.pid,
                                               returncode=event.returncode))]
    if event.exception_line is not None:  # the launch's last crash line (events.ChildExited)
        state = replace(state, exception_line=event.exception_line)
    if state.tentative is not None and state.phase in ("starting", "ready"):
        state, acts = _settle(state, env)  # the child died before the settle window closed
        journal += [a for a in acts if not isinstance(a, Stop)]
    pending = state.pending
    if pending is not None and pending.kind == "exit":
        if pending.code in (EXIT_GIVE_UP, EXIT_ENVIRONMENT, EXIT_USAGE):  # journaled alike
            journal.append(Journal(GaveUp(reason=pending.reason, cause=pending.cause)))
        return replace(state, phase="done"), [*journal, Exit(pending.code, pending.reason)]
    if pending is None and env.role == "worker":  # the leader counts it and says what next
        return replace(state, phase="held"), [
            *journal, Notify(status="SGLang exited; waiting for the group leader")]
    if pending is not None and pending.port_fix is not None and pending.cl is not None:
        # The old tree is gone: now the shell may look for a port (answer: PortChosen).
        fix = pending.port_fix.fix
        return replace(state, phase="picking"), [
            *journal, PickPort(state.gen, fix.flag or "", _avoid(pending.cl, fix))]
    if pending is not None and not pending.failure and pending.cl is not None:
        new, actions = _spawn(state, env, pending.cl, pending.reason or "fixed")
        return new, [*journal, *actions]
    cl = pending.cl if pending is not None and pending.cl is not None else state.cl
    reason = pending.reason if pending is not None else f"exited with status {event.returncode}"
    return _failure(state, env, cl, reason, now=now, jitter=jitter, journal=journal)


def _failure(state: State, env: Env, cl: CommandLine, reason: str, *, now: float, jitter: float,
             journal: list[Action]) -> tuple[State, list[Action]]:
    cfg = env.restart
    failures = (*failures_in_window(state.failures, now, cfg.window_s), now)
    line = state.exception_line
    crash = (cl.argv, crash_signature(line)) if line is not None else None
    if cfg.give_up_on_repeat and line is not None and crash == state.last_crash:
        why = (f"the same crash twice with the same command line: {line[:500]} "
               "(a third launch cannot change it)")
        done = replace(state, phase="done", failures=failures)
        return done, [*journal, Journal(GaveUp(reason=why, line=line,
                                                cause=GiveUpCause.REPEATED_CRASH)),
                      Exit(EXIT_GIVE_UP, why)]
    state = replace(state, last_crash=crash)
    if len(failures) >= cfg.max_failures:
        why = f"crash loop: {len(failures)} failures within {cfg.window_s:g}s (last: {reason})"
        done = replace(state, phase="done", failures=failures)
        return done, [*journal, Journal(GaveUp(reason=why, cause=GiveUpCause.CRASH_LOOP)),
                      Exit(EXIT_GIVE_UP, why)]
    delay = backoff_delay(state.attempt, initial=cfg.backoff_initial_s, factor=cfg.backoff_factor,
                          maximum=cfg.backoff_max_s, jitter=jitter)
    new = replace(state, phase="backoff", failures=failures, attempt=state.attempt + 1,
                  pending=Pending("restart", cl=cl, failure=True, reason=reason), tentative=None)
    return new, [*journal,
                 Journal(BackingOff(delay_s=round(delay, 3), reason=reason,
                                    failures_in_window=len(failures))),
                 Notify(status=f"crashed ({reason}); restarting in {delay:.1f}s"),
                 Schedule("backoff", state.gen, delay)]


# -- a multi-node group: the leader decides for every node, a worker follows ---------------


def _on_peer(state: State, event: PeerLine | PeerDown, env: Env, now: float
             ) -> tuple[State, list[Action]]:
    """Leader: a worker's line is matched as if it were rank 0's; a lost worker is a failure."""
    if isinstance(event, PeerLine):
        if READY_LINE in event.text:
            return state, []
        line = ChildLine(state.gen, "stderr", event.text, len(event.text))
        new, actions = _on_line(state, line, env, now)
        return new, [Journal(_at_node(a.record, event.rank)) if isinstance(a, Journal) else a
                     for a in actions]
    if state.phase not in ("starting", "ready"):
        return state, []
    journal = Journal(NodeDown(gen=state.gen, node=event.rank, reason=event.reason,
                               stage=event.stage or None))
    pending = Pending("restart", cl=state.cl, failure=True, reason=event.reason)
    new, actions = _stop(state, pending, f"node {event.rank} down")
    return new, [journal, Notify(status=f"node {event.rank} down; restarting the group"),
                 *actions]


def _on_group_order(state: State, event: GroupRelaunch | GroupReady | GroupExit, env: Env
                    ) -> tuple[State, list[Action]]:
    """Worker: relaunch, turn ready or end as the leader says."""
    if isinstance(event, GroupReady):
        return _ready(state, env) if state.phase == "starting" else (state, [])
    if isinstance(event, GroupExit):
        journal = Journal(GroupExited(code=event.code, reason=event.reason))
        pending = Pending("exit", code=event.code, reason=event.reason, cause=event.cause)
        if state.phase in ("starting", "ready", "stopping"):
            new, actions = _stop(state, pending, "group exit")
            return new, [journal, Notify(status="stopping with the group"), *actions]
        return replace(state, phase="done"), [journal, Exit(event.code, event.reason)]
    why = f"group generation {event.group_gen}"
    journal = Journal(GroupRelaunched(group_gen=event.group_gen, cause=dict(event.cause),
                                      argv_after=redact_argv(event.cl.argv, env.options)))
    if state.phase in ("starting", "ready"):
        new, actions = _stop(state, Pending("restart", cl=event.cl, reason=why), "group relaunch")
        return new, [journal, *actions]
    if state.phase == "stopping":
        if state.pending is not None and state.pending.kind == "restart":
            return replace(state, pending=Pending("restart", cl=event.cl, reason=why)), [journal]
        return state, []
    new, actions = _spawn(state, env, event.cl, why)  # held, idle or backoff: launch now
    return new, [journal, *actions]
