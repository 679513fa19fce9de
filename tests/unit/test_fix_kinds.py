"""The fix vocabulary (rules/fixes.py): every kind has its registry entry and its docs row,
`new_value` is typed once at parse time, and each form's errors stay one clear line."""

from __future__ import annotations

import re
import typing
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from sglang_guard.cli import main
from sglang_guard.common.outcomes import FixKind
from sglang_guard.errors import ConfigError
from sglang_guard.rules import fixes
from sglang_guard.rules.fixes import (
    FIX_KINDS,
    Above,
    FreePort,
    Literal,
    NewValue,
    Scale,
)
from sglang_guard.rules.rulepack import load_default_packs, parse_pack
from sglang_guard.rules.rules import Matcher
from sglang_guard.supervise.actions import Exit, PickPort, Schedule, Spawn, Stop
from support.machinerun import Run, events_of, make_env, of, only, record

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


# -- the machine carries out each kind's reaction (supervise/machine._apply_fix's match) ----------

_CASES: dict[FixKind, tuple[str, str, str]] = {
    # kind: (the rule's fields, the line, what the launch after it shows)
    FixKind.DROP_FLAG: ('flags = ["--attention-backend"]\n', "bad backend", "spawn"),
    FixKind.SET_FLAG: ('flags = ["--max-running-requests"]\nnew_value = "4"\n', "too many",
                       "spawn"),
    FixKind.REWRITE_VALUE: ('flags = ["--attention-backend"]\nnew_value = "triton"\n',
                            "bad backend", "spawn"),
    FixKind.RESTART: ('reason = "crashed"\n', "scheduler died", "backoff"),
    FixKind.GIVE_UP: ('reason = "no way"\n', "port taken", "exit 75"),
    FixKind.ENVIRONMENT: ('reason = "broken install"\n', "undefined symbol", "exit 69"),
    FixKind.PARSER_EXIT: ("", "error: unrecognized arguments: --x", "exit 2"),
}


def _machine_run(kind: FixKind, fields: str, line: str
                 ) -> tuple[Run, list[typing.Any], list[typing.Any]]:
    pack = parse_pack(HEAD.replace('">=0.5"', '">=0.5.1"') +
                      f'id = "k"\npattern = "{line}"\naction = "{kind}"\n{fields}', "k.toml")
    run = Run(env=replace(make_env(), matcher=Matcher([pack])))
    run.start()
    return run, run.line(f"RuntimeError: {line}"), run.exited(1)


@pytest.mark.parametrize("kind", list(_CASES))
def test_the_machine_carries_out_each_kinds_reaction(kind: FixKind) -> None:
    fields, line, then = _CASES[kind]
    _, acted, after = _machine_run(kind, fields, line)
    assert of(acted, Stop), events_of(acted)
    if then == "spawn":
        rec = record(acted, "remediated")
        assert rec["action"] == kind and rec["rule"] == "k"
        argv = only(after, Spawn).argv
        assert argv == tuple(rec["argv_after"]) and argv != tuple(rec["argv_before"])
    elif then == "backoff":
        assert record(acted, "crash.detected")["reason"] == "crashed"
        assert any(isinstance(a, Schedule) and a.name == "backoff" for a in after)
    else:
        planned = record(acted, "give_up.planned")
        assert planned.get("class") == {FixKind.ENVIRONMENT: "environment",
                                        FixKind.PARSER_EXIT: "usage"}.get(kind)
        assert only(after, Exit).code == int(then.split()[1])


def test_every_acting_kind_has_its_machine_case() -> None:
    """A new kind cannot be added without showing what the machine does with it (undo's
    two-launch history is in test_machine.py, the free port's in test_ports.py)."""
    acting = {k for k, spec in FIX_KINDS.items() if spec.acts}
    assert acting - set(_CASES) == {FixKind.UNDO_GUARD_EDIT}


def test_a_free_port_fix_asks_the_shell_for_a_port_once_the_tree_is_gone() -> None:
    run, acted, after = _machine_run(FixKind.SET_FLAG, 'flags = ["--nccl-port"]\n'
                                     'new_value = "free_port"\n', "nccl port busy")
    assert not of(acted, PickPort)  # not while SGLang still runs
    assert only(after, PickPort).flag == "--nccl-port" and run.state.phase == "picking"
