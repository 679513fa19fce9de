"""Issue 24: a per-line set of plain literals is searched in C (`linescan.literal_lines`) and
answers exactly what the per-line Hyperscan set answered for it, and what reading each line
does.

The running phase of the default pack is four literals (three rules' and the traceback
header); rules/blockscan.py searches such a set in rules/_linescan.c, which gathers the hits
with the GIL released instead of a Python callback per match. Held equal here to a per-line
reference over random needle sets and soups made of their pieces (overlaps, repeats, needles
inside needles, matches cut by the block's end), on every vector width the C has, and to
Hyperscan's own database of the same patterns over every stored log cut at random.
tests/unit/test_reading_paths.py runs the reader's differential tests on it as well.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import re2

from sglang_guard.rules import blockscan, linescan
from sglang_guard.rules.linereader import _dirty
from sglang_guard.rules.rules import Matcher, load_default_packs

DATA = Path(__file__).resolve().parents[1] / "data"
LOGS = sorted((DATA / "sglang-logs").glob("*.log"))
REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference"
WIDTHS = (0, 1, 2, 3)  # byte by byte, SSE2, AVX2 and AVX-512BW where the CPU has them

needs_c = pytest.mark.skipif(
    not linescan.compiled and os.environ.get("SGLANG_GUARD_REQUIRE_NATIVE") != "1",
    reason="the C line search is not built here (no C compiler at install)")


def per_line(block: bytes, needles: list[bytes]) -> set[tuple[int, int]]:
    """The answer: each complete line, each needle it holds."""
    found, start = set(), 0
    while (newline := block.find(b"\n", start)) >= 0:
        line = block[start:newline]
        found |= {(k, newline + 1) for k, needle in enumerate(needles) if needle in line}
        start = newline + 1
    return found


def search(block: bytes, needles: list[bytes], widest: int) -> list[tuple[int, int]]:
    from sglang_guard.rules import _linescan  # noqa: PLC0415 - built here (needs_c)

    got = _linescan.literal_lines(block, needles, widest)
    assert len(got) == len(set(got)), "a (needle, line) pair twice"
    for k in range(len(needles)):  # each needle's lines in block order
        ends = [end for i, end in got if i == k]
        assert ends == sorted(ends)
    return got


def soup(rng: random.Random, needles: list[bytes], size: int) -> bytes:
    """Needles whole and cut, the bytes they are made of, newlines, an ESC, high bytes."""
    pieces: list[bytes] = [b"\n", b"\n", b" ", b"\x1b[0m", b"\xc3\xa9", b"\x00"]
    for needle in needles:
        cut = rng.randrange(len(needle) + 1)
        pieces += [needle, needle, needle[:cut], needle[cut:], needle[rng.randrange(len(needle)):]]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(pieces)
    return bytes(out[:size])


def random_needles(rng: random.Random) -> list[bytes]:
    alphabet = rng.choice([b"ab", b"abc ", b"Traceback (most)", bytes(range(32, 127))])
    count = rng.randint(1, linescan.MAX_NEEDLES)
    needles = [bytes(rng.choice(alphabet) for _ in range(rng.choice([1, 2, 3, 5, 17, 40])))
               for _ in range(count)]
    if rng.random() < 0.3 and needles[0]:  # a needle inside another
        needles.append(needles[0][: max(1, len(needles[0]) // 2)])
    return needles[: linescan.MAX_NEEDLES]


@needs_c
@pytest.mark.parametrize("seed", range(300))
def test_literal_lines_answers_as_reading_each_line_on_every_width(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - reproducible, not a secret
    needles = random_needles(rng)
    size = rng.choice([0, 1, 15, 31, 33, 64, 200, 1000, 5000])
    block = soup(rng, needles, size)
    want = per_line(block, needles)
    for widest in WIDTHS:
        assert set(search(block, needles, widest)) == want, (needles, block[:300], widest)


@needs_c
@pytest.mark.parametrize("seed", range(6))
def test_a_long_block_is_searched_without_the_gil_and_answers_the_same(seed: int) -> None:
    """Past 64 KiB the GIL is let go: another thread runs meanwhile; the answer holds."""
    rng = random.Random(seed)  # noqa: S311 - reproducible, not a secret
    needles = random_needles(rng)
    block = soup(rng, needles, 300_000)
    want = per_line(block, needles)
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        for widest in WIDTHS:
            assert set(search(block, needles, widest)) == want
    finally:
        stop.set()
        spinner.join()
    assert ticks > 0


@needs_c
@pytest.mark.parametrize("seed", range(200))
def test_the_marks_are_the_lines_the_reader_would_clean_on_every_width(seed: int) -> None:
    """`marks`: (-1, end) for each complete line with an ESC or a NUL, exactly the lines
    rules/linereader._dirty finds (the reader used to look for them itself, with the GIL
    held), and the needles' pairs as without it."""
    from sglang_guard.rules import _linescan  # noqa: PLC0415 - built here (needs_c)

    rng = random.Random(seed)  # noqa: S311 - reproducible, not a secret
    needles = random_needles(rng)
    block = soup(rng, needles, rng.choice([0, 1, 15, 64, 1000, 5000, 100_000]))
    last = block.rfind(b"\n")
    want = _dirty(block, last) if last >= 0 else set()
    for widest in WIDTHS:
        marked = _linescan.literal_lines(block, needles, widest, True)
        assert [pair for pair in marked if pair[0] >= 0] == search(block, needles, widest)
        assert {end for i, end in marked if i < 0} == want, (block[:300], widest)


