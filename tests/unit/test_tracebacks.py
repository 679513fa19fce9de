"""Which exception lines end a traceback (rules/tracebacks.py), line by line and advanced over."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_guard.rules import tracebacks as tb
from sglang_guard.rules.linereader import Hits, LineReader
from sglang_guard.rules.logline import clean, is_exception_line
from sglang_guard.rules.rules import Matcher, load_default_packs

# Every test here runs on both of the tracker's line searches (C and regex: conftest.py).
pytestmark = pytest.mark.usefixtures("both_searches")

LOGS = sorted((Path(__file__).resolve().parents[1] / "data" / "sglang-logs").glob("*.log"))

TS = "[2026-11-29 16:50:40 TP0]"
REAL = [  # shaped as SGLang 0.5.23 prints a scheduler failure (tests/data/sglang-logs/)
    f"{TS} Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 3',
    "    scheduler = Scheduler(",
    "                ^^^^^^^^^^",
    "ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90.",
    "Please use `--attention-backend flashinfer`.",
    "RuntimeError: CUDA out of memory.",  # the message's third line: no exception line
    "",
]


def flags(lines: list[str], state: str = tb.OTHER) -> list[bool]:
    out = []
    for line in lines:
        state, ends = tb.step(state, line)
        out.append(ends)
    return out


def test_only_the_line_after_the_frames_ends_the_traceback() -> None:
    assert flags(REAL) == [False, False, False, False, True, False, False, False]


def test_records_and_progress_bars_of_other_processes_may_interleave() -> None:
    lines = [REAL[0], REAL[1], "[2026-11-29 16:50:40 TP1] Load weight begin.",
             "Loading safetensors checkpoint shards:  50% Completed | 1/2", REAL[4]]
    assert flags(lines) == [False, False, False, False, True]


def test_sgl_kernel_load_report_items_count_in_the_message() -> None:
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
             "ImportError: [sgl_kernel] CRITICAL: Could not load any common_ops library!",
             "Error details from previous import attempts:",
             "- ImportError: libnvrtc.so.12: cannot open shared object file",
             "RuntimeError: not an item"]
    assert flags(lines) == [False, False, True, False, True, False]


def test_outside_tracebacks_and_requests_every_line_is_read() -> None:
    """Issue 20: C++/CUDA/NCCL lines after SGLang's records, lines after blank lines."""
    assert flags(["ValueError: x", "RuntimeError: y"]) == [True, True]
    assert flags(["ValueError: x", "RuntimeError: y", f"{TS} ok", "ValueError: z", "",
                  "Failed: Cuda error x.cuh:307 'peer access'"], tb.UNKNOWN) == [
        True, True, False, True, False, True]


# A request record cut inside its quote (at the line cap, say): what follows is its text.
REQUEST = [f"{TS} Receive: obj=GenerateReqInput(rid='a', text='x",
           "Traceback (most recent call last):", '  File "x.py", line 1',
           "ValueError: FlashAttention v3 Backend requires SM>=80", "", "RuntimeError: y"]


def test_a_request_record_and_its_continuation_are_never_read() -> None:
    assert flags(REQUEST) == [False] * 6
    for fmt in ("Receive OpenAI: obj={'x': 'a", "Finish: obj=X(text='\\'), out={}",
                '{"event": "request.received", "obj": {"text": "a\\"}}'):
        assert flags([f"{TS} {fmt}", "ValueError: x"]) == [False, False]
    # The next record ends it; a request record cut so also ends a traceback's frames.
    assert flags([*REQUEST, f"{TS} ok", "ValueError: x"]) == [False] * 7 + [True]
    assert flags([REAL[0], REAL[1], REQUEST[0], REAL[4]]) == [False] * 4
    # A whole request record (all of SGLang's are: repr and JSON escape newlines) is one
    # line of request text; SGLang's own output goes on after it, a traceback's frames too.
    whole = f"{TS} Receive: obj=GenerateReqInput(rid='a', text='it\\'s \\nValueError: x')"
    assert flags([whole, "ValueError: y"]) == [False, True]
    assert flags([REAL[0], REAL[1], whole, REAL[4]]) == [False, False, False, True]


_HEADERS = re.compile(rb"Traceback \(most recent call last\):[^\n]*\n")


def skip(state: str, block: bytes, head: bytes = b"") -> str:
    """Where the reader's tracker is after `block`'s complete lines (`head`: the start of the
    line the block finishes), reading none but the headers, as the live scan hits them
    (rules/linereader.py over rules/tracebacks.advance)."""
    reader = LineReader(65536, lambda b: Hits([], [m.end() for m in _HEADERS.finditer(b)]))
    reader.state = state
    reader.feed(head)
    reader.feed(block)
    return reader.state


def test_advance_reports_the_exception_line_it_passes() -> None:
    block = b'  File "x.py", line 1\n[2026-11-29 16:50:40] other\nKeyError: \'a\'\nmore\n'
    found: list[tuple[int, int, str]] = []
    assert tb.advance(tb.TRACEBACK, block, (0, len(block)), 65536, found) == tb.MESSAGE
    at = block.index(b"KeyError")
    assert found == [(at, block.index(b"\n", at), "KeyError: 'a'")]


