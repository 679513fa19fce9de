"""The guard's import graph, read from its source (never by importing it).

Every `import x` and `from x import y` of a sglang_guard module counts: at a module's top, inside
a function (a lazy import closes a circle at run time all the same) and under `TYPE_CHECKING`
(a type-only import still ties the two modules: neither can be read or moved without the other).
`from pkg import mod` counts as an import of `pkg.mod` where that is a module.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import sglang_guard

PACKAGE = Path(sglang_guard.__file__).resolve().parent


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """`sglang_guard.errors` for .../sglang_guard/errors.py, `a.b` for .../a/b/__init__.py."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))
            if "__pycache__" not in p.parts}


def imported(source: str) -> set[str]:
    """Every absolute module name `source` imports (and `pkg.name` for `from pkg import name`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports (packages whose
    `__init__.py` is empty are left out: importing one runs nothing)."""
    found = modules(package)
    empty = {name for name, path in found.items()
             if path.name == "__init__.py" and not path.read_text(encoding="utf-8").strip()}
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        deps = imported(path.read_text(encoding="utf-8"))
        graph[name] = {d for d in deps if d in found and d != name and d not in empty}
    return graph


def circle_through(graph: Mapping[str, set[str]], start: str) -> list[str] | None:
    """A chain of imports from `start` back to it, if there is one."""
    stack: list[tuple[str, list[str]]] = [(d, [start, d]) for d in sorted(graph[start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        if node == start:
            return path
        if node in seen:
            continue
        seen.add(node)
        stack += [(d, [*path, d]) for d in sorted(graph.get(node, ()))]
    return None


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One circle through each node that lies on one (each circle listed once)."""
    found: list[list[str]] = []
    covered: set[str] = set()
    for node in sorted(graph):
        if node in covered:
            continue
        circle = circle_through(graph, node)
        if circle is not None:
            found.append(circle)
            covered |= set(circle)
    return found