@needs_c
@pytest.mark.parametrize("log", [*LOGS, *sorted(REFERENCE.glob("*.log"))],
                         ids=lambda p: p.name)
def test_the_running_scan_hands_the_reader_the_lines_it_would_clean(log: Path) -> None:
    """Past the start the scan's hits carry the marked lines (Hits.dirty); a reader that
    scans gets what `_dirty` gives, on every stored log cut at random (ESCs of colour
    codes, NULs of a torn write)."""
    matcher = Matcher(load_default_packs())
    matcher.prepare_scan()
    for start, block in random_cuts(log):
        hits = matcher.line_scan(block, starting=False)
        last = block.rfind(b"\n")
        assert hits.dirty == (_dirty(block, last) if last >= 0 else set()), (log.name, start)


def random_cuts(log: Path) -> Iterator[tuple[int, bytes]]:
    """The stored log cut into blocks of random sizes, as reads cut a stream: (start, block)."""
    data = log.read_bytes()
    rng = random.Random(log.name)  # noqa: S311 - reproducible, not a secret
    start = 0
    while start < len(data):
        end = min(len(data), start + rng.choice([7, 500, 4096, 70_000, 300_000]))
        yield start, data[start:end]
        start = end


def running_patterns() -> tuple[str, ...]:
    return Matcher(load_default_packs())._lines_running.patterns


@needs_c
@pytest.mark.parametrize("log", [*LOGS, *sorted(REFERENCE.glob("*.log"))],
                         ids=lambda p: p.name)
def test_the_running_set_answers_as_its_hyperscan_database_on_every_stored_log(log: Path
                                                                               ) -> None:
    """Each stored log cut into random blocks (as reads cut a stream): the C search of the
    running phase's literals and the Hyperscan database the per-line set compiled for the
    same patterns before, the same (pattern, line) pairs; and both as reading each line."""
    if blockscan._hs is None:
        pytest.skip("hyperscan is not installed here")
    patterns = running_patterns()
    literals = blockscan._literals(patterns)
    assert literals is not None
    db = blockscan._hyperscan(patterns, range(len(patterns)), stored=False, lines=True)
    assert not isinstance(db, str), db
    for start, block in random_cuts(log):
        on_hyperscan: list[tuple[int, int]] = []

        def hit(pid: int, _start: int, at: int, _flags: int, _ctx: object,
                into: list[tuple[int, int]] = on_hyperscan) -> bool:
            into.append((pid, at))
            return False

        db.scan(block, match_event_handler=hit)
        got = set(search(block, list(literals), 2))
        assert got == set(on_hyperscan) == per_line(block, list(literals)), (log.name, start)


@needs_c
def test_the_default_running_phase_is_searched_as_literals() -> None:
    matcher = Matcher(load_default_packs())
    matcher.prepare_scan()
    assert matcher._lines_running.engine == "literals"
    assert matcher._lines.engine == "hyperscan"  # the start-up set has regexes
    block = (b"x\nTraceback (most recent call last):\n  File \"a.py\"\n"
             b"[2026] Scheduler hit an exception: boom\ntail Capture cuda graph failed")
    hits = matcher.line_scan(block, starting=False)
    assert sorted(hits.headers) == [block.index(b"\n  File") + 1]
    assert list(hits.lines) == [block.index(b"\ntail") + 1]  # the unfinished line: not yet
    # `hits` (a superset test of the block) counts the unfinished last line too
    assert matcher._lines_running.hits(block) == [0, 2, 3]


