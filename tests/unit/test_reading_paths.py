"""Issues 20 and 24: the reader's lines decide what a full per-line pass decides.

The same bytes go through the reader's line reader (rules/linereader.py) with the
supervisor's own per-line scan and filter (supervise/shell/supervisor.Supervisor._scan/_keep) on
Hyperscan+RE2, on RE2 alone, and with no scan at all (every line read), and the lines it
emits through the supervisor's machine (supervise/replay.py): the fix must be the same, over every
stored real log and mutations of it (CRLF line ends, ANSI colours, an invalid UTF-8 byte, a
NUL, chunk splits at every offset of the fatal line, a 10 MB line before it, random
chunkings, a fatal traceback at a random place in a flood). Line by line, the reader emits
exactly the lines of an independent per-line pass (split, clean, rules/tracebacks.step) that
the machine acts on (a line `_keep` keeps), and keeps that pass's last exception line that
ended a traceback (what the child's exit event carries). And `explain`'s CLI path (the
matching lines only) gives that fix.
"""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from requestlines import FATAL_TEXTS, TS, quoting
from sglang_guard.config.guardconfig import GuardConfig
from sglang_guard.preflight.shell.inputs import read_command_line
from sglang_guard.rules import tracebacks
from sglang_guard.rules.linereader import Line, LineReader
from sglang_guard.rules.logline import LINE_CAP, clean
from sglang_guard.rules.rules import Fix, Matcher, in_phase, load_default_packs
from sglang_guard.rules.shell.explain import explain_fix, explain_lines, matching_lines
from sglang_guard.rules.stages import READY_LINE
from sglang_guard.sglang.argv import CommandLine
from sglang_guard.sglang.releases import load_option_table
from sglang_guard.supervise.replay import Replay, env_for
from sglang_guard.supervise.shell import child
from sglang_guard.supervise.shell.supervisor import Supervisor
from support.storedlogs import STORED, reader, reader_side

# Every test here runs on both of the tracker's line searches (C and regex: conftest.py).
pytestmark = pytest.mark.usefixtures("both_searches")

PACKS = load_default_packs()
FAST = Matcher(PACKS)
SLOW = Matcher(PACKS, accelerate=False)
OPTIONS = load_option_table()


def read_all(chunks: list[bytes], matcher: Matcher | None) -> tuple[list[Line], str | None]:
    """The lines the reader emits for these chunks (None: no scan, every line), and the
    last exception line it kept."""
    lines = reader(matcher)
    got = [line for i, chunk in enumerate(chunks) for line in fed(lines, chunk, i)]
    return got + lines.close(), lines.last_exception


def fed(lines: LineReader, chunk: bytes, i: int) -> list[Line]:
    """`chunk` fed as the pumps feed it (scanned first, the scan's hits and ESC/NUL lines
    handed on: supervise/shell/child.py) every other chunk, scanned inside `feed` else."""
    return lines.feed(chunk, lines.scan(chunk)) if i % 2 else lines.feed(chunk)


def read(chunks: list[bytes], matcher: Matcher | None) -> list[Line]:
    """The lines the reader emits for these chunks; its last exception line must be the
    per-line pass's."""
    got, last = read_all(chunks, matcher)
    assert last == last_exception(b"".join(chunks))
    return got


def per_line(data: bytes) -> list[Line]:
    """An independent full pass: every line, split, cleaned and tracked one by one."""
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    state, out = tracebacks.UNKNOWN, []
    for raw in parts:
        text = clean(raw[:LINE_CAP], LINE_CAP)
        before = state
        state, ends = tracebacks.step(before, text)
        out.append(Line(text, len(raw), ends, tracebacks.ends_frames(before, state)))
    return out


def acting(data: bytes, matcher: Matcher) -> list[Line]:
    """Of the per-line pass, the lines the machine acts on: what the reader must emit."""
    live = reader_side(matcher)
    return [ln for ln in per_line(data) if Supervisor._keep(live, ln)]


def last_exception(data: bytes) -> str | None:
    """The per-line pass's last exception line that ends a traceback (None: none)."""
    return next((ln.text for ln in reversed(per_line(data)) if ln.exception), None)


def decide(lines: list[Line], cl: CommandLine) -> tuple[Any, ...] | None:
    run = Replay(env_for(FAST, OPTIONS, sglang_version="0.5.23"), cl)
    for line in lines:
        run.feed(line.text, line.ends, read=False, exception=line.exception)
        if run.done:
            break
    return _key(run.finish())


def _key(fix: Fix | None) -> tuple[Any, ...] | None:
    return None if fix is None else (fix.rule.id, fix.action, fix.flag, fix.new_value)


def three_ways(chunks: list[bytes], cl: CommandLine) -> set[tuple[Any, ...] | None]:
    """The fixes of the reader on Hyperscan+RE2, on RE2 and reading every line, and of the
    independent per-line pass; the two scanning readers also line for line."""
    data = b"".join(chunks)
    want = acting(data, FAST)
    for matcher in (FAST, SLOW):
        assert read(chunks, matcher) == want
    return {decide(read(chunks, m), cl) for m in (FAST, SLOW, None)} | {
        decide(per_line(data), cl)}


