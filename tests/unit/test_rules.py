"""The rule engine: pack validation, conditions, budgets, scale arithmetic, and clean()."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping

import pytest

from sglang_guard.errors import ConfigError
from sglang_guard.rules.logline import clean
from sglang_guard.rules.rules import (
    MatchContext,
    Matcher,
    Rule,
    RulePack,
    first_fix,
    parse_pack,
    plan_fix,
)
from sglang_guard.sglang.options import OptionTable
from sglang_guard.sglang.options import parse_table as parse_option_table

HEAD = '[pack]\nname = "t"\nsglang_versions = ">=0.5.23"\n'


def pack(body: str, path: str = "/etc/guard/rules/t.toml") -> RulePack:
    return parse_pack(HEAD + body, path)


def ctx(
    flags: Mapping[str, str | None] | None = None,
    arch: str = "unknown",
    sm: int | None = None,
    version: str | None = None,
) -> MatchContext:
    return MatchContext(flags=flags or {}, arch=arch, sm=sm, sglang_version=version)


def rule(body: str) -> Rule:
    return pack("[[rules]]\n" + body).rules[0]


DROP = 'id = "r1"\npattern = "boom"\naction = "drop_flag"\nflags = ["--attention-backend"]\n'


# --- parsing and validation ---------------------------------------------------------------


def test_parse_minimal_rule_and_defaults() -> None:
    r = rule(DROP)
    assert (r.id, r.action, r.flags, r.values, r.max_fires, r.fatal, r.pack) == (
        "r1",
        "drop_flag",
        ("--attention-backend",),
        None,
        1,
        True,
        "t",
    )
    assert r.priority == 0
    assert r.conditions.arch == ()


@pytest.mark.parametrize(
    ("body", "key", "needle"),
    [
        ('id = "bad"\npattern = "(a"\naction = "restart"\n', "rules[bad].pattern", "RE2"),
        ('id = "br"\npattern = "(a)\\\\1"\naction = "restart"\n', "rules[br].pattern", "RE2"),
        ('id = "la"\npattern = "a(?=b)"\naction = "restart"\n', "rules[la].pattern", "RE2"),
        ('id = "nl"\npattern = "a(?!b)"\naction = "restart"\n', "rules[nl].pattern", "RE2"),
        ('id = "ua"\npattern = "x"\naction = "explode"\n', "rules[ua].action", "explode"),
        ('id = "nf"\npattern = "x"\naction = "drop_flag"\n', "rules[nf].flags", "drop_flag needs"),
        (
            'id = "sc"\npattern = "x"\naction = "set_flag"\nflags = ["--x"]\n'
            'new_value = "scale:abc"\n',
            "rules[sc].new_value",
            "not a number",
        ),
        (
            'id = "sz"\npattern = "x"\naction = "set_flag"\nflags = ["--x"]\n'
            'new_value = "scale:0"\n',
            "rules[sz].new_value",
            "> 0",
        ),
        (
            'id = "sd"\npattern = "x"\naction = "set_flag"\nflags = ["--x"]\n'
            'new_value = "scale:0.5"\ndefault = "lots"\n',
            "rules[sd].default",
            "not a number",
        ),
        (
            'id = "rv"\npattern = "x"\naction = "rewrite_value"\nflags = ["--x"]\n',
            "rules[rv].new_value",
            "needs a new_value",
        ),
        (
            'id = "rf"\npattern = "x"\naction = "restart"\nflags = ["--x"]\n',
            "rules[rf].flags",
            "changes no flag",
        ),
        (
            'id = "fl"\npattern = "x"\naction = "drop_flag"\nflags = ["attention"]\n',
            "rules[fl].flags",
            "canonical",
        ),
        (
            'id = "mf"\npattern = "x"\naction = "restart"\nmax_fires = 0\n',
            "rules[mf].max_fires",
            "at least 1",
        ),
        (
            'id = "mb"\npattern = "x"\naction = "restart"\nmax_fires = true\n',
            "rules[mb].max_fires",
            "expected int",
        ),
        (
            'id = "uk"\npattern = "x"\naction = "restart"\ncolour = "red"\n',
            "rules[uk].colour",
            "unknown key",
        ),
        (
            'id = "wa"\npattern = "x"\naction = "restart"\n[rules.when]\narch = ["gqa"]\n',
            "rules[wa].when.arch",
            "gqa",
        ),
        (
            'id = "wv"\npattern = "x"\naction = "restart"\n[rules.when]\nsglang = "new"\n',
            "rules[wv].when.sglang",
            "specifier",
        ),
        (
            'id = "wk"\npattern = "x"\naction = "restart"\n[rules.when]\ngpu = 90\n',
            "rules[wk].when.gpu",
            "unknown key",
        ),
        ('id = "ep"\npattern = ""\naction = "restart"\n', "rules[ep].pattern", "empty"),
    ],
)
def test_bad_rules_name_file_and_rule(body: str, key: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        pack("[[rules]]\n" + body)
    assert err.value.path == "/etc/guard/rules/t.toml"
    assert err.value.key == key
    assert needle in err.value.problem
    assert "/etc/guard/rules/t.toml" in str(err.value)


def test_duplicate_ids_rejected() -> None:
    with pytest.raises(ConfigError) as err:
        pack("[[rules]]\n" + DROP + "[[rules]]\n" + DROP)
    assert err.value.key == "rules[r1].id"
    assert "duplicate" in err.value.problem


def test_duplicate_ids_across_packs_rejected() -> None:
    a = pack("[[rules]]\n" + DROP, "a.toml")
    b = pack("[[rules]]\n" + DROP, "b.toml")
    with pytest.raises(ConfigError) as err:
        Matcher([a, b])
    assert err.value.path == "b.toml"
    assert "a.toml" in err.value.problem


def test_pack_header_required() -> None:
    with pytest.raises(ConfigError) as err:
        parse_pack('[pack]\nname = "x"\n', "p.toml")
    assert err.value.key == "pack.sglang_versions"
    with pytest.raises(ConfigError) as err:
        parse_pack("[pack\n", "p.toml")
    assert "TOML" in err.value.problem
    with pytest.raises(ConfigError) as err:
        parse_pack(HEAD + '[[rules]]\npattern = "x"\naction = "restart"\n', "p.toml")
    assert err.value.key == "rules[0].id"


# --- matching ------------------------------------------------------------------------------


def three_rules() -> Matcher:
    return Matcher(
        [
            pack(
                '[[rules]]\nid = "a"\npattern = "alpha"\naction = "restart"\n'
                '[[rules]]\nid = "b"\npattern = "al.*ha"\naction = "give_up"\n'
                '[[rules]]\nid = "c"\npattern = "^gamma$"\naction = "restart"\n'
            )
        ]
    )


def test_candidates_in_pack_order() -> None:
    m = three_rules()
    assert [r.id for r in m.candidates("RuntimeError: xx alpha yy")] == ["a", "b"]
    assert [r.id for r in m.candidates("[2026-01-01 10:00:00] gamma")] == ["c"]
    assert m.candidates("[2026-01-01 10:00:00] a gamma") == ()
    assert m.candidates("") == ()
    assert Matcher([]).candidates("alpha") == ()


def test_candidates_handle_nul_and_replacement_chars() -> None:
    m = three_rules()
    assert [r.id for r in m.candidates("RuntimeError: \x00\ufffdalpha\x00")] == ["a", "b"]
    # a lone surrogate
    assert [r.id for r in m.candidates("RuntimeError: \udcffalpha")] == ["a", "b"]


# --- conditions ----------------------------------------------------------------------------


def cond_rule(when: str) -> Rule:
    return rule('id = "c"\npattern = "x"\naction = "restart"\n[rules.when]\n' + when)


@pytest.mark.parametrize(
    ("when", "context", "holds"),
    [
        ('arch = ["mla"]', ctx(arch="mla"), True),
        ('arch = ["mla"]', ctx(arch="mha"), False),
        ('arch = ["mla"]', ctx(arch="unknown"), True),  # the log line is the evidence
        ("sm_min = 100", ctx(sm=90), False),
        ("sm_min = 100", ctx(sm=100), True),
        ("sm_max = 90", ctx(sm=100), False),
        ("sm_max = 90", ctx(sm=None), True),
        ('sglang = ">=0.5.23,<0.6"', ctx(version="0.5.23"), True),
        ('sglang = ">=0.5.23,<0.6"', ctx(version="0.4.9"), False),
        ('sglang = ">=0.5.23,<0.6"', ctx(version=None), True),
        ('sglang = ">=0.5.23,<0.6"', ctx(version="not-a-version"), True),
        ('flags = { "--enable-mis" = true }', ctx({"--enable-mis": None}), True),
        ('flags = { "--enable-mis" = true }', ctx({}), False),
        ('flags = { "--enable-mis" = false }', ctx({"--enable-mis": None}), False),
        (
            'flags = { "--kv-cache-dtype" = ["fp8_e5m2"] }',
            ctx({"--kv-cache-dtype": "fp8_e5m2"}),
            True,
        ),
        ('flags = { "--kv-cache-dtype" = ["fp8_e5m2"] }', ctx({"--kv-cache-dtype": "auto"}), False),
        ('flags = { "--kv-cache-dtype" = ["fp8_e5m2"] }', ctx({}), False),
    ],
)
def test_conditions(when: str, context: MatchContext, holds: bool) -> None:
    assert (plan_fix(cond_rule(when), context) is not None) is holds


# --- plan_fix per action -------------------------------------------------------------------

MULTI = (
    'id = "m"\npattern = "x"\naction = "drop_flag"\nvalues = ["cutedsl_mla"]\n'
    'flags = ["--decode-attention-backend", "--attention-backend"]\nmax_fires = 2\n'
)


def test_drop_flag_first_present_target_with_matching_value() -> None:
    r = rule(MULTI)
    fix = plan_fix(
        r, ctx({"--attention-backend": "cutedsl_mla", "--decode-attention-backend": "flashinfer"})
    )
    assert fix is not None
    assert (fix.action, fix.flag, fix.old_value, fix.new_value) == (
        "drop_flag",
        "--attention-backend",
        "cutedsl_mla",
        None,
    )
    assert plan_fix(r, ctx({"--attention-backend": "triton"})) is None
    assert plan_fix(r, ctx({})) is None


def test_drop_store_true_flag() -> None:
    r = rule('id = "d"\npattern = "x"\naction = "drop_flag"\nflags = ["--enable-mis"]\n')
    fix = plan_fix(r, ctx({"--enable-mis": None}))
    assert fix is not None and fix.flag == "--enable-mis" and fix.old_value is None


def test_set_flag_adds_or_replaces_but_never_no_ops() -> None:
    r = rule(
        'id = "s"\npattern = "x"\naction = "set_flag"\nflags = ["--cuda-graph-backend-decode"]'
        '\nnew_value = "disabled"\n'
    )
    added = plan_fix(r, ctx({}))
    assert added is not None and (added.old_value, added.new_value) == (None, "disabled")
    replaced = plan_fix(r, ctx({"--cuda-graph-backend-decode": "full"}))
    assert replaced is not None and replaced.old_value == "full"
    assert plan_fix(r, ctx({"--cuda-graph-backend-decode": "disabled"})) is None


def test_rewrite_value_needs_the_flag_and_a_listed_value() -> None:
    r = rule(
        'id = "w"\npattern = "x"\naction = "rewrite_value"\nflags = ["--kv-cache-dtype"]\n'
        'values = ["fp8_e5m2"]\nnew_value = "fp8_e4m3"\n'
    )
    fix = plan_fix(r, ctx({"--kv-cache-dtype": "fp8_e5m2"}))
    assert fix is not None and (fix.old_value, fix.new_value) == ("fp8_e5m2", "fp8_e4m3")
    assert plan_fix(r, ctx({"--kv-cache-dtype": "auto"})) is None
    assert plan_fix(r, ctx({})) is None


def test_restart_and_give_up_change_no_flag() -> None:
    for action in ("restart", "give_up"):
        fix = plan_fix(
            rule(f'id = "g"\npattern = "x"\naction = "{action}"\n'),
            ctx({"--attention-backend": "fa3"}),
        )
        assert fix is not None and fix.action == action
        assert (fix.flag, fix.old_value, fix.new_value) == (None, None, None)


# --- scale arithmetic ----------------------------------------------------------------------

MEM = (
    'id = "mem"\npattern = "x"\naction = "set_flag"\nflags = ["--mem-fraction-static"]\n'
    'new_value = "scale:0.9"\ndefault = "0.85"\nminimum = 0.5\n'
)
BS = (
    'id = "bs"\npattern = "x"\naction = "set_flag"\nflags = ["--cuda-graph-max-bs-decode"]\n'
    'new_value = "scale:0.5"\ndefault = "32"\n'
)


@pytest.mark.parametrize(
    ("body", "flags", "expected"),
    [
        (MEM, {"--mem-fraction-static": "0.8"}, "0.72"),
        (MEM, {}, "0.765"),  # the default stands in for the absent flag
        (MEM, {"--mem-fraction-static": "0.52"}, "0.5"),  # clamped
        (MEM, {"--mem-fraction-static": "0.5"}, None),  # at the floor: nothing left to change
        (MEM, {"--mem-fraction-static": "lots"}, None),  # not a number: not ours to fix
        (BS, {"--cuda-graph-max-bs-decode": "160"}, "80"),
        (BS, {"--cuda-graph-max-bs-decode": "3"}, "1"),  # counts stay whole
        (BS, {"--cuda-graph-max-bs-decode": "1"}, None),
        (BS, {}, "16"),
    ],
)
def test_scale(body: str, flags: dict[str, str | None], expected: str | None) -> None:
    fix = plan_fix(rule(body), ctx(flags))
    assert (fix.new_value if fix else None) == expected


def test_scale_without_default_skips_absent_flag() -> None:
    r = rule(
        'id = "n"\npattern = "x"\naction = "set_flag"\nflags = ["--mem-fraction-static"]\n'
        'new_value = "scale:1.1"\nmaximum = 0.95\n'
    )
    assert plan_fix(r, ctx({})) is None
    fix = plan_fix(r, ctx({"--mem-fraction-static": "0.9"}))
    assert fix is not None and fix.new_value == "0.95"


# --- budgets and first_fix -----------------------------------------------------------------

LADDER = pack(
    "[[rules]]\n" + MEM.replace('pattern = "x"', 'pattern = "out of memory"') + "max_fires = 2\n"
    "[[rules]]\n" + BS.replace('pattern = "x"', 'pattern = "out of memory"') + "max_fires = 2\n"
    '[[rules]]\nid = "off"\npattern = "out of memory"\naction = "set_flag"\n'
    'flags = ["--cuda-graph-backend-decode"]\nnew_value = "disabled"\n'
    '[[rules]]\nid = "note"\npattern = "out of memory"\naction = "restart"\nfatal = false\n'
)


def test_ladder_walks_rules_as_budgets_run_out() -> None:
    m = Matcher([LADDER])
    line = "Exception: Capture cuda graph failed: CUDA out of memory"
    fired: dict[str, int] = {}
    flags: dict[str, str | None] = {}
    steps = []
    for _ in range(6):
        fix, exhausted = first_fix(m, line, ctx(flags), fired)
        if fix is None:
            assert [r.id for r in exhausted] == ["mem", "bs", "off"]
            break
        steps.append((fix.rule.id, fix.new_value))
        fired[fix.rule.id] = fired.get(fix.rule.id, 0) + 1
        assert fix.flag is not None
        flags[fix.flag] = fix.new_value
    assert steps == [
        ("mem", "0.765"),
        ("mem", "0.6885"),
        ("bs", "16"),
        ("bs", "8"),
        ("off", "disabled"),
    ]


def test_exhausted_rules_reported_even_when_another_fixes() -> None:
    m = Matcher([LADDER])
    fix, exhausted = first_fix(m, "RuntimeError: out of memory", ctx(), {"mem": 2})
    assert fix is not None and fix.rule.id == "bs"
    assert [r.id for r in exhausted] == ["mem"]


def test_non_fatal_rules_never_fix() -> None:
    m = Matcher([LADDER])
    fired = {"mem": 2, "bs": 2, "off": 1}
    fix, exhausted = first_fix(m, "RuntimeError: out of memory", ctx(), fired)
    assert fix is None
    assert "note" not in [r.id for r in exhausted]
    assert "note" in [r.id for r in m.candidates("RuntimeError: out of memory")]


def test_exhausted_only_counts_rules_whose_conditions_hold() -> None:
    p = pack(
        '[[rules]]\nid = "mla"\npattern = "boom"\naction = "restart"\n'
        '[rules.when]\narch = ["mla"]\n'
    )
    _, exhausted = first_fix(Matcher([p]), "RuntimeError: boom", ctx(arch="mha"), {"mla": 1})
    assert exhausted == ()
    _, exhausted = first_fix(Matcher([p]), "RuntimeError: boom", ctx(arch="mla"), {"mla": 1})
    assert [r.id for r in exhausted] == ["mla"]


def test_priority_beats_pack_order_within_a_line() -> None:
    p = pack(
        '[[rules]]\nid = "crash"\npattern = "boom"\naction = "restart"\npriority = -10\n'
        '[[rules]]\nid = "cause"\npattern = "boom"\naction = "give_up"\n'
    )
    fix, _ = first_fix(Matcher([p]), "RuntimeError: boom", ctx(), {})
    assert fix is not None and fix.rule.id == "cause"


def test_no_match_no_fix() -> None:
    assert first_fix(Matcher([LADDER]), "all good", ctx(), {}) == (None, ())


def test_conditions_failing_falls_through_to_next_rule() -> None:
    p = pack(
        '[[rules]]\nid = "sm90"\npattern = "fa"\naction = "set_flag"\n'
        'flags = ["--prefill-attention-backend"]\nnew_value = "fa3"\n[rules.when]\nsm_max = 90\n'
        '[[rules]]\nid = "sm100"\npattern = "fa"\naction = "set_flag"\n'
        'flags = ["--prefill-attention-backend"]\nnew_value = "fa4"\n[rules.when]\nsm_min = 100\n'
    )
    fix, _ = first_fix(Matcher([p]), "RuntimeError: fa", ctx(sm=100), {})
    assert fix is not None and fix.new_value == "fa4"
    fix, _ = first_fix(Matcher([p]), "RuntimeError: fa", ctx(sm=90), {})
    assert fix is not None and fix.new_value == "fa3"


# --- clean() -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"plain line\n", "plain line"),
        (b"crlf line\r\n", "crlf line"),
        (b"\x1b[31mValueError\x1b[0m: boom\n", "ValueError: boom"),
        (b"\x1b[1;38;5;196mbold\x1b[K", "bold"),
        (b"\x1b]0;window title\x07text", "text"),
        (b"\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
        (b"\x1b(Bcharset\x1b=keypad\x1bM", "charsetkeypad"),
        (b"nul\x00in\x00side", "nulinside"),
        (b"bad utf8 \xff\xfe end", "bad utf8 \ufffd\ufffd end"),
        (b"lone esc \x1b", "lone esc "),
        (b"caf\xc3\xa9", "caf\u00e9"),
        (b"", ""),
    ],
)
def test_clean(raw: bytes, expected: str) -> None:
    assert clean(raw, 4096) == expected


def test_clean_keeps_the_head_without_splitting_a_character() -> None:
    raw = "é".encode() * 10  # 2 bytes each
    assert clean(raw, 5) == "éé"
    assert clean(b"x" * 10_000_000 + b"\n", 100) == "x" * 100
    assert clean(b"\x1b[31m" + b"y" * 100, 10) == "yyyyy"


def test_clean_is_safe_on_random_binary() -> None:
    rng = random.Random(7)  # noqa: S311  (reproducible test input, not crypto)
    for _ in range(200):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
        out = clean(raw, 256)
        assert "\x00" not in out and "\x1b" not in out


def test_clean_is_fast_enough_for_every_line() -> None:
    # Informal budget: ordinary 150-byte lines at well over 500k lines/s on a dev box; the
    # assertion is loose (100k/s) so that a slow CI machine does not flake.
    line = (
        b"[2026-11-29 15:36:24] Decode batch. #running-req: 1, #token: 7, token usage: 0.00, "
        b"cuda graph: False, gen throughput (token/s): 3.21, #queue-req: 0\n"
    )
    n = 200_000
    start = time.perf_counter()
    for _ in range(n):
        clean(line, 4096)
    rate = n / (time.perf_counter() - start)
    assert rate > 100_000, f"{rate:.0f} lines/s"


# --- values taken from the matched line (named groups) -----------------------------------

KV = (
    'id = "kv"\npattern = \'under --mem-fraction-static=(?P<current>[0-9.]+)\\. Raise '
    '--mem-fraction-static above (?P<y>[0-9.]+)\'\naction = "set_flag"\n'
    'flags = ["--mem-fraction-static"]\nnew_value = "above:y"\nmaximum = 0.95\n'
)
KV_LINE = (
    "ValueError: Loaded weights leave no GPU memory for the KV cache under "
    "--mem-fraction-static=0.8. Raise --mem-fraction-static above 0.912 (minimum viable"
)


def test_above_sets_just_above_the_number_sglang_names() -> None:
    fix = plan_fix(rule(KV), ctx({"--mem-fraction-static": "0.8"}), KV_LINE)
    assert fix is not None and (fix.flag, fix.old_value, fix.new_value) == (
        "--mem-fraction-static", "0.8", "0.922")
    # The flag absent: the same value (SGLang's own default ran; the line says which).
    fix = plan_fix(rule(KV), ctx({}), KV_LINE)
    assert fix is not None and fix.new_value == "0.922"


def test_above_never_goes_past_the_cap_or_down() -> None:
    over = KV_LINE.replace("above 0.912", "above 0.951")
    assert plan_fix(rule(KV), ctx({"--mem-fraction-static": "0.8"}), over) is None
    assert plan_fix(rule(KV), ctx({"--mem-fraction-static": "0.93"}), KV_LINE) is None
    assert plan_fix(rule(KV), ctx({"--mem-fraction-static": "0.8"}), None) is None


def test_above_needs_its_group_in_the_pattern() -> None:
    body = KV.replace('new_value = "above:y"', 'new_value = "above:z"')
    with pytest.raises(ConfigError, match="no group"):
        rule(body)
    with pytest.raises(ConfigError, match="only a maximum"):
        rule(KV + "minimum = 0.5\n")


def test_scale_base_is_the_value_the_line_names_when_the_flag_is_absent() -> None:
    body = (
        'id = "ne"\npattern = \'Not enough memory\\..*mem_fraction_static=(?P<current>[0-9.]+)\'\n'
        'action = "set_flag"\nflags = ["--mem-fraction-static"]\nnew_value = "scale:1.1"\n'
        'default = "0.85"\nmaximum = 0.95\n'
    )
    line = ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: mem_fraction_static=0.5")
    assert (fix := plan_fix(rule(body), ctx({}), line)) is not None and fix.new_value == "0.55"
    # The command line wins over the line, and no line means the rule's default.
    fix = plan_fix(rule(body), ctx({"--mem-fraction-static": "0.6"}), line)
    assert fix is not None and fix.new_value == "0.66"
    assert (fix := plan_fix(rule(body), ctx({}))) is not None and fix.new_value == "0.935"


def test_first_fix_hands_the_line_to_the_plan() -> None:
    m = Matcher([pack("[[rules]]\n" + KV)])
    fix, _ = first_fix(m, KV_LINE, ctx({"--mem-fraction-static": "0.8"}), {})
    assert fix is not None and fix.new_value == "0.922"

# --- fixes the running release's parser would take ----------------------------------------


def _release(*options: dict[str, object]) -> OptionTable:
    """A small parser table, as a release's dump would give it."""
    base = {"dest": "", "action": "store", "nargs": None, "choices": None,
            "store_true": False, "yaml": "value"}
    rows = [{**base, **o, "dest": str(o["strings"][0]).lstrip("-").replace("-", "_")}  # type: ignore[index]
            for o in options]
    return parse_option_table({"sglang_version": "0.5.12", "options": rows}, "t.json")


