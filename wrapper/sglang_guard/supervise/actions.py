"""What the state machine asks the shell to do: small frozen values, carried out in order."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_guard.common.outcomes import JournalEvent, StopCause


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start launch number `gen` of SGLang with these arguments (after the port is free)."""

    gen: int
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the whole process tree of launch `gen` (TERM, grace, KILL); its exit follows."""

    gen: int
    reason: str  # for a person (the journal, the log)
    cause: StopCause | None = None  # for the status board: None for rule, signal, group stops


@dataclass(frozen=True, slots=True)
class Probe:
    """GET `endpoint` on SGLang's HTTP server; the answer comes back as a HealthResult."""

    gen: int
    endpoint: str


@dataclass(frozen=True, slots=True)
class Schedule:
    """Put `Tick(name, gen)` on the queue after `delay` seconds."""

    name: str
    gen: int
    delay: float


@dataclass(frozen=True, slots=True)
class Journal:
    """Append one event to the journal (and log it); every listener hears it."""

    record: JournalEvent


@dataclass(frozen=True, slots=True)
class Notify:
    """Tell systemd (a no-op without NOTIFY_SOCKET)."""

    status: str | None = None
    ready: bool = False
    watchdog: bool = False
    reloading: bool = False


@dataclass(frozen=True, slots=True)
class Reload:
    """Re-read a config file or rule pack (`path` None: everything the guard reads)."""

    kind: str
    path: str | None


@dataclass(frozen=True, slots=True)
class PickPort:
    """Find a TCP port that can be bound now (not one of `avoid`); answer with PortChosen."""

    gen: int
    flag: str
    avoid: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Exit:
    """Leave the loop with this status."""

    code: int
    reason: str


Action = Spawn | Stop | Probe | Schedule | Journal | Notify | Reload | PickPort | Exit
