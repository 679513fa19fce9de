"""structlog, configured once: event names with key-values, JSON off a TTY, console on one.

The guard's own events go to stderr; the child's lines are passed through raw, never wrapped.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

# structlog's dev module imports `rich` when it happens to be installed (another package's
# dependency), only for pretty tracebacks the guard never prints; that import alone costs the
# long-lived supervisor ~6 MiB of RSS. Marking it absent makes structlog use its plain
# formatter. It affects this process only, never SGLang.
sys.modules.setdefault("rich", None)  # type: ignore[arg-type]

import structlog  # noqa: E402 - must follow the line above

from sglang_guard.core.redact import redact_record  # noqa: E402 - after the rich marker
from sglang_guard.shell import stderrgate  # noqa: E402 - after the rich marker


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Mask secrets in every value (nested too) before it is rendered, as the journal does."""
    event.update(redact_record(event))
    return event


def configure(fmt: str = "auto", stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Set up structlog for the whole process (`fmt`: auto, json or console)."""
    stream = stream or stderrgate.guard_stderr()  # never inside a line of SGLang's stderr
    # The rule: JSON whenever stdout is not a TTY (a unit, a pipe, a container log).
    use_json = fmt == "json" or (fmt == "auto" and not _isatty(sys.stdout))
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=colors(stream))
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def colors(stream: TextIO) -> bool:
    """Colour on a terminal, unless $NO_COLOR is set to anything but "" (no-color.org)."""
    return not os.environ.get("NO_COLOR") and _isatty(stream)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def get_logger(name: str = "sglang_guard") -> Any:
    """A bound structlog logger."""
    return structlog.get_logger(name)
