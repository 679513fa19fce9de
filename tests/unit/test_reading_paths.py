"""Issue 20 item 5: the fallback path equals the fast path, and the CLI's path equals both.

The same bytes go through the reader's own line cutter (shell/child._Pump) behind the block
prefilter on Hyperscan+RE2, behind the prefilter on RE2 alone, and with no prefilter at all
(every line read), and the lines it emits through the supervisor's machine (core/replay.py):
the fix must be the same, over every stored real log and mutations of it (CRLF line ends,
ANSI colours, an invalid UTF-8 byte, a NUL, chunk splits at every offset of the fatal line,
a 10 MB line before it). And `explain`'s CLI path (the matching lines only) gives that fix.
"""

from __future__ import annotations

import io
import re
import shlex
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.core.argv import CommandLine
from sglang_guard.core.guardconfig import GuardConfig
from sglang_guard.core.logline import LINE_CAP, clean, clean_block
from sglang_guard.core.releases import load_option_table
from sglang_guard.core.replay import Replay, env_for
from sglang_guard.core.rules import Fix, Matcher, load_default_packs
from sglang_guard.shell import child
from sglang_guard.shell.explain import explain_fix, explain_lines, matching_lines
from sglang_guard.shell.inputs import read_command_line

DATA = Path(__file__).resolve().parents[1] / "data"
PACKS = load_default_packs()
FAST = Matcher(PACKS)
SLOW = Matcher(PACKS, accelerate=False)
OPTIONS = load_option_table()


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


def _prefilter(matcher: Matcher) -> Callable[[bytes], int]:
    """The supervisor's per-chunk question (shell/supervisor.Supervisor._prefilter)."""
    def interesting(block: bytes) -> int:
        found = matcher.scan(clean_block(block))
        if found.rule or found.ready:
            return child.LINES
        return child.HEADER if found.traceback else child.SKIP
    return interesting


def read(chunks: list[bytes], matcher: Matcher | None) -> list[tuple[str, bool]]:
    """The lines the reader emits for these chunks (None: no prefilter, every line)."""
    lines: list[tuple[str, bool]] = []
    pump = child._Pump(pipe=io.BytesIO(), stream="stderr", gen=1, sink=io.BytesIO(),
                       emit=lambda _s, text, _n, ends, _x: lines.append((text, ends)),
                       cap=LINE_CAP, budget=1 << 30,
                       prefilter=_prefilter(matcher) if matcher is not None else None)
    for chunk in chunks:
        pump._cut(chunk)
    if pump._head or pump._length:
        pump._line()
    return lines


def decide(lines: list[tuple[str, bool]], cl: CommandLine) -> tuple[Any, ...] | None:
    run = Replay(env_for(FAST, OPTIONS, sglang_version="0.5.23"), cl)
    for text, ends in lines:
        run.feed(text, ends, read=False)
        if run.done:
            break
    return _key(run.finish())


def _key(fix: Fix | None) -> tuple[Any, ...] | None:
    return None if fix is None else (fix.rule.id, fix.action, fix.flag, fix.new_value)


def three_ways(chunks: list[bytes], cl: CommandLine) -> set[tuple[Any, ...] | None]:
    return {decide(read(chunks, m), cl) for m in (FAST, SLOW, None)}


def _fatal(data: bytes, cl: CommandLine) -> tuple[int, int] | None:
    """Where the line that decides the fix is (start, end), read every line."""
    lines = read([data], None)
    want = decide(lines, cl)
    if want is None:
        return None
    offset = 0
    for raw in data.split(b"\n"):
        text = clean(raw, LINE_CAP)
        if any(r.id == want[0] for r in FAST.candidates(text, True)):
            return offset, offset + len(raw)
        offset += len(raw) + 1
    return None


# An invalid byte goes after a record's prefix and an exception's class: before the message.
_PREFIX = re.compile(rb"^((?:\[[^\]\n]*\] )?(?:[\w.]+: )?)")