def test_a_pure_install_searches_the_running_phase_on_hyperscan() -> None:
    """Without the C (SGLANG_GUARD_PURE=1, or no compiler at install) the set stays on
    Hyperscan, the same answers."""
    code = ("from sglang_guard.rules.rules import Matcher, load_default_packs\n"
            "m = Matcher(load_default_packs())\n"
            "print(m._lines_running.engine)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "SGLANG_GUARD_PURE": "1"}, timeout=120,
                          check=True)
    assert done.stdout.strip() in ("hyperscan", "re2")


@pytest.mark.parametrize("text", ["Scheduler hit an exception", "a.b*c?(d)[e]{f}|g^h$i\\j",
                                  "Traceback (most recent call last):", " ", "x"])
def test_literal_reads_back_what_re2_escape_wrote(text: str) -> None:
    assert blockscan.literal(re2.escape(text)) == text.encode()


@pytest.mark.parametrize("pattern", ["a.b", "a\\db", "\\x41", "(?i)abc", "[ab]c", "ab+", "a{2}",
                                     "a|b", "^ab", "ab$", "caf\u00e9", "a\\nb", "a(b)", "",
                                     "\\Aab", "a\\", "\\pL"])
def test_literal_refuses_anything_but_plain_text(pattern: str) -> None:
    assert blockscan.literal(pattern) is None


@pytest.mark.parametrize("seed", range(50))
def test_where_literal_answers_re2_finds_exactly_those_bytes(seed: int) -> None:
    """A pattern of random pieces, metacharacters escaped or not: where `literal` reads it as
    text, RE2 matches a line exactly where that text is in it."""
    rng = random.Random(seed)  # noqa: S311 - reproducible, not a secret
    pieces = ["a", "b", " ", ":", "\\(", "\\)", "\\.", "\\ ", "\\:", "-", "\\-", "\\_", "\\d",
              ".", "(", "\\x41", "A"]
    pattern = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
    text = blockscan.literal(pattern)
    if text is None:
        return
    compiled = re2.compile(pattern)
    for _ in range(40):
        line = "".join(rng.choice("ab :().-_A") for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.5:
            line = line[: len(line) // 2] + text.decode() + line[len(line) // 2:]
        assert (compiled.search(line) is not None) == (text.decode() in line), (pattern, line)


@needs_c
@pytest.mark.parametrize("needles", [[b""], [b"a\nb"], [b"x"] * (linescan.MAX_NEEDLES + 1),
                                     ["text"], [None]])
def test_needles_it_cannot_search_are_refused(needles: list[object]) -> None:
    assert linescan.literal_lines is not None
    with pytest.raises((ValueError, TypeError)):
        linescan.literal_lines(b"a\nb\n", needles)  # type: ignore[arg-type]


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_read_scan_reads_as_os_read_and_scans_as_literal_lines(seed: int) -> None:
    """read_scan(fd, size, needles, widest, marks): what os.read(fd, size) returns and, where
    that chunk holds a newline, literal_lines' answer for it (None where it holds none),
    over a pipe written in random pieces (short reads, chunks cut anywhere)."""
    from sglang_guard.rules import _linescan  # noqa: PLC0415 - built here (needs_c)

    rng = random.Random(seed)  # noqa: S311 - reproducible, not a secret
    needles = random_needles(rng)
    data = soup(rng, needles, rng.choice([0, 1, 100, 70_000, 400_000]))
    size, widest, marks = rng.choice([1, 7, 4096, 65_536, 262_144]), rng.choice(WIDTHS), seed % 2
    cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, 30)))
    read_fd, write_fd = os.pipe()

    def feed() -> None:
        with os.fdopen(write_fd, "wb", buffering=0) as out:
            for a, b in itertools.pairwise([0, *cuts, len(data)]):
                out.write(data[a:b])

    writer = threading.Thread(target=feed)
    writer.start()
    got = bytearray()
    try:
        while True:
            chunk, pairs = _linescan.read_scan(read_fd, size, needles, widest, marks)
            assert type(chunk) is bytes and len(chunk) <= size
            if not chunk:
                assert pairs is None
                break
            got += chunk
            want = (_linescan.literal_lines(chunk, needles, widest, marks)
                    if b"\n" in chunk else None)
            assert pairs == want, (size, widest, chunk[:200])
    finally:
        writer.join()
        os.close(read_fd)
    assert bytes(got) == data


