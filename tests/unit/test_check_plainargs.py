"""`check`'s plain command lines, read without click, are read as click reads them.

The reading is compared over every command line of up to three words after `check` from an
alphabet of the options, their values, values click rejects, help, `--opt=value`, unknown
options and `--`, and 20,000 seeded random lines of four to eight words: wherever
`plain_check_args` answers, click's own parse of the same words gives the same parameters.
The outputs of the two ways: tests/integration/test_check_ways.py.
"""

from __future__ import annotations

import itertools
import random
import sys
from typing import Any

import click
import pytest

from sglang_guard import checkcmd, cli
from sglang_guard.config.guardconfig import POLICY_MODES

WORDS = ("--policy", "drop", "rewrite", "nuke", "--gpu-sm", "90", "auto", "--config",
         "g.toml", "--json", "--", "--model-path", "m", "-h", "--help", "--policy=drop", "-x",
         "--state-dir", "--python", "--sglang-version", "", "--unknown", "-", "check")


def _click_params(words: list[str]) -> dict[str, Any] | None:
    try:
        with cli.check.make_context("check", list(words)) as ctx:
            return dict(ctx.params)
    except (click.exceptions.Exit, click.ClickException):
        return None


def _lines() -> list[list[str]]:
    lines = [list(w) for n in range(4) for w in itertools.product(WORDS, repeat=n)]
    rng = random.Random(24)  # noqa: S311 - a seeded sample of command lines
    lines += [[rng.choice(WORDS) for _ in range(rng.randint(4, 8))] for _ in range(20_000)]
    return lines


def test_plain_lines_are_read_as_click_reads_them() -> None:
    plain = 0
    for words in _lines():
        found = checkcmd.plain_check_args(["check", *words])
        if found is None:
            continue
        plain += 1
        assert _click_params(words) == found, words
    assert plain > 500  # the comparison ran on lines of every shape it takes


def test_what_is_not_plain_goes_to_click() -> None:
    for words in (["check", "--help"], ["check", "--", ], ["check", "--policy=drop", "--", "x"],
                  ["check", "--policy", "nuke", "--", "x"], ["check", "--json", "--json", "--",
                                                             "x"],
                  ["check", "--model-path", "m"], ["run", "--", "x"],
                  ["check", "--gpu-sm", "--", "x"]):
        assert checkcmd.plain_check_args(words) is None, words
    assert checkcmd.plain_check_args(["check", "--json", "--", "--model-path", "m"]) == {
        "policy": None, "gpu_sm": None, "config_path": None, "state_dir": None,
        "sglang_version": None, "python": None, "as_json": True,
        "args": ("--model-path", "m")}


def test_check_takes_the_options_plain_reading_knows() -> None:
    names = {o for p in cli.check.params for o in p.opts if isinstance(p, click.Option)}
    assert names == {*checkcmd.VALUE_OPTIONS, *checkcmd.FLAG_OPTIONS}  # (and help)
    policy = next(p for p in cli.check.params if p.name == "policy")
    assert isinstance(policy.type, click.Choice) and tuple(policy.type.choices) == POLICY_MODES


def test_shell_completion_and_an_ascii_console_go_to_click(
        monkeypatch: pytest.MonkeyPatch) -> None:
    words = ["check", "--", "--model-path", "m"]
    assert checkcmd.plain_check_args(words) is not None
    monkeypatch.setenv("_SGLANG_GUARD_COMPLETE", "bash_complete")
    assert checkcmd.plain_check_args(words) is None
    monkeypatch.delenv("_SGLANG_GUARD_COMPLETE")

    class Ascii:
        encoding = "ANSI_X3.4-1968"

    monkeypatch.setattr(sys, "stdout", Ascii())
    assert checkcmd.plain_check_args(words) is None


def test_echo_writes_what_click_echo_writes(capsys: pytest.CaptureFixture[str]) -> None:
    for text in ("plain", "tab\there", "é ü 中", "\x1b[31mred\x1b[0m and \x1b]8;;x\x1b\\"):
        for err in (False, True):
            click.echo(text, err=err)
            want = capsys.readouterr()
            checkcmd.echo(text, err=err)
            assert capsys.readouterr() == want, text