@pytest.mark.parametrize("start", [tb.OTHER, tb.UNKNOWN, tb.REQUEST, tb.TRACEBACK, tb.MESSAGE])
@pytest.mark.parametrize("lines", [REQUEST, [*REQUEST, f"{TS} ok", "x"], REAL + REQUEST,
                                   REQUEST + REAL, [REAL[0], REQUEST[0], *REAL[1:]],
                                   [REQUEST[0], REAL[0], "", "x"]])
def test_skip_agrees_with_step_around_requests(start: str, lines: list[str]) -> None:
    block = ("\n".join(lines) + "\n").encode()
    state = start
    for line in lines:
        state, _ = tb.step(state, line)
    assert skip(start, block) == state
    for cut in range(1, len(block)):
        head_end = block.rfind(b"\n", 0, cut) + 1
        before = start
        for raw in block[:head_end].splitlines():
            before, _ = tb.step(before, raw.decode())
        assert skip(before, block[cut:], block[head_end:cut]) == state, cut


@pytest.mark.parametrize("split", [0, 10, 30, 60])
def test_skip_finds_a_header_in_a_block_and_across_the_boundary(split: int) -> None:
    text = ("\n".join(REAL[:4]) + "\n").encode()
    head, block = text[:split], text[split:]
    assert skip(tb.MESSAGE, block, head) == tb.TRACEBACK


def test_the_block_scan_passes_every_block_with_a_header() -> None:
    """Between hits the tracker reads no header: the scan must hit every one."""
    matcher = Matcher(load_default_packs())
    found = matcher.scan(("\n".join(REAL[:4]) + "\n").encode())
    assert found.traceback and not matcher.scan(b"[2026-11-29 16:50:40] fine\n").traceback


def test_skip_keeps_other_and_leaves_a_traceback_at_its_end() -> None:
    assert skip(tb.OTHER, b"[2026-11-29 16:50:40] a\nb\n") == tb.OTHER
    header_block = ("\n".join(REAL[:3]) + "\n").encode()
    assert skip(tb.OTHER, header_block) == tb.TRACEBACK
    assert skip(tb.UNKNOWN, b"plain\n") == tb.UNKNOWN
    assert skip(tb.UNKNOWN, b"[2026-11-29 16:50:40] first record\n") == tb.OTHER
    assert skip(tb.MESSAGE, b"more of the message\n\n") == tb.OTHER
    assert skip(tb.TRACEBACK, b"  File x\nKeyError: 'a'\n") == tb.MESSAGE


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_every_fatal_exception_line_of_the_real_logs_still_counts(log: Path) -> None:
    """Read as the reader does (from "unknown"), no real log loses a fatal exception line."""
    matcher = Matcher(load_default_packs())
    state, lost, kept = tb.UNKNOWN, [], 0
    for raw in log.read_bytes().splitlines():
        line = clean(raw, 65536)
        state, ends = tb.step(state, line)
        if is_exception_line(line) and any(r.fatal for r in matcher.candidates(line)):
            if any(r.fatal for r in matcher.candidates(line, ends)):
                kept += 1
            else:
                lost.append(line)
    assert lost == []


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_skip_agrees_with_reading_every_line(log: Path) -> None:
    """`advance` jumps with regexes; it must land where `step`, line by line, lands."""
    data = log.read_bytes()
    cuts = [len(data) * k // 7 for k in range(1, 7)]
    for start in (tb.OTHER, tb.UNKNOWN, tb.TRACEBACK, tb.MESSAGE):
        for cut in cuts:
            block = data[: data.rfind(b"\n", 0, cut) + 1]
            state = start
            for raw in block.splitlines():
                state, _ = tb.step(state, raw.decode("utf-8", "replace"))
            assert skip(start, block) == state, (start, cut)


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_skip_reads_the_line_a_block_finishes_whole(log: Path) -> None:
    """A block that starts mid-line (a read cut a line): its first piece ends that line."""
    data = log.read_bytes()
    for start in (tb.OTHER, tb.UNKNOWN, tb.TRACEBACK, tb.MESSAGE):
        for k in range(1, 9):
            cut = len(data) * k // 9
            line_start = data.rfind(b"\n", 0, cut) + 1
            end = data.rfind(b"\n") + 1
            state = start
            for raw in data[:end].splitlines():
                state, _ = tb.step(state, raw.decode("utf-8", "replace"))
            before = start
            for raw in data[:line_start].splitlines():
                before, _ = tb.step(before, raw.decode("utf-8", "replace"))
            assert skip(before, data[cut:end], data[line_start:cut]) == state, (start, k)


def test_a_lone_newline_ends_the_line_it_finishes_not_a_blank_line() -> None:
    """A 10 MB line's newline written on its own: not a blank line (the fault suite's flood)."""
    assert skip(tb.UNKNOWN, b"\n", b"aaaa") == tb.UNKNOWN
    assert skip(tb.MESSAGE, b"\n", b"more message") == tb.MESSAGE
