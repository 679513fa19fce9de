"""What `run` says about a preflight decision besides its findings: the warnings `check` shows."""

from __future__ import annotations

from sglang_guard.common.shell.logsetup import get_logger
from sglang_guard.preflight.preflight import Decision


def log_warnings(decision: Decision) -> None:
    """One `preflight.warning` event per warning (unresolvable hub id, no NVML, parse problems)."""
    log = get_logger()
    for warning in decision.warnings:
        log.warning("preflight.warning", warning=warning)