def _mutations(data: bytes) -> dict[str, bytes]:
    lines = data.split(b"\n")
    return {
        "crlf": data.replace(b"\n", b"\r\n"),
        "ansi": b"\n".join(b"\x1b[31m" + ln + b"\x1b[0m" if ln else ln for ln in lines),
        "utf8": b"\n".join(_PREFIX.sub(lambda m: m[1] + b"\xff", ln) if ln else ln
                           for ln in lines),
        "nul": b"\n".join(ln[:1] + b"\x00" + ln[1:] if ln else ln for ln in lines),
    }


@pytest.mark.parametrize("name", STORED)
def test_every_path_gives_the_same_fix(name: str) -> None:
    data, argv, expect = STORED[name]
    cl = read_command_line(argv, OPTIONS)
    (want,) = three_ways([data], cl)
    if expect is not None:  # a real SGLang log names the rule it must give
        assert want is not None and want[0] == expect, want
    for kind, mutated in _mutations(data).items():
        got = three_ways([mutated], cl)
        assert len(got) == 1, (kind, got)  # the three paths agree
        if kind != "utf8":  # an invalid byte before a message may change what it says
            assert got == {want}, kind


# The real SGLang logs (every offset of a long argparse line costs seconds: those two stay out).
SPLIT = [n for n, (data, _, expect) in STORED.items() if expect is not None and len(data) < 30000]


@pytest.mark.parametrize("name", SPLIT)
def test_a_chunk_split_at_every_offset_of_the_fatal_line_changes_nothing(name: str) -> None:
    data, argv, _ = STORED[name]
    cl = read_command_line(argv, OPTIONS)
    (want,) = three_ways([data], cl)
    where = _fatal(data, cl)
    if where is None:
        pytest.skip("no line decides a fix in this log")
    start, end = where
    for cut in range(start, end + 2):
        assert three_ways([data[:cut], data[cut:]], cl) == {want}, cut


def test_a_10mb_line_before_the_fatal_line_changes_nothing() -> None:
    data, argv, expect = STORED["llama-fa3"]
    cl = read_command_line(argv, OPTIONS)
    start, _ = _fatal(data, cl) or (0, 0)
    huge = data[:start] + b"y" * (10 << 20) + b"\n" + data[start:]
    chunks = [huge[i:i + child.READ_CHUNK] for i in range(0, len(huge), child.READ_CHUNK)]
    got = three_ways(chunks, cl)
    assert len(got) == 1 and next(iter(got)) is not None
    assert next(iter(got))[0] == expect  # type: ignore[index]


@pytest.mark.parametrize("name", STORED)
def test_explain_cli_path_names_what_the_live_reader_decides(name: str) -> None:
    """The CLI keeps only the matching lines; replayed, they give the same fix."""
    data, argv, _ = STORED[name]
    cl = read_command_line(argv, OPTIONS)
    live = decide(read([data], FAST), cl)
    lines = [clean(raw, LINE_CAP) for raw in data.splitlines()]
    matches = explain_lines(lines, GuardConfig(), FAST)
    assert _key(explain_fix(matching_lines(matches), GuardConfig(), argv,
                            sglang_version="0.5.23", matcher=FAST)) == live


@pytest.mark.parametrize("matcher", [FAST, SLOW], ids=["hyperscan", "re2"])
def test_an_exception_line_no_rule_matches_still_reaches_the_machine(matcher: Matcher) -> None:
    """Read in its own chunk after the header's: the machine compares crash lines (issue 19
    item 6), so the line that ends a traceback is emitted whatever the prefilter says."""
    header = (b"[2026-11-29 16:50:40 TP0] Init torch distributed begin.\n"
              b"Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n")
    crash = b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
    for chunks in ([header, crash], [header + crash], [header[:50], header[50:], crash]):
        lines = read(chunks, matcher)
        assert (crash.decode().rstrip("\n"), True) in lines, chunks
