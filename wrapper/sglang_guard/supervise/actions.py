"""What the state machine asks the shell to do: small frozen values, carried out in order."""

from __future__ import annotations

from sglang_guard.common.outcomes import JournalEvent, StopCause
from sglang_guard.common.record import record


@record
class Spawn:
    """Start launch number `gen` of SGLang with these arguments (after the port is free)."""

    gen: int
    argv: tuple[str, ...]


@record
class Stop:
    """Stop the whole process tree of launch `gen` (TERM, grace, KILL); its exit follows."""

    gen: int
    reason: str  # for a person (the journal, the log)
    cause: StopCause | None = None  # for the status board: None for rule, signal, group stops


@record
class Probe:
    """GET `endpoint` on SGLang's HTTP server; the answer comes back as a HealthResult."""

    gen: int
    endpoint: str


@record
class Schedule:
    """Put `Tick(name, gen)` on the queue after `delay` seconds."""

    name: str
    gen: int
    delay: float


@record
class Journal:
    """Append one event to the journal (and log it); every listener hears it."""

    record: JournalEvent


@record
class Notify:
    """Tell systemd (a no-op without NOTIFY_SOCKET)."""

    status: str | None = None
    ready: bool = False
    watchdog: bool = False
    reloading: bool = False


@record
class Reload:
    """Re-read a config file or rule pack (`path` None: everything the guard reads)."""

    kind: str
    path: str | None


@record
class PickPort:
    """Find a TCP port that can be bound now (not one of `avoid`); answer with PortChosen."""

    gen: int
    flag: str
    avoid: tuple[int, ...] = ()


@record
class Exit:
    """Leave the loop with this status."""

    code: int
    reason: str


Action = Spawn | Stop | Probe | Schedule | Journal | Notify | Reload | PickPort | Exit
