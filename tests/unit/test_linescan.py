"""Issue 24: the traceback tracker's line search in C answers exactly what its regexes answer,
and its walk in C (`advance`) exactly what rules/tracebacks._advance does.

rules/_linescan.c reads each line's head by hand where rules/tracebacks.py's byte regexes
(`_candidates`, searched by `_next_line`) define the answer; the tracker's state over the lines
nobody reads rests on it. Held equal here over every stored log, random line soups of the
pieces each branch of the C reads (names with dots, digits and high bytes, "- " items, CRs,
records with and without their request words, blank runs around the cap), every line start
of each, every kind and several caps. tests/unit/test_reading_paths.py and test_tracebacks.py
run their differential tests on both searches.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_guard.rules import linescan
from sglang_guard.rules import tracebacks as tb
from sglang_guard.rules.logline import clean
from sglang_guard.rules.quick import Quick

DATA = Path(__file__).resolve().parents[1] / "data"
LOGS = sorted((DATA / "sglang-logs").glob("*.log"))
REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference"
KINDS = {linescan.FRAMES: "frames", linescan.MESSAGE: "message", linescan.BLANK: "blank"}
CAPS = (1, 3, 8, 4096, 65536)

needs_c = pytest.mark.skipif(
    not linescan.compiled and os.environ.get("SGLANG_GUARD_REQUIRE_NATIVE") != "1",
    reason="the C line search is not built here (no C compiler at install)")


def by_regex(block: bytes, start: int, end: int, kind: int, cap: int) -> int:
    """The answer the C must give: the regexes' own."""
    return tb._next_line(getattr(tb._candidates(cap), KINDS[kind]), block, start, end)


def line_starts(block: bytes) -> list[int]:
    return [0, *(i + 1 for i in range(len(block) - 1) if block[i] == 10)]