def _fatal(data: bytes, cl: CommandLine) -> tuple[int, int] | None:
    """Where the line that decides the fix is (start, end), read every line."""
    lines = per_line(data)
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
def test_an_exception_line_no_rule_matches_is_kept_for_the_exit(matcher: Matcher) -> None:
    """Read in its own chunk after the header's: the machine compares crash lines (issue 19
    item 6), so the line that ends a traceback is kept whatever the prefilter says -- as
    the reader's last exception (the exit event carries it), not as a line event."""
    header = (b"[2026-11-29 16:50:40 TP0] Init torch distributed begin.\n"
              b"Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n")
    crash = b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
    later = b"Traceback (most recent call last):\n  File \"y.py\"\nKeyError: 'x'\n"
    for chunks in ([header, crash], [header + crash], [header[:50], header[50:], crash]):
        assert read_all(chunks, matcher) == ([], crash.decode().rstrip("\n")), chunks
        assert read_all([*chunks, later], matcher) == ([], "KeyError: 'x'")


def _chunkings(data: bytes, rng: random.Random) -> list[bytes]:
    """`data` cut at random offsets: many small pieces, a few large, any byte a boundary."""
    cuts, at = [], 0
    while at < len(data):
        at += rng.choice((1, 2, 7, 64, 300, 4096, 65536, child.READ_CHUNK))
        cuts.append(min(at, len(data)))
    return [data[a:b] for a, b in zip([0, *cuts], cuts, strict=False) if b > a]


@pytest.mark.parametrize("name", STORED)
def test_random_chunkings_read_exactly_the_acting_lines(name: str) -> None:
    """A property over chunkings (seeded, 12 per log and mutation): whatever the chunk
    boundaries, the reader emits exactly the per-line pass's acting lines, and the fix."""
    data, argv, _ = STORED[name]
    cl = read_command_line(argv, OPTIONS)
    rng = random.Random(name)  # noqa: S311 - test data, not secrets
    for kind, mutated in {"as is": data, **_mutations(data)}.items():
        want = acting(mutated, FAST)
        fix = decide(per_line(mutated), cl)
        for _ in range(12):
            chunks = _chunkings(mutated, rng)
            got = read(chunks, FAST)
            assert got == want, (kind, [len(c) for c in chunks][:20])
            assert decide(got, cl) == fix, kind


FLOOD_LINE = (b"[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 512, "
              b"#cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0\n")
FLOOD_FATAL = (b"[2026-01-01 00:00:00] Scheduler hit an exception: Traceback (most recent call "
               b"last):\n  File \"scheduler.py\", line 1, in run_scheduler_process\n"
               b"ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90. Please use "
               b"`--attention-backend flashinfer`.\n")


@pytest.mark.parametrize("seed", range(8))
def test_a_fatal_traceback_anywhere_in_a_flood_costs_its_own_lines(seed: int) -> None:
    """The bench's flood (bench/compare/floodchild.py) with the fatal traceback at a random
    line of ~2 MB of records, read in random chunks: the reader emits the crash banner (a
    catch-all rule reads it) and the exception line, no line of the flood, and the machine
    decides the FA3 fix."""
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    before, after = rng.randrange(0, 15000), rng.randrange(0, 3000)
    data = FLOOD_LINE * before + FLOOD_FATAL + FLOOD_LINE * after
    cl = read_command_line(["--model-path", "/m", "--attention-backend", "fa3"], OPTIONS)
    for matcher in (FAST, SLOW):
        got = read(_chunkings(data, rng), matcher)
        assert got == acting(data, matcher)
        fatal = FLOOD_FATAL.decode().splitlines()
        assert [ln.text for ln in got] == [fatal[0], fatal[-1]]
        fix = decide(got, cl)
        assert fix is not None and fix[0] == "fa3-requires-sm80-sm90", fix


