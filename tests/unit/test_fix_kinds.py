"""The fix vocabulary (core/fixes.py): every kind has its registry entry and its docs row,
`new_value` is typed once at parse time, and each form's errors stay one clear line."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from click.testing import CliRunner

from sglang_guard.cli import main
from sglang_guard.core import fixes
from sglang_guard.core.fixes import (
    FIX_KINDS,
    Above,
    FreePort,
    Literal,
    NewValue,
    Scale,
)
from sglang_guard.core.outcomes import FixKind
from sglang_guard.core.rulepack import load_default_packs, parse_pack
from sglang_guard.errors import ConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "fix-kinds.md"
HEAD = '[pack]\nname = "t"\nsglang_versions = ">=0.5"\n\n[[rules]]\n'


def test_every_kind_has_one_entry_and_its_row_in_the_docs() -> None:
    assert list(FIX_KINDS) == list(FixKind)
    assert all(spec.kind == kind for kind, spec in FIX_KINDS.items())
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", DOC.read_text(encoding="utf-8"), re.M))
    assert {k.value for k in FixKind} <= rows


def test_every_value_form_is_documented() -> None:
    forms = typing.get_args(NewValue)
    assert set(forms) == {Literal, Scale, Above, FreePort}
    text = DOC.read_text(encoding="utf-8")
    assert all(f"| `{form.__name__}` |" in text for form in forms)


def _rule(body: str) -> typing.Any:
    return parse_pack(HEAD + body, "t.toml").rules[0]


@pytest.mark.parametrize(("new_value", "extra", "want"), [
    ("fa3", "", Literal("fa3")),
    ("scale:0.9", 'default = "0.8"\nminimum = 0.1\nmaximum = 0.95\n',
     Scale("scale:0.9", 0.9, "0.8", 0.1, 0.95)),
    ("above:y", "maximum = 0.95\n", Above("above:y", "y", 0.95)),
    ("free_port", "", FreePort("free_port", "")),
    ("free_port:y", "", FreePort("free_port:y", "y")),
    ("free_portx", "", Literal("free_portx")),  # not the form: a value like any other
])
def test_new_value_is_parsed_once_into_its_form(new_value: str, extra: str,
                                                want: NewValue) -> None:
    rule = _rule(f'id = "r"\npattern = "at (?P<y>[0-9.]+)"\naction = "set_flag"\n'
                 f'flags = ["--x"]\nnew_value = "{new_value}"\n{extra}')
    assert rule.new_value == want and rule.new_value.text == new_value
    assert rule.action is FixKind.SET_FLAG


def test_the_shipped_packs_hold_only_typed_values() -> None:
    rules = [r for p in load_default_packs() for r in p.rules]
    assert all(isinstance(r.action, FixKind) for r in rules)
    assert all(r.new_value is None or isinstance(r.new_value, typing.get_args(NewValue))
               for r in rules)
    # Each form the vocabulary has is used by the shipped packs (none is dead code).
    assert {type(r.new_value) for r in rules if r.new_value is not None} == {
        Literal, Scale, Above, FreePort}


@pytest.mark.parametrize(("body", "key", "needle"), [
    ('action = "set_flag"\nflags = ["--x"]\nnew_value = "scale:-1"\n', "new_value", "> 0"),
    ('action = "set_flag"\nflags = ["--x"]\nnew_value = "scale:inf"\n', "new_value", "> 0"),
    ('action = "set_flag"\nflags = ["--x"]\nnew_value = "scale:0.5"\nminimum = 2\nmaximum = 1\n',
     "minimum", "above maximum"),
    ('action = "set_flag"\nflags = ["--x"]\nnew_value = "fa3"\nmaximum = 1\n', "default",
     "only go with"),
    ('action = "rewrite_value"\nflags = ["--x"]\nnew_value = "free_port"\n', "new_value",
     "set_flag only"),
    ('action = "set_flag"\nflags = ["--x"]\nnew_value = "free_port:nope"\n', "new_value",
     "no group"),
    ('action = "set_flag"\nflags = ["--x"]\nnew_value = "free_port"\ndefault = "1"\n',
     "default", "takes no default"),
    ('action = "drop_flag"\nflags = ["--x"]\nnew_value = "1"\n', "new_value",
     "takes no new_value"),
    ('action = "restart"\nnew_value = "1"\n', "new_value", "takes no new_value"),
    ('action = "restart"\nflags = ["--x"]\n', "flags", "changes no flag"),
    ('action = "set_flag"\n', "flags", "needs the flag(s) it changes"),
    ('action = "environment"\n', "reason", "diagnosis"),
])
def test_a_bad_fix_is_refused_at_parse_time_naming_the_key(body: str, key: str,
                                                           needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        _rule(f'id = "b"\npattern = "x"\n{body}')
    assert err.value.key == f"rules[b].{key}" and needle in str(err.value)


def test_a_bad_new_value_is_exit_2_and_one_line(tmp_path: Path) -> None:
    pack = tmp_path / "mine.toml"
    pack.write_text(HEAD + 'id = "b"\npattern = "x"\naction = "set_flag"\n'
                    'flags = ["--mem-fraction-static"]\nnew_value = "scale:zero"\n')
    config = tmp_path / "guard.toml"
    config.write_text(f'[rules]\npacks = ["{pack}"]\n')
    result = CliRunner().invoke(main, ["explain", "--config", str(config), "-"], input="x\n")
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "rules[b].new_value" in err and "not a number" in err


def test_the_registry_is_the_only_dispatch_on_kinds() -> None:
    """No module outside the registry compares a rule's or a fix's action to a kind's
    spelling: they go through FixKind members or FIX_KINDS."""
    root = Path(fixes.__file__).resolve().parents[1]
    kinds = "|".join(k.value for k in FixKind)
    compare = re.compile(rf"""\.action\s*(?:==|!=|in)\s*\(?["'](?:{kinds})["']""")
    offenders = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py")
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if compare.search(line)]
    assert not offenders, offenders
