"""The option table: loading, spellings, and argparse's classification of one token."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sglang_guard.errors import ConfigError
from sglang_guard.sglang.options import OptionTable, parse_table
from sglang_guard.sglang.releases import load_option_table


def test_table_is_sglang_0_5_23(options: OptionTable) -> None:
    assert options.sglang_version == "0.5.23"
    assert options.allow_abbrev
    assert len(options.options) > 500
    assert load_option_table() is options  # read once per process


@pytest.mark.parametrize(
    ("name", "dest", "canonical", "takes_value"),
    [
        ("--model", "model_path", "--model-path", True),
        ("model_path", "model_path", "--model-path", True),
        ("--speculative-draft-model", "speculative_draft_model_path",
         "--speculative-draft-model-path", True),
        ("--ep", "ep_size", "--ep-size", True),
        ("--enable-hicache", "enable_hierarchical_cache", "--enable-hierarchical-cache", False),
        ("--trust-remote-code", "trust_remote_code", "--trust-remote-code", False),
        ("--no-enable-tf32-matmul", "enable_tf32_matmul", "--enable-tf32-matmul", False),
        ("--attention-backend", "attention_backend", "--attention-backend", True),
    ],
)
def test_spec_by_spelling_or_dest(
    options: OptionTable, name: str, dest: str, canonical: str, takes_value: bool
) -> None:
    spec = options.spec(name)
    assert (spec.dest, spec.canonical, spec.takes_value) == (dest, canonical, takes_value)


def test_spec_unknown_raises_keyerror(options: OptionTable) -> None:
    with pytest.raises(KeyError):
        options.spec("--no-such-flag")


@pytest.mark.parametrize(
    ("token", "kind", "option", "explicit"),
    [
        ("--model-path", "exact", "--model-path", None),
        ("--model", "exact", "--model", None),
        ("--model-path=/m", "exact", "--model-path", "/m"),
        ("--model-path=a=b", "exact", "--model-path", "a=b"),
        ("--model-p", "abbrev", "--model-path", None),
        ("--model-p=/m", "abbrev", "--model-path", "/m"),
        ("--attention-back", "abbrev", "--attention-backend", None),
        ("--cuda-graph-max-bs", "ambiguous", None, None),
        ("--cuda-graph-max-bs=8", "ambiguous", None, None),
        ("--mod", "ambiguous", None, None),  # --model, --model-path, --modelopt-...
        ("--nope", "unknown", None, None),
        ("--nope=1", "unknown", None, None),
        ("-x", "unknown", None, None),
        ("-1", "not_option", None, None),
        ("-1.5", "not_option", None, None),
        ("-.5", "not_option", None, None),
        ("-1x", "unknown", None, None),
        ("-", "not_option", None, None),
        ("", "not_option", None, None),
        ("/m", "not_option", None, None),
        ("-a b", "not_option", None, None),  # argparse: a space means "not an option"
    ],
)
def test_lookup_like_argparse(
    options: OptionTable, token: str, kind: str, option: str | None, explicit: str | None
) -> None:
    look = options.lookup(token)
    assert (look.kind, look.option, look.explicit) == (kind, option, explicit)
    if kind == "ambiguous":
        assert len(look.matches) > 1
        assert all(m.startswith(token.split("=", maxsplit=1)[0]) for m in look.matches)


def test_mod_is_ambiguous_against_the_real_table(options: OptionTable) -> None:
    # If this ever resolves, the ambiguous case above needs a new example.
    assert options.lookup("--mod").kind == "ambiguous"


def test_no_abbrev_when_the_parser_disallows_it() -> None:
    table = parse_table({"sglang_version": "x", "allow_abbrev": False, "options": [
        _opt(["--model-path"], "model_path")]}, "t.json")
    assert table.lookup("--model").kind == "unknown"
    assert table.lookup("--model-path").kind == "exact"


def _opt(strings: list[str], dest: str, nargs: Any = None) -> dict[str, Any]:
    return {"strings": strings, "dest": dest, "action": "_StoreAction", "nargs": nargs,
            "choices": None, "store_true": False, "yaml": "value"}


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"sglang_version": "x"},
        {"sglang_version": "x", "options": [{"strings": ["--a"]}]},
        {"sglang_version": "x", "options": None},
    ],
)
def test_parse_table_rejects_non_dumps(data: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"^t\.json: options: not an SGLang option dump"):
        parse_table(data, "t.json")


def test_shipped_dump_round_trips(options: OptionTable) -> None:
    from sglang_guard.resources import config_path  # noqa: PLC0415

    data = json.loads(config_path("sglang", "options-0.5.23.json").read_text(encoding="utf-8"))
    again = parse_table(data, "x")
    assert again.options == options.options
    # every spelling indexes its own option, aliases included
    for spec in options.options:
        for s in spec.strings:
            assert options.by_string[s] is spec or options.by_string[s].dest == spec.dest


def test_load_missing_version_names_the_file() -> None:
    with pytest.raises(ConfigError, match=r"options-9\.9\.9\.json: cannot read"):
        load_option_table("9.9.9")