@needs_c
@pytest.mark.parametrize("waiting", [1, 99, 4095, 4096, 4097, 60_000])
def test_read_scan_takes_what_waits_in_the_pipe_as_os_read_does(waiting: int) -> None:
    """The chunks are os.read's whether fewer, as many or more bytes than `size` wait in the
    pipe (a shorter read's object is shrunk in place, not copied), and the next read blocks
    for what the writer writes after."""
    from sglang_guard.rules import _linescan  # noqa: PLC0415 - built here (needs_c)

    data = (b"x" * 97 + b"\n") * (waiting // 98 + 1)
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, data[:waiting])
        got = bytearray()
        while len(got) < waiting:
            chunk, pairs = _linescan.read_scan(read_fd, 4096, [b"y"], 3, True)
            assert type(chunk) is bytes
            assert len(chunk) == min(4096, waiting - len(got))
            assert pairs == (None if b"\n" not in chunk else [])
            got += chunk
        assert bytes(got) == data[:waiting]
        later = threading.Timer(0.05, os.write, (write_fd, b"late y\n"))
        later.start()
        assert _linescan.read_scan(read_fd, 4096, [b"y"]) == (b"late y\n", [(0, 7)])
        later.join()
    finally:
        os.close(read_fd)
        os.close(write_fd)


@needs_c
def test_read_scan_raises_what_os_read_raises() -> None:
    from sglang_guard.rules import _linescan  # noqa: PLC0415 - built here (needs_c)

    read_fd, write_fd = os.pipe()
    try:
        os.set_blocking(read_fd, False)
        with pytest.raises(BlockingIOError):  # nothing written yet: EAGAIN
            _linescan.read_scan(read_fd, 10, [b"x"])
        os.write(write_fd, b"no newline")
        assert _linescan.read_scan(read_fd, 4, [b"x"]) == (b"no n", None)
        with pytest.raises(ValueError, match="size"):
            _linescan.read_scan(read_fd, 0, [b"x"])
        with pytest.raises(ValueError):
            _linescan.read_scan(read_fd, 10, [b"a\nb"])
    finally:
        os.close(read_fd)
        os.close(write_fd)
    with pytest.raises(OSError, match="Bad file descriptor"):
        _linescan.read_scan(read_fd, 10, [b"x"])


@needs_c
@pytest.mark.parametrize("log", [*LOGS, *sorted(REFERENCE.glob("*.log"))],
                         ids=lambda p: p.name)
def test_the_readers_literal_scan_answers_as_the_running_line_scan(log: Path) -> None:
    """Matcher.literal_scan(False): the same object each time (the reader compares it across
    its read), none while starting; its needles' pairs, made Hits, are line_scan's answer."""
    matcher = Matcher(load_default_packs())
    literal = matcher.literal_scan(False)
    assert literal is not None and matcher.literal_scan(False) is literal
    assert matcher.literal_scan(True) is None
    assert linescan.literal_lines is not None
    for _, block in random_cuts(log):
        got = literal.hits(linescan.literal_lines(block, literal.needles, 3, True))
        assert got == matcher.line_scan(block, False)


def test_a_set_with_one_regex_or_too_many_literals_is_not_searched_as_literals() -> None:
    assert blockscan._literals(("abc", "a.c")) is None
    assert blockscan._literals(tuple(f"word{i}" for i in range(linescan.MAX_NEEDLES + 1))
                               ) is None
    # a pattern cut before its `.*`, as the per-line Hyperscan set cuts it
    assert blockscan._literals(("abc.*def",)) == ((b"abc",) if linescan.compiled else None)


def test_the_pumps_scan_on_the_reader_only_where_the_scan_takes_no_gil() -> None:
    """Matcher.scan_takes_gil: while starting the set is on Hyperscan (a Python call per hit,
    under the GIL: the thread reading lines scans); past the start, the literals in C."""
    matcher = Matcher(load_default_packs())
    matcher.prepare_scan()
    assert matcher.scan_takes_gil(True)
    assert matcher.scan_takes_gil(False) == (not linescan.compiled)
    assert Matcher(load_default_packs(), accelerate=False).scan_takes_gil(False)
