"""`sglang serve`'s reading of its words, release by release, is the release's own.

For every shipped release, the functions its `sglang serve` runs on the words before
launch_server's parser (sglang/cli/serve.py `_extract_model_type_override` and
`_normalize_positional_model_path`, sglang/cli/utils.py `get_model_path`; each where the
release has it) are taken from its wheel and run on a set of command lines; whether the
`sglang` command ships at all is read from the wheel's entry_points.txt. The guard's
`serve_error` must fail exactly the lines SGLang fails (LLM path), and `split_args` must
hand launch_server's parser exactly the words SGLang hands it.

Only those pure functions run: each is compiled alone from the release's own source (no
import of SGLang, whose package needs torch), with the builtins alone in scope.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sglang_guard.sglang.launcher import (
    serve_error,
    serve_reading,
    split_args,
)
from support.sglang import WHEELS_MISSING, missing

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("constraint_ranges",
                                               REPO / "tools" / "constraint_ranges.py")
assert _spec is not None and _spec.loader is not None
ranges = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("constraint_ranges", ranges)
_spec.loader.exec_module(ranges)

_SERVE = ("_extract_model_type_override", "_normalize_positional_model_path")
_UTILS = ("try_get_model_path", "get_model_path")

CASES: list[list[str]] = [
    ["--model-path", "/m", "--port", "1"],
    ["--model-path=/m"],
    ["--model", "/m", "--tp", "2"],
    ["--model=/m"],
    ["/m", "--port", "1"],
    ["/m", "--model-path", "/n"],
    ["/m"],
    ["--port", "1"],
    [],
    ["--model-type", "llm", "--model-path", "/m"],
    ["--model-type=llm", "/m"],
    ["/m", "--model-type", "auto", "--tp", "2"],
    ["--model-type", "diffusion", "--model-path", "/m"],
    ["--model-type", "bogus", "--model-path", "/m"],
    ["--model-type=", "--model-path", "/m"],
    ["--model-type=", "--model-type", "llm", "--model-path", "/m"],
    ["--model-path", "/m", "--model-type"],
    ["--model-path"],
    ["--model-paths", "/m"],
    ["--port", "1", "--model-path", "/m", "--model-type", "llm"],
]


class _Release:
    """One release's `sglang serve` pre-parse, run from its own source."""

    def __init__(self, version: str, wheel: Path) -> None:
        self.version = version
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            entry = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
            self.has_command = entry is not None and any(
                line.replace(" ", "").startswith("sglang=")
                for line in z.read(entry).decode().splitlines())
            serve = z.read("sglang/cli/serve.py").decode() if "sglang/cli/serve.py" in names \
                else ""
            utils = z.read("sglang/cli/utils.py").decode() if "sglang/cli/utils.py" in names \
                else ""
        self.fns: dict[str, Callable[..., Any]] = {}
        for text, wanted in ((serve, _SERVE), (utils, _UTILS)):
            self.fns.update(_functions(text, wanted, f"sglang-{version}"))

    def server_args(self, argv: list[str]) -> list[str] | None:
        """The words launch_server's parser gets on the LLM path, or None: serve raises
        first (or selects another backend, which is not the guard's)."""
        extract = self.fns.get("_extract_model_type_override")
        backend = "auto"
        try:
            if extract is not None:
                backend, argv = extract(list(argv))
            if backend not in ("auto", "llm"):
                return None
            normalize = self.fns.get("_normalize_positional_model_path")
            if normalize is not None:
                argv, _ = normalize(argv)
            self.fns["get_model_path"](argv)  # on the LLM path it must find one
        except Exception:  # SGLang raises Exception/ValueError with its message
            return None
        return list(argv)

    def fails(self, argv: list[str]) -> bool:
        """Whether serve raises before the parser (LLM path), or there is no `sglang`."""
        if not self.has_command:
            return True
        extract = self.fns.get("_extract_model_type_override")
        try:
            if extract is not None:
                backend, argv = extract(list(argv))
                if backend not in ("auto", "llm"):
                    return False  # another backend: not the LLM path's checks
            normalize = self.fns.get("_normalize_positional_model_path")
            if normalize is not None:
                argv, _ = normalize(argv)
            self.fns["get_model_path"](argv)
        except Exception:
            return True
        return False


def _functions(source: str, names: tuple[str, ...], where: str) -> dict[str, Callable[..., Any]]:
    """The top-level functions `names` of `source`, each compiled alone (builtins only)."""
    if not source:
        return {}
    tree = ast.parse(source)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    module = ast.Module(body=[*found], type_ignores=[])
    scope: dict[str, Any] = {"__builtins__": __builtins__}
    # SGLang's own pure functions from its wheel, not data: what `sglang serve` itself runs.
    exec(compile(module, where, "exec"), scope)  # noqa: S102
    return {n: scope[n] for n in names if n in scope}


@pytest.fixture(scope="module")
def releases() -> list[_Release]:
    found = []
    for version in ranges.releases():
        hits = sorted(ranges.wheel_dir().glob(f"sglang-{version}-*.whl"))
        if not hits:
            missing(WHEELS_MISSING)
        found.append(_Release(version, hits[0]))
    return found


def test_the_releases_differ_where_the_reading_says(releases: list[_Release]) -> None:
    """The cases reach every change: no command, no selector, no positional, no alias."""
    assert any(not r.has_command for r in releases)
    assert any(r.has_command and "_extract_model_type_override" not in r.fns for r in releases)
    assert any("_extract_model_type_override" in r.fns
               and "_normalize_positional_model_path" not in r.fns for r in releases)
    bare = ["/m", "--port", "1"]
    assert {r.fails(bare) for r in releases if r.has_command} == {True, False}
    alias = ["--model", "/m"]
    assert {r.fails(alias) for r in releases if r.has_command} == {True, False}


def test_serve_error_fails_exactly_what_each_release_fails(releases: list[_Release]) -> None:
    wrong = []
    for r in releases:
        reading = serve_reading(r.version)
        for argv in CASES:
            theirs, ours = r.fails(argv), serve_error(argv, reading) is not None
            if theirs != ours:
                wrong.append((r.version, argv, theirs, serve_error(argv, reading)))
    assert wrong == []


def test_split_args_hands_the_parser_what_each_release_hands_it(
        releases: list[_Release]) -> None:
    wrong = []
    for r in releases:
        reading = serve_reading(r.version)
        for argv in CASES:
            theirs = r.server_args(argv) if r.has_command else None
            if theirs is None:
                continue
            ours = list(split_args(argv, reading)[1])
            if ours != theirs:
                wrong.append((r.version, argv, theirs, ours))
    assert wrong == []


def test_an_unknown_release_reads_as_the_newest() -> None:
    assert serve_reading(None) == serve_reading("not a version")
    assert split_args(["/m"], serve_reading(None)) == ((), ("--model-path", "/m"))
    assert serve_error(["/m"], serve_reading("0.5.12")) is not None
    assert serve_error(["/m"], serve_reading("0.5.16")) is None
