"""One entry wiring: `run`, the drop-in and `serve` each hand their settings to
`entry.run_process`, and no import circle runs through them.

The import graph is read from the source (tests/support/importgraph.py: every import of a
sglang_guard module counts, lazy and type-only ones too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import pytest
from click.testing import CliRunner

from sglang_guard import cli, launch_server, serve
from support.importgraph import circle_through, import_graph

ENTRIES = ("sglang_guard.cli", "sglang_guard.launch_server", "sglang_guard.serve",
           "sglang_guard.entry")


def test_the_graph_reader_finds_a_circle_where_there_is_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circle_through(graph, "a") == ["a", "b", "c", "a"]
    assert circle_through(graph, "d") is None


@pytest.mark.parametrize("module", ENTRIES)
def test_no_import_circle_runs_through_an_entry(module: str) -> None:
    graph = import_graph()
    assert module in graph
    assert circle_through(graph, module) is None


CALLED = 42  # the exit status the fake run_process exits with


def _capture(monkeypatch: pytest.MonkeyPatch, module: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake(cfg: Any, argv: Any, **kwargs: Any) -> NoReturn:
        seen.update(cfg=cfg, argv=tuple(argv), **kwargs)
        raise SystemExit(CALLED)

    monkeypatch.setattr(module, "run_process", fake)
    return seen


def test_run_the_drop_in_and_serve_all_go_through_run_process(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SGLANG_GUARD_PREFLIGHT", "0")
    monkeypatch.setenv("SGLANG_GUARD_PYTHON", "/opt/sgl/bin/python")
    argv = ["--model-path", "/m", "--port", "31000"]

    seen = _capture(monkeypatch, cli)
    result = CliRunner().invoke(cli.main, ["run", "--no-preflight", "--state-dir",
                                           str(tmp_path), "--", *argv])
    assert result.exit_code == CALLED, result.output
    assert (seen["argv"], seen["state_dir"], seen["preflight"]) == (tuple(argv), str(tmp_path),
                                                                     False)

    seen = _capture(monkeypatch, launch_server)
    with pytest.raises(SystemExit, match=str(CALLED)):
        launch_server.main(argv)
    assert (seen["argv"], seen["python"], seen["preflight"]) == (
        tuple(argv), "/opt/sgl/bin/python", False)

    seen = _capture(monkeypatch, serve)
    with pytest.raises(SystemExit, match=str(CALLED)):
        serve.main(["/m", "--model-type", "llm", "--port", "31000"])
    assert seen["argv"] == ("--model-path", "/m", "--port", "31000")
    assert seen["cfg"].sglang.launch[-3:] == ("serve", "--model-type", "llm")


class _Shared(Exception):
    """Raised by the fake share_one_arena: the run stops right there."""


def test_a_run_shares_one_malloc_arena_before_it_starts_any_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """entry.run_process limits glibc to one malloc arena first: the pumps' threads would
    each keep an arena of their own, and after a start-up flood malloc_trim left ~1.2 MiB of
    them resident (common/shell/heap.share_one_arena)."""
    import threading  # noqa: PLC0415

    from sglang_guard import entry  # noqa: PLC0415
    from sglang_guard.common.shell import heap, logsetup  # noqa: PLC0415
    from sglang_guard.config.guardconfig import GuardConfig  # noqa: PLC0415

    order: list[str] = []
    threads = threading.active_count()

    def share() -> bool:
        order.append("share")
        assert threading.active_count() == threads
        raise _Shared

    monkeypatch.setattr(heap, "share_one_arena", share)
    monkeypatch.setattr(logsetup, "configure", lambda *_: order.append("logging"))
    with pytest.raises(_Shared):
        entry.run_process(GuardConfig(), ["--model-path", "m"], python=None)
    assert order == ["share"]


def test_one_arena_takes_on_glibc() -> None:
    import platform  # noqa: PLC0415

    from sglang_guard.common.shell.heap import share_one_arena  # noqa: PLC0415

    assert share_one_arena() is (platform.libc_ver()[0] == "glibc")
