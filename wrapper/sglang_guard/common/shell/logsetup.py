"""The guard's own log lines: event names with key-values, JSON off a TTY, console on one.

The guard's own events go to stderr; the child's lines are passed through raw, never wrapped.

A small logger of the guard's own rather than structlog: structlog imports asyncio (and with
it ssl, concurrent.futures, selectors) whichever of its features is used, ~12 MiB of RSS in a
supervisor that otherwise has no use for them (bench/README.md, memory). The lines are what
structlog printed with the processors the guard configured (add_log_level, an ISO UTC
TimeStamper, the redaction below, JSONRenderer or ConsoleRenderer): JSON objects with the
call's key-values, then `event`, `level` and `timestamp`; on a TTY `timestamp [level] event
key=value ...` with the keys sorted.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
from typing import Any, TextIO

from sglang_guard.common.shell import stderrgate
from sglang_guard.sglang.redact import redact_record

DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
_LEVELS = {"debug": DEBUG, "info": INFO, "warning": WARNING, "error": ERROR}
_COLOURS = {"debug": "\033[32m", "info": "\033[32m", "warning": "\033[33m", "error": "\033[31m"}


class _Config:
    """What `configure` set: one per process, read by every logger at each call."""

    def __init__(self) -> None:
        self.stream: TextIO | None = None  # None: the stderr gate, made on first use
        self.json = True
        self.colours = False
        self.level = INFO
        self.lock = threading.Lock()


_config = _Config()


def configure(fmt: str = "auto", stream: TextIO | None = None, level: int = INFO) -> None:
    """Set up logging for the whole process (`fmt`: auto, json or console)."""
    stream = stream or stderrgate.guard_stderr()  # never inside a line of SGLang's stderr
    # The rule: JSON whenever stdout is not a TTY (a unit, a pipe, a container log).
    _config.json = fmt == "json" or (fmt == "auto" and not _isatty(sys.stdout))
    _config.colours = not _config.json and colors(stream)
    _config.stream = stream
    _config.level = level


def colors(stream: TextIO) -> bool:
    """Colour on a terminal, unless $NO_COLOR is set to anything but "" (no-color.org)."""
    return not os.environ.get("NO_COLOR") and _isatty(stream)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def render(event: str, level: str, values: dict[str, Any], *, as_json: bool,
           colours: bool = False, now: datetime.datetime | None = None) -> str:
    """One log line (no newline); every value masked as the journal masks it."""
    record = redact_record({**values, "event": event, "level": level,
                            "timestamp": _stamp(now)})
    if as_json:
        return json.dumps(record, default=repr)
    stamp, shown = record.pop("timestamp"), record.pop("event")
    record.pop("level")
    tag = f"[{level:<9}]"
    if colours:
        tag = f"{_COLOURS.get(level, '')}{tag}\033[0m"
    pairs = " ".join(f"{k}={v!r}" for k, v in sorted(record.items()))
    return f"{stamp} {tag} {shown:<30} {pairs}".rstrip()


def _stamp(now: datetime.datetime | None) -> str:
    now = now or datetime.datetime.now(tz=datetime.UTC)
    return now.isoformat().replace("+00:00", "Z")


class Logger:
    """`log.info("event.name", key=value, ...)`, as structlog's bound loggers were called."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _emit(self, level: str, event: str, values: dict[str, Any]) -> None:
        if _LEVELS[level] < _config.level:
            return
        line = render(event, level, values, as_json=_config.json, colours=_config.colours)
        with _config.lock:
            stream = _config.stream = _config.stream or stderrgate.guard_stderr()
            stream.write(line + "\n")
            stream.flush()

    def debug(self, event: str, **values: Any) -> None:
        """Log at debug level (dropped at the default level)."""
        self._emit("debug", event, values)

    def info(self, event: str, **values: Any) -> None:
        """Log at info level."""
        self._emit("info", event, values)

    def warning(self, event: str, **values: Any) -> None:
        """Log at warning level."""
        self._emit("warning", event, values)

    def error(self, event: str, **values: Any) -> None:
        """Log at error level."""
        self._emit("error", event, values)


def get_logger(name: str = "sglang_guard") -> Logger:
    """A logger (they share the process's configuration)."""
    return Logger(name)
