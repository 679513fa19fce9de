"""The events the supervision loop consumes: small frozen values put on one queue.

Producers (reader threads, the health prober, signal handlers, file watchers, timers) only
put events; the loop alone decides and acts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from sglang_guard.common.outcomes import GiveUpCause
from sglang_guard.common.record import record

if TYPE_CHECKING:
    from sglang_guard.sglang.argv import CommandLine

Stream = Literal["stdout", "stderr"]


@record
class ChildLine:
    """One line the child wrote, cleaned for matching (ANSI stripped, head only)."""

    gen: int  # which launch of the child (1, 2, ...): late lines of a stopped child are ignored
    stream: Stream
    text: str
    length: int  # the raw line's full length in bytes
    # Whether an exception-shaped line ends a traceback (rules/tracebacks.py): False, it is
    # no error output; None, not known (a line from elsewhere than a child's pipe).
    ends_traceback: bool | None = None
    # The exception line that ends a traceback (not any line read): a crash's own line, the
    # one two launches are compared by (supervise/machine.py, give_up_on_repeat).
    exception: bool = False


@record
class ChildOutput:
    """The child wrote a chunk while starting: progress evidence for the stall watch."""

    gen: int
    stream: Stream
    tail: str  # the chunk's last line (or redrawn progress-bar state), cleaned
    bar: bool  # the chunk redrew a progress bar (a carriage return)


@record
class ChildStage:
    """While starting, the child printed a stage marker (rules/stages.MARKERS)."""

    gen: int
    stage: str


@record
class ChildExited:
    """The child process was reaped."""

    gen: int
    pid: int
    returncode: int  # as subprocess reports it: negative for a signal
    # The last exception line that ended a traceback in this launch's output, on either
    # stream (rules/linereader.LineReader.last_exception): the crash's own line, the one two
    # launches are compared by (supervise/machine.py, give_up_on_repeat). The reader keeps
    # it rather than sending each such line as a ChildLine: a log full of tracebacks costs
    # no event per traceback. None: none was read (or not known: a replay's lines carry it).
    exception_line: str | None = None


@record
class HealthResult:
    """One probe of SGLang's HTTP health endpoints."""

    gen: int
    endpoint: str  # "/health" or "/health_generate"
    ok: bool
    detail: str


@record
class Tick:
    """A timer fired (`name` says which: "backoff", "stable", "liveness", "ready_timeout")."""

    name: str
    gen: int


@record
class SignalReceived:
    """A signal the guard handles (SIGTERM, SIGINT, SIGHUP) was caught."""

    signum: int


@record
class FileChanged:
    """A watched file settled after a change (debounced)."""

    path: str
    kind: Literal["guard_config", "sglang_yaml", "rule_pack"]


@record
class CommandChanged:
    """A reload changed the effective SGLang command line: restart SGLang with `cl`, once."""

    cl: CommandLine
    reason: str


# -- a multi-node group (group/group.py, group/shell/group.py) -------------------------------------


@record
class PeerLine:
    """Leader: a worker's SGLang wrote a line a rule may match, in group generation `gen`."""

    gen: int
    rank: int
    text: str


@record
class PeerDown:
    """Leader: a worker's SGLang or guard is gone (or never came up) in generation `gen`."""

    gen: int
    rank: int
    reason: str
    stage: str | None = None  # the start-up stage the group is stuck in, when known


@record
class GroupRelaunch:
    """Worker: the leader launched generation `group_gen`; relaunch with `cl`."""

    group_gen: int
    cl: CommandLine
    cause: Mapping[str, Any]  # the leader's journaled decision behind it (empty: none)


@record
class GroupReady:
    """Worker: the leader confirmed generation `group_gen` ready (its ready line and /health)."""

    group_gen: int


@record
class GroupExit:
    """Worker: end as the group ends (the leader exited, or was lost), for this cause (the
    leader's own give-up cause; `refused`: its launch cannot run here)."""

    code: int
    reason: str
    cause: GiveUpCause


@record
class PortChosen:
    """The shell's answer to PickPort: a port free now (None: none found, `detail` says why)."""

    gen: int
    flag: str
    port: int | None
    detail: str = ""


@record
class JobDone:
    """A slow step the loop handed to a job (supervise/shell/jobs.py) has finished: the loop takes
    its
    result and carries on where it left off; the machine never sees this event."""

    job: int  # the job's number, as `Jobs.start` gave it


Event = (ChildLine | ChildOutput | ChildStage | ChildExited | HealthResult | Tick
         | SignalReceived | FileChanged | CommandChanged | PeerLine | PeerDown | GroupRelaunch
         | GroupReady | GroupExit | PortChosen | JobDone)
