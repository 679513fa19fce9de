"""Issue 24: the quick no (rules/quick.py) turns away only lines the exact check turns away.

Three things must hold: the C (rules/_linescan.c `may_keep`, asked on the reader's walk) answers
as the definition (`quick.may_keep`) over line soups built from every piece error_text's
regexes and QUOTE_LEAD read (bounds at and past each limit, quotes open and closed,
backslashes, a literal at every kind of place); the definition's no is the supervisor's
`keeps`'s no, over every stored log, the near-miss lines the pass-through bench quotes, and
random soups; and a line reader with the quick no emits exactly what one without it does,
its last exception line too, while asking `keep` of far fewer lines.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest

from requestlines import FATAL_TEXTS, TS, quoting
from sglang_guard.rules import linescan
from sglang_guard.rules import tracebacks as tb
from sglang_guard.rules.linereader import Line, LineReader
from sglang_guard.rules.logline import LINE_CAP, clean
from sglang_guard.rules.quick import Quick, may_keep, outside_quotes
from sglang_guard.rules.rules import Matcher, load_default_packs
from sglang_guard.rules.stages import READY_LINE
from sglang_guard.supervise.shell.supervisor import keeps, quick_for
from support.storedlogs import STORED

DATA = Path(__file__).resolve().parents[1] / "data"
MATCHER = Matcher(load_default_packs())
MATCHER.prepare_scan()
RUNNING = MATCHER.line_scan(b"x\n", False).quick

needs_c = pytest.mark.skipif(linescan.read_walk is None, reason="the C walk is not built here")


def test_the_default_pack_past_the_start_has_a_quick_no() -> None:
    """Past the start the default pack's scan is plain literals (rules/blockscan.literal), so
    its hits carry the quick no; while starting (Hyperscan, every rule) they carry none."""
    assert RUNNING is not None and MATCHER.line_scan(b"x\n", False).by is MATCHER
    assert RUNNING.fatal and READY_LINE.encode() in RUNNING.present
    assert MATCHER.line_scan(b"x\n", True).quick is None


# --- the C answers as the definition ----------------------------------------------------------

FATAL = [lit.decode() for lit in RUNNING.fatal] if RUNNING else ["Scheduler hit an exception"]
PIECES = [
    *FATAL, *(f[:5] for f in FATAL), "x", " ", "  ", "\t", "\x1c", "\x0b", ":", ": ", "|", "| ",
    "'", '"', "\\", "\\'", '\\"', "'a'", '"a"', "'it''s'", "\\\\", "=", "(", ")", "obj=",
    TS + " ", "[2026-11-29 16:50:40.123 TP0] ", "[2026-11-29 16:50:40", "ERROR:", "ERROR: ",
    "ERROR:" + " " * 16, "ERROR:" + " " * 17, "ERROR:\t", "CRITICAL:  ", "CRITICAL:", "WARNING: ",
    "svc  | ", "svc" + " " * 16 + "| ", "svc" + " " * 17 + "| ", "a" * 64 + " | ",
    "a" * 65 + " | ", "a.b-c_d | ", "svc|", " | ",
    "launch_server.py: error: ", "sglang serve: error: ", "a b c: error: ", "x" * 128 + ": error: ",
    "x" * 129 + ": error: ", "x: error:", "x:error: ", ": error: ", "x y" + "z" * 127 + ": error: ",
    "ValueError: ", "torch.OutOfMemoryError: ", "- ImportError: ", "Receive: obj=", "Finish: ",
    READY_LINE, READY_LINE[:10],
]


def line_soup(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 7)))


def quick_sets(rng: random.Random) -> list[Quick]:
    """The default pack's, and random ones: literals that hold quotes, backslashes, spaces."""
    found = [RUNNING] if RUNNING else []
    alphabet = ["a", "x", " ", "'", '"', "\\", ":", "|", "E", "ERROR:"]
    for _ in range(3):
        fatal = tuple({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))).encode()
                       for _ in range(rng.randint(1, 4))})
        present = tuple({rng.choice(alphabet).encode() + b"#" for _ in range(rng.randint(0, 2))})
        found.append(Quick(fatal, present))
    return found