def _soup(rng: random.Random) -> bytes:
    """A random stream of every kind of line the tracker tells apart (records, requests with
    open quotes and their continuations, tracebacks, exception lines, `- ` items, blank and
    Unicode-blank lines, quoted fatal text), dressed at random (CRLF, ANSI, NUL, a bad byte,
    a head past the cap), starting anywhere."""
    fatal = rng.choice(FATAL_TEXTS)
    kinds = [
        lambda: FLOOD_LINE.rstrip(b"\n").decode(),
        lambda: f"{TS} {fatal}",
        lambda: f"{TS} Receive: obj=GenerateReqInput(rid='x', text='{fatal}",  # open quote
        lambda: f"{TS} Receive: obj=GenerateReqInput(rid='x', text={fatal!r})",
        lambda: f"{TS} Receive: obj=GenerateReqInput(rid='x', text='tell me",  # open, no hit
        lambda: f'{TS} {{"event": "request.finished", "out": "and so',
        lambda: f"{TS} Finish: obj=GenerateReqInput(rid='x'), out={{'text': 'ok'}}",
        lambda: fatal,
        lambda: f"- {fatal}",
        lambda: rng.choice(quoting(fatal)),
        lambda: tracebacks.HEADER,
        lambda: f"{TS} Scheduler hit an exception: {tracebacks.HEADER}",
        lambda: '  File "scheduler.py", line 1, in run',
        lambda: "    raise ValueError(msg)",
        lambda: rng.choice(("", "   ", "\u00a0", "\x1c", "\u3000 ", "\t")),
        lambda: "INFO:     127.0.0.1:5000 - \"POST /generate HTTP/1.1\" 200 OK",
        lambda: "Loading safetensors checkpoint shards:  50% Completed | 1/2",
        lambda: f"[2026-11-29 16:50:4 TP0] not quite a record {fatal}",
    ]
    out = []
    for _ in range(rng.randrange(1, 60)):
        line = rng.choice(kinds)().encode()
        dress = rng.random()
        if dress < 0.05:
            line = b"\x1b[31m" + line + b"\x1b[0m"
        elif dress < 0.08:
            line = line[:3] + b"\x00" + line[3:]
        elif dress < 0.11:
            line = line[:1] + b"\xff" + line[1:]
        elif dress < 0.13:
            line = b" " * (LINE_CAP + rng.randrange(-2, 3)) + line
        elif dress < 0.15:
            line = line + b"\r"
        out.append(line)
    return b"\n".join(out) + rng.choice((b"\n", b""))


@pytest.mark.parametrize("seed", range(40))
def test_random_line_soups_read_exactly_the_acting_lines(seed: int) -> None:
    """The property over the whole space, not only the stored logs: for random streams of
    every line kind (`_soup`), in random chunks, on both engines, the reader emits exactly
    the acting lines of the per-line pass, in order."""
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    for _ in range(25):
        data = _soup(rng)
        want = acting(data, FAST)
        for matcher in (FAST, SLOW):
            assert read(_chunkings(data, rng), matcher) == want, data[:400]


def _subsequence(small: list[Line], big: list[Line]) -> bool:
    """Whether `small` is `big` with some lines left out, in order."""
    rest = iter(big)
    return all(any(line == other for other in rest) for line in small)


@pytest.mark.parametrize("seed", range(20))
def test_past_the_start_the_reader_keeps_every_line_a_running_rule_reads(seed: int) -> None:
    """Past the start the chunk's scan names running-phase rules only (Matcher.line_scan),
    and the reader's check asks only those (Line.maybe): over random line soups in random
    chunks, on both engines, it emits every line of the per-line pass that a running-phase
    rule reads (or the ready line), and no line that no rule reads: what the machine acts
    on past the start (rules/rules.acting filters by phase) is all there, in order."""
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    read = 0
    for _ in range(25):
        data = _soup(rng)
        lines = per_line(data)
        every = acting(data, FAST)  # read by any rule, any phase
        running = [ln for ln in lines if READY_LINE in ln.text or any(
            in_phase(r, "running") for r in FAST.candidates(ln.text, ln.ends))]
        for matcher in (FAST, SLOW):
            live = reader_side(matcher, "running")
            reader = LineReader(LINE_CAP, Supervisor._scan(live),
                                lambda line, live=live: Supervisor._keep(live, line),
                                quick=lambda hits, live=live: Supervisor._quick(live, hits))
            chunks = _chunkings(data, rng)
            got = [line for i, chunk in enumerate(chunks) for line in fed(reader, chunk, i)]
            got += reader.close()
            assert _subsequence(running, got), data[:400]
            assert _subsequence(got, every), data[:400]
            assert reader.last_exception == last_exception(data)
        read += len(running)
    assert read > 25  # the soups hold lines that running-phase rules read


def test_a_chunk_scanned_before_a_reload_is_checked_whole_by_the_new_pack() -> None:
    """The scan numbers the rules of the matcher that scanned (Hits.by); a reload between a
    chunk's scan and its lines' check swaps the matcher, whose numbers differ (here the same
    rules in the other order). The check then asks the new matcher of the whole line: what
    `_keep` answers is `bool(new.candidates(...))` for every stored line, never the old
    numbers read against the new pack's rules."""
    old = Matcher(PACKS)
    new = Matcher(tuple(reversed(PACKS)))
    old.prepare_scan()
    new.prepare_scan()
    assert [r.id for r in old.rules] != [r.id for r in new.rules]
    scanned = reader_side(old)
    checked = reader_side(new)
    reader = LineReader(LINE_CAP, Supervisor._scan(scanned),
                        lambda line: Supervisor._keep(checked, line),
                        quick=lambda hits: Supervisor._quick(checked, hits))
    data = b"".join(STORED[name][0] for name in sorted(STORED))
    rng = random.Random(7)  # noqa: S311 - test data, not secrets
    got = [line for i, chunk in enumerate(_chunkings(data, rng))
           for line in fed(reader, chunk, i)]
    got += reader.close()
    want = [ln for ln in per_line(data) if Supervisor._keep(checked, ln)]
    assert got == want
    assert any(new.candidates(ln.text, ln.ends) for ln in got)
