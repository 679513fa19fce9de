"""The stored real logs (tests/data/sglang-logs, realworld) and the supervisor's line reader
as its pipes read them: what tests of the reading path replay."""

from __future__ import annotations

import queue
import shlex
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_guard.rules.linereader import LineReader
from sglang_guard.rules.logline import LINE_CAP
from sglang_guard.rules.rules import Matcher
from sglang_guard.supervise.shell.supervisor import Supervisor

DATA = Path(__file__).resolve().parents[1] / "data"


def _log(path: Path) -> tuple[bytes, list[str], str | None]:
    """A stored log: its bytes as SGLang printed them, its argv, and the rule it expects."""
    if path.suffix == ".toml":
        entry = tomllib.loads(path.read_text(encoding="utf-8"))
        return entry["log"]["text"].encode(), list(entry["argv"]), None
    raw = path.read_bytes()
    head = [ln for ln in raw.splitlines() if ln.startswith(b"# ")]
    body = b"".join(ln + b"\n" for ln in raw.splitlines() if not ln.startswith(b"# "))
    command = next(ln[10:].decode() for ln in head if ln.startswith(b"# command: "))
    argv = shlex.split(command.replace("{model}", "/m").replace("{port}", "30000"))
    argv = argv[argv.index("sglang.launch_server") + 1:]
    expect = next((ln[15:].decode() for ln in head if ln.startswith(b"# expect-rule: ")), None)
    return body, argv, expect


LOGS = [*sorted((DATA / "sglang-logs").glob("*.log")), *sorted((DATA / "realworld").glob("*.toml"))]
STORED = {p.stem: _log(p) for p in LOGS}


def reader_side(matcher: Matcher, phase: str = "starting") -> Any:
    """What the supervisor's reader side reads with (only `state`, `rt.env`, `events`)."""
    return SimpleNamespace(state=SimpleNamespace(phase=phase),
                           rt=SimpleNamespace(env=SimpleNamespace(matcher=matcher)),
                           events=queue.Queue())


def reader(matcher: Matcher | None, phase: str = "starting") -> LineReader:
    """The supervisor's line reader for one stream (None: no scan, every line)."""
    if matcher is None:
        return LineReader(LINE_CAP)
    sup = reader_side(matcher, phase)
    return LineReader(LINE_CAP, Supervisor._scan(sup),
                      lambda line: Supervisor._keep(sup, line),
                      quick=lambda hits: Supervisor._quick(sup, hits))
