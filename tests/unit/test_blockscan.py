"""The per-line scan: Hyperscan must find at least what RE2 finds, on every line we hold."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest
import re2

from requestlines import FATAL_TEXTS, quoting
from sglang_guard.rules import blockscan
from sglang_guard.rules.blockscan import BlockScan, trim_separators, unanchored, widen
from sglang_guard.rules.linereader import LineReader
from sglang_guard.rules.logline import clean
from sglang_guard.rules.rulepack import RE2_OPTIONS
from sglang_guard.rules.rules import Matcher, RulePack, load_default_packs, parse_pack
from sglang_guard.rules.stages import MARKERS, READY_LINE
from sglang_guard.supervise.shell.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[2]
MATCHER = Matcher(load_default_packs())
PATTERNS = MATCHER._lines.patterns  # the patterns the supervisor's reader threads scan for


@pytest.mark.parametrize(("pattern", "want"), [
    (r"a{2,5}b", r"a{2,}b"),
    (r"\d{4}-\d\d", r"\d{4,}-\d\d"),
    (r"[^\]]{0,200}\] ", r"[^\]]{0,}\] "),
    (r"x{3,}", r"x{3,}"),
    (r"\{3}", r"\{3}"),  # an escaped brace is a literal
    (r"[{]{2}", r"[{]{2,}"),  # a brace inside a class is a literal
    (r"[]{1}]", r"[]{1}]"),  # a leading ] belongs to the class
    (r"\x{41}{2}", r"\x{41}{2,}"),
    (r"\p{Greek}{1,3}", r"\p{Greek}{1,}"),
    (r"x{,3}", r"x{,3}"),  # RE2 reads "{,3}" as literal text
    (r"x{a}", r"x{a}"),
])
def test_widen_drops_only_upper_bounds_of_repeats(pattern: str, want: str) -> None:
    assert widen(pattern) == want


@pytest.mark.parametrize(("pattern", "want"), [
    (r"^AssertionError: (?P<a>[0-9]+) is x\s*$", r"AssertionError: (?P<a>[0-9]+) is x\s*"),
    (r"[^a]\^\$\Afoo\z", r"[^a]\^\$foo"),
])
def test_unanchored_drops_anchors_only(pattern: str, want: str) -> None:
    assert unanchored(pattern) == want


@pytest.mark.parametrize(("pattern", "want"), [
    ("Scheduler hit an exception: ", "Scheduler hit an exception"),
    (r"dist_init_port=", "dist_init_port"),
    (r"but got \ ", "but got"),  # an escaped space too
    (r"Traceback\ \(most\ recent\ call\ last\)\:", r"Traceback\ \(most\ recent\ call\ last\)\:"),
    ("x: +", "x: +"), ("x: ?", "x: ?"), ("x: {2}", "x: {2}"),  # a quantifier ends it
    ("x[: ]", "x[: ]"), ("(a): ", "(a): "), ("a|: ", "a|: "), (": ", ": "),
    (r"\d: ", r"\d: "), (r"\\: ", r"\\: "), (r"\x3a", r"\x3a"), (r"a\Qb: \E", r"a\Qb: \E"),
    ("got $", "got $"),  # an anchor ends it
])
def test_trim_separators_drops_only_a_plain_separator_tail_after_a_word_character(
        pattern: str, want: str) -> None:
    assert trim_separators(pattern) == want


@pytest.mark.parametrize("seed", range(40))
def test_a_trimmed_pattern_matches_in_every_line_the_pattern_matches_in(seed: int) -> None:
    """Per line a superset: RE2 itself, on random patterns ending in separators and lines."""
    rng = random.Random(seed)  # noqa: S311 - reproducible
    pieces = ["a", "b", "1", "é", ":", " ", ",", ";", "=", r"\ ", r"\:", r"\d", "[: ]", "+", "?",
              "*", "(a|b)", "|", "$", "^", "x{2}", "."]
    alphabet = "ab1é:;,= \tx"
    for _ in range(200):
        pattern = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
        try:
            whole = re2.compile(pattern, RE2_OPTIONS)
        except re2.error:
            continue
        trimmed = re2.compile(trim_separators(pattern), RE2_OPTIONS)
        for _ in range(20):
            line = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
            if whole.search(line):
                assert trimmed.search(line), (pattern, trim_separators(pattern), line)


def test_a_bounded_repeat_of_multibyte_characters_still_hits() -> None:
    """RE2 counts characters, Hyperscan bytes: 3 characters here are 6 bytes."""
    line = "ééé] ERR\n".encode()
    pattern = r"(?m)^[^\]\n]{1,3}\] ERR"
    assert BlockScan([pattern], accelerate=False).hits(line) == [0]
    scan = BlockScan([pattern])
    if scan.engine == "hyperscan":
        assert scan.hits(line) == [0]


def _stored_lines() -> list[bytes]:
    logs = [*sorted((REPO / "tests" / "data" / "sglang-logs").glob("*.log")),
            *sorted((REPO / "tests" / "data" / "realworld").glob("*.toml")),
            *sorted((REPO.parent / "shared" / "reference").glob("*.log"))]
    lines = {ln for path in logs for ln in path.read_bytes().splitlines()}
    for text in FATAL_TEXTS:
        lines.add(clean(text.encode(), 65536).encode())
        lines.update(q.encode() for q in quoting(text))
    return sorted(lines)


def test_the_engine_on_this_platform_is_hyperscan() -> None:
    """The dependency installs a wheel on the CI platform: a silent fallback would hide it."""
    assert MATCHER.prepare_scan() == ("hyperscan", None)


def test_hyperscan_hits_every_pattern_re2_hits_line_by_line() -> None:
    fast = BlockScan(PATTERNS, lines=True)
    exact = BlockScan(PATTERNS, accelerate=False, lines=True)
    assert fast.engine == "hyperscan"
    lines = _stored_lines()
    assert len(lines) > 1000
    hit_lines = 0
    for line in lines:
        want = set(exact.line_ends(line + b"\n"))
        hit_lines += bool(want)
        assert want <= set(fast.line_ends(line + b"\n")), line[:200]
        assert {i for i, _ in want} == set(exact.hits(line + b"\n"))  # halving loses none
    assert hit_lines > 100  # the stored logs hold many fatal lines and markers


def test_hyperscan_and_re2_agree_on_whole_logs_line_by_line() -> None:
    """Each (pattern, line) RE2 finds in a whole log (halving it), Hyperscan reports too."""
    fast = BlockScan(PATTERNS, lines=True)
    exact = BlockScan(PATTERNS, accelerate=False, lines=True)
    for path in sorted((REPO / "tests" / "data" / "sglang-logs").glob("*.log")):
        block = path.read_bytes()
        block = block if block.endswith(b"\n") else block + b"\n"
        want = set(exact.line_ends(block))
        assert want and want <= set(fast.line_ends(block)), path.name
        ends = {e for _, e in want}
        assert all(block[e - 1:e] == b"\n" for e in ends)  # each a line's end


def test_two_threads_scan_at_once_each_with_its_own_scratch() -> None:
    scan, lines = BlockScan(PATTERNS), BlockScan(PATTERNS, lines=True)
    fatal = clean(FATAL_TEXTS[0].encode(), 65536).encode() + b"\n"
    healthy = b"[2026-11-29 16:50:40] Load weight begin. avail mem=20 GB\n" * 20000
    errors: list[str] = []

    def work(block: bytes, want_rule: bool) -> None:
        for _ in range(50):
            got = any(i < len(MATCHER.rules) for i in scan.hits(block))
            got_lines = any(i < len(MATCHER.rules) for i, _ in lines.line_ends(block))
            if got_lines != want_rule:
                errors.append(f"{block[:40]!r} per line: {got_lines}")
            if got != want_rule:
                errors.append(f"{block[:40]!r}: {got}")

    threads = [threading.Thread(target=work, args=(healthy + fatal, True)),
               threading.Thread(target=work, args=(healthy, False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_an_empty_set_and_an_empty_block() -> None:
    assert BlockScan([]).hits(b"anything\n") == []
    assert BlockScan(PATTERNS).hits(b"") == []
    assert BlockScan([], lines=True).line_ends(b"anything\n") == []
    assert BlockScan(PATTERNS, lines=True).line_ends(b"") == []


def test_a_per_line_set_reports_each_line_once_and_no_unfinished_line() -> None:
    for accelerate in (True, False):
        scan = BlockScan(["boom", r"x\s*y"], accelerate=accelerate, lines=True)
        block = b"boom boom boom\nquiet\nx  y boom\nboom at the end"
        assert sorted(scan.line_ends(block)) == [(0, 15), (0, 31), (1, 31)], accelerate


def test_the_block_scan_passes_every_line_a_fatal_rule_matches() -> None:
    """The prefilter is a superset of the exact per-line matcher, line by line."""
    matched = 0
    for line in _stored_lines():
        text = clean(line, 65536)
        if any(r.fatal for r in MATCHER.candidates(text)):
            matched += 1
            assert MATCHER.scan(text.encode() + b"\n").rule, line[:200]
    assert matched > 100


def _live() -> object:
    from types import SimpleNamespace  # noqa: PLC0415

    return SimpleNamespace(state=SimpleNamespace(phase="starting"),
                           rt=SimpleNamespace(env=SimpleNamespace(matcher=MATCHER)),
                           events=__import__("queue").Queue())


@pytest.mark.parametrize("text", FATAL_TEXTS)
def test_lines_quoting_a_fatal_message_cost_one_check_and_no_event(text: str) -> None:
    """Requests, access lines and exceptions that quote the text: the scan has no lead, so
    it may hit them; the reader's one exact check (`Supervisor._keep`) then emits nothing."""
    live = _live()
    for line in quoting(text):
        reader = LineReader(65536, Supervisor._scan(live),  # type: ignore[arg-type]
                            lambda ln: Supervisor._keep(live, ln))  # type: ignore[arg-type]
        assert reader.feed(f"[2026-11-29 16:50:40] Load weight begin.\n{line}\n".encode()) == []