def agree(block: bytes, caps: tuple[int, ...] = CAPS) -> None:
    """From every line start to the block's end, and to each later line's end, every kind
    and cap: the same line."""
    assert linescan.first_line is not None
    starts = line_starts(block)
    ends = [i + 1 for i in range(len(block)) if block[i] == 10]
    for start in starts:
        for end in {len(block), *(e for e in ends[:: max(1, len(ends) // 4)] if e > start)}:
            for kind, name in KINDS.items():
                for cap in caps:
                    want = by_regex(block, start, end, kind, cap)
                    got = linescan.first_line(block, start, end, kind, cap)
                    assert got == want, (block[start:end][:300], start, end, name, cap)


PIECES = [
    b"ValueError", b"ValueError: x", b"torch.cuda.OutOfMemoryError: CUDA", b"a.B", b"a.Bc",
    b"Ab", b"AB", b"A1b", b"A_b", b"AB_c", b"A\xc3\xa9b", b"\xc3\x89a", b"_x.Foo", b"1x.Foo",
    b"x..Foo", b".Foo", b"Foo.", b"- ", b"- ImportError: y", b"-ImportError", b"  File \"x\"",
    b"\r", b"\r\r", b":", b" ", b"\t", b"\x0b", b"\x1c", b"\xc2\xa0", b"\xe3\x80\x80", b"\xc2",
    b"[2026-11-29 16:50:52] ", b"[2026-11-29 16:50:52 TP0] ", b"[2026-", b"[2026-11-29 16:50:52",
    b"[2026-11-29 16:50:52 TP0", b"[0000-", b"[202x-", b"] {\"evens", b"[202-", b"[20x6-",
    b"] Receive: obj=", b"] Finish: obj", b"] Finish:", b"] {\"event\": 1}", b"] {\"ev", b"]",
    b"Receive", b"Traceback (most recent call last):", b"x", b"Error", b"CUDAError: e", b"\x00",
    b"\x1b[31m", b"\xff", b"\x80",
]


def soup(rng: random.Random, lines: int, pieces: list[bytes] = PIECES,
         headers: float = 0.0) -> bytes:
    """`lines` lines: a tenth blank runs, a share `headers` traceback headers, the rest 1-4
    random pieces each."""
    out = []
    for _ in range(lines):
        roll = rng.random()
        if roll < 0.1:
            out.append(rng.choice([b" " * rng.choice([2, 3, 7, 8, 9]), b"", b"\t\r", b"\x1c"]))
        elif roll < 0.1 + headers:
            out.append(tb.HEADER.encode())
        else:
            out.append(b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))))
    return b"\n".join(out) + b"\n"


def windows(log: Path, size: int) -> list[bytes]:
    """The log (its last line given a newline) in windows of `size` lines."""
    raw = log.read_bytes()
    raw = raw if raw.endswith(b"\n") else raw + b"\n"
    lines = raw.splitlines(keepends=True)
    return [b"".join(lines[at:at + size]) for at in range(0, len(lines), size)]


@needs_c
@pytest.mark.parametrize("log", [*LOGS, *sorted(REFERENCE.glob("*.log"))],
                         ids=lambda p: p.name)
def test_the_c_search_answers_as_the_regexes_on_every_stored_log(log: Path) -> None:
    for window in windows(log, 40):  # every start in each
        agree(window, caps=(8, 4096))


@needs_c
@pytest.mark.parametrize("seed", range(200))
def test_the_c_search_answers_as_the_regexes_on_random_line_soups(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a reproducible soup, not a secret
    agree(soup(rng, rng.randint(1, 12)))


HEADS = [b"[2026-11-29 16:50:52", b"[2026-11-29 16:50:52 TP0", b"[2026-", b"[202x-", b"[20260",
         b"(2026-", b"- [2026-"]
TAILS = [b"] Receive: x", b"] Receiv", b"] Finish: x", b"] Finish:x", b"] {\"event\": 1}",
         b"] {\"evens", b"]Receive", b"\n] Receive", b"x] Receive", b"] ] Receive", b""]


@needs_c
def test_every_record_head_with_every_request_word() -> None:
    agree(b"".join(head + tail + b"\n" for head in HEADS for tail in TAILS), caps=(8,))


@needs_c
def test_a_blank_run_as_long_as_the_cap_is_taken_whatever_follows() -> None:
    assert linescan.first_line is not None
    for cap in (1, 4, 4096):
        for run in (cap - 1, cap, cap + 1):
            block = b"x\n" + b" " * max(run, 0) + b"text\n"
            assert linescan.first_line(block, 0, len(block), linescan.BLANK, cap) == \
                by_regex(block, 0, len(block), linescan.BLANK, cap) == (2 if run >= cap else -1)


@needs_c
def test_a_long_span_is_searched_without_the_gil_and_answers_the_same() -> None:
    assert linescan.first_line is not None
    frames = b'  File "x.py", line 1, in f\n    f()\n' * 20_000  # past RELEASE_GIL_AT
    block = frames + b"RuntimeError: boom\n" + frames
    want = len(frames)
    assert linescan.first_line(block, 0, len(block), linescan.FRAMES, 65536) == want
    assert by_regex(block, 0, len(block), linescan.FRAMES, 65536) == want
    assert linescan.first_line(frames, 0, len(frames), linescan.FRAMES, 65536) == -1


@needs_c
@pytest.mark.parametrize("args", [(b"x\n", 0, 3, 0, 8), (b"x\n", 1, 1, 0, 8),
                                  (b"x\n", -1, 2, 0, 8), (b"x\n", 0, 2, 3, 8),
                                  (b"x\n", 0, 2, 0, 0)])
def test_out_of_range_arguments_are_refused_not_read(args: tuple[bytes, int, int, int, int]
                                                     ) -> None:
    assert linescan.first_line is not None
    with pytest.raises(ValueError, match="first_line"):
        linescan.first_line(*args)


def test_the_c_search_is_built_where_it_is_required() -> None:
    """CI (.ci/run) sets SGLANG_GUARD_REQUIRE_NATIVE=1: a build that silently fell back to
    the regexes fails here instead of only running slower."""
    if os.environ.get("SGLANG_GUARD_REQUIRE_NATIVE") == "1":
        assert linescan.compiled and linescan.first_line is not None
        assert linescan.advance is not None
    probe = "from sglang_guard.rules import linescan; print(linescan.compiled)"
    pure = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, env={**os.environ, "SGLANG_GUARD_PURE": "1"})
    assert pure.stdout.strip() == "False"


# --- the vector loops: every width, over spans past 64 bytes ---------------------------------
# rules/_linescan.c's `search` reads 64 bytes at a time into masks of byte classes and visits
# only the lines they cannot turn away (a run of spaces that ends at a printable byte, a
# printable first byte no branch starts with); first_line's `widest` forces each loop (3
# AVX-512BW, 2 AVX2, where the CPU has them, 0 memchr line by line), each held to the regexes
# over lines built to sit on every side of what the masks read.

WIDTHS = (0, 2, 3)
WIDE_CAPS = (1, 3, 63, 64, 65, 4096)
RUNS = (0, 1, 2, 4, 15, 16, 31, 32, 33, 62, 63, 64, 65, 66, 70, 130)
AFTER_RUN = [b"", b"x", b"File \"x\"", b"^^^", b"\t", b"\x0b", b"\r", b"\x1c", b"\xc2\xa0",
             b"\x80", b"\xe3\x80\x80", b"\x7f", b"\x00", b"\x1b[0m", b"ValueError: x", b"[2026-"]
FIRSTS = [b"ValueError: x", b"- ImportError: y", b"-x", b"_x.Foo", b"a.Bc", b"Ab", b"AB",
          b"\rError", b"\x7fError", b"{venv}/x.py:1: UserWarning", b"/usr/x", b"1x", b"(x)",
          b"~", b"]", b"\tx", b"\x0bx", b"\x1cx", b"\x00x", b"\x1b[0m", b"\xc2\xa0x", b"\x80x",
          b"\xffx", b"Traceback (most recent call last):", b"- ", b"-"]
FILLER = [b"x", b" ", b"] R", b"] Receive", b"]", b"] {\"event", b"] F", b"\t", b"-", b"["]
LENGTHS = (15, 16, 31, 32, 63, 64, 65, 127, 128, 129)


def wide_line(rng: random.Random) -> bytes:
    """A line of the kinds the masks tell apart, often cut or padded to a length about a
    multiple of 16."""
    roll = rng.random()
    if roll < 0.3:
        line = b" " * rng.choice(RUNS) + rng.choice(AFTER_RUN)
    elif roll < 0.55:
        line = rng.choice(HEADS) + rng.choice(TAILS)
    elif roll < 0.65:
        line = b""
    else:
        line = rng.choice(FIRSTS)
    if rng.random() < 0.5:
        size = rng.choice(LENGTHS)
        while len(line) < size:
            line += rng.choice(FILLER)
        line = line[:size]
    return line.replace(b"\n", b"")


def wide_soup(rng: random.Random, lines: int) -> bytes:
    """`lines` wide lines after a random head (no line starts where the span does), the
    last newline sometimes missing."""
    head = b"x" * rng.randint(0, 70) + b"\n" * rng.randint(0, 1)
    block = head + b"\n".join(wide_line(rng) for _ in range(lines))
    return block + (b"\n" if rng.random() < 0.8 else b"")


def spans(block: bytes, rng: random.Random, count: int = 6) -> list[tuple[int, int]]:
    """Random spans: from line starts and from anywhere, to line ends, the block's end and
    anywhere."""
    starts = rng.sample(line_starts(block), min(count, len(line_starts(block))))
    starts += [rng.randrange(len(block)) for _ in range(2)]
    ends = [i + 1 for i in range(len(block)) if block[i] == 10]
    out = []
    for start in starts:
        later = [e for e in ends if e > start]
        for end in {len(block), *rng.sample(later, min(2, len(later))),
                    rng.randint(start + 1, len(block))}:
            out.append((start, end))
    return out


def widths_agree(block: bytes, span_list: list[tuple[int, int]],
                 caps: tuple[int, ...] = WIDE_CAPS) -> None:
    from sglang_guard.rules import _linescan  # noqa: PLC0415 - built here (needs_c)

    for start, end in span_list:
        for kind, name in KINDS.items():
            for cap in caps:
                want = by_regex(block, start, end, kind, cap)
                for widest in WIDTHS:
                    got = _linescan.first_line(block, start, end, kind, cap, widest)
                    assert got == want, (block[start:end][:400], start, end, name, cap, widest)


@needs_c
@pytest.mark.parametrize("seed", range(200))
def test_every_width_answers_as_the_regexes_on_wide_line_soups(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a reproducible soup, not a secret
    block = wide_soup(rng, rng.randint(8, 60))
    widths_agree(block, spans(block, rng))


@needs_c
def test_every_width_reads_a_line_at_every_place_in_the_64_bytes() -> None:
    """Each kind of line, starting at each offset of the first 64 bytes and past them, its
    run of spaces ending on each side of the 64: the four loops and the regexes agree."""
    lines = [b" " * run + after for run in (1, 2, 62, 63, 64, 65) for after in
             (b"x", b"", b"\t", b"\xc2\xa0", b"\r")] + FIRSTS + [head + tail for head in HEADS[:3]
                                                                 for tail in TAILS[:4]]
    for line in lines:
        for offset in (0, 1, 15, 16, 31, 32, 47, 62, 63, 64, 65, 66, 127, 128):
            before = b"#" * max(offset - 1, 0) + b"\n" * (offset > 0)
            block = before + line + b"\n" + b"#" * 70 + b"\n"
            widths_agree(block, [(0, len(block)), (0, len(block) - 71),
                                 (max(offset - 1, 0), len(block))], caps=(1, 63, 64, 65, 4096))


@needs_c
@pytest.mark.parametrize("log", [*LOGS, *sorted(REFERENCE.glob("*.log"))],
                         ids=lambda p: p.name)
def test_every_width_answers_as_the_regexes_on_every_stored_log_whole(log: Path) -> None:
    raw = log.read_bytes()
    block = raw if raw.endswith(b"\n") else raw + b"\n"
    rng = random.Random(log.name)  # noqa: S311 - reproducible spans
    widths_agree(block, spans(block, rng, count=20), caps=(8, 64, 65536))


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_the_c_walk_answers_as_python_on_wide_line_soups(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a reproducible soup, not a secret
    block = wide_soup(rng, rng.randint(8, 30))
    if not block.endswith(b"\n"):
        block += b"\n"
    walks_agree(block, caps=(8, 64, 65536), every=4)


# --- advance: the walk over the lines nobody reads --------------------------------------------
# rules/_linescan.c's `advance` against rules/tracebacks._advance (its definition), from every
# state: the same state and the same exception lines wherever the C answers, and the C
# declining (None) only where a line it would step is not plain ASCII.

def walk_py(state: str, block: bytes, start: int, end: int, cap: int
            ) -> tuple[str, list[tuple[int, int, str]]]:
    found: list[tuple[int, int, str]] = []
    return tb._advance(state, block, (start, end), cap, found), found


def walk_c(state: str, block: bytes, start: int, end: int, cap: int
           ) -> tuple[str, list[tuple[int, int, str]]] | None:
    assert linescan.advance is not None
    done = linescan.advance(tb.STATES.index(state), block, start, end, cap)
    return None if done is None else (tb.STATES[done[0]], done[1])


def _plain(block: bytes, start: int, end: int) -> bool:
    return all(b < 0x80 and b not in (0x1B, 0) for b in block[start:end])


def walks_agree(block: bytes, caps: tuple[int, ...] = (8, 4096, 65536), every: int = 1) -> int:
    """From every `every`-th line start to the block's end and to a few later line ends, from
    every state and cap: the C's answer, where it gives one, is Python's. How many it gave."""
    starts = line_starts(block)
    ends = [i + 1 for i in range(len(block)) if block[i] == 10]
    answered = 0
    for start in starts[::every]:
        for end in {len(block), *(e for e in ends[:: max(1, len(ends) // 3)] if e > start)}:
            for state in tb.STATES:
                for cap in caps:
                    got = walk_c(state, block, start, end, cap)
                    if got is None:
                        assert not _plain(block, start, end), (state, block[start:end][:300])
                        continue
                    answered += 1
                    assert got == walk_py(state, block, start, end, cap), (
                        state, cap, block[start:end][:400])
    return answered


WALK_PIECES = [
    *PIECES,
    b"[2026-11-29 16:50:52.123] ", b"[2026-11-29 16:50:52.1234567890] ", b"[2026-11-29 16:50:52.] ",
    b"[2026-11-29 16:50:52 DP0 TP1 EP0] ", b"[2026-11-29 16:50:52 " + b"x" * 201 + b"] ",
    b"[2026-11-29 16:50:52 " + b"x" * 199 + b"] ", b"[2026-11-29 16:50:52 TP0]x",
    b"[2026-11-29 16:50:52 TP0] ] ", b"Receive: obj='a", b"Receive OpenAI: x", b"Receive:x",
    b"{\"event\": \"request.received\"", b"{\"event\":\"request.x", b"{\"event\":  \"request.",
    b"'", b"\"", b"\\", b"'a\\'b'", b"\"\\\"\"", b"Finish: obj=\"",
    b"Traceback (most recent call last):", b"Traceback (most recent call last): \x1c",
    b"a.b.c.d.e.f.g.h.Error: x", b"a.b.c.d.e.f.g.h.i.Error: x", b"A" * 64 + b"b: x",
    b"A" * 65 + b"b: x", b"Ab" + b"c" * 127, b"Ab" + b"c" * 128, b"x" * 64 + b".Error",
    b"x" * 65 + b".Error", b"Error\r", b"Error \r", b"\x1c\x1d\x1e\x1f", b"\x0b\x0c",
    b"1Error: x", b"- - Error", b"-  Error: x", b"Error:x", b"Error.", b"ValueError\rx",
    # whole request records, their quote open or closed, each spelling of the event
    *(b"[2026-11-29 16:50:52 TP0] " + word + text
      for word in (b"Receive: ", b"Receive OpenAI: ", b"Finish: ", b"Receive:", b"Finish:",
                   b"{\"event\": \"request.received\", ", b"{\"event\":\"request.finished\",",
                   b"{\"event\":  \"request.x\", ", b"{\"event\": \"requests\", ")
      for text in (b"obj='open", b"obj='closed'", b"\"text\": \"open", b"\"t\": \"a\\\"b\"")),
]


@needs_c
@pytest.mark.parametrize("log", [*LOGS, *sorted(REFERENCE.glob("*.log"))],
                         ids=lambda p: p.name)
def test_the_c_walk_answers_as_python_on_every_stored_log(log: Path) -> None:
    answered = sum(walks_agree(window, caps=(8, 65536), every=3) for window in windows(log, 60))
    assert answered  # the C answered somewhere: it is the path the reader takes


@needs_c
@pytest.mark.parametrize("seed", range(300))
def test_the_c_walk_answers_as_python_on_random_line_soups(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a reproducible soup, not a secret
    walks_agree(soup(rng, rng.randint(1, 14), WALK_PIECES, headers=0.15))


@needs_c
def test_the_c_walk_reads_each_record_shape_and_exception_bound_as_python() -> None:
    """Each bound of the record and exception patterns, on both sides of it, as the line that
    a traceback, a message and an unknown start step."""
    answered = 0
    for piece in WALK_PIECES:
        for before in (b"", b"  File \"x\"\n", b"[2026-11-29 16:50:52] Traceback (most recent "
                                               b"call last):\n"):
            block = before + piece + b"\n" + piece + b": y\nnext\n"
            answered += walks_agree(block, caps=(4, 65536))
    assert answered > 1000


@needs_c
def test_the_c_walk_declines_a_line_it_must_step_that_is_not_ascii() -> None:
    assert linescan.advance is not None
    block = b'  File "x"\nValueError: caf\xc3\xa9\nmore\n'
    assert linescan.advance(tb.STATES.index(tb.TRACEBACK), block, 0, len(block), 65536) is None
    assert walk_py(tb.TRACEBACK, block, 0, len(block), 65536) == (
        tb.MESSAGE, [(11, 28, "ValueError: café")])
    # A line it does not step may hold anything: a frame's source line, a progress bar.
    block = b'  File "x"\n    s = "\xe2\x96\x88\x1b[0m"\nValueError: x\n'
    assert walk_c(tb.TRACEBACK, block, 0, len(block), 65536) == walk_py(
        tb.TRACEBACK, block, 0, len(block), 65536)


@needs_c
def test_the_c_walk_finds_a_byte_it_cannot_step_at_every_place_of_a_head() -> None:
    """The head's check (8 bytes at a time, then one at a time): a byte >= 0x80, an ESC or a
    NUL at each place of exception lines of every length around 8 and 16, inside the cap or
    past it."""
    for size in range(1, 26):
        for at in range(size):
            for bad in (b"\x80", b"\xff", b"\x1b", b"\x00", b"\x7f", b"\x1a"):
                line = (b"ValueError:" + b"x" * size)[:11 + size]
                line = line[:11 + at] + bad + line[12 + at:]
                block = b'  File "x"\n' + line + b"\nnext\n"
                for cap in (4, 8, 11, 12, 16, 17, 24, 65536):
                    got = walk_c(tb.TRACEBACK, block, 0, len(block), cap)
                    head = line[:cap]
                    if got is None:
                        assert not tb._plain(head), (line, cap)
                    else:
                        assert tb._plain(head), (line, cap)
                        assert got == walk_py(tb.TRACEBACK, block, 0, len(block), cap)


@needs_c
def test_a_long_span_is_walked_without_the_gil_and_answers_the_same() -> None:
    frames = b'  File "x.py", line 1, in f\n    f()\n' * 5_000  # past RELEASE_GIL_AT
    block = (frames + b"RuntimeError: boom\n\n[2026-11-29 16:50:52] Receive: obj='open\n"
             + frames)
    at = len(frames)
    want = (tb.REQUEST, [(at, at + len(b"RuntimeError: boom"), "RuntimeError: boom")])
    assert walk_c(tb.TRACEBACK, block, 0, len(block), 65536) == want
    assert walk_py(tb.TRACEBACK, block, 0, len(block), 65536) == want


# --- advance with lines to read: the reader's header-only lines, in one call ----------------
# rules/linereader.py hands the walk the lines only a traceback's header hit (`reads`); the C
# steps each where the walk stands. Its definition is tracebacks._advance_reading in Python
# (the walk and the read both in Python here: the C switched off).

def reading_py(state: str, block: bytes, start: int, end: int, cap: int, reads: list[int],
               monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[tuple[int, int, str]]]:
    found: list[tuple[int, int, str]] = []
    with monkeypatch.context() as patched:
        patched.setattr(linescan, "advance", None)
        patched.setattr(linescan, "first_line", None)
        return tb._advance_reading(state, block, (start, end), cap, found, reads=reads), found


def picks(block: bytes, rng: random.Random) -> Iterator[tuple[int, list[int], list[int]]]:
    """A few random line starts of `block`, each with the ends of the lines after it and of
    those among them that end in a traceback's header."""
    ends = [i + 1 for i in range(len(block)) if block[i] == 10]
    for start in rng.sample(line_starts(block), min(4, len(line_starts(block)))):
        later = [e for e in ends if e > start]
        yield start, later, [e for e in later if block[:e - 1].endswith(tb.HEADER.encode())]


def reading_agrees(block: bytes, rng: random.Random, monkeypatch: pytest.MonkeyPatch,
                   caps: tuple[int, ...] = (8, 65536)) -> int:
    """From a few line starts, over random subsets of the later lines as reads (the header
    lines often among them), every state and cap: the C's answer, where it gives one, is the
    definition's. How many it gave."""
    assert linescan.advance is not None
    answered = 0
    for start, later, headers in picks(block, rng):
        for reads in ([], headers, sorted(rng.sample(later, rng.randint(0, len(later)))),
                      sorted({*headers, *rng.sample(later, min(2, len(later)))})):
            for state in tb.STATES:
                for cap in caps:
                    done = linescan.advance(tb.STATES.index(state), block, start, len(block),
                                            cap, reads)
                    if done is None:
                        assert not _plain(block, start, len(block)), (state, reads)
                        continue
                    answered += 1
                    got = (tb.STATES[done[0]], done[1])
                    assert got == reading_py(state, block, start, len(block), cap, reads,
                                             monkeypatch), (state, cap, reads,
                                                            block[start:][:400])
    return answered


@needs_c
def test_a_header_read_on_the_walk_starts_a_traceback_whose_exception_is_found() -> None:
    assert linescan.advance is not None
    block = (b"[2026-11-29 16:50:52] other\n" + tb.HEADER.encode() + b"\n"
             b'  File "x.py", line 1, in f\nValueError: boom\nmore\n')
    header_end = block.index(b"\n", block.index(b"Traceback")) + 1
    at = block.index(b"ValueError")
    assert linescan.advance(tb.STATES.index(tb.OTHER), block, 0, len(block), 65536,
                            [header_end]) == (tb.STATES.index(tb.MESSAGE),
                                              [(at, at + 16, "ValueError: boom")])
    # Walked, not read, the header line leaves the state where the last record put it.
    assert linescan.advance(tb.STATES.index(tb.OTHER), block, 0, len(block), 65536) == (
        tb.STATES.index(tb.OTHER), [])


@needs_c
@pytest.mark.parametrize("reads", [[2], [4, 4], [6, 4], [3], [7], ["x"], [None], 5])
def test_the_walk_refuses_reads_out_of_order_or_off_a_line_end(reads: object) -> None:
    assert linescan.advance is not None
    block = b"a\nb\nc\n"
    with pytest.raises((ValueError, TypeError)):
        linescan.advance(0, block, 2, len(block), 8, reads)


@needs_c
@pytest.mark.parametrize("args", [(5, b"x\n", 0, 2, 8), (-1, b"x\n", 0, 2, 8),
                                  (0, b"x\n", -1, 2, 8), (0, b"x\n", 0, 3, 8),
                                  (0, b"xy", 0, 2, 8), (0, b"x\n", 0, 2, 0)])
def test_the_walk_refuses_arguments_out_of_range(args: tuple[int, bytes, int, int, int]
                                                 ) -> None:
    assert linescan.advance is not None
    with pytest.raises(ValueError, match="advance"):
        linescan.advance(*args)


# --- read_walk: the reader's walk that steps the lines it checks too ------------------------
# rules/linereader.py hands the walk its checked lines (`checks`) besides the header-only ones
# (`reads`); the C steps both where the walk stands and answers each checked line as
# (start, text length, state before, state after, step's own-output answer), up to the first
# checked line whose head is not plain ASCII. Its definition is tracebacks._read_walk (C off).

def read_walk_py(state: str, block: bytes, start: int, cap: int, reads: list[int],
                 checks: list[int], monkeypatch: pytest.MonkeyPatch, quick: Quick | None = None
                 ) -> tuple[str, list[tb.Stepped], list[tuple[int, int, str]]]:
    found: list[tuple[int, int, str]] = []
    with monkeypatch.context() as patched:
        patched.setattr(linescan, "advance", None)
        patched.setattr(linescan, "first_line", None)
        after, steps = tb._read_walk(state, block, (start, len(block)), cap, found,
                                     reads=reads, checks=checks, quick=quick)
    return after, steps, found


# The quick no's literals for the walks below (rules/quick.py): pieces of the soups.
QUICKS = (None, Quick((b"Error", b"ValueError: x", b"'"), (b"Finish",)))


def read_walks_agree(block: bytes, rng: random.Random, monkeypatch: pytest.MonkeyPatch,
                     caps: tuple[int, ...] = (8, 65536)) -> int:
    """From a few line starts, over random splits of random subsets of the later lines into
    reads and checks, every state and cap: the C's answer, where it gives one, is the
    definition's, and it stops early only at a checked line that is not plain. How many
    answers it gave."""
    answered = 0
    for start, later, headers in picks(block, rng):
        for picked in (later, sorted({*headers, *rng.sample(later, rng.randint(0, len(later)))})):
            checks = sorted(e for e in picked if rng.random() < 0.6)
            reads = [e for e in picked if e not in checks]
            for state in tb.STATES:
                for cap in caps:
                    found: list[tuple[int, int, str]] = []
                    quick = rng.choice(QUICKS)
                    done = tb.read_walk(state, block, (start, len(block)), cap, found,
                                        reads=reads, checks=checks, quick=quick)
                    if done is None:
                        assert not _plain(block, start, len(block)), (state, reads, checks)
                        continue
                    want = read_walk_py(state, block, start, cap, reads, checks, monkeypatch,
                                        quick)
                    assert (*done, found) == want, (state, cap, reads, checks, block[start:][:400])
                    steps = done[1]
                    if len(steps) < len(checks):
                        stop = checks[len(steps)]
                        line = block.rfind(b"\n", start, stop - 1) + 1 or start
                        assert not tb._plain(block[line:min(stop - 1, line + cap)])
                    answered += 1
    return answered


# Both walks that read lines on the way, each against its definition.
AGREES = {"advance": reading_agrees, "read_walk": read_walks_agree}


@needs_c
@pytest.mark.parametrize("walk", AGREES)
@pytest.mark.parametrize("seed", range(150))
def test_the_c_walks_read_the_lines_they_are_given_as_python(
        walk: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)  # noqa: S311 - a reproducible soup, not a secret
    assert AGREES[walk](soup(rng, rng.randint(1, 14), WALK_PIECES, headers=0.3), rng,
                        monkeypatch)


@needs_c
@pytest.mark.parametrize("walk", AGREES)
@pytest.mark.parametrize("log", [*LOGS, *sorted(REFERENCE.glob("*.log"))],
                         ids=lambda p: p.name)
def test_the_c_walks_read_the_lines_they_are_given_on_every_stored_log(
        walk: str, log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(log.name)  # noqa: S311 - reproducible picks
    assert sum(AGREES[walk](window, rng, monkeypatch) for window in windows(log, 60))


@needs_c
def test_the_reading_walk_answers_each_checked_line_and_stops_at_one_not_ascii() -> None:
    block = (b"[2026-11-29 16:50:52] x\n" + tb.HEADER.encode() + b"\n"
             b'  File "x.py", line 1\nValueError: boom\n- ImportError: y\nmore\n'
             b"\x1b[33mwarn\x1b[0m \x00y\r\ncaf\xc3\xa9\nlast\n")
    ends = [i + 1 for i in range(len(block)) if block[i] == 10]
    found: list[tuple[int, int, str]] = []
    # the header read; the exception line, the "- " item, "more", the colored line and
    # "café" checked
    done = tb.read_walk(tb.OTHER, block, (0, len(block)), 65536, found, reads=[ends[1]],
                        checks=[ends[3], ends[4], ends[5], ends[6], ends[7]])
    at = block.index(b"ValueError")
    item = block.index(b"- Import")
    more = block.index(b"more")
    colored = block.index(b"\x1b[33m")
    assert done == (tb.MESSAGE, [(at, 16, tb.TRACEBACK, tb.MESSAGE, True, None),
                                 (item, 16, tb.MESSAGE, tb.MESSAGE, True, None),
                                 (more, 4, tb.MESSAGE, tb.MESSAGE, False, None),
                                 (colored, 6, tb.MESSAGE, tb.MESSAGE, False, "warn y")])
    assert found == [(at, at + 16, "ValueError: boom")]


# Pieces of escape sequences and their near misses (logline._ANSI's three alternatives, each
# bound of each class, cut short, nested, at the end) and the text around them.
ESCAPE_PIECES = [
    b"\x1b", b"\x1b[", b"\x1b[0m", b"\x1b[1;31m", b"\x1b[38;5;196m", b"\x1b[?25l", b"\x1b[ @",
    b"\x1b[0;", b"\x1b[/", b"\x1b[0/~", b"\x1b[\x7f", b"\x1b[\x00m", b"\x1b]0;title\x07",
    b"\x1b]8;;http://x\x1b\\", b"\x1b]", b"\x1b]x\x1b", b"\x1b]x\x1bq", b"\x1b(B", b"\x1b#8",
    b"\x1b ", b"\x1b /", b"\x1b/0", b"\x1b~", b"\x1b\x7f", b"\x1b\x1f", b"\x1bc", b"\x1b\x1b[m",
    b"\x00", b"\x00\x00", b"\r", b"\r\r", b" ", b"x", b"ValueError: y", b"[", b"]", b"m", b";",
    b"\x07", b"\\", b"\t", b"0", b"@", b"~",
]


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_the_reading_walk_cleans_a_colored_line_as_logline_clean(seed: int) -> None:
    """A checked line whose ASCII head holds an ESC or a NUL comes back with its text as
    rules/logline.clean makes it (the definition), for caps that cut it anywhere."""
    rng = random.Random(seed)  # noqa: S311 - reproducible lines, not a secret
    answered = 0
    for _ in range(200):
        line = b"".join(rng.choice(ESCAPE_PIECES) for _ in range(rng.randint(1, 12)))
        block = line + b"\n"
        for cap in (1, 2, 3, 5, 8, 13, 65536):
            head = line[:cap]
            done = tb.read_walk(tb.OTHER, block, (0, len(block)), cap, [], reads=[],
                                checks=[len(block)])
            assert done is not None
            (step,) = done[1]
            want = clean(head, cap)
            if tb._plain(head):
                assert step[1] == len(want) and step[5] is None
            else:
                assert step[5] == want, (line, cap)
                assert step[1] == len(want)
                answered += 1
    assert answered > 500


@needs_c
@pytest.mark.parametrize("state", [tb.TRACEBACK, tb.MESSAGE])
def test_the_reading_walk_leaves_a_colored_exception_line_that_ends_frames_to_the_reader(
        state: str) -> None:
    """The exception line that ends a traceback is the reader's to keep (its ticket): in
    color, the walk stops at it as at a line not ASCII; a colored frame or message line it
    steps."""
    block = (b'  File "x.py", line 1\n\x1b[31m  x = 1\x1b[0m\n'
             b"\x1b[1;31mValueError: boom\x1b[0m\nafter\n")
    ends = [i + 1 for i in range(len(block)) if block[i] == 10]
    done = tb.read_walk(state, block, (0, len(block)), 65536, [], reads=[],
                        checks=ends[1:])
    assert done is not None
    after, steps = done
    if state == tb.TRACEBACK:  # the frame line stepped, cleaned; the exception line left
        assert after == tb.TRACEBACK
        assert steps == [(ends[0], 7, tb.TRACEBACK, tb.TRACEBACK, False, "  x = 1")]
    else:  # in a message, an exception-shaped line is its next line: stepped
        assert [s[5] for s in steps] == ["  x = 1", "ValueError: boom", None]


@needs_c
@pytest.mark.parametrize(("reads", "checks"), [([2], [2]), ([4], [6, 4]), ([], [3]),
                                               ([], ["x"]), ([], 5)])
def test_the_reading_walk_refuses_checks_out_of_order_off_a_line_end_or_also_read(
        reads: object, checks: object) -> None:
    assert linescan.read_walk is not None
    block = b"a\nb\nc\n"
    with pytest.raises((ValueError, TypeError)):
        linescan.read_walk(0, block, 0, len(block), 8, reads, checks)
