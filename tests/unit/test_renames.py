"""Flags SGLang renamed or removed: the derived table and the findings for a command line."""

from __future__ import annotations

import pytest

from sglang_guard.sglang.argv import parse_command_line
from sglang_guard.sglang.releases import load_release
from sglang_guard.sglang.renames import (
    RenameFinding,
    derive_renames,
    load_renames,
    rename_findings,
    successor_from_note,
)


def findings(version: str, *argv: str) -> list[RenameFinding]:
    table = load_release(version).options
    return rename_findings(parse_command_line(["--model-path", "m", *argv], table), table)


def test_cuda_graph_max_bs_is_renamed_from_0520_with_the_value_kept() -> None:
    (f,) = findings("0.5.23", "--cuda-graph-max-bs", "64")
    assert (f.action, f.flag, f.new_flag, f.new_value, f.changed_in) == (
        "rename", "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "64", "0.5.20")
    assert f.source.startswith("sglang/srt/server_args.py:")
    assert "Deprecated alias for --cuda-graph-max-bs-decode" in f.reason
    assert (f.index, f.count) == (2, 2)  # the option and its separate value token


def test_cuda_graph_max_bs_is_left_alone_where_it_exists() -> None:
    assert findings("0.5.18", "--cuda-graph-max-bs", "64") == []
    assert findings("0.5.18", "--cuda-graph-max-bs=64") == []


def test_the_new_spelling_on_an_old_release_goes_back_to_the_old_one() -> None:
    (f,) = findings("0.5.12", "--cuda-graph-max-bs-decode", "8")
    assert (f.action, f.new_flag, f.new_value) == ("rename", "--cuda-graph-max-bs", "8")
    assert "exists only from SGLang 0.5.20" in f.reason


def test_inline_value_is_kept() -> None:
    (f,) = findings("0.5.20", "--nsa-prefill-backend=flashmla_sparse")
    assert (f.new_flag, f.new_value, f.count) == ("--dsa-prefill-backend", "flashmla_sparse", 1)


def test_a_boolean_flag_becomes_a_flag_with_a_fixed_value() -> None:
    (f,) = findings("0.5.5", "--enable-deepep-moe", "--tp-size", "2")
    assert (f.action, f.new_flag, f.new_value, f.changed_in) == (
        "rename", "--moe-a2a-backend", "deepep", "0.5.4.post1")
    (g,) = findings("0.5.20", "--disable-piecewise-cuda-graph")
    assert (g.new_flag, g.new_value) == ("--cuda-graph-backend-prefill", "disabled")


def test_old_values_are_mapped_the_way_the_note_says() -> None:
    (f,) = findings("0.5.20", "--dsa-prefill-cp-mode", "round-robin-split")
    assert (f.new_flag, f.new_value) == ("--cp-strategy", "interleave")


def test_removed_without_successor_is_dropped_with_the_reason() -> None:
    (f,) = findings("0.5.18", "--torchao-config", "int4wo-128")
    assert (f.action, f.new_flag, f.changed_in) == ("drop", None, "0.5.18")
    assert "without a successor" in f.reason
    (g,) = findings("0.5.13", "--enable-nan-detection")
    assert "SGLANG_SPEC_NAN_DETECTION" in g.reason  # SGLang's own note says what replaced it


def test_known_flags_give_no_finding() -> None:
    assert findings("0.5.23", "--tp-size", "2", "--attention-backend", "triton") == []


def test_removal_table_counts() -> None:
    renames = load_renames()
    assert len(renames) == 75
    assert sum(r.successor is not None for r in renames) == 28
    for r in renames:
        assert r.successor is None or r.successor in load_release(r.removed_in).options.by_string
        assert r.flag in load_release(r.last_in).options.by_string
        assert r.flag not in load_release(r.removed_in).options.by_string


@pytest.mark.parametrize(
    ("note", "want"),
    [
        ("Deprecated alias for --cuda-graph-max-bs-decode.", ("--cuda-graph-max-bs-decode", None)),
        ("Deprecated alias for --cuda-graph-backend-prefill=disabled.",
         ("--cuda-graph-backend-prefill", "disabled")),
        ("[Deprecated] Use --dsa-decode-backend instead.", ("--dsa-decode-backend", None)),
        ("[Deprecated] Use --cp-strategy {zigzag,interleave} instead.", ("--cp-strategy", None)),
        ("NOTE: --enable-deepep-moe is deprecated. Please set `--moe-a2a-backend` to 'deepep' "
         "instead.", ("--moe-a2a-backend", "deepep")),
        ("[Deprecated] Alias for --elastic-ep-join-mode recover.",
         ("--elastic-ep-join-mode", "recover")),
        ("Deprecated. Token histograms are now automatically collected.", None),
    ],
)
def test_successor_from_note(note: str, want: tuple[str, str | None] | None) -> None:
    assert successor_from_note(note) == want


def test_derive_renames_between_two_releases() -> None:
    old = [
        {"strings": ["--a"], "nargs": None, "help": "Deprecated alias for --b.", "where": "x:1"},
        {"strings": ["--c"], "nargs": 0, "help": "gone", "where": "x:2"},
        {"strings": ["--d"], "nargs": None, "help": "Deprecated alias for --nowhere.",
         "where": "x:3"},
    ]
    new = [{"strings": ["--b"], "nargs": None, "help": "", "where": "y:1"}]
    got = {r.flag: (r.successor, r.removed_in, r.source)
           for r in derive_renames([("1.0", old), ("1.1", new)])}
    assert got == {"--a": ("--b", "1.1", "x:1"), "--c": (None, "1.1", "x:2"),
                   "--d": (None, "1.1", "x:3")}