OLD_RELEASE = _release({"strings": ["--cuda-graph-max-bs"]},
                       {"strings": ["--disable-cuda-graph"], "nargs": 0, "store_true": True,
                        "action": "store_true"},
                       {"strings": ["--kv-cache-dtype"], "choices": ["auto", "fp8_e4m3"]})
BS_LADDER = ('id = "bs"\npattern = "OOM"\naction = "set_flag"\n'
          'flags = ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs"]\n'
          'new_value = "scale:0.5"\ndefault = "32"\n')


def test_a_flag_the_release_lacks_is_never_set_its_other_spelling_is() -> None:
    r = rule(BS_LADDER)
    fix = plan_fix(r, MatchContext({}, "unknown", None, "0.5.12", OLD_RELEASE))
    assert fix is not None and (fix.flag, fix.new_value) == ("--cuda-graph-max-bs", "16")
    # Without a table (an unknown parser) the first spelling is used, as before.
    fix = plan_fix(r, ctx())
    assert fix is not None and fix.flag == "--cuda-graph-max-bs-decode"


def test_a_value_outside_the_release_choices_is_never_planned_the_next_rule_is() -> None:
    p = pack('[[rules]]\nid = "kv4"\npattern = "KV"\naction = "set_flag"\n'
             'flags = ["--kv-cache-dtype"]\nnew_value = "fp4_e2m1"\npriority = 1\n'
             '[[rules]]\nid = "off"\npattern = "KV"\naction = "set_flag"\n'
             'flags = ["--disable-cuda-graph"]\n')
    line = "ValueError: KV"  # an exception line: what a rule reads (issue 12)
    fix, _ = first_fix(Matcher([p]), line, MatchContext({}, "unknown", None, "0.5.12",
                                                        OLD_RELEASE), {})
    assert fix is not None and (fix.rule.id, fix.flag, fix.new_value) == (
        "off", "--disable-cuda-graph", None)
    # A release without either flag: nothing is planned at all.
    bare = _release({"strings": ["--port"]})
    assert first_fix(Matcher([p]), line, MatchContext({}, "unknown", None, "9", bare), {})[0] \
        is None
