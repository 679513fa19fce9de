"""Issue 24: the traceback tracker's line search in C answers exactly what its regexes answer.

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
from pathlib import Path

import pytest

from sglang_guard.rules import linescan
from sglang_guard.rules import tracebacks as tb

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


def soup(rng: random.Random, lines: int) -> bytes:
    out = []
    for _ in range(lines):
        if rng.random() < 0.1:
            out.append(rng.choice([b" " * rng.choice([2, 3, 7, 8, 9]), b"", b"\t\r"]))
        else:
            out.append(b"".join(rng.choice(PIECES) for _ in range(rng.randint(1, 4))))
    return b"\n".join(out) + b"\n"


@needs_c
@pytest.mark.parametrize("log", [*LOGS, *sorted(REFERENCE.glob("*.log"))],
                         ids=lambda p: p.name)
def test_the_c_search_answers_as_the_regexes_on_every_stored_log(log: Path) -> None:
    raw = log.read_bytes()
    raw = raw if raw.endswith(b"\n") else raw + b"\n"
    lines = raw.splitlines(keepends=True)
    for at in range(0, len(lines), 40):  # windows of 40 lines: every start in each
        agree(b"".join(lines[at:at + 40]), caps=(8, 4096))


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
    probe = "from sglang_guard.rules import linescan; print(linescan.compiled)"
    pure = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, env={**os.environ, "SGLANG_GUARD_PURE": "1"})
    assert pure.stdout.strip() == "False"
