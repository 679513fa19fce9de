"""Issue 20 item 6, the live-replay tier: every stored real log, printed by a fake SGLang as it
would appear live, ends in the journal with the rule `explain` names for that log.

The real SGLang logs (tests/data/sglang-logs) are printed as captured. A corpus excerpt
(tests/data/realworld) gets what a live server prints around it: start-up records first, a
traceback's header before an exception line the excerpt shows bare, and the parent's
follow-up record after it. Timing is bursty as SGLang's is: lines of one second go out in
one burst; a gap the records show is kept on the side of the catch-all's settle window it
falls (under it: 0.2 s; at or over it: just over it), so the live decision and `explain`'s
replayed clock see the same order of events.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.config.guardconfig import GuardConfig
from sglang_guard.rules.logline import LINE_CAP, clean, is_exception_line
from sglang_guard.rules.rules import Matcher, load_default_packs
from sglang_guard.rules.shell.explain import explain_fix
from sglang_guard.rules.tracebacks import HEADER
from sglang_guard.supervise import machine
from support.harness import HealthServer, Launcher, journal_events, make_runtime, supervise

DATA = Path(__file__).resolve().parents[1] / "data"
MATCHER = Matcher(load_default_packs())
DECIDED = ("remediated", "crash.detected", "give_up.planned")
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
TS = "2026-11-29 16:50:40"
FRAME = '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1, in run'


def _stored(path: Path, port: int) -> tuple[list[str], list[str], str | None, bool]:
    """(lines as stored, argv, release, whether the lines are a whole captured log)."""
    if path.suffix == ".toml":
        entry = tomllib.loads(path.read_text(encoding="utf-8"))
        argv = [str(port) if a == "30000" else a for a in entry["argv"]]
        version = entry.get("sglang", "").split(" ")[0] or None
        if version is not None and not re.fullmatch(r"\d+(?:\.\d+)*(?:\.post\d+)?", version):
            version = None
        return entry["log"]["text"].splitlines(), argv, version, False
    text = path.read_text(encoding="utf-8").replace("{port}", str(port))
    head = [ln for ln in text.splitlines() if ln.startswith("# ")]
    body = [ln for ln in text.splitlines() if not ln.startswith("# ")]
    command = next(ln[len("# command: "):] for ln in head if ln.startswith("# command: "))
    argv = shlex.split(command.replace("{model}", "/models/fake"))
    return body, argv[argv.index("sglang.launch_server") + 1:], "0.5.23", True


def _live(lines: list[str], whole: bool) -> list[str]:
    """What a live server prints around a stored excerpt."""
    if whole:
        return lines
    first = next((m[1] for ln in lines if (m := _STAMP.search(ln))), TS)
    out = [f"[{first}] server_args=ServerArgs(model_path='/models/fake')",
           f"[{first} TP0] Init torch distributed begin.",
           f"[{first} TP0] Load weight begin. avail mem=79.10 GB"]
    header = any(HEADER in ln for ln in lines)
    for line in lines:
        text = clean(line.encode(), LINE_CAP)
        if not header and is_exception_line(text) and any(
                r.fatal for r in MATCHER.candidates(text, True)):
            out += ["Traceback (most recent call last):", FRAME]
            header = True
        out.append(line)
    last = next((m[1] for ln in reversed(lines) if (m := _STAMP.search(ln))), first)
    return [*out, f"[{last}] Received sigquit from a child process. It usually means the "
                  "child failed."]


def _script(lines: list[str]) -> list[list[Any]]:
    steps: list[list[Any]] = []
    seen: float | None = None
    hot = False  # a rule has matched: gaps now decide against the settle window
    for line in lines:
        found = _STAMP.search(line[:40])
        if found is not None:
            at = datetime.fromisoformat(found[1]).timestamp()
            gap = 0.0 if seen is None else at - seen
            seen = at if seen is None else max(seen, at)
            if gap > 0:
                steps.append(["sleep", (2.5 if gap >= machine.SETTLE_S else 0.2) if hot
                              else 0.01])
        steps.append(["print", "stderr", line])
        hot = hot or bool(MATCHER.candidates(clean(line.encode(), LINE_CAP)))
    return [*steps, ["sleep", 0.3], ["exit", 1]]


def _local(argv: list[str]) -> list[str]:
    """The thread's --host made this machine's loopback: the port check binds it (the health
    server is on 127.0.0.2, so a wildcard host would find the port taken)."""
    return ["127.0.0.1" if i and argv[i - 1] == "--host"
            else "--host=127.0.0.1" if arg.startswith("--host=") else arg
            for i, arg in enumerate(argv)]


LOGS = [*sorted((DATA / "sglang-logs").glob("*.log")), *sorted((DATA / "realworld").glob("*.toml"))]


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_the_journal_shows_the_rule_explain_names(path: Path, tmp_path: Path) -> None:
    with HealthServer() as server:
        lines, argv, version, whole = _stored(path, server.port)
        if "--port" not in argv:
            argv = [*argv, "--port", str(server.port)]
        argv = _local(argv)
        fix = explain_fix([clean(ln.encode(), LINE_CAP) for ln in lines], GuardConfig(), argv,
                          sglang_version=version, matcher=MATCHER)
        launcher = Launcher(tmp_path, [_script(_live(lines, whole)), [["exit", 1]]])
        rt = make_runtime(tmp_path, launcher, max_failures=1)
        rt = replace(rt, env=replace(rt.env, matcher=MATCHER, sglang_version=version))
        supervise(rt, argv)
    decided = [r for r in journal_events(tmp_path / "state") if r["event"] in DECIDED]
    got = decided[0]["rule"] if decided else None
    assert got == (fix.rule.id if fix is not None else None), decided[:1]