def c_answer(text: str, state: str, quick: Quick) -> tuple[bool, bool]:
    """What the C walk answers for `text` as a checked line after `state`: (whether it may
    be kept, step's own-output answer)."""
    block = text.encode() + b"\n"
    done = tb.read_walk(state, block, (0, len(block)), LINE_CAP, [], reads=[],
                        checks=[len(block)], quick=quick)
    assert done is not None
    (_, size, _, _, own, cleaned), = done[1]
    assert cleaned is None  # a plain line: its text is the block's
    return size >= 0, own


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_the_c_answers_as_the_definition_on_line_soups(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - reproducible test data
    quicks = quick_sets(rng)
    kept = turned = 0
    for _ in range(300):
        text = line_soup(rng).rstrip("\r")
        for state in (tb.OTHER, tb.REQUEST, tb.TRACEBACK, tb.MESSAGE):
            for quick in quicks:
                got, own = c_answer(text, state, quick)
                assert got == may_keep(text, own, quick), (text, state, own, quick)
                kept += got
                turned += not got
    assert kept and turned


@needs_c
@pytest.mark.parametrize("name", sorted(STORED))
def test_the_c_answers_as_the_definition_on_every_stored_log_line(name: str) -> None:
    assert RUNNING is not None
    lines = [clean(raw, LINE_CAP) for raw in STORED[name][0].splitlines()]
    for text in (t for t in lines if t.isascii() and "\x1b" not in t and "\x00" not in t):
        for state in (tb.OTHER, tb.REQUEST):
            got, own = c_answer(text, state, RUNNING)
            assert got == may_keep(text, own, RUNNING), text


def test_the_places_outside_quotes_are_where_the_lead_can_end() -> None:
    raw = b"a'b\\'c'd\\\"e\"f'g"
    assert list(outside_quotes(raw, 0)) == [0, 1, 7, 8, 10, 11]  # the last quote never closes
    assert list(outside_quotes(b"x\\", 0)) == [0, 1]
    assert list(outside_quotes(b"ab'c'd", 2)) == [2, 5]


@pytest.mark.parametrize(("text", "own", "kept"), [
    (f"{TS} Scheduler hit an exception: boom", False, True),  # a plain record's message
    (f"{TS} x Scheduler hit an exception: boom", False, False),  # ... not at its start
    (f"{TS} ERROR:    x Scheduler hit an exception", False, True),  # error level: anywhere
    (f"{TS} ERROR:    x 'Scheduler hit an exception'", False, False),  # ... but in quotes
    (f"{TS} ERROR:    'a\\'b' Scheduler hit an exception", False, True),  # past a string
    (f"{TS} ERROR:    \"a 'Scheduler hit an exception", False, False),  # inside an open one
    ("x 'Scheduler hit an exception'", True, False),
    ("x \\'Scheduler hit an exception", True, True),  # an escaped quote opens nothing
    ("x Scheduler hit an exception", False, False),  # not SGLang's own: no error text
    ("svc  | Scheduler hit an exception", True, True),
    ("prog: error: x Scheduler hit an exception", False, True),  # argparse's line
    (f"{TS} Receive: obj={READY_LINE!r}", False, True),  # the ready line, anywhere
])
def test_each_kind_of_place_is_read_as_the_check_reads_it(text: str, own: bool,
                                                           kept: bool) -> None:
    quick = Quick((b"Scheduler hit an exception",), (READY_LINE.encode(),))
    assert may_keep(text, own, quick) is kept
    if linescan.read_walk is not None:
        block = text.encode() + b"\n"
        state = tb.OTHER if own else tb.REQUEST
        done = tb.read_walk(state, block, (0, len(block)), LINE_CAP, [], reads=[],
                            checks=[len(block)], quick=quick)
        assert done is not None and (done[1][0][1] >= 0) is kept and done[1][0][4] is own


# --- the definition's no is the check's no -----------------------------------------------------

def near_misses() -> list[str]:
    logs = sorted((DATA / "sglang-logs").glob("*.log"))
    frames = [ln.decode("utf-8", "replace") for src in logs for ln in src.read_bytes().splitlines()
              if ln.startswith((b"  ", b"\t")) or b"Warning: " in ln]
    return [q for text in FATAL_TEXTS for q in quoting(text)] + frames


def check_says(text: str, ends: bool) -> bool:
    maybe = tuple(MATCHER.line_scan(text.encode() + b"\n", False).rules.get(  # type: ignore[union-attr]
        len(text.encode()) + 1, ()))
    return keeps(MATCHER, Line(text, len(text), ends, False, maybe, MATCHER))


@pytest.mark.parametrize("seed", range(10))
def test_a_line_the_quick_no_turns_away_the_check_turns_away(seed: int) -> None:
    assert RUNNING is not None
    rng = random.Random(seed)  # noqa: S311 - reproducible test data
    texts = [t for t in near_misses() if t.isascii()]
    texts += [clean(raw, LINE_CAP) for name in sorted(STORED)
              for raw in STORED[name][0].splitlines()]
    texts += [line_soup(rng) for _ in range(3000)]
    texts += [f"{TS} ERROR:    " + t for t in rng.sample(FATAL_TEXTS, 20)]
    turned = 0
    for text in (t for t in texts if t.isascii() and "\x1b" not in t and "\x00" not in t):
        for ends in (False, True):
            if not may_keep(text, ends, RUNNING):
                turned += 1
                assert not check_says(text, ends), (text, ends)
    assert turned > 1000


# --- the reader with it emits what the reader without it does ----------------------------------

def feed_all(data: bytes, seed: int, quick: bool) -> tuple[list[Line], str | None, int]:
    """The lines a running-phase reader emits for `data` cut into random chunks (`seed`),
    half of them scanned first as the pumps do, its last exception line, and how many lines
    it asked `keep` of."""
    rng = random.Random(seed)  # noqa: S311 - reproducible chunkings
    asked = [0]

    def keep(line: Line) -> bool:
        asked[0] += 1
        return keeps(MATCHER, line)

    reader = LineReader(LINE_CAP, functools.partial(MATCHER.line_scan, starting=False), keep,
                        quick=functools.partial(quick_for, MATCHER) if quick else None)
    out: list[Line] = []
    at = 0
    while at < len(data):
        size = rng.choice([7, 300, 4096, 65536, 262144])
        chunk = data[at:at + size]
        out += reader.feed(chunk, reader.scan(chunk) if rng.random() < 0.5 else None)
        at += size
    return out + reader.close(), reader.last_exception, asked[0]


@pytest.mark.parametrize("seed", range(6))
def test_the_reader_emits_the_same_lines_with_the_quick_no(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - reproducible test data
    lines = [ln.encode() for ln in near_misses()]
    lines += [raw for name in sorted(STORED) for raw in STORED[name][0].splitlines()]
    rng.shuffle(lines)
    data = b"\n".join(lines) + b"\n"
    first, other = rng.randrange(1 << 30), rng.randrange(1 << 30)
    with_quick = feed_all(data, first, True)
    without = feed_all(data, first, False)
    assert with_quick[:2] == without[:2]
    assert with_quick[0]  # the stored logs' fatal lines are there
    if linescan.read_walk is not None:
        assert with_quick[2] * 2 < without[2], (with_quick[2], without[2])
    # other chunkings, the same lines
    assert feed_all(data, other, True)[:2] == with_quick[:2]


def test_a_chunk_scanned_by_another_matcher_is_not_turned_away() -> None:
    other = Matcher(load_default_packs())
    other.prepare_scan()
    hits = other.line_scan(b"x\n", False)
    assert quick_for(MATCHER, hits) is None
    assert quick_for(other, hits) is hits.quick is not None


@needs_c
@pytest.mark.parametrize("quick", [(b"x",), ((b"",), ()), ((b"x",) * 17, ()), "xy",
                                   ((b"x",), (1,))])
def test_the_walk_refuses_quick_literals_it_cannot_read(quick: object) -> None:
    assert linescan.read_walk is not None
    with pytest.raises((ValueError, TypeError)):
        linescan.read_walk(0, b"a\n", 0, 2, 8, [], [2], quick)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fatal", "present"), [((b"",), ()), ((b"a\nb",), ()),
                                                ((b"x",) * 17, ()), ((), ("é".encode(),))])
def test_a_quick_no_holds_only_literals_the_c_reads(fatal: tuple[bytes, ...],
                                                    present: tuple[bytes, ...]) -> None:
    with pytest.raises(ValueError, match="at most 16"):
        Quick(fatal, present)