def test_an_re2_set_too_large_for_one_program_is_split(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [ln + b"\n" for ln in _stored_lines()]
    one = BlockScan(PATTERNS, accelerate=False)
    want = [one.hits(ln) for ln in lines]
    assert len(blockscan._re2_sets(PATTERNS)) == 1
    # Small enough that the default pack does not fit one program (with no lead it fits
    # 1 MiB since issue 24).
    monkeypatch.setattr(blockscan, "RE2_SET_MEMORY", 1 << 18)
    blockscan._re2_sets.cache_clear()
    blockscan._compile.cache_clear()
    try:
        split = BlockScan(PATTERNS, accelerate=False)
        assert len(blockscan._re2_sets(PATTERNS)) > 1
        assert [sorted(split.hits(ln)) for ln in lines] == [sorted(w) for w in want]
    finally:
        blockscan._re2_sets.cache_clear()
        blockscan._compile.cache_clear()


@pytest.mark.parametrize("prog", ["launch_server.py", "/usr/bin/launch_server.py", "sglang serve"])
def test_argparse_error_lines_pass_at_error_and_past_it(prog: str) -> None:
    for line in (f"{prog}: error: argument --attention-backend: invalid choice: 'x' (choose "
                 "from 'fa3', 'triton')",
                 f"{prog}: error: unrecognized arguments: --foo"):
        assert any(r.fatal for r in MATCHER.candidates(line)), line
        assert MATCHER.scan(line.encode() + b"\n").rule, line


def test_a_pattern_hyperscan_cannot_take_stays_on_re2_alone() -> None:
    """An embedded anchor (which Hyperscan refuses) must not put the whole set on RE2."""
    scan = BlockScan(["(?m)^x(?:^y)?z", "token", "(?m)^other"])
    assert scan.engine == "hyperscan+re2"
    assert scan.why is not None and "1 of 3 patterns are on RE2" in scan.why
    assert sorted(scan.hits(b"xz\n")) == [0]
    assert sorted(scan.hits(b"a token\nother\n")) == [1, 2]
    assert scan.hits(b"nothing here\n") == []
    lines = BlockScan(["(?m)^x(?:^y)?z", "token", "(?m)^other"], lines=True)
    assert lines.engine == "hyperscan+re2"
    assert sorted(lines.line_ends(b"a token\nother\nxz\nnothing\n")) == [(0, 17), (1, 8),
                                                                         (2, 14)]


def test_clean_strips_escapes_as_the_pattern_and_drop_list_do() -> None:
    """The ESC-to-ESC walk gives what `_ANSI.sub` followed by dropping ESC and NUL gives."""
    import random  # noqa: PLC0415

    from sglang_guard.rules.logline import _ANSI, _DROP  # noqa: PLC0415

    rng = random.Random(12)  # noqa: S311 - test data, not secrets
    pieces = [b"\x1b[31m", b"\x1b[0m", b"\x1b]0;title\x07", b"\x1b]8;;x\x1b\\", b"\x1b",
              b"\x1b(", b"\x1b(B", b"\x00", b"text ", b"[", b"]", b"\x1b[", b"\x07"]
    for _ in range(3000):
        raw = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        want = _ANSI.sub(b"", raw).translate(None, _DROP).decode("utf-8", "replace")
        assert clean(raw, 1 << 20) == want, raw


def test_only_the_rules_scan_patterns_are_trimmed_the_markers_stay_whole() -> None:
    """A rule's hit is checked again by its own regex; a stage marker's is taken as found,
    so a marker must not be widened: "Uvicorn running on" without its space is no stage."""
    rules, (first, stop) = len(MATCHER.rules), MATCHER._markers
    assert MATCHER._lines.patterns[:rules] == tuple(
        blockscan.line_superset(unanchored(rule.pattern)) for rule in MATCHER.rules)
    assert any(p != unanchored(r.pattern)
               for p, r in zip(MATCHER._lines.patterns, MATCHER.rules, strict=False))
    assert MATCHER._lines.patterns[first:stop] == tuple(m for _, _, m in MARKERS)
    assert MATCHER._lines.patterns[stop] == re2.escape(READY_LINE)
    record = b"[2026-11-29 16:50:52] "
    assert MATCHER.line_scan(record + b"Uvicorn running onX\n", True).stage is None
    assert MATCHER.line_scan(record + b"Uvicorn running on http://127.0.0.1:1\n",
                             True).stage == "warmup"


def test_past_the_start_only_running_phase_rules_are_scanned_for() -> None:
    from sglang_guard.rules.rules import in_phase  # noqa: PLC0415

    running = [r for r in MATCHER.rules if in_phase(r, "running")]
    assert running and len(running) < len(MATCHER.rules) // 4
    crash = b"[2026-11-29 16:50:40 TP0] Scheduler hit an exception: boom\n"
    start_only = b"ValueError: FlashAttention v3 Backend requires SM>=80 and SM<=90.\n"
    assert MATCHER.scan(crash).rule and MATCHER.scan_running(crash).rule
    assert MATCHER.scan(start_only).rule and not MATCHER.scan_running(start_only).rule
    assert MATCHER.scan_running(b"Traceback (most recent call last):\n").traceback
    for line in _stored_lines():  # still a superset of what a running-phase rule reads
        text = clean(line, 65536)
        if any(in_phase(r, "running") and r.fatal for r in MATCHER.candidates(text)):
            assert MATCHER.scan_running(text.encode() + b"\n").rule, line[:200]


def _mutations(texts: list[str], count: int, seed: int) -> list[str]:
    """Each text with a character or a short run replaced, dropped or doubled: near misses
    of every rule's own lines, and lines that still match."""
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    alphabet = "aZ09 :'\"\\._-()[]>=<\u00e9\u4e2d"
    out = []
    for _ in range(count):
        text = rng.choice(texts)
        at = rng.randrange(len(text) + 1)
        cut = rng.randint(0, 3)
        what = rng.choice(["", rng.choice(alphabet), text[at:at + cut] * 2])
        out.append(text[:at] + what + text[at + cut:])
    return out


@pytest.mark.parametrize("packs", ["default", "with-notes"])
def test_each_rules_own_regex_decides_as_the_sets_do(packs: str) -> None:
    """Once the line scan is compiled (`prepare_scan`: the supervisor's), `candidates` asks
    the scan which rules might match and then each rule's own regex; before, the RE2 sets
    decide. Both answer the same over every stored line, every rule's fatal text quoted or
    not, and 20,000 mutations of them, as an exception line or not, and with lone
    surrogates (the sets' UTF-8 retry). `with-notes` adds every default rule again as a
    non-fatal note (read on the whole line, unanchored: the notes set)."""
    loaded = load_default_packs()
    if packs == "with-notes":
        loaded = (*loaded, _notes_of(loaded))
    by_sets, narrowed = Matcher(loaded), Matcher(loaded)
    narrowed.prepare_scan()
    assert narrowed._lines.compiled and not by_sets._lines.compiled
    stored = [clean(line, 65536) for line in _stored_lines()]
    texts = [*stored, *_mutations([t for t in stored if t] or ["x"], 20_000, 24),
             "ValueError: FlashAttention v3 Backend requires SM>=80 \udcff"]
    hits = notes = 0
    for ends in (True, False, None):
        for text in texts:
            want = by_sets.candidates(text, ends)
            assert narrowed.candidates(text, ends) == want, (text[:200], ends)
            hits += bool(want)
            notes += any(not rule.fatal for rule in want)
    assert hits > 1000  # the texts reach the rules
    assert (notes > 1000) == (packs == "with-notes")
    assert not by_sets._lines.compiled  # the sets' answers were the sets' own


def _notes_of(packs: tuple[RulePack, ...]) -> RulePack:
    """Every rule of `packs` again, as a non-fatal note with its own id."""
    body = '[pack]\nname = "notes"\nsglang_versions = ">=0.4"\n' + "".join(
        f"[[rules]]\nid = {json.dumps('note-' + rule.id)}\npattern = {json.dumps(rule.pattern)}\n"
        'action = "restart"\nfatal = false\n'
        for pack in packs for rule in pack.rules)
    return parse_pack(body, "notes.toml")


def test_warm_thread_allocates_this_threads_scratch_and_compiles_nothing() -> None:
    """The pumps' threads call `warm_thread` before their first chunk: on a compiled matcher
    it gives the calling thread its Hyperscan scratch for both phases' scans; on one never
    compiled it compiles nothing (a pump must not wait on a compile: the loop's reload
    compiles, `prepare_scan`)."""
    cold = Matcher(load_default_packs())
    warm = Matcher(load_default_packs())
    warm.prepare_scan()
    seen: dict[str, object] = {}

    def in_a_thread() -> None:
        cold.warm_thread()
        warm.warm_thread()
        seen["scratch"] = [getattr(scan._local, "scratch", None)
                           for scan in (warm._lines, warm._lines_running)]
        seen["cold"] = [getattr(scan._local, "scratch", None)
                        for scan in (cold._lines, cold._lines_running)]

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    # A set of plain literals is searched in C (linescan.literal_lines): no scratch to have.
    wanted = [scan.engine != "literals" for scan in (warm._lines, warm._lines_running)]
    assert [s is not None for s in seen["scratch"]] == wanted  # type: ignore[attr-defined]
    assert wanted[0]  # the start-up set is on Hyperscan
    assert seen["cold"] == [None, None]
    assert not cold._lines.compiled and not cold._lines_running.compiled
