"""The traceback tracker's line search, compiled where it could be built.

`first_line(block, start, end, kind, cap)`: where the first line of `block[start:end]` (whole
lines) that `kind` takes starts (-1: none), exactly as rules/tracebacks.py's byte regexes
answer (`_next_line`): FRAMES (a line that may end a traceback's frames: exception-shaped, a
request record or blank), MESSAGE (a record or blank) and BLANK. The C module
(`_linescan.c`, built by the wheel's build hook, hatch_build.py) reads 64 bytes at a time into
masks of byte classes (AVX-512BW or AVX2, where the CPU has them), turns away the lines
no kind can take by their first bytes, and reads the head of each line left: over the bench's
log mix, which sits in a traceback, ~0.02 CPU s per million lines (~10 GB/s) where Hyperscan's
set took ~0.10 and the regexes more (bench/README.md, fourth round), before the masks; the
reader's whole walk then took ~0.014 where it took ~0.025 (chunks in cache, Intel Xeon VM).
An optional sixth argument, `widest` (3, 2, 0: memchr line by line), forces a narrower
loop: tests/unit/test_linescan.py holds each equal to the regexes.

`advance(state, block, start, end, cap, reads)`: rules/tracebacks.advance's walk over the lines
nobody reads (`_advance` in Python is its definition), reading on the way the lines that end
just before each offset of `reads` (`_advance_reading`), the state as its index in
tracebacks.STATES; `(state, [(start, stop, text), ...])`, or None where a line it must step
is not plain ASCII (then the caller walks in Python). It took the line reading of the
pass-through bench's mixes from 0.049 to 0.035 CPU s per million lines (log mix) and 0.091 to
0.062 (near-miss) here (bench/README.md, "The log path, seventh round").

`read_walk(state, block, start, end, cap, reads, checks)`: `advance` that also steps the
lines ending just before each offset of `checks`, the lines the reader checks, and answers
each as `(line, n, before, after, own, text)` (tracebacks.read_walk; `text` None, or the
cleaned text of a line whose ASCII head holds an ESC or a NUL), up to the first whose head is
not ASCII (or the colored exception line that ends a traceback); the reader then asks only
`keep` of them in Python. Given the quick no's literals (rules/quick.py), a checked plain line
it turns away is answered with n = -1 and the reader asks nothing of it.

`literal_lines(block, needles)`: `[(needle index, line end)]`, each complete line of `block`
(by the offset just past its newline) that holds a needle (bytes, no newline), once per
needle, in block order: what rules/blockscan.py's per-line Hyperscan set answers for plain
literals (`(?:literal)[^\n]*\n`), gathered in C with the GIL released, with no Python call
per match (the running phase of the default pack is four literals). `literal_lines(block,
needles, widest, True)` adds `(-1, end)` for each complete line with an ESC or a NUL byte,
the lines the reader must clean to read (rules/linereader._dirty), in the same call.

`read_scan(fd, size, needles, widest, marks)`: `os.read(fd, size)` and, where the chunk
holds a newline, `literal_lines` over it, the GIL let go once over both: `(chunk, pairs)`,
pairs None where nothing was scanned. The pumps' reader (supervise/shell/child.py) runs the
running phase's scan so; it took the GIL back after the read only to let it go for the scan.

`write_pieces(fd, data, piece)`: the pumps' writer's writes (supervise/shell/child.py) in C,
`piece` bytes per write(2), with the GIL released over the whole chunk: in Python each piece
took the GIL back, and waited for it behind the threads reading lines.

The module also answers rules/logline.quotes_closed (`quotes_closed`), the request records'
quote check. `compiled` says whether it is there. Without it (no C compiler at install, a
platform it was not built for, SGLANG_GUARD_PURE=1) the tracker keeps its regexes and
quotes_closed its Python: the same answers, slower.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from types import ModuleType

FRAMES, MESSAGE, BLANK = 0, 1, 2

Search = Callable[[bytes, int, int, int, int], int]
Advance = Callable[[int, bytes, int, int, int, Sequence[int]],
                   "tuple[int, list[tuple[int, int, str]]] | None"]
# The last argument: None, or the quick no's literals (rules/quick.Quick.literals).
ReadWalk = Callable[[int, bytes, int, int, int, Sequence[int], Sequence[int],
                     "tuple[Sequence[bytes], Sequence[bytes]] | None"],
                    "tuple[int, list[tuple[int, int, str]],"
                    " list[tuple[int, int, int, int, bool, str | None]]]"
                    " | None"]


def _load() -> ModuleType | None:
    if os.environ.get("SGLANG_GUARD_PURE") == "1":
        return None
    try:
        from sglang_guard.rules import _linescan  # noqa: PLC0415
    except ImportError:
        return None
    return _linescan


_module = _load()
compiled = _module is not None
first_line: Search | None = None if _module is None else _module.first_line
advance: Advance | None = None if _module is None else _module.advance
read_walk: ReadWalk | None = None if _module is None else _module.read_walk
# (block, needles, widest, marks): marks adds (-1, end) for each line with an ESC or a NUL.
LiteralLines = Callable[["bytes | memoryview", Sequence[bytes], int, bool],
                        "list[tuple[int, int]]"]
literal_lines: LiteralLines | None = None if _module is None else _module.literal_lines
MAX_NEEDLES = 16  # literal_lines takes at most this many
# (fd, size, needles, widest, marks) -> (chunk, pairs or None): os.read, then literal_lines.
ReadScan = Callable[[int, int, Sequence[bytes], int, bool],
                    "tuple[bytes, list[tuple[int, int]] | None]"]
read_scan: ReadScan | None = None if _module is None else _module.read_scan
# write_pieces(fd, data, piece) -> bytes written: the pumps' writer's loop of write(2) calls
# in C, the GIL released over all of them (supervise/shell/child.py); stops at EAGAIN.
write_pieces: Callable[[int, bytes, int], int] | None = (
    None if _module is None else _module.write_pieces)
# rules/logline.quotes_closed in C (a str with a lone surrogate raises UnicodeEncodeError:
# read it in Python).
quotes_closed: Callable[[str], bool] | None = None if _module is None else _module.quotes_closed
