"""Rule packs against SGLang 0.5.23's option table: flags, choices, release range, deny list."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_guard.config.guardconfig import GuardConfig, RulesSection
from sglang_guard.errors import ConfigError
from sglang_guard.rules.packcheck import (
    check_allow_set,
    check_pack,
    is_denied,
    release_to_check,
    resolve_flag,
)
from sglang_guard.rules.rules import RulePack, load_default_pack, parse_pack
from sglang_guard.rules.shell.packs import load_packs, other_release_has
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.releases import load_option_table

PATH = "/etc/guard/rules/mine.toml"


def pack(body: str, versions: str = ">=0.5.23") -> RulePack:
    head = f'[pack]\nname = "mine"\nsglang_versions = "{versions}"\n'
    return parse_pack(head + body, PATH)


def one(action: str, flags: str, extra: str = "") -> RulePack:
    return pack(f'[[rules]]\nid = "r1"\npattern = "boom"\naction = "{action}"\n'
                f"flags = {flags}\n{extra}")


def refused(p: RulePack, options: OptionTable, allow: tuple[str, ...] = ()) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        check_pack(p, options, allow)
    assert err.value.path == PATH
    assert "pack 'mine'" in str(err.value)
    return err.value


def test_the_default_pack_passes(options: OptionTable) -> None:
    default = load_default_pack()
    assert check_pack(default, options, (), other_release_has) is default


def test_another_releases_spelling_only_next_to_this_releases_own(options: OptionTable) -> None:
    ladder = one("set_flag", '["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs"]',
                 'new_value = "scale:0.5"\ndefault = "32"\n')
    assert check_pack(ladder, options, (), other_release_has) is ladder
    alone = one("set_flag", '["--cuda-graph-max-bs"]', 'new_value = "8"\n')
    err = refused(alone, options)  # without the other releases: not a flag at all
    assert "is ambiguous in SGLang 0.5.23" in err.problem
    with pytest.raises(ConfigError, match=r"is ambiguous in SGLang 0\.5\.23"):
        check_pack(alone, options, (), other_release_has)  # never alone
    old_only = one("set_flag", '["--cuda-graph-max-bs"]',
                   'new_value = "8"\n[rules.when]\nsglang = "<0.5.14"\n')
    assert check_pack(old_only, options, (), other_release_has) is old_only
    typo = one("set_flag", '["--cuda-graph-max-bs-decode", "--cuda-graph-max-bss"]',
               'new_value = "8"\n')
    with pytest.raises(ConfigError, match="has no option --cuda-graph-max-bss"):
        check_pack(typo, options, (), other_release_has)


@pytest.mark.parametrize(("flag", "problem"), [
    ("--no-such-flag", "SGLang 0.5.23 has no option --no-such-flag"),
    ("--cuda-graph-max-bs", "is ambiguous in SGLang 0.5.23 (could match "
                            "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill)"),
    ("--attention-back", "is an abbreviation of --attention-backend"),
    ("--model", "is an alias: write --model-path"),
])
def test_a_flag_the_release_does_not_spell_so_is_refused(
        options: OptionTable, flag: str, problem: str) -> None:
    err = refused(one("drop_flag", f'["{flag}"]'), options)
    assert err.key == "rules[r1].flags"
    assert problem in err.problem


def test_a_condition_flag_is_checked_too(options: OptionTable) -> None:
    err = refused(pack('[[rules]]\nid = "r1"\npattern = "boom"\naction = "restart"\n'
                       '[rules.when.flags]\n"--cuda-graph-max-bs" = true\n'), options)
    assert err.key == "rules[r1].when.flags"
    assert "ambiguous" in err.problem


def test_a_condition_value_outside_the_choices_is_refused(options: OptionTable) -> None:
    err = refused(pack('[[rules]]\nid = "r1"\npattern = "boom"\naction = "restart"\n'
                       '[rules.when.flags]\n"--attention-backend" = ["fa9"]\n'), options)
    assert err.key == "rules[r1].when.flags.--attention-backend"


def test_a_new_value_outside_the_choices_is_refused(options: OptionTable) -> None:
    err = refused(one("set_flag", '["--attention-backend"]', 'new_value = "fa9"\n'), options)
    assert err.key == "rules[r1].new_value"
    assert "'fa9' is not a choice of --attention-backend" in err.problem


def test_a_new_value_must_fit_every_flag_it_may_set(options: OptionTable) -> None:
    # triton is a choice of --attention-backend but --kv-cache-dtype has its own list.
    err = refused(one("rewrite_value", '["--attention-backend", "--kv-cache-dtype"]',
                      'new_value = "triton"\n'), options)
    assert "--kv-cache-dtype" in err.problem


def test_values_that_no_flag_can_hold_are_refused(options: OptionTable) -> None:
    err = refused(one("drop_flag", '["--attention-backend"]', 'values = ["fa9"]\n'), options)
    assert err.key == "rules[r1].values"


def test_a_bare_flag_takes_no_value_and_a_valued_flag_needs_one(options: OptionTable) -> None:
    err = refused(one("set_flag", '["--disable-cuda-graph"]', 'new_value = "1"\n'), options)
    assert "takes no value" in err.problem
    err = refused(one("set_flag", '["--mem-fraction-static"]'), options)
    assert "needs a value" in err.problem


def test_a_scaled_value_on_a_flag_with_choices_is_refused(options: OptionTable) -> None:
    err = refused(one("set_flag", '["--kv-cache-dtype"]', 'new_value = "scale:0.5"\n'), options)
    assert "not a scaled number" in err.problem


@pytest.mark.parametrize(("action", "flag", "extra"), [
    ("set_flag", "--api-key", 'new_value = "x"\n'),
    ("set_flag", "--admin-api-key", 'new_value = "x"\n'),
    ("drop_flag", "--api-key", ""),  # dropping the key opens the server too
    ("rewrite_value", "--host", 'new_value = "0.0.0.0"\n'),
    ("set_flag", "--port", 'new_value = "80"\n'),
    ("set_flag", "--model-path", 'new_value = "/evil"\n'),
    ("set_flag", "--tokenizer-path", 'new_value = "/evil"\n'),
    ("set_flag", "--trust-remote-code", ""),
    ("set_flag", "--enable-custom-logit-processor", ""),
    ("set_flag", "--custom-weight-loader", 'new_value = "evil.load"\n'),
    ("set_flag", "--forward-hooks", 'new_value = "[]"\n'),
    ("set_flag", "--ssl-keyfile-password", 'new_value = "x"\n'),
    ("set_flag", "--config", 'new_value = "/evil.yaml"\n'),  # swaps every flag
    ("set_flag", "--delete-ckpt-after-loading", ""),  # deletes the model directory
    ("drop_flag", "--delete-ckpt-after-loading", ""),
    ("set_flag", "--modelopt-checkpoint-restore-path", 'new_value = "/evil"\n'),
    ("set_flag", "--modelopt-checkpoint-save-path", 'new_value = "/tmp/x"\n'),
    ("set_flag", "--modelopt-export-path", 'new_value = "/tmp/x"\n'),
    ("set_flag", "--init-expert-location", 'new_value = "/evil.pt"\n'),
])
def test_deny_listed_flags_are_refused(
        options: OptionTable, action: str, flag: str, extra: str) -> None:
    err = refused(one(action, f'["{flag}"]', extra), options)
    assert err.key == "rules[r1].flags"
    assert f"{flag} is on the deny list" in err.problem
    assert "[rules] allow_set" in err.problem


def test_allow_set_lets_one_denied_flag_through(options: OptionTable) -> None:
    p = one("rewrite_value", '["--host"]', 'new_value = "127.0.0.1"\n')
    assert check_pack(p, options, ("--host",)) is p
    refused(one("set_flag", '["--port"]', 'new_value = "1"\n'), options, ("--host",))


def test_conditions_may_read_denied_flags(options: OptionTable) -> None:
    p = pack('[[rules]]\nid = "r1"\npattern = "boom"\naction = "drop_flag"\n'
             'flags = ["--attention-backend"]\n[rules.when.flags]\n"--api-key" = true\n')
    assert check_pack(p, options) is p


def test_secret_words_not_substrings() -> None:
    assert is_denied("--api-key") and is_denied("--ssl-keyfile-password")
    assert is_denied("--some-future-hf-token")
    assert not is_denied("--max-total-tokens")
    assert not is_denied("--served-model-name")
    assert not is_denied("--attention-backend")


def test_a_pack_for_another_release_is_refused(options: OptionTable) -> None:
    err = refused(pack("", versions=">=0.6"), options)
    assert err.key == "pack.sglang_versions"
    assert "0.5.23" in err.problem


def test_allow_set_entries_must_be_flags_of_the_release(options: OptionTable) -> None:
    with pytest.raises(ConfigError) as err:
        check_allow_set(("--hostt",), options, "/etc/guard/guard.toml")
    assert err.value.key == "rules.allow_set"
    assert err.value.path == "/etc/guard/guard.toml"


def test_resolve_flag_uses_argparse_lookup(options: OptionTable) -> None:
    spec, problem = resolve_flag(options, "--attention-backend")
    assert spec is not None and spec.dest == "attention_backend" and problem is None
    spec, problem = resolve_flag(options, "--attention-backend=fa3")
    assert spec is None and problem is not None


def test_the_release_a_pack_is_checked_against() -> None:
    known = ("0.5.12", "0.5.22", "0.5.23")
    assert release_to_check(">=0.5.23,<0.5.24", "0.5.23", known) == "0.5.23"
    assert release_to_check(">=0.5", "0.5.22", known) == "0.5.22"  # the running one
    assert release_to_check(">=0.5.23,<0.5.24", "0.5.12", known) == "0.5.23"  # its own
    assert release_to_check(">=0.5.1,<0.5.20", None, known) == "0.5.12"
    assert release_to_check(">=0.6", "0.5.23", known) is None


def test_load_packs_checks_each_pack_against_its_release(tmp_path: Path) -> None:
    """The running release when the pack claims it, else the newest release of its range."""
    cutedsl = ('[[rules]]\nid = "r1"\npattern = "boom"\naction = "drop_flag"\n'
               'flags = ["--attention-backend"]\nvalues = ["cutedsl_mla"]\n')
    old = tmp_path / "old.toml"
    old.write_text('[pack]\nname = "old"\nsglang_versions = "==0.5.12"\n' + cutedsl)
    cfg = GuardConfig(rules=RulesSection(default_pack=True, packs=(str(old),)))
    with pytest.raises(ConfigError) as err:  # 0.5.12's parser has no cutedsl_mla
        load_packs(cfg, load_option_table("0.5.23"))
    assert err.value.key == "rules[r1].values" and err.value.path == str(old)
    # Running 0.5.12: the default pack (0.5.23 only) is checked against 0.5.23, not refused.
    new = tmp_path / "new.toml"
    new.write_text('[pack]\nname = "new"\nsglang_versions = ">=0.5.20"\n' + cutedsl)
    cfg = GuardConfig(rules=RulesSection(default_pack=True, packs=(str(new),)))
    # the shipped packs (default, environment: issue 12) come first
    assert [p.name for p in load_packs(cfg, load_option_table("0.5.12"))] == [
        "default", "environment", "new"]
    none = tmp_path / "none.toml"
    none.write_text('[pack]\nname = "none"\nsglang_versions = ">=0.6"\n')
    with pytest.raises(ConfigError, match="holds no SGLang release"):
        load_packs(GuardConfig(rules=RulesSection(default_pack=False, packs=(str(none),))))
