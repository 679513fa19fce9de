"""The package's rooms (docs/architecture.md): no import circle, the pure side of each room
imports no shell, the pure sides stack in layers, no room holds more than a quarter of the code.

Read from the source (tests/support/importgraph.py): every import counts, at a module's top,
inside a function and under TYPE_CHECKING. Written by the package split's codemod
(issue 21, item 5); a room is a package directly under sglang_guard/, its shell is its
`shell/` package, the top is the modules directly under sglang_guard/.
"""

from __future__ import annotations

import io
import tokenize
from collections import Counter
from pathlib import Path

from support.importgraph import PACKAGE, circles, import_graph, modules

SHARE = 0.25  # the most of the package's code one room (or one directory) may hold
TOP_LEAVES = {"sglang_guard", "sglang_guard.errors", "sglang_guard.resources"}


def room(module: str) -> str | None:
    """`supervise` for sglang_guard.supervise.shell.runner; None for the top's modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) \
        else None


def in_shell(module: str) -> bool:
    return "shell" in module.split(".")[2:]


def code_lines(path: Path) -> int:
    """Lines holding code: neither blank nor only a comment (docstrings count: they are read)."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENDMARKER):
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines)


def test_the_reader_reads_the_whole_package() -> None:
    graph = import_graph()
    assert len(graph) > 80
    assert sum(map(len, graph.values())) > 200  # the imports were read
    assert "sglang_guard.supervise.machine" in graph
    assert "sglang_guard.rules.rules" in graph["sglang_guard.supervise.machine"]
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b", "a"]]
    assert code_lines(PACKAGE / "supervise" / "machine.py") > 300


def test_no_import_circle() -> None:
    found = circles(import_graph())
    assert not found, f"import circles: {found}"


def test_the_pure_side_imports_no_shell() -> None:
    graph = import_graph()
    pure = [m for m in graph if room(m) is not None and not in_shell(m)]
    assert len(pure) > 30
    wrong = {m: sorted(d for d in graph[m]
                       if in_shell(d) or (room(d) is None and d not in TOP_LEAVES))
             for m in pure}
    wrong = {m: d for m, d in wrong.items() if d}
    assert not wrong, f"pure modules importing a shell or the top: {wrong}"


def test_the_pure_sides_stack_in_layers() -> None:
    graph = import_graph()
    rooms: dict[str, set[str]] = {}
    for module, deps in graph.items():
        if room(module) is None or in_shell(module):
            continue
        mine = rooms.setdefault(str(room(module)), set())
        mine |= {str(room(d)) for d in deps if room(d) not in (None, room(module))}
    assert len(rooms) >= 6
    found = circles(rooms)
    assert not found, f"rooms whose pure sides import each other: {found}"


def test_no_room_nor_directory_holds_more_than_a_quarter_of_the_code() -> None:
    lines = {name: code_lines(path) for name, path in modules().items()}
    total = sum(lines.values())
    rooms: Counter[str] = Counter()
    directories: Counter[str] = Counter()
    for name, count in lines.items():
        rooms[room(name) or "(the top)"] += count
        directories[str(modules()[name].parent.relative_to(PACKAGE))] += count
    assert len(rooms) >= 8 and total > 10_000
    big = {r: round(n / total, 3) for r, n in rooms.items() if n > SHARE * total}
    assert not big, f"rooms over a quarter of {total} code lines: {big}"
    big = {d: round(n / total, 3) for d, n in directories.items() if n > SHARE * total}
    assert not big, f"directories over a quarter of {total} code lines: {big}"
