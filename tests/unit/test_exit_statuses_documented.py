"""Every exit status the guard has is documented where an operator reads it, and right."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from sglang_guard import errors
from sglang_guard.cli import main

ROOT = Path(__file__).resolve().parents[2]
CODES = {name: value for name, value in vars(errors).items()
         if name.startswith("EXIT_") and name != "EXIT_REMEDIATED"}  # 1 is `check`'s only


def test_run_help_lists_every_exit_status() -> None:
    out = CliRunner().invoke(main, ["run", "--help"]).output
    listed = {int(m) for m in re.findall(r"^\s+(\d+)\s{2,}", out, flags=re.MULTILINE)}
    assert listed == set(CODES.values()), out


def test_the_example_config_names_the_right_statuses() -> None:
    text = (ROOT / "configs" / "guard.example.toml").read_text()
    lost = next(line for line in text.splitlines() if line.startswith("leader_lost_s"))
    assert f"exits {errors.EXIT_LEADER_LOST}" in lost, lost
    for line in text.splitlines():  # wherever a comment says "exit(s) N", N is a status
        for code in re.findall(r"exits? (\d+)", line):
            assert int(code) in {*CODES.values(), errors.EXIT_REMEDIATED}, line


def test_no_color_turns_colour_off_on_a_terminal(monkeypatch: object) -> None:
    import io  # noqa: PLC0415

    import pytest  # noqa: PLC0415

    from sglang_guard.common.shell import logsetup  # noqa: PLC0415

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    mp: pytest.MonkeyPatch = monkeypatch  # type: ignore[assignment]
    mp.delenv("NO_COLOR", raising=False)
    assert logsetup.colors(Tty())
    mp.setenv("NO_COLOR", "1")
    assert not logsetup.colors(Tty())
    mp.setenv("NO_COLOR", "")  # set but empty: no-color.org says colour stays
    assert logsetup.colors(Tty())
    assert not logsetup.colors(io.StringIO())
